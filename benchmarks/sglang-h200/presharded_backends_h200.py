#!/usr/bin/env python3
"""One presharded dump read back under another attention backend, on real SGLang (issue 37, item 3).

autotune keys a dump by every flag that may change the weights as loaded, and since session 14 leaves the
attention backends out (node.presharded.SAME_WEIGHTS_FLAGS): SGLang's own key leaves them out too. Three
starts of the kit's real-weights 8B, CUDA graphs off (the same in all three, so only the weights differ):

    triton-dump        --attention-backend triton, presharded, no dump yet: writes it
    native-read        --attention-backend torch_native, presharded: reads that dump
    native-default     --attention-backend torch_native, SGLang's default loader: the checkpoint itself

The same weights give the same greedy text under one backend: native-read's hash against native-default's.
$OUT/presharded_backends.json has each start's phases, whether its log read the dump, and the hashes.

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/presharded_backends_h200.py --model /tmp/m
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from presharded_h200 import greedy
from startup_h200 import start, stop

READ_LINE = "Loading from presharded checkpoint at"
STARTS = (
    ("triton-dump", "triton", True),
    ("native-read", "torch_native", True),
    ("native-default", "torch_native", False),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--timeout-s", type=float, default=170, help="each start's limit")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    root = Path("/tmp/presharded-backends")
    shutil.rmtree(root, ignore_errors=True)
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0"}
    found: dict[str, object] = {}
    loader: dict[str, object] = {"presharded_path": str(root / "m"), "draft_presharded_path": str(root / "d")}
    for port, (name, backend, presharded) in enumerate(STARTS, start=30100):
        flags: tuple[str, ...] = ("--attention-backend", backend, "--disable-cuda-graph")
        if presharded:
            flags = (*flags, "--load-format", "presharded")
        log = args.out / f"server-{name}.log"
        proc, reader, ready_s, _ = start(
            args.model, 8, port, log, env, args.timeout_s, flags, loader if presharded else None
        )
        answer = greedy(port) if ready_s is not None else None
        stop(proc)
        text = log.read_text(errors="replace")
        found[name] = {
            "ready_s": ready_s,
            "phases": reader.phases(ready_s),
            "read_dump": READ_LINE in text,
            "dump_dirs": sorted(str(p.relative_to(root)) for p in root.glob("*/TP-*")),
            "greedy": answer,
        }
        (args.out / "presharded_backends.json").write_text(json.dumps(found, indent=2))
        time.sleep(3)  # the port and the GPU memory free
    read, default = found.get("native-read"), found.get("native-default")
    same = (
        isinstance(read, dict) and isinstance(default, dict) and read.get("greedy") is not None
        and read.get("greedy") == default.get("greedy")
    )  # fmt: skip
    found["same_weights"] = same
    (args.out / "presharded_backends.json").write_text(json.dumps(found, indent=2))
    print(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
