"""What a benchmark sends and when: prompts from a file or random ids, their lengths, and arrival times.

`Workload` is both what a study file's `workload:` section is validated into and what a node receives:
one type, so one rule for each field. The prompt files, the arrivals and the workloads that share
prefixes: docs/design.md, "Workloads", and docs/workloads.md.
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, StrictInt, model_validator
from pydantic import dataclasses as pydantic_dataclasses

from autotune.errors import ConfigError, rule_error

__all__ = [
    "Lengths",
    "PromptsFormat",
    "Request",
    "Sessions",
    "SharedPrefix",
    "Slo",
    "Trace",
    "Workload",
    "arrival_offsets",
    "load_prompts",
    "prompts_format",
    "requests_for",
    "text_tokens",
]

PromptsFormat = Literal["auto", "jsonl", "sharegpt"]
Lengths = Literal["fixed", "uniform", "file"]

_Count = Annotated[StrictInt, Field(gt=0)]
_Positive = Annotated[float, Field(gt=0)]
# Validated when built, from a study file or from JSON; unknown keys are errors, as in every study file.
_STRICT = ConfigDict(extra="forbid")


@pydantic_dataclasses.dataclass(frozen=True, config=_STRICT)
class Slo:
    """Per-request latency limits in server milliseconds; a request that meets every one set is good.

    SGLang 0.5.23's `bench_serving --goodput ttft:MS tpot:MS e2el:MS` (sglang/benchmark/goodput.py): time to
    first token, time per output token after the first (a request's (latency - TTFT) / (output tokens - 1),
    its mean inter-token latency), end-to-end latency.
    """

    ttft_ms: _Positive | None = None
    tpot_ms: _Positive | None = None
    e2el_ms: _Positive | None = None

    @model_validator(mode="after")
    def _one_limit(self) -> Slo:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise rule_error("an SLO needs a limit", value={}, fix="Set ttft_ms, tpot_ms or e2el_ms.")
        return self

    @property
    def limits(self) -> dict[str, float]:
        """The limits set, by their keys in the study file."""
        named = {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2el_ms": self.e2el_ms}
        return {name: limit for name, limit in named.items() if limit is not None}

    def over(self, ttft_ms: float, tpot_ms: float, e2el_ms: float) -> tuple[str, ...]:
        """The limits a request broke, by their keys in the study file."""
        observed = {"ttft_ms": ttft_ms, "tpot_ms": tpot_ms, "e2el_ms": e2el_ms}
        return tuple(name for name, limit in self.limits.items() if observed[name] > limit)

    def met(self, ttft_ms: float, tpot_ms: float, e2el_ms: float) -> bool:
        return not self.over(ttft_ms, tpot_ms, e2el_ms)


@pydantic_dataclasses.dataclass(frozen=True, config=_STRICT)
class SharedPrefix:
    """`num_groups` groups of `prompts_per_group` prompts; a group's prompts start with the same
    `system_prompt_len` tokens and end with their own `question_len`; each asks `output_len` tokens. SGLang
    bench_serving's `generated-shared-prefix` dataset (`--gsp-num-groups`, `--gsp-prompts-per-group`,
    `--gsp-system-prompt-len`, `--gsp-question-len`, `--gsp-output-len`), its prompts shuffled as it does."""

    num_groups: _Count
    prompts_per_group: _Count
    system_prompt_len: _Count
    question_len: _Count
    output_len: _Count


@pydantic_dataclasses.dataclass(frozen=True, config=_STRICT)
class Sessions:
    """`num_sessions` conversations of `turns` turns each, all open at once. The first turn sends
    `first_prompt_len` tokens; each later turn sends the previous turn's prompt, then the previous answer
    (`output_len` tokens), then a new user message of `user_len` tokens, `think_time_s` server seconds after
    the previous answer ended."""

    num_sessions: _Count
    turns: _Count
    first_prompt_len: _Count
    user_len: _Count
    output_len: _Count
    think_time_s: Annotated[float, Field(ge=0)] = 0.0


@pydantic_dataclasses.dataclass(frozen=True, config=_STRICT)
class Trace:
    """A request trace to replay: a JSONL file (in a study file, relative to it), one request a line with
    the Mooncake trace's fields (`timestamp` in ms, `input_length`, `output_length`, `hash_ids`: one id per
    `block_size` prompt tokens, equal ids meaning equal blocks) and an optional `session_id`. Its times are
    divided by `speedup` (2.0 sends it twice as fast)."""

    path: Annotated[str, Field(min_length=1)]
    block_size: _Count = 512  # Mooncake's traces hash 512-token blocks
    speedup: _Positive = 1.0


@pydantic_dataclasses.dataclass(frozen=True, config=_STRICT)
class Workload:
    """What a benchmark sends: `num_prompts` requests of `input_len` random prompt tokens and `output_len`
    output tokens, at most `concurrency` in flight, after `warmup_requests` uncounted ones.

    Or the prompts of the file `prompts` (JSONL or ShareGPT JSON; in a study file, relative to it), lengths
    `fixed`, `uniform` (in [length * range_ratio, length]) or from the file, sent at `request_rate` per
    server second (gamma gaps of shape `burstiness`, 1.0 Poisson; None: all at once). With `slo`, the
    result's goodput counts the requests that met it.
    """

    num_prompts: _Count
    input_len: _Count
    output_len: _Count
    concurrency: _Count  # the most requests in flight (with request_rate too, as --max-concurrency)
    # Sent before the measured requests, on a fresh launch only (see `on_warm_server`); 0: none.
    warmup_requests: Annotated[StrictInt, Field(ge=0)] = 1
    prompts: Annotated[str, Field(min_length=1)] | None = None
    prompts_format: PromptsFormat = "auto"
    # fixed: input_len/output_len; uniform: in [len * range_ratio, len]; file: the prompts file's output_len.
    lengths: Lengths = "fixed"
    range_ratio: Annotated[float, Field(gt=0, le=1)] = 0.5
    request_rate: _Positive | None = None  # requests/s; None: all at once
    burstiness: _Positive = 1.0
    slo: Slo | None = None
    # Prompts that share prefixes (at most one of these, and not with `prompts`); each sets num_prompts,
    # input_len and output_len when they are left out (autotune.measure.sharing).
    shared_prefix: SharedPrefix | None = None
    sessions: Sessions | None = None
    trace: Trace | None = None

    @model_validator(mode="before")
    @classmethod
    def _sizes_from_sharing(cls, data: Any) -> Any:
        from autotune.measure.sharing import fill_sizes  # the rules of each sharing kind live there

        return fill_sizes(data)

    @property
    def sharing(self) -> str | None:
        """Which prefix-sharing kind this workload sends (`shared_prefix`, `sessions`, `trace`), or None."""
        return next((k for k in ("shared_prefix", "sessions", "trace") if getattr(self, k) is not None), None)

    @model_validator(mode="after")
    def _lengths_from_file(self) -> Workload:
        if self.lengths == "file" and self.prompts is None:
            raise rule_error(
                "lengths from the file need a prompts file",
                loc=("lengths",),
                value=self.lengths,
                fix="Set workload.prompts, or use lengths: fixed | uniform.",
            )
        return self

    def on_warm_server(self) -> Workload:
        """This workload for a benchmark after the first on the same launch: the launch's first one warmed
        the server up, so no warm-up requests."""
        return replace(self, warmup_requests=0)


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
    """One request to send: `text` or `input_ids` (exactly one), `output_len` new tokens. A workload that
    shares prefixes also says which `session` it belongs to and its `turn` there (0: the first), how many
    leading tokens an earlier prompt of the run already sent (`shared_tokens`: what an unbounded prefix cache
    could serve), and, for a trace, when it is sent (`arrival_s`, server seconds from the start)."""

    text: str | None
    input_ids: list[int] | None
    output_len: int
    session: int | None = None
    turn: int = 0
    shared_tokens: int = 0
    arrival_s: float | None = None

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


def jsonl_objects(
    path: str | Path, content: str, object_fix: str = "Write one JSON object a line."
) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each non-blank line of a JSONL file as ("line N", its object); a line that is not a JSON object is
    a ConfigError naming the file and the line (`object_fix` says what a line should hold)."""
    for number, line in enumerate(content.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise _bad(path, where, line[:60], f"not JSON ({exc})", "Write one JSON object a line.") from None
        if not isinstance(row, dict):
            raise _bad(path, where, line[:60], "not a JSON object", object_fix)
        yield where, row


def _jsonl(path: str | Path, content: str) -> list[Prompt]:
    prompts = []
    for where, row in jsonl_objects(path, content, 'Write {"text": "..."} a line.'):
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
    if workload.sharing is not None:
        from autotune.measure.sharing import sharing_requests

        return sharing_requests(workload, label, seed)[:count]
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
