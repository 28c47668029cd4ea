"""MLflow records: one experiment and one parent run per study, one child run per trial.

The tracker is a `StudyCallback` of the study loop, its only writer: no tracking is not registering it.
Child runs are created when a trial starts (so a running trial shows in
the UI with its phase) and finished with its state; a retried trial gets a new run, since MLflow params
are immutable. Run names read at a glance in the run list (`#004 · PRUNED · kv_pool_too_small`);
a run's description (MLflow's note) says why it failed and what to try; the parent run's description is
the study summary with the best config's launch script, and its artifacts hold the study's plots,
redrawn as the study goes (at most every PLOT_INTERVAL_S seconds and PLOT_TIME_SHARE of the time, and
once more when it closes).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import closing, contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from autotune.measure.metrics import BENCHMARK_FIGURES
from autotune.study.callbacks import (
    PhaseChanged,
    StudyCallback,
    StudyEnded,
    StudyStarted,
    SummaryUpdated,
    TrialFinished,
    TrialInterrupted,
    TrialsRecovered,
    TrialStarted,
)
from autotune.study.records import TrialRecord, record_mlflow_run
from autotune.study.store_failure import short_reason
from autotune.study.trust.answer import StudyAnswer, remeasured_record
from autotune.study.trust.node_budget import spent_s
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch, TrialConfig, launch_script, redact_argv, redact_env
from autotune.trial.redaction import Secrets

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.config import Study
    from autotune.measure.client import BenchmarkResult

log = logging.getLogger(__name__)
_Event = TypeVar("_Event")

STUDY_TAG = "autotune.study"
TRIAL_TAG = "autotune.trial"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"  # shown as the run's description in the UI (markdown)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MAX_PARAM_LENGTH = 6000
MAX_NOTE_LENGTH = 7500  # MLflow caps tag values at 8000 characters
PLOT_INTERVAL_S = 30.0  # plots cost a second or two; a trial on a real node takes minutes
# ... and they take at most this share of a study's time: where trials take seconds (the simulated node) on
# a busy machine, a draw took 4 s of every 30 (the quickstart, 2 cores), and then waits 80 s for the next.
PLOT_TIME_SHARE = 0.05
PLOTS_DIR = "plots"
BEST_LAUNCH_SCRIPT = "best/launch.sh"
ABLATION_OF_TAG = "autotune.ablation_of"
ABLATION_PARAM_TAG = "autotune.ablation_param"
METRIC_TAG = "autotune.metric"  # on the experiment: the objective its trial runs log as a metric
BEST_TAG = "autotune.best"  # "true" on the run of the study's best trial, "false" on the one it replaced
RANK_METRIC = "study_rank"  # 1: the study's best trial, then the others by value (`autotune ui` sorts by it)


class StudyPage(Protocol):
    """What a study's parent run shows of it, drawn by the views (autotune.views.tracked): the tracker
    records what it is given and draws nothing itself."""

    def summary(self, study: Study, optuna_study: optuna.Study) -> tuple[str, str | None]:
        """The study summary in markdown, and the best config's launch script (None before a best)."""

    def plots(
        self, optuna_study: optuna.Study, metric: str, unit: str, title: str, folder: Path
    ) -> list[Path]:
        """Draw the study's plots into `folder`; the files written."""


def _quiet_mlflow() -> None:
    # MLflow logs its database migrations at INFO and configures its loggers when imported; they drown
    # the study's own progress lines.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    # A write its database refuses (a full disk) is logged with a traceback before it raises; the tracker
    # says it once, in a line (StudyTracker._writing).
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def param_name(name: str, kind: str) -> str:
    """MLflow name of a search-space parameter: grouped by kind (nccl., sglang., spec.)."""
    prefix = {"nccl": "nccl", "sglang": "sglang", "speculative": "spec"}[kind]
    return f"{prefix}.{name.lstrip('-')}"


def metric_unit(metric: str) -> str:
    """The unit of an objective metric, as a run name shows it."""
    if metric.endswith("_ms"):
        return "ms"
    if metric.endswith("_us"):
        return "us"
    if metric.endswith("_mib"):
        return "MiB"
    return {"output_throughput": "tok/s", "input_throughput": "tok/s", "request_throughput": "req/s"}.get(
        metric, ""
    )


