"""Rules about a study's trials that every layer above it shares: which trial is feasible, which way is
better (`maximizes` itself is measure's, autotune.measure.metrics), which trials measured the same config,
and the study's best trial (`best_trial`).

This module sits below the sampler, the driver, re-measurement, the CLI and the views (it imports Optuna's
types only for type checking), so each of them imports the rule from here instead of spelling it out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from autotune.measure.metrics import maximizes
from autotune.measure.stats import mean_ci
from autotune.study.records import StudyRecord, TrialRecord
from autotune.trial.redaction import Secrets, is_secret_name

if TYPE_CHECKING:
    import optuna
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial

    from autotune.config import Study
    from autotune.trial.launch import ServerLaunch, TrialConfig

DEFAULT_CONFIDENCE = 0.95


ConfigKey = tuple[tuple[str, str], ...]


def trial_config(study: Study, trial: FrozenTrial) -> TrialConfig:
    """The settings a finished trial ran with, rebuilt from its parameters through the search space."""
    from optuna.trial import FixedTrial

    if TrialRecord.of(trial).baseline:
        return study.search_space.baseline()
    return study.search_space.suggest(FixedTrial(dict(trial.params), trial.number))


def config_key(params: Mapping[str, Any]) -> ConfigKey:
    """A config's parameters, comparable across trials: equal for the same config (True and 1 differ)."""
    return tuple(sorted((name, repr(value)) for name, value in params.items()))


def counts(trial: FrozenTrial) -> bool:
    """Whether a trial counts against the budget: not when it was never launched (a known incompatible
    proposal) or said nothing about its settings (interrupted, node lost: those run again)."""
    record = TrialRecord.of(trial)
    if record.skipped:
        return False
    kind = record.failure_kind
    return not (kind is not None and kind.retried_once)


def launch_identity(launch: ServerLaunch, secrets: Secrets | None = None) -> dict[str, Any]:
    """What makes two server launches the same, after the dialect's translation: each `--flag` with its
    value as the server reads it (the last one wins, as in argparse; None for a switch), and a digest of
    everything else (the command, the environment), so no secret is stored: the value of a secret flag,
    or one holding any of the study's `secrets` (a `${NAME}` it reads), is a digest too."""
    words, env = list(launch.command), launch.env
    flags = dict(launch.flags)  # the last one wins
    secret = {
        name: _digest(value)
        for name, value in flags.items()
        if is_secret_name(name) or (secrets is not None and value and secrets.redact(value) != value)
    }
    return {"flags": {**flags, **secret}, "rest": _digest(json.dumps([words, sorted(env.items())]))}


def _digest(text: str | None) -> str:
    return hashlib.sha256(str(text).encode()).hexdigest()[:16]


def _as_server_reads(value: object) -> object:
    # "0.80", "0.8" and the server's 0.8 are one value; a switch's None and any word stay as they are.
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return value


def same_launch(a: Mapping[str, Any], b: Mapping[str, Any], server_choices: Mapping[str, float]) -> bool:
    """Whether two `launch_identity`s start the same server: the same flags with the same values, a flag
    left unset counting as the value the server chose for itself in the baseline (`server_choices`)."""
    if a.get("rest") != b.get("rest"):
        return False

    def read(identity: Mapping[str, Any]) -> dict[str, object]:
        flags = {**server_choices, **identity.get("flags", {})}
        return {name: _as_server_reads(value) for name, value in flags.items()}

    return read(a) == read(b)


def earlier_launch(
    identity: Mapping[str, Any], trials: Iterable[FrozenTrial], server_choices: Mapping[str, float]
) -> FrozenTrial | None:
    """The first finished trial of `trials` that launched the same server as `identity`, or None. The
    caller passes the measurements that count (`storage.counts`: not a launch a Ctrl-C cut short)."""
    for trial in sorted(trials, key=lambda t: t.number):
        launched = TrialRecord.of(trial).launch
        if launched is None or not trial.state.is_finished():
            continue
        if same_launch(identity, launched, server_choices):
            return trial
    return None


def within_limits(constraints: Mapping[str, float]) -> bool:
    """Every constraint value is <= 0 (Optuna's convention: > 0 says by how much a limit was broken).

    No constraints at all (a study without limits, or a trial told before any was set) is within limits,
    as in Optuna's own rule (`optuna.study._constrained_optimization._get_feasible_trials`)."""
    return all(v <= 0 for v in constraints.values())


