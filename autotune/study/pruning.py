"""Short-first measurement on the Optuna side: the pruner, and the cutoff a node applies on its own.

A node cannot ask Optuna mid-trial (it may be a Ray actor elsewhere, and its server must not wait), so
when the driver hands out a trial it asks the study's pruner which short-measurement values it would
prune right now, as one number: the `cutoff`. The node stops after the short measurement when its value
is worse; the driver then reports that value as the trial's intermediate value at `SHORT_STEP` and tells
the trial PRUNED (its stored value is the short one, so TPE ranks it below every complete trial).
A load search's cutoff is the study's best max_load (`load_cutoff`; autotune.measure.load_search).
"""

from __future__ import annotations

import datetime
import math

import optuna
from optuna.pruners import BasePruner, PercentilePruner
from optuna.trial import FrozenTrial, TrialState

from autotune.config.objective import ShortFirst
from autotune.measure.metrics import maximizes
from autotune.study.rules import best_measured

SHORT_STEP = 0  # the intermediate value's step: the short measurement
_BISECTIONS = 60


def short_pruner(short: ShortFirst) -> PercentilePruner:
    """Optuna's pruner for a short measurement: a value outside the best `keep_top_pct` percent of the
    complete trials' short values, once `min_trials` trials completed, is pruned."""
    return PercentilePruner(short.keep_top_pct, n_startup_trials=short.min_trials, n_warmup_steps=0)


def _probe(value: float) -> FrozenTrial:
    """A running trial whose short measurement gave `value`, as the pruner would see it."""
    return FrozenTrial(
        number=-1,
        state=TrialState.RUNNING,
        value=None,
        datetime_start=datetime.datetime.now(),
        datetime_complete=None,
        params={},
        distributions={},
        user_attrs={},
        system_attrs={},
        intermediate_values={SHORT_STEP: value},
        trial_id=-1,
    )


def short_cutoff(study: optuna.Study, pruner: BasePruner) -> float | None:
    """The short-measurement value at which `pruner` starts pruning a trial reported now: values worse than
    it are pruned. None while the pruner prunes nothing (too few complete trials).

    Asked of the pruner itself, by bisection between the short values seen so far, so any pruner whose
    decision is a threshold on the step's value works (Median, Percentile, Threshold).
    """
    maximize = maximizes(study.direction)
    seen = [
        v
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        for step, v in t.intermediate_values.items()
        if step == SHORT_STEP and math.isfinite(v)
    ]
    if not seen:
        return None
    span = max(seen) - min(seen) or abs(max(seen)) or 1.0
    worst = min(seen) - span if maximize else max(seen) + span
    best = max(seen) + span if maximize else min(seen) - span

    def pruned(value: float) -> bool:
        return bool(pruner.prune(study, _probe(value)))

    if not pruned(worst):
        return None
    if pruned(best):
        return best  # prunes everything seen: the cutoff lies beyond the best value
    for _ in range(_BISECTIONS):
        middle = (worst + best) / 2
        if pruned(middle):
            worst = middle
        else:
            best = middle
    return best  # the least extreme value that is not pruned


def load_cutoff(study: optuna.Study) -> float | None:
    """The best max_load any launch of the study measured (its feasible COMPLETE trials): a search launch
    whose load search missed at or below it before any load passed cannot beat it. None before one."""
    best = best_measured(study.get_trials(deepcopy=False), study.direction)
    return None if best is None or best.value is None else float(best.value)
