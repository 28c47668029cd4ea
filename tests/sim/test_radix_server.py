"""The simulated server's radix cache seen from the benchmark client, as a real server's is: each
response's `meta_info.cached_tokens`, SGLang's "Prefill batch" lines and their `#cached-token`, and the
flag that disables it."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest

from autotune.measure.client import benchmark
from autotune.measure.workloads import Workload
from tests.sim.test_server import SimServer

pytestmark = pytest.mark.integration

SESSIONS = Workload(
    sessions={"num_sessions": 3, "turns": 3, "first_prompt_len": 4000, "user_len": 200, "output_len": 32},  # type: ignore[arg-type]
    warmup_requests=1,
)
# Real SGLang 0.5.17 on an H200 (tests/sim/test_real_h200.py's log): "Prefill batch, #new-seq: 8,
# #new-token: 8192, #cached-token: 0, token usage: 0.06, #running-req: 42, ...".
PREFILL = re.compile(
    r"Prefill batch, #new-seq: (\d+), #new-token: (\d+), #cached-token: (\d+), token usage: "
)
FAST = {"SGLANG_SIM_TIME_SCALE": "0.1", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001"}


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[SimServer]:
    launched = SimServer(*request.param, env=FAST)
    try:
        launched.wait_ready(60)
        yield launched
    finally:
        launched.close()


@pytest.mark.parametrize("server", [()], indirect=True)
def test_sessions_hit_the_cache_as_designed_and_the_log_says_so(server: SimServer) -> None:
    result = benchmark(server.url(""), SESSIONS, timeout_s=120)
    assert result.completed == 9 and result.failed == 0
    # Turns 2 and 3 re-send the previous prompt: 4,000 then 4,232 tokens of 4,232 and 4,464.
    assert result.designed_hit_rate == pytest.approx((4000 + 4232) / (4000 + 4232 + 4464))
    assert result.cache_hit_rate is not None
    assert result.designed_hit_rate - 0.01 < result.cache_hit_rate <= result.designed_hit_rate
    assert result.mean_ttft_first_turn_ms is not None and result.mean_ttft_later_turns_ms is not None
    assert result.mean_ttft_later_turns_ms < result.mean_ttft_first_turn_ms / 2
    # The log's prefill lines count the same hits, after the warm-up and the flush.
    flushed = next(i for i, line in enumerate(server.lines) if "Cache flushed successfully!" in line)
    batches = [tuple(map(int, m.groups())) for line in server.lines[flushed:] if (m := PREFILL.search(line))]
    assert sum(b[0] for b in batches) == 9
    cached = sum(b[2] for b in batches)
    assert cached == pytest.approx(result.cache_hit_rate * (4000 + 4232 + 4464) * 3)
    assert sum(b[1] for b in batches) + cached == (4000 + 4232 + 4464) * 3


@pytest.mark.parametrize("server", [("--disable-radix-cache",)], indirect=True)
def test_disable_radix_cache_serves_nothing_from_the_cache(server: SimServer) -> None:
    result = benchmark(server.url(""), SESSIONS, timeout_s=120)
    assert result.completed == 9
    assert result.cache_hit_rate == 0.0 and result.designed_hit_rate is not None
    assert all(m.group(3) == "0" for line in server.lines if (m := PREFILL.search(line)))


@pytest.mark.parametrize("server", [()], indirect=True)
def test_a_second_measurement_on_the_same_launch_starts_from_a_flushed_cache(server: SimServer) -> None:
    # The client flushes before each measurement; a flush that only logged it left the first measurement's
    # prompts cached, and the second served every token of its (identical) prompts from the cache.
    first = benchmark(server.url(""), SESSIONS, timeout_s=120)
    second = benchmark(server.url(""), SESSIONS.on_warm_server(), timeout_s=120)
    assert first.cache_hit_rate is not None and second.cache_hit_rate is not None
    assert second.designed_hit_rate is not None
    assert second.cache_hit_rate <= second.designed_hit_rate
    assert second.cache_hit_rate == pytest.approx(first.cache_hit_rate, abs=0.01)
