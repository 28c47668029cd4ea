"""What a benchmark sends and when: prompts from a file or random ids, their lengths, and arrival times.

A prompts file is JSONL (one object a line: `text` or `input_ids`, optionally `output_len`) or ShareGPT's
JSON (a list of `{"conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value": ...}]}`, the
first human turn the prompt and the reply's length the output length, as `sglang.bench_serving`'s
`sharegpt` dataset reads it). The client has no tokenizer: a text's length is its whitespace-separated
words, the rule the simulated server counts tokens by too.

Arrivals are SGLang bench_serving's: every request at once (then `concurrency` bounds what is in flight), or
at `request_rate` requests per second with gamma-distributed gaps of shape `burstiness` (1.0: Poisson, the
exponential gaps of bench_serving's `get_request`; below 1 burstier, above 1 more even), still at most
`concurrency` in flight.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from autotune.errors import ConfigError

if TYPE_CHECKING:
    from autotune.measure.client import Workload

__all__ = [
    "PromptsFormat",
    "Request",
    "arrival_offsets",
    "load_prompts",
    "prompts_format",
    "requests_for",
    "text_tokens",
]

PromptsFormat = Literal["auto", "jsonl", "sharegpt"]
Lengths = Literal["fixed", "uniform", "file"]

# Token ids past every common tokenizer's special tokens and inside every modern LLM's vocabulary
# (the smallest in use, Llama 2's, has 32000 ids).
TOKEN_IDS = range(1000, 30000)


@dataclass(frozen=True)
class Prompt:
    """One prompt of a file: its text or token ids, and the output length the file gives (None: none)."""

    text: str | None = None
    input_ids: tuple[int, ...] | None = None
    output_len: int | None = None


@dataclass(frozen=True)
class Request:
    """One request to send: `text` or `input_ids` (exactly one), `output_len` new tokens."""

    text: str | None
    input_ids: list[int] | None
    output_len: int

    @property
    def prompt_tokens(self) -> int:
        return len(self.input_ids) if self.input_ids is not None else text_tokens(self.text or "")


def text_tokens(text: str) -> int:
    """A text's length in tokens without a tokenizer: its whitespace-separated words (at least 1)."""
    return max(1, len(text.split()))


def prompts_format(path: str | Path, declared: PromptsFormat = "auto") -> Literal["jsonl", "sharegpt"]:
    """The file's format: as declared, else by its suffix (`.jsonl` JSONL, `.json` ShareGPT)."""
    if declared != "auto":
        return declared
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        return "sharegpt"
    raise ConfigError(
        path,
        "",
        suffix,
        "cannot tell the prompts file's format from its suffix",
        "Name it *.jsonl (one object a line) or *.json (ShareGPT), or set workload.prompts_format: "
        "jsonl | sharegpt.",
    )


def _bad(path: str | Path, where: str, value: object, problem: str, fix: str) -> ConfigError:
    return ConfigError(path, where, value, problem, fix)


def _jsonl(path: str | Path, content: str) -> list[Prompt]:
    prompts = []
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise _bad(path, where, line[:60], f"not JSON ({exc})", "Write one JSON object a line.") from None
        if not isinstance(row, dict):
            raise _bad(path, where, line[:60], "not a JSON object", 'Write {"text": "..."} a line.')
        text, ids, out = row.get("text"), row.get("input_ids"), row.get("output_len")
        if (text is None) == (ids is None):
            raise _bad(
                path, where, sorted(row), "needs exactly one of text and input_ids", "Give the prompt once."
            )
        if text is not None and not (isinstance(text, str) and text.strip()):
            raise _bad(path, f"{where}: text", text, "not a non-empty string", "Give the prompt's text.")
        if ids is not None and not (
            isinstance(ids, list) and ids and all(isinstance(i, int) and i >= 0 for i in ids)
        ):
            raise _bad(
                path, f"{where}: input_ids", ids, "not a non-empty list of token ids", "List ints >= 0."
            )
        if out is not None and not (isinstance(out, int) and not isinstance(out, bool) and out > 0):
            raise _bad(path, f"{where}: output_len", out, "not a positive int", "Give a token count >= 1.")
        prompts.append(Prompt(text, tuple(ids) if ids is not None else None, out))
    return prompts


