"""Requests that carry their arrival time (autotune.measure.arrival): the header the client sends, the
schedule the simulated server keeps (autotune.sim.server.schedule), and the server admitting each request
at the model time it is due, however close together and however late they come on the wall clock."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest

from autotune.measure.arrival import ARRIVAL_HEADER, ScheduledArrival, schedule
from autotune.measure.client import run_benchmark
from autotune.measure.workloads import Slo, Workload, arrival_offsets
from autotune.sim.server.schedule import ArrivalSchedule
from autotune.sim.server.serving import SCHEDULE_WAIT_S
from tests.sim.test_server import SimServer, ready_sim_server

FAST = {"SGLANG_SIM_TIME_SCALE": "0.02", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001"}


# -- the header ---------------------------------------------------------------------------------------------
def test_the_header_reads_back_what_the_client_wrote() -> None:
    arrivals = schedule([0.0, 2.5, 0.1 + 0.2], concurrency=2)
    # Ranked by arrival time; each says when the next is due; one run id for the run, a new one per run.
    assert [(a.index, a.at_s, a.next_s) for a in arrivals] == [
        (0, 0.0, 0.1 + 0.2),
        (2, 2.5, None),
        (1, 0.1 + 0.2, 2.5),
    ]
    assert len({a.run for a in arrivals}) == 1 and schedule([0.0], 1)[0].run != arrivals[0].run
    for arrival in arrivals:
        (value,) = arrival.header().values()
        assert ScheduledArrival.parse(value) == arrival  # floats exactly


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("run=a; index=x; at=0; concurrency=1", "cannot read"),
        ("run=a; at=0; concurrency=1", "cannot read"),
        ("run=a; index=0; at=-1; concurrency=1", "out of range"),
        ("run=a; index=0; at=0; next=nan; concurrency=1", "out of range"),
        ("run=a; index=0; at=0; concurrency=0", "out of range"),
    ],
)
def test_a_bad_header_names_itself_the_value_and_the_form(value: str, says: str) -> None:
    with pytest.raises(ValueError, match=f"^{ARRIVAL_HEADER}: ") as caught:
        ScheduledArrival.parse(value)
    assert says in str(caught.value) and repr(value) in str(caught.value)


# -- the schedule -------------------------------------------------------------------------------------------
def _on_clock(seconds: float) -> float:
    return round(seconds * 2**20) / 2**20


def test_each_request_is_due_at_its_offset_from_the_run_s_first() -> None:
    a0, a1, a2 = schedule([0.0, 0.5, 2.0], concurrency=8)
    book: ArrivalSchedule[str] = ArrivalSchedule(_on_clock)
    assert book.starts_run(a0) and not book.starts_run(a1)
    assert [(d.at, d.item) for d in book.came(a0, 100.0, "r0")] == [(100.0, "r0")]
    assert not book.starts_run(a0)
    # The next is due at 100.5: a step may start before then, not at or after it until it has come.
    assert not book.waits(100.25) and book.waits(100.5) and book.waits(101.0)
    assert [(d.at, d.item) for d in book.came(a1, 100.1, "r1")] == [(100.5, "r1")]  # came early: held
    assert book.waits(102.0) and not book.waits(101.9)
    book.came(a2, 103.0, "r2")  # came late
    assert not book.waits(1e9)  # the last has come


def test_a_request_that_waited_for_a_slot_is_due_when_the_slot_freed() -> None:
    a0, a1, a2 = schedule([0.0, 0.0, 0.0], concurrency=2)
    book: ArrivalSchedule[str] = ArrivalSchedule(_on_clock)
    book.came(a0, 10.0, "r0")
    assert book.waits(10.0)  # a slot is free and the next is due: it is on its way
    book.came(a1, 10.0, "r1")
    assert not book.waits(10.0) and not book.waits(50.0)  # both slots taken: the next waits for one
    book.ended(a0, 12.0)
    assert book.waits(12.0)
    (due,) = book.came(a2, 12.0, "r2")
    assert due.at == 12.0  # sent when the slot freed, not at its offset


def test_a_request_that_overtook_one_due_sooner_is_not_in_flight_before_its_time() -> None:
    a0, a1, a2 = schedule([0.0, 1.0, 1.5], concurrency=2)
    book: ArrivalSchedule[str] = ArrivalSchedule(_on_clock)
    book.came(a0, 0.0, "r0")
    book.came(a2, 0.0, "r2")  # sent at 1.5, it came before the one sent at 1.0
    # At 1.2 the client has r0 in flight and a slot free for r1: the engine waits for it.
    assert book.waits(1.2)
    assert [d.at for d in book.came(a1, 0.0, "r1")] == [1.0]


def test_a_run_whose_client_went_away_waits_for_nothing() -> None:
    a0, _, a2 = schedule([0.0, 1.0, 2.0], concurrency=8)
    book: ArrivalSchedule[str] = ArrivalSchedule(_on_clock)
    book.came(a0, 0.0, "r0")
    assert book.waits(1.0)
    book.give_up()
    assert not book.waits(1.0)
    assert [(d.at, d.item) for d in book.came(a2, 5.0, "r2")] == [(5.0, "r2")]  # admitted as it comes


def test_requests_before_the_run_s_first_wait_for_it_and_a_refused_one_is_not_waited_for() -> None:
    a0, a1, a2, a3 = schedule([0.0, 1.0, 2.0, 3.0], concurrency=8)
    book: ArrivalSchedule[str] = ArrivalSchedule(_on_clock)
    assert book.came(a1, 5.0, "r1") == [] and not book.waits(1e9)  # the run has no start yet
    assert [(d.at, d.item) for d in book.came(a0, 7.0, "r0")] == [(7.0, "r0"), (8.0, "r1")]
    assert book.waits(9.0)
    assert book.came(a2, 7.5, None) == []  # answered with an error: never in flight
    assert book.waits(10.0) and not book.waits(9.9)  # now waiting for the next one, due at 10
    # A new run ends the last one's schedule.
    (b0,) = schedule([0.0], concurrency=1)
    book.came(b0, 20.0, "s0")
    assert not book.waits(1e9)
    book.ended(a3, 21.0)  # the old run's: nothing to free


# -- the simulated server ---------------------------------------------------------------------------------
@pytest.fixture
def sim() -> Iterator[SimServer]:
    yield from ready_sim_server("--skip-server-warmup", env=FAST)


async def _post(
    session: aiohttp.ClientSession, url: str, arrival: ScheduledArrival | None, body: Any
) -> tuple[int, list[dict[str, Any]]]:
    """POST /generate (streamed) with `arrival`'s header; the status and the chunks' meta_info."""
    headers = arrival.header() if arrival is not None else {}
    async with session.post(url + "/generate", json=body, headers=headers) as resp:
        text = await resp.text()
    if resp.status != 200:
        return resp.status, [json.loads(text)]
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    return resp.status, [json.loads(e)["meta_info"] for e in events if e != "[DONE]"]


def _generate(tokens: int, prompt: int = 0) -> dict[str, Any]:
    """A streamed request of 100 prompt tokens, a different prompt for each `prompt` (no cache hits)."""
    sampling = {"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True}
    ids = list(range(1 + 1000 * prompt, 101 + 1000 * prompt))
    return {"input_ids": ids, "sampling_params": sampling, "stream": True}


@pytest.mark.integration
def test_the_server_admits_each_request_at_its_scheduled_model_time(sim: SimServer) -> None:
    # Due 0.5 server s apart, both sent at once: 10 ms of wall time at 50x, closer than any hold.
    first, second, third = schedule([0.0, 0.5, 0.75], concurrency=3)

    async def run() -> list[tuple[int, list[dict[str, Any]]]]:
        async with aiohttp.ClientSession() as session:
            url = sim.url("")
            return await asyncio.gather(
                _post(session, url, first, _generate(8)),
                _post(session, url, second, _generate(8)),
                _post(session, url, third, {"sampling_params": {"max_new_tokens": 8}}),  # refused: no prompt
            )

    started = time.monotonic()
    (s1, m1), (s2, m2), (s3, _) = asyncio.run(run())
    assert time.monotonic() - started < SCHEDULE_WAIT_S  # the refused one was not waited for
    assert s1 == s2 == 200 and s3 == 400
    received = [m1[0]["sim_received"], m2[0]["sim_received"]]
    assert received[1] - received[0] == 0.5  # exactly: the model clock counts in 2**-20 s
    assert m2[0]["sim_time"] > received[1] and m1[-1]["completion_tokens"] == 8 == m2[-1]["completion_tokens"]
    # A header the server cannot read is a 400 that names it.
    bad = ScheduledArrival("x", 0, 0.0, None, 1)

    async def malformed() -> tuple[int, str]:
        async with aiohttp.ClientSession() as session:
            headers = {ARRIVAL_HEADER: bad.header()[ARRIVAL_HEADER].replace("index=0", "index=first")}
            async with session.post(sim.url("") + "/generate", json=_generate(1), headers=headers) as resp:
                return resp.status, (await resp.json())["error"]["message"]

    status, message = asyncio.run(malformed())
    assert status == 400 and message.startswith(f"{ARRIVAL_HEADER}: cannot read")


@pytest.mark.integration
def test_a_request_that_overtakes_one_due_sooner_does_not_move_the_clock_past_it(sim: SimServer) -> None:
    first, second, third = schedule([0.0, 1.0, 2.0], concurrency=3)

    async def run() -> list[list[dict[str, Any]]]:
        async with aiohttp.ClientSession() as session:
            url = sim.url("")
            _, m0 = await _post(session, url, first, _generate(4, 0))
            third_sent = asyncio.create_task(_post(session, url, third, _generate(4, 2)))
            await asyncio.sleep(0.2)  # the third, due later, comes first to an idle engine
            _, m1 = await _post(session, url, second, _generate(4, 1))
            _, m2 = await third_sent
            return [m0, m1, m2]

    metas = asyncio.run(run())
    received = [m[0]["sim_received"] - metas[0][0]["sim_received"] for m in metas]
    assert received == [0.0, 1.0, 2.0]
    # Each met an idle engine at its time: the same prefill, the same time to its first token.
    ttfts = {m[0]["sim_time"] - m[0]["sim_received"] for m in metas}
    assert len(ttfts) == 1, ttfts


@pytest.mark.integration
def test_a_seeded_launch_measures_a_poisson_rate_the_same_on_a_rerun() -> None:
    # Arrivals a second apart on average (20 ms of wall time at 50x, some closer than a hold, some not), on
    # a server with noise: the same batches at the same model times on both launches.
    workload = Workload(
        num_prompts=12, input_len=200, output_len=32, concurrency=4, request_rate=1.0, slo=Slo(tpot_ms=25)
    )
    env = {**FAST, "SGLANG_SIM_SEED": "5", "SGLANG_SIM_NOISE": "0.03"}
    results = []
    for _ in range(2):
        server = SimServer("--skip-server-warmup", env=env)
        try:
            server.wait_ready()
            results.append(asyncio.run(run_benchmark(server.url(""), workload, timeout_s=60, seed=3)))
        finally:
            server.close()
    first, second = results
    assert first.completed == 12 and first.duration_s > arrival_offsets(12, 1.0, 1.0)[-1]
    # To the last digit where the order the requests ended in does not enter (a mean adds them in that
    # order); an ITL spreads a chunk's gap over its tokens, and how a stream groups them follows the wall.
    exact = ["duration_s", "output_throughput", "request_goodput", "slo_attainment", "p50_ttft_ms"]
    exact += ["p99_ttft_ms", "p50_e2e_latency_ms", "p99_e2e_latency_ms"]
    assert [getattr(first, name) for name in exact] == [getattr(second, name) for name in exact]
    assert first.mean_ttft_ms == pytest.approx(second.mean_ttft_ms, rel=1e-12)
    assert first.mean_itl_ms == pytest.approx(second.mean_itl_ms, rel=1e-3)