def is_feasible(trial: FrozenTrial) -> bool:
    """The trial met every constraint set on it (`within_limits`); its state is not looked at."""
    return within_limits(trial.constraints)


def direction_sign(direction: StudyDirection | str) -> float:
    """+1.0 to maximize, -1.0 to minimize: `sign * value` grows as the value gets better."""
    return 1.0 if maximizes(direction) else -1.0


def non_dominated(trials: Sequence[FrozenTrial], directions: Sequence[StudyDirection]) -> list[FrozenTrial]:
    """The trials no other one dominates (at least as good in every objective of `directions`, better in
    one), in their order: the Pareto front of the study's answer and of its plot."""
    signs = [direction_sign(d) for d in directions]
    scores = {t.number: [s * v for s, v in zip(signs, t.values, strict=False)] for t in trials}

    def dominates(a: list[float], b: list[float]) -> bool:
        return all(x >= y for x, y in zip(a, b, strict=True)) and a != b

    return [t for t in trials if not any(dominates(scores[o.number], scores[t.number]) for o in trials)]


def gain_pct(value: float | None, baseline: float | None, direction: StudyDirection | str) -> float | None:
    """How much better `value` is than the baseline's, in percent of the baseline's (positive: better);
    None without both values or when the baseline's is 0."""
    if value is None or not baseline:
        return None
    return direction_sign(direction) * (value - baseline) / abs(baseline) * 100


def baseline_trial(optuna_study: optuna.Study) -> FrozenTrial | None:
    """The first completed baseline trial (SGLang's defaults), if there is one."""
    return next(
        (
            t
            for t in optuna_study.get_trials(deepcopy=False)
            if t.state.name == "COMPLETE" and TrialRecord.of(t).baseline
        ),
        None,
    )


def best_measured(trials: Iterable[FrozenTrial], direction: StudyDirection | str) -> FrozenTrial | None:
    """The best of single-objective trials by their one measured value: the feasible COMPLETE ones only,
    the lowest-numbered among equals; None when none is. Once configs were re-measured the study's answer
    is the config with the best mean instead (`best_trial`, which falls back to this)."""
    sign = direction_sign(direction)
    candidates = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and is_feasible(t)]
    return max(
        sorted(candidates, key=lambda t: t.number), key=lambda t: sign * cast(float, t.value), default=None
    )


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
    remeasured: bool = False  # measured again on purpose (`remeasure_of`), not proposed twice by chance
    # Each value's resolution, a relative SD (`resolution`): a load search's bracket; empty: none known.
    resolutions: tuple[float, ...] = ()

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


def _config_of(trial: FrozenTrial) -> ConfigKey | str:
    # The sampler's key: a config it does not propose twice is not grouped here as re-measured.
    return "baseline" if TrialRecord.of(trial).baseline else config_key(trial.params)


def measurement_groups(
    optuna_study: optuna.Study, confidence: float | None = None
) -> list[ConfigMeasurements]:
    """Every config the study measured, with all its measurements; the first trial of each names it."""
    if confidence is None:
        settings = StudyRecord.of(optuna_study).remeasure
        confidence = float(settings.get("confidence", DEFAULT_CONFIDENCE))
    return _measurements(optuna_study.get_trials(deepcopy=False), confidence)


def _measurements(trials: Iterable[FrozenTrial], confidence: float) -> list[ConfigMeasurements]:
    groups: dict[ConfigKey | str, list[FrozenTrial]] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        if trial.state.name in ("WAITING", "RUNNING") or not counts(trial):
            continue  # an interrupted launch measured nothing: its retry is the config's measurement
        groups.setdefault(_config_of(trial), []).append(trial)
    out = []
    for members in groups.values():
        good = [t for t in members if t.state.name == "COMPLETE" and t.value is not None and is_feasible(t)]
        # A first trial that failed says the config failed; only failures among measurements that count.
        again = [TrialRecord.of(t).remeasure_of is not None for t in members]
        # A launch stopped at its load search's cutoff measured no value and did not fail (confirm's rounds).
        counted = [
            t
            for t, a in zip(members, again, strict=True)
            if t.state.name == "COMPLETE" or (a and TrialRecord.of(t).load_below is None)
        ]
        bad = [t.number for t in counted if t not in good]
        out.append(
            ConfigMeasurements(
                of=members[0].number,
                baseline=TrialRecord.of(members[0]).baseline,
                params=dict(members[0].params),
                trials=tuple(t.number for t in good),
                values=tuple(float(t.value) for t in good if t.value is not None),
                failed=tuple(bad),
                resolutions=tuple(resolution(t) for t in good),
                confidence=confidence,
                remeasured=any(again),
            )
        )
    return out


