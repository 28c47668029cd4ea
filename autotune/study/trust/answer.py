"""The study's answer: the config to use, its gain over SGLang's defaults, and how far that gain is to be
trusted (its interval, the noise, the trials it rests on, the NCCL values the stage held).

`study_answer` reads it from the Optuna study once; `best`, `run`, `status`, `report`, the MLflow parent run
and the notebook render this one record, so no two of them can show different figures for one study.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.measure.load_search import BUDGET_FLOOR_SAID
from autotune.measure.stats import Gain
from autotune.study.records import StudyRecord, TrialRecord
from autotune.study.remeasure import RemeasuredAnswer, remeasured_answer
from autotune.study.rules import (
    ConfigMeasurements,
    baseline_trial,
    best_trial,
    gain_pct,
    is_feasible,
)
from autotune.study.storage import counts
from autotune.study.trust.confirm import (
    DEFAULTS_CUTOFF_SHARE,
    SEARCH_ROUNDS_KEY,
    Confirmation,
    confirmation,
    met_at_no_rate,
    stopped_below,
)
from autotune.study.trust.node_budget import STEP_SHARE, ran_out_text
from autotune.study.trust.noise import NoiseEstimate, noise_estimate
from autotune.study.trust.screening import screened_lines
from autotune.study.trust.stopping import stopped_early

__all__ = ["NcclStageValues", "StudyAnswer", "Verdict", "remeasured_record", "study_answer"]

# confirmed: the leader beat the defaults in interleaved rounds; no gain: the rounds say it did not (use the
# defaults); unconfirmed: the best measurement(s) of the search, never measured side by side with the
# defaults; under way: confirmation began and has not yet measured two rounds of a candidate.
Verdict = Literal["confirmed", "no gain", "unconfirmed", "under way"]


@dataclass(frozen=True)
class NcclStageValues:
    """What the NCCL all-reduce stage held in every server trial (autotune.study.stages.StageResult)."""

    held: Mapping[str, Any]  # knob -> value; None: held at NCCL's default
    baseline_us: float | None
    best_us: float | None
    trials: int

    def text(self) -> str:
        changed = ", ".join(f"{n}={v}" for n, v in self.held.items() if v is not None)
        return f"NCCL stage held {changed}" if changed else "NCCL stage held NCCL's defaults"


@dataclass(frozen=True)
class StudyAnswer:
    """The answer of a single-objective study: which config to use (`trial`, the baseline's when no
    candidate beats SGLang's defaults), its value and gain over the defaults with their intervals, the noise
    estimate, and the trials these figures rest on. `text` is the sentence every view leads with."""

    verdict: Verdict
    trial: int  # the config to use (its first trial)
    leader: int  # the best candidate, the one the gain is of
    value: (
        float | None
    )  # the config to use's value: its rounds' mean, its re-measured mean, or one measurement
    value_interval: tuple[float, float] | None
    baseline: int | None  # the baseline's first trial
    baseline_value: float | None  # measured as `value` was: in the same rounds, re-measured, or once
    gain_pct: float | None  # the leader's gain over the defaults, in percent (positive: better)
    gain_interval_pct: tuple[float, float] | None
    confidence: float | None  # of both intervals
    within_noise: bool | None  # an unconfirmed gain inside the noise band (or a re-measured one reaching 0)
    rounds: int  # the confirmation rounds its gain rests on (0 without confirmation)
    trials: tuple[int, ...]  # the trials `value`, `baseline_value` and the gain were computed from
    noise: NoiseEstimate | None
    nccl: NcclStageValues | None
    stopped: str | None  # why the search stopped early
    screened: tuple[str, ...]  # why screening held each knob it held
    text: str
    remeasured: RemeasuredAnswer | None = field(default=None, compare=False)  # the ranking behind `value`
    # Why an answer is unconfirmed when it is not the search's own: "budget ran out" (study.node_budget).
    reason: str | None = None
    # `value` and `baseline_value` are the means of confirmation rounds (decided or not: a budget cut them).
    in_rounds: bool = False
    # How `value` was measured where neither rounds nor a re-measurement say it (`value_how`).
    measured: str | None = None
    # `baseline_value` is at most what it says: some of its rounds' launches stopped at their cutoff and
    # gave the load they missed at (confirm.defaults_cutoff).
    baseline_at_most: bool = False

    @property
    def value_how(self) -> str:
        """How `value` was measured, as the views say it after the value."""
        if self.measured is not None:
            return self.measured
        if self.in_rounds:
            return "the mean of its confirmation rounds"
        if self.remeasured is not None:
            return f"the mean of its {self.remeasured.best.n} launches"
        return "its best single measurement"

    @property
    def confirmed(self) -> bool:
        """Measured side by side with the defaults in rounds (`best --json`'s `confirmed`): with or
        without a gain; or the defaults met the SLO at the load search's max, which no config can pass."""
        return self.verdict in ("confirmed", "no gain")

    @property
    def beats_defaults(self) -> bool | None:
        """Whether the rounds say the leader beats the defaults; None while unconfirmed."""
        return None if not self.confirmed else self.verdict == "confirmed"

    def record(self) -> dict[str, Any]:
        """A JSON-ready record (`best --json`, `status --json`, benchmarks)."""
        return {
            "verdict": self.verdict,
            "confirmed": self.confirmed,
            "trial": self.trial,
            "leader": self.leader,
            "beats_defaults": self.beats_defaults,
            "value": self.value,
            "value_interval": list(self.value_interval) if self.value_interval else None,
            "baseline_value": self.baseline_value,
            "baseline_at_most": self.baseline_at_most,
            "gain_pct": self.gain_pct,
            "gain_interval_pct": list(self.gain_interval_pct) if self.gain_interval_pct else None,
            "confidence": self.confidence,
            "within_noise": self.within_noise,
            "rounds": self.rounds,
            "trials": list(self.trials),
            "noise": self.noise.record() if self.noise is not None else None,
            "nccl_stage": dict(self.nccl.held) if self.nccl is not None else None,
            "text": self.text,
            "reason": self.reason,
        }


def study_answer(optuna_study: optuna.Study) -> StudyAnswer | None:
    """The study's answer: confirmed in rounds (or not beaten), else the re-measured best mean, else the
    best single measurement. None for a multi-objective study (its answer is the Pareto front) or before
    any feasible trial completed. Rounds the node-hour budget cut short make it unconfirmed, saying so."""
    answer = _budget_floor(optuna_study, _answer(optuna_study))
    said = ran_out_text(optuna_study)
    # The hours ran out only before rounds that had not decided (trust.confirm): a "no gain" from them is
    # an interval still across zero and wider than the target, which claims nothing.
    if answer is None or said is None:
        return answer
    # The rounds' own "under way: `autotune resume` finishes it" would promise what the hours left cannot.
    best = re.sub(r"; confirmation under way \([^)]*\): [^;]*", "", answer.text.removeprefix("unconfirmed: "))
    ahead = _ahead_in_every_round(optuna_study, answer, said)
    if ahead is not None:
        return ahead
    text = f"{said}; the best so far: {best}"
    return replace(answer, verdict="unconfirmed", reason="budget ran out", text=text)


def _budget_floor(optuna_study: optuna.Study, answer: StudyAnswer | None) -> StudyAnswer | None:
    """An answer of max_load 0 where the node-hour budget kept load searches from the slower rates
    (load_search.BUDGET_FLOOR_SAID) says so: more hours would measure them."""
    if answer is None or answer.value != 0:
        return answer
    floored = any(
        (TrialRecord.of(t).load_stopped_by or "").endswith(BUDGET_FLOOR_SAID)
        for t in optuna_study.get_trials(deepcopy=False)
    )
    if not floored:
        return answer
    note = (
        "; under this node-hour budget no load search went slower than the rate at which a step takes "
        f"{STEP_SHARE:.0%} of the hours left (`autotune status` says where each stopped): more hours reach "
        "slower rates"
    )
    return replace(answer, text=answer.text + note)


def _ahead_in_every_round(optuna_study: optuna.Study, answer: StudyAnswer, said: str) -> StudyAnswer | None:
    """Rounds the budget cut short before they decided, whose leader beat SGLang's defaults in every one by
    more than the noise band (two runs of one config stay within it): the leader is the config to use,
    unconfirmed. Its interval, from a round or two whose spread the study's noise does not explain (a
    machine change inside a round), is too wide to claim a gain; the defaults, which lost every round by
    more than the noise, would be the worse bet (`said`: how the budget ran out). None where that does not
    hold."""
    state, noise = confirmation(optuna_study), answer.noise
    if answer.verdict != "no gain" or state is None or state.leader is None or state.gain is None:
        return None
    if noise is None:  # no band to be ahead of
        return None
    leader, base, band = state.leader, state.baseline, 100 * noise.band()
    gains = [
        pct
        for values in state.rounds.values()
        if (pct := gain_pct(values.get(leader), values.get(base), optuna_study.direction)) is not None
    ]
    if not gains or min(gains) <= band:
        return None
    gain = state.gain
    shown = f"{gain.confidence:.1%} CI {gain.low_pct:+.1f}% to {gain.high_pct:+.1f}%"
    text = (
        f"{said}; the best so far: trial {leader}'s config, ahead of SGLang's defaults by {min(gains):+.1f}% "
        f"to {max(gains):+.1f}% in each of its {len(gains)} round{'s' if len(gains) != 1 else ''}, more than "
        f"two runs of one config differ ({band:.2f}%), but not confirmed ({gain.pct:+.1f}%, {shown}); "
        f"{_noise_text(noise)}"
    )
    return replace(
        answer,
        verdict="unconfirmed",
        reason="budget ran out",
        trial=leader,
        value=_rounds_mean(state, leader),
        text=text,
    )


def _rounds_mean(state: Confirmation, config: int, beside: int | None = None) -> float | None:
    """The mean of `config`'s values in the confirmation's rounds (those that measured `beside` too: the
    defaults beside the answer, not in a round of the runner-up alone), None where none measured."""
    values = [
        value
        for v in state.rounds.values()
        if (value := v.get(config)) is not None and (beside is None or v.get(beside) is not None)
    ]
    return sum(values) / len(values) if values else None


def _answer(optuna_study: optuna.Study) -> StudyAnswer | None:
    if len(optuna_study.directions) != 1:
        return None
    noise = noise_estimate(optuna_study)
    context: dict[str, Any] = {
        "noise": noise,
        "nccl": _nccl_stage(optuna_study),
        "stopped": stopped_early(optuna_study),
        "screened": tuple(screened_lines(optuna_study)),
    }
    state = confirmation(optuna_study)
    if state is not None and state.gain is not None and state.leader is not None:
        return _confirmed(optuna_study, state, context)
    if state is not None and met_at_no_rate(state, StudyRecord.of(optuna_study).confirm or {}):
        return _confirmed_at_no_rate(optuna_study, state, context)
    if state is not None and state.defaults_at_max:
        return _defaults_at_max(optuna_study, state, context)
    # Once confirmation began, its rounds are the answer: the means of its launches would be a second one.
    remeasured = remeasured_answer(optuna_study) if not StudyRecord.of(optuna_study).confirming else None
    if remeasured is not None:
        return _remeasured(optuna_study, remeasured, context)
    return _single(optuna_study, state, context)


def _load_metric(optuna_study: optuna.Study) -> str:
    """The name of a load-search study's metric, as the answers about its load search say it."""
    return optuna_study.metric_names[0] if optuna_study.metric_names else "max_load"


def _noise_text(noise: NoiseEstimate | None) -> str:
    return noise.describe() if noise is not None else "no config measured twice yet: noise unknown"


def _confirmed(optuna_study: optuna.Study, state: Confirmation, context: dict[str, Any]) -> StudyAnswer:
    gain, leader = state.gain, state.leader
    assert gain is not None and leader is not None  # the caller checked
    beats = gain.verdict == "gain"  # the whole interval above zero
    chosen = leader if beats else state.baseline

    # Rounds made of the search's own launches paired in time (study.confirm.search_rounds) are said so.
    searched = f", {state.searched} of them the search's launches paired in time" if state.searched else ""
    # An interval that pooled the rounds' spread with the study's noise (study.confirm.pooled_gain) says so.
    if state.pooled_dof is not None:
        searched += (
            f", {'their' if state.pairs != 1 else 'its'} spread pooled with the study's run-to-run noise "
            f"({state.pooled_dof} degrees of freedom)"
        )
    # The defaults' launches that stopped at their cutoff gave the load they missed at, above their own.
    below = len(state.defaults_below)
    if below:
        metric = _load_metric(optuna_study)
        searched += (
            f"; in {below} of them SGLang's defaults missed your SLO at or below {DEFAULTS_CUTOFF_SHARE:.0%} "
            f"of the lowest {metric} the configs measured and stopped there, and every round counts them at "
            "no less than the load they missed at: the gain is at least this"
        )
    shown = (
        f"{gain.pct:+.1f}%{' or more' if below else ''} ({gain.confidence:.1%} CI {gain.low_pct:+.1f}% to "
        f"{gain.high_pct:+.1f}%, {state.pairs} round{'s' if state.pairs != 1 else ''}{searched})"
    )
    text = (
        f"confirmed: trial {leader}'s config beats SGLang's defaults by {shown}"
        if beats
        else f"no config beat SGLang's defaults beyond run-to-run noise (the best, trial {leader}'s "
        f"config: {shown}); use SGLang's defaults"
    )
    interval = (
        (gain.low_pct, gain.high_pct) if gain.low_pct is not None and gain.high_pct is not None else None
    )
    return StudyAnswer(
        verdict="confirmed" if beats else "no gain",
        trial=chosen,
        leader=leader,
        value=_rounds_mean(state, chosen),
        value_interval=None,
        baseline=state.baseline,
        baseline_value=_rounds_mean(state, state.baseline, chosen),
        baseline_at_most=bool(below),
        gain_pct=gain.pct,
        gain_interval_pct=interval,
        confidence=gain.confidence,
        within_noise=None,
        rounds=state.pairs,
        trials=_round_trials(optuna_study, {leader, state.baseline}, leader),
        text=f"{text}; {_noise_text(context['noise'])}",
        in_rounds=True,
        **context,
    )


def _confirmed_at_no_rate(
    optuna_study: optuna.Study, state: Confirmation, context: dict[str, Any]
) -> StudyAnswer:
    """SGLang's defaults meet the SLO at no rate tried, in the search and in every round; the leader met it in
    each round beside them: no percent gain over 0, the value of each is what the user reads."""
    leader = state.leader
    assert leader is not None  # the caller checked
    values = [v for round_values in state.rounds.values() if (v := round_values.get(leader)) is not None]
    value = sum(values) / len(values)
    metric = _load_metric(optuna_study)
    launches = len(state.defaults_at_zero)
    text = (
        f"confirmed: SGLang's defaults meet your SLO at no rate tried ({metric} 0 in each of their "
        f"{launches} launches, the rounds' included); trial {leader}'s config meets it at {metric} "
        f"{value:.4g} (the mean of {state.pairs} rounds, each above 0 beside the defaults at 0)"
    )
    return StudyAnswer(
        verdict="confirmed",
        trial=leader,
        leader=leader,
        value=value,
        value_interval=None,
        baseline=state.baseline,
        baseline_value=0.0,
        gain_pct=None,
        gain_interval_pct=None,
        confidence=None,
        within_noise=None,
        rounds=state.pairs,
        trials=_round_trials(optuna_study, {leader}),
        text=f"{text}; {_noise_text(context['noise'])}",
        in_rounds=True,
        **context,
    )


def _defaults_at_max(optuna_study: optuna.Study, state: Confirmation, context: dict[str, Any]) -> StudyAnswer:
    """SGLang's defaults met the SLO at the load search's `max` in each of their launches (confirm's
    DEFAULTS_AT_MAX_KEY): no config can measure more, so they are the answer with no round run; the
    launches' spread is that of a ceiling, not the server's noise, so none is quoted."""
    launches = state.defaults_at_max
    value = min(
        v
        for t in optuna_study.get_trials(deepcopy=False)
        if t.number in launches and (v := t.value) is not None
    )
    metric = _load_metric(optuna_study)
    text = (
        f"no config can beat SGLang's defaults: they met your SLO at the highest load the search tries "
        f"({metric} {value:g}, load_search.max, in each of their {len(launches)} launches), and no config "
        "can measure more; use SGLang's defaults, or raise load_search.max to tell configs apart"
    )
    return StudyAnswer(
        verdict="no gain",
        trial=state.baseline,
        leader=state.baseline,
        value=value,
        value_interval=None,
        baseline=state.baseline,
        baseline_value=value,
        gain_pct=None,
        gain_interval_pct=None,
        confidence=None,
        within_noise=None,
        rounds=0,
        trials=tuple(sorted(launches)),
        text=text,
        measured=f"each of its {len(launches)} launches, at load_search.max",
        **context,
    )


def _interval(gain: Gain) -> tuple[float, float] | None:
    low, high = gain.low_pct, gain.high_pct
    return (low, high) if low is not None and high is not None else None


def _round_trials(
    optuna_study: optuna.Study, configs: set[int], leader: int | None = None
) -> tuple[int, ...]:
    """The complete confirmation-round trials of `configs` (the rounds after the confirmation started, and
    the search's launches paired in time that count as rounds: study.trust.confirm.search_rounds; of those,
    only the ones that measured `leader`)."""
    settings = StudyRecord.of(optuna_study).confirm or {}
    since = int(settings.get("since", -1))
    searched = {
        int(n)
        for pairs in settings.get(SEARCH_ROUNDS_KEY) or []
        if leader is None or any(of == leader for of, _ in pairs)
        for of, n in pairs
        if of in configs
    }
    rounds = tuple(
        t.number
        for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED))
        if t.number > since
        and TrialRecord.of(t).confirm is not None
        and TrialRecord.of(t).remeasure_of in configs
        and counts(t)
        and ((t.state == TrialState.COMPLETE and is_feasible(t)) or stopped_below(t))
    )
    return tuple(sorted(searched)) + rounds


