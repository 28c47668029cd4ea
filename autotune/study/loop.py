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
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.dialect import Dialect, FlagTable
from autotune.errors import STOP_SIGNALS, AutotuneError, ForbiddenLaunchError, interrupt, stop_signal
from autotune.measure.plan import MeasurementPlan, plan_for
from autotune.node.pool import NodePool, RayNodePool, Submitted
from autotune.study import node_budget, optuna_internals, outcome, samplers, screening, stages
from autotune.study.ablation import ablation_of
from autotune.study.before_launch import known_before_launch, remember_known_failures
from autotune.study.callbacks import (
    CallbackList,
    IncompatibilityLearned,
    KnobHeld,
    PhaseChanged,
    Progress,
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
from autotune.study.confirm import confirmation, confirmation_rounds
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.node_failing import node_failing, requeue_baseline
from autotune.study.noise import move_from, repeat_baseline
from autotune.study.outcome import Outcome
from autotune.study.preflight import beyond_memory_edge, predicted_oom
from autotune.study.pruning import short_cutoff, short_pruner
from autotune.study.records import (
    BASELINE_ATTR,
    DERIVED_ATTR,
    FAILURE_KIND_ATTR,
    HARDWARE_ATTR,
    LAUNCH_ATTR,
    NCCL_STAGE_ATTR,
    NODE_ATTR,
    NODE_S_ATTR,
    QUEUED_ATTR,
    REMEASURE_OF_ATTR,
    SERVER_CHOICES_ATTR,
    SHORT_CUTOFF_ATTR,
)
from autotune.study.rules import deliberate, earlier_launch, launch_identity
from autotune.study.stopping import record_stop, stopped_early, why_stop
from autotune.study.storage import (
    HEARTBEAT_S,
    abandoned_trials,
    budget_used,
    claim,
    counts,
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
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest, TrialResult

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

MAX_CONSECUTIVE_SKIPS = 200
# Proposals in a row of configs launched before: the sampler has nothing new to try, the search ends.
MAX_SAME_IN_A_ROW = 20
POLL_S = 0.5
INTERRUPT_WAIT_S = 60.0  # SGLang needs 10 to 15 s to stop; a node that does not answer is left to resume


class StudyInterrupted(AutotuneError):
    """Ctrl-C (or SIGTERM, SIGHUP: `signum`) stopped the study; the running trials were stopped and recorded
    as interrupted."""

    def __init__(self, what: str, signum: int = signal.SIGINT) -> None:
        self.signum = signal.Signals(signum)
        how = "interrupted" if self.signum is signal.SIGINT else f"stopped by {self.signum.name}"
        super().__init__(f"{how}{what}")


@dataclass
class _Running:
    trial: optuna.Trial
    submitted: Submitted
    baseline: bool
    started: float
    phase: str = "launching"
    phase_started: float = field(default_factory=time.monotonic)


def recover_interrupted(study: Study, ostudy: optuna.Study) -> list[FrozenTrial]:
    """Trials a dead driver left RUNNING: FAIL them as interrupted and enqueue them again; returns them as
    they were found (their runs are for the tracker to close)."""
    recovered = []
    with study_lock(study) as locked:
        abandoned = abandoned_trials(ostudy, locked=locked)
    for trial in abandoned:
        optuna_internals.set_user_attr(ostudy, trial, FAILURE_KIND_ATTR, FailureKind.INTERRUPTED.value)
        ostudy.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        # The queued values too: a trial enqueued (the baseline, a retry, a config queued by hand) and asked
        # for by a driver that died before suggesting them holds no params yet.
        params = {**optuna_internals.fixed_params(trial), **trial.params}
        enqueue_retry(ostudy, trial.number, params, trial.user_attrs, once=False)
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
    observers (`StudyCallback`: the tracker `tracking` makes, then `callbacks` in order)."""

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
    ) -> None:
        """`sampler` and `storage` replace the study file's; `tracking` makes the study's tracker (the CLI
        gives the MLflow one, autotune.views.tracked.study_tracker; None writes no runs);
        `preflight=False` launches predicted OOMs, `memory_edge=False` only those past the memory edge the
        study met, and `remember_incompatible=False` launches known incompatibilities again. They are for
        measuring the tuner itself (benchmarks/). `queued_only` runs the trials queued in the study and
        nothing else (no proposal, baseline repeat, screening, stopping rule or confirmation): `compare`'s
        rounds."""
        self.study = study
        self.callbacks = tuple(callbacks)
        self.make_pool = pool
        self.sampler = sampler
        self.storage = storage
        self.tracking = tracking
        self.preflight = preflight
        self.remember_incompatible = remember_incompatible
        self.memory_edge = memory_edge
        self.hours_from = "budget.node_hours"  # where the node-hour budget was given: `--hours` from the CLI
        self.queued_only = queued_only
        self._hardware_by_node: dict[str, str | None] = {}
        self._dialects: dict[tuple[str | None, str], Dialect] = {}  # one per server flag set: one notice each

    def run(self, n_trials: int | None = None, *, accept_changes: bool = False) -> optuna.Study:
        """Run trials until the study's budget (all drivers' trials count) or its timeout is reached."""
        study = self.study
        study.check_launchable()
        budget = n_trials or study.file.budget.n_trials
        deadline = time.monotonic() + study.file.budget.timeout_s if study.file.budget.timeout_s else None
        study.ensure_workdir()
        storage = self.storage if self.storage is not None else rdb_storage(study.storage)
        self.trials_before = trials_so_far(storage, study.name)  # before a new study's baseline is queued
        ostudy = open_study(study, accept_changes=accept_changes, sampler=self.sampler, storage=storage)
        if not self.queued_only:
            node_budget.check_budget(study, ostudy, self.hours_from)  # before any launch or write
            node_budget.record_budget(study, ostudy)
        self._ostudy = ostudy
        self.known = KnownIncompatibilities(ostudy, study.search_space)
        self.base_sampler = ostudy.sampler
        self.skips = self.same_in_a_row = 0
        self.running: dict[int, _Running] = {}
        self.searching = False
        # A search that stopped early stays stopped on a plain resume (which then finishes the confirmation);
        # a resume given --n-trials asks for more search.
        self.stopped: str | None = stopped_early(ostudy) if n_trials is None else None
        with study_lock(study):  # drivers starting together must not create the tracking store twice
            tracker = [self.tracking(study)] if self.tracking else []
        self.observers = CallbackList([*tracker, *self.callbacks])
        recovered = self._recover(ostudy)
        if not self.queued_only:
            requeue_baseline(study, ostudy)  # its node may have been fixed since (study.node_failing)
        self.total, self.done = budget or 0, finished_count(ostudy)
        self._refresh_standing(ostudy)
        self.observers.study_started(StudyStarted(study, tuple(recovered)))
        try:
            pool = self.make_pool(study)
        except KeyboardInterrupt as exc:  # Ctrl-C while Ray starts: no trial has started yet
            self.observers.study_ended(StudyEnded(study, ostudy, None))
            signum = stop_signal(exc)
            raise StudyInterrupted(" while the nodes started; no trial was running", signum) from None
        except BaseException:  # a node check refused the start: no parent run left RUNNING
            self.observers.study_ended(StudyEnded(study, ostudy, None))
            raise
        try:
            study.check_flags([t for node in pool.idle_nodes() if (t := self._flag_table(pool, node))])
            held = self._nccl_stage(ostudy, pool, storage, deadline, accept_changes)
        except BaseException:
            pool.close()
            raise
        self.stage_held = held
        self.flag_defaults = screening.flag_defaults(
            [t for node in pool.idle_nodes() if (t := self._flag_table(pool, node))]
        )
        screened = screening.held_knobs(ostudy)  # a resumed study holds what its screening held
        if held or screened:
            self.base_sampler = self._holding({**held, **screened})
            for line in screening.screened_lines(ostudy):
                self.observers.knob_held(KnobHeld(line))
        self.hardware = {self._hardware(pool, node) for node in pool.idle_nodes()}
        for node in pool.idle_nodes() if self.remember_incompatible else ():  # known before any launch
            facts, hardware = pool.facts(node), self._hardware_by_node[node]
            if notice := remember_known_failures(self.known, ostudy, study.search_space, facts, hardware):
                self.observers.knob_held(KnobHeld(notice))
        ostudy.sampler = self._sampler()
        try:
            with ctrl_c_remembered() as ctrl_c:
                self.searching = True
                self._trials(ostudy, pool, budget, deadline, ctrl_c)
                self.searching = False
                if self.stopped is not None:
                    self.observers.knob_held(KnobHeld(self.stopped))
                node_budget.clear_ran_out(ostudy)
                for total in () if self.queued_only else confirmation_rounds(study, ostudy, self._affordable):
                    self.total = total  # a round at a time (study.confirm), while the node hours pay for it
                    self._trials(ostudy, pool, total, None, ctrl_c)
        except KeyboardInterrupt as exc:
            self._interrupt(ostudy, pool)
            self.observers.study_ended(StudyEnded(study, ostudy, None))
            # The signal remembered: a KeyboardInterrupt caught and raised again on the way lost it.
            signum = ctrl_c.signum if ctrl_c.is_set() else stop_signal(exc)
            raise StudyInterrupted(": the running trials were stopped; resume to continue", signum) from None
        except Exception as exc:
            if (unwritable := storage_unwritable(study, exc)) is None:
                raise
            self._interrupt(ostudy, pool, record=False)  # the storage takes no more: a resume recovers them
            self.observers.study_ended(StudyEnded(study, ostudy, None))
            raise unwritable from exc
        finally:
            pool.close()
        self.observers.study_ended(StudyEnded(study, ostudy, study_summary(ostudy)))
        return ostudy

    def _trials(
        self,
        ostudy: optuna.Study,
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
                if not self._fill(ostudy, pool, node, budget, deadline):
                    break
            if not self.running:
                break
            for submitted, result in pool.wait(POLL_S):
                self._finish(ostudy, self.running.pop(submitted.request.number), result)
            self._poll_phases(pool)
            if time.monotonic() - last_beat > HEARTBEAT_S:
                heartbeat(ostudy, [entry.trial for entry in self.running.values()])
                self._recover(ostudy)  # other drivers that died meanwhile
                last_beat = time.monotonic()

    def _nccl_stage(
        self,
        ostudy: optuna.Study,
        pool: NodePool,
        storage: optuna.storages.BaseStorage,
        deadline: float | None,
        accept_changes: bool,
    ) -> dict[str, Any]:
        """Run the study's NCCL all-reduce stage on the pool (autotune.study.stages), or reuse the finished
        one a resumed study has; the NCCL values every server trial then holds ({} without a stage)."""
        study = self.study
        reason = stages.why_not(study)
        if reason is not None:
            if reason.startswith("skipped"):
                self.observers.knob_held(KnobHeld(f"NCCL stage {reason}"))
            return {}
        result = stages.finished_stage(study, storage)
        name = study.name + stages.STAGE_SUFFIX
        if result is None:
            # Its time counts against the study's: the stage gets what is left of it.
            left = None if deadline is None else max(deadline - time.monotonic(), 1e-3)
            stage = stages.stage_study(study, stages.smallest_gpu_gb(pool), left)
            driver = StudyDriver(
                stage,
                self.callbacks,
                pool=lambda _stage: stages.LentPool(pool),
                sampler=stages.CoordinateAscent(stages.stage_knobs(study)),
                storage=storage,
                tracking=self.tracking,
                preflight=False,  # a job loads no weights
            )
            try:
                trials = driver.run(accept_changes=accept_changes).get_trials(deepcopy=False)
            except StudyInterrupted:
                self.observers.study_ended(StudyEnded(study, ostudy, None))
                raise
            result = stages.stage_result(stages.stage_knobs(study), trials)
            if result is None:
                self.observers.knob_held(
                    KnobHeld(f"NCCL stage {name}: not finished in the study's time; no NCCL value is held")
                )
                return {}
        for line in result.lines(name):
            self.observers.knob_held(KnobHeld(line))
        ostudy.set_user_attr(NCCL_STAGE_ATTR, result.record())  # the answer names the values it held
        return result.held

    def _affordable(self, launches: int) -> bool:
        """Whether the node hours left pay for a confirmation round of `launches`; recorded when not."""
        ostudy = self._ostudy
        if node_budget.round_fits(self.study, ostudy, launches):
            return True
        state = confirmation(ostudy)
        node_budget.record_ran_out(self.study, ostudy, state.pairs if state is not None else 0)
        return False

    def _holding(self, held: dict[str, Any], trials_so_far: int | None = None) -> optuna.samplers.BaseSampler:
        """The study's sampler, holding the NCCL stage's values (and the knobs screening held): the study
        file's, built with them (tpe keeps them out of its moves), or the sampler given, with them fixed."""
        if self.sampler is None:
            so_far = self.trials_before if trials_so_far is None else trials_so_far
            return samplers.build(self.study.file.sampler, staged=held, trials_so_far=so_far)
        return optuna.samplers.PartialFixedSampler(held, self.sampler)

    def _sampler(self) -> optuna.samplers.BaseSampler:
        """The study's sampler now: its base, with what the study learned fixed (`KnownIncompatibilities`),
        its moves starting from a config tied with the best within noise when `trust.noise_ties` says so."""
        if isinstance(self.base_sampler, samplers.IncumbentMoves) and self.study.file.trust.noise_ties:
            self.base_sampler.reference = move_from
        return self.known.sampler(self.base_sampler, self.hardware)

    def _screen(self, ostudy: optuna.Study) -> None:
        """Queue screening's own launches when its method has them, hold the knobs it shows to have no
        effect beyond noise (said to the observers, kept in the study), and stop the search when no knob is
        left to search."""
        screening.plan_alone(self.study, ostudy, self.stage_held, self.flag_defaults)
        found = screening.screen(self.study, ostudy, self.stage_held, self.flag_defaults)
        if found:
            screening.record(ostudy, found)
            for held in found:
                self.observers.knob_held(KnobHeld(held.why))
            # A new seed from the trials so far: the file's again would replay the first proposals.
            held_now = {**self.stage_held, **screening.held_knobs(ostudy)}
            self.base_sampler = self._holding(held_now, len(ostudy.get_trials(deepcopy=False)))
            ostudy.sampler = self._sampler()
        why = screening.why_all_held(self.study, ostudy, self.stage_held)
        if why is not None:
            self.stopped = why
            record_stop(ostudy, why)

    def _recover(self, ostudy: optuna.Study) -> list[int]:
        recovered = recover_interrupted(self.study, ostudy)
        if recovered:
            self.observers.trials_recovered(TrialsRecovered(tuple(recovered)))
        return [trial.number for trial in recovered]

    def _progress(self, launching: int | None = None) -> Progress:
        """What a display shows now; `launching`: a trial about to be handed to its node."""
        best, baseline = self.standing
        phases = {number: entry.phase for number, entry in self.running.items()}
        if launching is not None:
            phases[launching] = "launching"
        return Progress(self.total, self.done, phases, best, baseline)

    def _refresh_standing(self, ostudy: optuna.Study) -> StudySummary:
        summary = study_summary(ostudy)
        self.standing = (summary.best_value, summary.baseline_value)
        return summary

    def _fill(
        self, ostudy: optuna.Study, pool: NodePool, node: str, budget: int | None, deadline: float | None
    ) -> bool:
        """Start the next trial on an idle node; False once the budget or the time is spent."""
        while True:
            with study_lock(self.study):  # other drivers of the study count and ask one at a time too
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                if budget is not None and budget_used(ostudy) >= budget:
                    return False
                if self.queued_only and not ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
                    return False
                if self.searching and self.stopped is None and not self.queued_only:
                    if (dead := node_failing(ostudy, self.trials_before)) is not None:
                        self.stopped = dead.text  # not recorded: a resume tries the node again
                        return False
                    hours = node_budget.node_hours(self.study, ostudy)
                    if not hours.search_may_launch(len(self.running)):
                        self.stopped = (  # recorded: a resume given more hours goes on to confirm
                            f"search ended: its share of the node-hour budget is spent ("
                            f"{hours.text().removeprefix('node hours: ')}); the rest pays for confirmation"
                        )
                        record_stop(ostudy, self.stopped)
                        return False
                    self.stopped = why_stop(self.study, ostudy)  # the stopping rule (study.stopping)
                    if self.stopped is not None:
                        record_stop(ostudy, self.stopped)
                    repeat_baseline(self.study, ostudy)  # the noise measured (study.noise)
                    self._screen(ostudy)  # knobs without effect held (study.screening)
                if self.searching and self.stopped is not None:
                    return False
                trial = ostudy.ask()
                claim(ostudy, trial)
            if self._start(ostudy, pool, node, trial):
                return True

    # -- one trial --------------------------------------------------------------------------------------
    def _start(self, ostudy: optuna.Study, pool: NodePool, node: str, trial: optuna.Trial) -> bool:
        """Launch `trial` on `node`, or record it at once when it must not be launched."""
        study = self.study
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
        config = study.search_space.baseline() if baseline else study.search_space.suggest(trial)
        hardware = self._hardware(pool, node)
        if hardware is not None:
            trial.set_user_attr(HARDWARE_ATTR, hardware)
        # Known before a launch (study.before_launch): a flag this GPU cannot run, a KV pool too small.
        refused = known_before_launch(
            study, ostudy, trial, pool.facts(node), gpu=self.remember_incompatible, memory=self.preflight
        )
        if refused is not None:
            self._skip(ostudy, trial, refused.why, oom=refused.oom)
            return False
        blocked = self.known.blocking(trial.params, hardware)
        if blocked is not None:
            where = f" ({hardware})" if hardware else ""
            self._skip(ostudy, trial, f"known incompatible with this node{where}: {blocked[0]}={blocked[1]}")
            return False
        # A config queued by hand runs as asked, even past the edge (a user may want to see it again).
        if self.preflight and self.memory_edge and not trial.user_attrs.get(QUEUED_ATTR):
            pruned = ostudy.get_trials(deepcopy=False, states=(TrialState.PRUNED,))
            edge = beyond_memory_edge(trial.params, hardware, pruned)
            if edge is not None:
                self._skip(ostudy, trial, edge, oom=True)
                return False
        try:
            launch = study.server_launch(config, dialect=self._dialect(pool, node))
            if (earlier := self._launched_before(ostudy, trial, launch)) is not None:
                self._same(ostudy, trial, earlier)
                return False
            reason = self._predicted_oom(pool, node, launch.argv) if self.preflight else None
            if reason is not None:
                self._skip(ostudy, trial, reason, oom=True)
                return False
        except ForbiddenLaunchError as exc:
            judged = outcome.refused(trial, FailureKind.FORBIDDEN, study.secrets.redact(str(exc)))
            ostudy.tell(trial, state=judged.state)
            self.done = finished_count(ostudy)
            self.observers.trial_finished(
                TrialFinished(
                    study=study,
                    number=trial.number,
                    baseline=baseline,
                    outcome=judged,
                    result=None,
                    launch=None,
                    elapsed_s=0.0,
                    progress=self._progress(),
                )
            )
            return False
        self.skips = self.same_in_a_row = 0  # a launch: the run of proposals that cannot run is broken
        launch = study.seeded(launch, trial.number)  # after the same-launch check: the seed is no setting
        trial.set_user_attr(NODE_ATTR, node)
        if config.derived:
            trial.set_user_attr(DERIVED_ATTR, {k: v for k, v in config.derived.items()})
        request = TrialRequest(
            number=trial.number,
            launch=launch,
            workload=study.objective.workload,
            startup_timeout_s=study.file.timeouts.startup_s,
            benchmark_timeout_s=study.file.timeouts.benchmark_s,
            seed=trial.number,
            plan=None if study.objective.is_job else self._measurement_plan(ostudy, trial, baseline),
            job=study.objective.is_job,  # the launch measures itself (autotune.node.job)
            compile_cache=study.file.startup.compile_cache,
        )
        self.observers.trial_started(  # before the node has it: a run to follow its phases in
            TrialStarted(
                study=study,
                trial=trial,
                node=node,
                baseline=baseline,
                config=config,
                launch=launch,
                ablation=ablation_of(trial, ostudy),
                progress=self._progress(launching=trial.number),
            )
        )
        self.running[trial.number] = _Running(trial, pool.submit(node, request), baseline, time.monotonic())
        return True

    def _measurement_plan(self, ostudy: optuna.Study, trial: optuna.Trial, baseline: bool) -> MeasurementPlan:
        """What the node measures: the objective's ladder, its short run first with the pruner's cutoff now
        (never for the baseline, whose short value is a reference, nor for a re-measurement)."""
        objective = self.study.objective
        again = REMEASURE_OF_ATTR in trial.user_attrs
        cutoff = None
        if objective.short_first is not None and not (baseline or again):
            cutoff = short_cutoff(ostudy, short_pruner(objective.short_first))
            if cutoff is not None:
                trial.set_user_attr(SHORT_CUTOFF_ATTR, cutoff)
        return plan_for(objective, short=not again, cutoff=cutoff)

    def _skip(self, ostudy: optuna.Study, trial: optuna.Trial, why: str, *, oom: bool = False) -> None:
        """Record a proposal that is never launched (`outcome.skipped`); too many in a row stop the study."""
        self._skip_counted(why)
        ostudy.tell(trial, state=outcome.skipped(self.study, trial, why, oom=oom).state)

    def _launched_before(
        self, ostudy: optuna.Study, trial: optuna.Trial, launch: ServerLaunch
    ) -> FrozenTrial | None:
        """The earlier trial that launched the same server (rules.same_launch), when this proposal must not
        launch it again: not a measurement asked for on purpose (`rules.deliberate`); records the launch on
        the trial."""
        identity = launch_identity(launch.argv, launch.env, self.study.secrets)
        trial.set_user_attr(LAUNCH_ATTR, identity)
        if not self.study.file.trust.skip_same_launch or deliberate(trial.user_attrs):
            return None
        counted = [t for t in ostudy.get_trials(deepcopy=False) if counts(t)]
        # A flag left unset is the server's own choice in the baseline, else its parser's default.
        unset = {**self.flag_defaults, **(ostudy.user_attrs.get(SERVER_CHOICES_ATTR) or {})}
        return earlier_launch(identity, counted, unset)

    def _skip_counted(self, why: str) -> None:
        self.skips += 1
        if self.skips > MAX_CONSECUTIVE_SKIPS:
            raise AutotuneError(
                f"the sampler proposed {MAX_CONSECUTIVE_SKIPS} trials in a row that cannot run ({why}): "
                "remove the failing values from the search space"
            )

    def _same(self, ostudy: optuna.Study, trial: optuna.Trial, earlier: FrozenTrial) -> None:
        """Record a proposal of a launch made before with that launch's result, without node time or budget
        (`outcome.same_as`); too many in a row stop the study as skips do."""
        self._skip_counted(f"the same launch as trial {earlier.number}")
        judged = outcome.same_as(trial, earlier)
        ostudy.tell(trial, judged.values, state=judged.state)
        self.same_in_a_row += 1
        if self.same_in_a_row >= MAX_SAME_IN_A_ROW and self.stopped is None:
            self.stopped = (
                f"stopped early: the sampler proposed {self.same_in_a_row} configs in a row that were "
                "launched before; the search space has nothing new to try"
            )
            record_stop(ostudy, self.stopped)

    def _hardware(self, pool: NodePool, node: str) -> str | None:
        facts = pool.facts(node)
        hardware = facts.hardware if facts is not None else None
        self._hardware_by_node[node] = hardware
        return hardware

    @staticmethod
    def _flag_table(pool: NodePool, node: str) -> FlagTable | None:
        facts = pool.facts(node)
        return facts.server_flags if facts is not None else None

    def _dialect(self, pool: NodePool, node: str) -> Dialect | None:
        """How the server on `node` spells flags (from the node check), None where it was not learned."""
        table = self._flag_table(pool, node)
        if table is None:
            return None
        key = (table.version, table.digest)
        if key not in self._dialects:
            self._dialects[key] = Dialect(table, lambda text: self.observers.knob_held(KnobHeld(text)))
        return self._dialects[key]

    def _predicted_oom(self, pool: NodePool, node: str, argv: tuple[str, ...]) -> str | None:
        """Why this launch would certainly run out of memory on `node`, from the node check's facts."""
        facts = pool.facts(node)
        declared = self.study.file.server.model_weight_gb
        weights = (
            declared
            if declared is not None
            else (facts.weight_bytes / 1e9 if facts is not None and facts.weight_bytes else None)
        )
        return predicted_oom(argv, facts.gpu_memory_gb if facts is not None else None, weights)

    def _poll_phases(self, pool: NodePool) -> None:
        for number, entry in self.running.items():
            phase = pool.phase(entry.submitted)
            if phase is None or phase in ("idle", "stopping") or phase == entry.phase:
                continue
            now = time.monotonic()
            previous, took = entry.phase, now - entry.phase_started
            entry.phase, entry.phase_started = phase, now
            self.observers.trial_phase_changed(PhaseChanged(number, phase, previous, took, self._progress()))

    def _finish(self, ostudy: optuna.Study, entry: _Running, result: TrialResult) -> None:
        """Judge the node's result, learn from a failure, tell Optuna, then the observers."""
        trial = entry.trial
        judged = outcome.judge(self.study, trial, result)
        if result.server_choices and entry.baseline:
            # SGLang's own values: where the sampler starts the knobs with no "unset".
            ostudy.set_user_attr(SERVER_CHOICES_ATTR, result.server_choices)
        learned = self._learn(ostudy, trial, judged, result.node) if judged.failure is not None else None
        if (node_s := result.node_seconds) is not None:
            trial.set_user_attr(NODE_S_ATTR, node_s)
        ostudy.tell(trial, judged.values, state=judged.state)
        self.done = finished_count(ostudy)
        summary = self._refresh_standing(ostudy)
        self.observers.trial_finished(
            TrialFinished(
                study=self.study,
                number=trial.number,
                baseline=entry.baseline,
                outcome=judged,
                result=result,
                launch=entry.submitted.request.launch,
                elapsed_s=time.monotonic() - entry.started,
                progress=self._progress(),
            )
        )
        if learned is not None:  # after the failed trial's row, so that it does not read as skipped
            self.observers.incompatibility_learned(learned)
        self.observers.summary_updated(SummaryUpdated(self.study, ostudy, summary))

    def _learn(
        self, ostudy: optuna.Study, trial: optuna.Trial, judged: Outcome, node: str
    ) -> IncompatibilityLearned | None:
        """After a failure: settings this hardware cannot run are not proposed again (what was learned is
        returned, for the observers), and a trial whose failure says nothing about its settings runs once
        more."""
        failure = judged.failure
        assert failure is not None
        hardware = self._hardware_by_node.get(node)
        learn = self.remember_incompatible and failure.kind.deterministic
        learned = None
        if learn and (new := self.known.learn(trial.params, failure, hardware)):
            ostudy.sampler = self._sampler()
            learned = IncompatibilityLearned(tuple(new), tuple(self.known.pairs))
        if failure.kind.retried_once:
            once = failure.kind is not FailureKind.INTERRUPTED
            enqueue_retry(ostudy, trial.number, trial.params, trial.user_attrs, once=once)
        return learned

    def _interrupt(self, ostudy: optuna.Study, pool: NodePool, *, record: bool = True) -> None:
        """First Ctrl-C: stop every running server, record the trials as interrupted (not in a storage that
        cannot be written: `record=False`), close their runs."""
        if record:
            self.observers.study_interrupting(StudyInterrupting(tuple(sorted(self.running))))
        pool.abort_all()
        logs: dict[int, str] = {}
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while len(logs) < len(self.running) and time.monotonic() < deadline:
            for submitted, result in pool.wait(POLL_S):
                logs[submitted.request.number] = result.log
        for number, entry in self.running.items():
            if record:
                ostudy.tell(entry.trial, state=outcome.interrupted(entry.trial).state)
                enqueue_retry(ostudy, number, entry.trial.params, entry.trial.user_attrs, once=False)
            self.observers.trial_interrupted(TrialInterrupted(number, entry.baseline, logs.get(number, "")))
