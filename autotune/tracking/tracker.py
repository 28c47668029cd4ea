"""MLflow records: one experiment and one parent run per study, one child run per trial.

The driver is the only writer. Child runs are created when a trial starts (so a running trial shows in
the UI with its phase) and finished with its state; a retried trial gets a new run, since MLflow params
are immutable. Run names read at a glance in the run list (`#004 · PRUNED · kv_pool_too_small`);
a run's description (MLflow's note) says why it failed and what to try; the parent run's description is
the study summary with the best config's launch script, and its artifacts hold the study's plots,
redrawn as the study goes (at most every PLOT_INTERVAL_S seconds, and once more when it closes).
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.trial.launch import ServerLaunch, TrialConfig, launch_script, redact_argv, redact_env
from autotune.trial.redaction import Secrets

if TYPE_CHECKING:
    import optuna

    from autotune.config import Study

log = logging.getLogger(__name__)

STUDY_TAG = "autotune.study"
TRIAL_TAG = "autotune.trial"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
NOTE_TAG = "mlflow.note.content"  # shown as the run's description in the UI (markdown)
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
MAX_PARAM_LENGTH = 6000
MAX_NOTE_LENGTH = 7500  # MLflow caps tag values at 8000 characters
PLOT_INTERVAL_S = 30.0  # plots cost a second or two; a trial on a real node takes minutes
PLOTS_DIR = "plots"
BEST_LAUNCH_SCRIPT = "best/launch.sh"


def _quiet_mlflow() -> None:
    # MLflow logs its database migrations at INFO and configures its loggers when imported; they drown
    # the study's own progress lines.
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)


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


def failure_note(state: str, kind: str, advice: str | None, line: str | None) -> str:
    """A failed trial's run description: what happened and what to try, in markdown."""
    parts = [f"**{state}: {kind}**"]
    if advice:
        parts.append(advice)
    if line:
        parts.append(f"```\n{line}\n```")
    return "\n\n".join(parts)[:MAX_NOTE_LENGTH]


