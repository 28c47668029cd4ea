"""The steps the search takes before it asks Optuna for each trial, in order (`STEPS`): a node on which
nothing starts, SGLang's defaults at the load search's max, the node hours spent, the stopping rule, the
noise measured, knobs screened out. A step returns `SearchEnds` to end the search, or None; the rules
themselves live in autotune.study.trust. Whether another trial may start at all is `may_ask`; the knobs the
search holds from its start, `hold`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from optuna.trial import TrialState

from autotune.study import nccl_stage
from autotune.study.callbacks import KnobHeld
from autotune.study.node_failing import node_failing
from autotune.study.records import TrialRecord
from autotune.study.remeasure import enqueue_measurement
from autotune.study.run_state import RunState
from autotune.study.storage import budget_used
from autotune.study.trust import node_budget, screening
from autotune.study.trust.noise import repeat_baseline
from autotune.study.trust.stopping import (
    at_load_max_rule,
    defaults_at_max,
    load_max_settled,
    record_stop,
    why_stop,
)


@dataclass(frozen=True)
class SearchEnds:
    """Why the search ends; `recorded`: kept in the study (a plain resume stays stopped); `at_once`: the
    steps after this one are not taken."""

    why: str
    recorded: bool = True
    at_once: bool = False


Step = Callable[[RunState], SearchEnds | None]


def nodes_failing(run: RunState) -> SearchEnds | None:
    """Nothing starts on the node (study.node_failing); not recorded: a resume tries the node again."""
    dead = node_failing(run.optuna_study, run.trials_before)
    return None if dead is None else SearchEnds(dead.text, recorded=False, at_once=True)


def settled_at_load_max(run: RunState) -> SearchEnds | None:
    """SGLang's defaults met the SLO at the load search's max twice: no launch can measure more
    (study.trust.stopping.load_max_settled), whatever the node hours left would buy."""
    why = load_max_settled(run.study, run.optuna_study)
    return None if why is None else SearchEnds(why, at_once=True)


def node_hours_spent(run: RunState) -> SearchEnds | None:
    """The search's share of the node-hour budget is spent; recorded: a resume given more hours goes on
    to confirm."""
    hours = node_budget.node_hours(run.study, run.optuna_study)
    if hours.search_may_launch(len(run.running)):
        return None
    return SearchEnds(node_budget.search_ended_text(run.study, run.optuna_study, hours), at_once=True)


def stopping_rule(run: RunState) -> SearchEnds | None:
    """The stopping rule (study.trust.stopping)."""
    why = why_stop(run.study, run.optuna_study)
    return None if why is None else SearchEnds(why)


def noise_measured(run: RunState) -> None:
    """The baseline launched again while the noise is not known well enough (study.trust.noise), or at once
    where it met the SLO at the load search's max (`defaults_again_at_load_max`)."""
    defaults_again_at_load_max(run)

    def affordable() -> bool:
        # Where the hours pay for it beside the rounds, at what the defaults cost (a load search near the
        # slowest rates: 4066 s on 4x L40S, queued on a price of 571 s, took a 2.9 node h study to 3.26).
        hours = node_budget.node_hours(run.study, run.optuna_study)
        return hours.search_may_launch(len(run.running), defaults=True)

    repeat_baseline(run.study, run.optuna_study, affordable)


def defaults_again_at_load_max(run: RunState) -> None:
    """SGLang's defaults met the SLO at the load search's `max` in their one launch: launch them again next,
    where the hours left pay for it. A second launch there settles the study (stopping.load_max_settled):
    no stage, search launch or confirmation round can measure more, and their node hours are saved."""
    study, optuna_study = run.study, run.optuna_study
    defaults = defaults_at_max(study, optuna_study)
    if defaults is None or defaults.n != 1 or not at_load_max_rule(study):
        return
    waiting = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    if any(TrialRecord.of(t).baseline for t in waiting):
        return
    hours = node_budget.node_hours(study, optuna_study)
    if hours.left_s is not None and (hours.defaults_s or hours.next_price_s or 0.0) > hours.left_s:
        return
    enqueue_measurement(optuna_study, defaults)


def knobs_screened(run: RunState) -> SearchEnds | None:
    """Queue screening's own launches when its method has them, hold the knobs it shows to have no
    effect beyond noise (said to the observers, kept in the study), and end the search when no knob is
    left to search (study.trust.screening)."""
    study, optuna_study = run.study, run.optuna_study
    screening.plan_alone(study, optuna_study, run.stage_held, run.flag_defaults)
    found = screening.screen(study, optuna_study, run.stage_held, run.flag_defaults)
    if found:
        screening.record(optuna_study, found)
        for held in found:
            run.observers.knob_held(KnobHeld(held.why))
        # A new seed from the trials so far: the file's again would replay the first proposals.
        held_now = {**run.stage_held, **screening.held_knobs(optuna_study)}
        run.base_sampler = run.holding(held_now, len(optuna_study.get_trials(deepcopy=False)))
        optuna_study.sampler = run.current_sampler()
    why = screening.why_all_held(study, optuna_study, run.stage_held)
    return None if why is None else SearchEnds(why)


STEPS: tuple[Step, ...] = (
    nodes_failing,
    settled_at_load_max,
    node_hours_spent,
    stopping_rule,
    noise_measured,
    knobs_screened,
)


def between_trials(run: RunState) -> None:
    """Take the steps in order; the last `SearchEnds` is why the search stopped (`run.stopped`)."""
    for step in STEPS:
        ends = step(run)
        if ends is None:
            continue
        run.stopped = ends.why
        if ends.recorded:
            record_stop(run.optuna_study, ends.why)
        if ends.at_once:
            return


def may_ask(run: RunState, budget: int | None, deadline: float | None) -> bool:
    """Whether another trial may start: time and budget left, and the search not ended by one of the
    steps between trials."""
    if deadline is not None and time.monotonic() >= deadline:
        return False
    if run.baseline_only:
        defaults_again_at_load_max(run)  # before the stage, which cannot raise a max_load past the max
        return nccl_stage.baseline_next(run.optuna_study)
    if budget is not None and budget_used(run.optuna_study) >= budget:
        return False
    waiting = (TrialState.WAITING,)
    if run.options.queued_only and not run.optuna_study.get_trials(deepcopy=False, states=waiting):
        return False
    if run.searching and run.stopped is None and not run.options.queued_only:
        between_trials(run)
    return not (run.searching and run.stopped is not None)


def hold(run: RunState, held: dict[str, Any]) -> None:
    """Before the search: hold the NCCL stage's values `held` and the knobs a resumed study's screening
    held in every server trial the sampler proposes."""
    run.stage_held = held
    screened = screening.held_knobs(run.optuna_study)  # a resumed study holds what its screening held
    if held or screened:
        run.base_sampler = run.holding({**held, **screened})
        for line in screening.screened_lines(run.optuna_study):
            run.observers.knob_held(KnobHeld(line))
    run.optuna_study.sampler = run.current_sampler()
