"""The best config's gain over the baseline, split by parameter: revert one changed parameter at a time.

`autotune ablate` queues one ordinary study trial per parameter the best config changed, the best config
with that one reverted to the baseline's value (unset, off, or for a range SGLang's own choice); what it
was worth is the best trial's value minus that trial's. Details: docs/design.md, "Ablation".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.errors import AutotuneError
from autotune.study.records import StudyRecord, TrialRecord, marks
from autotune.study.rules import baseline_trial, best_trial, direction_sign
from autotune.study.samplers import default_of, nearest
from autotune.trial.failures import FailureKind


@dataclass(frozen=True)
class AblationPlan:
    """The ablation trials of one best trial: what each reverts, and what cannot be reverted alone."""

    of: int
    reverts: dict[str, object]  # parameter -> the baseline's value it goes back to
    not_ablated: dict[str, str]  # parameter -> why it is not reverted alone
    done: tuple[str, ...]  # reverts that already ran or are queued
    server_chosen: tuple[str, ...] = ()  # reverts to the value SGLang chose for itself in the baseline


@dataclass(frozen=True)
class AblationRow:
    """One reverted parameter and what the best config lost without it."""

    param: str
    best_setting: object
    reverted_to: object
    trial: int
    state: str
    value: float | None
    failure_kind: str | None
    loss: float | None  # better-is-positive: how much worse the config is without this setting
    loss_pct: float | None  # of the best trial's value
    share_of_gain: float | None  # of the best trial's gain over the baseline


@dataclass(frozen=True)
class Ablation:
    """The finished ablation of one best trial."""

    of: int
    best_value: float
    baseline_value: float | None
    rows: tuple[AblationRow, ...]
    not_ablated: dict[str, str]
    pending: tuple[str, ...]  # reverts queued or running, without a result yet


def changed_params(trial: FrozenTrial) -> dict[str, object]:
    """The trial's parameters that set something: the baseline leaves every one of them unset or off."""
    return {name: value for name, value in trial.params.items() if value is not None and value is not False}


def revert_value(
    trial: FrozenTrial, name: str, server_choices: Mapping[str, float] | None = None
) -> tuple[bool, object]:
    """(True, the baseline's value) when `name`'s search space can express it (its unset value, or the
    value SGLang chose in the baseline, `server_choices`, on the space's step), else (False, None)."""
    distribution = trial.distributions[name]
    value = default_of(distribution)
    if value is None or value is False:
        return True, value
    if server_choices and name in server_choices:
        chosen = nearest(distribution, server_choices[name])
        return (True, chosen) if isinstance(chosen, int | float) else (False, None)  # a number to be near
    return False, None


def plan_ablation(optuna_study: optuna.Study) -> AblationPlan:
    """The ablation of the study's best trial; raises AutotuneError when there is nothing to ablate."""
    best = best_trial(optuna_study)
    if best is None:
        raise AutotuneError(
            f"study {optuna_study.study_name!r} has no completed trial yet: nothing to ablate"
        )
    if TrialRecord.of(best).baseline or not changed_params(best):
        raise AutotuneError(
            f"the best trial of study {optuna_study.study_name!r} is the baseline (SGLang's defaults): "
            "no setting to revert"
        )
    done = {
        param
        for trial, (of, param) in ablation_trials(optuna_study.get_trials(deepcopy=False))
        if of == best.number and not _interrupted(trial)
    }
    reverts: dict[str, object] = {}
    not_ablated: dict[str, str] = {}
    chosen = StudyRecord.of(optuna_study).server_choices
    server_chosen = []
    for name in changed_params(best):
        possible, value = revert_value(best, name, chosen)
        if possible and value == best.params[name]:
            not_ablated[name] = f"the best config has SGLang's own choice already ({value})"
        elif possible:
            reverts[name] = value
            if value is not None and value is not False:
                server_chosen.append(name)
        else:
            not_ablated[name] = (
                "its search space has no 'leave it to SGLang' value (a range or a list without null), and "
                "the baseline recorded no value SGLang chose for it"
            )
    return AblationPlan(
        of=best.number,
        reverts=reverts,
        not_ablated=not_ablated,
        done=tuple(name for name in reverts if name in done),
        server_chosen=tuple(server_chosen),
    )


