"""The load search on scripted steps: where max_load lands between the bracket's steps, and the warning when
the search ran out of steps before its tolerance (issue 29, point 5). The simulated server runs it in
tests/measure/test_workloads.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import pytest

from autotune.measure.client import BenchmarkResult, Workload
from autotune.measure.load_search import LoadSearchPlan
from autotune.measure.plan import MeasurementPlan, run_plan_sync

BASE = Workload(num_prompts=24, input_len=200, output_len=256, concurrency=64)
# The real H200 study's search: doubling from 2 req/s, five steps, so it never bisected.
REAL = LoadSearchPlan("request_rate", start=2, max=64, steps=5, attainment=0.9, tolerance=0.1)


def step(workload: Workload, attainment: float, failed: int = 0) -> BenchmarkResult:
    """A step's result: only what the search reads (its workload, failures and SLO attainment) matters."""
    numbers = {f: 1.0 for f in BenchmarkResult.__dataclass_fields__ if f.endswith(("_ms", "_throughput"))}
    return BenchmarkResult(
        **numbers,  # type: ignore[arg-type]
        workload=workload,
        duration_s=1.0,
        completed=workload.num_prompts - failed,
        failed=failed,
        total_input_tokens=0,
        total_output_tokens=0,
        accept_length=None,
        time_scale=1.0,
        slo_attainment=attainment,
    )


def search(
    plan: LoadSearchPlan, attainment: Callable[[float], float], failed_from: float = 1e9
) -> BenchmarkResult:
    """Run `plan` against a server whose SLO attainment at each load is `attainment(load)`, losing a request
    from `failed_from` on."""

    def measure(workload: Workload, _index: int) -> BenchmarkResult:
        load = plan.load_of(workload)
        return step(workload, attainment(load), failed=int(load >= failed_from))

    return run_plan_sync(replace(MeasurementPlan.single(BASE), load_search=plan), measure)


def test_configs_tied_at_the_last_passing_step_are_told_apart_by_their_attainment_above_it() -> None:
    # The real study: 2 to 16 req/s pass, 32 misses with 50% or 67% of requests good, and the steps run out.
    low = search(REAL, lambda load: 1.0 if load <= 16 else 0.50)
    high = search(REAL, lambda load: 1.0 if load <= 16 else 0.67)
    assert [s.workload.request_rate for s in low.levels] == [2, 4, 8, 16, 32]
    # Linear between (16, 100%) and (32, 50% / 67%), crossing 90%: 16 + 16 * 0.1 / 0.5, 16 + 16 * 0.1 / 0.33.
    assert low.max_load == pytest.approx(19.2)
    assert high.max_load == pytest.approx(16 + 16 * 0.1 / 0.33)
    assert low.workload.request_rate == 16  # the figures are still the highest passing step's


def test_a_search_that_ran_out_of_steps_warns_with_its_bracket_and_the_fix() -> None:
    result = search(REAL, lambda load: 0.95 if load <= 16 else 0.6)
    assert result.load_warning is not None
    assert result.load_warning.startswith("the load search ran out of steps (5) before its tolerance (0.1): ")
    assert "between 16 passed, 95% good and 32 missed, 60% good" in result.load_warning
    assert "raise load_search.steps" in result.load_warning
    assert result.load_stopped_by == "the steps ran out (5): highest pass 16, lowest miss 32"


def test_a_search_bisected_to_its_tolerance_interpolates_inside_its_bracket_without_a_warning() -> None:
    plan = replace(REAL, steps=12)
    result = search(plan, lambda load: 1.0 if load <= 20 else 0.5)
    rates = [s.workload.request_rate for s in result.levels]
    passed = max(r for r in rates if r is not None and r <= 20)
    missed = min(r for r in rates if r is not None and r > 20)
    assert missed - passed <= 0.1 * passed and len(rates) < 12
    assert passed < result.max_load < missed  # type: ignore[operator]
    assert result.load_warning is None


def test_a_miss_that_lost_requests_says_nothing_about_latency_and_keeps_the_highest_pass() -> None:
    result = search(REAL, lambda load: 1.0 if load <= 16 else 0.5, failed_from=32)
    assert result.max_load == 16.0