def run_name(
    number: int,
    state: str,
    value: float | None,
    baseline: bool,
    unit: str = "tok/s",
    detail: str | None = None,
) -> str:
    """A child run's name, readable at a glance in the run list (which cuts names short): the trial number,
    then its value when it completed (`#005 · 212.4 tok/s · COMPLETE`), else its state and `detail`, the
    failure kind or a running trial's phase (`#003 · PRUNED · kv_pool_too_small`)."""
    label = f"#{number:03d}" + (" baseline" if baseline else "")
    if state.upper() == "COMPLETE" and value is not None:
        return " · ".join([label, f"{value:.1f} {unit}".strip(), "COMPLETE"])
    return " · ".join([label, state.upper(), *([detail] if detail else [])])


def ablation_label(of: int, param: str) -> str:
    """What an ablation trial's run name adds: the setting it reverts, and the trial it ablates."""
    return f"without {param} (ablation of #{of:03d})"


def failure_note(state: str, kind: str, advice: str | None, line: str | None) -> str:
    """A failed trial's run description: what happened and what to try, in markdown."""
    parts = [f"**{state}: {kind}**"]
    if advice:
        parts.append(advice)
    if line:
        parts.append(f"```\n{line}\n```")
    return "\n\n".join(parts)[:MAX_NOTE_LENGTH]


def sqlite_path(tracking_uri: str) -> Path | None:
    """The database file of a `sqlite:///` tracking URI, None for any other store."""
    prefix = "sqlite:///"
    return Path(tracking_uri[len(prefix) :]) if tracking_uri.startswith(prefix) else None


def anchor_artifacts(tracking_uri: str, folder: Path) -> int:
    """Anchor a portable store's relative artifact locations at `folder`, the store's own; returns how many.

    scripts/portable_store.py writes them relative so that a store opens wherever it is unpacked, but MLflow
    resolves them against the current directory: a study resumed from such a store (a study carried to
    another machine) would write its new runs' artifacts wherever autotune was started, outside the store.
    Only a SQLite store can be portable; any other tracking URI is left alone."""
    db = sqlite_path(tracking_uri)
    if db is None or not db.is_file():
        return 0
    changed = 0
    with closing(sqlite3.connect(db)) as con, con:
        for table, column in (("experiments", "artifact_location"), ("runs", "artifact_uri")):
            for rowid, location in con.execute(f"SELECT rowid, {column} FROM {table}").fetchall():
                if location and ":" not in location and not location.startswith("/"):
                    anchored = (folder / location).resolve().as_uri()
                    con.execute(f"UPDATE {table} SET {column} = ? WHERE rowid = ?", (anchored, rowid))
                    changed += 1
    return changed


def _tolerant(hook: Callable[[StudyTracker, _Event], None]) -> Callable[[StudyTracker, _Event], None]:
    """An event hook whose MLflow writes may fail without stopping the study (StudyTracker._writing)."""

    @functools.wraps(hook)
    def tolerant(self: StudyTracker, event: _Event) -> None:
        with self._writing():
            hook(self, event)

    return tolerant


