#!/usr/bin/env python3
"""autotune's page cache step (node/page_cache.py) in front of real SGLang 0.5.17 loads, on a host whose free
memory is smaller than the weights, at the seed's proportions (issue 37, item 3).

The device has 128 GB of memory and a 14.5 GB checkpoint, so a process that holds anonymous memory
(mmap MAP_POPULATE) brings MemAvailable down to the weights / 1.114 (the seed's 547 GB of weights on
491 GB available). The launch is autotune's own: `presharded_launch` gives it the dump folder and the dump
file size it picks for that MemAvailable (a tenth of it), and `keep_weights` runs the step through a
LocalCommandRunner, as the executor does before every launch. Each start stops at SGLang's `Load weight
end` line: the load is what the step changes (session 8 showed the same KV pool, output and tok/s for every
way the weights were read).

    dump         the first presharded start, before the memory is held: load and write the dump
    alone        a reload, page cache alone (the first one after dropping the dump from the cache)
    step         a reload after autotune's step
    threaded     after the memory is given back: the checkpoint with SGLang's multithreaded loader

Per start: SGLang's `Load weight end. elapsed=`, the bytes read from disk over the start (/proc/vmstat
pgpgin; the step's own reads counted apart), the dump's share in the page cache before it (mincore), and
the server processes' host memory sampled every 0.2 s (the most anonymous and file-backed RSS they held
together, and the least MemAvailable): whether a reload holds a whole dump file per rank, and what the
multithreaded loader holds. JSON lines in $OUT/page_cache_h200.jsonl, a table in $OUT/page_cache_h200.txt.

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/page_cache_h200.py --model /tmp/model-8b
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from startup_h200 import drop_from_page_cache, resident_share, shards, stop

from autotune.node.page_cache import keep_weights
from autotune.node.presharded import DumpRoom, presharded_launch
from autotune.node.runner import LocalCommandRunner
from autotune.node.startup_prep import HostMemory
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import compile_cache_env

SEED_RATIO = 547 / 491  # the seed's weights over its MemAvailable (seed-figures.md: 512 GB host assumed)
PORT = 30000
LOAD_END = re.compile(r"Load weight end\. elapsed=([\d.]+) s")
SAMPLE_S = 0.2


def meminfo(key: str) -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))


def pgpgin_bytes() -> int:
    with open("/proc/vmstat") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("pgpgin ")) * 1024


def group_rss(pgid: int) -> tuple[int, int]:
    """Anonymous and file-backed RSS of every process in the group, in bytes."""
    anon = file = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
            status = (entry / "status").read_text()
        except (OSError, ProcessLookupError):
            continue
        for line in status.splitlines():
            if line.startswith("RssAnon:"):
                anon += int(line.split()[1]) * 1024
            elif line.startswith("RssFile:"):
                file += int(line.split()[1]) * 1024
    return anon, file


def dump_files(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.safetensor"))


def load(
    launch: ServerLaunch, log: Path, env: dict[str, str], timeout_s: float, until_ready_file: Path | None
) -> dict[str, object]:
    """Start the server, sample its host memory until `Load weight end` (and `until_ready_file`), stop it."""
    began, disk0 = time.monotonic(), pgpgin_bytes()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            launch.argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    peak_anon = peak_file = 0
    least_available = meminfo("MemAvailable")
    elapsed = None
    while time.monotonic() - began < timeout_s and proc.poll() is None:
        anon, file = group_rss(proc.pid)
        peak_anon, peak_file = max(peak_anon, anon), max(peak_file, file)
        least_available = min(least_available, meminfo("MemAvailable"))
        if (end := LOAD_END.search(log.read_text(errors="replace"))) is not None:
            if until_ready_file is None or any(until_ready_file.glob("*/READY")):
                elapsed = float(end.group(1))
                break
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - began
    stop(proc)
    text = log.read_text(errors="replace")
    return {
        "weights_load_s": elapsed,
        "wall_s": round(wall, 1),
        "disk_gb": round((pgpgin_bytes() - disk0) / 1e9, 2),
        "peak_rss_anon_gb": round(peak_anon / 1e9, 2),
        "peak_rss_file_gb": round(peak_file / 1e9, 2),
        "least_available_gb": round(least_available / 1e9, 2),
        "log_tail": [] if elapsed is not None else text.splitlines()[-20:],
        "presharded_lines": [line[:200] for line in text.splitlines() if "presharded checkpoint" in line],
    }


def hold_memory(leave: int) -> subprocess.Popen[bytes] | None:
    """A process holding MemAvailable - `leave` bytes of anonymous memory, populated (None: none to hold)."""
    hold = meminfo("MemAvailable") - leave
    if hold <= 0:
        return None
    code = (
        "import mmap, sys, time\n"
        f"m = mmap.mmap(-1, {hold}, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | {mmap.MAP_POPULATE})\n"
        "print('held', flush=True)\n"
        "time.sleep(3600)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert proc.stdout is not None
    proc.stdout.readline()
    time.sleep(2)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--presharded-root", type=Path, default=Path("/tmp/presharded-pc"))
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--alone-passes", type=int, default=None, help="page cache alone (default: --passes)")
    ap.add_argument("--no-threaded", action="store_true", help="leave out the 8-thread checkpoint load")
    ap.add_argument("--ratio", type=float, default=SEED_RATIO, help="the weights over MemAvailable")
    ap.add_argument("--deadline-s", type=float, default=480)
    args = ap.parse_args()
    began = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    files = shards(args.model)
    checkpoint = sum(f.stat().st_size for f in files)
    target = int(checkpoint / args.ratio)  # a dump at tp=1 is the checkpoint's size (session 8: 14.48 GB)
    flags = (
        ("--model-path", str(args.model)),
        ("--attention-backend", "triton"),
        ("--sampling-backend", "pytorch"),
        ("--cuda-graph-max-bs", "64"),
        ("--cuda-graph-backend-prefill", "disabled"),
        ("--model-loader-extra-config", json.dumps({"enable_multithread_load": True, "num_threads": 8})),
        ("--host", "127.0.0.1"),
        ("--port", str(PORT)),
    )
    threaded = ServerLaunch(
        (sys.executable, "-m", "sglang.launch_server"), {}, "127.0.0.1", PORT, flags=flags
    )
    memory = HostMemory(target, max(f.stat().st_size for f in files), checkpoint)
    root = args.presharded_root / "model-8b"
    launch, note = presharded_launch(threaded, (str(root), f"{root}-draft"), memory, DumpRoom(10**12, False))
    assert note is None, note
    env = {**os.environ, **compile_cache_env("/tmp/startup-compile-cache", {}), "NCCL_NVLS_ENABLE": "0"}
    runner = LocalCommandRunner()
    rows: list[dict[str, object]] = []
    jsonl = (args.out / "page_cache_h200.jsonl").open("a")

    def record(name: str, row: dict[str, object]) -> None:
        row = {"condition": name, **row}
        rows.append(row)
        jsonl.write(json.dumps(row) + "\n")
        jsonl.flush()
        print(json.dumps(row), flush=True)

    def left() -> float:
        return args.deadline_s - (time.monotonic() - began)

    print("launch:", " ".join(launch.argv), flush=True)
    if not any(root.glob("*/READY")):
        drop_from_page_cache(files)
        record(
            "dump", load(launch, args.out / "server-dump.log", env, min(left(), 200), until_ready_file=root)
        )
    dump = dump_files(root)
    record(
        "dump-files",
        {"files": len(dump), "bytes": [f.stat().st_size for f in dump], "target_gb": target / 1e9},
    )
    hog = hold_memory(target)
    try:
        record("held", {"hog_gb": round((meminfo("MemTotal") - meminfo("MemAvailable")) / 1e9, 1)})
        drop_from_page_cache(dump + files)
        alone = args.passes if args.alone_passes is None else args.alone_passes
        for i, name in enumerate(["alone"] * alone + ["step"] * args.passes):
            if left() < 60:
                print(f"{name}: skipped, {left():.0f} s left", flush=True)
                continue
            step: dict[str, object] = {}
            if name == "step":
                disk0 = pgpgin_bytes()
                seconds = keep_weights(runner, launch, timeout_s=120)
                step = {"step_s": seconds, "step_disk_gb": round((pgpgin_bytes() - disk0) / 1e9, 2)}
            before = {
                "available_gb": round(meminfo("MemAvailable") / 1e9, 2),
                "dump_resident_before": round(resident_share(dump), 3),
            }
            result = load(launch, args.out / f"server-{name}-{i}.log", env, min(left() - 10, 120), None)
            record(name, {**step, **before, **result, "dump_resident_after": round(resident_share(dump), 3)})
    finally:
        if hog is not None:
            stop(hog)
    if left() > 90 and not args.no_threaded:
        drop_from_page_cache(files + dump)
        available = {"available_gb": round(meminfo("MemAvailable") / 1e9, 2)}
        record(
            "threaded",
            available | load(threaded, args.out / "server-threaded.log", env, min(left() - 10, 120), None),
        )
    table(rows, args.out / "page_cache_h200.txt", checkpoint)
    return 0


def table(rows: list[dict[str, object]], path: Path, checkpoint: int) -> None:
    lines = [
        f"checkpoint {checkpoint / 1e9:.2f} GB; MemAvailable held at the weights / {SEED_RATIO:.3f}",
        "condition  MemAvail GB  step s  step disk GB  dump cached before  load s  disk GB  RSS anon/file GB",
    ]
    for r in rows:
        if "weights_load_s" not in r:
            lines.append(f"{r['condition']}: " + json.dumps({k: v for k, v in r.items() if k != "condition"}))
            continue
        lines.append(
            f"{r['condition']:<10} {r.get('available_gb', '-')!s:>11} {r.get('step_s', '-')!s:>7}"
            f" {r.get('step_disk_gb', '-')!s:>13}"
            f" {r.get('dump_resident_before', '-')!s:>19} {r['weights_load_s']!s:>7} {r['disk_gb']:>8}"
            f"  {r['peak_rss_anon_gb']}/{r['peak_rss_file_gb']}"
        )
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