class StudyTracker:
    """Writes a study's runs to one MLflow tracking store."""

    def __init__(
        self,
        tracking_uri: str,
        study_name: str,
        artifact_root: Path,
        metric: str = "output_throughput",
        secrets: Secrets | None = None,
    ) -> None:
        from mlflow.tracking import MlflowClient  # imported here: mlflow takes seconds to import

        _quiet_mlflow()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.secrets = secrets or Secrets()  # redacted from every param, tag and text it records
        self.study_name = study_name
        self.metric = metric
        self.unit = metric_unit(metric)
        self._trials: dict[str, tuple[int, bool]] = {}  # run id -> (trial number, baseline)
        self._view: tuple[optuna.Study, Study] | None = None  # what the plots are drawn from
        self._plots_stale = False  # the study changed since the plots were last drawn
        self._plotted_at = time.monotonic()
        self._best_script: str | None = None
        self.experiment_id = self._experiment(study_name, artifact_root)
        self.parent_run_id = self._parent_run()

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
    ) -> str:
        """Create the trial's child run (RUNNING) with its parameters and launch script."""
        run = self.client.create_run(
            self.experiment_id,
            run_name=run_name(number, "RUNNING", None, baseline, self.unit, "launching"),
            tags={
                PARENT_TAG: self.parent_run_id,
                STUDY_TAG: self.study_name,
                TRIAL_TAG: str(number),
                "autotune.role": "trial",
                "autotune.baseline": str(baseline).lower(),
                "autotune.node": node,
                "autotune.state": "RUNNING",
                "autotune.phase": "launching",
            },
        )
        run_id = str(run.info.run_id)
        self._trials[run_id] = (number, baseline)
        params = {param_name(name, kinds[name]): _text(value) for name, value in config.params.items()}
        params.update(
            {
                f"{param_name(name, kinds.get(name, 'speculative'))}.derived": _text(value)
                for name, value in config.derived.items()
            }
        )
        params["server.env"] = json.dumps(redact_env(launch.env), sort_keys=True)[:MAX_PARAM_LENGTH]
        params["server.argv"] = " ".join(redact_argv(launch.argv))[:MAX_PARAM_LENGTH]
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
        trial = self.client.get_run(run_id).data.tags.get(TRIAL_TAG)
        if trial is not None and trial.isdigit():
            self.client.set_tag(
                run_id, RUN_NAME_TAG, run_name(int(trial), "FAIL", None, False, "", "interrupted")
            )
        self.client.set_terminated(run_id, status="KILLED")

    def set_phase(self, run_id: str, phase: str, seconds: float | None = None) -> None:
        """Live progress: the trial's current phase (also in its run name), and how long the last one took."""
        self.client.set_tag(run_id, "autotune.phase", phase)
        if run_id in self._trials:
            number, baseline = self._trials[run_id]
            self.client.set_tag(
                run_id, RUN_NAME_TAG, run_name(number, "RUNNING", None, baseline, detail=phase)
            )
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
                    RUN_NAME_TAG: run_name(number, state, value, baseline, self.unit, kind),
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

    def refresh_study_view(self, ostudy: optuna.Study, study: Study, *, force: bool = False) -> None:
        """What a person opening the study's parent run sees: the summary and the best config's launch
        script as its description (every call), and the plots (at most every PLOT_INTERVAL_S seconds
        unless `force`; close() draws the last ones). Never raises: a broken plot must not stop a study."""
        self._view = (ostudy, study)
        self._plots_stale = True
        try:
            from autotune.views.report import study_findings, summary_markdown

            findings = study_findings(study, ostudy)
            note = self.secrets.redact(summary_markdown(findings))[:MAX_NOTE_LENGTH]
            self.client.set_tag(self.parent_run_id, NOTE_TAG, note)
            if findings.best_script is not None and findings.best_script != self._best_script:
                script = self.secrets.redact(findings.best_script)
                self.client.log_text(self.parent_run_id, script, BEST_LAUNCH_SCRIPT)
                self._best_script = findings.best_script
        except Exception:  # the study goes on without its summary; the log says why
            log.warning("could not update the study summary in MLflow", exc_info=True)
        if force or time.monotonic() - self._plotted_at >= PLOT_INTERVAL_S:
            self._draw_plots()

    def _draw_plots(self) -> None:
        if self._view is None:
            return
        ostudy, study = self._view
        self._plots_stale = False
        try:
            from autotune.views.plots import plot_data, save_plots

            data = plot_data(ostudy, self.metric, self.unit, title=study.name)
            with tempfile.TemporaryDirectory(prefix="autotune-plots-") as folder:
                for path in save_plots(data, Path(folder)):
                    self.client.log_artifact(self.parent_run_id, str(path), PLOTS_DIR)
        except Exception:  # plots are a view of the study, never a reason to stop it
            log.warning("could not draw the study's plots", exc_info=True)
        self._plotted_at = time.monotonic()

    def close(self, status: str = "FINISHED") -> None:
        """Draw the last plots (when the study view changed since) and close the parent run."""
        if self._plots_stale:
            self._draw_plots()
        self.client.set_terminated(self.parent_run_id, status=status)


class NullTracker(StudyTracker):
    """Records nothing: for studies run by the thousand on model nodes, to measure the tuner itself.

    Each public method of StudyTracker that the driver calls is overridden here; a new one must be too.
    """

    def __init__(self) -> None:  # no MLflow client, store or parent run
        self.study_name = ""

    def log_study_files(self, files: Mapping[str, str]) -> None:
        pass

    def start_trial(
        self,
        number: int,
        config: TrialConfig,
        kinds: Mapping[str, str],
        launch: ServerLaunch,
        baseline: bool,
        node: str,
    ) -> str:
        return ""

    def close_interrupted(self, run_id: str) -> None:
        pass

    def set_phase(self, run_id: str, phase: str, seconds: float | None = None) -> None:
        pass

    def phase_took(self, run_id: str, phase: str, seconds: float) -> None:
        pass

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
        pass

    def update_summary(self, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        pass

    def log_parent_text(self, text: str, name: str) -> None:
        pass

    def refresh_study_view(self, ostudy: optuna.Study, study: Study, *, force: bool = False) -> None:
        pass

    def close(self, status: str = "FINISHED") -> None:
        pass


def _text(value: Any) -> str:
    return "default" if value is None else str(value)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
