"""The study loop: Optuna proposes, a node actor runs, the outcome goes back to Optuna and the observers.

The driver holds no GPU. It asks Optuna for a trial, turns it into a server launch through the search
space, hands it to a free node actor, judges what came back (`outcome`), tells Optuna, and tells its
observers (`callbacks`: MLflow tracking, the console). It never sees how a node runs commands (local
process or SSH) nor how an observer records; the node never sees Optuna.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import optuna

from autotune.config import Study
from autotune.errors import stop_signal
from autotune.node.pool import NodePool, RayNodePool
from autotune.study import nccl_stage, outcome, stages, unlaunched
from autotune.study.ablation import ablation_of
from autotune.study.between_trials import hold, may_ask
from autotune.study.callbacks import (
    CallbackList,
    KnobHeld,
    PhaseChanged,
    StudyCallback,
    StudyEnded,
    SummaryUpdated,
    TrialFinished,
    TrialStarted,
)
from autotune.study.gates import Proposal, first_verdict
from autotune.study.interrupts import (
    StopRemembered,
    StudyInterrupted,
    ctrl_c_remembered,
    recover,
    stop_running,
)
from autotune.study.learn import learn_from
from autotune.study.node_facts import dialect_of, flag_tables, hardware_of, learn_nodes
from autotune.study.opening import open_run
from autotune.study.optuna_internals import reads_once
from autotune.study.records import TrialRecord, record_hardware, record_launch, record_node
from autotune.study.request import trial_request
from autotune.study.run_state import POLL_S, RunningTrial, RunOptions, RunState
from autotune.study.storage import HEARTBEAT_S, claim, finished_count, heartbeat, study_lock
from autotune.study.store_failure import storage_unwritable
from autotune.study.summary import study_summary
from autotune.study.trust import node_budget
from autotune.study.trust.confirm import confirmation, confirmation_rounds
from autotune.trial.wire import TrialResult

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

STAGE_OPTIONS = RunOptions(preflight=False)  # the NCCL stage's jobs load no weights


class StudyDriver:
    """Runs a study to its budget: one trial per node at a time, every outcome told to Optuna and to the
    observers (`StudyCallback`: the tracker `tracking` makes, then `callbacks` in order). What a run holds
    is in its `RunState` (`state`, once `run` opened the study); the driver holds only its options."""

    def __init__(
        self,
        study: Study,
        callbacks: Sequence[StudyCallback] = (),
        pool: Callable[[Study], NodePool] = RayNodePool,
        *,
        sampler: optuna.samplers.BaseSampler | None = None,
        storage: optuna.storages.BaseStorage | None = None,
        tracking: Callable[[Study], StudyCallback] | None = None,
        preflight: bool = True,
        remember_incompatible: bool = True,
        memory_edge: bool = True,
        queued_only: bool = False,
        hours_from: str = "budget.node_hours",
    ) -> None:
        """`pool` makes the node pool once the study is open (the CLI gives `in_process_pool` for
        --no-ray); `sampler` and `storage` replace the study file's; `tracking` makes the study's tracker
        (the CLI gives the MLflow one, autotune.views.tracked.study_tracker; None writes no runs); the rest
        are the run's `RunOptions` (`hours_from`: `--hours` from the CLI)."""
        self.study = study
        self.callbacks = tuple(callbacks)
        self.make_pool = pool
        self.sampler = sampler
        self.storage = storage
        self.tracking = tracking
        self.options = RunOptions(preflight, memory_edge, remember_incompatible, queued_only, hours_from)
        self.state: RunState | None = None

    @property
    def stopped(self) -> str | None:
        """Why the last run's search ended before its budget, or None."""
        return self.state.stopped if self.state is not None else None

    def run(self, n_trials: int | None = None, *, accept_changes: bool = False) -> optuna.Study:
        """Run trials until the study's budget (all drivers' trials count) or its timeout is reached: the
        baseline, then the NCCL stage when the study has one (autotune.study.stages), then the search and
        its confirmation."""
        run = self.state = open_run(
            self.study, self.options, self._observers, self.storage, self.sampler, n_trials, accept_changes
        )
        pool = self._start_pool(run, self.make_pool)
        stage = partial(nccl_stage.held_values, run, pool, partial(self._run_stage, run, pool))
        self._drive(run, pool, stage)
        return run.optuna_study

    # -- a run's phases: open, start the nodes, drive ------------------------------------------------------
    def _observers(self, study: Study) -> CallbackList:
        """What a run of `study` tells what happens: the tracker `tracking` makes, then the callbacks."""
        with study_lock(study):  # drivers starting together must not create the tracking store twice
            tracker = [self.tracking(study)] if self.tracking else []
        return CallbackList([*tracker, *self.callbacks])

    @staticmethod
    def _start_pool(run: RunState, make_pool: Callable[[Study], NodePool]) -> NodePool:
        """The node pool, its servers' flags checked against the study; the study's end told when the pool
        cannot start."""
        try:
            pool = make_pool(run.study)
        except KeyboardInterrupt as exc:  # Ctrl-C while Ray starts: no trial has started yet
            run.observers.study_ended(StudyEnded(run.study, run.optuna_study, None))
            signum = stop_signal(exc)
            raise StudyInterrupted(" while the nodes started; no trial was running", signum) from None
        except BaseException:  # a node check refused the start: no parent run left RUNNING
            run.observers.study_ended(StudyEnded(run.study, run.optuna_study, None))
            raise
        try:
            run.study.check_flags(flag_tables(pool))
        except BaseException:
            pool.close()
            raise
        return pool

    def _drive(
        self, run: RunState, pool: NodePool, stage: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """The baseline, the NCCL stage (`stage` returns the values it holds), the search, then the
        confirmation rounds, on `pool` (closed at the end); the study's end told."""
        study, optuna_study = run.study, run.optuna_study
        learn_nodes(run, pool, remember_incompatible=self.options.remember_incompatible)
        try:
            with ctrl_c_remembered() as ctrl_c:
                main = stage is not None and not run.options.queued_only  # not a stage's own study
                if main and (nccl_stage.pending(run) or study.file.budget.node_hours is not None):
                    # The baseline alone first: a measured server before the stage's all-reduces, and
                    # the cost of a launch before a node-hour budget prices the search's launches.
                    run.baseline_only = True
                    self._trials(run, pool, run.budget, run.deadline, ctrl_c)
                    run.baseline_only = False
                hold(run, stage() if stage is not None else {})
                run.searching = True
                self._trials(run, pool, run.budget, run.deadline, ctrl_c)
                run.searching = False
                if run.stopped is not None:
                    run.observers.knob_held(KnobHeld(run.stopped))
                node_budget.clear_ran_out(optuna_study)
                affordable = partial(self._affordable, run)
                pays = partial(node_budget.rounds_pay, study, optuna_study)
                rounds = (
                    ()
                    if run.options.queued_only
                    else confirmation_rounds(study, optuna_study, affordable, pays)
                )
                for total in rounds:
                    run.total = total  # a round at a time (study.confirm), while the node hours pay for it
                    self._trials(run, pool, total, None, ctrl_c)
        except KeyboardInterrupt as exc:
            # The signal remembered: a KeyboardInterrupt caught and raised again on the way lost it.
            signum = ctrl_c.signum if ctrl_c.is_set() else stop_signal(exc)
            stop_running(run, pool, signum=signum)
            run.observers.study_ended(StudyEnded(study, optuna_study, None))
            raise StudyInterrupted(": the running trials were stopped; resume to continue", signum) from None
        except Exception as exc:
            if (unwritable := storage_unwritable(study, exc)) is None:
                raise
            stop_running(run, pool, record=False)  # the storage takes no more: a resume recovers them
            run.observers.study_ended(StudyEnded(study, optuna_study, None))
            raise unwritable from exc
        finally:
            pool.close()
        run.observers.study_ended(StudyEnded(study, optuna_study, study_summary(optuna_study)))

    def _run_stage(
        self, run: RunState, pool: NodePool, stage: Study, sampler: optuna.samplers.BaseSampler
    ) -> optuna.Study:
        """A stage's study (autotune.study.nccl_stage) run to its end before `run`'s search, on its pool,
        lent: a run of its own, with its own tracker."""
        try:
            stage_run = open_run(
                stage, STAGE_OPTIONS, self._observers, run.storage, sampler, None, run.accept_changes
            )
            lent = self._start_pool(stage_run, lambda _stage: stages.LentPool(pool))
            self._drive(stage_run, lent)  # a stage's study runs no stage of its own (nccl_stage off)
        except StudyInterrupted:
            run.observers.study_ended(StudyEnded(run.study, run.optuna_study, None))
            raise
        return stage_run.optuna_study

    def _affordable(self, run: RunState, launches: int) -> bool:
        """Whether the node hours left pay for a confirmation round of `launches`; recorded when not."""
        if node_budget.round_fits(run.study, run.optuna_study, launches):
            return True
        state = confirmation(run.optuna_study)
        node_budget.record_ran_out(run.study, run.optuna_study, state.pairs if state is not None else 0)
        return False

    # -- the trials -----------------------------------------------------------------------------------------
    def _trials(
        self,
        run: RunState,
        pool: NodePool,
        budget: int | None,
        deadline: float | None,
        ctrl_c: StopRemembered,
    ) -> None:
        """Run trials on every idle node until the budget or the deadline is reached and none runs."""
        last_beat = time.monotonic()
        while True:
            if ctrl_c.is_set():  # a Ctrl-C that something below turned into another error
                raise KeyboardInterrupt(ctrl_c.signum)
            for node in pool.idle_nodes():
                if not self._fill(run, pool, node, budget, deadline):
                    break
            if not run.running:
                break
            for submitted, result in pool.wait(POLL_S):
                self._finish(run, run.running.pop(submitted.request.number), result)
            self._poll_phases(run, pool)
            if time.monotonic() - last_beat > HEARTBEAT_S:
                heartbeat(run.optuna_study, [entry.trial for entry in run.running.values()])
                recover(run)  # other drivers that died meanwhile
                last_beat = time.monotonic()

    def _fill(
        self, run: RunState, pool: NodePool, node: str, budget: int | None, deadline: float | None
    ) -> bool:
        """Start the next trial on an idle node; False once the budget or the time is spent."""
        while True:
            with study_lock(run.study):  # other drivers of the study count and ask one at a time too
                with reads_once(run.optuna_study):  # the checks read the trials once, until one writes
                    if not may_ask(run, budget, deadline):
                        return False
                trial = run.optuna_study.ask()
                claim(run.optuna_study, trial)
            if self._start(run, pool, node, trial):
                return True

    def _start(self, run: RunState, pool: NodePool, node: str, trial: optuna.Trial) -> bool:
        """Launch `trial` on `node`, or record it at once when a gate says it must not be launched
        (autotune.study.gates)."""
        study, optuna_study = run.study, run.optuna_study
        baseline = TrialRecord.of(trial).baseline
        config = study.search_space.baseline() if baseline else study.search_space.suggest(trial)
        hardware = hardware_of(run, pool, node)
        if hardware is not None:
            record_hardware(trial, hardware)
        proposal = Proposal(run, trial, config, hardware, pool.facts(node), dialect_of(run, pool, node))
        verdict = first_verdict(proposal)
        if proposal.built() is not None:  # what later proposals' same-launch check reads
            record_launch(trial, proposal.identity)
        if verdict is not None:
            unlaunched.record(run, trial, baseline, verdict)
            return False
        run.skips = run.same_in_a_row = 0  # a launch: the run of proposals that cannot run is broken
        launch = study.seeded(proposal.launch, trial.number)  # after the same-launch check: no setting
        record_node(trial, node, config.derived)
        request = trial_request(run, trial, launch, baseline, proposal.dialect)
        run.observers.trial_started(  # before the node has it: a run to follow its phases in
            TrialStarted(
                study=study,
                trial=trial,
                node=node,
                baseline=baseline,
                config=config,
                launch=launch,
                ablation=ablation_of(trial, optuna_study),
                progress=run.progress(launching=trial.number),
            )
        )
        submitted = pool.submit(node, request)
        run.running[trial.number] = RunningTrial(trial, submitted, baseline, time.monotonic())
        return True

    # -- what came back ------------------------------------------------------------------------------------
    def _poll_phases(self, run: RunState, pool: NodePool) -> None:
        for number, entry in run.running.items():
            phase = pool.phase(entry.submitted)
            if phase is None or phase in ("idle", "stopping") or phase == entry.phase:
                continue
            now = time.monotonic()
            previous, took = entry.phase, now - entry.phase_started
            entry.phase, entry.phase_started = phase, now
            run.observers.trial_phase_changed(PhaseChanged(number, phase, previous, took, run.progress()))

    def _finish(self, run: RunState, entry: RunningTrial, result: TrialResult) -> None:
        """Judge the node's result, learn from a failure, tell Optuna, then the observers."""
        study, optuna_study, trial = run.study, run.optuna_study, entry.trial
        judged = outcome.judge(study, trial, result)
        learned = learn_from(run, entry, judged, result)
        optuna_study.tell(trial, judged.values, state=judged.state)
        with reads_once(optuna_study):  # the count and the summary read the same trials
            run.done = finished_count(optuna_study)
            summary = run.refresh_standing()
        run.observers.trial_finished(
            TrialFinished(
                study=study,
                number=trial.number,
                baseline=entry.baseline,
                outcome=judged,
                result=result,
                launch=entry.submitted.request.launch,
                elapsed_s=time.monotonic() - entry.started,
                progress=run.progress(),
            )
        )
        if learned is not None:  # after the failed trial's row, so that it does not read as skipped
            run.observers.incompatibility_learned(learned)
        run.observers.summary_updated(SummaryUpdated(study, optuna_study, summary))
