"""Serving in real time: the requests in flight, the engine stepped against the wall clock, each step's
tokens delivered to its clients, and the scheduler's batch log lines."""

from __future__ import annotations

import asyncio
import heapq
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, NoReturn

from autotune.errors import AutotuneError
from autotune.measure.arrival import ScheduledArrival
from autotune.sim.engine import Step, input_too_long
from autotune.sim.server.launch import Launch, LaunchPart
from autotune.sim.server.schedule import ArrivalSchedule, Due

IDLE_STEP_S = 0.001  # a step that did nothing: yield a little wall time instead of spinning
MAX_BUSY_S = 0.002  # longest the engine loop keeps the event loop when it is behind schedule
# How the engine waits for requests on their way (see Serving.run_engine), in wall seconds: a hold ends
# once nothing has happened for REPLY_WINDOW_S (a client busy on a loaded machine replies in tens of ms; a
# session's think time shorter than this counts as none: 12.5 s of server time at 50x, 5 s at 20x), a
# burst once no request has come for BURST_GAP_S, either after MAX_HOLD_S.
REPLY_WINDOW_S = 0.25
BURST_GAP_S = 0.03
MAX_HOLD_S = 1.0
# How long the engine waits for a scheduled request that is due (see Serving.run_engine), in wall seconds:
# its client sends it when the engine's clock gets there, so only a client gone leaves it waiting this long.
SCHEDULE_WAIT_S = 5.0
# The model clock counts in ticks of 2**-20 s (about a microsecond): sums and differences of its readings are
# then exact, so a reading does not depend on how much idle time (wall time, scaled) came before it.
TICKS_PER_S = 2**20
FAKE_WORDS = (
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "was", "with", "be", "by",
    "on", "not", "he", "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had",
    "they", "you", "were", "their", "one", "all", "we", "can", "her", "has", "there", "been", "if",
    "more", "when", "will", "would", "who", "so", "no", "model", "token", "server", "batch", "graph",
)  # fmt: skip


def _ticks(seconds: float) -> float:
    """`seconds` on the model clock's grid (TICKS_PER_S)."""
    return round(seconds * TICKS_PER_S) / TICKS_PER_S


# -- fake tokenizer ----------------------------------------------------------------------------------------
def fake_token_id(position: int) -> int:
    """The id of the `position`-th generated token of any request: deterministic, never special."""
    return 1000 + (position * 7919) % 30000


def fake_token_text(token_id: int) -> str:
    return " " + FAKE_WORDS[token_id % len(FAKE_WORDS)]


def count_text_tokens(text: str) -> int:
    """The fake tokenizer: one token per whitespace-separated word, at least one."""
    return max(1, len(text.split()))


