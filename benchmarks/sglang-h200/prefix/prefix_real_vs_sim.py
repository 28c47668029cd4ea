#!/usr/bin/env python3
"""Issue 40 item 5: the prefix-sharing workloads against real SGLang 0.5.17 on one H200 and against the
simulated node of the same machine and model, measured by autotune's own client (autotune.measure.client).

The model is the device kit's Llama-3-8B shape with a 32k vocabulary and dummy weights (the radix cache
matches token ids, so random weights do not matter), its config's max_position_embeddings raised to 65536
so the sessions' 31,000-token prompts fit; the simulated node serves the same shape
(`llama-8b-dummy-64k.yaml` here: the shipped llama-8b-dummy profile with that context) on the H200 profile.
Each side launches the server once per config and runs, on each launch:

    sessions       objectives/agentic-sessions.yaml's workload: 4 sessions of 3 turns, 28,000 tokens first,
                   each later turn the previous prompt + 1,000 + 500 tokens, 1,000 out, 2 s think time
    shared-prefix  docs/workloads.md's example: 8 groups of 16 prompts behind a 2,048-token system prompt,
                   128-token questions, 256 out, 16 in flight

and writes one JSON line per measurement: the hit rate the server reported (meta_info.cached_tokens) beside
the designed one, TTFT of first and later turns, the KV pool the server reported.

    # on the GPU machine (benchmarks/sglang-h200/prefix/device.sh runs it):
    PYTHONPATH=<checkout>:/tmp/site python3 benchmarks/sglang-h200/prefix/prefix_real_vs_sim.py real \
        --model /tmp/model-8b --out $OUT/real.jsonl --logs $OUT --budget-s 500
    # here, the simulated node (about 5 minutes):
    python benchmarks/sglang-h200/prefix/prefix_real_vs_sim.py sim   # appends to sim.jsonl beside it
    # the side-by-side table:
    python benchmarks/sglang-h200/prefix/prefix_real_vs_sim.py table
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO))

from autotune.config.objective import load_objective  # noqa: E402
from autotune.measure.client import BenchmarkError, BenchmarkResult, benchmark  # noqa: E402
from autotune.measure.workloads import SharedPrefix, Workload  # noqa: E402

PORT = 30000
# Held on every launch: dummy weights, the kit's backends (no FA3 in its bundle).
COMMON = ["--load-format", "dummy", "--attention-backend", "triton", "--sampling-backend", "pytorch"]
# config name -> its flags. small-pool: a KV pool of roughly 100k tokens on the H200 (weights 13.5 GiB),
# short of the 4 x 32,000 tokens the four sessions hold at their third turn, so the cache must evict.
CONFIGS: dict[str, list[str]] = {
    "defaults": [],
    "small-pool": ["--mem-fraction-static", "0.19"],
    "no-radix-cache": ["--disable-radix-cache"],
}
REPEATS = {"defaults": 2}  # measurements of each workload per launch (1 where not named)
ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
SIM_ENV = {
    "SGLANG_SIM_HARDWARE": "h200-x1",
    "SGLANG_SIM_MODEL": str(HERE / "llama-8b-dummy-64k.yaml"),
    "SGLANG_SIM_TIME_SCALE": "0.5",  # 2x: the sessions' 2 s think time is 1 s of wall time, above 0.25 s
    "SGLANG_SIM_STARTUP_TIME_SCALE": "0.01",
    "SGLANG_SIM_NOISE": "off",
}


def workloads() -> dict[str, Workload]:
    sessions = load_objective(REPO / "objectives" / "agentic-sessions.yaml").workload
    assert sessions is not None
    # num_prompts, input_len and output_len come from the kind (autotune.measure.sharing.fill_sizes).
    spec: dict[str, Any] = {
        "shared_prefix": SharedPrefix(
            num_groups=8, prompts_per_group=16, system_prompt_len=2048, question_len=128, output_len=256
        ),
        "concurrency": 16,
    }
    shared = Workload(**spec)
    return {"sessions": sessions, "shared-prefix": shared}


def _get(path: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{PORT}{path}", timeout=5) as resp:
        data = json.loads(resp.read())
    return data if isinstance(data, dict) else {}


def _ready(proc: subprocess.Popen[bytes], log: Path, deadline: float) -> bool:
    """SGLang's ready line (after its warm-up request), which the simulated server prints too."""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        if b"The server is fired up and ready to roll" in log.read_bytes():
            return True
        time.sleep(1)
    return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    # The server leads its own process group (scheduler and detokenizer are its children).
    for sig, wait in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _record(
    side: str, config: str, name: str, repeat: int, result: BenchmarkResult, info: dict[str, Any]
) -> dict[str, Any]:
    first, later = result.mean_ttft_first_turn_ms, result.mean_ttft_later_turns_ms
    return {
        "side": side,
        "config": config,
        "workload": name,
        "repeat": repeat,
        "cache_hit_rate": result.cache_hit_rate,
        "designed_hit_rate": result.designed_hit_rate,
        "mean_ttft_ms": result.mean_ttft_ms,
        "mean_ttft_first_turn_ms": first,
        "mean_ttft_later_turns_ms": later,
        "ttft_later_over_first": later / first if first and later is not None else None,
        "output_throughput": result.output_throughput,
        "mean_itl_ms": result.mean_itl_ms,
        "duration_s": result.duration_s,
        "completed": result.completed,
        "failed": result.failed,
        "first_error": result.first_error,
        "kv_pool_tokens": info.get("max_total_num_tokens"),
        "chunked_prefill_size": info.get("chunked_prefill_size"),
        "time_scale": result.time_scale,
    }