def _remeasured(optuna_study: optuna.Study, answer: RemeasuredAnswer, context: dict[str, Any]) -> StudyAnswer:
    best, base, gain = answer.best, answer.baseline, answer.gain
    measured = base is not None and base.n > 0
    single = baseline_trial(optuna_study)
    within = gain.within_noise if gain is not None else None
    shown = (
        f"{gain.pct:+.1f}% ({gain.confidence:.1%} CI {gain.low_pct:+.1f}% to {gain.high_pct:+.1f}%)"
        if gain is not None and gain.low_pct is not None and gain.high_pct is not None
        else f"{gain.pct:+.1f}%"
        if gain is not None
        else "an unknown gain"
    )
    is_base = best.baseline
    said = (
        f"unconfirmed: the best mean is SGLang's defaults' (trial {best.of}, {best.n} launches)"
        if is_base
        else f"unconfirmed: trial {best.of}'s config measured {shown} over SGLang's defaults as the mean of "
        f"{best.n} launches, not confirmed in interleaved rounds"
        + (" (within noise: the interval reaches 0%)" if within else "")
    )
    interval = _interval(gain) if gain is not None else None
    return StudyAnswer(
        verdict="unconfirmed",
        trial=best.of,
        leader=best.of,
        value=best.mean,
        value_interval=best.interval,
        baseline=base.of if base is not None else single.number if single is not None else None,
        baseline_value=base.mean if measured and base is not None else _value(single),
        gain_pct=gain.pct if gain is not None else None,
        gain_interval_pct=interval,
        confidence=best.confidence,
        within_noise=within,
        rounds=0,
        trials=_measured_trials(best, base),
        text=f"{said}; {_noise_text(context['noise'])}",
        remeasured=answer,
        **context,
    )


