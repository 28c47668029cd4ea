#!/usr/bin/env python3
"""Where a real SGLang start-up goes on the lent H200, and what autotune's start-up settings change.

A real-weights checkpoint (random bf16 values in safetensors shards, made by the device kit's
make_model.py) is started several times, each start one condition:

    cold-jit    the first start: weights read from disk, the JIT caches empty (what a new node pays once)
    cold-1      weights dropped from the page cache (posix_fadvise DONTNEED), one loader thread
    cold-8      the same with SGLang's multithreaded loader, 8 threads (0.5.17's default; autotune passes it)
    warm-1      weights in the page cache, one loader thread
    warm-8      weights in the page cache, 8 threads

Each start's phases are read from its log by autotune's own reader (node/startup_phases.py), its KV pool
from the `KV Cache is allocated. ... #tokens: N` line, and after it is ready a short streaming benchmark
gives its output tok/s, so a faster start that changed the server would show. One JSON line per start
goes to $OUT/startup_h200.jsonl and a table to $OUT/startup_h200.txt.

    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/startup_h200.py --model /tmp/model-8b
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.node.startup_phases import StartupPhaseReader
from autotune.trial.startup import compile_cache_env

READY = "The server is fired up and ready to roll!"
KV_TOKENS = re.compile(r"KV Cache is allocated\..*#tokens: (\d+)")
CONDITIONS = {  # name -> (weights dropped from the page cache first, loader threads; 1 = single-threaded)
    "cold-jit": (True, 8),
    "cold-1": (True, 1),
    "cold-8": (True, 8),
    "warm-1": (False, 1),
    "warm-8": (False, 8),
}
_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int]
_libc.mmap.argtypes += [ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]


def shards(model: Path) -> list[Path]:
    return sorted(model.glob("*.safetensors"))


def resident_share(files: list[Path]) -> float:
    """The share of the files' pages in the page cache now (mincore on a read-only mapping)."""
    page, held, total = os.sysconf("SC_PAGE_SIZE"), 0, 0
    for path in files:
        size = path.stat().st_size
        pages = (size + page - 1) // page
        with path.open("rb") as f:
            addr = _libc.mmap(None, size, 1, 1, f.fileno(), 0)  # PROT_READ, MAP_SHARED
            vec = (ctypes.c_ubyte * pages)()
            _libc.mincore(addr, size, vec)
            _libc.munmap(addr, size)
        held += sum(b & 1 for b in vec)
        total += pages
    return held / total if total else 0.0


def drop_from_page_cache(files: list[Path]) -> None:
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_into_page_cache(files: list[Path]) -> None:
    for path in files:
        with path.open("rb") as f:
            while f.read(64 << 20):
                pass


def start(
    model: Path, threads: int, port: int, log: Path, env: dict[str, str], timeout_s: float,
    extra: tuple[str, ...] = (), loader_extra: dict[str, object] | None = None,
) -> tuple[subprocess.Popen[bytes], StartupPhaseReader, float | None, list[str]]:
    """`extra`: more server flags (weight_cache.py's --mem-fraction-static, --weight-cache-mode);
    `loader_extra`: more --model-loader-extra-config keys (presharded_h200.py's presharded_path)."""
    loader: dict[str, object] = {"enable_multithread_load": threads > 1}
    loader.update({"num_threads": threads} if threads > 1 else {})
    loader.update(loader_extra or {})
    argv = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--host", "127.0.0.1",
        "--port", str(port), "--attention-backend", "triton", "--sampling-backend", "pytorch",
        "--cuda-graph-max-bs", "64", "--cuda-graph-backend-prefill", "disabled",
        "--model-loader-extra-config", json.dumps(loader), *extra,
    ]
    began = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    reader, seen, ready_s = StartupPhaseReader(), 0, None
    while time.monotonic() - began < timeout_s and proc.poll() is None:
        text = log.read_text(errors="replace")
        for line in text.splitlines()[seen:]:
            reader.take(line, time.monotonic() - began)
        seen = len(text.splitlines())
        if READY in text:
            ready_s = time.monotonic() - began
            break
        time.sleep(0.2)
    return proc, reader, ready_s, argv


def stop(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def bench(kit: Path, port: int) -> dict[str, float] | None:
    done = subprocess.run(
        [sys.executable, str(kit / "bench.py"), "--url", f"http://127.0.0.1:{port}", "--concurrency", "16",
         "--requests-per-client", "2", "--input-words", "300", "--output-len", "128"],
        capture_output=True, text=True, timeout=120,
    )
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return lines[-1] if lines else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--kit", type=Path, default=Path(".sglkit/kit"))
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/out")))
    ap.add_argument("--conditions", default=",".join(CONDITIONS))
    ap.add_argument("--deadline-s", type=float, default=480, help="no start begins after this many seconds")
    args = ap.parse_args()
    began, port = time.monotonic(), 30000
    files = shards(args.model)
    size_gb = sum(f.stat().st_size for f in files) / 1e9
    cache = Path("/tmp/startup-compile-cache")
    env = {**os.environ, **compile_cache_env(str(cache), {}), "NCCL_NVLS_ENABLE": "0"}
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.conditions.split(","):
        if time.monotonic() - began > args.deadline_s:
            print(f"{name}: skipped, past the deadline", flush=True)
            continue
        cold, threads = CONDITIONS[name]
        if cold:
            drop_from_page_cache(files)
        else:
            read_into_page_cache(files)
        resident = resident_share(files)
        log = args.out / f"server-{name}.log"
        proc, reader, ready_s, argv = start(args.model, threads, port, log, env, timeout_s=300)
        text = log.read_text(errors="replace")
        kv = KV_TOKENS.search(text)
        row: dict[str, object] = {
            "condition": name, "threads": threads, "resident_before": round(resident, 3),
            "weights_gb": round(size_gb, 1), "shards": len(files), "ready_s": ready_s and round(ready_s, 1),
            "phases": reader.phases(ready_s), "kv_tokens": int(kv.group(1)) if kv else None,
            "argv_tail": argv[-2:],
        }
        row["bench"] = bench(args.kit, port) if ready_s is not None else None
        if ready_s is None:
            row["log_tail"] = text.splitlines()[-15:]
        stop(proc)
        rows.append(row)
        print(json.dumps(row), flush=True)
        with (args.out / "startup_h200.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        time.sleep(3)  # the port and the GPU memory free
    table = [
        "condition  threads  in page cache  weights s  KV pool s  graphs s  ready s  KV tokens  tok/s"
    ]
    for r in rows:
        p = r["phases"] if isinstance(r["phases"], dict) else {}
        b = r["bench"] if isinstance(r["bench"], dict) else {}
        table.append(
            f"{r['condition']:<10} {r['threads']:>7}  {r['resident_before']:>13.0%}"
            f"  {p.get('weight_load_s', '-'):>9}"
            f"  {p.get('kv_pool_s', '-'):>9}  {p.get('cuda_graph_s', '-'):>8}  {r['ready_s'] or '-':>7}"
            f"  {r['kv_tokens'] or '-':>9}  {b.get('output_tok_s', b.get('tok_s', '-'))}"
        )
    (args.out / "startup_h200.txt").write_text("\n".join(table) + "\n")
    print("\n".join(table))
    return 0


if __name__ == "__main__":
    sys.exit(main())
