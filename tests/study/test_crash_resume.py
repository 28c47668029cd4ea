"""Kill a real driver at varied points, resume after each: nothing lost or duplicated, nothing left running.

The driver runs as `autotune run` in its own process group, on the simulated node, with a local Ray
runtime or without (`--no-ray`); it is killed with SIGKILL (or interrupted with SIGINT) while a server
loads its weights, while it is benchmarked, or just after a trial finished, and started again each time.
The same driver also meets what a real node brings mid-trial: its Ray node actor's process killed, and the
driver itself stopped with SIGTERM or SIGHUP (what `timeout`, systemd and Slurm send).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, NamedTuple

import optuna
import pytest
from optuna.trial import TrialState

from autotune.study.storage import finished_count
from tests.builders import SIM_TIMEOUTS, StudyFiles, simulated_server, small_objective, study_data
from tests.processes import ended_side_by_side, own_node_locks

pytestmark = pytest.mark.integration
BUDGET = 10
SIGKILL, SIGINT = signal.SIGKILL, signal.SIGINT


def crash_study(
    storage: str | None, model_path: str, name: str = "crash", budget: int = BUDGET
) -> dict[str, Any]:
    server = simulated_server(
        model_path=model_path,
        draft_model_path="/models/eagle3",
        port="auto",
        # A 2.4 s weight load and a short benchmark: time to kill the driver inside either.
        env={"SGLANG_SIM_TIME_SCALE": "0.002", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.004"},
    )
    return study_data(
        study=name,
        objective=small_objective(),
        server=server,
        n_trials=budget,
        sampler={"name": "random", "seed": 11},
        timeouts=SIM_TIMEOUTS,
        storage=storage,
    )


def start_driver(
    path: Path, log: Path, *, ray: bool = True, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "autotune", "run", str(path), *([] if ray else ["--no-ray"])],
            cwd=path.parent,
            env=dict(os.environ, RAY_AUTH_MODE="disabled", PYTHONUNBUFFERED="1", **(env or {})),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def reached(point: str, trials_dir: Path, before: set[Path], log: Path, finished_before: int) -> bool:
    """Whether the driver is at a kill point: a server of one of its trials (not in `before`: a killed
    driver's server may still be loading until the next driver stops it) loading or benchmarked, or a
    trial just told."""
    if point == "between":
        return (
            log.read_text(errors="replace").count("] trial")
            + log.read_text(errors="replace").count("] baseline")
            > finished_before
        )
    for server_log in trials_dir.glob("trial-*/server.log"):
        if server_log.parent in before:
            continue
        text = server_log.read_text(errors="replace")
        if point == "loading" and "Load weight begin" in text and "Load weight end" not in text:
            return True
        if point == "benchmarking" and "fired up and ready" in text and "Shutting down" not in text:
            return True
    return False


def crash_and_resume(path: Path, kills: list[tuple[str, signal.Signals]], ray_at: set[int]) -> list[str]:
    """Start a driver per kill (through Ray for the kills numbered in `ray_at`, else --no-ray), kill it at
    its point, then finish the study with one more; returns the points reached."""
    workdir = path.parent / ".autotune" / "crash"
    trials_dir = workdir / "nodes" / "local"
    log = path.parent / "driver.log"
    hit = []
    for index, (point, sig) in enumerate(kills):
        finished_before = (
            log.read_text(errors="replace").count("] trial")
            + log.read_text(errors="replace").count("] baseline")
            if log.exists()
            else 0
        )
        before = set(trials_dir.glob("trial-*"))
        # Both pools must leave a resumable study; a Ray start costs seconds a kill point need not.
        driver = start_driver(path, log, ray=index in ray_at)
        deadline = time.monotonic() + 90
        while driver.poll() is None and time.monotonic() < deadline:
            if reached(point, trials_dir, before, log, finished_before):
                break
            time.sleep(0.05)
        if driver.poll() is not None:
            break  # the study reached its budget before this kill point
        hit.append(point)
        os.kill(driver.pid, sig)  # the driver alone: the servers are autotune's to clean up
        if sig is SIGINT:
            assert driver.wait(timeout=90) == 130, log.read_text()[-3000:]
        else:
            driver.wait(timeout=30)
        # What Ray's own processes leave of a killed driver stays in its process group.
        try:
            os.killpg(driver.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    final = start_driver(path, log, ray=False)  # finishing the study: which pool does not matter
    assert final.wait(timeout=300) == 0, log.read_text(errors="replace")[-4000:]
    os.killpg(final.pid, signal.SIGKILL) if _group_alive(final.pid) else None
    return hit


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def servers_of(model_path: str) -> list[int]:
    """Live processes of this test's simulated servers (its model path is unique)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if model_path.encode() in cmdline and state not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def check_study(path: Path, storage: str | None, model_path: str, budget: int = BUDGET) -> None:
    from mlflow.tracking import MlflowClient

    workdir = path.parent / ".autotune" / "crash"
    storage = storage or f"sqlite:///{workdir / 'optuna.db'}"
    optuna_study = optuna.load_study(study_name="crash", storage=storage)
    trials = optuna_study.trials
    assert not [t.number for t in trials if t.state is TrialState.RUNNING]
    assert finished_count(optuna_study) == budget
    assert trials[0].user_attrs.get("baseline") is True
    assert sum(1 for t in trials if t.user_attrs.get("baseline") and t.state is TrialState.COMPLETE) == 1

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("crash")
    runs = client.search_runs([experiment.experiment_id], max_results=1000)
    assert not [
        r.info.run_id
        for r in runs
        if r.info.status == "RUNNING" and r.data.tags.get("autotune.role") == "trial"
    ]
    by_trial: dict[int, list] = {}
    for run in runs:
        if run.data.tags.get("autotune.role") == "trial":
            by_trial.setdefault(int(run.data.tags["autotune.trial"]), []).append(run)
    for trial in trials:
        if trial.user_attrs.get("skipped"):
            continue
        if trial.user_attrs.get("failure_kind") == "interrupted" and "mlflow_run_id" not in trial.user_attrs:
            # Killed between Optuna's ask and the launch: no run by design; its params were queued again.
            assert any(t.user_attrs.get("retry_of") == trial.number for t in trials), trial.number
            continue
        assert len(by_trial.get(trial.number, [])) == 1, trial.number  # one run per trial, none twice
        if trial.state is TrialState.COMPLETE:
            run = by_trial[trial.number][0]
            assert run.info.status == "FINISHED"
            assert run.data.metrics["output_throughput"] == pytest.approx(trial.value)
    assert servers_of(model_path) == [], "a server of an interrupted trial is still alive"
    assert not (workdir / "nodes" / "local" / "servers.json").exists()


# Each (point, signal, pool) once: without Ray a SIGKILL at each point and a SIGINT while benchmarking;
# through Ray a SIGKILL while loading and a SIGINT while loading and benchmarking. (Ten kills repeated some.)
KILLS = [
    ("loading", SIGKILL),  # Ray
    ("benchmarking", SIGKILL),
    ("between", SIGKILL),
    ("loading", SIGINT),  # Ray
    ("loading", SIGKILL),
    ("benchmarking", SIGINT),  # Ray
    ("benchmarking", SIGINT),
]
THROUGH_RAY = {0, 3, 5}


def test_sigkill_and_sigint_at_varied_points_then_resume_on_sqlite(study_file: StudyFiles) -> None:
    model_path = f"/models/crash-{uuid.uuid4().hex[:8]}"
    # Kills let few trials finish (a `between` kill waits for one): a budget one over them outlasts them all.
    budget = len(KILLS) + 1
    path = study_file(crash_study(None, model_path, budget=budget))
    hit = crash_and_resume(path, KILLS, ray_at=THROUGH_RAY)
    assert hit == [point for point, _ in KILLS], hit  # every kill point was reached
    check_study(path, None, model_path, budget=budget)


def test_the_same_against_postgresql(study_file: StudyFiles, postgres_url: str) -> None:
    model_path = f"/models/crash-{uuid.uuid4().hex[:8]}"
    storage = postgres_url.replace("/autotune", "/autotune")
    path = study_file(crash_study(storage, model_path, budget=6))
    # Each kind of point and signal once, without Ray (the storage is what differs; SQLite runs both pools).
    hit = crash_and_resume(path, KILLS[:4], ray_at=set())
    assert len(hit) >= 3, hit
    check_study(path, storage, model_path, budget=6)


def test_two_drivers_on_one_postgresql_study_share_the_budget(
    tmp_path: Path, study_file: StudyFiles, postgres_url: str
) -> None:
    model_path = f"/models/two-{uuid.uuid4().hex[:8]}"
    path = study_file(crash_study(postgres_url, model_path, name="two-drivers"))
    first = start_driver(path, tmp_path / "first.log")
    time.sleep(3)  # the first creates the study and its baseline; the second joins it
    second = start_driver(path, tmp_path / "second.log", ray=False)  # one with each pool
    for driver in (first, second):
        assert driver.wait(timeout=300) == 0
        if _group_alive(driver.pid):
            os.killpg(driver.pid, signal.SIGKILL)

    optuna_study = optuna.load_study(study_name="two-drivers", storage=postgres_url)
    counted = [t for t in optuna_study.trials if not t.user_attrs.get("skipped")]
    assert len(counted) == BUDGET == finished_count(optuna_study)
    assert len({t.number for t in counted}) == BUDGET
    drivers = {t.user_attrs["driver"] for t in counted}
    assert len(drivers) == 2, "both drivers ran trials"
    logs = sorted((path.parent / ".autotune" / "two-drivers" / "nodes" / "local").glob("trial-*/server.log"))
    assert [int(p.parent.name.split("-")[1]) for p in logs] == sorted(t.number for t in counted)
    assert servers_of(model_path) == []


def session_processes(session: int, title: bytes) -> list[int]:
    """Live processes of session `session` (a driver started in a session of its own, and what it started:
    Ray's workers included) whose command line starts with `title` (Ray names a worker `ray::NodeActor`)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and cmdline.startswith(title) and fields[0] not in ("Z", "X"):
            pids.append(int(entry.name))
    return pids


def wait_until_loading(
    driver: subprocess.Popen[bytes], trials_dir: Path, log: Path, first: int = 1, last: int | None = None
) -> None:
    """Return once a server of trial `first` or later (up to `last`) loads its weights (the driver still
    running)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert driver.poll() is None, log.read_text(errors="replace")[-3000:]
        for server_log in trials_dir.glob("trial-*/server.log"):
            number = int(server_log.parent.name.split("-")[1])
            if number < first or (last is not None and number > last):
                continue
            text = server_log.read_text(errors="replace")
            if "Load weight begin" in text and "Load weight end" not in text:
                return
        time.sleep(0.05)
    pytest.fail(f"no trial reached its weight load: {log.read_text(errors='replace')[-3000:]}")


class Stopped(NamedTuple):
    """A driver's run that a test below looks at: its study file, its simulated model's unique path, and
    what it left (the driver's log; `left`: the process group of the server a killed driver left)."""

    path: Path
    model_path: str
    log: str = ""
    status: int | None = None
    left: int | None = None


def _files(root: Path, kind: str, budget: int) -> tuple[Path, str, Path, Path]:
    """A crash study of `budget` trials under `root`: its file, model path, trials folder and driver log."""
    model_path = f"/models/{kind}-{uuid.uuid4().hex[:8]}"
    path = StudyFiles(root)(crash_study(None, model_path, budget=budget))
    trials_dir = path.parent / ".autotune" / "crash" / "nodes" / "local"
    return path, model_path, trials_dir, path.parent / "driver.log"


def _node_actor_killed(root: Path) -> Stopped:
    # The actor's worker process dies (kill -9), not ray.kill: Ray frees its name later, and its server,
    # in a session of its own, outlives it. Killed while the baseline loads: SGLang's defaults run here, so
    # its server stays up until the new actor stops it (a proposal's server may die of its own settings
    # before the new actor has started: trial 1's, which this GPU cannot run, does a second after its load).
    path, model_path, trials_dir, log = _files(root, "actor", 4)
    driver = start_driver(path, log, env=own_node_locks())
    try:
        wait_until_loading(driver, trials_dir, log, first=0, last=0)
        actors = session_processes(driver.pid, b"ray::NodeActor")
        assert len(actors) == 1, actors
        os.kill(actors[0], signal.SIGKILL)
        assert driver.wait(timeout=300) == 0, log.read_text(errors="replace")[-4000:]
    finally:
        if _group_alive(driver.pid):
            os.killpg(driver.pid, signal.SIGKILL)
    return Stopped(path, model_path)


def _stopped_by(root: Path, sig: signal.Signals) -> Stopped:
    path, model_path, trials_dir, log = _files(root, "term", 3)
    driver = start_driver(path, log, env=own_node_locks())
    try:
        wait_until_loading(driver, trials_dir, log)
        os.kill(driver.pid, sig)  # the driver alone, as `timeout` or systemd stops it
        status = driver.wait(timeout=90)
    finally:
        if _group_alive(driver.pid):
            os.killpg(driver.pid, signal.SIGKILL)  # what Ray's own processes leave stays in the group
    return Stopped(path, model_path, log.read_text(errors="replace"), status)


def _killed_then_resumed(root: Path) -> Stopped:
    path, model_path, trials_dir, log = _files(root, "left", 2)
    locks = own_node_locks()
    driver = start_driver(path, log, ray=False, env=locks)
    wait_until_loading(driver, trials_dir, log, first=0)
    os.killpg(driver.pid, signal.SIGKILL)  # the server, in a session of its own, outlives its driver
    driver.wait(timeout=30)
    left = servers_of(model_path)
    assert left, "the killed driver's server still runs"
    pgid = os.getpgid(left[0])

    resumed = start_driver(path, log, ray=False, env=locks)
    assert resumed.wait(timeout=300) == 0, log.read_text(errors="replace")[-4000:]
    return Stopped(path, model_path, log.read_text(errors="replace"), left=pgid)


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[Stopped]]:
    """The runs of the tests below, side by side (each mostly waits on Ray's start and its servers' clocks,
    each on a node lock of its own); a test meets its own run's failure."""
    runs: dict[str, Callable[[], Stopped]] = {
        "node actor": lambda: _node_actor_killed(tmp_path_factory.mktemp("actor")),
        "SIGTERM": lambda: _stopped_by(tmp_path_factory.mktemp("sigterm"), signal.SIGTERM),
        "SIGHUP": lambda: _stopped_by(tmp_path_factory.mktemp("sighup"), signal.SIGHUP),
        "left running": lambda: _killed_then_resumed(tmp_path_factory.mktemp("left")),
    }
    return ended_side_by_side(runs)