def _sharegpt(path: str | Path, text: str) -> list[Prompt]:
    try:
        rows = json.loads(text)
    except ValueError as exc:
        raise _bad(
            path, "", text[:60], f"not JSON ({exc})", "Give ShareGPT's JSON list, or a *.jsonl file."
        ) from None
    if not isinstance(rows, list):
        raise _bad(
            path,
            "",
            type(rows).__name__,
            "not a JSON list",
            'ShareGPT is a list of {"conversations": [...]}.',
        )
    prompts = []
    for index, row in enumerate(rows):
        turns = row.get("conversations") if isinstance(row, dict) else None
        if not isinstance(turns, list):
            raise _bad(path, f"entry {index}", row, "has no conversations list", "Use ShareGPT's layout.")
        values = [t.get("value") for t in turns if isinstance(t, dict)]
        # bench_serving's sharegpt dataset skips conversations of fewer than two turns the same way.
        if len(values) < 2 or not all(isinstance(v, str) and v.strip() for v in values[:2]):
            continue
        prompts.append(Prompt(text=str(values[0]), output_len=text_tokens(str(values[1]))))
    return prompts


@functools.lru_cache(maxsize=8)
def load_prompts(path: str, declared: PromptsFormat = "auto") -> tuple[Prompt, ...]:
    """The prompts of `path`; a ConfigError names the file, the line or entry, and the fix."""
    fmt = prompts_format(path, declared)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            path,
            "",
            path,
            f"cannot read the prompts file ({exc.strerror or exc})",
            "Set workload.prompts to a file on the machine that runs the client (the shipped set: "
            "prompts/autotune-prompts.jsonl).",
        ) from None
    prompts = _jsonl(path, text) if fmt == "jsonl" else _sharegpt(path, text)
    if not prompts:
        raise ConfigError(path, "", 0, "holds no prompts", "Add at least one, or leave workload.prompts out.")
    return tuple(prompts)


def _length(rng: random.Random, length: int, lengths: Lengths, range_ratio: float) -> int:
    """`fixed`: `length`; `uniform`: bench_serving's random dataset, uniform in [length * ratio, length]."""
    if lengths == "uniform":
        return rng.randint(max(1, int(length * range_ratio)), length)
    return length


def requests_for(workload: Workload, label: str, seed: int, count: int) -> list[Request]:
    """The `count` requests a run sends (`label`: which run, e.g. "warmup"); the same on every run and
    platform for the same seed: a string seed is hashed with SHA-512 by `random`."""
    prompts = load_prompts(workload.prompts, workload.prompts_format) if workload.prompts else ()
    requests = []
    for index in range(count):
        rng = random.Random(f"autotune:{label}:{seed}:{index}")
        if not prompts:
            input_len = _length(rng, workload.input_len, workload.lengths, workload.range_ratio)
            output_len = _length(rng, workload.output_len, workload.lengths, workload.range_ratio)
            requests.append(Request(None, rng.choices(TOKEN_IDS, k=input_len), output_len))
            continue
        prompt = prompts[rng.randrange(len(prompts))]
        if workload.lengths == "file":
            output_len = prompt.output_len or workload.output_len
        else:
            output_len = _length(rng, workload.output_len, workload.lengths, workload.range_ratio)
        ids = list(prompt.input_ids) if prompt.input_ids is not None else None
        requests.append(Request(prompt.text, ids, output_len))
    return requests


def arrival_offsets(
    count: int, request_rate: float | None, burstiness: float, time_scale: float = 1.0
) -> list[float]:
    """When each request is sent, in real seconds from the start: all at 0 without a rate, else the sums
    of gamma gaps of mean 1/rate (server seconds, times `time_scale` real seconds per server second).
    Every trial gets the same schedule for the same rate and shape, so configs meet the same traffic."""
    if request_rate is None:
        return [0.0] * count
    rng = random.Random(f"autotune:arrivals:{burstiness}")
    theta = 1.0 / (request_rate * burstiness)  # gamma(shape k, scale theta) has mean k * theta = 1 / rate
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now * time_scale)
        now += rng.gammavariate(burstiness, theta)
    return offsets
