"""The study loop: Optuna proposes, a node actor runs, the outcome goes back to Optuna and to MLflow.

The driver holds no GPU. It asks Optuna for a trial, turns it into a server launch through the search
space, hands it to a free node actor, and tells Optuna what happened. It never sees how a node runs
commands (local process or SSH); the node never sees Optuna.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.benchmark import Workload
from autotune.config import Study
from autotune.errors import AutotuneError, ForbiddenLaunchError
from autotune.failures import FailureKind
from autotune.incompatible import KnownIncompatibilities
from autotune.launch import TrialConfig, launch_script
from autotune.node import TrialRequest, TrialResult
from autotune.pool import NodePool, RayNodePool, Submitted
from autotune.study_storage import (
    BASELINE_ATTR,
    HEARTBEAT_S,
    SKIPPED_ATTR,
    abandoned_trials,
    budget_used,
    claim,
    enqueue_retry,
    finished_count,
    heartbeat,
    open_study,
    study_lock,
)
from autotune.tracking import NullTracker, StudyTracker

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


def recover_interrupted(ostudy: optuna.Study, tracker: StudyTracker) -> list[int]:
    """Trials a dead driver left RUNNING: FAIL them as interrupted, close their runs, enqueue them again."""
    recovered = []
    for trial in abandoned_trials(ostudy):
        ostudy._storage.set_trial_user_attr(trial._trial_id, "failure_kind", FailureKind.INTERRUPTED.value)
        ostudy.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        run_id = trial.user_attrs.get("mlflow_run_id")
        if run_id:
            tracker.close_interrupted(run_id)
        enqueue_retry(ostudy, trial.number, trial.params, trial.user_attrs)
        recovered.append(trial.number)
    return recovered


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
    ) -> None:
        """`sampler` and `storage` replace the study file's; `tracking=False` writes no MLflow runs. The
        three are for measuring the tuner itself over thousands of model trials (benchmarks/)."""
        self.study = study
        self.reporter = reporter
        self.make_pool = pool
        self.sampler = sampler
        self.storage = storage
        self.tracking = tracking
        self.kinds = {name: p.kind for name, p in study.search_space.parameters.items()}

    def run(self, n_trials: int | None = None, *, accept_changes: bool = False) -> optuna.Study:
        """Run trials until the study's budget (all drivers' trials count) or its timeout is reached."""
        study = self.study
        budget = n_trials or study.file.budget.n_trials
        deadline = time.monotonic() + study.file.budget.timeout_s if study.file.budget.timeout_s else None
        study.ensure_workdir()
        ostudy = open_study(study, accept_changes=accept_changes, sampler=self.sampler, storage=self.storage)
        self.known = KnownIncompatibilities(ostudy, study.search_space)
        self.base_sampler = ostudy.sampler
        ostudy.sampler = self.known.sampler(self.base_sampler)
        self.skips = 0
        tracker = (
            StudyTracker(
                study.tracking_uri, study.name, study.workdir / "artifacts", metric=study.objective.metric
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
        recovered = recover_interrupted(ostudy, tracker)
        if recovered:
            self.reporter("recovered", Progress(total=budget or 0), {"trials": recovered})
        pool = self.make_pool(study)
        progress = Progress(total=budget or 0, done=finished_count(ostudy))
        self._refresh_best(ostudy, progress)
        running: dict[int, _Running] = {}
        last_beat = time.monotonic()
        try:
            while True:
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
                    recover_interrupted(ostudy, tracker)  # trials of other drivers that died meanwhile
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
        blocked = self.known.blocking(trial.params)
        if blocked is not None:
            self._skip(ostudy, trial, f"{blocked[0]}={blocked[1]} failed deterministically on this hardware")
            return None
        self.skips = 0
        try:
            launch = study.server_launch(config)
        except ForbiddenLaunchError as exc:
            trial.set_user_attr("failure_kind", "forbidden")
            trial.set_user_attr("failure", str(exc))
            ostudy.tell(trial, state=TrialState.FAIL)
            progress.done = finished_count(ostudy)
            self.reporter(
                "finished", progress, {"number": trial.number, "state": "FAIL", "failure": str(exc)}
            )
            return None
        run_id = tracker.start_trial(trial.number, config, self.kinds, launch, baseline, node)
        trial.set_user_attr("mlflow_run_id", run_id)
        trial.set_user_attr("node", node)
        if config.derived:
            trial.set_user_attr("derived", {k: v for k, v in config.derived.items()})
        request = TrialRequest(
            number=trial.number,
            launch=launch,
            workload=Workload(**study.objective.workload.model_dump()),
            startup_timeout_s=study.file.timeouts.startup_s,
            benchmark_timeout_s=study.file.timeouts.benchmark_s,
            seed=trial.number,
        )
        progress.running[trial.number] = "launching"
        self.reporter(
            "started",
            progress,
            {"number": trial.number, "baseline": baseline, "node": node, "params": _changed(config)},
        )
        return _Running(trial, pool.submit(node, request), run_id, baseline, time.monotonic())

    def _skip(self, ostudy: optuna.Study, trial: optuna.Trial, why: str) -> None:
        """Record a proposal that is never launched; its known failure teaches the sampler nothing new."""
        self.skips += 1
        if self.skips > MAX_CONSECUTIVE_SKIPS:
            raise AutotuneError(
                f"the sampler proposed {MAX_CONSECUTIVE_SKIPS} known-incompatible trials in a row ({why}): "
                "remove the failing values from the search space"
            )
        trial.set_user_attr(SKIPPED_ATTR, True)
        trial.set_user_attr("failure_kind", "known_incompatible")
        trial.set_user_attr("failure", why)
        ostudy.tell(trial, state=TrialState.FAIL)

    def _poll_phases(
        self, tracker: StudyTracker, pool: NodePool, running: dict[int, _Running], progress: Progress
    ) -> None:
        for entry in running.values():
            phase = pool.phase(entry.submitted)
            if phase is None or phase in ("idle", "stopping") or phase == entry.phase:
                continue
            now = time.monotonic()
            tracker.set_phase(entry.run_id, phase, None)
            tracker.client.log_metric(entry.run_id, f"phase.{entry.phase}_s", now - entry.phase_started)
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
            trial.set_user_attr("server_pgid", result.server_pgid)
        if result.ok:
            assert result.benchmark is not None  # TrialResult.ok says so
            bench = asdict(result.benchmark)
            metrics.update({k: float(bench[k]) for k in BENCHMARK_METRICS if bench.get(k) is not None})
            if result.benchmark.accept_length is not None:
                metrics["accept_length"] = result.benchmark.accept_length
            value = objective.value(result.benchmark)
            trial.set_constraint(MEMORY_CONSTRAINT, 0.0)
            for key, amount in objective.constraints(result.benchmark).items():
                trial.set_constraint(key, amount)
            state = TrialState.COMPLETE
            ostudy.tell(trial, value)
        else:
            assert result.failure is not None  # a result that is not ok carries its failure
            failure = result.failure
            trial.set_user_attr("failure_kind", failure.kind.value)
            trial.set_user_attr("failure", failure.line[:500])
            trial.set_user_attr("advice", failure.advice)
            if failure.culprits:
                trial.set_user_attr("culprits", list(failure.culprits))
            tags.update(
                {
                    "autotune.failure_kind": failure.kind.value,
                    "autotune.advice": failure.advice,
                    "autotune.failure": failure.line[:500],
                }
            )
            if failure.kind.deterministic and self.known.learn(trial.params, failure):
                ostudy.sampler = self.known.sampler(self.base_sampler)
                self.reporter("learned", progress, {"incompatible": self.known.pairs})
            if failure.kind.retried_once:
                enqueue_retry(ostudy, trial.number, trial.params, trial.user_attrs)
            if failure.kind.is_oom:
                # Penalized and pruned: TPE learns the region is bad, constraint-aware samplers learn why.
                value = self.study.file.failures.oom_penalty
                trial.set_constraint(MEMORY_CONSTRAINT, 1.0)
                for key in objective.limits:
                    trial.set_constraint(key, 1.0)
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
            entry.trial.set_user_attr("failure_kind", FailureKind.INTERRUPTED.value)
            ostudy.tell(entry.trial, state=TrialState.FAIL)
            enqueue_retry(ostudy, number, entry.trial.params, entry.trial.user_attrs)
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
        tracker.update_summary(metrics, tags)
        tracker.refresh_study_view(ostudy, self.study)  # description, best launch.sh, plots (throttled)


def baseline_trial(ostudy: optuna.Study) -> FrozenTrial | None:
    """The completed baseline trial (SGLang's defaults), if there is one."""
    for trial in ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if trial.user_attrs.get(BASELINE_ATTR):
            return trial
    return None


def best_trial(ostudy: optuna.Study) -> FrozenTrial | None:
    """The best feasible COMPLETE trial, or None before any."""
    complete = ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    feasible = [t for t in complete if all(v <= 0 for v in t.constraints.values())] if complete else []
    if not feasible:
        return None
    maximize = ostudy.direction == optuna.study.StudyDirection.MAXIMIZE
    return (max if maximize else min)(feasible, key=lambda t: t.value if t.value is not None else 0.0)


def study_summary(ostudy: optuna.Study) -> dict[str, Any]:
    """Baseline, best, gain over the baseline, and trials counted by state and failure kind."""
    trials = ostudy.get_trials(deepcopy=False)
    states: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for trial in trials:
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
        kind = trial.user_attrs.get("failure_kind")
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    base, best = baseline_trial(ostudy), best_trial(ostudy)
    base_value = base.value if base else None
    best_value = best.value if best else None
    gain = None
    if base_value and best_value is not None:
        sign = 1 if ostudy.direction == optuna.study.StudyDirection.MAXIMIZE else -1
        gain = sign * (best_value - base_value) / abs(base_value) * 100
    return {
        "states": states,
        "failure_kinds": kinds,
        "baseline_value": base_value,
        "best_value": best_value,
        "best_trial": best.number if best else None,
        "gain_pct": gain,
    }


def _changed(config: TrialConfig) -> dict[str, object]:
    return {k: v for k, v in config.params.items() if v not in (None, False)}
