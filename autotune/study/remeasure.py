"""Repeated measurement: the study's best configs measured again, and its answer as a mean with an interval.

One measurement of a config is one draw of its run-to-run noise; the config with the best single draw is
often one that drew high. After the budget, `enqueue_remeasurement` queues the `top` configs of the
objective's `remeasure` section (by their best single value) and the baseline, until each has `repeats`
measurements; they run through the normal study loop as ordinary trials with the user attr `remeasure_of`
(each on a fresh launch, with its own prompts and noise). `remeasured_answer` then groups every complete
trial by its config and picks the best mean, with a Student-t confidence interval, and the gain over the
baseline's mean with Welch's interval: a gain whose interval reaches zero is within noise.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import optuna
from optuna.trial import TrialState

from autotune.config import Study
from autotune.config.objective import Remeasure
from autotune.measure.metrics import maximizes
from autotune.measure.stats import Gain, welch_gain
from autotune.study.records import CompareMark, ConfirmMark, TrialRecord, marks, record_remeasure
from autotune.study.rules import ConfigMeasurements, measurement_groups, remeasured_ranking
from autotune.study.storage import budget_used

__all__ = [
    "RemeasuredAnswer",
    "enqueue_remeasurement",
    "remeasure",
    "remeasured_answer",
]


def gain_over(best: ConfigMeasurements, base: ConfigMeasurements, maximize: bool) -> Gain | None:
    """The gain of `best` over `base` with Welch's interval (separate launches, not rounds side by side);
    None when either has no measurement or the baseline's mean is 0."""
    if not best.n or not base.n or base.mean == 0:
        return None
    return welch_gain(base.values, best.values, minimize=not maximize, confidence=best.confidence)


@dataclass(frozen=True)
class RemeasuredAnswer:
    """The study's answer after re-measurement: the best config by mean, the baseline, the gain."""

    best: ConfigMeasurements
    baseline: ConfigMeasurements | None
    gain: Gain | None
    ranking: tuple[ConfigMeasurements, ...]  # reliable configs, best mean first
    unreliable: tuple[ConfigMeasurements, ...]  # re-measured configs that failed or broke a limit once


def _maximize(optuna_study: optuna.Study) -> bool:
    return maximizes(optuna_study.direction)


def enqueue_remeasurement(optuna_study: optuna.Study, settings: Remeasure) -> list[int]:
    """Queue the measurements the top configs and the baseline still need; returns the configs' first trial
    numbers. Configs are ranked by their best single value, as a single-measurement study would rank them."""
    record_remeasure(optuna_study, settings.model_dump())
    maximize = _maximize(optuna_study)
    groups = [g for g in measurement_groups(optuna_study, settings.confidence) if g.n]
    candidates = sorted(
        (g for g in groups if not g.baseline), key=lambda g: max(g.values) if maximize else -min(g.values)
    )[::-1][: settings.top]
    candidates += [g for g in groups if g.baseline]
    queued = [
        of
        for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        if (of := TrialRecord.of(t).remeasure_of) is not None
    ]
    chosen = []
    for group in candidates:
        waiting = queued.count(group.of)
        missing = settings.repeats - len(group.trials) - len(group.failed) - waiting
        for _ in range(max(0, missing)):
            enqueue_measurement(optuna_study, group)
        chosen.append(group.of)
    return chosen


def enqueue_measurement(
    optuna_study: optuna.Study,
    group: ConfigMeasurements,
    *,
    confirm: ConfirmMark | None = None,
    compare: CompareMark | None = None,
) -> None:
    """Queue one more measurement of `group`'s config, a fresh launch through the study loop: the one way
    re-measurement, the baseline's repeat and confirmation rounds measure a config again."""
    attrs = marks(remeasure_of=group.of, baseline=group.baseline, confirm=confirm, compare=compare)
    optuna_study.enqueue_trial(dict(group.params), user_attrs=attrs)


def remeasured_answer(optuna_study: optuna.Study) -> RemeasuredAnswer | None:
    """The best config by mean among those measured more than once (the baseline included), or None before
    any config other than the baseline was re-measured."""
    if len(optuna_study.directions) != 1:
        return None
    maximize = _maximize(optuna_study)
    groups = measurement_groups(optuna_study)
    ranked = remeasured_ranking(groups, maximize)
    if ranked is None:
        return None
    reliable, unreliable = ranked
    base = next((g for g in groups if g.baseline), None)
    best = reliable[0]
    gain = gain_over(best, base, maximize) if base is not None else None
    return RemeasuredAnswer(
        best=best, baseline=base, gain=gain, ranking=tuple(reliable), unreliable=tuple(unreliable)
    )


def remeasure(study: Study, optuna_study: optuna.Study, run: Callable[[int], optuna.Study]) -> optuna.Study:
    """Queue the re-measurements the study's objective asks for and run them with `run(total_budget)` (a
    study driver's run); nothing when the objective has no `remeasure` or every measurement is done."""
    settings = study.objective.remeasure
    if settings is None:
        return optuna_study
    enqueue_remeasurement(optuna_study, settings)
    waiting = len(optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if not waiting:
        return optuna_study
    return run(budget_used(optuna_study) + waiting)
