"""The benchmark client: SSE parsing, percentile math, time-scale conversion, and a tiny SSE server."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from aiohttp import web

from autotune.config import parse_objective
from autotune.measure.client import (
    SSE_DONE,
    BenchmarkError,
    BenchmarkResult,
    RequestOutcome,
    SSEParser,
    Workload,
    benchmark,
    percentile,
    run_benchmark,
    summarize,
)
from autotune.measure.metrics import ALLREDUCE_METRICS, BENCHMARK_FIGURES, CATALOGUE, OBJECTIVE_METRICS
from autotune.measure.plan import plan_for, run_plan_sync
from autotune.node.runner import free_port

# ---------------------------------------------------------------------------------------------------
# SSE parsing


def _sglang_chunk(text: str, new_ids: list[int], completion_tokens: int, finish: bool = False) -> bytes:
    meta: dict[str, Any] = {
        "id": "8f1c",
        "prompt_tokens": 4,
        "completion_tokens": completion_tokens,
        "finish_reason": {"type": "length", "length": completion_tokens} if finish else None,
    }
    if finish:
        meta["e2e_latency"] = 0.5
        meta["spec_accept_length"] = 2.0
    return b"data: " + json.dumps({"text": text, "output_ids": new_ids, "meta_info": meta}).encode() + b"\n\n"


STREAM = (
    _sglang_chunk("Hé", [11], 1)
    + _sglang_chunk("Hé wörld", [12, 13], 3)
    + _sglang_chunk("Hé wörld!", [14], 4, finish=True)
    + b"data: [DONE]\n\n"
)


def _payloads() -> list[str]:
    return SSEParser().feed(STREAM)


def test_sse_whole_stream() -> None:
    events = _payloads()
    assert len(events) == 4 and events[-1] == SSE_DONE
    assert [json.loads(e)["meta_info"]["completion_tokens"] for e in events[:-1]] == [1, 3, 4]
    assert json.loads(events[1])["text"] == "Hé wörld"


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64])
def test_sse_chunks_split_anywhere(size: int) -> None:
    # Every split point, including inside "data:", inside the blank line and inside a UTF-8 character.
    parser = SSEParser()
    events: list[str] = []
    for i in range(0, len(STREAM), size):
        events += parser.feed(STREAM[i : i + size])
    assert events == _payloads()
    assert parser.close() == []


def test_sse_crlf_comments_multiline_and_unterminated_tail() -> None:
    parser = SSEParser()
    data = b': keep-alive\r\n\r\nevent: message\r\ndata: {"a":\r\ndata:1}\r\n\r\ndata: [DONE]'
    assert parser.feed(data) == ['{"a":\n1}']
    assert parser.close() == [SSE_DONE]


# ---------------------------------------------------------------------------------------------------
# Percentiles and time scale


def test_percentile_matches_numpy_linear() -> None:
    # Values from numpy.percentile(..., method="linear").
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert percentile([4, 1, 3, 2], 0) == 1 and percentile([4, 1, 3, 2], 100) == 4
    assert percentile([10.0, 20.0, 40.0], 75) == 30.0
    assert percentile([5.0], 99) == 5.0
    assert percentile([], 50) == 0.0
    with pytest.raises(ValueError, match="q"):
        percentile([1.0], 101)


def _outcome(ttft: float, itl: list[float], latency: float, out: int = 3) -> RequestOutcome:
    return RequestOutcome(
        success=True, prompt_tokens=8, output_tokens=out, ttft_s=ttft, itl_s=itl, latency_s=latency
    )


def test_summarize_converts_to_server_time() -> None:
    wl = Workload(num_prompts=3, input_len=8, output_len=3, concurrency=2)
    outcomes = [
        _outcome(0.010, [0.002, 0.004], 0.020),
        _outcome(0.030, [0.006, 0.008], 0.040),
        RequestOutcome(prompt_tokens=8, error="HTTP 500 Internal Server Error: boom"),
    ]
    real = summarize(outcomes, duration_s=0.1, workload=wl)
    # time_scale 0.01: one real second is 100 server seconds.
    scaled = summarize(outcomes, duration_s=0.1, workload=wl, time_scale=0.01, accept_length=2.5)

    assert (real.completed, real.failed) == (2, 1)
    assert real.total_input_tokens == 16 and real.total_output_tokens == 6
    assert real.first_error == "HTTP 500 Internal Server Error: boom"
    assert real.duration_s == pytest.approx(0.1)
    assert real.output_throughput == pytest.approx(60.0)
    assert real.request_throughput == pytest.approx(20.0)
    assert real.mean_ttft_ms == pytest.approx(20.0)
    assert real.p50_itl_ms == pytest.approx(5.0)
    assert real.p99_e2e_latency_ms == pytest.approx(39.8)
    assert real.time_scale == 1.0 and real.accept_length is None

    assert scaled.time_scale == 0.01 and scaled.accept_length == 2.5
    assert scaled.duration_s == pytest.approx(10.0)
    assert scaled.output_throughput == pytest.approx(0.6)
    assert scaled.input_throughput == pytest.approx(1.6)
    for name in ("mean_ttft_ms", "p99_ttft_ms", "mean_itl_ms", "p99_itl_ms", "p50_e2e_latency_ms"):
        assert getattr(scaled, name) == pytest.approx(getattr(real, name) * 100), name
    with pytest.raises(ValueError, match="time_scale"):
        summarize(outcomes, 0.1, wl, time_scale=0.0)


def test_result_json_round_trip() -> None:
    wl = Workload(num_prompts=1, input_len=8, output_len=3, concurrency=1, warmup_requests=0)
    result = summarize([_outcome(0.01, [0.002], 0.02)], 0.05, wl, time_scale=0.5, accept_length=3.1)
    text = result.to_json()
    assert json.loads(text)["workload"]["concurrency"] == 1
    assert BenchmarkResult.from_json(text) == result


def test_workload_validates() -> None:
    with pytest.raises(ValueError, match=r"concurrency\s+Input should be greater than 0"):
        Workload(num_prompts=1, input_len=1, output_len=1, concurrency=0)
    with pytest.raises(ValueError, match=r"warmup_requests\s+Input should be greater than or equal to 0"):
        Workload(num_prompts=1, input_len=1, output_len=1, concurrency=1, warmup_requests=-1)


def test_the_metric_catalogue_names_benchmark_fields() -> None:
    fields = {f.name for f in dataclasses.fields(BenchmarkResult)}
    assert set(BENCHMARK_FIGURES) <= fields and set(OBJECTIVE_METRICS) - set(ALLREDUCE_METRICS) <= fields
    assert all(CATALOGUE[name].better == better for name, better in OBJECTIVE_METRICS.items())


def test_one_warm_up_rule_for_study_files_and_nodes() -> None:
    """A study file's workload is the type a node receives: 0 warm-up requests is valid in both, and
    every benchmark after a launch's first one sends none."""
    data = {"name": "t", "metric": "output_throughput"}
    workload = {"num_prompts": 4, "input_len": 8, "output_len": 4, "concurrency": 2, "warmup_requests": 0}
    objective = parse_objective({**data, "workload": workload})
    assert type(objective.workload) is Workload and objective.workload == Workload(**workload)
    warmed = replace(objective.workload, warmup_requests=3)
    assert warmed.on_warm_server() == objective.workload
    ladder = {**data, "workload": {**workload, "warmup_requests": 2}, "ladder": {"concurrency": [1, 2, 4]}}
    sent: list[int] = []

    def measure(w: Workload, _index: int) -> BenchmarkResult:
        sent.append(w.warmup_requests)
        return summarize([_outcome(0.01, [0.002], 0.02)], 0.05, w)

    run_plan_sync(plan_for(parse_objective(ladder)), measure)
    assert sent == [2, 0, 0]