def enqueue_ablation(optuna_study: optuna.Study, plan: AblationPlan) -> list[str]:
    """Queue the plan's trials that have not run yet; returns the parameters they revert."""
    best = next(t for t in optuna_study.get_trials(deepcopy=False) if t.number == plan.of)
    queued = []
    for name, value in plan.reverts.items():
        if name in plan.done:
            continue
        # A parameter whose `when` no longer holds is simply not suggested: its fixed value goes unused.
        optuna_study.enqueue_trial(
            {**best.params, name: value},
            user_attrs=marks(ablation_of=plan.of, ablation_param=name),
        )
        queued.append(name)
    return queued


def ablation_trials(trials: list[FrozenTrial]) -> list[tuple[FrozenTrial, tuple[int, str]]]:
    """The ablation trials among `trials`, each with (the ablated trial, the reverted parameter).

    A retry of an interrupted ablation trial (user attr `retry_of`, queued by the driver with the same
    parameters) counts as that ablation trial."""
    by_number = {t.number: t for t in trials}
    found = []
    for trial in trials:
        ablated = _ablation_of(TrialRecord.of(trial), by_number)
        if ablated is not None:
            found.append((trial, ablated))
    return found


def ablation_of(trial: FrozenTrial | optuna.Trial, optuna_study: optuna.Study) -> tuple[int, str] | None:
    """(the ablated trial, the reverted parameter) when `trial` is an ablation trial or a retry of one."""
    record = TrialRecord.of(trial)
    if record.ablation_of is None and record.retry_of is None:
        return None  # neither: no need to read the study's trials
    return _ablation_of(record, {t.number: t for t in optuna_study.get_trials(deepcopy=False)})


def _ablation_of(record: TrialRecord, by_number: Mapping[int, FrozenTrial]) -> tuple[int, str] | None:
    for _ in range(len(by_number) + 1):  # follow retry_of back to the enqueued ablation trial
        if record.ablation_of is not None:
            return record.ablation_of, str(record.ablation_param)
        retry_of = record.retry_of
        source = by_number.get(retry_of) if retry_of is not None else None
        if source is None:
            return None
        record = TrialRecord.of(source)
    return None


def _interrupted(trial: FrozenTrial) -> bool:
    return trial.state == TrialState.FAIL and TrialRecord.of(trial).failure_kind == FailureKind.INTERRUPTED


def ablation_results(optuna_study: optuna.Study) -> Ablation | None:
    """The ablation of the current best trial when it has one, else of the latest ablated trial; None
    when the study has no ablation trials."""
    trials = optuna_study.get_trials(deepcopy=False)
    ablated = ablation_trials(trials)
    if not ablated:
        return None
    best = best_trial(optuna_study)
    numbers = {of for _, (of, _) in ablated}
    of = best.number if best is not None and best.number in numbers else max(numbers)
    target = next(t for t in trials if t.number == of)
    if target.value is None:
        return None
    base = baseline_trial(optuna_study)
    base_value = base.value if base is not None else None
    sign = direction_sign(optuna_study.direction)
    gain = sign * (target.value - base_value) if base_value is not None else None
    latest: dict[str, FrozenTrial] = {}
    pending = []
    for trial, (trial_of, name) in ablated:
        if trial_of != of:
            continue
        if not trial.state.is_finished():
            pending.append(name)
        elif not _interrupted(trial):
            latest[name] = trial  # a later run of the same revert replaces an earlier one
    rows = []
    for name, trial in latest.items():
        value = trial.value if trial.state == TrialState.COMPLETE else None
        loss = sign * (target.value - value) if value is not None else None
        rows.append(
            AblationRow(
                param=name,
                best_setting=target.params.get(name),
                reverted_to=trial.params.get(name),
                trial=trial.number,
                state=trial.state.name,
                value=value,
                failure_kind=TrialRecord.of(trial).failure_kind_text,
                loss=loss,
                loss_pct=loss / abs(target.value) * 100 if loss is not None and target.value else None,
                share_of_gain=loss / gain if loss is not None and gain else None,
            )
        )
    # Failed reverts first (the config needs that setting to run at all), then by what was lost.
    rows.sort(key=lambda r: (r.loss is not None, -(r.loss or 0.0)))
    not_ablated = {
        name: "no 'leave it to SGLang' value in its search space"
        for name in changed_params(target)
        if not revert_value(target, name)[0]
    }
    return Ablation(
        of=of,
        best_value=float(target.value),
        baseline_value=base_value,
        rows=tuple(rows),
        not_ablated=not_ablated,
        pending=tuple(p for p in pending if p not in latest),
    )