def test_a_miss_by_failed_requests_alone_is_no_attainment_crossing() -> None:
    plan = replace(REAL, attainment=0.9)
    result = search(plan, lambda load: 1.0, failed_from=32)  # every request met the SLO, one failed at 32
    assert result.max_load == 16.0


def test_a_search_that_reaches_max_scores_max_and_one_that_never_passes_scores_zero() -> None:
    top = search(replace(REAL, max=16), lambda load: 1.0)
    assert top.max_load == 16.0 and top.load_warning is None
    assert top.load_stopped_by == "max reached (16)"
    none = search(replace(REAL, min=0.25), lambda load: 0.0)
    assert none.max_load == 0.0 and none.load_warning is None


def test_a_search_that_ran_out_before_any_miss_warns_that_the_answer_may_be_higher() -> None:
    result = search(replace(REAL, steps=3), lambda load: 1.0)
    assert result.max_load == 8.0
    assert "between 8 passed, 100% good and no load missed" in (result.load_warning or "")


def test_a_concurrency_search_interpolates_between_whole_concurrencies() -> None:
    plan = LoadSearchPlan("concurrency", start=1, max=64, steps=12)
    result = search(plan, lambda load: 1.0 if load <= 12 else 0.8)
    assert {12, 13} <= {s.workload.concurrency for s in result.levels}
    assert result.max_load == pytest.approx(12.5)  # 100% at 12, 80% at 13: 90% halfway


def test_a_search_launch_stops_halving_once_it_missed_at_or_below_the_studys_best() -> None:
    # The L40S max_load study: the best so far 0.5 req/s; a config that misses at 0.5 cannot beat it, and
    # halving down to 1/16 req/s (80 prompts each) cost 1.25 node h a launch against 0.07 for the first step.
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=6, cutoff=0.5)
    result = search(plan, lambda load: 1.0 if load <= 0.1 else 0.07)
    assert [s.workload.request_rate for s in result.levels] == [0.5]
    assert result.stopped_early and result.max_load == 0.0
    assert result.load_stopped_by == (
        "stopped below the study's best max_load: the SLO missed at 0.5 (7% good), at or below it (0.5)"
    )
    assert result.load_below == 0.5  # its max_load lies below the load it missed at


def test_a_search_above_the_best_or_with_a_passing_load_or_switched_off_runs_to_its_answer() -> None:
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=6, cutoff=0.3)
    below = search(plan, lambda load: 1.0 if load <= 0.1 else 0.07)  # 0.5 misses above 0.3: on to 0.3
    assert [s.workload.request_rate for s in below.levels] == [0.5, 0.3]
    assert below.stopped_early and below.load_below == 0.3
    passes_at_half = lambda load: 1.0 if load <= 0.5 else 0.5  # noqa: E731
    passing = search(replace(plan, cutoff=2.0), passes_at_half)  # a load passed: bisects as without it
    assert not passing.stopped_early
    assert passing.levels == search(replace(plan, cutoff=None), passes_at_half).levels
    off = search(replace(plan, stop_below_best=False), lambda load: 1.0 if load <= 0.1 else 0.07)
    assert not off.stopped_early and 0.0625 < off.max_load < 0.125  # type: ignore[operator]
    assert [s.workload.request_rate for s in off.levels][:4] == [0.5, 0.25, 0.125, 0.0625]


