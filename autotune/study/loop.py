"""The study loop: Optuna proposes, a node actor runs, the outcome goes back to Optuna and the observers.

The driver holds no GPU. It asks Optuna for a trial, turns it into a server launch through the search
space, hands it to a free node actor, judges what came back (`outcome`), tells Optuna, and tells its
observers (`callbacks`: MLflow tracking, the console). It never sees how a node runs commands (local
process or SSH) nor how an observer records; the node never sees Optuna.
"""

from __future__ import annotations

import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from types import FrameType
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.dialect import Dialect, FlagTable
from autotune.errors import STOP_SIGNALS, AutotuneError, interrupt, stop_signal
from autotune.measure.plan import MeasurementPlan, plan_for
from autotune.node.pool import NodePool, RayNodePool
from autotune.study import nccl_stage, optuna_internals, outcome, stages, unlaunched
from autotune.study.ablation import ablation_of
from autotune.study.before_launch import remember_known_failures
from autotune.study.between_trials import between_trials
from autotune.study.callbacks import (
    CallbackList,
    IncompatibilityLearned,
    KnobHeld,
    PhaseChanged,
    StudyCallback,
    StudyEnded,
    StudyInterrupting,
    StudyStarted,
    SummaryUpdated,
    TrialFinished,
    TrialInterrupted,
    TrialsRecovered,
    TrialStarted,
)
from autotune.study.gates import Proposal, first_verdict
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.node_failing import requeue_baseline
from autotune.study.optuna_internals import reads_once
from autotune.study.outcome import Outcome
from autotune.study.pruning import load_cutoff, short_cutoff, short_pruner
from autotune.study.records import (
    TrialRecord,
    record_failure,
    record_hardware,
    record_launch,
    record_node,
    record_node_s,
    record_server_choices,
    record_short_cutoff,
)
from autotune.study.run_state import RunningTrial, RunOptions, RunState
from autotune.study.storage import (
    HEARTBEAT_S,
    abandoned_trials,
    budget_used,
    claim,
    enqueue_retry,
    finished_count,
    heartbeat,
    open_study,
    rdb_storage,
    study_lock,
    trials_so_far,
)
from autotune.study.store_failure import storage_unwritable
from autotune.study.summary import StudySummary, study_summary
from autotune.study.trust import node_budget, screening
from autotune.study.trust.confirm import confirmation, confirmation_rounds
from autotune.study.trust.stopping import stopped_early
from autotune.trial.failures import FailureKind
from autotune.trial.wire import TrialRequest, TrialResult

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

POLL_S = 0.5
STAGE_OPTIONS = RunOptions(preflight=False)  # the NCCL stage's jobs load no weights
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


class _Stop(threading.Event):
    """Set by the first stop signal; `signum` says which."""

    signum = signal.SIGINT