def test_a_node_actor_killed_mid_trial_is_node_lost_its_server_stopped_and_the_trial_run_again(
    stopped: dict[str, Future[Stopped]],
) -> None:
    path, model_path = stopped["node actor"].result()[:2]
    check_study(path, None, model_path, budget=4)  # nothing RUNNING, no server, every run closed
    optuna_study = optuna.load_study(
        study_name="crash", storage=f"sqlite:///{path.parent / '.autotune' / 'crash' / 'optuna.db'}"
    )
    lost = [t for t in optuna_study.trials if t.user_attrs.get("failure_kind") == "node_lost"]
    assert len(lost) == 1 and lost[0].state is TrialState.FAIL, [t.user_attrs for t in optuna_study.trials]
    # The new actor stopped the dead one's server before anything else ran, and the trial says so.
    assert "its server (process group" in lost[0].user_attrs["failure"], lost[0].user_attrs["failure"]
    retries = [t for t in optuna_study.trials if t.user_attrs.get("retry_of") == lost[0].number]
    assert len(retries) == 1 and retries[0].params == lost[0].params and retries[0].state.is_finished()


@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_or_sighup_stops_the_driver_as_ctrl_c_does(
    stopped: dict[str, Future[Stopped]], sig: signal.Signals, status: int
) -> None:
    path, model_path, text, exited, _ = stopped[sig.name].result()
    assert exited == status, text[-4000:]
    trials_dir = path.parent / ".autotune" / "crash" / "nodes" / "local"
    assert f"autotune: stopped by {sig.name}: the running trials were stopped; resume to continue" in text
    assert f"({sig.name} again to stop at once)" in text and "Ctrl-C again" not in text, text[-4000:]
    assert "*** SIGTERM received" not in text and "Traceback" not in text, text[-4000:]
    optuna_study = optuna.load_study(
        study_name="crash", storage=f"sqlite:///{path.parent / '.autotune' / 'crash' / 'optuna.db'}"
    )
    assert not [t.number for t in optuna_study.trials if t.state is TrialState.RUNNING]
    stopped_trials = [t for t in optuna_study.trials if t.user_attrs.get("failure_kind") == "interrupted"]
    assert len(stopped_trials) == 1, [t.user_attrs for t in optuna_study.trials]
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{path.parent / '.autotune' / 'crash' / 'mlflow.db'}")
    runs = client.search_runs([client.get_experiment_by_name("crash").experiment_id], max_results=100)
    assert runs and not [r.info.run_id for r in runs if r.info.status == "RUNNING"]
    assert servers_of(model_path) == [], "a server of the stopped trial is still alive"
    assert not (trials_dir / "servers.json").exists()


def test_resume_says_which_servers_a_killed_driver_left_running_it_stopped(
    stopped: dict[str, Future[Stopped]],
) -> None:
    _, model_path, text, _, pgid = stopped["left running"].result()
    said = [line for line in text.splitlines() if "left running" in line]
    assert said == [
        "autotune: node local: stopped 1 server that a dead driver or node actor left running "
        f"(process group {pgid})"
    ]
    assert servers_of(model_path) == []