def test_halving_past_the_cutoff_measures_at_the_cutoff_first() -> None:
    # The L40S study's best was the defaults' 0.0957 req/s: a config that halved from 0.125 to 1/16 req/s
    # passed there (80 prompts, 21 minutes) and bisected at the slow rates below the best, 3724 s a launch.
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=8, cutoff=0.0957)
    below = search(plan, lambda load: 1.0 if load <= 0.078 else 0.5)
    assert [s.workload.request_rate for s in below.levels] == [0.5, 0.25, 0.125, 0.0957]
    assert below.stopped_early and below.load_below == 0.0957 and below.max_load == 0.0
    above = search(plan, lambda load: 1.0 if load <= 0.11 else 0.5)  # it passes at the best: bracketed above
    assert [s.workload.request_rate for s in above.levels][:4] == [0.5, 0.25, 0.125, 0.0957]
    assert not above.stopped_early and above.load_below is None
    assert 0.0957 <= above.max_load < 0.125  # type: ignore[operator]
    under_the_floor = search(replace(plan, cutoff=0.05), lambda load: 1.0 if load <= 0.078 else 0.5)
    assert [s.workload.request_rate for s in under_the_floor.levels][:4] == [0.5, 0.25, 0.125, 0.0625]
    whole = LoadSearchPlan("concurrency", start=32, max=64, steps=8, cutoff=9.5)
    rates = [s.workload.concurrency for s in search(whole, lambda load: 1.0 if load <= 4 else 0.5).levels]
    assert rates == [32, 16, 9]  # halving from 16 to 8 measures at the cutoff, in whole requests


def test_under_a_node_hour_budget_halving_stops_where_a_step_would_cost_more_than_its_share() -> None:
    # 4x L40S under 2.9 node h: the defaults' and a config's walk down to 1/16 req/s (80 prompts, 1280 s a
    # step) took 0.95 and 1.10 node h before a config near the best was launched. A tenth of 2.9 node h pays
    # 80 prompts at 0.0766 req/s or faster (node_budget.step_floor).
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=6, budget_floor=0.0766)
    result = search(plan, lambda load: 1.0 if load <= 0.07 else 0.5)
    assert [s.workload.request_rate for s in result.levels] == [0.5, 0.25, 0.125]
    assert result.max_load == 0.0
    assert result.load_stopped_by is not None and result.load_stopped_by.startswith(
        "the SLO missed down to the lowest load tried (0.125)"
    )
    assert result.load_stopped_by.endswith(
        "a slower step costs more than the node-hour budget gives one step"
    )
    # Under the user's own `min`, the budget changes nothing.
    loose = search(replace(plan, budget_floor=0.01), lambda load: 1.0 if load <= 0.07 else 0.5)
    assert [s.workload.request_rate for s in loose.levels][:4] == [0.5, 0.25, 0.125, 0.0625]
    assert "node-hour budget" not in (loose.load_stopped_by or "")


def test_the_budget_never_floors_the_search_above_its_start() -> None:
    # 1000 prompts a step under a small budget: the floor would lie above `start`, which is always tried.
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=6, budget_floor=1.39)
    assert plan.floor == 0.5 and plan.own_floor == 0.0625
    result = search(plan, lambda load: 0.5)
    assert [s.workload.request_rate for s in result.levels] == [0.5]
    assert (result.load_stopped_by or "").startswith("the SLO missed down to the lowest load tried (0.5)")


def test_a_search_records_which_limits_the_step_above_its_max_load_broke_and_how_many_ran_at_once() -> None:
    # The default sampler caps the running requests of a best whose misses broke the TPOT limit
    # (samplers.IncumbentMoves._running_cap): it reads them here.
    plan = LoadSearchPlan("request_rate", start=1.0, max=8, steps=4)

    def measure(workload: Workload, _index: int) -> BenchmarkResult:
        load = plan.load_of(workload)
        over = {"ttft_ms": 1, "tpot_ms": 0 if load <= 1 else 9}
        result = step(workload, 1.0 if load <= 1 else 0.5)
        # Every request 3 s long: load x 3 of them at once on average (Little's law).
        return replace(result, request_throughput=load, mean_e2e_latency_ms=3000.0, slo_over=over)

    searched = run_plan_sync(replace(MeasurementPlan.single(BASE), load_search=plan), measure)
    lowest_miss = min(s.workload.request_rate or 0 for s in searched.levels if (s.slo_attainment or 0) < 0.9)
    assert searched.max_load is not None and 1 <= searched.max_load < lowest_miss < 2
    missed = searched.load_missed
    assert missed == {"load": lowest_miss, "over": {"ttft_ms": 1, "tpot_ms": 9}, "in_flight": lowest_miss * 3}
    assert search(replace(plan, max=2), lambda load: 1.0).load_missed is None  # it missed nowhere
