"""The built-in benchmark client: SGLang's streaming `POST /generate`, measured like `sglang.bench_serving`.

Prompts are random token ids (like bench_serving's `random-ids` dataset with `--random-range-ratio 1.0`),
so no tokenizer is needed and every request has exactly `input_len` prompt tokens and, with
`ignore_eos`, exactly `output_len` output tokens; or the workload's prompts file, lengths and arrival
rate (see `autotune.measure.workloads`). With an SLO, requests that met it count as goodput.

A workload that shares prefixes (`autotune.measure.sharing`) starts each measurement with an empty cache
(`/flush_cache` after the warm-up, so every config meets the same cold cache), sends a session's turns one
after another, and records the share of prompt tokens the server says it served from its cache (each
response's `meta_info.cached_tokens`) beside the share the workload was designed to share.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp

from autotune.errors import AutotuneError
from autotune.measure.arrival import ScheduledArrival, schedule
from autotune.measure.workloads import Request, Slo, Workload, arrival_offsets, requests_for

__all__ = [
    "SSE_DONE",
    "BenchmarkError",
    "BenchmarkResult",
    "MissLimit",
    "MissTally",
    "RequestOutcome",
    "SSEParser",
    "Slo",
    "Workload",
    "benchmark",
    "percentile",
    "run_benchmark",
    "summarize",
]

SSE_DONE = "[DONE]"

# Warm-up only needs to touch the prefill and decode paths once, not to decode the full length.
_WARMUP_MAX_NEW_TOKENS = 16
_ERROR_TEXT_MAX = 500
_JSON = {"Content-Type": "application/json"}


class BenchmarkError(AutotuneError):
    """The benchmark produced no usable result: every request failed, warm-up failed, or it timed out.

    Carries the partial counts (`completed`, `failed`, `unfinished`) and the first error's text.
    """

    def __init__(
        self,
        reason: str,
        *,
        completed: int = 0,
        failed: int = 0,
        unfinished: int = 0,
        first_error: str | None = None,
    ) -> None:
        self.reason = reason
        self.completed = completed
        self.failed = failed
        self.unfinished = unfinished
        self.first_error = first_error
        super().__init__(
            f"benchmark {reason} ({completed} completed, {failed} failed, {unfinished} unfinished); "
            f"first error: {first_error or 'none'}"
        )


@dataclass(frozen=True)
class BenchmarkResult:
    """One benchmark's measurements, in server time (see `time_scale`); latencies in milliseconds.

    `time_scale` is what the server reported at the top level of /server_info (1.0 when absent, as
    on real SGLang): real seconds per server second. Every measured duration was divided by it and every
    throughput multiplied by it. `accept_length` is the server's `avg_spec_accept_length` of DP rank 0,
    None without speculative decoding.

    A trial's whole measurement (see `autotune.measure.plan`) is one result too: the figures at the top
    level combine its `levels` (one result per concurrency level of a ladder, all on one launch);
    `short` is the short measurement taken first, and `stopped_early` says the trial stopped after it
    (then the top level is the short measurement's). `client` names what measured: `builtin` or
    `bench_serving`.
    """

    workload: Workload
    duration_s: float
    completed: int
    failed: int
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    mean_ttft_ms: float
    p50_ttft_ms: float
    p99_ttft_ms: float
    mean_itl_ms: float
    p50_itl_ms: float
    p99_itl_ms: float
    mean_e2e_latency_ms: float
    p50_e2e_latency_ms: float
    p99_e2e_latency_ms: float
    accept_length: float | None
    time_scale: float
    first_error: str | None = None
    levels: tuple[BenchmarkResult, ...] = ()
    short: BenchmarkResult | None = None
    stopped_early: bool = False
    client: str = "builtin"
    # With the workload's SLO: good requests per server second, and the share of requests sent that were good.
    request_goodput: float | None = None
    slo_attainment: float | None = None
    # With the workload's SLO: how many of the successful requests broke each limit set (by its key in the
    # study file: ttft_ms, tpot_ms, e2el_ms; a request may break more than one).
    slo_over: dict[str, int] | None = None
    # A load search (autotune.measure.load_search): the load at which the SLO attainment crossed its
    # threshold, why the search ended, and a warning when it ran out of steps before its tolerance.
    max_load: float | None = None
    load_stopped_by: str | None = None
    load_warning: str | None = None
    # A load search stopped below its cutoff (`stopped_early`): the lowest load that missed, which its
    # max_load lies below.
    load_below: float | None = None
    # The width of the bracket the search ended in (its lowest miss less its highest pass): its max_load
    # lies within it, and two launches ending in one bracket can measure the same value (noise.pooled).
    load_bracket: float | None = None
    # The step a load search missed at just above its max_load: its load, how many of its requests broke each
    # limit (`slo_over`) and how many it ran at once on average (Little's law: request rate x mean latency).
    load_missed: dict[str, Any] | None = None
    # A workload that shares prefixes: the share of prompt tokens the server served from its prefix cache
    # (its responses' meta_info.cached_tokens; None when it reported none), the share an unbounded cache
    # could have served, and the mean TTFT of sessions' first turns and of their later turns.
    cache_hit_rate: float | None = None
    designed_hit_rate: float | None = None
    mean_ttft_first_turn_ms: float | None = None
    mean_ttft_later_turns_ms: float | None = None
    # A benchmark that stopped sending once its outcome was decided (`MissLimit`): the prompts it sent, of
    # its workload's num_prompts; None: it sent them all.
    decided_after: int | None = None

    def to_json(self) -> str:
        """Serialize to a JSON object (the workload nested under "workload", the parts under theirs)."""
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> BenchmarkResult:
        """Parse what `to_json` wrote."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BenchmarkResult:
        """Build a result from `dataclasses.asdict` of one (what `to_json` writes, parsed)."""
        data = dict(data)
        data["workload"] = Workload(**data["workload"])
        data["levels"] = tuple(cls.from_dict(level) for level in data.get("levels") or ())
        if data.get("short") is not None:
            data["short"] = cls.from_dict(data["short"])
        return cls(**data)


@dataclass
class RequestOutcome:
    """One request as the client saw it, in real (wall-clock) seconds; on a simulated server that reports
    its model clock (`server_clock`), in that clock's seconds times the time scale, so in the same units.
    `sent_at` and `ended_at` are readings of the clock it was timed by (the server's in server seconds)."""

    success: bool = False
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    latency_s: float = 0.0
    error: str | None = None
    turn: int = 0  # the request's turn in its session (0: the first, or no session)
    cached_tokens: int | None = (
        None  # prompt tokens the server served from its cache (meta_info.cached_tokens)
    )
    server_clock: bool = False
    sent_at: float = 0.0
    ended_at: float = 0.0


@dataclass(frozen=True)
class MissLimit:
    """Where a benchmark's outcome is decided: once more than `missed` of its requests missed the SLO (a
    failed one included) or more than `failed` failed, the client sends no more of them and lets those in
    flight finish (autotune.measure.load_search sets both for a step of its search)."""

    missed: int
    failed: int = 0

    def tally(self, slo: Slo | None, time_scale: float = 1.0) -> MissTally:
        """A count of the ended requests of one benchmark against this limit."""
        return MissTally(self, slo, 1000.0 / time_scale)


@dataclass
class MissTally:
    """The requests of one benchmark that missed or failed so far; `ms` turns their seconds into server ms."""

    limit: MissLimit
    slo: Slo | None
    ms: float
    missed: int = 0
    failed: int = 0

    def ended(self, outcome: RequestOutcome) -> bool:
        """Count a request that ended; whether the benchmark's outcome is now decided."""
        self.failed += not outcome.success
        self.missed += not outcome.success or self.slo is None or not _good(outcome, self.slo, self.ms)
        return self.missed > self.limit.missed or self.failed > self.limit.failed


class SSEParser:
    """Incremental parser of a server-sent-events byte stream; returns each event's data payload.

    Bytes may arrive split anywhere (inside a line, inside a UTF-8 character); `feed` returns the
    events completed so far. Multi-line data fields are joined with newlines, comments and other
    fields are ignored, as the SSE specification says. SGLang's final payload is `SSE_DONE`.
    """

    def __init__(self) -> None:
        self._buf = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes) -> list[str]:
        """Add bytes; return the payloads of the events they complete."""
        *lines, self._buf = (self._buf + chunk).split(b"\n")
        events: list[str] = []
        for raw in lines:
            line = raw.rstrip(b"\r").decode("utf-8")
            if not line:
                if self._data:
                    events.append("\n".join(self._data))
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)
        return events

    def close(self) -> list[str]:
        """End of stream: return a last event that lacked its closing blank line, if any."""
        events = self.feed(b"\n\n") if self._buf or self._data else []
        self._buf = b""
        return events


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile with linear interpolation (numpy's default, which bench_serving uses); 0.0
    for no values, as bench_serving's `np.percentile(x or 0, q)`."""
    if not 0 <= q <= 100:
        raise ValueError(f"`0 <= q <= 100` must hold, but got ({q=}).")
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    outcomes: Sequence[RequestOutcome],
    duration_s: float,
    workload: Workload,
    *,
    time_scale: float = 1.0,
    accept_length: float | None = None,
    designed_hit_rate: float | None = None,
) -> BenchmarkResult:
    """Turn per-request outcomes and the real wall-clock `duration_s` into a result in server time.

    Durations are divided by `time_scale` and throughputs thereby multiplied by it.
    """
    if not (math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"`time_scale > 0` must hold, but got ({time_scale=}).")
    ok = [o for o in outcomes if o.success]
    ms = 1000.0 / time_scale  # real seconds -> server milliseconds
    ttfts = [o.ttft_s * ms for o in ok if o.ttft_s is not None]
    itls = [gap * ms for o in ok for gap in o.itl_s]
    e2es = [o.latency_s * ms for o in ok]
    server_duration = duration_s / time_scale
    total_in = sum(o.prompt_tokens for o in ok)
    total_out = sum(o.output_tokens for o in ok)
    over = [_over(o, workload.slo, ms) for o in ok] if workload.slo is not None else []
    good = sum(not broke for broke in over)
    reported = [o for o in ok if o.cached_tokens is not None]
    reported_prompt = sum(o.prompt_tokens for o in reported)
    turns = workload.sessions is not None or (workload.trace is not None and any(o.turn for o in outcomes))
    first = [o.ttft_s * ms for o in ok if o.ttft_s is not None and o.turn == 0]
    later = [o.ttft_s * ms for o in ok if o.ttft_s is not None and o.turn > 0]

    def rate(amount: float) -> float:
        return amount / server_duration if server_duration > 0 else 0.0

    return BenchmarkResult(
        workload=workload,
        duration_s=server_duration,
        completed=len(ok),
        failed=len(outcomes) - len(ok),
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=rate(len(ok)),
        input_throughput=rate(total_in),
        output_throughput=rate(total_out),
        mean_ttft_ms=_mean(ttfts),
        p50_ttft_ms=percentile(ttfts, 50),
        p99_ttft_ms=percentile(ttfts, 99),
        mean_itl_ms=_mean(itls),
        p50_itl_ms=percentile(itls, 50),
        p99_itl_ms=percentile(itls, 99),
        mean_e2e_latency_ms=_mean(e2es),
        p50_e2e_latency_ms=percentile(e2es, 50),
        p99_e2e_latency_ms=percentile(e2es, 99),
        accept_length=accept_length,
        time_scale=time_scale,
        first_error=next((o.error for o in outcomes if o.error), None),
        request_goodput=rate(good) if workload.slo is not None else None,
        slo_attainment=good / len(outcomes) if workload.slo is not None and outcomes else None,
        slo_over=(
            {name: sum(name in broke for broke in over) for name in workload.slo.limits}
            if workload.slo is not None
            else None
        ),
        cache_hit_rate=(
            sum(o.cached_tokens or 0 for o in reported) / reported_prompt
            if workload.sharing is not None and reported_prompt
            else None
        ),
        designed_hit_rate=designed_hit_rate,
        mean_ttft_first_turn_ms=_mean(first) if turns and first else None,
        mean_ttft_later_turns_ms=_mean(later) if turns and later else None,
    )


