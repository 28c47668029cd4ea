"""Proposals recorded without a launch: what each verdict of the checks before a launch (autotune.study.gates)
tells Optuna and the observers. None costs node time or budget; too many in a row end the study.
"""

from __future__ import annotations

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import AutotuneError
from autotune.study import outcome
from autotune.study.callbacks import TrialFinished
from autotune.study.gates import Forbidden, SameLaunch, Verdict
from autotune.study.run_state import RunState
from autotune.study.storage import finished_count
from autotune.study.trust.stopping import record_stop
from autotune.trial.failures import FailureKind

MAX_CONSECUTIVE_SKIPS = 200
# Proposals in a row of configs launched before: the sampler has nothing new to try, the search ends.
MAX_SAME_IN_A_ROW = 20


def record(run: RunState, trial: optuna.Trial, baseline: bool, verdict: Verdict) -> None:
    """Tell `verdict` on `trial` to Optuna (and a refusal to the observers, as a trial of its own)."""
    if isinstance(verdict, Forbidden):
        refused(run, trial, baseline, verdict.why)
    elif isinstance(verdict, SameLaunch):
        same(run, trial, verdict.earlier)
    else:
        skip(run, trial, verdict.why, oom=verdict.oom)


def refused(run: RunState, trial: optuna.Trial, baseline: bool, why: str) -> None:
    """Record a launch the study file forbids (`never_launch`), told to the observers as a trial."""
    judged = outcome.refused(trial, FailureKind.FORBIDDEN, why)
    run.optuna_study.tell(trial, state=judged.state)
    run.done = finished_count(run.optuna_study)
    run.observers.trial_finished(
        TrialFinished(
            study=run.study,
            number=trial.number,
            baseline=baseline,
            outcome=judged,
            result=None,
            launch=None,
            elapsed_s=0.0,
            progress=run.progress(),
        )
    )


def skip(run: RunState, trial: optuna.Trial, why: str, *, oom: bool = False) -> None:
    """Record a proposal that is never launched (`outcome.skipped`); too many in a row stop the study."""
    _count_skip(run, why)
    run.optuna_study.tell(trial, state=outcome.skipped(run.study, trial, why, oom=oom).state)


def same(run: RunState, trial: optuna.Trial, earlier: FrozenTrial) -> None:
    """Record a proposal of a launch made before with that launch's result, without node time or budget
    (`outcome.same_as`); too many in a row stop the study as skips do."""
    _count_skip(run, f"the same launch as trial {earlier.number}")
    judged = outcome.same_as(trial, earlier)
    run.optuna_study.tell(trial, judged.values, state=judged.state)
    run.same_in_a_row += 1
    if run.same_in_a_row >= MAX_SAME_IN_A_ROW and run.stopped is None:
        run.stopped = (
            f"stopped early: the sampler proposed {run.same_in_a_row} configs in a row that were "
            "launched before; the search space has nothing new to try"
        )
        record_stop(run.optuna_study, run.stopped)


def _count_skip(run: RunState, why: str) -> None:
    run.skips += 1
    if run.skips > MAX_CONSECUTIVE_SKIPS:
        raise AutotuneError(
            f"the sampler proposed {MAX_CONSECUTIVE_SKIPS} trials in a row that cannot run ({why}): "
            "remove the failing values from the search space"
        )
