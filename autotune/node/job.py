"""Job trials: a launched program that measures itself, prints one result line and exits.

A server trial launches SGLang and benchmarks it from outside; a job trial (e.g. `autotune.measure.nccl`)
is started through the same command runner, with the trial's env, and its measurement is what it prints:
one line `AUTOTUNE_RESULT {"metrics": {...}, ...}`. `wait_for_job` waits for the exit within the
benchmark timeout and turns what happened into metrics or a classified failure, as for a server.

The result line itself (`autotune.measure.result_line`) sits below: the programs that print it are
measure's (and the simulated node's); this module waits for them and classifies how they ended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from autotune.measure.result_line import ResultLineError, parse_result
from autotune.node.runner import ServerProcess
from autotune.trial.failures import Failure, FailureKind, classify

__all__ = ["JobOutcome", "wait_for_job"]

POLL_S = 0.2
STOP_GRACE_S = 10.0  # a job holds no server state; NCCL's teardown takes a second or two


@dataclass(frozen=True)
class JobOutcome:
    """How a job ended: its payload and metrics, or a classified failure; `elapsed_s` from the start."""

    metrics: dict[str, float] = field(default_factory=dict)
    payload: dict[str, Any] = field(default_factory=dict)
    failure: Failure | None = None
    returncode: int | None = None
    elapsed_s: float = 0.0


def wait_for_job(
    process: ServerProcess, timeout_s: float, *, stopped: Callable[[], bool] = lambda: False
) -> JobOutcome:
    """Wait until `process` exits (stopping it after `timeout_s`), then read its result from its log.

    A job that exits 0 with a result line succeeded; any other ending is a Failure, classified from the
    log like a server's (an NCCL error is NCCL_ERROR, a CUDA OOM an OOM). `stopped()` true ends the
    wait early (the executor was told to abort and stops the process itself).
    """
    started = time.monotonic()
    timed_out = False
    while process.poll() is None and not stopped():
        if time.monotonic() - started > timeout_s:
            process.stop(grace_s=STOP_GRACE_S)
            timed_out = True
            break
        time.sleep(POLL_S)
    elapsed = time.monotonic() - started
    returncode = process.poll()
    text = process.read_log()
    try:
        payload = parse_result(text)
    except ResultLineError as exc:
        kind = FailureKind.BENCHMARK_ERROR
        failure = Failure(kind, str(exc), "the job printed a malformed result line", kind.advice)
        return JobOutcome(failure=failure, returncode=returncode, elapsed_s=elapsed)
    if returncode == 0 and payload is not None and not timed_out:
        metrics = {name: float(value) for name, value in payload["metrics"].items()}
        return JobOutcome(metrics, payload, None, returncode, elapsed)
    known = classify(text, "benchmarking")
    if known is not None and known.kind is not FailureKind.UNKNOWN_CRASH:
        return JobOutcome(failure=known, returncode=returncode, elapsed_s=elapsed)
    kind = FailureKind.BENCHMARK_ERROR if timed_out or returncode == 0 else FailureKind.UNKNOWN_CRASH
    if timed_out:
        line = f"the job did not finish within {timeout_s:g} s (a hang: look at its last lines)"
    elif returncode == 0:
        line = "the job exited 0 without a result line"
    else:
        line = _last_line(text) or f"exit status {returncode}"
    description = f"job ended with exit status {returncode}" if not timed_out else "job timed out"
    return JobOutcome(
        failure=Failure(kind, line, description, kind.advice), returncode=returncode, elapsed_s=elapsed
    )


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1][:500] if lines else ""
