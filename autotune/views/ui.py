"""`autotune ui`: the MLflow UI on a study's tracking store, started and stopped as one process group.

The server reads the study's MLflow database and serves the artifacts from where autotune writes them
(`<workdir>/artifacts`, the experiment's artifact location). It listens on 127.0.0.1 unless told
otherwise; listening beyond loopback needs `allow_remote`, because the MLflow UI has no login.

It opens on the study's trials, flat and sorted best first, with the objective, state, failure kind and
best mark as columns: a view the MLflow UI loads from an experiment tag (`mlflow.sharedViewState.<key>`,
what its "Share" button writes) named by the URL's `viewStateShareKey`. An NCCL stage, tracked in an
experiment of its own, gets its own link.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TextIO

from autotune.config import Study
from autotune.config.hosts import LOOPBACK, reachable_here
from autotune.errors import AutotuneError
from autotune.node.runner import free_port
from autotune.study.stages import STAGE_SUFFIX
from autotune.tracking.tracker import BEST_TAG, METRIC_TAG, RANK_METRIC, STUDY_TAG, _quiet_mlflow, sqlite_path

READY_TIMEOUT_S = 120.0
STOP_GRACE_S = 10.0
REMOTE_WARNING = (
    "autotune: warning: the MLflow UI has no login: anyone who can reach {host}:{port} can read this "
    "study's runs, logs and launch scripts, and edit or delete them. Prefer `ssh -L {port}:127.0.0.1:{port}`."
)


VIEW_STATE_TAG = "mlflow.sharedViewState."  # the MLflow UI's prefix of a shared view's experiment tag
VIEW_KEY = "autotune-trials"


class UIError(AutotuneError):
    """The MLflow UI could not be started."""


def server_command(study: Study, host: str, port: int) -> list[str]:
    """The `mlflow server` command line for the study's tracking store and artifact folder (it runs in
    the study's work folder, see `start_ui`: the store's path is made absolute)."""
    artifacts = (study.workdir / "artifacts").resolve()
    database = sqlite_path(study.tracking_uri)
    return [
        sys.executable,
        "-m",
        "mlflow",
        "server",
        "--backend-store-uri",
        study.tracking_uri if database is None else f"sqlite:///{database.resolve()}",
        # Runs keep the artifact location autotune gave the experiment; these cover anything new.
        "--default-artifact-root",
        artifacts.as_uri(),
        "--artifacts-destination",
        str(artifacts),
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def server_env() -> dict[str, str]:
    """The server's environment: no usage telemetry, no background job workers (the UI does not need them,
    and they triple the start-up time)."""
    return {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "DO_NOT_TRACK": "true",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }


def trials_view(metric: str) -> dict[str, object]:
    """The run list `autotune ui` opens on, in the MLflow UI's shared-view format: the trial runs alone
    (sorting by a metric un-nests them from the study's run), the study's best first (`study_rank`), and
    these columns, as wide as their text. The MLflow UI (3.17) applies `columnWidths` only to the columns
    `columnOrder` lists, so both are given."""
    columns = [
        "attributes.`Run Name`",
        f"metrics.`{RANK_METRIC}`",
        f"metrics.`{metric}`",
        "tags.`autotune.state`",
        "tags.`autotune.failure_kind`",
        f"tags.`{BEST_TAG}`",
        "attributes.`Duration`",
    ]
    # Pixels for what autotune writes there, a name with its value and state (`#003 baseline · 81.2 tok/s ·
    # COMPLETE`), a failure kind (`kv_pool_too_small`); MLflow's own are 190 and 100.
    widths = {
        "attributes.`Run Name`": 340,
        f"metrics.`{metric}`": 120,
        "tags.`autotune.state`": 100,
        "tags.`autotune.failure_kind`": 150,
    }
    return {
        "searchFilter": "tags.`autotune.role` = 'trial'",
        "orderByKey": f"metrics.`{RANK_METRIC}`",
        "orderByAsc": True,
        "startTime": "ALL",
        "lifecycleFilter": "Active",
        "modelVersionFilter": "All Runs",
        "datasetsFilter": [],
        "selectedColumns": columns,
        "columnOrder": columns,
        "columnWidths": widths,
        "runListHidden": False,
    }


@dataclass
class UIServer:
    """A running MLflow UI server: its own process group, so stopping it stops every worker."""

    process: subprocess.Popen[bytes]
    host: str
    port: int
    experiment_id: str | None
    log_path: Path
    stage_experiment_id: str | None = None

    @property
    def url(self) -> str:
        host = reachable_here(self.host)
        host = f"[{host}]" if ":" in host else host
        return f"http://{host}:{self.port}/"

    @property
    def experiment_url(self) -> str:
        """The study's trials (`trials_view`) in the "Model training" run table."""
        return self._runs_url(self.experiment_id)

    @property
    def stage_url(self) -> str | None:
        """The NCCL stage's trials, None when the study has no stage experiment."""
        return None if self.stage_experiment_id is None else self._runs_url(self.stage_experiment_id)

    def _runs_url(self, experiment: str | None) -> str:
        if experiment is None:
            return self.url
        return (
            f"{self.url}#/experiments/{experiment}/runs?workflowType=machine_learning"
            f"&compareRunsMode=TABLE&viewStateShareKey={VIEW_KEY}"
        )

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> None:
        """Wait until the server answers /health; raises UIError when it exits or does not answer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise UIError(
                    f"mlflow server exited with status {self.process.returncode}: {self._log_tail()}"
                )
            try:
                with urllib.request.urlopen(self.url + "health", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.25)
        self.stop()
        raise UIError(f"mlflow server did not answer within {timeout_s:g} s: {self._log_tail()}")

    def stop(self, grace_s: float = STOP_GRACE_S) -> int:
        """SIGTERM the server's process group, SIGKILL it after `grace_s`; returns the exit status."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        # Workers left behind by a dead leader go too.
        _signal_group(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def _log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return " | ".join(lines[-5:]) or "(empty log)"


def _signal_group(pid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def experiment_id(study: Study, name: str | None = None) -> str | None:
    """The MLflow experiment id of the study (or of its experiment `name`), None when it has not tracked
    anything yet. An experiment found gets the trials view (`trials_view`) as a tag, for its URL."""
    from mlflow.tracking import MlflowClient  # imported here: mlflow takes seconds to import

    _quiet_mlflow()
    client = MlflowClient(tracking_uri=study.tracking_uri)
    experiment = client.get_experiment_by_name(name or study.name)
    if experiment is None or experiment.tags.get(STUDY_TAG) is None:
        return None
    # Stores written before the tracker tagged the metric are the study's own experiment.
    metric = experiment.tags.get(METRIC_TAG, study.objective.metric)
    view = trials_view(metric)
    client.set_experiment_tag(experiment.experiment_id, VIEW_STATE_TAG + VIEW_KEY, json.dumps(view))
    return str(experiment.experiment_id)


def start_ui(study: Study, host: str = LOOPBACK, port: int | None = None) -> UIServer:
    """Start `mlflow server` on the study's store in its own process group; returns once it answers.

    Checking that a non-loopback `host` is wanted is the caller's job (the CLI's `--allow-remote`)."""
    if study.tracking_uri.startswith(("http://", "https://", "databricks")):
        raise UIError(
            f"study {study.name!r} tracks to the MLflow server at {study.tracking_uri}: open its UI there"
        )
    database = sqlite_path(study.tracking_uri)
    if database is not None and not database.exists():
        raise UIError(
            f"no MLflow store yet at {database}: start the study with `autotune run {study.path}` first"
        )
    found = experiment_id(study)
    stage = experiment_id(study, study.name + STAGE_SUFFIX)
    port = port or free_port(host)
    log_path = study.ensure_workdir() / "mlflow-ui.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            server_command(study, host, port),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_env(),
            # A portable store (scripts/portable_store.py) keeps artifact locations relative to its folder.
            cwd=study.workdir,
            start_new_session=True,  # its own process group: Ctrl-C reaches us, and we stop all of it
        )
    server = UIServer(process, host, port, found, log_path, stage)
    try:
        server.wait_ready()
    except BaseException:
        server.stop()
        raise
    return server


def serve(study: Study, host: str = LOOPBACK, port: int | None = None, out: TextIO = sys.stdout) -> int:
    """Start the UI, print its URL, and keep it up until Ctrl-C or SIGTERM; then stop it. Returns 0, or
    the server's status when it exits by itself."""
    server = start_ui(study, host, port)

    def stop_on_term(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    # Ctrl-C and SIGTERM both stop the server, even where the shell started us with SIGINT ignored.
    previous = {sig: signal.signal(sig, stop_on_term) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(f"MLflow UI for study {study.name!r}: {server.experiment_url}", file=out, flush=True)
        if server.experiment_id is None:
            print(f"(no experiment {study.name!r} yet: it appears once the study starts)", file=out)
        if server.stage_url is not None:
            print(f"its NCCL stage, a separate experiment: {server.stage_url}", file=out, flush=True)
        print(f"log: {server.log_path} · Ctrl-C to stop", file=out, flush=True)
        status = server.process.wait()
        print(f"autotune: mlflow server exited with status {status}: {server._log_tail()}", file=sys.stderr)
        return status or 1
    except KeyboardInterrupt:
        print("stopping the MLflow UI", file=out, flush=True)
        return 0
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