class StudyTracker(StudyCallback):
    """Writes a study's runs to one MLflow tracking store, as the study loop tells it what happened."""

    def __init__(
        self,
        tracking_uri: str,
        study_name: str,
        artifact_root: Path,
        metric: str = "output_throughput",
        secrets: Secrets | None = None,
        page: StudyPage | None = None,
    ) -> None:
        """`page` draws the parent run's description and plots; without one the parent run has neither."""
        from mlflow.tracking import MlflowClient  # imported here: mlflow takes seconds to import

        _quiet_mlflow()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.tracking_uri = tracking_uri
        self.secrets = secrets or Secrets()  # redacted from every param, tag and text it records
        self.study_name = study_name
        self.metric = metric
        self.unit = metric_unit(metric)
        self.page = page
        self._trials: dict[str, tuple[int, bool, str | None]] = {}  # run id -> (number, baseline, label)
        self._runs: dict[int, str] = {}  # trial number -> run id, for this driver's trials
        self._pareto: set[int] = set()  # trials whose run is tagged `autotune.pareto` true
        self._best: str | None = None  # the run tagged `autotune.best` true
        self._ranks: dict[str, int] = {}  # run id -> the study_rank last logged on it
        self._view: tuple[optuna.Study, Study] | None = None  # what the plots are drawn from
        self._plots_stale = False  # the study changed since the plots were last drawn
        self._plotted_at = time.monotonic()
        self._plot_s = 0.0  # how long the last draw took
        self._best_script: str | None = None
        self._behind = True  # runs may be missing (a write failed, here or in an earlier driver): catch up
        self._said_behind = False  # the console was told once that a write failed
        self._run_of: dict[int, str] = {}  # trial number -> run id, as the catch-up found or wrote them
        self.experiment_id = self._experiment(study_name, artifact_root)
        self.client.set_experiment_tag(self.experiment_id, METRIC_TAG, metric)
        self.parent_run_id = self._parent_run()

    @classmethod
    def of(cls, study: Study, page: StudyPage | None = None) -> StudyTracker:
        """The tracker of `study`'s MLflow store, its artifacts beside the study."""
        anchor_artifacts(study.tracking_uri, study.workdir)
        return cls(
            study.tracking_uri,
            study.name,
            study.workdir / "artifacts",
            metric=study.objective.metric,
            secrets=study.secrets,
            page=page,
        )

    def _experiment(self, study_name: str, artifact_root: Path) -> str:
        from mlflow.exceptions import MlflowException

        experiment = self.client.get_experiment_by_name(study_name)
        if experiment is not None:
            return str(experiment.experiment_id)
        try:
            return str(
                self.client.create_experiment(
                    study_name,
                    # Artifacts live beside the study, not in ./mlruns of wherever autotune was started.
                    artifact_location=artifact_root.resolve().as_uri(),
                    # A model-tuning experiment: runs, params and metrics, not GenAI traces.
                    tags={STUDY_TAG: study_name, EXPERIMENT_KIND_TAG: "custom_model_development"},
                )
            )
        except MlflowException:
            # Another driver of the study created it a moment ago.
            experiment = self.client.get_experiment_by_name(study_name)
            if experiment is None:
                raise
            return str(experiment.experiment_id)

    def _study_runs(self) -> list[Any]:
        return list(
            self.client.search_runs(
                [self.experiment_id],
                filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`autotune.role` = 'study'",
                order_by=["attributes.start_time ASC"],
            )
        )

    def _parent_run(self) -> str:
        runs = self._study_runs()
        if not runs:
            self.client.create_run(
                self.experiment_id,
                run_name=f"study {self.study_name}",
                tags={STUDY_TAG: self.study_name, "autotune.role": "study"},
            )
            runs = self._study_runs()
            # Drivers that started together may each have made one: all keep the first, the rest go.
            for extra in runs[1:]:
                self.client.delete_run(extra.info.run_id)
        run_id: str = runs[0].info.run_id
        self.client.update_run(run_id, status="RUNNING")
        return run_id

    def log_study_files(self, files: Mapping[str, str]) -> None:
        """Attach the study, search-space and objective files as they were when the study ran."""
        for name, text in files.items():
            self.client.log_text(self.parent_run_id, self.secrets.redact(text), f"study/{name}")

    def start_trial(
        self,
        number: int,
        config: TrialConfig,
        kinds: Mapping[str, str],
        launch: ServerLaunch,
        baseline: bool,
        node: str,
        ablation: tuple[int, str] | None = None,
    ) -> str:
        """Create the trial's child run (RUNNING) with its parameters and launch script. An ablation
        trial's run (`ablation`: the ablated trial, the reverted parameter) says so in its tags and name."""
        label = ablation_label(*ablation) if ablation is not None else None
        tags = {
            PARENT_TAG: self.parent_run_id,
            STUDY_TAG: self.study_name,
            TRIAL_TAG: str(number),
            "autotune.role": "trial",
            "autotune.baseline": str(baseline).lower(),
            "autotune.node": node,
            "autotune.state": "RUNNING",
            "autotune.phase": "launching",
        }
        if ablation is not None:
            tags.update({ABLATION_OF_TAG: str(ablation[0]), ABLATION_PARAM_TAG: ablation[1]})
        run = self.client.create_run(
            self.experiment_id,
            run_name=_labelled(run_name(number, "RUNNING", None, baseline, self.unit, "launching"), label),
            tags=tags,
        )
        run_id = str(run.info.run_id)
        self._trials[run_id] = (number, baseline, label)
        params = {param_name(name, kinds[name]): _text(value) for name, value in config.params.items()}
        params.update(
            {
                f"{param_name(name, kinds.get(name, 'speculative'))}.derived": _text(value)
                for name, value in config.derived.items()
            }
        )
        params["server.env"] = json.dumps(redact_env(launch.env), sort_keys=True)[:MAX_PARAM_LENGTH]
        params["server.argv"] = " ".join(redact_argv(launch))[:MAX_PARAM_LENGTH]
        from mlflow.entities import Param

        params = {k: self.secrets.redact(v) for k, v in params.items()}
        self.client.log_batch(run_id, params=[Param(k, v) for k, v in sorted(params.items())])
        self.client.log_text(run_id, self.secrets.redact(launch_script(launch)), "launch.sh")
        return run_id

    def close_interrupted(self, run_id: str) -> None:
        """Close the run of a trial whose driver died: KILLED, never left RUNNING."""
        self.client.set_tag(run_id, "autotune.state", "FAIL")
        self.client.set_tag(run_id, "autotune.failure_kind", "interrupted")
        self.client.set_tag(run_id, "autotune.phase", "done")
        tags = self.client.get_run(run_id).data.tags
        trial = tags.get(TRIAL_TAG)
        if trial is not None and trial.isdigit():
            name = run_name(int(trial), "FAIL", None, False, "", "interrupted")
            of, param = tags.get(ABLATION_OF_TAG), tags.get(ABLATION_PARAM_TAG)
            label = ablation_label(int(of), param) if of is not None and of.isdigit() and param else None
            self.client.set_tag(run_id, RUN_NAME_TAG, _labelled(name, label))
        self.client.set_terminated(run_id, status="KILLED")

    def set_phase(self, run_id: str, phase: str, seconds: float | None = None) -> None:
        """Live progress: the trial's current phase (also in its run name), and how long the last one took."""
        self.client.set_tag(run_id, "autotune.phase", phase)
        if run_id in self._trials:
            number, baseline, label = self._trials[run_id]
            name = run_name(number, "RUNNING", None, baseline, detail=phase)
            self.client.set_tag(run_id, RUN_NAME_TAG, _labelled(name, label))
        if seconds is not None:
            self.client.log_metric(run_id, f"phase.{phase}_s", seconds)

    def phase_took(self, run_id: str, phase: str, seconds: float) -> None:
        """How long a trial's phase took, recorded when the next one begins."""
        self.client.log_metric(run_id, f"phase.{phase}_s", seconds)

    def finish_trial(
        self,
        run_id: str,
        *,
        number: int,
        state: str,
        value: float | None,
        baseline: bool,
        metrics: Mapping[str, float],
        tags: Mapping[str, str],
        artifacts: Mapping[str, str],
    ) -> None:
        """Record the trial's outcome and close its run (FINISHED, FAILED or KILLED)."""
        from mlflow.entities import Metric, RunTag

        now = _now_ms()
        kind = tags.get("autotune.failure_kind")
        label = self._trials.get(run_id, (number, baseline, None))[2]
        extra = {}
        if kind:
            extra[NOTE_TAG] = failure_note(
                state, kind, tags.get("autotune.advice"), tags.get("autotune.failure")
            )
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(metrics.items())],
            tags=[
                RunTag(k, self.secrets.redact(v))
                for k, v in {
                    **tags,
                    **extra,
                    "autotune.state": state,
                    "autotune.phase": "done",
                    RUN_NAME_TAG: _labelled(run_name(number, state, value, baseline, self.unit, kind), label),
                }.items()
            ],
        )
        self._trials.pop(run_id, None)
        for name, text in artifacts.items():
            self.client.log_text(run_id, self.secrets.redact(text), name)
        status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}.get(state, "KILLED")
        self.client.set_terminated(run_id, status=status)

    def update_summary(self, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        """The parent run's study summary: baseline, best, gain, trials by state."""
        from mlflow.entities import Metric, RunTag

        now = _now_ms()
        self.client.log_batch(
            self.parent_run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(metrics.items())],
            tags=[RunTag(k, self.secrets.redact(v)) for k, v in tags.items()],
        )

    def log_parent_text(self, text: str, name: str) -> None:
        self.client.log_text(self.parent_run_id, self.secrets.redact(text), name)

    def refresh_study_view(self, optuna_study: optuna.Study, study: Study, *, force: bool = False) -> None:
        """What a person opening the study's parent run sees: the summary and the best config's launch
        script as its description (every call), and the plots (at most every PLOT_INTERVAL_S seconds and
        PLOT_TIME_SHARE of the time, unless `force`; close() draws the last ones). Never raises: a broken
        plot must not stop a study."""
        if self.page is None:
            return
        self._view = (optuna_study, study)
        self._plots_stale = True
        try:
            summary, best_script = self.page.summary(study, optuna_study)
            note = self.secrets.redact(summary)[:MAX_NOTE_LENGTH]
            self.client.set_tag(self.parent_run_id, NOTE_TAG, note)
            if best_script is not None and best_script != self._best_script:
                script = self.secrets.redact(best_script)
                self.client.log_text(self.parent_run_id, script, BEST_LAUNCH_SCRIPT)
                self._best_script = best_script
        except Exception:  # the study goes on without its summary; the log says why
            log.warning("could not update the study summary in MLflow", exc_info=True)
        wait_s = max(PLOT_INTERVAL_S, self._plot_s / PLOT_TIME_SHARE)
        if force or time.monotonic() - self._plotted_at >= wait_s:
            self._draw_plots()

    def _draw_plots(self) -> None:
        if self._view is None or self.page is None:
            return
        optuna_study, study = self._view
        self._plots_stale = False
        started = time.monotonic()
        try:
            with tempfile.TemporaryDirectory(prefix="autotune-plots-") as folder:
                for path in self.page.plots(optuna_study, self.metric, self.unit, study.name, Path(folder)):
                    self.client.log_artifact(self.parent_run_id, str(path), PLOTS_DIR)
        except Exception:  # plots are a view of the study, never a reason to stop it
            log.warning("could not draw the study's plots", exc_info=True)
        self._plotted_at = time.monotonic()
        self._plot_s = self._plotted_at - started

    def close(self, status: str = "FINISHED") -> None:
        """Draw the last plots (when the study view changed since) and close the parent run."""
        if self._plots_stale:
            self._draw_plots()
        self.client.set_terminated(self.parent_run_id, status=status)

    # -- a store that cannot be written -----------------------------------------------------------------
    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Run one event's writes; a write that fails (a full disk, a server gone) does not stop the study:
        the Optuna storage is its record, and the runs are written from it later (`catch_up`). Said once."""
        from optuna.exceptions import StorageInternalError

        try:
            yield
        except StorageInternalError:
            raise  # the Optuna storage itself: the study cannot go on (study.store_failure)
        except Exception as exc:
            self._behind = True
            log.debug("MLflow write failed", exc_info=True)
            if not self._said_behind:
                self._said_behind = True
                reason = short_reason(exc)[:160]
                print(
                    f"autotune: MLflow could not write to {self.tracking_uri} ({reason}); the trials go on "
                    "(the Optuna storage records them) and their runs are written once the store can be "
                    "written again, at the latest when the study is resumed",
                    file=sys.stderr,
                    flush=True,
                )

    def catch_up(self, optuna_study: optuna.Study, study: Study) -> int:
        """Write the run of every launched, finished trial that has none, and close the runs still RUNNING
        of trials that finished (their writes failed, or their driver died); returns how many runs it
        wrote or closed. A caught-up run holds what the Optuna storage keeps (params, state, value,
        metrics, failure), not the server log."""
        from optuna.trial import TrialState

        runs: dict[int, list[Any]] = {}
        for run in self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`autotune.role` = 'trial'",
            max_results=50000,
        ):
            number = run.data.tags.get(TRIAL_TAG, "")
            if number.isdigit():
                runs.setdefault(int(number), []).append(run)
        mine = set(self._runs)  # trials this driver is running: their runs are open on purpose
        written = 0
        for trial in optuna_study.get_trials(deepcopy=False):
            record = TrialRecord.of(trial)
            if not record.launched or trial.number in mine or not trial.state.is_finished():
                continue
            found = runs.get(trial.number, [])
            if found:
                self._run_of[trial.number] = found[0].info.run_id
            open_runs = [r.info.run_id for r in found if r.info.status == "RUNNING"]
            if found and not open_runs:
                continue
            run_id = open_runs[0] if open_runs else self._create_caught_up_run(trial, study)
            self._run_of[trial.number] = run_id
            kind = record.failure_kind_text
            tags = {"autotune.node": str(record.node), "autotune.caught_up": "true"}
            for tag, text in (("failure_kind", kind), ("advice", record.advice)):
                if text:
                    tags[f"autotune.{tag}"] = str(text)
            if record.failure:
                tags["autotune.failure"] = record.failure[:500]
            metrics = {k: float(v) for k, v in record.metrics.items() if isinstance(v, int | float)}
            value = trial.value if len(optuna_study.directions) == 1 and trial.values else None
            if value is not None and trial.state is TrialState.COMPLETE:
                metrics.setdefault(self.metric, value)
            self.finish_trial(
                run_id,
                number=trial.number,
                state="INTERRUPTED" if kind == FailureKind.INTERRUPTED.value else trial.state.name,
                value=value,
                baseline=record.baseline,
                metrics=metrics,
                tags=tags,
                artifacts={},
            )
            written += 1
        self._behind = False
        return written

    def _create_caught_up_run(self, trial: FrozenTrial, study: Study) -> str:
        from mlflow.entities import Param

        baseline = TrialRecord.of(trial).baseline
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name(trial.number, trial.state.name, None, baseline, self.unit),
            tags={
                PARENT_TAG: self.parent_run_id,
                STUDY_TAG: self.study_name,
                TRIAL_TAG: str(trial.number),
                "autotune.role": "trial",
                "autotune.baseline": str(baseline).lower(),
            },
        )
        kinds = {name: p.kind for name, p in study.search_space.parameters.items()}
        params = {param_name(k, kinds.get(k, "speculative")): _text(v) for k, v in trial.params.items()}
        if params:
            self.client.log_batch(
                run.info.run_id,
                params=[Param(k, self.secrets.redact(v)) for k, v in sorted(params.items())],
            )
        return str(run.info.run_id)

    # -- the study loop's events -----------------------------------------------------------------------
    @_tolerant
    def study_started(self, event: StudyStarted) -> None:
        study = event.study
        self.log_study_files(
            {
                "study.yaml": study.path.read_text(),
                "search_space.yaml": study.search_space_text,
                "objective.yaml": study.objective_text,
            }
        )

    @_tolerant
    def trials_recovered(self, event: TrialsRecovered) -> None:
        for trial in event.trials:
            run_id = TrialRecord.of(trial).mlflow_run_id
            if run_id:
                self.close_interrupted(run_id)

    @_tolerant
    def trial_started(self, event: TrialStarted) -> None:
        trial = event.trial
        kinds = {name: p.kind for name, p in event.study.search_space.parameters.items()}
        run_id = self.start_trial(
            trial.number, event.config, kinds, event.launch, event.baseline, event.node, event.ablation
        )
        record_mlflow_run(trial, run_id)
        self._runs[trial.number] = run_id

    @_tolerant
    def trial_phase_changed(self, event: PhaseChanged) -> None:
        run_id = self._runs.get(event.number)
        if run_id is not None:
            self.set_phase(run_id, event.phase, None)
            self.phase_took(run_id, event.previous, event.previous_s)

    @_tolerant
    def trial_finished(self, event: TrialFinished) -> None:
        run_id = self._runs.pop(event.number, None)
        result, outcome = event.result, event.outcome
        if run_id is None or result is None:  # refused before launch: it has no run
            return
        metrics = {"trial_s": event.elapsed_s}
        if result.startup_s is not None:
            metrics["startup_s"] = result.startup_s
        if result.benchmark_s is not None:
            metrics["benchmark_s"] = result.benchmark_s
        metrics.update({f"startup.{phase}": seconds for phase, seconds in result.startup_phases.items()})
        if (node_s := result.node_seconds) is not None:  # in the node's own clock (the study's node hours)
            metrics["node_s"] = node_s
        if result.ok:  # a job's metrics are its measurement
            metrics.update(
                result.metrics if result.benchmark is None else measurement_metrics(result.benchmark)
            )
        tags = {"autotune.node": result.node}
        if outcome.over_limits:
            tags["autotune.over_limits"] = "; ".join(outcome.over_limits)[:500]
        if outcome.load_stopped_by is not None:
            tags["autotune.load_stopped_by"] = outcome.load_stopped_by[:500]
        if outcome.load_warning is not None:
            tags["autotune.load_warning"] = outcome.load_warning[:500]
        if outcome.pruned_by is not None:
            tags["autotune.pruned_by"] = outcome.pruned_by
        objective = event.study.objective
        if outcome.values is not None and objective.is_multi_objective:
            tags["autotune.values"] = json.dumps(dict(zip(objective.metrics, outcome.values, strict=True)))
        if outcome.failure is not None:
            tags["autotune.failure_kind"] = outcome.failure.kind.value
            tags["autotune.advice"] = outcome.failure.advice
            tags["autotune.failure"] = outcome.failure.line[:500]
        artifacts = {
            "server.log": result.log,
            "result.json": json.dumps(result.summary(), indent=2, default=str),
        }
        if result.benchmark is not None:
            artifacts["benchmark.json"] = result.benchmark.to_json()
        if result.details:
            artifacts["job_result.json"] = json.dumps(result.details, indent=2)
        artifacts.update(result.other_logs)  # the node's own processes' logs (the weight cache daemon's)
        launch = event.launch
        if launch is not None and result.port and result.port != launch.port:
            artifacts["launch.sh"] = launch_script(
                launch.with_port(result.port)
            )  # `port: auto`: the one used
        self.finish_trial(
            run_id,
            number=event.number,
            state=outcome.state.name,
            value=outcome.value,
            baseline=event.baseline,
            metrics=metrics,
            tags=tags,
            artifacts=artifacts,
        )

    @_tolerant
    def trial_interrupted(self, event: TrialInterrupted) -> None:
        run_id = self._runs.pop(event.number, None)
        if run_id is None:
            return
        self.finish_trial(
            run_id,
            number=event.number,
            state="INTERRUPTED",
            value=None,
            baseline=event.baseline,
            metrics={},
            tags={"autotune.failure_kind": FailureKind.INTERRUPTED.value},
            artifacts={"server.log": event.log} if event.log else {},
        )

    def summary_updated(self, event: SummaryUpdated) -> None:
        """The parent run's metrics and tags from the study's summary, its description and plots; first the
        runs a failed write (or an earlier driver's) left missing."""
        if self._behind:
            with self._writing():
                self.catch_up(event.optuna_study, event.study)
        with self._writing():
            self._summary(event)

    def _summary(self, event: SummaryUpdated) -> None:
        summary = event.summary
        metrics = {f"trials_{k.lower()}": float(v) for k, v in summary.states.items()}
        for key, value in (
            ("best_value", summary.best_value),
            ("baseline_value", summary.baseline_value),
            ("gain_pct", summary.gain_pct),
        ):
            if value is not None:
                metrics[key] = value
        metrics["node_hours"] = spent_s(event.optuna_study) / 3600  # the study's, its NCCL stage's included
        tags = {"autotune.best_trial": str(summary.best_trial)}
        tags.update({f"autotune.failures.{k}": str(v) for k, v in summary.failure_kinds.items()})
        tags.update(self._pareto_tags(event))
        self._mark_best(event.optuna_study, summary.best_trial)
        self._rank(event.optuna_study, summary.best_trial)
        if summary.answer is not None:  # the noise, the answer confirmed or not, an early stop
            answer_metrics, answer_tags = answer_for_tracking(summary.answer)
            metrics.update(answer_metrics)
            tags.update(answer_tags)
        self.update_summary(metrics, tags)
        self.refresh_study_view(
            event.optuna_study, event.study
        )  # description, best launch.sh, plots (throttled)

    def study_ended(self, event: StudyEnded) -> None:
        if event.summary is None:  # interrupted, or stopped by an error
            with self._writing():
                self.close("KILLED")
            return
        self.summary_updated(SummaryUpdated(event.study, event.optuna_study, event.summary))
        with self._writing():
            self.close()

    def _mark_best(self, optuna_study: optuna.Study, best_trial: int | None) -> None:
        """Tag the best trial's run `autotune.best` true (a column of `autotune ui`'s run list), and the
        run it replaces false."""
        run_id = None
        if best_trial is not None:
            trial = next((t for t in optuna_study.get_trials(deepcopy=False) if t.number == best_trial), None)
            run_id = None if trial is None else self._run_id(trial)
        if run_id == self._best:
            return
        marked = [self._best] if self._best is not None else self._marked_best()  # a resumed study's
        for old in marked:
            if old != run_id:
                self.client.set_tag(old, BEST_TAG, "false")
        if run_id is not None:
            self.client.set_tag(run_id, BEST_TAG, "true")
        self._best = run_id

    def _rank(self, optuna_study: optuna.Study, best_trial: int | None) -> None:
        """Log each completed trial's `study_rank` where it changed: the best trial (the study's answer,
        which confirmation may have chosen over a higher single measurement) first, then the others by
        their (first) objective value."""
        from mlflow.entities import Metric
        from optuna.trial import TrialState

        sign = -1.0 if optuna_study.directions[0].name == "MAXIMIZE" else 1.0
        done = [
            t
            for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if self._run_id(t) and t.values
        ]
        done.sort(key=lambda t: (t.number != best_trial, sign * t.values[0], t.number))
        now = _now_ms()
        for rank, trial in enumerate(done, start=1):
            run_id = self._run_id(trial)
            assert run_id is not None  # kept above
            if self._ranks.get(run_id) != rank:
                self.client.log_batch(run_id, metrics=[Metric(RANK_METRIC, float(rank), now, 0)])
                self._ranks[run_id] = rank

    def _run_id(self, trial: FrozenTrial) -> str | None:
        """The trial's run: the one it recorded when it started, else the one the catch-up wrote."""
        return TrialRecord.of(trial).mlflow_run_id or self._run_of.get(trial.number)

    def _marked_best(self) -> list[str]:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`{BEST_TAG}` = 'true'",
        )
        return [run.info.run_id for run in runs]

    def _pareto_tags(self, event: SummaryUpdated) -> dict[str, str]:
        """A multi-objective study's answer: the Pareto front (and each trial run tagged `autotune.pareto`
        while it is on it)."""
        tags: dict[str, str] = {}
        front = event.summary.pareto
        if front is None:
            return tags
        names = event.study.objective.metrics
        tags["autotune.pareto_front"] = json.dumps(
            [{"trial": p["number"], **dict(zip(names, p["values"], strict=True))} for p in front]
        )[:5000]
        members = {p["number"] for p in front}
        for trial in event.optuna_study.get_trials(deepcopy=False):
            run_id = TrialRecord.of(trial).mlflow_run_id
            if run_id and (trial.number in members) != (trial.number in self._pareto):
                self.client.set_tag(run_id, "autotune.pareto", str(trial.number in members).lower())
        self._pareto = members
        return tags


