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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.config.objective import Remeasure
from autotune.measure.stats import Gain, mean_ci, welch_gain
from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR, REMEASURE_SETTINGS_ATTR, SKIPPED_ATTR
from autotune.study.rules import is_feasible, maximizes
from autotune.study.samplers import ConfigKey, config_key
from autotune.study.storage import budget_used

DEFAULT_CONFIDENCE = 0.95

__all__ = [
    "REMEASURE_OF_ATTR",
    "ConfigMeasurements",
    "RemeasuredAnswer",
    "enqueue_remeasurement",
    "mean_interval",
    "measurement_groups",
    "remeasure",
    "remeasured_answer",
]


def mean_interval(values: Sequence[float], confidence: float) -> tuple[float, float] | None:
    """The Student-t confidence interval of the mean of `values`; None for fewer than two."""
    if len(values) < 2:
        return None
    ci = mean_ci(values, confidence)
    return ci.low, ci.high


@dataclass(frozen=True)
class ConfigMeasurements:
    """Every measurement of one config: its complete, feasible trials' values, and the trials that failed."""

    of: int  # the first trial of this config
    baseline: bool
    params: dict[str, object]
    trials: tuple[int, ...]
    values: tuple[float, ...]
    failed: tuple[int, ...]  # measurements that failed, were pruned or broke a limit
    confidence: float = DEFAULT_CONFIDENCE

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else math.nan

    @property
    def interval(self) -> tuple[float, float] | None:
        return mean_interval(self.values, self.confidence)

    @property
    def reliable(self) -> bool:
        """Measured more than once, and never failed nor broke a limit."""
        return self.n >= 2 and not self.failed


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


def _config_key(trial: FrozenTrial) -> ConfigKey | str:
    # The sampler's key: a config it does not propose twice is not grouped here as re-measured.
    return "baseline" if trial.user_attrs.get(BASELINE_ATTR) else config_key(trial.params)


def measurement_groups(ostudy: optuna.Study, confidence: float | None = None) -> list[ConfigMeasurements]:
    """Every config the study measured, with all its measurements; the first trial of each names it."""
    if confidence is None:
        settings = ostudy.user_attrs.get(REMEASURE_SETTINGS_ATTR) or {}
        confidence = float(settings.get("confidence", DEFAULT_CONFIDENCE))
    groups: dict[ConfigKey | str, list[FrozenTrial]] = {}
    for trial in sorted(ostudy.get_trials(deepcopy=False), key=lambda t: t.number):
        if trial.state in (TrialState.WAITING, TrialState.RUNNING) or trial.user_attrs.get(SKIPPED_ATTR):
            continue
        groups.setdefault(_config_key(trial), []).append(trial)
    out = []
    for members in groups.values():
        good = [
            t for t in members if t.state == TrialState.COMPLETE and t.value is not None and is_feasible(t)
        ]
        # A first trial that failed says the config failed; only failures among measurements that count.
        counted = [t for t in members if t.state == TrialState.COMPLETE or REMEASURE_OF_ATTR in t.user_attrs]
        bad = [t.number for t in counted if t not in good]
        out.append(
            ConfigMeasurements(
                of=members[0].number,
                baseline=bool(members[0].user_attrs.get(BASELINE_ATTR)),
                params=dict(members[0].params),
                trials=tuple(t.number for t in good),
                values=tuple(float(t.value) for t in good if t.value is not None),
                failed=tuple(bad),
                confidence=confidence,
            )
        )
    return out


def _maximize(ostudy: optuna.Study) -> bool:
    return maximizes(ostudy.direction)


def enqueue_remeasurement(ostudy: optuna.Study, settings: Remeasure) -> list[int]:
    """Queue the measurements the top configs and the baseline still need; returns the configs' first trial
    numbers. Configs are ranked by their best single value, as a single-measurement study would rank them."""
    ostudy.set_user_attr(REMEASURE_SETTINGS_ATTR, settings.model_dump())
    maximize = _maximize(ostudy)
    groups = [g for g in measurement_groups(ostudy, settings.confidence) if g.n]
    candidates = sorted(
        (g for g in groups if not g.baseline), key=lambda g: max(g.values) if maximize else -min(g.values)
    )[::-1][: settings.top]
    candidates += [g for g in groups if g.baseline]
    queued = [
        t
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING, TrialState.RUNNING))
        if REMEASURE_OF_ATTR in t.user_attrs
    ]
    chosen = []
    for group in candidates:
        waiting = sum(1 for t in queued if t.user_attrs[REMEASURE_OF_ATTR] == group.of)
        missing = settings.repeats - len(group.trials) - len(group.failed) - waiting
        attrs: dict[str, object] = {REMEASURE_OF_ATTR: group.of}
        if group.baseline:
            attrs[BASELINE_ATTR] = True
        for _ in range(max(0, missing)):
            ostudy.enqueue_trial(dict(group.params), user_attrs=attrs)
        chosen.append(group.of)
    return chosen


def remeasured_answer(ostudy: optuna.Study) -> RemeasuredAnswer | None:
    """The best config by mean among those measured more than once (the baseline included), or None before
    any config other than the baseline was re-measured."""
    if len(ostudy.directions) != 1:
        return None
    maximize = _maximize(ostudy)
    groups = measurement_groups(ostudy)
    repeated = [g for g in groups if g.n >= 2 or (g.failed and g.n)]
    if not any(not g.baseline for g in repeated):
        return None
    reliable = sorted((g for g in repeated if g.reliable), key=lambda g: g.mean, reverse=maximize)
    if not reliable:
        return None
    base = next((g for g in groups if g.baseline), None)
    best = reliable[0]
    gain = gain_over(best, base, maximize) if base is not None else None
    return RemeasuredAnswer(
        best=best,
        baseline=base,
        gain=gain,
        ranking=tuple(reliable),
        unreliable=tuple(g for g in repeated if not g.reliable),
    )


def remeasure(study: Study, ostudy: optuna.Study, run: Callable[[int], optuna.Study]) -> optuna.Study:
    """Queue the re-measurements the study's objective asks for and run them with `run(total_budget)` (a
    study driver's run); nothing when the objective has no `remeasure` or every measurement is done."""
    settings = study.objective.remeasure
    if settings is None:
        return ostudy
    enqueue_remeasurement(ostudy, settings)
    waiting = len(ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if not waiting:
        return ostudy
    return run(budget_used(ostudy) + waiting)
