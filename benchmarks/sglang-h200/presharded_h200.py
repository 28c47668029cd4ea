#!/usr/bin/env python3
"""SGLang 0.5.17's `--load-format presharded` on the lent GPU: the first start's load and dump, later starts
that read the dump instead of the checkpoint, against the default loader (issue 37, item 3).

The real-weights 8B checkpoint of startup_h200.sh is started once per condition, 8 loader threads each:

    default-cold      default loader, the source shards dropped from the page cache (the baseline)
    presharded-dump   --load-format presharded, no dump yet (the folder is removed first), source cold:
                      the first-time load, then every rank writes its weights under presharded_path
    presharded-cold   the same flags, the dump's files (and the source's) dropped from the page cache
    presharded-warm   the same flags, the dump's files read into the page cache first
    default-warm      default loader, the source in the page cache

with autotune's flags for it (`--model-loader-extra-config` carries enable_multithread_load, num_threads,
presharded_path and draft_presharded_path). Each start's phases come from autotune's StartupPhaseReader,
its KV pool from the `KV Cache is allocated` line; once ready, one greedy request (its text's hash shows
the weights are the same) and the kit's bench.py (output tok/s). Also: the server's lines that mention
presharded, the dump folder (size, files, READY, checksum.json, when its files were written), and how much
of the source and of the dump sat in the page cache before and after the start (a reload that reads only
the dump leaves the source out). One JSON line per start in $OUT/presharded_h200.jsonl, a table in
$OUT/presharded_h200.txt.

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/presharded_h200.py --model /tmp/model-8b
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from startup_h200 import (
    KV_TOKENS,
    bench,
    drop_from_page_cache,
    read_into_page_cache,
    resident_share,
    shards,
    start,
    stop,
)

from autotune.trial.startup import compile_cache_env

THREADS = 8
PORT = 30000
CONDITIONS = {  # name -> (load format, what is read into the page cache first: "" none, "source", "dump")
    "default-cold": ("default", ""),
    "presharded-dump": ("presharded", ""),
    "presharded-cold": ("presharded", ""),
    "presharded-warm": ("presharded", "dump"),
    "default-warm": ("default", "source"),
}
# Seconds a start is planned at (warm JIT, 8B: 55-75 s to ready, + request, bench and stop); a start
# begins only when its estimate fits before the deadline. The first start on a machine compiles ~75 s more.
EST_S = {"presharded-dump": 120}
EST_DEFAULT_S = 90
GREEDY = {"text": "The presharded checkpoint holds",
          "sampling_params": {"temperature": 0, "max_new_tokens": 32}}
LOAD_END = re.compile(r"Load weight end\..*")


def dump_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def dump_state(root: Path, launched_at: float) -> dict[str, object]:
    """The dump folder as it is now: size, files (relative, bytes, written how long after the launch)."""
    files = dump_files(root)
    return {
        "bytes": sum(f.stat().st_size for f in files),
        "files": [
            {"path": str(f.relative_to(root)), "bytes": f.stat().st_size,
             "written_s": round(f.stat().st_mtime - launched_at, 1)}
            for f in files
        ],
        "ready_file": any(f.name == "READY" for f in files),
        "checksum_json": any(f.name == "checksum.json" for f in files),
    }


def _dict(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def greedy(port: int) -> dict[str, object] | None:
    """One greedy request: the same weights give the same text."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/generate", data=json.dumps(GREEDY).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = json.loads(r.read())["text"]
    except (OSError, ValueError, KeyError) as e:
        return {"error": repr(e)}
    return {"sha1": hashlib.sha1(text.encode()).hexdigest()[:12], "head": text[:40]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kit", type=Path, default=Path(".sglkit/kit"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--presharded-root", type=Path, default=Path("/tmp/presharded"))
    ap.add_argument("--key", default="model-8b", help="the folder under the root (autotune's <key>)")
    ap.add_argument("--conditions", default=",".join(CONDITIONS), help="comma-separated, repeats allowed")
    ap.add_argument("--deadline-s", type=float, default=480, help="every start ends within this many seconds")
    args = ap.parse_args()
    began = time.monotonic()
    files = shards(args.model)
    size_gb = sum(f.stat().st_size for f in files) / 1e9
    root = args.presharded_root / args.key
    loader_extra: dict[str, object] = {"presharded_path": str(root)}
    loader_extra["draft_presharded_path"] = str(root) + "-draft"
    cache = Path("/tmp/startup-compile-cache")
    env = {**os.environ, **compile_cache_env(str(cache), {}), "NCCL_NVLS_ENABLE": "0"}
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, object]] = []
    seen: dict[str, int] = {}
    for name in args.conditions.split(","):
        left = args.deadline_s - (time.monotonic() - began)
        if left < EST_S.get(name, EST_DEFAULT_S):
            print(f"{name}: skipped, {left:.0f} s left", flush=True)
            continue
        fmt, warm = CONDITIONS[name]
        if name == "presharded-dump":
            shutil.rmtree(root, ignore_errors=True)  # a first-time load: no dump yet
        drop_from_page_cache(files + dump_files(root))
        if warm == "source":
            read_into_page_cache(files)
        elif warm == "dump":
            read_into_page_cache(dump_files(root))
        resident = {"source": resident_share(files), "dump": resident_share(dump_files(root))}
        seen[name] = seen.get(name, 0) + 1
        tag = name if seen[name] == 1 else f"{name}-{seen[name]}"
        log = args.out / f"server-{tag}.log"
        extra = ("--load-format", "presharded") if fmt == "presharded" else ()
        launched_at = time.time()
        proc, reader, ready_s, argv = start(
            args.model, THREADS, PORT, log, env, timeout_s=left - 40, extra=extra,
            loader_extra=loader_extra if fmt == "presharded" else None,
        )
        text = log.read_text(errors="replace")
        kv = KV_TOKENS.search(text)
        load_end = LOAD_END.search(text)
        row: dict[str, object] = {
            "condition": tag, "load_format": fmt, "threads": THREADS,
            "resident_before": {k: round(v, 3) for k, v in resident.items()},
            "weights_gb": round(size_gb, 1), "ready_s": ready_s and round(ready_s, 1),
            "phases": reader.phases(ready_s), "kv_tokens": int(kv.group(1)) if kv else None,
            "load_weight_end": load_end.group(0) if load_end else None,
            "presharded_lines": [line for line in text.splitlines() if "presharded" in line.lower()],
            "argv_tail": argv[argv.index("--model-loader-extra-config"):],
        }
        if ready_s is not None:
            row["greedy"] = greedy(PORT)
            row["bench"] = bench(args.kit, PORT)
        else:
            row["log_tail"] = text.splitlines()[-25:]
        stop(proc)
        row["resident_after"] = {"source": round(resident_share(files), 3),
                                 "dump": round(resident_share(dump_files(root)), 3)}
        row["dump"] = dump_state(root, launched_at)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with (args.out / "presharded_h200.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        time.sleep(3)  # the port and the GPU memory free
    table = [
        "condition          in page cache    weights s  KV pool s  graphs s  ready s  KV tokens   tok/s"
        "  greedy        dump GB  READY"
    ]
    for r in rows:
        p, b, g = _dict(r["phases"]), _dict(r.get("bench")), _dict(r.get("greedy"))
        res, d = _dict(r["resident_before"]), _dict(r["dump"])
        table.append(
            f"{r['condition']:<18} src {res.get('source', 0):>4.0%} dump {res.get('dump', 0):>4.0%}"
            f"  {p.get('weight_load_s', '-'):>9}  {p.get('kv_pool_s', '-'):>9}"
            f"  {p.get('cuda_graph_s', '-'):>8}"
            f"  {r['ready_s'] or '-':>7}  {r['kv_tokens'] or '-':>9}  {b.get('output_tok_s', '-'):>6}"
            f"  {g.get('sha1', '-'):<12}  {d.get('bytes', 0) / 1e9:>7.2f}  {d.get('ready_file')}"
        )
    (args.out / "presharded_h200.txt").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
