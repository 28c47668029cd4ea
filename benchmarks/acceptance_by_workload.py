"""Draft acceptance on the simulated node: random token ids against the shipped text prompts.

One fresh simulated launch per cell (EAGLE3 on the seed's node: the 8x RTX PRO 6000 of the session the
simulator is calibrated on, see docs/concepts.md; 50x faster than real time), 32 requests, 8 in flight, 128
output tokens; random ids of 200 tokens or `prompts/autotune-prompts.jsonl`. Prints a
Markdown table: accept length, output tok/s and mean ITL for each speculative tree.

    python benchmarks/acceptance_by_workload.py
"""

from __future__ import annotations

from pathlib import Path

from autotune.measure.client import BenchmarkResult, Workload, benchmark
from tests.sim.test_server import SimServer

SHIPPED = Path(__file__).resolve().parent.parent / "prompts" / "autotune-prompts.jsonl"
FAST = {"SGLANG_SIM_TIME_SCALE": "0.02", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001"}
EAGLE3 = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "lmsys/Kimi-K2.5-EAGLE3")
TREES = {
    "steps 3, topk 1 (the draft's default)": (),
    # The default --cuda-graph-max-bs-decode (512) runs out of memory capturing this tree's graphs.
    "steps 5, topk 4, 8 draft tokens": (
        "--speculative-num-steps", "5", "--speculative-eagle-topk", "4",
        "--speculative-num-draft-tokens", "8", "--cuda-graph-max-bs-decode", "64",
    ),
}  # fmt: skip


def measure(flags: tuple[str, ...], prompts: str | None) -> BenchmarkResult:
    server = SimServer(*EAGLE3, "--skip-server-warmup", *flags, env=FAST)
    try:
        server.wait_ready(60)
        return benchmark(server.url(""), Workload(32, 200, 128, 8, prompts=prompts), 120)
    finally:
        server.close()


def main() -> None:
    print("| EAGLE3 tree | accept length, random ids | accept length, text | output tok/s, random ids | "
          "output tok/s, text | mean ITL ms, random ids | mean ITL ms, text |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for name, flags in TREES.items():
        ids, text = measure(flags, None), measure(flags, str(SHIPPED))
        print(
            f"| {name} | {ids.accept_length:.2f} | {text.accept_length:.2f} | {ids.output_throughput:.0f} | "
            f"{text.output_throughput:.0f} | {ids.mean_itl_ms:.1f} | {text.mean_itl_ms:.1f} |"
        )


if __name__ == "__main__":
    main()
