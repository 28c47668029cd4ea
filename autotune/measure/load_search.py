"""The highest load at which an SLO holds, searched on one launch.

The load doubles while a step meets the SLO and halves while it misses, then the bracket is bisected;
`max_load` interpolates where the SLO attainment crosses its threshold, so that configs whose search
stopped at the same bracket are still told apart. The steps, failures, and the peers it follows:
docs/design.md, "Load search". A launch given a `cutoff` (a search launch: the study's best max_load; the
defaults' launch in a confirmation round: a share of the configs' beside them) stops halving once a load at
or below it missed with none passed: it cannot reach the cutoff, and the slow rates below would cost most of
the launch (`stopped_early`, its max_load below `load_below`; the driver tells it PRUNED). Halving that would
pass the cutoff measures at the cutoff first: a miss there stops at once, a pass brackets above it. A step
stops sending once
more of its requests missed than `attainment` allows of its num_prompts (`miss_limit`): it has missed
whatever the rest would measure, and their node time is saved.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from autotune.measure.client import BenchmarkError, BenchmarkResult, MissLimit, Workload

__all__ = ["BUDGET_FLOOR_SAID", "LoadSearchPlan", "decided_steps", "search_load"]

# How `load_stopped_by` ends where the node-hour budget's floor (`budget_floor`) stopped the halving.
BUDGET_FLOOR_SAID = "a slower step costs more than the node-hour budget gives one step"


@dataclass(frozen=True)
class LoadSearchPlan:
    """The search's settings, from the objective's `load_search` (see autotune.config.objective)."""

    vary: Literal["request_rate", "concurrency"]
    start: float
    max: float
    steps: int = 8
    attainment: float = 0.9
    tolerance: float = 0.1
    min: float | None = None  # the lowest load tried; None: start / 8 (a step's time grows as 1 / rate)
    stop_below_best: bool = True  # whether `cutoff` stops the halving (the objective's switch)
    stop_when_decided: bool = True  # whether a step stops sending once it has missed (`miss_limit`)
    cutoff: float | None = None  # the load it stops below, handed out with the trial (`cutoff_is`)
    cutoff_is: str = "the study's best max_load"  # what `cutoff` is, as `load_stopped_by` says it
    # The slowest rate a node-hour budget pays a step at (its num_prompts in a share of the hours left:
    # study.trust.node_budget.step_floor); None: no budget, or a concurrency search.
    budget_floor: float | None = None

    def below_cutoff(self, highest_pass: float | None, lowest_miss: float | None) -> bool:
        """Whether the search can stop: nothing passed and a load at or below the cutoff missed, so this
        config's max_load (below its lowest miss) cannot reach it."""
        if not self.stop_below_best or self.cutoff is None or highest_pass is not None:
            return False
        return lowest_miss is not None and lowest_miss <= self.cutoff

    @property
    def floor(self) -> float:
        """The lowest load tried: `min` (default start / 8), or the budget's where it is higher (never above
        `start`, which is always tried)."""
        return max(self.own_floor, min(self.budget_floor or 0.0, self.start))

    @property
    def own_floor(self) -> float:
        """The lowest load the objective lets the search try: `min`, by default start / 8."""
        if self.min is not None:
            return self.min
        return max(1.0, self.start / 8) if self.vary == "concurrency" else self.start / 8

    def load_of(self, workload: Workload) -> float:
        if self.vary == "concurrency":
            return float(workload.concurrency)
        return float(workload.request_rate or 0.0)

    def at(self, base: Workload, load: float) -> Workload:
        """`base` at `load`; a concurrency step sends at least two requests per slot."""
        if self.vary == "concurrency":
            concurrency = int(load)
            return replace(base, concurrency=concurrency, num_prompts=max(base.num_prompts, 2 * concurrency))
        return replace(base, request_rate=load)

    def passed(self, result: BenchmarkResult) -> bool:
        return result.failed == 0 and (result.slo_attainment or 0.0) >= self.attainment

    def miss_limit(self, step: Workload) -> MissLimit | None:
        """Where `step` has missed whatever its unsent requests would measure: one failed, or more missed the
        SLO than `passed` allows of its num_prompts; None when the objective's switch is off."""
        if not self.stop_when_decided:
            return None
        n = step.num_prompts
        # By `passed`'s own comparison: n * (1 - attainment) rounds badly (80 * (1 - 0.9) < 8).
        allowed = max(missed for missed in range(n + 1) if (n - missed) / n >= self.attainment)
        return MissLimit(missed=allowed, failed=0)

    def next_load(self, highest_pass: float | None, lowest_miss: float | None) -> float | None:
        """The next load to measure, or None when the answer is found."""
        whole = self.vary == "concurrency"
        if lowest_miss is None:
            assert highest_pass is not None
            return None if highest_pass >= self.max else min(highest_pass * 2, self.max)
        if highest_pass is None:
            lower = math.floor(lowest_miss / 2) if whole else lowest_miss / 2
            probe = self._probe(lower, lowest_miss)
            if probe is not None:
                return probe
            return lower if lower >= self.floor else None
        if lowest_miss - highest_pass <= (1 if whole else self.tolerance * highest_pass):
            return None
        middle = (highest_pass + lowest_miss) / 2
        return float(math.floor(middle)) if whole else middle

    def _probe(self, lower: float, lowest_miss: float) -> float | None:
        """The cutoff, where halving from `lowest_miss` to `lower` would step past it: a miss at the cutoff
        decides the launch (`below_cutoff`) for one step's time, where the rates below it cost the most."""
        if not self.stop_below_best or self.cutoff is None:
            return None
        probe = float(math.floor(self.cutoff)) if self.vary == "concurrency" else self.cutoff
        return probe if lower < probe < lowest_miss and probe >= self.floor else None

    def crossing_load(self, passed: BenchmarkResult, missed: BenchmarkResult | None) -> float:
        """The load at which the attainment crosses `attainment` between a passing step and the missing step
        above it (see the module doc); the passing step's load when the miss lost requests or is unknown."""
        # A step decided early brings its share over the requests it sent: it always lies between what the
        # unsent ones could have made of the whole step (all missed, all good), and it assumes neither.
        low = self.load_of(passed.workload)
        if missed is None or missed.failed or missed.slo_attainment is None:
            return low
        high, above = self.load_of(missed.workload), passed.slo_attainment or 0.0
        below = missed.slo_attainment
        if below >= self.attainment or above <= below:  # not a crossing of the threshold between them
            return low
        return low + (high - low) * (above - self.attainment) / (above - below)


