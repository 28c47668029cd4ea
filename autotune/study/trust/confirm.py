"""The winner confirmed: the study's best configs and SGLang's defaults launched again in interleaved rounds.

The best of many single measurements is biased upwards, so after the search the top configs and the
baseline run again as ordinary study trials, a round at a time in alternating order, until the leader's
paired gain over the defaults is narrow enough or clear of zero, or `max_rounds`. The rules of the rounds
and of their error: docs/design.md, "Confirmation"; the answer built on them is
autotune.study.trust.answer's. Where every launch of the defaults measured 0 (a max_load: they met the SLO
at no rate tried), in the search and in every round, there is no percent gain: the rounds decide once the
leader met the SLO in each of `min_rounds` rounds beside them (`at_no_rate`). A round's launch of the
defaults stops its load search below half the configs' lowest value (`defaults_cutoff`): their value in that
round is the load they missed at, above their own, so the gain the rounds show is at most the true one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.measure.load_search import LoadSearchPlan
from autotune.measure.stats import Gain, MeanCI, mean_ci, paired_gain, t_quantile
from autotune.study.records import STAGE_AFTER_KEY, ConfirmMark, StudyRecord, TrialRecord, record_confirm
from autotune.study.remeasure import enqueue_measurement
from autotune.study.rules import (
    ConfigMeasurements,
    at_no_rate,
    groups_by_trial,
    is_feasible,
    maximizes,
    measurement_groups,
)
from autotune.study.storage import budget_used, counts
from autotune.study.trust.noise import NoiseEstimate, noise_apart_from, noise_estimate
from autotune.study.trust.stopping import load_max_settled

__all__ = [
    "DEFAULTS_CUTOFF_IS",
    "DEFAULTS_CUTOFF_SHARE",
    "Confirmation",
    "confirmation",
    "confirmation_rounds",
    "contenders",
    "defaults_cutoff",
    "defaults_stop_early",
    "floor_gain",
    "look_confidence",
    "met_at_no_rate",
    "pooled_gain",
    "precision_confidence",
    "round_order",
    "stopped_below",
]

# In the CONFIRM_ATTR record: the candidates beyond noise of the leader, or no better than the defaults
LEFT_OUT_KEY = "left_out"
# In the study's CONFIRM_ATTR record: the search's launches paired in time, each a round of
# [config (its first trial), the trial that measured it] pairs, the baseline's first.
SEARCH_ROUNDS_KEY = "search_rounds"
# In the study's CONFIRM_ATTR record: the defaults' launches, where every one measured 0 (see `at_no_rate`).
DEFAULTS_AT_ZERO_KEY = "defaults_at_zero"
# In the study's CONFIRM_ATTR record: the defaults' launches, where each met the SLO at the load search's
# `max` (stopping.load_max_settled): no round can show a config that measures more, so none runs.
DEFAULTS_AT_MAX_KEY = "defaults_at_max"

T = TypeVar("T")

# A round's launch of SGLang's defaults (a load-search objective's) stops once it missed at or below this
# share of the lowest value its configs measured (`defaults_cutoff`): below half of it, their exact value
# cannot change a verdict, and the slow rates it takes to find cost most of a round (on 4x L40S, defaults
# near 0.1 req/s cost 1537 to 3583 s a launch beside 500-600 s for the leader's).
DEFAULTS_CUTOFF_SHARE = 0.5
DEFAULTS_CUTOFF_IS = "half the lowest value of the configs in its round"  # as load_stopped_by says it

# The pairs' own spread pools with the study's noise only while their variance is within this quantile of F
# (their degrees of freedom against the noise estimate's) of what that noise predicts: a leader noisier than
# the configs the noise was measured on keeps its own interval.
POOL_CHECK = 0.90


def round_order(index: int, configs: Sequence[T]) -> tuple[T, ...]:
    """The order of round `index`: as given in rounds 0, 3, 4, 7, ..., reversed in rounds 1, 2, 5, 6, ...
    (ABBA for two configs: each position's drift falls on every config alike)."""
    return tuple(configs) if index % 4 in (0, 3) else tuple(reversed(configs))


@dataclass(frozen=True)
class Confirmation:
    """The confirmation rounds so far: each config's value per complete round, and the leader's gain."""

    baseline: int  # the baseline's first trial
    configs: tuple[int, ...]  # the candidates' first trials
    rounds: dict[int, dict[int, float | None]]  # round -> config -> value (None: failed or broke a limit)
    queued: int  # rounds queued so far
    leader: int | None
    gain: Gain | None  # the leader's paired gain over the baseline
    pairs: int  # the rounds where both the leader and the baseline were measured
    # The leader's gain at `precision_confidence`: whether the rounds know it well enough to stop.
    precision: Gain | None = None
    searched: int = 0  # rounds made of the search's launches paired in time (`search_rounds`), before these
    # The defaults' launches, where every one measured 0 in the search and in the rounds (`at_no_rate`).
    defaults_at_zero: tuple[int, ...] = ()
    # The defaults' launches, each at the load search's `max` (DEFAULTS_AT_MAX_KEY): decided with no round.
    defaults_at_max: tuple[int, ...] = ()
    # The degrees of freedom of the leader's interval pooled with the study's noise (`pooled_gain`); None:
    # its rounds' own spread alone.
    pooled_dof: int | None = None
    # The defaults' launches in the rounds that stopped at their cutoff (`defaults_cutoff`): their value in
    # `rounds` is the load they missed at, which their own lies below.
    defaults_below: tuple[int, ...] = ()


def look_confidence(settings: Mapping[str, Any], candidates: int) -> float:
    """The confidence of the leader's interval at each look: the study's `confidence` split (Bonferroni)
    over the `candidates` (the leader is the best of them) and over the looks, one after each round from
    `min_rounds` to `max_rounds` (rounds that stop at the first interval clear of zero otherwise claim a
    gain that is not there more often with every look: 2 of 10 flat L40S studies at 97.5% per look)."""
    looks = int(settings["max_rounds"]) - int(settings["min_rounds"]) + 1
    return 1 - (1 - float(settings.get("confidence", 0.95))) / (max(candidates, 1) * max(looks, 1))


def precision_confidence(settings: Mapping[str, Any], candidates: int) -> float:
    """The confidence of the interval whose width stops the rounds: the study's `confidence` split over the
    `candidates` alone. It claims no gain (the verdict is `look_confidence`'s), so the looks need no share:
    rounds that stop sooner give a false gain fewer looks, not more."""
    return 1 - (1 - float(settings.get("confidence", 0.95))) / max(candidates, 1)


def _settings(optuna_study: optuna.Study) -> Mapping[str, Any] | None:
    return StudyRecord.of(optuna_study).confirm


def round_cutoff(configs: Sequence[ConfigMeasurements]) -> float | None:
    """Where the defaults' launch in a round beside `configs` stops its load search: DEFAULTS_CUTOFF_SHARE
    of the lowest value they measured; None where one measured nothing above 0."""
    low = min((v for g in configs for v in g.values), default=0.0)
    return DEFAULTS_CUTOFF_SHARE * low if low > 0 else None


def _stops_below(study: Study) -> bool:
    """A load-search objective whose launches stop below their cutoff (`stop_below_best`)."""
    search = study.objective.load_search
    return search is not None and search.stop_below_best


def defaults_cutoff(study: Study, optuna_study: optuna.Study) -> float | None:
    """The cutoff of the defaults' launches in the confirmation's rounds (`round_cutoff` of its configs),
    where `_stops_below`; None otherwise, or before the confirmation."""
    settings = _settings(optuna_study)
    if not _stops_below(study) or settings is None:
        return None
    groups = groups_by_trial(optuna_study)
    return round_cutoff([groups[int(c)] for c in settings["configs"] if int(c) in groups])


def defaults_stop_early(
    study: Study, defaults: ConfigMeasurements, configs: Sequence[ConfigMeasurements]
) -> bool:
    """Whether the defaults' launch in a round beside `configs` will stop at its cutoff: every value they
    measured lies below it (how a node-hour budget prices that launch)."""
    search = study.objective.load_search
    cutoff = round_cutoff(configs) if _stops_below(study) else None
    if search is None or cutoff is None or cutoff < LoadSearchPlan(**search.model_dump()).floor:
        return False  # a cutoff under the slowest rate tried: the search runs down to it as ever
    return max(defaults.values, default=0.0) < cutoff


def pooled_gain(
    reference: Sequence[float],
    candidate: Sequence[float],
    noise: NoiseEstimate | None,
    *,
    minimize: bool,
    confidence: float = 0.95,
) -> tuple[Gain, int | None]:
    """The candidate's paired gain over the reference (`paired_gain`), the SD of a round's difference pooled
    from the pairs' own spread (n - 1 degrees of freedom) and the one the study's `noise` predicts for it
    (sqrt(2) times its relative SD, times the candidate's value over the reference's; its own degrees of
    freedom), the interval's t quantile on their sum; with those degrees of freedom. The pairs' own interval
    and None without a noise estimate, or when their spread is beyond what the noise predicts (POOL_CHECK):
    the leader's noise is not the study's. `noise` must come from launches other than these pairs'
    (`noise_apart_from`). One pair has an interval only from the noise."""
    own = paired_gain(reference, candidate, minimize=minimize, confidence=confidence)
    n = len(reference)
    if noise is None or noise.dof < 1 or not all(reference):
        return own, None
    # The F quantile, from scipy.special: it imports in a fraction of scipy.stats' time.
    from scipy.special import fdtri

    ratio = math.fsum(c / r for r, c in zip(reference, candidate, strict=True)) / n
    predicted = 100 * math.sqrt(2) * noise.relative_sd * abs(ratio)  # a round's difference, in percent
    if n >= 2 and own.percent.std**2 > predicted**2 * float(fdtri(n - 1, noise.dof, POOL_CHECK)):
        return own, None
    dof = n - 1 + noise.dof
    quantile = t_quantile(confidence, dof)

    def pool(measured: MeanCI, expected: float) -> MeanCI:
        own_squares = (n - 1) * measured.std**2 if n >= 2 else 0.0
        sd = math.sqrt((own_squares + noise.dof * expected**2) / dof)
        return MeanCI(measured.mean, quantile * sd / math.sqrt(n), n, sd, confidence)

    # The same in the objective's unit: the noise of each side's own mean value.
    means = (math.fsum(reference) / n, math.fsum(candidate) / n)
    absolute = noise.relative_sd * math.hypot(*means)
    return Gain(pool(own.percent, predicted), pool(own.difference, absolute)), dof


def _paired_rounds(
    rounds: dict[int, dict[int, float | None]], base: int, config: int, floor: bool = False
) -> list[int]:
    # A gain is in percent of the defaults' value: a round where they measured 0 (a max_load: no rate tried
    # met the SLO) has none to give, and is left out rather than divided by; at the floor (`floor_gain`)
    # it is a difference like any other.
    return [
        index
        for index, values in sorted(rounds.items())
        if (values.get(base) if not floor else values.get(base) is not None)
        and values.get(config) is not None
    ]


def floor_gain(
    reference: Sequence[float], candidate: Sequence[float], confidence: float, floor_sd: float = 0.0
) -> Gain:
    """The candidate's max_load gain over defaults that measured 0 in the search and above it in some round
    (the load search's floor, where a later lease served them at a slow rate): the rounds' paired
    differences in the metric's unit (req/s, or requests in flight), every round's, shown in percent of the
    defaults' mean over them. In percent of
    each round's own value, the rounds at 0 had none to give and the rest divided by a few hundredths of a
    req/s: on 4x L40S a leader at 0.875 req/s in each of 6 rounds beside defaults at 0, 0.078 and 0.0625
    was "no gain" (+1163%, 99.5% CI -16706% to +19032% from 2 rounds). The differences spread no less than
    `floor_sd` (their load searches' resolution: `_resolution_sd`)."""
    difference = mean_ci([c - r for r, c in zip(reference, candidate, strict=True)], confidence)
    if difference.std < floor_sd:
        quantile = t_quantile(confidence, difference.n - 1)
        difference = MeanCI(
            difference.mean, quantile * floor_sd / math.sqrt(difference.n), difference.n, floor_sd, confidence
        )
    scale = 100.0 / (math.fsum(reference) / len(reference))
    percent = MeanCI(
        difference.mean * scale,
        difference.half_width * scale,
        difference.n,
        difference.std * scale,
        confidence,
    )
    return Gain(percent, difference)


def _pooled(
    rounds: dict[int, dict[int, float | None]],
    base: int,
    config: int,
    maximize: bool,
    confidence: float,
    noise: NoiseEstimate | None,
    floor: Mapping[int, Sequence[float]] | None = None,
) -> tuple[Gain | None, int, int | None]:
    """The config's gain over the defaults in the rounds, their count and the pooled degrees of freedom
    (`pooled_gain`); no gain before two rounds, or one with the study's `noise` to pool with. `floor`: the
    defaults measured 0 in the search (`floor_gain`, not pooled: the study's noise is relative), with each
    config's load-search resolutions (`_resolution_sd`)."""
    paired = _paired_rounds(rounds, base, config, floor is not None)
    if not paired:
        return None, 0, None
    references = [float(rounds[i][base] or 0.0) for i in paired]
    candidates = [float(rounds[i][config] or 0.0) for i in paired]
    if floor is not None and maximize:  # at least two rounds, and the defaults above 0 in one of them
        spread = _resolution_sd(rounds, base, config, floor)
        return (
            floor_gain(references, candidates, confidence, spread)
            if len(paired) >= 2 and any(references)
            else None,
            len(paired),
            None,
        )
    gain, dof = pooled_gain(references, candidates, noise, minimize=not maximize, confidence=confidence)
    if len(paired) < 2 and dof is None:
        return None, len(paired), None
    return gain, len(paired), dof


def confirmation(optuna_study: optuna.Study) -> Confirmation | None:
    """The study's confirmation rounds as measured so far; None before confirmation started."""
    settings = _settings(optuna_study)
    if settings is None or len(optuna_study.directions) != 1:
        return None
    base, configs = int(settings["baseline"]), tuple(int(c) for c in settings["configs"])
    rounds: dict[int, dict[int, float | None]] = {}
    launched: dict[int, dict[int, int]] = {}
    # The defaults' launches that stopped at their cutoff, and the highest load they missed at.
    below: list[int] = []
    bound = 0.0
    since = int(settings.get("since", -1))
    for trial in optuna_study.get_trials(deepcopy=False):
        record = TrialRecord.of(trial)
        mark, of = record.confirm, record.remeasure_of
        if mark is None or of is None or trial.number <= since:
            continue
        if not trial.state.is_finished() or not counts(trial):
            continue
        rounds.setdefault(mark["round"], {})[of] = _round_value(trial)
        launched.setdefault(mark["round"], {})[of] = trial.number
        if of == base and stopped_below(trial):
            below.append(trial.number)
            bound = max(bound, record.load_below or 0.0)
    searched = settings.get(SEARCH_ROUNDS_KEY) or []
    if searched:
        values = {t.number: t.value for t in optuna_study.get_trials(deepcopy=False)}
        for index, pairs_in_time in enumerate(searched):  # rounds -len .. -1: before the confirmation's
            rounds[index - len(searched)] = {int(of): values.get(int(n)) for of, n in pairs_in_time}
            launched[index - len(searched)] = {int(of): int(n) for of, n in pairs_in_time}
    if below:
        _count_at_least(rounds, base, bound)
    queued = int(settings.get("queued", 0))
    at_max = tuple(int(n) for n in settings.get(DEFAULTS_AT_MAX_KEY) or ())
    if at_max:
        return Confirmation(base, configs, rounds, queued, None, None, 0, defaults_at_max=at_max)
    maximize = maximizes(optuna_study.direction)
    zero = tuple(int(n) for n in settings.get(DEFAULTS_AT_ZERO_KEY) or ())
    if zero and not any(values.get(base) for values in rounds.values()):
        # No percent gain over 0: the leader is the best that met the SLO in every round beside them.
        leader, met = _met_in_every_round(rounds, base, configs)
        at_zero = (*zero, *(n for n in _round_launches(optuna_study, base, since)))
        return Confirmation(base, configs, rounds, queued, leader, None, met, defaults_at_zero=at_zero)
    confidence = look_confidence(settings, len(configs))
    # Stores from before `pool_noise` keep the rule their rounds began under.
    pool = bool(settings.get("pool_noise", False))
    measured = measurement_groups(optuna_study) if pool or zero else None
    groups = measured if pool else None

    def noise_of(config: int) -> NoiseEstimate | None:
        """The study's noise apart from the launches of the config's pairs with the defaults."""
        if groups is None:
            return None
        paired = _paired_rounds(rounds, base, config)
        left_out = {launched[i][of] for i in paired for of in (base, config)}
        return noise_apart_from(groups, left_out, maximize, keep=base)  # the defaults: one side of each pair

    best: tuple[int | None, Gain | None, int] = (None, None, 0)
    pooled_dof = None
    # The defaults at 0 in the search, above it in a round: `floor_gain`, on the rounds' resolution.
    floor = {of: g.resolutions for of, g in groups_by_trial(optuna_study, measured).items()} if zero else None
    for config in configs:
        gain, pairs, dof = _pooled(rounds, base, config, maximize, confidence, noise_of(config), floor)
        if gain is not None and (best[1] is None or gain.pct > best[1].pct):
            best, pooled_dof = (config, gain, pairs), dof
    precision = None
    if best[0] is not None:
        at = precision_confidence(settings, len(configs))
        precision, _, _ = _pooled(rounds, base, best[0], maximize, at, noise_of(best[0]), floor)
    return Confirmation(
        base,
        configs,
        rounds,
        queued,
        *best,
        precision=precision,
        searched=len(searched),
        pooled_dof=pooled_dof,
        defaults_below=tuple(below),
    )


def _count_at_least(rounds: dict[int, dict[int, float | None]], base: int, bound: float) -> None:
    """Count the defaults at no less than `bound` (the highest load a launch of theirs that stopped at its
    cutoff missed at) in every round, the ones that measured them whole too: every round's difference is
    then one of the same kind, and at most the true one. Mixed with a round of the search that measured
    them at 0.094 req/s beside a leader at 0.81, five rounds at their bound of 0.41 spread the gain in percent
    from +100% to +768%: "no gain", -320% to +743%, on 4x L40S."""
    for values in rounds.values():
        value = values.get(base)
        if value is not None:
            values[base] = max(value, bound)


def _resolution_sd(
    rounds: dict[int, dict[int, float | None]],
    base: int,
    config: int,
    resolutions: Mapping[int, Sequence[float]],
) -> float:
    """The SD a round's difference of `config` and the defaults cannot resolve below, in the metric's unit:
    each side's load-search resolution (rules.resolution, as their launches measured it) at its mean in the
    rounds, added in quadrature."""
    squares = 0.0
    for of in (base, config):
        own = resolutions.get(of) or ()
        values = [v for r in rounds.values() if (v := r.get(of)) is not None]
        if own and values:
            relative = math.fsum(x**2 for x in own) / len(own)
            squares += relative * (math.fsum(values) / len(values)) ** 2
    return math.sqrt(squares)


def stopped_below(trial: FrozenTrial) -> bool:
    """A launch whose load search stopped at its cutoff (PRUNED, with the load it missed at)."""
    return trial.state == TrialState.PRUNED and TrialRecord.of(trial).load_below is not None


def _round_value(trial: FrozenTrial) -> float | None:
    """A round launch's value: its measurement; the load it missed at where it stopped at its cutoff (its
    own lies below: `defaults_cutoff`); None where it failed or broke a limit."""
    if stopped_below(trial):
        return TrialRecord.of(trial).load_below
    good = trial.state == TrialState.COMPLETE and trial.value is not None and is_feasible(trial)
    return float(trial.value) if good and trial.value is not None else None


def met_at_no_rate(state: Confirmation, settings: Mapping[str, Any]) -> bool:
    """Every launch of the defaults measured 0 and the leader met the SLO in each of the first `min_rounds`
    rounds beside them: decided, with no percent gain (`at_no_rate`)."""
    return (
        bool(state.defaults_at_zero)
        and state.leader is not None
        and state.pairs >= int(settings["min_rounds"])
    )


def _round_launches(optuna_study: optuna.Study, config: int, since: int) -> list[int]:
    """The confirmation rounds' finished launches of `config` (the trials after `since`)."""
    return [
        t.number
        for t in optuna_study.get_trials(deepcopy=False)
        if t.number > since
        and t.state.is_finished()
        and TrialRecord.of(t).remeasure_of == config
        and TrialRecord.of(t).confirm is not None
    ]


def _met_in_every_round(
    rounds: Mapping[int, Mapping[int, float | None]], base: int, configs: Sequence[int]
) -> tuple[int | None, int]:
    """The candidate with the best mean among those above 0 in every round where the defaults measured 0,
    and its rounds; (None, 0) when none was (or no such round finished)."""
    measured = [values for _, values in sorted(rounds.items()) if values.get(base) == 0]
    met = {
        config: [v for values in measured if (v := values.get(config)) is not None and v > 0]
        for config in configs
    }
    kept = {c: v for c, v in met.items() if v and len(v) == sum(c in values for values in measured)}
    if not kept:
        return None, 0
    leader = max(kept, key=lambda c: sum(kept[c]) / len(kept[c]))
    return leader, len(kept[leader])


def _decided(state: Confirmation, settings: Mapping[str, Any]) -> bool:
    """The leader's interval is narrow enough (`precision_confidence`) or clear of zero (`look_confidence`),
    after the first rounds (one round has an interval only pooled with the study's noise: `pooled_gain`);
    or rounds ran out. With the defaults at no rate: the leader met the SLO in each of the first rounds."""
    if state.queued + state.searched >= int(settings["max_rounds"]) or state.defaults_at_max:
        return True
    if state.defaults_at_zero:
        return met_at_no_rate(state, settings)
    gain = state.gain
    if gain is None or state.pairs < int(settings["min_rounds"]):
        return False
    narrow = state.precision if state.precision is not None else gain
    return narrow.percent.half_width < float(settings["target_pct"]) or gain.verdict != "no gain"


def contenders(
    top: Sequence[ConfigMeasurements],
    noise: NoiseEstimate | None,
    maximize: bool,
    confidence: float,
    baseline_mean: float | None = None,
) -> tuple[list[ConfigMeasurements], list[ConfigMeasurements]]:
    """The candidates worth confirming (`top`, best mean first): the leader, and each other whose mean lies
    within the noise band (`NoiseEstimate.band` at `confidence`) of the leader's (every one with the noise
    unknown) and beyond the defaults' (`baseline_mean`: a runner-up the search measured no better than
    SGLang's defaults is no gain worth a launch a round); and those left out."""
    if not top:
        return [], []
    sign = 1.0 if maximize else -1.0
    leader = top[0]
    floor = -math.inf if noise is None else sign * leader.mean - noise.band(confidence) * abs(leader.mean)
    above = -math.inf if baseline_mean is None else sign * baseline_mean

    def kept(g: ConfigMeasurements) -> bool:
        return sign * g.mean >= floor and sign * g.mean > above

    return [leader, *(g for g in top[1:] if kept(g))], [g for g in top[1:] if not kept(g)]


def search_rounds(
    optuna_study: optuna.Study, baseline: ConfigMeasurements, candidates: Sequence[ConfigMeasurements]
) -> list[list[tuple[int, int]]]:
    """The search's launches that make a round (paired in time): each measurement of the baseline with
    the candidates' measurements launched right before or after it on the same node, as
    [(config, trial)] with the baseline's first; a baseline launch with no such neighbour makes none, nor
    one with the NCCL stage's all-reduces between it and its neighbour (the baseline runs before them)."""
    config_of = {n: g.of for g in candidates for n in g.trials}
    stage = StudyRecord.of(optuna_study).nccl_stage or {}
    before_stage = set(stage.get(STAGE_AFTER_KEY) or ())
    by_node: dict[str, list[int]] = {}
    for trial in sorted(optuna_study.get_trials(deepcopy=False), key=lambda t: t.number):
        node = TrialRecord.of(trial).node
        if trial.state.is_finished() and counts(trial) and node is not None:
            by_node.setdefault(node, []).append(trial.number)
    rounds: list[list[tuple[int, int]]] = []
    used: set[int] = set()
    for launches in by_node.values():
        for i, number in enumerate(launches):
            if number not in baseline.trials:
                continue
            near = [
                n
                for n in launches[max(i - 1, 0) : i + 2]
                if n in config_of and n not in used and (n in before_stage) == (number in before_stage)
            ]
            paired = {config_of[n]: n for n in near}  # a config on both sides: its later launch
            used.update(paired.values())  # a launch is one draw: it pairs once
            if paired:
                rounds.append([(baseline.of, number), *sorted(paired.items())])
    return sorted(rounds, key=lambda paired: paired[0][1])  # in time, over the nodes


def _start(
    study: Study, optuna_study: optuna.Study, pays: Callable[[Sequence[int]], bool] | None = None
) -> Mapping[str, Any] | None:
    """Choose the configs to confirm (the `top` by mean of their measurements, feasible and never failed)
    and the baseline, and remember them in the study; None when there is nothing to confirm. A runner-up
    is left out where the node hours left do not pay for its rounds (`pays(configs)`, the baseline's
    first): the leader's rounds come first."""
    settings = study.file.trust.confirm
    groups = [g for g in measurement_groups(optuna_study, settings.confidence) if g.n and not g.failed]
    base = next((g for g in groups if g.baseline), None)
    if base is None:
        return None
    maximize = maximizes(optuna_study.direction)
    sign = 1.0 if maximize else -1.0
    top = sorted((g for g in groups if not g.baseline), key=lambda g: -sign * g.mean)[: settings.top]
    at_max = load_max_settled(study, optuna_study) is not None
    if not top and not at_max:
        return None
    top, left_out = contenders(top, noise_estimate(optuna_study), maximize, settings.confidence, base.mean)
    while pays is not None and len(top) > 1 and not pays([base.of, *(g.of for g in top)]):
        left_out.insert(0, top.pop())
    zero = settings.decide_at_no_rate and at_no_rate(base, maximize)
    since = max((t.number for t in optuna_study.get_trials(deepcopy=False)), default=-1)
    paired_in_time = search_rounds(optuna_study, base, top) if settings.pair_search_launches else []
    record = {
        **settings.model_dump(),
        "baseline": base.of,
        "configs": [g.of for g in top],
        LEFT_OUT_KEY: [g.of for g in left_out],
        # At most min_rounds - 1, the latest: the confirmation's own launches always have a say, as the
        # candidates were chosen by the search's (they drew high).
        SEARCH_ROUNDS_KEY: [
            [list(pair) for pair in paired]  # as JSON stores it
            for paired in paired_in_time[max(len(paired_in_time) - (settings.min_rounds - 1), 0) :]
            if not zero  # at 0 the rounds' own launches decide
        ],
        DEFAULTS_AT_ZERO_KEY: list(base.trials) if zero else [],
        DEFAULTS_AT_MAX_KEY: list(base.trials) if at_max else [],
        "queued": 0,
        "since": since,  # its rounds are the trials after this one
    }
    record_confirm(optuna_study, record)
    return record


def _searched_since(optuna_study: optuna.Study, since: int) -> bool:
    """A trial the search launched after the confirmation started (a resume with a larger budget)."""
    return any(
        t.number > since and not TrialRecord.of(t).deliberate and t.state.is_finished() and counts(t)
        for t in optuna_study.get_trials(deepcopy=False)
    )


def confirmation_rounds(
    study: Study,
    optuna_study: optuna.Study,
    affordable: Callable[[int], bool] | None = None,
    pays: Callable[[Sequence[int]], bool] | None = None,
) -> Iterator[int]:
    """Queue the confirmation's rounds one at a time; yields the budget the study loop runs to for each
    (every trial of the round: budget used plus the queued). A resumed study continues its rounds.
    `affordable(launches)` says whether the node hours left pay for a round; the rounds end when not;
    `pays(configs)`, whether they pay for every round of these configs (a runner-up's are left out)."""
    if not study.file.trust.confirm.enabled or len(optuna_study.directions) != 1:
        return
    settings = _settings(optuna_study)
    if settings is None or _searched_since(optuna_study, int(settings.get("since", -1))):
        settings = _start(study, optuna_study, pays)  # first, or again after the search found more configs
    if settings is None:
        return
    groups = groups_by_trial(optuna_study)
    while True:
        state = confirmation(optuna_study)
        assert state is not None  # started above
        waiting = len(optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        if waiting:  # a round a Ctrl-C cut short: its trials run again first
            yield budget_used(optuna_study) + waiting
            continue
        if _decided(state, settings):
            return
        if affordable is not None and not affordable(len(state.configs) + 1):
            return
        index = state.queued
        for position, of in enumerate(round_order(index, (state.baseline, *state.configs))):
            enqueue_measurement(optuna_study, groups[of], confirm=ConfirmMark(round=index, position=position))
        settings = {**settings, "queued": index + 1}
        record_confirm(optuna_study, settings)
        yield budget_used(optuna_study) + len(state.configs) + 1
