"""MLflow records: one experiment and one parent run per study, one child run per trial.

The driver is the only writer. Child runs are created when a trial starts (so a running trial shows in
the UI with its phase) and finished with its state; a retried trial gets a new run, since MLflow params
are immutable.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.launch import ServerLaunch, TrialConfig, launch_script, redact_argv, redact_env

STUDY_TAG = "autotune.study"
TRIAL_TAG = "autotune.trial"
PARENT_TAG = "mlflow.parentRunId"
RUN_NAME_TAG = "mlflow.runName"
MAX_PARAM_LENGTH = 6000


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


def run_name(number: int, state: str, value: float | None, baseline: bool) -> str:
    """A child run's name, readable at a glance in the run list."""
    label = "baseline" if baseline else f"trial {number:03d}"
    if value is not None:
        return f"{label} · {value:.1f} tok/s"
    return f"{label} · {state.lower()}"


class StudyTracker:
    """Writes a study's runs to one MLflow tracking store."""

    def __init__(self, tracking_uri: str, study_name: str, artifact_root: Path) -> None:
        from mlflow.tracking import MlflowClient  # imported here: mlflow takes seconds to import

        _quiet_mlflow()
        self.client = MlflowClient(tracking_uri=tracking_uri)
        self.study_name = study_name
        experiment = self.client.get_experiment_by_name(study_name)
        self.experiment_id = (
            experiment.experiment_id
            if experiment is not None
            # Artifacts live beside the study, not in ./mlruns of wherever autotune was started.
            else self.client.create_experiment(
                study_name, artifact_location=artifact_root.resolve().as_uri(), tags={STUDY_TAG: study_name}
            )
        )
        self.parent_run_id = self._parent_run()

    def _parent_run(self) -> str:
        runs = self.client.search_runs(
            [self.experiment_id],
            filter_string=f"tags.`{STUDY_TAG}` = '{self.study_name}' and tags.`autotune.role` = 'study'",
            max_results=1,
        )
        if runs:
            run_id: str = runs[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=f"study {self.study_name}",
            tags={STUDY_TAG: self.study_name, "autotune.role": "study"},
        )
        return str(run.info.run_id)

    def log_study_files(self, files: Mapping[str, str]) -> None:
        """Attach the study, search-space and objective files as they were when the study ran."""
        for name, text in files.items():
            self.client.log_text(self.parent_run_id, text, f"study/{name}")

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
            run_name=run_name(number, "running", None, baseline),
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

        self.client.log_batch(run_id, params=[Param(k, v) for k, v in sorted(params.items())])
        self.client.log_text(run_id, launch_script(launch), "launch.sh")
        return run_id

    def set_phase(self, run_id: str, phase: str, seconds: float | None = None) -> None:
        """Live progress: the trial's current phase, and how long the last one took."""
        self.client.set_tag(run_id, "autotune.phase", phase)
        if seconds is not None:
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
        self.client.log_batch(
            run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(metrics.items())],
            tags=[
                RunTag(k, v)
                for k, v in {
                    **tags,
                    "autotune.state": state,
                    "autotune.phase": "done",
                    RUN_NAME_TAG: run_name(number, state, value, baseline),
                }.items()
            ],
        )
        for name, text in artifacts.items():
            self.client.log_text(run_id, text, name)
        status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}.get(state, "KILLED")
        self.client.set_terminated(run_id, status=status)

    def update_summary(self, metrics: Mapping[str, float], tags: Mapping[str, str]) -> None:
        """The parent run's study summary: baseline, best, gain, trials by state."""
        from mlflow.entities import Metric, RunTag

        now = _now_ms()
        self.client.log_batch(
            self.parent_run_id,
            metrics=[Metric(k, float(v), now, 0) for k, v in sorted(metrics.items())],
            tags=[RunTag(k, v) for k, v in tags.items()],
        )

    def log_parent_text(self, text: str, name: str) -> None:
        self.client.log_text(self.parent_run_id, text, name)

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.parent_run_id, status=status)


def _text(value: Any) -> str:
    return "default" if value is None else str(value)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)
