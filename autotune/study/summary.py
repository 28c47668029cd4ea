"""The read-only questions about a study that the loop, the CLI and the views ask: its baseline trial,
its Pareto front, and its summary (baseline, best, gain, trials by state and failure kind)."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.study.records import BASELINE_ATTR, CONFIRM_ATTR, FAILURE_KIND_ATTR
from autotune.study.remeasure import RemeasuredAnswer, remeasured_answer
from autotune.study.rules import ConfigMeasurements, best_trial, direction_sign, is_feasible, non_dominated


def baseline_trial(ostudy: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial (SGLang's defaults), if there is one."""
    for trial in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.user_attrs.get(BASELINE_ATTR):
            return trial
    return None


def pareto_front(ostudy: optuna.Study) -> list[FrozenTrial]:
    """A multi-objective study's answer: the feasible COMPLETE trials that no other one dominates (at least
    as good in every objective and better in one), by number; [] for a single-objective study."""
    if len(ostudy.directions) < 2:
        return []
    complete = [
        t
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values is not None and is_feasible(t)
    ]
    return sorted(non_dominated(complete, ostudy.directions), key=lambda t: t.number)


def study_summary(ostudy: optuna.Study) -> dict[str, Any]:
    """Baseline, best, gain over the baseline, and trials counted by state and failure kind."""
    trials = ostudy.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
        kind = trial.user_attrs.get(FAILURE_KIND_ATTR)
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    summary: dict[str, Any] = {
        "states": states,
        "failure_kinds": kinds,
        "baseline_value": None,
        "best_value": None,
        "best_trial": None,
        "gain_pct": None,
        "pareto": None,
        "remeasured": None,
    }
    if len(ostudy.directions) > 1:
        front = pareto_front(ostudy)
        summary["pareto"] = [{"number": t.number, "values": list(t.values or [])} for t in front]
        return summary
    base, best = baseline_trial(ostudy), best_trial(ostudy)
    base_value = base.value if base else None
    best_value = best.value if best else None
    gain = None
    if base_value and best_value is not None:
        sign = direction_sign(ostudy.direction)
        gain = sign * (best_value - base_value) / abs(base_value) * 100
    # Once the trust section's confirmation began, its paired rounds are the answer (confirm.study_answer):
    # the means of its launches here would be a second answer, computed another way.
    answer = remeasured_answer(ostudy) if CONFIRM_ATTR not in ostudy.user_attrs else None
    remeasured = None
    if answer is not None:
        # The answer is a mean now: the best config's and the baseline's, and the gain between them.
        best_value = answer.best.mean
        if answer.baseline is not None and answer.baseline.n:
            base_value = answer.baseline.mean
        gain = answer.gain.pct if answer.gain is not None else None
        remeasured = remeasured_summary(answer)
    summary.update(
        baseline_value=base_value,
        best_value=best_value,
        best_trial=best.number if best else None,
        gain_pct=gain,
        remeasured=remeasured,
    )
    return summary


def remeasured_summary(answer: RemeasuredAnswer) -> dict[str, Any]:
    """A JSON-ready record of a re-measured study's answer."""

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