def answer_for_tracking(answer: StudyAnswer) -> tuple[dict[str, float], dict[str, str]]:
    """The MLflow parent run's metrics and tags of the study's answer: its verdict and sentence, its gain
    and interval, the noise estimate, the re-measured ranking, why the search stopped early, the knobs
    screening held and the NCCL stage's values."""
    metrics: dict[str, float] = {}
    tags = {
        "autotune.verdict": answer.verdict,
        "autotune.confirmed": str(answer.confirmed).lower(),
        "autotune.answer": answer.text[:5000],
    }
    noise = answer.noise
    if noise is not None:
        metrics["noise_relative_sd_pct"] = 100 * noise.relative_sd
        metrics["noise_dof"] = float(noise.dof)
        tags["autotune.noise"] = noise.describe()[:5000]
    if answer.confirmed and answer.gain_pct is not None and answer.gain_interval_pct is not None:
        low, high = answer.gain_interval_pct
        metrics.update(confirmed_gain_pct=answer.gain_pct, confirmed_gain_ci_low_pct=low)
        metrics["confirmed_gain_ci_high_pct"] = high
    if answer.remeasured is not None:
        remeasured = remeasured_record(answer.remeasured)
        tags["autotune.remeasured"] = json.dumps(remeasured)[:5000]
        for key in ("gain_ci_low_pct", "gain_ci_high_pct"):
            if remeasured[key] is not None:
                metrics[key] = remeasured[key]
        tags["autotune.within_noise"] = str(remeasured["within_noise"]).lower()
    if answer.stopped is not None:
        tags["autotune.stopped_early"] = answer.stopped[:5000]
    if answer.screened:
        tags["autotune.screened"] = "\n".join(answer.screened)[:5000]
    if answer.nccl is not None:
        tags["autotune.nccl_stage"] = json.dumps(dict(answer.nccl.held), default=str)[:5000]
    return metrics, tags


