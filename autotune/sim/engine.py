"""SGLang's scheduler played forward in model time: admission by KV capacity, the radix cache's prefix
reuse (`autotune.sim.radix`) and its schedule policy, chunked prefill, decode.

The simulated server advances an `Engine` against the wall clock; `run_workload` advances one as fast as
it can, so the model's answer for a workload and what a client measures come from the same code.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.sim.model.noise import SimNoise
from autotune.sim.radix import BLOCK, PrefixCache, block_hashes

if TYPE_CHECKING:
    from autotune.sim.model import MemoryPlan, NodePerformanceModel

# SGLang reserves part of each request's remaining output when admitting (its new_token_ratio).
NEW_TOKEN_RATIO = 0.3
# Above this many waiting requests SGLang's lpm policy falls back to fcfs: sorting by prefix match costs too
# much (schedule_policy.py, `_determine_active_policy`: len(waiting_queue) > 128).
LPM_MAX_QUEUE = 128
# lpm's in-batch prefix caching (schedule_policy.py, IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and
# _DEPRIORITIZE_THRESHOLD, both 32 tokens by default): see Engine._held_for_in_batch_reuse.
IN_BATCH_THRESHOLD_TOKENS = 32


@dataclass
class _Request:
    rid: str
    input_len: int
    max_new_tokens: int
    prefilled: int = 0
    generated: int = 0
    accept_credit: float = 0.0
    accept: float | None = None  # this request's accept length when its prompt sets one (None: the node's)
    blocks: tuple[
        int, ...
    ] = ()  # its prompt's block hashes (autotune.sim.radix); () when its ids are unknown
    cached: int = 0  # prompt tokens the cache served when it was admitted
    probe: bool = False  # a health check's: its steps draw no noise, so it does not shift a run's draws

    @property
    def tokens(self) -> int:
        return self.prefilled + self.generated

    def reserved(self) -> float:
        return self.input_len + self.generated + (self.max_new_tokens - self.generated) * NEW_TOKEN_RATIO


@dataclass(frozen=True)
class Step:
    """One scheduler iteration: how long it took and what it produced."""

    duration_s: float
    kind: str  # prefill | decode
    emitted: dict[str, int]
    finished: list[str]
    aborted: list[str] = field(default_factory=list)
    oom_lines: list[str] | None = None
    # A prefill batch, as SGLang's "Prefill batch" line counts it: requests starting their prefill, the
    # tokens computed, the tokens the cache served the starting ones.
    new_seqs: int = 0
    new_tokens: int = 0
    cached_tokens: int = 0


class Engine:
    """A simulated SGLang scheduler for one launch; call `add` and `step`, nothing here sleeps."""

    def __init__(self, node: NodePerformanceModel, seed: int = 0, noise: SimNoise | float = 0.0) -> None:
        self.node = node
        self.rng = random.Random(seed)
        self.noise = SimNoise.of(noise)
        # Run-to-run spread: one factor per launch, as on real GPUs where a whole run is fast or slow, times
        # the lease's GPU (autotune.sim.model.noise); the host's eager dispatch is the node's (eager_host).
        gpu, node.eager_host = self.noise.lease_factors(node.hw.name)
        self.run_factor = max(0.5, self.rng.gauss(1.0, self.noise.run)) * gpu if self.noise.on else 1.0
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self._rejected: list[str] = []
        self.last_gen_throughput = 0.0
        self._accepted = 0.0
        self._verify_steps = 0
        settings = node.settings
        block = max(BLOCK, settings.page_size)
        self.cache = None if settings.disable_radix_cache else PrefixCache(block)
        self.schedule_policy = settings.schedule_policy
        self.hits: dict[str, int] = {}  # rid -> prompt tokens the cache served it (meta_info.cached_tokens)
        self._starting: set[str] = set()  # admitted since the last prefill batch

    def add(
        self,
        rid: str,
        input_len: int,
        max_new_tokens: int,
        predictability: float = 0.0,
        tokens: Sequence[int] | None = None,
        probe: bool = False,
    ) -> bool:
        """Queue a request; False (and nothing queued) when its prompt can never fit, as SGLang rejects it.
        `predictability` (autotune.sim.predictability) raises its draft acceptance above the node's; the
        prompt's `tokens` (ids, or any stable numbering of its words) let the prefix cache match it."""
        limit = max_input_len(self.node.plan)
        input_len = max(1, input_len)
        if input_len >= limit:
            self._rejected.append(rid)  # reported by the next step, as SGLang answers with an abort
            return False
        # SGLang shortens the output of a request that would outgrow the pool rather than refusing it.
        max_new_tokens = max(1, min(max_new_tokens, limit - input_len))
        accept = self.node.accept_length_for(predictability) if predictability > 0 else None
        blocks = (
            block_hashes(tokens, self.cache.block) if tokens is not None and self.cache is not None else ()
        )
        self.waiting.append(
            _Request(rid, input_len, max_new_tokens, accept=accept, blocks=blocks, probe=probe)
        )
        return True

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._rejected)

    @property
    def stats(self) -> dict[str, float]:
        used = sum(r.tokens for r in self.running)
        accept = self._accepted / self._verify_steps if self._verify_steps else 0.0
        return {
            "running": len(self.running),
            "queued": len(self.waiting),
            "tokens": used,
            "token_usage": used / max(self.node.plan.kv_tokens, 1),
            "last_gen_throughput": self.last_gen_throughput,
            "avg_accept_length": accept,
        }

    def _admit(self) -> None:
        plan, cache = self.node.plan, self.cache
        held: deque[_Request] = deque()
        if cache is not None and self.schedule_policy == "lpm" and 1 < len(self.waiting) <= LPM_MAX_QUEUE:
            # lpm: the waiting requests whose prefix the cache holds longest go first (a stable sort keeps
            # arrival order among equals), so a shared prefix is reused before it is evicted.
            self.waiting = deque(sorted(self.waiting, key=lambda r: -cache.peek(r.blocks)))
            held = self._held_for_in_batch_reuse(cache)
        while self.waiting and len(self.running) < plan.max_running_requests:
            request = self.waiting[0]
            reserved = sum(r.reserved() for r in self.running)
            if self.running and reserved + request.reserved() > plan.kv_tokens:
                break
            self.running.append(self.waiting.popleft())
            if cache is not None and request.prefilled == 0:
                request.cached = request.prefilled = cache.match(request.blocks, request.input_len)
                self.hits[request.rid] = request.cached
            self._starting.add(request.rid)
        self.waiting.extend(held)
        self._evict()

    def _held_for_in_batch_reuse(self, cache: PrefixCache) -> deque[_Request]:
        """lpm's in-batch prefix caching: a waiting request the cache serves at most
        IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD tokens of, whose first IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_
        THRESHOLD tokens another request being prefilled (or ahead of it) shares, waits for that one's prefix
        to be cached instead of computing it too (SGLang schedule_policy.py, both thresholds 32 tokens).
        Taken out of `waiting` for this admission; the caller puts them back at its end."""
        depth = -(-IN_BATCH_THRESHOLD_TOKENS // cache.block)  # blocks that make the 32 tokens
        ahead = {
            r.blocks[depth - 1] for r in self.running if r.prefilled < r.input_len and len(r.blocks) >= depth
        }
        kept: deque[_Request] = deque()
        held: deque[_Request] = deque()
        for request in self.waiting:
            if (
                len(request.blocks) < depth
                or cache.peek(request.blocks) * cache.block > IN_BATCH_THRESHOLD_TOKENS
            ):
                kept.append(request)
            elif request.blocks[depth - 1] in ahead:
                held.append(request)
            else:
                ahead.add(request.blocks[depth - 1])
                kept.append(request)
        self.waiting = kept
        return held

    def _evict(self) -> None:
        """The pool holds the running requests' tokens outside the cache (a prompt not yet prefilled, every
        output); the cache keeps the room left, as SGLang evicts tree leaves when an allocation needs them."""
        if self.cache is not None:
            own = sum(
                r.generated + (r.input_len - r.cached if r.prefilled < r.input_len else 0)
                for r in self.running
            )
            self.cache.evict_to(self.node.plan.kv_tokens - own)

    def _jitter(self, seconds: float, batch: Sequence[_Request]) -> float:
        if not self.noise.on:
            return seconds
        if all(r.probe for r in batch):
            return seconds * self.run_factor
        return seconds * self.run_factor * max(0.5, self.rng.gauss(1.0, self.noise.step))

    def step(self) -> Step:
        """Run one scheduler iteration: a prefill batch if any request awaits prefill, else a decode."""
        self._admit()
        aborted, self._rejected = self._rejected, []
        node, plan = self.node, self.node.plan
        prefilling = [r for r in self.running if r.prefilled < r.input_len]
        if prefilling:
            budget, batch_tokens, context = plan.chunked_prefill_size, 0, 0
            done: dict[str, int] = {}
            batch: list[_Request] = []
            for request in prefilling:
                take = min(budget - batch_tokens, request.input_len - request.prefilled)
                if take <= 0:
                    break
                batch.append(request)
                request.prefilled += take
                batch_tokens += take
                context += request.prefilled
                if request.prefilled == request.input_len:
                    request.generated = 1  # the prefill's last position yields the first token
                    done[request.rid] = 1
                    if self.cache is not None:
                        self.cache.insert(request.blocks)
            if batch_tokens * plan.activation_gb_per_token > plan.avail_after_graph_gb:
                return Step(0.0, "prefill", {}, [], aborted, node.oom_under_load_lines(batch_tokens))
            self._evict()
            starting = [r for r in batch if r.rid in self._starting]
            self._starting.difference_update(r.rid for r in starting)
            duration = self._jitter(node.prefill_step_s(batch_tokens, context), batch)
            cached = sum(r.cached for r in starting)
            return Step(
                duration,
                "prefill",
                done,
                self._finish(done),
                aborted,
                None,
                len(starting),
                batch_tokens,
                cached,
            )

        batch = [r for r in self.running if r.generated > 0]
        if not batch:
            return Step(0.0, "decode", {}, [], aborted)
        context = sum(r.tokens for r in batch)
        duration = self._jitter(node.decode_step_s(len(batch), context), batch)
        node_accept = node.accept_length or 1.0
        emitted = {}
        accepted = 0.0
        for request in batch:
            accept = request.accept or node_accept
            accepted += accept
            request.accept_credit += accept
            whole = int(request.accept_credit)
            request.accept_credit -= whole
            count = min(whole, request.max_new_tokens - request.generated)
            request.generated += count
            emitted[request.rid] = count
        if node.spec:
            self._accepted += accepted
            self._verify_steps += len(batch)
        self.last_gen_throughput = sum(emitted.values()) / duration if duration else 0.0
        self._retract_if_full()
        return Step(duration, "decode", emitted, self._finish(emitted), aborted)

    def _finish(self, emitted: dict[str, int]) -> list[str]:
        finished = [r.rid for r in self.running if r.rid in emitted and r.generated >= r.max_new_tokens]
        self.running = [r for r in self.running if r.rid not in finished]
        return finished

    def _retract_if_full(self) -> None:
        # Out of KV slots mid-decode: SGLang retracts the newest request and recomputes it later.
        while len(self.running) > 1 and sum(r.tokens for r in self.running) > self.node.plan.kv_tokens:
            victim = self.running.pop()
            victim.prefilled = victim.generated = victim.cached = 0
            victim.accept_credit = 0.0
            self.waiting.appendleft(victim)


def max_input_len(plan: MemoryPlan) -> int:
    """SGLang's max_req_input_len: the longest prompt the context and the KV pool can take."""
    return min(plan.context_len, plan.kv_tokens) - 1


def input_too_long(prompt_tokens: int, plan: MemoryPlan) -> str:
    """The abort message SGLang answers a request whose prompt is longer than `max_input_len`."""
    return (
        f"Input length ({prompt_tokens} tokens) exceeds the maximum allowed length "
        f"({max_input_len(plan)} tokens). Use a shorter input or enable --allow-auto-truncate."
    )


@dataclass(frozen=True)
class WorkloadResult:
    """The model's answer for a closed-loop workload, in model time."""

    output_throughput: float
    duration_s: float
    completed: int
    aborted: int
    mean_ttft_s: float
    accept_length: float | None
    oom_lines: list[str] | None = None


def run_workload(
    node: NodePerformanceModel,
    num_prompts: int,
    input_len: int,
    output_len: int,
    concurrency: int,
    *,
    seed: int = 0,
    noise: SimNoise | float = 0.0,
) -> WorkloadResult:
    """Play `num_prompts` requests through the engine, `concurrency` in flight, as fast as possible."""
    engine = node.new_engine(seed=seed, noise=noise)
    clock, submitted = 0.0, 0
    submit_time: dict[str, float] = {}
    first_token: dict[str, float] = {}
    completed = aborted = 0
    output_tokens = 0

    def submit() -> None:
        nonlocal submitted
        rid = f"r{submitted}"
        engine.add(rid, input_len, output_len)
        submit_time[rid] = clock
        submitted += 1

    for _ in range(min(concurrency, num_prompts)):
        submit()
    while engine.has_work:
        step = engine.step()
        if step.oom_lines:
            return WorkloadResult(0.0, clock, completed, aborted, 0.0, None, step.oom_lines)
        clock += step.duration_s
        for rid, count in step.emitted.items():
            first_token.setdefault(rid, clock)
            output_tokens += count
        for rid in step.finished + step.aborted:
            completed += rid in step.finished
            aborted += rid in step.aborted
            if submitted < num_prompts:
                submit()
    ttfts = [first_token[r] - submit_time[r] for r in first_token]
    return WorkloadResult(
        output_throughput=output_tokens / clock if clock else 0.0,
        duration_s=clock,
        completed=completed,
        aborted=aborted,
        mean_ttft_s=sum(ttfts) / len(ttfts) if ttfts else 0.0,
        accept_length=node.accept_length,
    )


@dataclass
class RequestTimes:
    """One request as a streaming client sees it, in model seconds from the start: when it was sent (when
    it got a slot, as a client's --max-concurrency waits), its first token, the gap before each later token
    (a chunk of several tokens spreads its gap over them, as the client does), and when it finished (None:
    aborted or not finished)."""

    sent: float
    first_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    finished: float | None = None
    last: float = 0.0


@dataclass(frozen=True)
class ArrivalsResult:
    """The model's answer for requests sent at given times: each request's times, and when the last ended;
    `stopped_sending` when the caller's `decided` stopped it before every request was sent."""

    requests: list[RequestTimes]
    duration_s: float
    oom_lines: list[str] | None = None
    stopped_sending: bool = False


def run_arrivals(
    node: NodePerformanceModel,
    arrivals: list[float],
    input_len: int,
    output_len: int,
    concurrency: int,
    *,
    seed: int = 0,
    noise: SimNoise | float = 0.0,
    decided: Callable[[RequestTimes], bool] | None = None,
) -> ArrivalsResult:
    """Play requests that arrive at `arrivals` (model seconds from the start), at most `concurrency` in
    flight, through the engine: the open-loop counterpart of `run_workload`, for a request rate. `decided`
    is told each request that ends (finished, or aborted); once it answers True, no more are sent and those
    in flight finish, as the client does (autotune.measure.client.MissLimit)."""
    engine = node.new_engine(seed=seed, noise=noise)
    stopped = False
    clock = 0.0
    pending = deque(sorted((t, f"r{i}") for i, t in enumerate(arrivals)))
    arrived: deque[str] = deque()
    times: dict[str, RequestTimes] = {}
    in_flight = 0
    while True:
        while pending and pending[0][0] <= clock:
            arrived.append(pending.popleft()[1])
        while arrived and in_flight < concurrency:
            rid = arrived.popleft()
            engine.add(rid, input_len, output_len)
            times[rid] = RequestTimes(sent=clock, last=clock)
            in_flight += 1
        if not engine.has_work:
            if not pending:
                break
            clock = pending[0][0]  # idle until the next request arrives
            continue
        step = engine.step()
        if step.oom_lines:
            return ArrivalsResult(list(times.values()), clock, step.oom_lines)
        if step.duration_s == 0 and not (step.emitted or step.finished or step.aborted):
            break  # nothing can run (SGLang would hang as well); the rest count as unfinished
        clock += step.duration_s
        for rid, count in step.emitted.items():
            request = times[rid]
            if count and request.first_token is None:
                request.first_token = clock
                request.tokens, count = 1, count - 1
            if count:
                request.gaps.extend([(clock - request.last) / count] * count)
                request.tokens += count
            if request.tokens:
                request.last = clock
        for rid in step.finished:
            times[rid].finished = clock
        in_flight -= len(step.finished) + len(step.aborted)
        if decided is not None and not stopped:
            ended = [times[rid] for rid in (*step.finished, *step.aborted)]
            if any([decided(request) for request in ended]):  # a list: each ended request is told
                stopped = bool(pending or arrived)
                pending.clear()
                arrived.clear()
    return ArrivalsResult(list(times.values()), clock, stopped_sending=stopped)
