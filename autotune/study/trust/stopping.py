"""The stopping rule: a search ends early when further trials are unlikely to beat its best beyond noise.

After `min_trials` (and `min_node_hours`), when the last `patience` search trials (or
`patience_node_hours`) did not raise the best value by more than the noise band, the search stops and the
study goes on to confirmation; without a noise estimate it never stops a study. With `min_patience` the
patience grows with the search: a best raised early is waited on fewer trials. Why this rule, and its
figures: docs/design.md, "The stopping rule", and benchmarks/RESULTS.md. A max_load study is settled once
SGLang's defaults met the SLO at the highest load it tries in each of their first two launches
(`load_max_settled`): no stage, search or confirmation round can measure more.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial

from autotune.config import Study
from autotune.config.trust import StopEarly
from autotune.study.records import StudyRecord, TrialRecord, record_stopped
from autotune.study.rules import ConfigMeasurements, best_measured, direction_sign, measurement_groups
from autotune.study.storage import counts
from autotune.study.trust.noise import noise_estimate

__all__ = [
    "at_load_max_rule",
    "defaults_at_max",
    "load_max_settled",
    "record_stop",
    "stopped_early",
    "why_stop",
]


def _search_trials(trials: Sequence[FrozenTrial]) -> list[FrozenTrial]:
    """The finished launches the sampler proposed (`TrialRecord.deliberate`: not one asked for on purpose)."""
    return [
        t
        for t in sorted(trials, key=lambda t: t.number)
        if t.state.is_finished() and counts(t) and not TrialRecord.of(t).deliberate
    ]


def _best(trials: Sequence[FrozenTrial], direction: StudyDirection) -> float | None:
    """The best measured value of `trials` (`rules.best_measured`), signed so that larger is better."""
    best = best_measured(trials, direction)
    return None if best is None or best.value is None else direction_sign(direction) * best.value


# The fewest search launches a stretch in node hours must hold: where a launch costs over an hour (a load
# search on 4x L40S), 2 node hours were 2 launches, and the rule stopped a study 4 launches into its search
# at 0.10 of the best known (benchmarks/RESULTS-peers.md, max_load).
MIN_STRETCH_LAUNCHES = 5


def why_stop(study: Study, optuna_study: optuna.Study) -> str | None:
    """Why the search should stop now, in a sentence, or None to go on."""
    settings = study.file.trust.stop_early
    if not settings.enabled or len(optuna_study.directions) != 1:
        return None
    if (
        settings.patience_node_hours is not None
        and (why := _why_stop_in_hours(study, optuna_study)) is not None
    ):
        return why  # else the rule in trials may stop it: whichever is met first
    trials = optuna_study.get_trials(deepcopy=False)
    launched = [t for t in trials if t.state.is_finished() and counts(t)]
    search = _search_trials(trials)
    # After an earlier stop, a resumed search gets `patience` trials of its own before the rule looks again.
    since = _stopped_after(optuna_study)
    fresh = [t for t in search if t.number > since]
    min_trials = 0 if StudyRecord.of(optuna_study).warm_start is not None else settings.min_trials
    patience = _patience(settings, optuna_study, launched, search)
    if len(launched) < min_trials or len(search) <= patience:
        return None
    if len(fresh) < patience:
        return None
    recent = {t.number for t in search[-patience:]}
    if (gain := _within_noise(optuna_study, launched, recent, settings.min_noise_dof)) is None:
        return None
    return f"stopped early: the last {patience} search trials raised the best by {gain}"


# The patience that grows with the search: this share of the search trials it took to raise the best the
# last time (a best found in 8 trials is waited on 8 more where `min_patience` is 8; one found in 20, 15).
PATIENCE_SHARE = 0.75


def _patience(
    settings: StopEarly, optuna_study: optuna.Study, launched: list[FrozenTrial], search: list[FrozenTrial]
) -> int:
    """The search trials the rule waits on: `patience`, or with `min_patience` PATIENCE_SHARE of the
    search trials until the best was last raised beyond the noise band, between the two."""
    if settings.min_patience is None or (noise := noise_estimate(optuna_study)) is None:
        return settings.patience
    band, direction, found = noise.band(spread_known=True), optuna_study.direction, 0
    for position, trial in enumerate(search, start=1):
        before = _best([t for t in launched if t.number < trial.number], direction)
        now = _best([t for t in launched if t.number <= trial.number], direction)
        if before is not None and now is not None and before != 0 and (now - before) / abs(before) > band:
            found = position
    return min(settings.patience, max(settings.min_patience, math.ceil(PATIENCE_SHARE * found)))


def defaults_at_max(study: Study, optuna_study: optuna.Study) -> ConfigMeasurements | None:
    """SGLang's defaults' measurements, where each of their launches met the SLO at the load search's `max`:
    no config can measure more there; None otherwise (or where the objective is no max_load)."""
    search = study.objective.load_search
    if search is None or study.objective.metric != "max_load":
        return None
    defaults = next((g for g in measurement_groups(optuna_study) if g.baseline), None)
    if defaults is None or not defaults.n or defaults.failed or min(defaults.values) < search.max:
        return None
    return defaults


def at_load_max_rule(study: Study) -> bool:
    """Whether the study ends once SGLang's defaults met the SLO at the load search's `max` twice
    (`stop_early.at_load_max`)."""
    settings = study.file.trust.stop_early
    return settings.enabled and settings.at_load_max


def load_max_settled(study: Study, optuna_study: optuna.Study) -> str | None:
    """Why the study is settled with SGLang's defaults: they met the SLO at the load search's `max` in each
    of their launches, two at least, so no NCCL stage, search launch or confirmation round can show a config
    that measures more (`at_load_max_rule`); None otherwise."""
    defaults = defaults_at_max(study, optuna_study) if at_load_max_rule(study) else None
    search = study.objective.load_search
    if defaults is None or defaults.n < 2 or search is None:
        return None
    return (
        f"stopped early: SGLang's defaults met the SLO at the highest load the search tries (load_search.max "
        f"{search.max:g}) in each of their {defaults.n} launches, and no config can measure more; raise "
        "load_search.max to tell configs apart"
    )


def _within_noise(
    optuna_study: optuna.Study, launched: list[FrozenTrial], recent: set[int], min_noise_dof: int
) -> str | None:
    """How far the `recent` launches raised the best, with the noise band it stayed within and the way
    on, when they raised it no more than that band; None when they did, or the noise is not known yet."""
    noise = noise_estimate(optuna_study)
    if noise is None or noise.dof < min_noise_dof:
        return None
    before = _best([t for t in launched if t.number not in recent], optuna_study.direction)
    now = _best(launched, optuna_study.direction)
    if before is None or now is None or before == 0:
        return None
    improvement = (now - before) / abs(before)
    band = noise.band(spread_known=True)
    if improvement > band:
        return None
    return (
        f"{improvement:.2%}, within the run-to-run noise band of {band:.2%} ({noise.describe()}); "
        "`autotune resume --n-trials N` continues the search"
    )


def _node_h(trial: FrozenTrial) -> float:
    return (TrialRecord.of(trial).node_s or 0.0) / 3600


def _why_stop_in_hours(study: Study, optuna_study: optuna.Study) -> str | None:
    """The rule with its stretch in node hours: after `min_node_hours` of launches, the last
    `patience_node_hours` of search launches did not raise the best beyond the noise band."""
    settings = study.file.trust.stop_early
    patience_h, min_h = float(settings.patience_node_hours or 0.0), float(settings.min_node_hours or 0.0)
    if StudyRecord.of(optuna_study).warm_start is not None:
        min_h = 0.0
    trials = optuna_study.get_trials(deepcopy=False)
    launched = [t for t in trials if t.state.is_finished() and counts(t)]
    search = _search_trials(trials)
    since = _stopped_after(optuna_study)
    if (
        sum(map(_node_h, launched)) < min_h
        or sum(_node_h(t) for t in search if t.number > since) < patience_h
    ):
        return None
    recent: set[int] = set()
    stretch = 0.0
    for trial in reversed(search):  # the last search launches that together took `patience_h`
        if stretch >= patience_h:
            break
        recent.add(trial.number)
        stretch += _node_h(trial)
    if len(recent) < MIN_STRETCH_LAUNCHES:
        return None
    if (gain := _within_noise(optuna_study, launched, recent, settings.min_noise_dof)) is None:
        return None
    stretch_text = f"the last {stretch:.2f} node hours of search ({len(recent)} trials)"
    return f"stopped early: {stretch_text} raised the best by {gain}"


def record_stop(optuna_study: optuna.Study, why: str) -> None:
    """Remember in the study that its search stopped early, why, and after which trial."""
    last = max(
        (t.number for t in optuna_study.get_trials(deepcopy=False) if t.state.is_finished()), default=-1
    )
    record_stopped(optuna_study, why, last)


def stopped_early(optuna_study: optuna.Study) -> str | None:
    """Why the study's search last stopped early, or None when it never did."""
    stopped = StudyRecord.of(optuna_study).stopped
    return (stopped["why"] or None) if stopped is not None else None


def _stopped_after(optuna_study: optuna.Study) -> int:
    """The last trial before an earlier early stop; -1 when the search never stopped early."""
    stopped = StudyRecord.of(optuna_study).stopped
    return stopped["after_trial"] if stopped is not None else -1