def measurement_metrics(measured: BenchmarkResult) -> dict[str, float]:
    """A measurement's MLflow metrics: the combined figures, each ladder level's under `c{concurrency}.`,
    and the short measurement's under `short.`."""

    def figures(result: BenchmarkResult, prefix: str = "") -> dict[str, float]:
        bench = asdict(result)
        out = {prefix + k: float(bench[k]) for k in BENCHMARK_FIGURES if bench.get(k) is not None}
        if result.accept_length is not None:
            out[prefix + "accept_length"] = result.accept_length
        return out

    metrics = figures(measured)
    for index, level in enumerate(measured.levels):
        if measured.max_load is None:
            metrics.update(figures(level, f"c{level.workload.concurrency}."))
            continue
        # A load search's steps, in the order measured: each with the load it sent, how many prompts (fewer
        # than num_prompts when its outcome was decided early) and how many broke each SLO limit.
        metrics.update(figures(level, f"step{index}."))
        metrics[f"step{index}.request_rate"] = level.workload.request_rate or 0.0
        metrics[f"step{index}.concurrency"] = float(level.workload.concurrency)
        metrics[f"step{index}.prompts_sent"] = float(level.decided_after or level.workload.num_prompts)
        for limit, count in (level.slo_over or {}).items():  # which limits its misses broke
            metrics[f"step{index}.over.{limit}"] = float(count)
    if measured.short is not None:
        metrics.update(figures(measured.short, "short."))
    return metrics


def _labelled(name: str, label: str | None) -> str:
    return f"{name} · {label}" if label else name


def _text(value: Any) -> str:
    return "default" if value is None else str(value)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
