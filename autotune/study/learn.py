"""What the study keeps from a trial a node finished, before Optuna is told: SGLang's own values from the
baseline, the node seconds the trial cost, and after a failure, the settings its hardware cannot run (not
proposed there again) or a retry of a trial whose failure says nothing about its settings.
"""

from __future__ import annotations

import optuna

from autotune.study.callbacks import IncompatibilityLearned
from autotune.study.outcome import Outcome
from autotune.study.records import TrialRecord, record_node_s, record_server_choices
from autotune.study.run_state import RunningTrial, RunState
from autotune.study.storage import enqueue_retry
from autotune.trial.failures import FailureKind
from autotune.trial.wire import TrialResult


def learn_from(
    run: RunState, entry: RunningTrial, judged: Outcome, result: TrialResult
) -> IncompatibilityLearned | None:
    """Record what `result` says beyond its values; returns what a failure taught, for the observers."""
    if result.server_choices and entry.baseline:
        # SGLang's own values: where the sampler starts the knobs with no "unset".
        record_server_choices(run.optuna_study, result.server_choices)
    learned = after_failure(run, entry.trial, judged, result.node) if judged.failure is not None else None
    if (node_s := result.node_seconds) is not None:
        record_node_s(entry.trial, node_s)
    return learned


def after_failure(
    run: RunState, trial: optuna.Trial, judged: Outcome, node: str
) -> IncompatibilityLearned | None:
    """After a failure: settings this hardware cannot run are not proposed again (what was learned is
    returned, for the observers), and a trial whose failure says nothing about its settings runs once
    more."""
    failure = judged.failure
    assert failure is not None
    hardware = run.hardware_by_node.get(node)
    learn = run.options.remember_incompatible and failure.kind.deterministic
    learned = None
    if learn and (new := run.known.learn(trial.params, failure, hardware)):
        run.optuna_study.sampler = run.current_sampler()
        learned = IncompatibilityLearned(tuple(new), tuple(run.known.pairs))
    if failure.kind.retried_once:
        once = failure.kind is not FailureKind.INTERRUPTED
        enqueue_retry(run.optuna_study, trial.number, trial.params, TrialRecord.of(trial), once=once)
    return learned