async def search_load(
    plan: LoadSearchPlan, base: Workload, measure: Callable[[Workload, int], Awaitable[BenchmarkResult]]
) -> BenchmarkResult:
    """Run the search with `measure(workload, step_index)` on the launched server (see module doc)."""
    load: float | None = float(int(plan.start)) if plan.vary == "concurrency" else plan.start
    highest_pass: float | None = None
    lowest_miss: float | None = None
    steps: list[BenchmarkResult] = []
    best: BenchmarkResult | None = None
    stopped_by = ""
    last_error: BenchmarkError | None = None
    failed_in_a_row = 0
    ran_out = below = False
    for index in range(plan.steps):
        assert load is not None
        workload = plan.at(base, load)
        if index:
            workload = workload.on_warm_server()
        try:
            result = await measure(workload, index)
        except BenchmarkError as exc:
            last_error, failed_in_a_row = exc, failed_in_a_row + 1
            lowest_miss = load if lowest_miss is None else min(lowest_miss, load)
            stopped_by = f"the benchmark failed at {load:g}: {exc.first_error or exc}"
            if failed_in_a_row >= 2:
                break
        else:
            failed_in_a_row = 0
            steps.append(result)
            if plan.passed(result):
                highest_pass = load if highest_pass is None else max(highest_pass, load)
                best = result if best is None or load >= plan.load_of(best.workload) else best
            else:
                lowest_miss = load if lowest_miss is None else min(lowest_miss, load)
                stopped_by = f"the SLO missed at {load:g} ({_good_share(result)})"
        if steps and plan.below_cutoff(highest_pass, lowest_miss):
            assert plan.cutoff is not None
            stopped_by = f"stopped below {plan.cutoff_is}: {stopped_by}, at or below it ({plan.cutoff:.4g})"
            below = True
            break
        load = plan.next_load(highest_pass, lowest_miss)
        if load is None:
            if lowest_miss is None:
                stopped_by = f"max reached ({plan.max:g})"
            elif highest_pass is not None:
                stopped_by = f"bracketed: {highest_pass:g} met the SLO, {lowest_miss:g} did not"
            else:
                stopped_by = f"the SLO missed down to the lowest load tried ({lowest_miss:g}): {stopped_by}"
                if plan.floor > plan.own_floor:
                    stopped_by += f"; {BUDGET_FLOOR_SAID}"
            break
    else:
        passed = "none" if highest_pass is None else f"{highest_pass:g}"
        missed = "none" if lowest_miss is None else f"{lowest_miss:g}"
        stopped_by = f"the steps ran out ({plan.steps}): highest pass {passed}, lowest miss {missed}"
        ran_out = True
    if not steps:
        assert last_error is not None
        raise last_error
    head = best or steps[-1]
    missed_step = next((s for s in steps if plan.load_of(s.workload) == lowest_miss), None)
    max_load = 0.0 if best is None else plan.crossing_load(best, missed_step)
    warning = _ran_out_warning(plan, best, missed_step, max_load) if ran_out else None
    return replace(
        head,
        levels=tuple(steps),
        max_load=max_load,
        load_stopped_by=stopped_by,
        load_warning=warning,
        stopped_early=below,
        load_below=lowest_miss if below else None,
        load_bracket=(
            lowest_miss - highest_pass if highest_pass is not None and lowest_miss is not None else None
        ),
        load_missed=_missed(plan, missed_step) if best is not None else None,
    )