def measure_launch(
    side: str, config: str, command: list[str], env: dict[str, str], log: Path, out: Path, deadline: float
) -> None:
    """Launch one config, run every workload on it, append each measurement to `out`, stop it."""
    started = time.monotonic()
    with log.open("ab") as sink:
        sink.write(("+ " + " ".join(command) + "\n").encode())
        sink.flush()
        proc = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        if not _ready(proc, log, min(deadline, time.monotonic() + 400)):
            print(f"[{side}] {config}: not ready (exit {proc.poll()}), see {log.name}", flush=True)
            return
        info = _get("/server_info")
        print(
            f"[{side}] {config}: ready in {time.monotonic() - started:.0f} s, "
            f"KV pool {info.get('max_total_num_tokens')} tokens",
            flush=True,
        )
        warm = False
        for repeat in range(REPEATS.get(config, 1)):
            for name, workload in workloads().items():
                left = deadline - time.monotonic()
                if left < 30:
                    print(f"[{side}] {config}: {name} #{repeat} skipped ({left:.0f} s left)", flush=True)
                    continue
                try:
                    result = benchmark(
                        f"http://127.0.0.1:{PORT}",
                        workload.on_warm_server() if warm else workload,
                        timeout_s=min(240.0, left - 10),
                    )
                except BenchmarkError as exc:
                    print(f"[{side}] {config}: {name} #{repeat} failed: {exc}", flush=True)
                    continue
                warm = True
                row = _record(side, config, name, repeat, result, info)
                with out.open("a") as sink:
                    sink.write(json.dumps(row) + "\n")
                print(
                    f"[{side}] {config}: {name} #{repeat}: hit {row['cache_hit_rate']} designed "
                    f"{row['designed_hit_rate']:.4f} TTFT first {row['mean_ttft_first_turn_ms']} later "
                    f"{row['mean_ttft_later_turns_ms']} ratio {row['ttft_later_over_first']} "
                    f"out {row['output_throughput']:.0f} tok/s ({result.duration_s:.1f} s)",
                    flush=True,
                )
    finally:
        _stop(proc)