def designed_hit_rate(requests: Sequence[Request]) -> float | None:
    """The share of the requests' prompt tokens that an earlier request of the run already sent as the same
    leading tokens: what an unbounded prefix cache could serve (None: none says)."""
    total = sum(r.prompt_tokens for r in requests)
    return sum(r.shared_tokens for r in requests) / total if total else None


def _good(outcome: RequestOutcome, slo: Slo, ms: float) -> bool:
    """Whether a successful request met the SLO."""
    return not _over(outcome, slo, ms)


def _over(outcome: RequestOutcome, slo: Slo, ms: float) -> tuple[str, ...]:
    """The limits a successful request broke, as SGLang 0.5.23's calculate_goodput decides (a single-token
    answer has no inter-token gap: its TPOT counts as 0)."""
    ttft = (outcome.ttft_s or 0.0) * ms
    latency = outcome.latency_s * ms
    tpot = (latency - ttft) / (outcome.output_tokens - 1) if outcome.output_tokens > 1 else 0.0
    return slo.over(ttft, tpot, latency)


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:_ERROR_TEXT_MAX]


def _body(prompt: Request, max_new_tokens: int) -> bytes:
    """One streaming /generate request's JSON body."""
    payload = {
        **({"text": prompt.text} if prompt.input_ids is None else {"input_ids": prompt.input_ids}),
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }
    return json.dumps(payload).encode()


