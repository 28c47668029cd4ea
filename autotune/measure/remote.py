"""`python -m autotune.measure.remote`: the benchmark client as a command, for `benchmark_from: node`.

It runs on the GPU node itself (where the server's port is reachable when the driver cannot reach it),
prints its result line (autotune's one result protocol, `autotune.measure.result_line`) with
`{"result": ...}` or `{"error": ...}`, and exits 0 or 1. `result_from_output` turns that output back
into a `BenchmarkResult` or a `BenchmarkError` on the driver.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict

from autotune.measure.client import (
    API_KEY_ENV,
    BenchmarkError,
    BenchmarkResult,
    MissLimit,
    Workload,
    benchmark,
)
from autotune.measure.result_line import ResultLineError, read_result, result_line

__all__ = ["command", "main", "result_from_output"]


def command(
    python: str, base_url: str, workload: Workload, timeout_s: float, seed: int, stop: MissLimit | None = None
) -> list[str]:
    """The argv that benchmarks `base_url` with `python` on the node (the server's key, if any, goes in
    its env as `API_KEY_ENV`, never on its command line), stopping where `stop` says."""
    limit = ["--miss-limit", json.dumps(asdict(stop))] if stop is not None else []
    return [
        python,
        "-m",
        "autotune.measure.remote",
        "--base-url",
        base_url,
        "--workload",
        json.dumps(asdict(workload)),
        "--timeout-s",
        repr(float(timeout_s)),
        "--seed",
        str(seed),
        *limit,
    ]


def result_from_output(returncode: int, stdout: str, stderr: str) -> BenchmarkResult:
    """The result the command printed; raises `BenchmarkError` for its error, or when it printed none."""
    try:
        data = read_result(stdout) or {}
    except ResultLineError:
        data = {}
    if "result" in data:
        return BenchmarkResult.from_dict(data["result"])
    if "error" in data:
        error = data["error"]
        raise BenchmarkError(
            str(error.get("reason", "failed on the node")),
            completed=int(error.get("completed", 0)),
            failed=int(error.get("failed", 0)),
            unfinished=int(error.get("unfinished", 0)),
            first_error=error.get("first_error"),
        )
    tail = next((line for line in reversed(stderr.splitlines()) if line.strip()), "").strip()
    raise BenchmarkError(f"could not run on the node (status {returncode})", first_error=tail[:500] or None)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autotune.measure.remote", description=__doc__)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--workload", required=True, help="the Workload as a JSON object")
    parser.add_argument("--timeout-s", type=float, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--miss-limit", help="a MissLimit as a JSON object: stop once it is reached")
    args = parser.parse_args(argv)
    workload = Workload(**json.loads(args.workload))
    stop = MissLimit(**json.loads(args.miss_limit)) if args.miss_limit else None
    key = os.environ.get(API_KEY_ENV) or None
    try:
        result = benchmark(args.base_url, workload, args.timeout_s, args.seed, api_key=key, stop=stop)
    except BenchmarkError as exc:
        error = {
            "reason": exc.reason,
            "completed": exc.completed,
            "failed": exc.failed,
            "unfinished": exc.unfinished,
            "first_error": exc.first_error,
        }
        print(result_line({"error": error}))
        return 1
    print(result_line({"result": json.loads(result.to_json())}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