def at_no_rate(defaults: ConfigMeasurements | None, maximize: bool) -> bool:
    """Whether every launch of SGLang's defaults measured 0 (a max_load: no rate tried met the SLO): the load
    search's floor, not a draw. A gain in percent of 0 has no value, so the confirmation's rounds ask whether
    the leader meets the SLO in each round where the defaults, launched beside it, measured 0 again (a later
    lease may serve them at a rate: then the rounds' paired differences decide, `confirm.floor_gain`)."""
    return maximize and defaults is not None and defaults.n > 0 and not any(defaults.values)


def resolution(trial: FrozenTrial) -> float:
    """The relative SD a measurement cannot resolve below: a load search's value lies in the bracket it ended
    in (`load_bracket`), anywhere alike for all it knows (a uniform's SD, width / sqrt(12)); 0 for another."""
    bracket, value = TrialRecord.of(trial).load_bracket, trial.value
    if not bracket or not value:
        return 0.0
    return bracket / math.sqrt(12) / abs(float(value))


def groups_by_trial(
    optuna_study: optuna.Study, groups: Sequence[ConfigMeasurements] | None = None
) -> dict[int, ConfigMeasurements]:
    """Each config's measurements under its first trial's number, and also under the number of a launch of
    it that measured nothing (interrupted, node lost), as `of`: a store written before issue 41 named a
    config by such a trial, and its confirmation rounds go on under that name. `groups`: the study's
    `measurement_groups`, where the caller has them."""
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    groups = measurement_groups(optuna_study) if groups is None else groups
    by_number = {g.of: g for g in groups}
    by_config = {_config_of(trials[g.of]): g for g in groups}
    for trial in trials.values():
        if trial.number not in by_number and trial.state.is_finished() and not counts(trial):
            if (group := by_config.get(_config_of(trial))) is not None:
                by_number[trial.number] = dataclasses.replace(group, of=trial.number)
    return by_number


def remeasured_ranking(
    groups: Sequence[ConfigMeasurements], maximize: bool
) -> tuple[list[ConfigMeasurements], list[ConfigMeasurements]] | None:
    """The reliable configs measured more than once, best mean first, and the unreliable ones; None before
    any config other than the baseline was measured again by re-measurement, or when none is reliable.
    (A config a sampler happened to propose twice is not re-measured: its second value is one more draw.)"""
    repeated = [g for g in groups if g.n >= 2 or (g.failed and g.n)]
    if not any(g.remeasured and not g.baseline for g in repeated):
        return None
    reliable = sorted((g for g in repeated if g.reliable), key=lambda g: g.mean, reverse=maximize)
    if not reliable:
        return None
    return reliable, [g for g in repeated if not g.reliable]


def best_trial(optuna_study: optuna.Study, trials: Sequence[FrozenTrial] | None = None) -> FrozenTrial | None:
    """The study's best trial: the one answer of `autotune best` and `status`, the report, compare, the
    ablation and the default sampler's moves. Once a config other than the baseline was measured again by
    re-measurement, the first trial of the reliable config with the best mean (`remeasured_ranking`);
    before, the best single measurement (`best_measured`). None before any feasible COMPLETE trial, and in a
    multi-objective study (its answer is the Pareto front). `trials`: the ones to choose among, by default
    all the study's (the sampler passes those that set parameters: it moves from one)."""
    if len(optuna_study.directions) > 1:
        return None
    trials = optuna_study.get_trials(deepcopy=False) if trials is None else trials
    ranked = remeasured_ranking(_measurements(trials, DEFAULT_CONFIDENCE), maximizes(optuna_study.direction))
    if ranked is not None:
        first = ranked[0][0].of
        return next(t for t in trials if t.number == first)
    return best_measured(trials, optuna_study.direction)