async def _generate(
    session: aiohttp.ClientSession,
    url: str,
    prompt: Request,
    max_new_tokens: int,
    encoded: bytes | None = None,
    time_scale: float = 1.0,
    arrival: ScheduledArrival | None = None,
) -> RequestOutcome:
    """Send one streaming /generate request (its JSON body `encoded` beforehand, so that a benchmark's
    requests leave together and the clock times the server, not the encoding of long prompts) and time it;
    never raises for server or network errors. A request sent at a scheduled time carries its `arrival`
    (autotune.measure.arrival), which only a simulated server reads.

    Timed by the client's clock, as bench_serving does; a simulated server's chunks carry its model clock
    (`meta_info.sim_received`, `sim_time`: real SGLang sends neither), and then the request is timed by
    that, since at a clock sped up 50 times a client's few milliseconds late are seconds of server time."""
    out = RequestOutcome(prompt_tokens=prompt.prompt_tokens, turn=prompt.turn)
    request_body = encoded if encoded is not None else _body(prompt, max_new_tokens)
    unit = 1.0  # real seconds per second of the clock that times this request
    parser = SSEParser()
    done = False
    last_tokens = 0
    most_recent = 0.0
    headers = {**_JSON, **arrival.header()} if arrival is not None else _JSON
    st = ended = time.perf_counter()
    try:
        async with session.post(url, data=request_body, headers=headers) as resp:
            if resp.status != 200:
                body = await resp.text(errors="replace")
                out.error = f"HTTP {resp.status} {resp.reason or ''}: {body}"[:_ERROR_TEXT_MAX]
                return out
            async for data in resp.content.iter_any():
                for event in parser.feed(data):
                    if event == SSE_DONE:
                        done = True
                        break
                    chunk = json.loads(event)
                    if not isinstance(chunk, dict):
                        raise ValueError(f"stream chunk is not a JSON object: {event[:100]!r}")
                    if "error" in chunk:
                        out.error = f"server error: {json.dumps(chunk['error'])}"[:_ERROR_TEXT_MAX]
                        return out
                    now = time.perf_counter()
                    meta = chunk.get("meta_info") or {}
                    if meta.get("sim_time") is not None and meta.get("sim_received") is not None:
                        if not out.server_clock and last_tokens == 0:
                            out.server_clock, st, unit = True, float(meta["sim_received"]), time_scale
                        if out.server_clock:
                            now = ended = float(meta["sim_time"])
                    reason = meta.get("finish_reason")
                    if isinstance(reason, dict) and reason.get("type") == "abort":
                        out.error = f"request aborted: {reason.get('message', '')}"[:_ERROR_TEXT_MAX]
                        return out
                    out.prompt_tokens = int(meta.get("prompt_tokens", out.prompt_tokens))
                    if meta.get("cached_tokens") is not None:  # set once the prefill matched the cache
                        out.cached_tokens = int(meta["cached_tokens"])
                    # completion_tokens is cumulative; output_ids carries only this chunk's new tokens.
                    tokens = meta.get("completion_tokens")
                    tokens = (
                        int(tokens)
                        if tokens is not None
                        else last_tokens + len(chunk.get("output_ids") or [])
                    )
                    new = tokens - last_tokens
                    if new <= 0:
                        continue
                    if out.ttft_s is None:
                        out.ttft_s = (now - st) * unit
                    else:
                        # A chunk with k new tokens (speculative decoding accepts several per step, and
                        # the server may batch stream output) counts as k gaps of chunk_gap / k, as
                        # sglang.bench_serving does: ITL stays per token, comparable with and without
                        # speculation and with bench_serving's own numbers.
                        out.itl_s.extend([(now - most_recent) * unit / new] * new)
                    most_recent = now
                    last_tokens = tokens
                if done:
                    break
            if not done:
                for event in parser.close():
                    done = done or event == SSE_DONE
            if not out.server_clock:
                ended = time.perf_counter()
            out.sent_at, out.ended_at, out.latency_s = st, ended, (ended - st) * unit
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
        # ValueError covers malformed JSON and UTF-8 in the stream; the rest are network and server deaths.
        out.error = _error_text(e)
        return out
    out.output_tokens = last_tokens
    if not done:
        out.error = f"stream ended before {SSE_DONE} after {last_tokens} tokens"
    elif last_tokens == 0:
        out.error = "stream finished without generating a token"
    else:
        out.success = True
    return out