# ---------------------------------------------------------------------------------------------------
# A tiny SGLang-like server: streaming /generate in SGLang's SSE format, /get_server_info.


@dataclass
class FakeSGLang:
    token_delay_s: float = 0.002
    tokens_per_chunk: int = 2  # as with speculative decoding: several tokens per streamed chunk
    time_scale: float | None = 0.5
    accept_length: float | None = 2.5
    fail_every: int = 0  # every n-th /generate answers HTTP 500
    die_after_chunks: int | None = None  # close the stream without [DONE]
    # As the simulated server: each chunk carries its model clock, request k arriving at 10 k server
    # seconds and each chunk 0.1 s after the one before.
    sim_clock: bool = False
    requests: list[dict[str, Any]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.fail_every and len(self.requests) % self.fail_every == 0:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        max_new = body["sampling_params"]["max_new_tokens"]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            done, chunks = 0, 0
            while done < max_new:
                await asyncio.sleep(self.token_delay_s)
                new = min(self.tokens_per_chunk, max_new - done)
                done += new
                if self.die_after_chunks is not None and chunks == self.die_after_chunks:
                    assert request.transport is not None
                    request.transport.close()
                    return resp
                meta: dict[str, Any] = {
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": done,
                    "finish_reason": {"type": "length", "length": max_new} if done == max_new else None,
                }
                if self.sim_clock:
                    received = 10.0 * (len(self.requests) - 1)
                    meta |= {"sim_received": received, "sim_time": received + 0.1 * (chunks + 1)}
                data = (
                    b"data: "
                    + json.dumps({"text": "x" * done, "output_ids": [7] * new, "meta_info": meta}).encode()
                )
                # Split each event across two writes so the client sees partial reads.
                await resp.write(data[:9])
                await resp.write(data[9:] + b"\n\n")
                chunks += 1
            await resp.write(b"data: [DONE]\n\n")
            return resp
        finally:
            self.in_flight -= 1

    async def server_info(self, request: web.Request) -> web.Response:
        info: dict[str, Any] = {"version": "0.5.4", "internal_states": [{"last_gen_throughput": 90.0}]}
        if self.accept_length is not None:
            info["internal_states"][0]["avg_spec_accept_length"] = self.accept_length
        if self.time_scale is not None:
            info["time_scale"] = self.time_scale
        return web.json_response(info)


@pytest.fixture
def fake() -> Iterator[tuple[str, FakeSGLang]]:
    """Serve a FakeSGLang on a free port from a background thread; yield its base URL and state."""
    state = FakeSGLang()
    app = web.Application()
    app.router.add_post("/generate", state.generate)
    app.router.add_get("/get_server_info", state.server_info)
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app)
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}/", state
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)
    loop.close()