@contextmanager
def ctrl_c_remembered() -> Iterator[_Stop]:
    """Ctrl-C (and SIGTERM, SIGHUP: `STOP_SIGNALS`) raises KeyboardInterrupt as usual and is also
    remembered, so that code which swallows it cannot make the study loop miss it (once a Ctrl-C between
    two trials was lost and the driver ran its study to the end; the call that swallowed it was not found).
    Only the main thread takes signals. Installed after Ray started: ray.init takes SIGTERM for itself."""
    remembered = _Stop()
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
        (the CLI gives the MLflow one, autotune.views.tracked.study_tracker; None writes no runs);
        `preflight=False` launches predicted OOMs, `memory_edge=False` only those past the memory edge the
        study met, and `remember_incompatible=False` launches known incompatibilities again. They are for
        measuring the tuner itself (benchmarks/). `queued_only` runs the trials queued in the study and
        nothing else (no proposal, baseline repeat, screening, stopping rule or confirmation): `compare`'s
        rounds. `hours_from`: where the node-hour budget was given, for its error (`--hours` from the CLI)."""
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
        run = self.state = self._open(
            self.study,
            n_trials,
            accept_changes,
            self.storage,
            self.sampler,
            self.options,
        )
        pool = self._start_pool(run, self.make_pool)
        try:
            run.study.check_flags(self._flag_tables(pool))
        except BaseException:
            pool.close()
            raise
        stage = partial(nccl_stage.held_values, run, pool, partial(self._run_stage, run, pool))
        self._drive(run, pool, stage)
        return run.optuna_study

    # -- a run's phases: open, start the nodes, drive ------------------------------------------------------
    def _open(
        self,
        study: Study,
        n_trials: int | None,
        accept_changes: bool,
        storage: optuna.storages.BaseStorage | None,
        sampler: optuna.samplers.BaseSampler | None,
        options: RunOptions,
    ) -> RunState:
        """Open or resume the study, recover what a dead driver left, and tell the observers it started."""
        study.check_launchable()
        budget = n_trials or study.file.budget.n_trials
        deadline = time.monotonic() + study.file.budget.timeout_s if study.file.budget.timeout_s else None
        study.ensure_workdir()
        storage = storage if storage is not None else rdb_storage(study.storage)
        trials_before = trials_so_far(storage, study.name)  # before a new study's baseline is queued
        optuna_study = open_study(study, accept_changes=accept_changes, sampler=sampler, storage=storage)
        if not options.queued_only:
            node_budget.check_budget(study, optuna_study, options.hours_from)  # before any launch or write
            node_budget.record_budget(study, optuna_study)
        known = KnownIncompatibilities(optuna_study, study.search_space)
        base_sampler = optuna_study.sampler
        # A search that stopped early stays stopped on a plain resume (which then finishes the confirmation);
        # a resume given --n-trials asks for more search.
        stopped = stopped_early(optuna_study) if n_trials is None else None
        with study_lock(study):  # drivers starting together must not create the tracking store twice
            tracker = [self.tracking(study)] if self.tracking else []
        run = RunState(
            study=study,
            optuna_study=optuna_study,
            storage=storage,
            observers=CallbackList([*tracker, *self.callbacks]),
            known=known,
            sampler=sampler,
            options=options,
            accept_changes=accept_changes,
            trials_before=trials_before,
            budget=budget,
            deadline=deadline,
            stopped=stopped,
            total=budget or 0,
            done=0,
            base_sampler=base_sampler,
        )
        recovered = self._recover(run)
        if not options.queued_only:
            requeue_baseline(study, optuna_study)  # its node may have been fixed since (study.node_failing)
        run.done = finished_count(optuna_study)
        self._refresh_standing(run)
        run.observers.study_started(StudyStarted(study, tuple(recovered)))
        return run

    @staticmethod
    def _start_pool(run: RunState, make_pool: Callable[[Study], NodePool]) -> NodePool:
        """The node pool; the study's end told when it cannot start."""
        try:
            return make_pool(run.study)
        except KeyboardInterrupt as exc:  # Ctrl-C while Ray starts: no trial has started yet
            run.observers.study_ended(StudyEnded(run.study, run.optuna_study, None))
            signum = stop_signal(exc)
            raise StudyInterrupted(" while the nodes started; no trial was running", signum) from None
        except BaseException:  # a node check refused the start: no parent run left RUNNING
            run.observers.study_ended(StudyEnded(run.study, run.optuna_study, None))
            raise

    def _drive(
        self, run: RunState, pool: NodePool, stage: Callable[[], dict[str, Any]] | None = None
    ) -> None:
        """The baseline, the NCCL stage (`stage` returns the values it holds), the search, then the
        confirmation rounds, on `pool` (closed at the end); the study's end told."""
        study, optuna_study = run.study, run.optuna_study
        run.flag_defaults = screening.flag_defaults(self._flag_tables(pool))
        run.hardware = {self._hardware(run, pool, node) for node in pool.idle_nodes()}
        for node in pool.idle_nodes() if self.options.remember_incompatible else ():  # known before a launch
            facts, hardware = pool.facts(node), run.hardware_by_node[node]
            space = study.search_space
            if notice := remember_known_failures(run.known, optuna_study, space, facts, hardware):
                run.observers.knob_held(KnobHeld(notice))
        optuna_study.sampler = run.current_sampler()
        try:
            with ctrl_c_remembered() as ctrl_c:
                if stage is not None and not run.options.queued_only and nccl_stage.pending(run):
                    # A measured server after the first launch, not after the stage's all-reduces.
                    run.baseline_only = True
                    self._trials(run, pool, run.budget, run.deadline, ctrl_c)
                    run.baseline_only = False
                self._hold(run, stage() if stage is not None else {})
                run.searching = True
                self._trials(run, pool, run.budget, run.deadline, ctrl_c)
                run.searching = False
                if run.stopped is not None:
                    run.observers.knob_held(KnobHeld(run.stopped))
                node_budget.clear_ran_out(optuna_study)
                affordable = partial(self._affordable, run)
                rounds = (
                    () if run.options.queued_only else confirmation_rounds(study, optuna_study, affordable)
                )
                for total in rounds:
                    run.total = total  # a round at a time (study.confirm), while the node hours pay for it
                    self._trials(run, pool, total, None, ctrl_c)
        except KeyboardInterrupt as exc:
            # The signal remembered: a KeyboardInterrupt caught and raised again on the way lost it.
            signum = ctrl_c.signum if ctrl_c.is_set() else stop_signal(exc)
            self._interrupt(run, pool, signum=signum)
            run.observers.study_ended(StudyEnded(study, optuna_study, None))
            raise StudyInterrupted(": the running trials were stopped; resume to continue", signum) from None
        except Exception as exc:
            if (unwritable := storage_unwritable(study, exc)) is None:
                raise
            self._interrupt(run, pool, record=False)  # the storage takes no more: a resume recovers them
            run.observers.study_ended(StudyEnded(study, optuna_study, None))
            raise unwritable from exc
        finally:
            pool.close()
        run.observers.study_ended(StudyEnded(study, optuna_study, study_summary(optuna_study)))

    @staticmethod
    def _hold(run: RunState, held: dict[str, Any]) -> None:
        """Hold the NCCL stage's values `held` and the knobs a resumed study's screening held in every
        server trial the sampler proposes."""
        run.stage_held = held
        screened = screening.held_knobs(run.optuna_study)  # a resumed study holds what its screening held
        if held or screened:
            run.base_sampler = run.holding({**held, **screened})
            for line in screening.screened_lines(run.optuna_study):
                run.observers.knob_held(KnobHeld(line))
        run.optuna_study.sampler = run.current_sampler()

    def _run_stage(
        self, run: RunState, pool: NodePool, stage: Study, sampler: optuna.samplers.BaseSampler
    ) -> optuna.Study:
        """A stage's study (autotune.study.nccl_stage) run to its end before `run`'s search, on its pool,
        lent: a run of its own, with its own tracker."""
        try:
            stage_run = self._open(stage, None, run.accept_changes, run.storage, sampler, STAGE_OPTIONS)
            lent = self._start_pool(stage_run, lambda _stage: stages.LentPool(pool))
            try:
                stage.check_flags(self._flag_tables(lent))
            except BaseException:
                lent.close()
                raise
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

    def _recover(self, run: RunState) -> list[int]:
        recovered = recover_interrupted(run.study, run.optuna_study)
        if recovered:
            run.observers.trials_recovered(TrialsRecovered(tuple(recovered)))
        return [trial.number for trial in recovered]

    @staticmethod
    def _refresh_standing(run: RunState) -> StudySummary:
        summary = study_summary(run.optuna_study)
        run.standing = (summary.best_value, summary.baseline_value)
        return summary

    # -- the trials -----------------------------------------------------------------------------------------
    def _trials(
        self,
        run: RunState,
        pool: NodePool,
        budget: int | None,
        deadline: float | None,
        ctrl_c: _Stop,
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
                self._recover(run)  # other drivers that died meanwhile
                last_beat = time.monotonic()

    def _fill(
        self, run: RunState, pool: NodePool, node: str, budget: int | None, deadline: float | None
    ) -> bool:
        """Start the next trial on an idle node; False once the budget or the time is spent."""
        while True:
            with study_lock(run.study):  # other drivers of the study count and ask one at a time too
                with reads_once(
                    run.optuna_study
                ):  # every check below reads the trials: once, until one writes
                    if not self._may_ask(run, budget, deadline):
                        return False
                trial = run.optuna_study.ask()
                claim(run.optuna_study, trial)
            if self._start(run, pool, node, trial):
                return True

    @staticmethod
    def _may_ask(run: RunState, budget: int | None, deadline: float | None) -> bool:
        """Whether another trial may start: time and budget left, and the search not ended by one of the
        steps between trials (autotune.study.between_trials)."""
        if deadline is not None and time.monotonic() >= deadline:
            return False
        if run.baseline_only:
            return nccl_stage.baseline_next(run.optuna_study)
        if budget is not None and budget_used(run.optuna_study) >= budget:
            return False
        waiting = (TrialState.WAITING,)
        if run.options.queued_only and not run.optuna_study.get_trials(deepcopy=False, states=waiting):
            return False
        if run.searching and run.stopped is None and not run.options.queued_only:
            between_trials(run)
        return not (run.searching and run.stopped is not None)

    def _start(self, run: RunState, pool: NodePool, node: str, trial: optuna.Trial) -> bool:
        """Launch `trial` on `node`, or record it at once when a gate says it must not be launched
        (autotune.study.gates)."""
        study, optuna_study = run.study, run.optuna_study
        baseline = TrialRecord.of(trial).baseline
        config = study.search_space.baseline() if baseline else study.search_space.suggest(trial)
        hardware = self._hardware(run, pool, node)
        if hardware is not None:
            record_hardware(trial, hardware)
        proposal = Proposal(run, trial, config, hardware, pool.facts(node), self._dialect(run, pool, node))
        verdict = first_verdict(proposal)
        if proposal.built() is not None:  # what later proposals' same-launch check reads
            record_launch(trial, proposal.identity)
        if verdict is not None:
            unlaunched.record(run, trial, baseline, verdict)
            return False
        run.skips = run.same_in_a_row = 0  # a launch: the run of proposals that cannot run is broken
        launch = study.seeded(
            proposal.launch, trial.number
        )  # after the same-launch check: the seed is no setting
        record_node(trial, node, config.derived)
        request = TrialRequest(
            number=trial.number,
            launch=launch,
            workload=study.objective.workload,
            startup_timeout_s=study.file.timeouts.startup_s,
            benchmark_timeout_s=study.file.timeouts.benchmark_s,
            seed=trial.number,
            plan=None if study.objective.is_job else self._measurement_plan(run, trial, baseline),
            job=study.objective.is_job,  # the launch measures itself (autotune.node.job)
            compile_cache=study.file.startup.compile_cache,
        )
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
        run.running[trial.number] = RunningTrial(
            trial, pool.submit(node, request), baseline, time.monotonic()
        )
        return True

    @staticmethod
    def _measurement_plan(run: RunState, trial: optuna.Trial, baseline: bool) -> MeasurementPlan:
        """What the node measures: the objective's ladder, its short run first with the pruner's cutoff now
        (never for the baseline, whose short value is a reference, nor for a re-measurement)."""
        objective = run.study.objective
        again = TrialRecord.of(trial).remeasure_of is not None
        cutoff = None
        if objective.short_first is not None and not (baseline or again):
            cutoff = short_cutoff(run.optuna_study, short_pruner(objective.short_first))
            if cutoff is not None:
                record_short_cutoff(trial, cutoff)
        search = objective.load_search
        below = None  # a search launch's load search stops below the study's best (measure.load_search)
        if search is not None and search.stop_below_best and not (baseline or again):
            below = load_cutoff(run.optuna_study)
        return plan_for(objective, short=not again, cutoff=cutoff, load_cutoff=below)

    # -- what the nodes are --------------------------------------------------------------------------------
    @staticmethod
    def _hardware(run: RunState, pool: NodePool, node: str) -> str | None:
        facts = pool.facts(node)
        hardware = facts.hardware if facts is not None else None
        run.hardware_by_node[node] = hardware
        return hardware

    @staticmethod
    def _flag_tables(pool: NodePool) -> list[FlagTable]:
        """The flags each idle node's server takes, where its node check learned them."""
        return [t for node in pool.idle_nodes() if (facts := pool.facts(node)) and (t := facts.server_flags)]

    @staticmethod
    def _dialect(run: RunState, pool: NodePool, node: str) -> Dialect | None:
        """How the server on `node` spells flags (from the node check), None where it was not learned."""
        facts = pool.facts(node)
        table = facts.server_flags if facts is not None else None
        if table is None:
            return None
        key = (table.version, table.digest)
        if key not in run.dialects:
            run.dialects[key] = Dialect(table, lambda text: run.observers.knob_held(KnobHeld(text)))
        return run.dialects[key]

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
        if result.server_choices and entry.baseline:
            # SGLang's own values: where the sampler starts the knobs with no "unset".
            record_server_choices(optuna_study, result.server_choices)
        learned = self._learn(run, trial, judged, result.node) if judged.failure is not None else None
        if (node_s := result.node_seconds) is not None:
            record_node_s(trial, node_s)
        optuna_study.tell(trial, judged.values, state=judged.state)
        with reads_once(optuna_study):  # the count and the summary read the same trials
            run.done = finished_count(optuna_study)
            summary = self._refresh_standing(run)
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

    @staticmethod
    def _learn(
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

    def _interrupt(
        self, run: RunState, pool: NodePool, *, record: bool = True, signum: int = signal.SIGINT
    ) -> None:
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