async def _server_info(session: aiohttp.ClientSession, base_url: str) -> dict[str, Any]:
    """GET /server_info (0.5.8+), else the older /get_server_info, which 0.5.17+ log as deprecated on every
    call; {} when neither answers with a JSON object."""
    for path in ("/server_info", "/get_server_info"):
        try:
            async with session.get(base_url + path) as resp:
                if resp.status == 200:
                    info = await resp.json(content_type=None)
                    if isinstance(info, dict):
                        return info
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
            continue
    return {}


async def _flush_cache(session: aiohttp.ClientSession, base_url: str) -> None:
    """Empty the server's prefix cache (SGLang's /flush_cache), so that the warm-up and an earlier benchmark
    on the same launch leave nothing behind; a server that refuses keeps its cache (the hit rate shows it)."""
    try:
        async with session.post(base_url + "/flush_cache") as resp:
            await resp.read()
    except (TimeoutError, aiohttp.ClientError, OSError):
        return


def _time_scale(info: dict[str, Any]) -> float | None:
    value = info.get("time_scale")
    if value is None:
        return None
    scale = float(value)
    if not (math.isfinite(scale) and scale > 0):
        raise BenchmarkError(f"cannot convert units: the server reported time_scale={value!r}, not > 0")
    return scale


def _accept_length(info: dict[str, Any]) -> float | None:
    states = info.get("internal_states")
    if isinstance(states, list) and states and isinstance(states[0], dict):
        value = states[0].get("avg_spec_accept_length")
        if value is not None:
            return float(value)
    return None