def test_benchmark_against_sse_server(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    wl = Workload(num_prompts=12, input_len=16, output_len=20, concurrency=4, warmup_requests=2)
    t0 = time.perf_counter()
    result = benchmark(url, wl, timeout_s=30, seed=7)
    wall = time.perf_counter() - t0

    assert (result.completed, result.failed) == (12, 0)
    assert result.total_input_tokens == 12 * 16 and result.total_output_tokens == 12 * 20
    assert result.accept_length == 2.5 and result.time_scale == 0.5
    assert result.first_error is None
    # Server time = real time / 0.5: the measured part lasted less than the whole call, in real time.
    assert result.duration_s < wall / 0.5
    assert result.output_throughput == pytest.approx(result.total_output_tokens / result.duration_s)
    assert result.p50_ttft_ms <= result.p50_e2e_latency_ms <= result.p99_e2e_latency_ms
    # Each 2-token chunk is one gap split in two, then scaled: about token_delay_s per token of server time.
    assert 0.5 * server.token_delay_s * 1000 <= result.p50_itl_ms < 20 * server.token_delay_s * 1000

    warmups, measured = server.requests[:2], server.requests[2:]
    assert [r["sampling_params"]["max_new_tokens"] for r in warmups] == [16, 16]
    for r in measured:
        assert r["stream"] is True and len(r["input_ids"]) == 16
        assert r["sampling_params"] == {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
    assert server.max_in_flight == 4
    prompts = sorted(map(tuple, (r["input_ids"] for r in measured)))
    assert len(set(prompts)) == 12  # distinct prompts: no accidental prefix-cache hits

    server.requests.clear()
    again = asyncio.run(run_benchmark(url, wl, timeout_s=30, seed=7))
    assert sorted(map(tuple, (r["input_ids"] for r in server.requests[2:]))) == prompts  # seeded
    assert again.completed == 12


def test_failed_requests_are_counted(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    server.fail_every = 3
    wl = Workload(num_prompts=9, input_len=4, output_len=4, concurrency=3, warmup_requests=0)
    result = benchmark(url, wl, timeout_s=30)
    assert (result.completed, result.failed) == (6, 3)
    assert result.first_error is not None and result.first_error.startswith("HTTP 500")
    assert result.total_output_tokens == 6 * 4


def test_every_request_failing_raises(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    server.fail_every = 1
    wl = Workload(num_prompts=3, input_len=4, output_len=4, concurrency=2, warmup_requests=0)
    with pytest.raises(BenchmarkError) as info:
        benchmark(url, wl, timeout_s=30)
    assert (info.value.completed, info.value.failed) == (0, 3)
    assert info.value.first_error is not None and "boom" in info.value.first_error


def test_failed_warmup_raises(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    server.fail_every = 1
    with pytest.raises(BenchmarkError, match="warm-up"):
        benchmark(url, Workload(num_prompts=3, input_len=4, output_len=4, concurrency=2), timeout_s=30)


def test_stream_cut_before_done_is_a_failure(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    server.die_after_chunks = 1
    wl = Workload(num_prompts=2, input_len=4, output_len=8, concurrency=2, warmup_requests=0)
    with pytest.raises(BenchmarkError) as info:
        benchmark(url, wl, timeout_s=30)
    assert info.value.failed == 2


def test_timeout_raises_with_partial_counts(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    wl = Workload(num_prompts=6, input_len=4, output_len=2, concurrency=2, warmup_requests=0)
    server.token_delay_s = 0.15
    server.tokens_per_chunk = 1  # 2 chunks: 0.3 s a request; the second round of 2 cannot end by 0.5 s
    t0 = time.monotonic()
    with pytest.raises(BenchmarkError, match=r"within 0\.5 s") as info:
        benchmark(url, wl, timeout_s=0.5)
    assert time.monotonic() - t0 < 2
    e = info.value
    assert e.completed >= 2 and e.completed + e.failed + e.unfinished == 6 and e.unfinished >= 2


def test_a_simulated_server_is_timed_by_its_model_clock(fake: tuple[str, FakeSGLang]) -> None:
    """Where the chunks carry the server's model clock (only the simulated server's do), every time is
    read from it: what a busy client's own clock adds at a sped-up clock cannot change a measurement."""
    url, server = fake
    server.sim_clock = True
    wl = Workload(num_prompts=3, input_len=4, output_len=4, concurrency=1, warmup_requests=0)
    result = benchmark(url, wl, timeout_s=30)
    # Two chunks of two tokens a request, 0.1 server seconds apart; requests at 0, 10 and 20 s.
    assert result.mean_ttft_ms == pytest.approx(100.0) and result.p99_ttft_ms == pytest.approx(100.0)
    assert result.mean_itl_ms == pytest.approx(50.0) and result.p99_itl_ms == pytest.approx(50.0)
    assert result.mean_e2e_latency_ms == pytest.approx(200.0)
    assert result.duration_s == pytest.approx(20.2)
    assert result.output_throughput == pytest.approx(12 / 20.2)


def test_real_sglang_reports_no_time_scale(fake: tuple[str, FakeSGLang]) -> None:
    url, server = fake
    server.time_scale = None
    server.accept_length = None
    wl = Workload(num_prompts=2, input_len=4, output_len=4, concurrency=2, warmup_requests=0)
    result = benchmark(url, wl, timeout_s=30)
    assert result.time_scale == 1.0 and result.accept_length is None


def test_unreachable_server_raises() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    wl = Workload(num_prompts=2, input_len=4, output_len=4, concurrency=2, warmup_requests=0)
    with pytest.raises(BenchmarkError) as info:
        benchmark(url, wl, timeout_s=10)
    assert info.value.failed == 2 and info.value.first_error is not None


# Integration test against the simulated node goes here (the lead adds it once autotune.sim lands):
# start `python -m autotune.sim.sglang_server` through LocalCommandRunner, wait_until_ready, then
# benchmark() it and check time_scale and accept_length come from its /get_server_info.
