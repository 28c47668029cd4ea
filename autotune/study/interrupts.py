"""A run stopped and a run picked up after one: a stop signal remembered however the code below handles it,
the running trials stopped and recorded as interrupted (queued to run again), and the trials a dead driver
left RUNNING recovered the same way.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.errors import STOP_SIGNALS, AutotuneError, interrupt
from autotune.node.pool import NodePool
from autotune.study import optuna_internals, outcome
from autotune.study.callbacks import StudyInterrupting, TrialInterrupted, TrialsRecovered
from autotune.study.records import TrialRecord, record_failure
from autotune.study.run_state import POLL_S, RunState
from autotune.study.storage import abandoned_trials, enqueue_retry, study_lock
from autotune.trial.failures import FailureKind

INTERRUPT_WAIT_S = 60.0  # SGLang needs 10 to 15 s to stop; a node that does not answer is left to resume


class StudyInterrupted(AutotuneError):
    """Ctrl-C (or SIGTERM, SIGHUP: `signum`) stopped the study; the running trials were stopped and recorded
    as interrupted."""

    def __init__(self, what: str, signum: int = signal.SIGINT) -> None:
        self.signum = signal.Signals(signum)
        how = "interrupted" if self.signum is signal.SIGINT else f"stopped by {self.signum.name}"
        super().__init__(f"{how}{what}")


def recover_interrupted(study: Study, optuna_study: optuna.Study) -> list[FrozenTrial]:
    """Trials a dead driver left RUNNING: FAIL them as interrupted and enqueue them again; returns them as
    they were found (their runs are for the tracker to close)."""
    recovered = []
    with study_lock(study) as locked:
        abandoned = abandoned_trials(optuna_study, locked=locked)
    for trial in abandoned:
        record_failure(optuna_internals.StoredTrial(optuna_study, trial), FailureKind.INTERRUPTED)
        optuna_study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        # The queued values too: a trial enqueued (the baseline, a retry, a config queued by hand) and asked
        # for by a driver that died before suggesting them holds no params yet.
        params = {**optuna_internals.fixed_params(trial), **trial.params}
        enqueue_retry(optuna_study, trial.number, params, TrialRecord.of(trial), once=False)
        recovered.append(trial)
    return recovered


def recover(run: RunState) -> list[int]:
    """`recover_interrupted` for `run`, told to its observers; returns the trials' numbers."""
    recovered = recover_interrupted(run.study, run.optuna_study)
    if recovered:
        run.observers.trials_recovered(TrialsRecovered(tuple(recovered)))
    return [trial.number for trial in recovered]


class StopRemembered(threading.Event):
    """Set by the first stop signal; `signum` says which."""

    signum = signal.SIGINT


@contextmanager
def ctrl_c_remembered() -> Iterator[StopRemembered]:
    """Ctrl-C (and SIGTERM, SIGHUP: `STOP_SIGNALS`) raises KeyboardInterrupt as usual and is also
    remembered, so that code which swallows it cannot make the study loop miss it (once a Ctrl-C between
    two trials was lost and the driver ran its study to the end; the call that swallowed it was not found).
    Only the main thread takes signals. Installed after Ray started: ray.init takes SIGTERM for itself."""
    remembered = StopRemembered()
    if threading.current_thread() is not threading.main_thread():
        yield remembered
        return

    def on_stop(signum: int, frame: FrameType | None) -> None:
        if not remembered.is_set():
            remembered.signum = signal.Signals(signum)
        remembered.set()
        interrupt(signum, frame)

    previous = {sig: signal.signal(sig, on_stop) for sig in STOP_SIGNALS}
    try:
        yield remembered
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_running(run: RunState, pool: NodePool, *, record: bool = True, signum: int = signal.SIGINT) -> None:
    """First Ctrl-C (or `signum`): stop every running server, record the trials as interrupted (not in a
    storage that cannot be written: `record=False`), close their runs."""
    if record:
        running = tuple(sorted(run.running))
        run.observers.study_interrupting(StudyInterrupting(running, signal.Signals(signum).name))
    pool.abort_all()
    logs: dict[int, str] = {}
    deadline = time.monotonic() + INTERRUPT_WAIT_S
    while len(logs) < len(run.running) and time.monotonic() < deadline:
        for submitted, result in pool.wait(POLL_S):
            logs[submitted.request.number] = result.log
    for number, entry in run.running.items():
        if record:
            run.optuna_study.tell(entry.trial, state=outcome.interrupted(entry.trial).state)
            enqueue_retry(
                run.optuna_study, number, entry.trial.params, TrialRecord.of(entry.trial), once=False
            )
        run.observers.trial_interrupted(TrialInterrupted(number, entry.baseline, logs.get(number, "")))
