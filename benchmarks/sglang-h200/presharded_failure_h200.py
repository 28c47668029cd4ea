#!/usr/bin/env python3
"""A presharded dump real SGLang cannot read back, and whether autotune tells that failure from others.

Starts SGLang 0.5.17 with autotune's presharded flags on a small real-weights checkpoint (the first start
writes the dump), stops it, rewrites the dump's plan with another version, and starts it again: SGLang's
loader refuses it. autotune's own reader (node.presharded.presharded_failure) and its failure table
(trial.failures.classify) read the second start's log; $OUT/presharded_failure.json says what each found,
beside both server logs.

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/presharded_failure_h200.py --model /tmp/m
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from startup_h200 import start, stop

from autotune.node.presharded import presharded_failure
from autotune.node.startup_phases import DUMP_PHASE
from autotune.trial.failures import classify


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    dumps = Path("/tmp/presharded-failure")
    loader: dict[str, object] = {
        "presharded_path": str(dumps / "m"),
        "draft_presharded_path": str(dumps / "m-draft"),
    }
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    flags = ("--load-format", "presharded")
    found: dict[str, object] = {}
    log = args.out / "server-dump.log"
    proc, reader, ready_s, _ = start(args.model, 8, 30000, log, env, 300, flags, loader)
    stop(proc)
    found["dump_start"] = {"ready_s": ready_s, "phases": reader.phases(ready_s)}
    plans = sorted(dumps.glob("m/TP-*/checksum.json"))
    found["plans"] = [str(p) for p in plans]
    if not plans:
        print(json.dumps(found))
        return 1
    plan = json.loads(plans[0].read_text())
    plans[0].write_text(json.dumps({**plan, "version": 99}))
    time.sleep(3)  # the port and the GPU memory free
    log = args.out / "server-refused.log"
    proc, reader, ready_s, _ = start(args.model, 8, 30000, log, env, 180, flags, loader)
    if ready_s is None and proc.poll() is None:
        time.sleep(10)  # SGLang's launcher takes its scheduler's death down
    stop(proc)
    text = log.read_text(errors="replace")
    failure = classify(text, "starting")
    found["refused_start"] = {
        "ready_s": ready_s,
        "returncode": proc.returncode,
        "presharded_failure": presharded_failure(text),
        "classified": None if failure is None else {"kind": failure.kind.value, "line": failure.line},
        "dump_phase_in_first": DUMP_PHASE in found["dump_start"]["phases"],  # type: ignore[index]
        "lines": [line for line in text.splitlines() if "resharded" in line or "Error" in line][-12:],
    }
    (args.out / "presharded_failure.json").write_text(json.dumps(found, indent=2))
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