def _measured_trials(*groups: ConfigMeasurements | None) -> tuple[int, ...]:
    return tuple(sorted({n for g in groups if g is not None for n in g.trials}))


def _value(trial: FrozenTrial | None) -> float | None:
    return None if trial is None else trial.value


def _single(
    optuna_study: optuna.Study, state: Confirmation | None, context: dict[str, Any]
) -> StudyAnswer | None:
    best = best_trial(optuna_study)
    if best is None or best.value is None:
        return None
    base = baseline_trial(optuna_study)
    gain = gain_pct(best.value, _value(base), optuna_study.direction)
    noise: NoiseEstimate | None = context["noise"]
    within = None if noise is None or gain is None else abs(gain) <= 100 * noise.band()
    shown = f"{gain:+.1f}%" if gain is not None else "an unknown gain"
    verdict = (
        " (within the run-to-run noise band: it may be no gain at all)"
        if within
        else " (beyond the noise band, but not confirmed)"
        if within is False
        else ""
    )
    if TrialRecord.of(best).baseline:
        said = f"unconfirmed: the best single measurement is SGLang's defaults (trial {best.number})"
    else:
        said = (
            f"unconfirmed: trial {best.number}'s config measured {shown} over SGLang's defaults once, not "
            f"confirmed in interleaved rounds{verdict}"
        )
    if state is not None:  # confirmation began but has not measured two rounds of a candidate yet
        settings = StudyRecord.of(optuna_study).confirm or {}
        measured = sum(1 for values in state.rounds.values() if values.get(state.baseline) is not None)
        said += (
            f"; confirmation under way ({measured} of at least {settings.get('min_rounds', 2)} rounds "
            f"measured): `autotune resume` finishes it"
        )
    return StudyAnswer(
        verdict="under way" if state is not None else "unconfirmed",
        trial=best.number,
        leader=best.number,
        value=best.value,
        value_interval=None,
        baseline=base.number if base is not None else None,
        baseline_value=_value(base),
        gain_pct=gain,
        gain_interval_pct=None,
        confidence=None,
        within_noise=within,
        rounds=state.pairs if state is not None else 0,
        trials=tuple(sorted({best.number} | ({base.number} if base is not None else set()))),
        text=f"{said}; {_noise_text(noise)}",
        **context,
    )