def _missed(plan: LoadSearchPlan, step: BenchmarkResult | None) -> dict[str, Any] | None:
    """What the step missed at just above the max_load showed (`load_missed`); None where none says."""
    if step is None or step.slo_over is None:
        return None
    in_flight = step.request_throughput * step.mean_e2e_latency_ms / 1000  # Little's law
    load = plan.load_of(step.workload)
    return {"load": load, "over": dict(step.slo_over), "in_flight": round(in_flight, 2)}


def decided_steps(searched: BenchmarkResult) -> str | None:
    """What a search's steps that stopped once decided sent (for status), or None when none did."""
    decided = [s for s in searched.levels if s.decided_after is not None]
    if not decided:
        return None
    sent = sum(s.decided_after or 0 for s in decided)
    planned = sum(s.workload.num_prompts for s in decided)
    steps = f"{len(decided)} of {len(searched.levels)} load steps"
    return f"{steps} decided early: {sent} of {planned} prompts sent"


def _good_share(step: BenchmarkResult) -> str:
    """A missed step's share of good requests, and how many it sent when it was decided early."""
    good = f"{(step.slo_attainment or 0) * 100:.0f}% good"
    if step.decided_after is None:
        return good
    return f"{good}; decided after {step.decided_after} of {step.workload.num_prompts} prompts"


def _ran_out_warning(
    plan: LoadSearchPlan, passed: BenchmarkResult | None, missed: BenchmarkResult | None, max_load: float
) -> str:
    """What a user must know about a max_load whose search ran out of steps: the bracket it got to, and
    the fix."""

    def step(result: BenchmarkResult | None, verb: str) -> str:
        if result is None:
            return f"no load {verb}"
        attained = result.slo_attainment
        good = f", {attained * 100:.0f}% good" if attained is not None else ""
        return f"{plan.load_of(result.workload):g} {verb}{good}"

    return (
        f"the load search ran out of steps ({plan.steps}) before its tolerance ({plan.tolerance:g}): "
        f"max_load {max_load:.4g} lies between {step(passed, 'passed')} and {step(missed, 'missed')}; "
        f"raise load_search.steps, or set start and max closer to the answer"
    )
