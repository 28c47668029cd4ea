"""The study loop: Optuna proposes, a node actor runs, the outcome goes back to Optuna and to MLflow.

The driver holds no GPU. It asks Optuna for a trial, turns it into a server launch through the search
space, hands it to a free node actor, and tells Optuna what happened. It never sees how a node runs
commands (local process or SSH); the node never sees Optuna.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from types import FrameType
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.dialect import Dialect
from autotune.errors import AutotuneError, ForbiddenLaunchError
from autotune.measure.client import BenchmarkResult, Workload
from autotune.measure.plan import MeasurementPlan, plan_for
from autotune.node.pool import NodePool, RayNodePool, Submitted
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.preflight import predicted_oom
from autotune.study.pruning import SHORT_STEP, short_cutoff, short_pruner
from autotune.study.records import (
    ACCEPT_LENGTH_ATTR,
    ADVICE_ATTR,
    BASELINE_ATTR,
    CULPRITS_ATTR,
    DERIVED_ATTR,
    FAILURE_ATTR,
    FAILURE_KIND_ATTR,
    HARDWARE_ATTR,
    LOAD_STOPPED_BY_ATTR,
    METRICS_ATTR,
    MLFLOW_RUN_ATTR,
    NODE_ATTR,
    OVER_LIMITS_ATTR,
    PRUNED_BY_ATTR,
    REMEASURE_OF_ATTR,
    SERVER_CHOICES_ATTR,
    SERVER_MEMORY_ATTR,
    SERVER_PGID_ATTR,
    SHORT_CUTOFF_ATTR,
    SHORT_VALUE_ATTR,
    SKIPPED_ATTR,
)
from autotune.study.remeasure import ConfigMeasurements, RemeasuredAnswer, remeasured_answer
from autotune.study.rules import best_measured, direction_sign, is_feasible
from autotune.study.storage import (
    HEARTBEAT_S,
    abandoned_trials,
    budget_used,
    claim,
    enqueue_retry,
    finished_count,
    heartbeat,
    open_study,
    study_lock,
)
from autotune.tracking.tracker import NullTracker, StudyTracker
from autotune.trial.failures import FailureKind
from autotune.trial.launch import TrialConfig, is_set, launch_script
from autotune.trial.wire import TrialRequest, TrialResult

optuna.logging.set_verbosity(optuna.logging.WARNING)
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

MAX_CONSECUTIVE_SKIPS = 200
MEMORY_CONSTRAINT = "memory"
POLL_S = 0.5
INTERRUPT_WAIT_S = 60.0  # SGLang needs 10 to 15 s to stop; a node that does not answer is left to resume
BENCHMARK_METRICS = (
    "output_throughput",
    "request_throughput",
    "input_throughput",
    "mean_ttft_ms",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "mean_itl_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "p50_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "duration_s",
    "completed",
    "failed",
    "time_scale",
    "request_goodput",
    "slo_attainment",
    "max_load",
)


class StudyInterrupted(AutotuneError):
    """Ctrl-C stopped the study; the running trials were stopped and recorded as interrupted."""


@dataclass
class Progress:
    """What the display shows: trial k of n, its phase, the best so far and the baseline."""

    total: int
    done: int = 0
    running: dict[int, str] = field(default_factory=dict)
    best: float | None = None
    baseline: float | None = None


Reporter = Callable[[str, Progress, dict[str, Any]], None]


def _quiet(event: str, progress: Progress, info: dict[str, Any]) -> None:
    """A reporter that shows nothing."""


@dataclass
class _Running:
    trial: optuna.Trial
    submitted: Submitted
    run_id: str
    baseline: bool
    started: float
    phase: str = "launching"
    phase_started: float = field(default_factory=time.monotonic)


def recover_interrupted(study: Study, ostudy: optuna.Study, tracker: StudyTracker) -> list[int]:
    """Trials a dead driver left RUNNING: FAIL them as interrupted, close their runs, enqueue them again."""
    recovered = []
    with study_lock(study) as locked:
        abandoned = abandoned_trials(ostudy, locked=locked)
    for trial in abandoned:
        ostudy._storage.set_trial_user_attr(trial._trial_id, FAILURE_KIND_ATTR, FailureKind.INTERRUPTED.value)
        ostudy.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        run_id = trial.user_attrs.get(MLFLOW_RUN_ATTR)
        if run_id:
            tracker.close_interrupted(run_id)
        enqueue_retry(ostudy, trial.number, trial.params, trial.user_attrs, once=False)
        recovered.append(trial.number)
    return recovered


@contextmanager
def ctrl_c_remembered() -> Iterator[threading.Event]:
    """Ctrl-C raises KeyboardInterrupt as usual and is also remembered, so that code which swallows it
    cannot make the study loop miss it (once a Ctrl-C between two trials was lost and the driver ran its
    study to the end; the call that swallowed it was not found). Only the main thread takes signals."""
    remembered = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield remembered
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        remembered.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield remembered
    finally:
        signal.signal(signal.SIGINT, previous)


class StudyDriver:
    """Runs a study to its budget: one trial per node at a time, every outcome told and tracked."""

    def __init__(
        self,
        study: Study,
        reporter: Reporter = _quiet,
        pool: Callable[[Study], NodePool] = RayNodePool,
        *,
        sampler: optuna.samplers.BaseSampler | None = None,
        storage: optuna.storages.BaseStorage | None = None,
        tracking: bool = True,
        preflight: bool = True,
        remember_incompatible: bool = True,
    ) -> None:
        """`sampler` and `storage` replace the study file's; `tracking=False` writes no MLflow runs;
        `preflight=False` launches predicted OOMs and `remember_incompatible=False` launches known
        incompatibilities again. They are for measuring the tuner itself (benchmarks/)."""
        self.study = study
        self.reporter = reporter
        self.make_pool = pool
        self.sampler = sampler
        self.storage = storage
        self.tracking = tracking
        self.preflight = preflight
        self.remember_incompatible = remember_incompatible
        self.kinds = {name: p.kind for name, p in study.search_space.parameters.items()}
        self._hardware_by_node: dict[str, str | None] = {}
        self._dialects: dict[tuple[str | None, str], Dialect] = {}  # one per server flag set: one notice each

    def run(self, n_trials: int | None = None, *, accept_changes: bool = False) -> optuna.Study:
        """Run trials until the study's budget (all drivers' trials count) or its timeout is reached."""
        study = self.study
        budget = n_trials or study.file.budget.n_trials
        deadline = time.monotonic() + study.file.budget.timeout_s if study.file.budget.timeout_s else None
        study.ensure_workdir()
        ostudy = open_study(study, accept_changes=accept_changes, sampler=self.sampler, storage=self.storage)
        self.known = KnownIncompatibilities(ostudy, study.search_space)
        self.base_sampler = ostudy.sampler
        self.skips = 0
        with study_lock(study):  # drivers starting together must not create the tracking store twice
            tracker = (
                StudyTracker(
                    study.tracking_uri,
                    study.name,
                    study.workdir / "artifacts",
                    metric=study.objective.metric,
                    secrets=study.secrets,
                )
                if self.tracking
                else NullTracker()
            )
        tracker.log_study_files(
            {
                "study.yaml": study.path.read_text(),
                "search_space.yaml": study.search_space_text,
                "objective.yaml": study.objective_text,
            }
        )
        recovered = recover_interrupted(self.study, ostudy, tracker)
        if recovered:
            self.reporter("recovered", Progress(total=budget or 0), {"trials": recovered})
        pool = self.make_pool(study)
        self.hardware = {self._hardware(pool, node) for node in pool.idle_nodes()}
        ostudy.sampler = self.known.sampler(self.base_sampler, self.hardware)
        progress = Progress(total=budget or 0, done=finished_count(ostudy))
        self._refresh_best(ostudy, progress)
        running: dict[int, _Running] = {}
        last_beat = time.monotonic()
        try:
            with ctrl_c_remembered() as ctrl_c:
                while True:
                    if ctrl_c.is_set():  # a Ctrl-C that something below turned into another error
                        raise KeyboardInterrupt
                    for node in pool.idle_nodes():
                        entry = self._fill(ostudy, tracker, pool, node, progress, budget, deadline)
                        if entry is None:
                            break
                        running[entry.trial.number] = entry
                    if not running:
                        break
                    for submitted, result in pool.wait(POLL_S):
                        entry = running.pop(submitted.request.number)
                        self._finish(ostudy, tracker, entry, result, progress)
                    self._poll_phases(tracker, pool, running, progress)
                    if time.monotonic() - last_beat > HEARTBEAT_S:
                        heartbeat(ostudy, [entry.trial for entry in running.values()])
                        recover_interrupted(self.study, ostudy, tracker)  # other drivers that died meanwhile
                        last_beat = time.monotonic()
        except KeyboardInterrupt:
            self._interrupt(ostudy, tracker, pool, running, progress)
            tracker.close("KILLED")
            raise StudyInterrupted(
                "interrupted: the running trials were stopped; resume to continue"
            ) from None
        finally:
            pool.close()
        self._summarize(ostudy, tracker)
        tracker.close()
        return ostudy

    def _fill(
        self,
        ostudy: optuna.Study,
        tracker: StudyTracker,
        pool: NodePool,
        node: str,
        progress: Progress,
        budget: int | None,
        deadline: float | None,
    ) -> _Running | None:
        """Start the next trial on an idle node; None once the budget or the time is spent."""
        while True:
            with study_lock(self.study):  # other drivers of the study count and ask one at a time too
                if deadline is not None and time.monotonic() >= deadline:
                    return None
                if budget is not None and budget_used(ostudy) >= budget:
                    return None
                trial = ostudy.ask()
                claim(ostudy, trial)
            entry = self._start(ostudy, tracker, pool, node, trial, progress)
            if entry is not None:
                return entry

    # -- one trial --------------------------------------------------------------------------------------
    def _start(
        self,
        ostudy: optuna.Study,
        tracker: StudyTracker,
        pool: NodePool,
        node: str,
        trial: optuna.Trial,
        progress: Progress,
    ) -> _Running | None:
        """Launch `trial` on `node`, or record it at once when it must not be launched."""
        study = self.study
        baseline = bool(trial.user_attrs.get(BASELINE_ATTR))
        config = study.search_space.baseline() if baseline else study.search_space.suggest(trial)
        hardware = self._hardware(pool, node)
        if hardware is not None:
            trial.set_user_attr(HARDWARE_ATTR, hardware)
        blocked = self.known.blocking(trial.params, hardware)
        if blocked is not None:
            where = f" ({hardware})" if hardware else ""
            self._skip(ostudy, trial, f"known incompatible with this node{where}: {blocked[0]}={blocked[1]}")
            return None
        try:
            launch = study.server_launch(config, dialect=self._dialect(pool, node, progress))
            reason = self._predicted_oom(pool, node, launch.argv) if self.preflight else None
            if reason is not None:
                self._skip(ostudy, trial, reason, oom=True)
                return None
        except ForbiddenLaunchError as exc:
            trial.set_user_attr(FAILURE_KIND_ATTR, FailureKind.FORBIDDEN.value)
            trial.set_user_attr(FAILURE_ATTR, study.secrets.redact(str(exc)))
            ostudy.tell(trial, state=TrialState.FAIL)
            progress.done = finished_count(ostudy)
            self.reporter(
                "finished",
                progress,
                {"number": trial.number, "state": "FAIL", "failure": study.secrets.redact(str(exc))},
            )
            return None
        self.skips = 0  # a launch: the run of proposals that cannot run is broken
        run_id = tracker.start_trial(trial.number, config, self.kinds, launch, baseline, node)
        trial.set_user_attr(MLFLOW_RUN_ATTR, run_id)
        trial.set_user_attr(NODE_ATTR, node)
        if config.derived:
            trial.set_user_attr(DERIVED_ATTR, {k: v for k, v in config.derived.items()})
        request = TrialRequest(
            number=trial.number,
            launch=launch,
            workload=Workload(**study.objective.workload.model_dump()) if study.objective.workload else None,
            startup_timeout_s=study.file.timeouts.startup_s,
            benchmark_timeout_s=study.file.timeouts.benchmark_s,
            seed=trial.number,
            plan=None if study.objective.is_job else self._measurement_plan(ostudy, trial, baseline),
            job=study.objective.is_job,  # the launch measures itself (autotune.node.job)
        )
        progress.running[trial.number] = "launching"
        self.reporter(
            "started",
            progress,
            {"number": trial.number, "baseline": baseline, "node": node, "params": _changed(config)},
        )
        return _Running(trial, pool.submit(node, request), run_id, baseline, time.monotonic())

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

    def _tell_measured(
        self, ostudy: optuna.Study, trial: optuna.Trial, measured: BenchmarkResult, tags: dict[str, str]
    ) -> tuple[float, TrialState]:
        """Tell Optuna a measured trial: its limits as constraints (and by how much each was broken), its
        short measurement as the intermediate value, then PRUNED (stopped after it) or COMPLETE."""
        objective = self.study.objective
        trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
        over = {}
        for check in objective.limit_checks(measured):
            trial.set_constraint(check.metric, check.excess)
            if check.violated:
                over[check.metric] = {
                    "limit": check.limit,
                    "measured": check.measured,
                    "excess": check.excess,
                    "concurrency": check.concurrency,
                    "text": check.describe(),
                }
        if over:
            trial.set_user_attr(OVER_LIMITS_ATTR, over)
            tags["autotune.over_limits"] = "; ".join(str(v["text"]) for v in over.values())[:500]
        if measured.accept_length is not None:  # the default sampler steers the speculative tree by it
            trial.set_user_attr(ACCEPT_LENGTH_ATTR, measured.accept_length)
        if measured.load_stopped_by is not None:
            trial.set_user_attr(LOAD_STOPPED_BY_ATTR, measured.load_stopped_by)
            tags["autotune.load_stopped_by"] = measured.load_stopped_by[:500]
        short = measured if measured.stopped_early else measured.short
        if short is not None and not objective.is_multi_objective:
            short_value = objective.value(short)
            trial.set_user_attr(SHORT_VALUE_ATTR, short_value)
            trial.report(short_value, SHORT_STEP)
            if measured.stopped_early:
                cutoff = trial.user_attrs.get(SHORT_CUTOFF_ATTR)
                why = (
                    f"short measurement: {objective.metric} {short_value:.4g} worse than the pruner's "
                    f"cutoff {cutoff:.4g}"
                )
                trial.set_user_attr(PRUNED_BY_ATTR, why)
                tags["autotune.pruned_by"] = why
                ostudy.tell(trial, state=TrialState.PRUNED)  # stored value: the short one, reported above
                return short_value, TrialState.PRUNED
        values = objective.values(measured)
        if objective.is_multi_objective:
            tags["autotune.values"] = json.dumps(dict(zip(objective.metrics, values, strict=True)))
            ostudy.tell(trial, values)
        else:
            ostudy.tell(trial, values[0])
        return values[0], TrialState.COMPLETE

    def _tell_job(
        self, ostudy: optuna.Study, trial: optuna.Trial, measured: dict[str, float]
    ) -> tuple[float, TrialState]:
        """Tell Optuna a job trial's metrics (kept as the `metrics` attribute, intervals included), its
        limits as constraints; COMPLETE."""
        objective = self.study.objective
        trial.set_user_attr(METRICS_ATTR, measured)
        trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
        for key, amount in objective.constraints(measured).items():
            trial.set_constraint(key, amount)
        values = objective.values(measured)
        ostudy.tell(trial, values if objective.is_multi_objective else values[0])
        return values[0], TrialState.COMPLETE

    def _skip(self, ostudy: optuna.Study, trial: optuna.Trial, why: str, *, oom: bool = False) -> None:
        """Record a proposal that is never launched, costing no node time nor budget: a known
        incompatibility (FAIL), or a predicted OOM (PRUNED with the penalty, so samplers learn from it)."""
        self.skips += 1
        if self.skips > MAX_CONSECUTIVE_SKIPS:
            raise AutotuneError(
                f"the sampler proposed {MAX_CONSECUTIVE_SKIPS} trials in a row that cannot run ({why}): "
                "remove the failing values from the search space"
            )
        trial.set_user_attr(SKIPPED_ATTR, True)
        trial.set_user_attr(
            FAILURE_KIND_ATTR, (FailureKind.PREDICTED_OOM if oom else FailureKind.KNOWN_INCOMPATIBLE).value
        )
        trial.set_user_attr(FAILURE_ATTR, why)
        if not oom:
            ostudy.tell(trial, state=TrialState.FAIL)
            return
        trial.set_constraint(MEMORY_CONSTRAINT, 1.0)
        trial.report(self.study.file.failures.oom_penalty, 0)
        ostudy.tell(trial, state=TrialState.PRUNED)

    def _hardware(self, pool: NodePool, node: str) -> str | None:
        facts = pool.facts(node)
        hardware = facts.hardware if facts is not None else None
        self._hardware_by_node[node] = hardware
        return hardware

    def _dialect(self, pool: NodePool, node: str, progress: Progress) -> Dialect | None:
        """How the server on `node` spells flags (from the node check), None where it was not learned."""
        facts = pool.facts(node)
        table = facts.server_flags if facts is not None else None
        if table is None:
            return None
        key = (table.version, table.digest)
        if key not in self._dialects:
            self._dialects[key] = Dialect(table, lambda text: self.reporter("held", progress, {"text": text}))
        return self._dialects[key]

    def _hardware_of(self, node: str) -> str | None:
        return self._hardware_by_node.get(node)

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

    def _poll_phases(
        self, tracker: StudyTracker, pool: NodePool, running: dict[int, _Running], progress: Progress
    ) -> None:
        for entry in running.values():
            phase = pool.phase(entry.submitted)
            if phase is None or phase in ("idle", "stopping") or phase == entry.phase:
                continue
            now = time.monotonic()
            tracker.set_phase(entry.run_id, phase, None)
            tracker.phase_took(entry.run_id, entry.phase, now - entry.phase_started)
            entry.phase, entry.phase_started = phase, now
            progress.running[entry.trial.number] = phase
            self.reporter("phase", progress, {"number": entry.trial.number, "phase": phase})

    def _finish(
        self,
        ostudy: optuna.Study,
        tracker: StudyTracker,
        entry: _Running,
        result: TrialResult,
        progress: Progress,
    ) -> None:
        trial, objective = entry.trial, self.study.objective
        value: float | None = None
        metrics: dict[str, float] = {"trial_s": time.monotonic() - entry.started}
        if result.startup_s is not None:
            metrics["startup_s"] = result.startup_s
        if result.benchmark_s is not None:
            metrics["benchmark_s"] = result.benchmark_s
        tags = {"autotune.node": result.node}
        if result.server_pgid is not None:
            trial.set_user_attr(SERVER_PGID_ATTR, result.server_pgid)
        if result.server_memory:
            trial.set_user_attr(SERVER_MEMORY_ATTR, result.server_memory)
        if result.server_choices:
            trial.set_user_attr(SERVER_CHOICES_ATTR, result.server_choices)
            if entry.baseline:  # SGLang's own values: where the sampler starts the knobs with no "unset"
                ostudy.set_user_attr(SERVER_CHOICES_ATTR, result.server_choices)
        if result.ok and result.benchmark is None:  # a job trial: its metrics are its measurement
            metrics.update(result.metrics)
            value, state = self._tell_job(ostudy, trial, result.metrics)
        elif result.ok:
            assert result.benchmark is not None  # TrialResult.ok says so
            metrics.update(measurement_metrics(result.benchmark))
            value, state = self._tell_measured(ostudy, trial, result.benchmark, tags)
        else:
            assert result.failure is not None  # a result that is not ok carries its failure
            failure = result.failure
            trial.set_user_attr(FAILURE_KIND_ATTR, failure.kind.value)
            trial.set_user_attr(FAILURE_ATTR, self.study.secrets.redact(failure.line)[:500])
            trial.set_user_attr(ADVICE_ATTR, failure.advice)
            if failure.culprits:
                trial.set_user_attr(CULPRITS_ATTR, list(failure.culprits))
            tags.update(
                {
                    "autotune.failure_kind": failure.kind.value,
                    "autotune.advice": failure.advice,
                    "autotune.failure": failure.line[:500],
                }
            )
            hardware = self._hardware_of(result.node)
            learn = self.remember_incompatible and failure.kind.deterministic
            if learn and self.known.learn(trial.params, failure, hardware):
                ostudy.sampler = self.known.sampler(self.base_sampler, self.hardware)
                self.reporter("learned", progress, {"incompatible": self.known.pairs})
            if failure.kind.retried_once:
                once = failure.kind is not FailureKind.INTERRUPTED
                enqueue_retry(ostudy, trial.number, trial.params, trial.user_attrs, once=once)
            if failure.kind.is_oom:
                # Penalized and pruned: TPE learns the region is bad, constraint-aware samplers learn why.
                value = self.study.file.failures.oom_penalty
                trial.set_constraint(MEMORY_CONSTRAINT, 1.0)
                for key in objective.limits:
                    trial.set_constraint(key, 1.0)
                if objective.is_multi_objective:
                    value = None  # multi-objective trials cannot report(): pruned without a value
                else:
                    trial.report(value, 0)
                state = TrialState.PRUNED
            else:
                state = TrialState.FAIL
            ostudy.tell(trial, state=state)
        artifacts = {
            "server.log": result.log,
            "result.json": json.dumps(result.summary(), indent=2, default=str),
        }
        if result.benchmark is not None:
            artifacts["benchmark.json"] = result.benchmark.to_json()
        if result.details:
            artifacts["job_result.json"] = json.dumps(result.details, indent=2)
        launch = entry.submitted.request.launch
        if result.port and result.port != launch.port:  # `port: auto`: the script gets the port used
            artifacts["launch.sh"] = launch_script(launch.with_port(result.port))
        tracker.finish_trial(
            entry.run_id,
            number=trial.number,
            state=state.name,
            value=value,
            baseline=entry.baseline,
            metrics=metrics,
            tags=tags,
            artifacts=artifacts,
        )
        progress.done = finished_count(ostudy)
        progress.running.pop(trial.number, None)
        self._refresh_best(ostudy, progress)
        self.reporter(
            "finished",
            progress,
            {
                "number": trial.number,
                "state": state.name,
                "value": value,
                "baseline": entry.baseline,
                "failure": result.failure.kind.value if result.failure else None,
            },
        )
        self._summarize(ostudy, tracker)

    def _interrupt(
        self,
        ostudy: optuna.Study,
        tracker: StudyTracker,
        pool: NodePool,
        running: dict[int, _Running],
        progress: Progress,
    ) -> None:
        """First Ctrl-C: stop every running server, record the trials as interrupted, close their runs."""
        self.reporter("interrupting", progress, {"trials": sorted(running)})
        pool.abort_all()
        logs: dict[int, str] = {}
        deadline = time.monotonic() + INTERRUPT_WAIT_S
        while len(logs) < len(running) and time.monotonic() < deadline:
            for submitted, result in pool.wait(POLL_S):
                logs[submitted.request.number] = result.log
        for number, entry in running.items():
            entry.trial.set_user_attr(FAILURE_KIND_ATTR, FailureKind.INTERRUPTED.value)
            ostudy.tell(entry.trial, state=TrialState.FAIL)
            enqueue_retry(ostudy, number, entry.trial.params, entry.trial.user_attrs, once=False)
            log = logs.get(number, "")
            tracker.finish_trial(
                entry.run_id,
                number=number,
                state="INTERRUPTED",
                value=None,
                baseline=entry.baseline,
                metrics={},
                tags={"autotune.failure_kind": FailureKind.INTERRUPTED.value},
                artifacts={"server.log": log} if log else {},
            )

    # -- summary ----------------------------------------------------------------------------------------
    def _refresh_best(self, ostudy: optuna.Study, progress: Progress) -> None:
        summary = study_summary(ostudy)
        progress.best = summary["best_value"]
        progress.baseline = summary["baseline_value"]

    def _summarize(self, ostudy: optuna.Study, tracker: StudyTracker) -> None:
        summary = study_summary(ostudy)
        metrics = {f"trials_{k.lower()}": float(v) for k, v in summary["states"].items()}
        for key in ("best_value", "baseline_value", "gain_pct"):
            if summary[key] is not None:
                metrics[key] = summary[key]
        tags = {"autotune.best_trial": str(summary["best_trial"])}
        tags.update({f"autotune.failures.{k}": str(v) for k, v in summary["failure_kinds"].items()})
        tags.update(self._answer_tags(ostudy, tracker, summary, metrics))
        tracker.update_summary(metrics, tags)
        tracker.refresh_study_view(ostudy, self.study)  # description, best launch.sh, plots (throttled)

    def _answer_tags(
        self, ostudy: optuna.Study, tracker: StudyTracker, summary: dict[str, Any], metrics: dict[str, float]
    ) -> dict[str, str]:
        """The study's answer beyond one best value, for its MLflow parent run: the Pareto front (and each
        trial run tagged `autotune.pareto` while it is on it), or the re-measured mean and gain."""
        tags: dict[str, str] = {}
        remeasured = summary.get("remeasured")
        if remeasured is not None:
            tags["autotune.remeasured"] = json.dumps(remeasured)[:5000]
            for key in ("gain_ci_low_pct", "gain_ci_high_pct"):
                if remeasured[key] is not None:
                    metrics[key] = remeasured[key]
            tags["autotune.within_noise"] = str(remeasured["within_noise"]).lower()
        front = summary.get("pareto")
        if front is None:
            return tags
        names = self.study.objective.metrics
        tags["autotune.pareto_front"] = json.dumps(
            [{"trial": p["number"], **dict(zip(names, p["values"], strict=True))} for p in front]
        )[:5000]
        members = {p["number"] for p in front}
        tagged: set[int] = getattr(self, "_pareto_tagged", set())
        if not isinstance(tracker, NullTracker):
            for trial in ostudy.get_trials(deepcopy=False):
                run_id = trial.user_attrs.get(MLFLOW_RUN_ATTR)
                if run_id and (trial.number in members) != (trial.number in tagged):
                    tracker.client.set_tag(run_id, "autotune.pareto", str(trial.number in members).lower())
        self._pareto_tagged = members
        return tags


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
    signs = [direction_sign(d) for d in ostudy.directions]
    complete = [
        t
        for t in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values is not None and is_feasible(t)
    ]

    def dominates(a: FrozenTrial, b: FrozenTrial) -> bool:
        better = [s * x for s, x in zip(signs, a.values, strict=True)]
        worse = [s * y for s, y in zip(signs, b.values, strict=True)]
        return all(x >= y for x, y in zip(better, worse, strict=True)) and better != worse

    return sorted((t for t in complete if not any(dominates(o, t) for o in complete)), key=lambda t: t.number)


def best_trial(ostudy: optuna.Study) -> FrozenTrial | None:
    """The best feasible COMPLETE trial, or None before any (and in a multi-objective study, whose answer is
    its `pareto_front`). Once configs were re-measured, the first trial of the config with the best mean."""
    if len(ostudy.directions) > 1:
        return None
    answer = remeasured_answer(ostudy)
    if answer is not None:
        return next(t for t in ostudy.get_trials(deepcopy=False) if t.number == answer.best.of)
    return best_measured(ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), ostudy.direction)


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
    if len(ostudy.directions) > 1:
        front = pareto_front(ostudy)
        return {
            "states": states,
            "failure_kinds": kinds,
            "baseline_value": None,
            "best_value": None,
            "best_trial": None,
            "gain_pct": None,
            "pareto": [{"number": t.number, "values": list(t.values or [])} for t in front],
            "remeasured": None,
        }
    base, best = baseline_trial(ostudy), best_trial(ostudy)
    base_value = base.value if base else None
    best_value = best.value if best else None
    gain = None
    if base_value and best_value is not None:
        sign = direction_sign(ostudy.direction)
        gain = sign * (best_value - base_value) / abs(base_value) * 100
    answer = remeasured_answer(ostudy)
    remeasured = None
    if answer is not None:
        # The answer is a mean now: the best config's and the baseline's, and the gain between them.
        best_value = answer.best.mean
        if answer.baseline is not None and answer.baseline.n:
            base_value = answer.baseline.mean
        gain = answer.gain.pct if answer.gain is not None else None
        remeasured = remeasured_summary(answer)
    return {
        "states": states,
        "failure_kinds": kinds,
        "baseline_value": base_value,
        "best_value": best_value,
        "best_trial": best.number if best else None,
        "gain_pct": gain,
        "pareto": None,
        "remeasured": remeasured,
    }


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


def measurement_metrics(measured: BenchmarkResult) -> dict[str, float]:
    """A measurement's MLflow metrics: the combined figures, each ladder level's under `c{concurrency}.`,
    and the short measurement's under `short.`."""

    def figures(result: BenchmarkResult, prefix: str = "") -> dict[str, float]:
        bench = asdict(result)
        out = {prefix + k: float(bench[k]) for k in BENCHMARK_METRICS if bench.get(k) is not None}
        if result.accept_length is not None:
            out[prefix + "accept_length"] = result.accept_length
        return out

    metrics = figures(measured)
    for index, level in enumerate(measured.levels):
        if measured.max_load is None:
            metrics.update(figures(level, f"c{level.workload.concurrency}."))
            continue
        # A load search's steps, in the order measured: each with the load it sent.
        metrics.update(figures(level, f"step{index}."))
        metrics[f"step{index}.request_rate"] = level.workload.request_rate or 0.0
        metrics[f"step{index}.concurrency"] = float(level.workload.concurrency)
    if measured.short is not None:
        metrics.update(figures(measured.short, "short."))
    return metrics


def _changed(config: TrialConfig) -> dict[str, object]:
    return {k: v for k, v in config.params.items() if is_set(v)}