def _nccl_stage(optuna_study: optuna.Study) -> NcclStageValues | None:
    record = StudyRecord.of(optuna_study).nccl_stage
    if record is None:
        return None
    return NcclStageValues(
        held=dict(record.get("held") or {}),
        baseline_us=record.get("baseline_us"),
        best_us=record.get("best_us"),
        trials=int(record.get("trials", 0)),
    )


def remeasured_record(answer: RemeasuredAnswer) -> dict[str, Any]:
    """A JSON-ready record of a re-measured study's ranking (`status --json`'s `remeasured`, MLflow)."""

    def config(group: ConfigMeasurements | None) -> dict[str, Any] | None:
        if group is None:
            return None
        interval = group.interval
        return {
            "trial": group.of,
            "trials": list(group.trials),
            "n": group.n,
            "mean": group.mean if group.n else None,
            "ci_low": interval[0] if interval else None,
            "ci_high": interval[1] if interval else None,
            "failed": list(group.failed),
        }

    gain = answer.gain
    return {
        "confidence": answer.best.confidence,
        "best": config(answer.best),
        "baseline": config(answer.baseline),
        "gain_pct": gain.pct if gain else None,
        "gain_ci_low_pct": gain.low_pct if gain else None,
        "gain_ci_high_pct": gain.high_pct if gain else None,
        "within_noise": gain.within_noise if gain else None,
        "ranking": [config(g) for g in answer.ranking],
        "unreliable": [config(g) for g in answer.unreliable],
    }