# -- requests in flight ------------------------------------------------------------------------------------
@dataclass
class ClientRequest:
    """One generation the engine runs: its token deliveries arrive on `queue` (None = finished)."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    queue: asyncio.Queue[int | None] = field(default_factory=asyncio.Queue)
    generated: int = 0
    verify_ct: int = 0
    abort_message: str | None = None
    cached_tokens: int = 0  # prompt tokens the prefix cache served (meta_info.cached_tokens)
    probe: bool = False  # a health check's
    # On the server's model clock (Serving.model_now): when it came, and when its latest tokens were made.
    received_at: float = 0.0
    delivered_at: float = 0.0


@dataclass
class _Chunk:
    """What one streamed delivery carries: the new token ids and whether the request is done."""

    new_ids: list[int]
    finished: bool


@dataclass
class _Scheduled:
    """A scheduled request that has come and waits for its model time: what the engine will be given."""

    request: ClientRequest
    predictability: float
    tokens: list[int] | None


class BadRequest(AutotuneError):
    """A request SGLang answers with 400 and this message."""


class Serving(LaunchPart):
    """The engine of one launch played in real time, and the requests it is generating for."""

    def __init__(self, launch: Launch) -> None:
        super().__init__(launch)
        self.scale = self.options.time_scale
        self.engine = self.node.new_engine(seed=self.options.seed, noise=self.options.noise)
        self.requests: dict[str, ClientRequest] = {}
        self.ready = False
        self.tokens_after_ready = 0
        self.last_gen_throughput = 0.0
        self._work = asyncio.Event()
        self._decode_steps = 0
        self._interval_tokens = 0
        self._interval_model_s = 0.0
        self._arrivals = 0  # requests submitted since the launch
        self._incoming = 0  # requests whose body is being read and parsed
        self._arrived = asyncio.Event()  # set when a request starts arriving or is submitted
        self._replying = True  # False once a client let requests end without sending more (a run's tail)
        self._woke_at = 0.0  # when the request that woke the idle engine came (the event loop's time)
        self._idle_since = time.monotonic()  # when the engine last went idle (asyncio's clock)
        self.model_now = 0.0  # model seconds since the launch at the engine's latest delivered step
        # Requests that carry their arrival time (autotune.measure.arrival): admitted when they are due.
        self.schedule: ArrivalSchedule[_Scheduled] = ArrivalSchedule(_ticks)
        self._due: list[Due[_Scheduled]] = []  # come, waiting for their model time (a heap)
        self._scheduled: dict[str, ScheduledArrival] = {}  # rid -> its arrival, until it ends

    @contextmanager
    def arriving(self) -> Iterator[float]:
        """Around reading, parsing and submitting one request: the time it came (the event loop's); the
        engine waits for a request on its way as for one submitted (see `run_engine`)."""
        self._incoming += 1
        self._replying = True
        self._arrived.set()
        try:
            yield asyncio.get_running_loop().time()
        finally:
            self._incoming -= 1
            self._arrived.set()

    def submit(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        rid: str | None = None,
        predictability: float = 0.0,
        tokens: list[int] | None = None,
        received: float | None = None,
        probe: bool = False,
        arrival: ScheduledArrival | None = None,
    ) -> ClientRequest:
        """Queue one generation on the engine and return the request its tokens will be delivered to;
        its prompt's `tokens` let the prefix cache match it. `received` (the event loop's time, default
        now) is when the request came, before its body was parsed: the engine's clock counts from there.
        A `probe` (a health check) is no client's request: nothing waits for it, and it draws no noise.
        A request with its `arrival` in the client's schedule waits for the model time it is due."""
        context_len = self.plan.context_len
        if prompt_tokens >= context_len:
            raise BadRequest(
                f"The input ({prompt_tokens} tokens) is longer than the model's context length "
                f"({context_len} tokens)."
            )
        if prompt_tokens + max_new_tokens >= context_len:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
                f"You requested a total of {prompt_tokens + max_new_tokens} tokens: {prompt_tokens} tokens "
                f"from the input messages and {max_new_tokens} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit."
            )
        rid = rid or uuid.uuid4().hex
        if rid in self.requests:
            raise BadRequest(f"Duplicate request ID: {rid}")
        request = ClientRequest(rid, prompt_tokens, max_new_tokens, probe=probe)
        self.requests[rid] = request
        if arrival is not None:
            self._submit_scheduled(request, arrival, _Scheduled(request, predictability, tokens), received)
            return request
        self.engine.add(rid, prompt_tokens, max_new_tokens, predictability, tokens, probe)
        if not probe:
            self._arrivals += 1
            self._arrived.set()
        if not self._work.is_set():
            # Idle time passes on the model clock at the wall clock's pace (scaled): nothing ran to time it.
            now = asyncio.get_running_loop().time()
            self._woke_at = max(received if received is not None else now, self._idle_since)
            self.model_now += _ticks((self._woke_at - self._idle_since) / self.scale)
            self._work.set()
        request.received_at = request.delivered_at = self.model_now
        return request

    def _submit_scheduled(
        self, request: ClientRequest, arrival: ScheduledArrival, item: _Scheduled, received: float | None
    ) -> None:
        """Hand a scheduled request to the schedule, which says from when the engine may admit it (see
        `run_engine`); an idle engine wakes at that model time."""
        self._scheduled[request.rid] = arrival
        idle = not self._work.is_set()
        now = asyncio.get_running_loop().time()
        woke_at = max(received if received is not None else now, self._idle_since)
        clock = self.model_now
        if idle and self.schedule.starts_run(arrival):
            # A run's first request wakes the engine as any request does: idle time at the wall clock's pace.
            clock += _ticks((woke_at - self._idle_since) / self.scale)
        for due in self.schedule.came(arrival, clock, item):
            heapq.heappush(self._due, due)
        self._arrived.set()
        if idle and self._due:
            # The engine's clock moves to the first due time in `run_engine`, once nothing due sooner is
            # missing (one due later can overtake one due sooner on its way); the wall reads that time now.
            self.model_now = clock
            self._woke_at = woke_at - max(0.0, self._due[0].at - clock) * self.scale
            self._work.set()

    def refused(self, arrival: ScheduledArrival) -> None:
        """A scheduled request was answered with an error before the engine got it: the engine stops
        waiting for it."""
        self.schedule.came(arrival, self.model_now, None)
        self._arrived.set()

    async def run_engine(self) -> None:
        """Step the engine while it has work, each step ending at its absolute wall-clock deadline.

        What the engine runs is decided in model time, never by when a request happened to arrive: a client
        that answers a finished request with its next one (a closed loop) takes no model time to do so, as
        a client's millisecond is nothing beside a step on a real server but is many steps of a clock sped
        up 50 times. So when requests end, the next step waits for as many new ones, and an idle engine
        woken by a request waits for the rest of its burst (`_await_arrivals`); the steps' deadlines stay
        where the model clock puts them, and the engine catches up by running late steps back to back.
        A seeded launch then serves the same requests in the same batches on every run.

        A request that carries its arrival in the client's schedule (autotune.measure.arrival) is not waited
        for so: it is admitted at the model time it is due (autotune.sim.server.schedule), an idle engine's
        clock moving there, and no step starts at or after the time the next one is due before it has come.
        Arrivals closer than a hold then stay as far apart as the client scheduled them.
        """
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            anchor, model_clock, woke_model = self._woke_at, 0.0, self.model_now
            if not self._due:  # woken by a request without an arrival time: the rest of its burst
                await self._await_arrivals(self._arrivals, burst=True)
            last_yield = loop.time()
            while self.engine.has_work or self._due:
                step_at = self.model_now if self.engine.has_work else max(self.model_now, self._due[0].at)
                if self.schedule.waits(step_at):
                    await self._await_scheduled()
                    last_yield = loop.time()
                    continue
                if step_at > self.model_now:
                    # Idle until the next scheduled request is due: the clock moves there, the wall with it.
                    anchor += (model_clock + step_at - self.model_now) * self.scale
                    model_clock, woke_model, self.model_now = 0.0, step_at, step_at
                self._admit_due()
                step = self.engine.step()
                if step.oom_lines:
                    self.ranks.die(0, step.oom_lines)
                model_clock += step.duration_s
                delay = anchor + model_clock * self.scale - loop.time()
                if not (step.emitted or step.finished or step.aborted) and step.duration_s == 0:
                    delay = max(delay, IDLE_STEP_S)
                if delay > 0 or loop.time() - last_yield > MAX_BUSY_S:
                    # Behind schedule, steps run back to back and writers coalesce their tokens, as
                    # SGLang's are when clients are slow; yielding now and then keeps the HTTP side alive.
                    await asyncio.sleep(max(delay, 0.0))
                    last_yield = loop.time()
                arrived = self._arrivals
                self.model_now = woke_model + _ticks(model_clock)
                # Scheduled requests' ends are answered through the schedule, not by a hold.
                rids = [rid for rid in (*step.finished, *step.aborted) if rid not in self._scheduled]
                ends = [self.requests.get(rid) for rid in rids]
                ended = sum(request is None or not request.probe for request in ends)
                self._deliver(step)
                if ended and self._replying:
                    # Without other work, what the replies bring is a burst, as when the engine wakes.
                    await self._await_arrivals(arrived + ended, burst=not self.engine.has_work)
                    # None came: the client has sent its last request, and the rest of the run's tail
                    # ends without waiting (until a request comes).
                    self._replying = self._arrivals > arrived
                    last_yield = loop.time()
                if step.kind == "prefill" and step.emitted:
                    await asyncio.sleep(0)  # first tokens go out on their own, so time to first token holds
                    last_yield = loop.time()
            self._work.clear()
            self._idle_since = max(loop.time(), anchor + model_clock * self.scale)

    def _admit_due(self) -> None:
        """Give the engine the scheduled requests due by now, in the order they were due; each counts its
        time from then."""
        while self._due and self._due[0].at <= self.model_now:
            due = heapq.heappop(self._due)
            request, item = due.item.request, due.item
            request.received_at = request.delivered_at = due.at
            self.engine.add(
                request.rid, request.prompt_tokens, request.max_new_tokens, item.predictability, item.tokens
            )

    async def _await_scheduled(self) -> None:
        """Wait for a scheduled request that is due; SCHEDULE_WAIT_S without any coming ends its run's
        schedule (its client went away)."""
        self._arrived.clear()
        try:
            await asyncio.wait_for(self._arrived.wait(), SCHEDULE_WAIT_S)
        except TimeoutError:
            self.schedule.give_up()

    async def _await_arrivals(self, count: int, burst: bool) -> None:
        """Wait until `count` requests have been submitted since the launch and none is on its way, and
        with `burst` until none has come for BURST_GAP_S; or until nothing has happened for REPLY_WINDOW_S;
        MAX_HOLD_S at most."""
        loop = asyncio.get_running_loop()
        end = loop.time() + MAX_HOLD_S
        while True:
            left = min(end - loop.time(), REPLY_WINDOW_S)
            if self._arrivals >= count and not self._incoming:
                if not burst:
                    return
                left = min(left, BURST_GAP_S)
            if left <= 0:
                return
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except TimeoutError:
                return

    def _deliver(self, step: Step) -> None:
        kind, emitted, finished, aborted = step.kind, step.emitted, step.finished, step.aborted
        for rid, count in emitted.items():
            request = self.requests.get(rid)
            hit = self.engine.hits.pop(rid, None)
            if request is None:
                continue  # the client went away; the engine cannot abort, so its tokens are dropped
            if hit is not None:
                request.cached_tokens = hit
            request.generated += count
            request.delivered_at = self.model_now
            if kind == "decode":
                request.verify_ct += 1
            request.queue.put_nowait(count)
        for rid in aborted:
            request = self.requests.get(rid)
            if request is not None:
                request.abort_message = input_too_long(request.prompt_tokens, self.plan)
        self._log_step(step)
        for rid in [*finished, *aborted]:
            arrival = self._scheduled.pop(rid, None)
            if arrival is not None:
                self.schedule.ended(arrival, self.model_now)
            request = self.requests.pop(rid, None)
            if request is not None:
                request.delivered_at = self.model_now
                request.queue.put_nowait(None)
        if self.ready and emitted:
            self.tokens_after_ready += sum(emitted.values())
            if "crash_benchmark" in self.options.faults:
                if self.tokens_after_ready >= self.options.crash_after_tokens:
                    self._crash()

    def _log_step(self, step: Step) -> None:
        kind, emitted, duration_s = step.kind, step.emitted, step.duration_s
        stats = self.engine.stats
        if kind == "prefill" and step.new_tokens:
            # SGLang's scheduler_metrics_mixin.log_prefill_stats: the batch's requests starting their
            # prefill, the tokens it computes, the tokens the radix cache served those requests.
            self.ranks.rank0(
                f"Prefill batch, #new-seq: {step.new_seqs}, #new-token: {step.new_tokens}, "
                f"#cached-token: {step.cached_tokens}, "
                f"token usage: {stats['token_usage']:.2f}, #running-req: {int(stats['running'])}, "
                f"#queue-req: {int(stats['queued'])}, "
            )
            return
        if kind != "decode" or not emitted:
            return
        self._decode_steps += 1
        self._interval_tokens += sum(emitted.values())
        self._interval_model_s += duration_s
        if self._decode_steps % self.ns.decode_log_interval:
            return
        self.last_gen_throughput = (
            self._interval_tokens / self._interval_model_s if self._interval_model_s else 0.0
        )
        self._interval_tokens, self._interval_model_s = 0, 0.0
        running = int(stats["running"])
        message = (
            f"Decode batch [{self._decode_steps}], #running-req: {running}, #token: {int(stats['tokens'])}, "
            f"token usage: {stats['token_usage']:.2f}, "
        )
        if self.node.spec is not None:
            accept = stats["avg_accept_length"]
            drafts = self.node.spec.num_draft_tokens
            rate = (accept - 1) / (drafts - 1) if drafts > 1 else 0.0
            message += f"accept len: {accept:.2f}, accept rate: {rate:.2f}, "
        in_graph = not self.ns.disable_cuda_graph and running <= self.plan.cuda_graph_max_bs
        message += (
            f"cuda graph: {in_graph}, gen throughput (token/s): {self.last_gen_throughput:.2f}, "
            f"#queue-req: {int(stats['queued'])}, "
        )
        self.ranks.rank0(message)

    def _crash(self) -> NoReturn:
        """`crash_benchmark`: a CUDA error kills the scheduler mid-benchmark and the process with it."""
        lines = [
            "Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 1024, '
            "in event_loop_normal",
            "    result = self.run_batch(batch)",
            "RuntimeError: CUDA error: an illegal memory access was encountered",
            "CUDA kernel errors might be asynchronously reported at any other API call, so the stacktrace "
            "below might be incorrect.",
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
            "",
        ]
        self.log.error("Scheduler hit an exception: " + "\n".join(lines), self.ranks.first)
        sys.stderr.flush()
        self.ranks.linger_if_asked()
        os._exit(1)

    async def chunks(self, request: ClientRequest) -> AsyncIterator[_Chunk]:
        """Deliveries for one streaming client, coalescing what piled up and honouring --stream-interval."""
        sent = pending = 0
        interval = max(1, self.ns.stream_interval)
        while True:
            items = [await request.queue.get()]
            while not request.queue.empty():
                items.append(request.queue.get_nowait())
            finished = None in items
            pending += sum(item for item in items if item is not None)
            # SGLang streams the first token at once (TTFT), then every stream_interval tokens.
            if finished or pending >= interval or (sent == 0 and pending > 0):
                yield _Chunk([fake_token_id(i) for i in range(sent, sent + pending)], finished)
                sent += pending
                pending = 0
            if finished:
                return

    async def collect(self, request: ClientRequest) -> list[int]:
        ids: list[int] = []
        async for chunk in self.chunks(request):
            ids.extend(chunk.new_ids)
        return ids

    def abandon(self, request: ClientRequest) -> None:
        self.requests.pop(request.rid, None)

    def meta_info(self, request: ClientRequest, completion_tokens: int, finished: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": request.rid,
            "finish_reason": None,
            "prompt_tokens": request.prompt_tokens,
            "weight_version": "default",
            "completion_tokens": completion_tokens,
            "cached_tokens": request.cached_tokens,
            # Not SGLang's: the model clock, in server seconds since the launch, when the request came and
            # when this chunk's tokens were made. A client times a simulated server by it, as no wall clock
            # can at a clock sped up 50 times on a busy machine (autotune.measure.client).
            "sim_received": request.received_at,
            "sim_time": request.delivered_at,
        }
        if finished:
            if request.abort_message is not None:
                meta["finish_reason"] = {
                    "type": "abort",
                    "message": request.abort_message,
                    "status_code": 400,
                    "err_type": "BadRequestError",
                }
            else:
                meta["finish_reason"] = {"type": "length", "length": completion_tokens}
            meta["e2e_latency"] = request.delivered_at - request.received_at
        if self.node.spec is not None:
            meta["spec_verify_ct"] = request.verify_ct
            # completion_tokens / verify_ct, the prefill's token included (tokenizer_manager.py:2767-2769).
            meta["spec_accept_length"] = completion_tokens / request.verify_ct if request.verify_ct else 0.0
        return meta
