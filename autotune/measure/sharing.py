"""Workloads whose prompts share token prefixes: each kind's rules and requests, a trace's rows.

Every kind sends token ids, and prompts that share a prefix share the same leading ids, so a real server's
radix cache (which matches token ids) can serve them. Each request says how many of its leading tokens an
earlier prompt of the same run already sent (`Request.shared_tokens`): the share an unbounded cache could
serve, which a trial records beside what the server reports it served (`BenchmarkResult.cache_hit_rate`).
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic_core import ArgsKwargs

from autotune.errors import ConfigError, rule_error

if TYPE_CHECKING:
    from autotune.measure.workloads import Request, Workload

__all__ = ["KINDS", "TraceRow", "fill_sizes", "load_trace", "sharing_requests"]

KINDS = ("shared_prefix", "sessions", "trace")


@dataclass(frozen=True)
class TraceRow:
    """One request of a trace: when (ms), its lengths, the ids of its prompt's blocks, its session."""

    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session_id: str | None = None


def _field(section: Any, name: str) -> Any:
    return section.get(name) if isinstance(section, Mapping) else getattr(section, name, None)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@functools.lru_cache(maxsize=8)
def load_trace(path: str, block_size: int = 512) -> tuple[TraceRow, ...]:
    """The rows of a JSONL trace, in time order; a ConfigError names the file, line, field and fix."""
    try:
        content = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            path,
            "",
            path,
            f"cannot read the trace ({exc.strerror or exc})",
            "Set workload.trace.path to a JSONL file (the shipped one: traces/agentic-sessions.jsonl).",
        ) from None
    from autotune.measure.workloads import jsonl_objects

    rows = []
    for where, row in jsonl_objects(path, content):
        stamp, ilen, olen, ids = (
            row.get(k) for k in ("timestamp", "input_length", "output_length", "hash_ids")
        )
        if not (isinstance(stamp, int | float) and not isinstance(stamp, bool) and stamp >= 0):
            raise ConfigError(
                path, f"{where}: timestamp", stamp, "not a time >= 0", "Give the arrival in milliseconds."
            )
        for name, value in (("input_length", ilen), ("output_length", olen)):
            if not _positive_int(value):
                raise ConfigError(
                    path, f"{where}: {name}", value, "not a positive int", "Give a token count >= 1."
                )
        assert isinstance(ilen, int) and isinstance(olen, int)
        if not (isinstance(ids, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
            raise ConfigError(
                path,
                f"{where}: hash_ids",
                ids,
                "not a list of ints",
                "List the prompt's block ids, e.g. [0, 1, 2].",
            )
        blocks = math.ceil(ilen / block_size)
        if len(ids) > blocks:
            raise ConfigError(
                path,
                f"{where}: hash_ids",
                len(ids),
                f"more blocks than {ilen} input tokens fill at {block_size} tokens a block ({blocks})",
                "Set workload.trace.block_size to the trace's (Mooncake's is 512), or fix the row.",
            )
        session = row.get("session_id")
        rows.append(TraceRow(float(stamp), ilen, olen, tuple(ids), None if session is None else str(session)))
    if not rows:
        raise ConfigError(path, "", 0, "holds no requests", "Add at least one line.")
    return tuple(sorted(rows, key=lambda r: r.timestamp_ms))


def _sizes(kind: str, section: Any) -> tuple[int, int, int]:
    """What a kind sends: (requests, the first request's prompt tokens, output tokens)."""
    if kind == "shared_prefix":
        groups, per, system, question = (
            _field(section, k)
            for k in ("num_groups", "prompts_per_group", "system_prompt_len", "question_len")
        )
        return groups * per, system + question, _field(section, "output_len")
    if kind == "sessions":
        sessions, turns = _field(section, "num_sessions"), _field(section, "turns")
        return sessions * turns, _field(section, "first_prompt_len"), _field(section, "output_len")
    rows = load_trace(str(_field(section, "path")), _field(section, "block_size") or 512)
    return len(rows), max(r.input_length for r in rows), round(sum(r.output_length for r in rows) / len(rows))


def fill_sizes(data: Any) -> Any:
    """Workload's before-validator: with a sharing kind, the rules that tie it to the other fields, and
    num_prompts, input_len and output_len (and a session workload's concurrency) filled in from it."""
    args = data.args if isinstance(data, ArgsKwargs) else ()
    kwargs = data.kwargs if isinstance(data, ArgsKwargs) else data
    if args or not isinstance(kwargs, Mapping):
        return data
    kinds = [k for k in KINDS if kwargs.get(k) is not None]
    if not kinds:
        return data
    if len(kinds) > 1:
        raise rule_error(
            f"a workload sends one kind of shared prefixes; this one sets {' and '.join(kinds)}",
            loc=(kinds[1],),
            value=kinds,
            fix=f"Keep one of {', '.join(kinds)}.",
        )
    kind = kinds[0]
    section = kwargs[kind]
    if isinstance(section, Mapping) and not all(
        _positive_int(v) for k, v in section.items() if k not in ("think_time_s", "path", "speedup")
    ):
        # The section's own validation names the bad field; placeholders keep it the only error.
        placeholders = {"num_prompts": 1, "input_len": 1, "output_len": 1, "concurrency": 1, **kwargs}
        return ArgsKwargs((), placeholders) if isinstance(data, ArgsKwargs) else placeholders
    for other, why in (
        ("prompts", "its prompts are generated token ids"),
        ("request_rate", "sessions pace themselves by think_time_s" if kind == "sessions" else ""),
        ("request_rate", "a trace's timestamps are its arrivals" if kind == "trace" else ""),
    ):
        if why and kwargs.get(other) is not None:
            raise rule_error(
                f"{kind} does not take {other}: {why}",
                loc=(other,),
                value=kwargs[other],
                fix=f"Remove workload.{other}.",
            )
    if kwargs.get("lengths", "fixed") != "fixed":
        raise rule_error(
            f"{kind} sets every prompt's length itself",
            loc=("lengths",),
            value=kwargs["lengths"],
            fix="Remove workload.lengths.",
        )
    if kind == "trace" and isinstance(section, Mapping) and not _field(section, "path"):
        return data
    total, input_len, output_len = _sizes(kind, section)
    filled = dict(kwargs)
    filled.setdefault("num_prompts", total)
    if _positive_int(filled["num_prompts"]) and filled["num_prompts"] > total:
        raise rule_error(
            f"{kind} makes {total} requests, fewer than num_prompts",
            loc=("num_prompts",),
            value=filled["num_prompts"],
            fix=f"Leave num_prompts out (all {total}), or set it to at most {total}.",
        )
    for name, derived in (("input_len", input_len), ("output_len", output_len)):
        filled.setdefault(name, derived)
        if filled[name] != derived:
            raise rule_error(
                f"{kind} sets {name} ({derived})",
                loc=(name,),
                value=filled[name],
                fix=f"Leave workload.{name} out; set the lengths in workload.{kind}.",
            )
    if kind == "sessions":
        filled.setdefault("concurrency", _field(section, "num_sessions"))
    return ArgsKwargs((), filled) if isinstance(data, ArgsKwargs) else filled


def _ids(rng: random.Random, count: int) -> list[int]:
    from autotune.measure.workloads import TOKEN_IDS

    return rng.choices(TOKEN_IDS, k=count)


@functools.lru_cache(maxsize=4)
def _cached_requests(workload: Workload, label: str, seed: int) -> tuple[Request, ...]:
    from autotune.measure.workloads import Request

    key = f"autotune:{label}:{seed}"
    requests: list[Request] = []
    if workload.shared_prefix is not None:
        gsp = workload.shared_prefix
        rng = random.Random(f"{key}:shared_prefix")
        made: list[tuple[int, list[int]]] = []
        for group in range(gsp.num_groups):
            system = _ids(rng, gsp.system_prompt_len)
            made.extend((group, system + _ids(rng, gsp.question_len)) for _ in range(gsp.prompts_per_group))
        rng.shuffle(made)  # bench_serving's gsp dataset shuffles its prompts too
        seen: set[int] = set()
        for group, ids in made:
            shared = gsp.system_prompt_len if group in seen else 0
            seen.add(group)
            requests.append(Request(None, ids, gsp.output_len, session=group, shared_tokens=shared))
    elif workload.sessions is not None:
        spec = workload.sessions
        for session in range(spec.num_sessions):
            rng = random.Random(f"{key}:session:{session}")
            prompt = _ids(rng, spec.first_prompt_len)
            for turn in range(spec.turns):
                shared = 0
                if turn:
                    # The previous answer is the client's own ids: the server caches what it generated,
                    # which the client does not resend, so the designed sharing is the previous prompt.
                    shared = len(prompt)
                    prompt = prompt + _ids(rng, spec.output_len) + _ids(rng, spec.user_len)
                requests.append(Request(None, prompt, spec.output_len, session, turn, shared))
    else:
        assert workload.trace is not None
        trace = workload.trace
        rows = load_trace(trace.path, trace.block_size)
        blocks: dict[int, list[int]] = {}
        seen_blocks: set[int] = set()
        sessions: dict[str, int] = {}
        turns: dict[int, int] = {}
        start = rows[0].timestamp_ms
        for index, row in enumerate(rows):
            ids = []
            for hash_id in row.hash_ids:
                if hash_id not in blocks:
                    blocks[hash_id] = _ids(random.Random(f"{key}:block:{hash_id}"), trace.block_size)
                ids.extend(blocks[hash_id])
            ids = ids[: row.input_length]
            ids += _ids(random.Random(f"{key}:tail:{index}"), row.input_length - len(ids))
            leading = 0
            for hash_id in row.hash_ids:
                if hash_id not in seen_blocks:
                    break
                leading += 1
            seen_blocks.update(row.hash_ids)
            session = None
            if row.session_id is not None:
                session = sessions.setdefault(row.session_id, len(sessions))
                turns[session] = turns.get(session, -1) + 1
            arrival = (row.timestamp_ms - start) / 1000 / trace.speedup
            requests.append(
                Request(
                    None,
                    ids,
                    row.output_length,
                    session,
                    turns.get(session, 0) if session is not None else 0,
                    min(leading * trace.block_size, row.input_length),
                    arrival,
                )
            )
    return tuple(requests)


def sharing_requests(workload: Workload, label: str, seed: int) -> list[Request]:
    """Every request a sharing workload sends, in the order it sends them (a session's turns in order);
    the same for the same seed and `label` (which run: "warmup", "bench")."""
    return list(_cached_requests(workload, label, seed))