def run_side(side: str, args: argparse.Namespace) -> None:
    deadline = time.monotonic() + args.budget_s
    out = Path(args.out)
    logs = Path(args.logs) if args.logs else Path(tempfile.mkdtemp(prefix="prefix-sim-"))
    if side == "real":
        server = [sys.executable, "-m", "sglang.launch_server"]
        env = dict(ENV)
    else:
        server = [sys.executable, "-m", "autotune.sim.sglang_server"]
        env = {**ENV, **SIM_ENV}
    for config, flags in CONFIGS.items():
        if args.configs and config not in args.configs:
            continue
        if deadline - time.monotonic() < 90:
            print(f"[{side}] {config}: not launched ({deadline - time.monotonic():.0f} s left)", flush=True)
            continue
        command = [
            *server,
            "--model-path",
            args.model,
            "--host",
            "127.0.0.1",
            "--port",
            str(PORT),
            *COMMON,
            *flags,
        ]
        measure_launch(side, config, command, env, logs / f"server-{config}.log", out, deadline)


def _rows(path: Path) -> list[dict[str, Any]]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(real_path: Path, sim_path: Path) -> str:
    real, sim = _rows(real_path), _rows(sim_path)
    lines = [
        "| config | workload | # | designed | hit real | hit sim | TTFT first real ms | later real ms | "
        "later/first real | TTFT first sim ms | later sim ms | later/first sim | KV pool real / sim |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted(
        {(r["config"], r["workload"], r["repeat"]) for r in real + sim},
        key=lambda k: (list(CONFIGS).index(k[0]), k[1] != "sessions", k[2]),
    )
    for config, name, repeat in keys:
        r = next((x for x in real if (x["config"], x["workload"], x["repeat"]) == (config, name, repeat)), {})
        s = next((x for x in sim if (x["config"], x["workload"], x["repeat"]) == (config, name, repeat)), {})
        designed = r.get("designed_hit_rate", s.get("designed_hit_rate"))
        lines.append(
            f"| {config} | {name} | {repeat} | {_pct(designed)} | {_pct(r.get('cache_hit_rate'))} | "
            f"{_pct(s.get('cache_hit_rate'))} | {_ms(r.get('mean_ttft_first_turn_ms'))} | "
            f"{_ms(r.get('mean_ttft_later_turns_ms'))} | {_ratio(r.get('ttft_later_over_first'))} | "
            f"{_ms(s.get('mean_ttft_first_turn_ms'))} | {_ms(s.get('mean_ttft_later_turns_ms'))} | "
            f"{_ratio(s.get('ttft_later_over_first'))} | "
            f"{r.get('kv_pool_tokens') or '-'} / {s.get('kv_pool_tokens') or '-'} |"
        )
    lines += [
        "",
        "| config | workload | # | mean TTFT real / sim ms | output tok/s real / sim | failed real / sim |",
        "|---|---|---|---|---|---|",
    ]
    for config, name, repeat in keys:
        r = next((x for x in real if (x["config"], x["workload"], x["repeat"]) == (config, name, repeat)), {})
        s = next((x for x in sim if (x["config"], x["workload"], x["repeat"]) == (config, name, repeat)), {})
        lines.append(
            f"| {config} | {name} | {repeat} | {_ms(r.get('mean_ttft_ms'))} / {_ms(s.get('mean_ttft_ms'))} | "
            f"{_ms(r.get('output_throughput'))} / {_ms(s.get('output_throughput'))} | "
            f"{r.get('failed', '-')} / {s.get('failed', '-')} |"
        )
    return "\n".join(lines)


def main() -> None:
    global PORT
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("side", choices=["real", "sim", "table"])
    parser.add_argument("--model", default="/tmp/model-8b")
    parser.add_argument("--out", default=None, help="the JSON lines file to append to")
    parser.add_argument("--logs", default=None, help="folder for the server logs (sim: a temporary one)")
    parser.add_argument("--port", type=int, default=PORT, help="the server's port (here: a free one)")
    parser.add_argument("--budget-s", type=float, default=900.0)
    parser.add_argument("--configs", nargs="*", default=None, help=f"some of {', '.join(CONFIGS)}")
    parser.add_argument("--real", default=str(HERE / "real.jsonl"))
    parser.add_argument("--sim", default=str(HERE / "sim.jsonl"))
    args = parser.parse_args()
    if args.side == "table":
        print(table(Path(args.real), Path(args.sim)))
        return
    PORT = args.port
    args.out = args.out or (args.real if args.side == "real" else args.sim)
    run_side(args.side, args)


if __name__ == "__main__":
    main()
