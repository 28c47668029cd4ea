"""autotune's one protocol for a program that prints its result: one line
`AUTOTUNE_RESULT {"metrics": {...}, ...}`. `result_line` writes it, `read_result` finds the last one in
the output, `parse_result` reads a job's (`autotune.node.job` waits for the job and classifies its end).

The programs that print it import it: the NCCL all-reduce job (`autotune.measure.nccl`), the on-node
benchmark client (`autotune.measure.remote`) and the simulated job (`autotune.sim.nccl_job`), so it sits
at the bottom of measure and imports nothing heavy.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Mapping
from typing import Any

from autotune.errors import AutotuneError

__all__ = ["RESULT_PREFIX", "ResultLineError", "parse_result", "print_result", "read_result", "result_line"]

RESULT_PREFIX = "AUTOTUNE_RESULT "


class ResultLineError(AutotuneError, ValueError):
    """A result line that is not a JSON object (for a job: not one with a `metrics` object of numbers)."""


def result_line(payload: Mapping[str, Any]) -> str:
    """The line a program prints as its result: `RESULT_PREFIX` and `payload` as one JSON object (a NaN
    is a ValueError: JSON has none)."""
    return RESULT_PREFIX + json.dumps(payload, separators=(",", ":"), allow_nan=False)


def read_result(text: str) -> dict[str, Any] | None:
    """The payload of the last result line in `text`; None when there is none.

    Raises ResultLineError when that line is not a JSON object (the program's bug, not the trial's settings).
    """
    line = next((ln for ln in reversed(text.splitlines()) if ln.startswith(RESULT_PREFIX)), None)
    if line is None:
        return None
    try:
        payload = json.loads(line[len(RESULT_PREFIX) :])
    except json.JSONDecodeError as exc:
        raise ResultLineError(f"the result line is not JSON ({exc}): {line[:200]!r}") from None
    if not isinstance(payload, dict):
        raise ResultLineError(f"the result line is not a JSON object: {line[:200]!r}")
    return payload


def parse_result(text: str) -> dict[str, Any] | None:
    """A job's result: the last result line's payload, whose `metrics` maps metric names to numbers;
    None when there is none. Raises ResultLineError when the line is malformed."""
    payload = read_result(text)
    if payload is None:
        return None
    if not isinstance(payload.get("metrics"), dict):
        raise ResultLineError(f"the result line has no `metrics` object: {json.dumps(payload)[:200]!r}")
    for name, value in payload["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ResultLineError(f"metric {name!r} must be a finite number, but got {value!r}.")
    return payload


def print_result(
    program: str, measure: Callable[[], Mapping[str, Any]], expected: tuple[type[Exception], ...]
) -> int:
    """A job's main: print what `measure()` returns as the result line and return 0; when it raises one of
    the `expected` errors (the job's own, not a bug), print `program: error` on stderr and return 1."""
    try:
        payload = measure()
    except expected as exc:
        print(f"{program}: {exc}", file=sys.stderr, flush=True)
        return 1
    print(result_line(payload), flush=True)
    return 0
