"""sglang.benchmark.serving (SGLang's bench_serving) as auto_benchmark runs it, measuring with autotune's
client: it waits until the server answers /health (its --ready-check-timeout-sec), sends the prepared
dataset's requests (their lengths) at --request-rate with at most --max-concurrency in flight, after
--warmup-requests, and appends the JSONL line auto_benchmark reads to --output-file."""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from autotune.measure.client import BenchmarkResult, benchmark
from autotune.measure.workloads import Workload


def bench_serving_record(b: BenchmarkResult) -> dict[str, float]:
    """The JSONL line bench_serving writes, with the fields auto_benchmark reads (its TPOT, the mean time per
    output token after the first, is what autotune's client reports as the mean inter-token latency)."""
    return {
        "completed": b.completed,
        "request_throughput": b.request_throughput,
        "output_throughput": b.output_throughput,
        "mean_ttft_ms": b.mean_ttft_ms,
        "mean_tpot_ms": b.mean_itl_ms,
        "mean_itl_ms": b.mean_itl_ms,
        "mean_e2e_latency_ms": b.mean_e2e_latency_ms,
        "duration": b.duration_s,
    }


def wait_ready(base_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"server at {base_url} not ready within {timeout_s:g} s")
        time.sleep(0.2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--dataset-path", required=True)
    parser.add_argument("--num-prompts", type=int)
    parser.add_argument("--request-rate", type=float, default=float("inf"))
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--output-file", required=True)
    parser.add_argument("--warmup-requests", type=int, default=0)
    parser.add_argument("--ready-check-timeout-sec", type=float, default=600)
    parser.add_argument("--seed", type=int, default=1)
    args, _ = parser.parse_known_args(argv)
    rows = [json.loads(line) for line in Path(args.dataset_path).read_text().splitlines() if line.strip()]
    inputs = {int(row["prompt_len"]) for row in rows}
    outputs = {int(row["output_len"]) for row in rows}
    if len(inputs) != 1 or len(outputs) != 1:
        raise SystemExit(f"this stand-in sends one prompt and output length, not {inputs} and {outputs}")
    num_prompts = args.num_prompts or len(rows)
    workload = Workload(
        num_prompts=num_prompts,
        input_len=inputs.pop(),
        output_len=outputs.pop(),
        concurrency=args.max_concurrency or num_prompts,
        warmup_requests=args.warmup_requests,
        request_rate=None if args.request_rate == float("inf") else args.request_rate,
    )
    wait_ready(args.base_url, args.ready_check_timeout_sec)
    result = benchmark(args.base_url, workload, timeout_s=3600, seed=args.seed)
    with open(args.output_file, "a", encoding="utf-8") as f:
        f.write(json.dumps(bench_serving_record(result)) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