# The env var that carries the server's --api-key to a client on the node: sglang.bench_serving reads it
# (SGLang 0.5.17/0.5.23 benchmark/serving.py get_auth_headers), and so does autotune.measure.remote.
API_KEY_ENV = "OPENAI_API_KEY"


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The header every request to a server started with `--api-key` carries (SGLang 0.5.17
    srt/utils/auth.py decide_request_auth: `Authorization: Bearer <key>`, else 401)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def run_benchmark(
    base_url: str,
    workload: Workload,
    *,
    timeout_s: float,
    seed: int = 0,
    api_key: str | None = None,
    stop: MissLimit | None = None,
) -> BenchmarkResult:
    """Benchmark the SGLang server at `base_url` with `workload`; prompts are fixed by `seed`; every
    request carries `api_key` (the server's `--api-key`). With `stop`, no request is sent once the
    outcome is decided; those in flight finish, and the result's `decided_after` says how many were sent.

    Warm-up requests run first and are not counted. Failed requests are counted in the result; raises
    `BenchmarkError` when a warm-up request or every request fails, or when the whole benchmark takes
    longer than `timeout_s` real seconds.
    """
    base_url = base_url.rstrip("/")
    url = base_url + "/generate"
    outcomes: list[RequestOutcome] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30)  # the overall deadline bounds the rest
    connector = aiohttp.TCPConnector(limit=0)  # the semaphore bounds what is in flight
    headers = auth_headers(api_key)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector, headers=headers) as session:
        try:
            async with asyncio.timeout(timeout_s):
                info = await _server_info(session, base_url)
                warmups = await asyncio.gather(
                    *(
                        _generate(session, url, prompt, min(prompt.output_len, _WARMUP_MAX_NEW_TOKENS))
                        for prompt in requests_for(workload, "warmup", seed, workload.warmup_requests)
                    )
                )
                bad = [w for w in warmups if not w.success]
                if bad:
                    raise BenchmarkError(
                        f"warm-up failed: {len(bad)} of {len(warmups)} warm-up requests failed",
                        first_error=bad[0].error,
                    )

                semaphore = asyncio.Semaphore(workload.concurrency)
                prompts = requests_for(workload, "bench", seed, workload.num_prompts)
                bodies = {id(p): _body(p, p.output_len) for p in prompts}  # before the clock starts
                scale = _time_scale(info) or 1.0
                if workload.sharing is not None:
                    await _flush_cache(session, base_url)
                # When each request is due, in server seconds from the start (all at once: 0).
                if workload.trace is not None:
                    due = [p.arrival_s or 0.0 for p in prompts]
                else:
                    due = arrival_offsets(workload.num_prompts, workload.request_rate, workload.burstiness)
                arrivals = schedule(due, workload.concurrency)
                tally = stop.tally(workload.slo, scale) if stop is not None else None
                decided = asyncio.Event()

                async def send(
                    prompt: Request, arrival: ScheduledArrival | None = None
                ) -> RequestOutcome | None:
                    # Waits for a slot, as bench_serving's --max-concurrency; not sent once the outcome is
                    # decided (those in flight finish: the next benchmark meets an idle server).
                    async with semaphore:
                        if decided.is_set():
                            return None
                        outcome = await _generate(
                            session, url, prompt, prompt.output_len, bodies[id(prompt)], scale, arrival
                        )
                        outcomes.append(outcome)
                    if tally is not None and tally.ended(outcome):
                        decided.set()
                    return outcome

                async def one(prompt: Request, arrival: ScheduledArrival) -> None:
                    await _sleep_unless(decided, start + arrival.at_s * scale - time.perf_counter())
                    await send(prompt, arrival)  # at its arrival time

                async def conversation(turns: list[Request]) -> None:
                    # A session's next turn follows its previous answer, after the user's think time.
                    for index, prompt in enumerate(turns):
                        if index and workload.sessions is not None:
                            await _sleep_unless(decided, workload.sessions.think_time_s * scale)
                        outcome = await send(prompt)
                        if outcome is None or not outcome.success:
                            break  # the later turns would re-send a context the server never answered

                start = time.perf_counter()
                if workload.sessions is not None:
                    by_session: dict[int | None, list[Request]] = {}
                    for prompt in prompts:
                        by_session.setdefault(prompt.session, []).append(prompt)
                    await asyncio.gather(*(conversation(turns) for turns in by_session.values()))
                else:
                    await asyncio.gather(*(one(p, a) for p, a in zip(prompts, arrivals, strict=True)))
                duration = time.perf_counter() - start
                if outcomes and all(o.server_clock for o in outcomes):
                    # From the first request's arrival to the last one's end, on the server's clock.
                    clock = max(o.ended_at for o in outcomes) - min(o.sent_at for o in outcomes)
                    duration = clock * scale
                after = await _server_info(session, base_url)
        except TimeoutError:
            completed = sum(o.success for o in outcomes)
            raise BenchmarkError(
                f"did not finish within {timeout_s:g} s",
                completed=completed,
                failed=len(outcomes) - completed,
                unfinished=workload.num_prompts - len(outcomes),
                first_error=next((o.error for o in outcomes if o.error), None),
            ) from None

    time_scale = _time_scale(info) or _time_scale(after) or 1.0
    result = summarize(
        outcomes,
        duration,
        workload,
        time_scale=time_scale,
        accept_length=_accept_length(after),
        designed_hit_rate=designed_hit_rate(prompts) if workload.sharing is not None else None,
    )
    if result.completed == 0:
        raise BenchmarkError(
            "failed: every request failed", failed=result.failed, first_error=result.first_error
        )
    if decided.is_set() and len(outcomes) < len(prompts):
        result = replace(result, decided_after=len(outcomes))
    return result


async def _sleep_unless(event: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or until `event` is set."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), max(0.0, seconds))


def benchmark(
    base_url: str,
    workload: Workload,
    timeout_s: float,
    seed: int = 0,
    api_key: str | None = None,
    stop: MissLimit | None = None,
) -> BenchmarkResult:
    """Synchronous `run_benchmark` for callers without an event loop (a Ray actor method, the CLI)."""
    job = run_benchmark(base_url, workload, timeout_s=timeout_s, seed=seed, api_key=api_key, stop=stop)
    return asyncio.run(job)
