"""A disk that fills during a study: the MLflow store's (the trials go on, the runs are written later) or
the Optuna storage's (the study stops with one sentence, nothing left running); and a start the node's
free-space check refuses. The disk is a real one: a small tmpfs, mounted where this process may (root);
elsewhere these tests skip."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.study.callbacks import StudyCallback, TrialFinished
from autotune.study.loop import StudyDriver
from autotune.study.store_failure import StorageUnwritable
from autotune.views.tracked import study_tracker
from tests.builders import StudyFiles, model_pool


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "8m") -> Iterator[Path]:
    """A tmpfs of `size` mounted on `folder` (made if missing), through mount(2): no process starts."""
    folder.mkdir(parents=True, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)  # the C library this process has loaded: no ldconfig
    if libc.mount(b"tmpfs", str(folder).encode(), b"tmpfs", 0, f"size={size}".encode()) != 0:
        pytest.skip(f"cannot mount a tmpfs here: {os.strerror(ctypes.get_errno())}")
    try:
        yield folder
    finally:
        libc.umount2(str(folder).encode(), 2)  # MNT_DETACH: a test that failed may hold files open


class FillsTheDisk(StudyCallback):
    """After trial `after` finished (and its run was written: registered after the tracker), fills `disk`."""

    def __init__(self, disk: Path, after: int) -> None:
        self.disk, self.after = disk, after
        self.filler = disk / "filler"

    def trial_finished(self, event: TrialFinished) -> None:
        if event.number != self.after:
            return
        with self.filler.open("wb") as out:
            try:
                while True:
                    out.write(b"\0" * (1 << 16))
                    out.flush()
            except OSError as exc:
                assert exc.errno == errno.ENOSPC

    def free(self) -> None:
        self.filler.unlink()


def _runs(db: Path) -> list[tuple[str, str, str | None]]:
    """Each run of the store: its role (study or trial), MLflow status and trial number."""
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute(
            "SELECT role.value, runs.status, trial.value FROM runs "
            "JOIN tags role ON role.run_uuid = runs.run_uuid AND role.key = 'autotune.role' "
            "LEFT JOIN tags trial ON trial.run_uuid = runs.run_uuid AND trial.key = 'autotune.trial' "
            "WHERE runs.lifecycle_stage = 'active'"
        ).fetchall()


def test_a_full_mlflow_disk_does_not_stop_the_trials_and_the_runs_catch_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The tracker's write raised "database or disk is full" and aborted the study with a traceback."""
    with small_disk(tmp_path / "mlflow") as disk:
        path = StudyFiles(tmp_path)(n_trials=6, tracking_uri=f"sqlite:///{disk}/mlflow.db")
        study = load_study(path)
        filler = FillsTheDisk(disk, after=1)
        optuna_study = StudyDriver(study, [filler], pool=model_pool(), tracking=study_tracker).run()

        trials = optuna_study.get_trials()
        assert len(trials) >= 6 and all(t.state.is_finished() for t in trials), "every trial ran to its end"
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if "MLflow could not write" in line]
        assert len(said) == 1, err
        assert said[0].startswith(f"autotune: MLflow could not write to sqlite:///{disk}/mlflow.db (")
        assert "database or disk is full" in said[0], said[0]
        assert "the trials go on" in said[0] and "Traceback" not in err, err
        launched = {str(t.number) for t in trials if "node" in t.user_attrs}
        written = {number for role, _, number in _runs(disk / "mlflow.db") if role == "trial"}
        assert written < launched, "trials 2 on could not be written while the disk was full"

        filler.free()  # resumed once there is space: the runs missing are written from the Optuna storage
        optuna_study = StudyDriver(study, pool=model_pool(), tracking=study_tracker).run(n_trials=7)
        runs = _runs(disk / "mlflow.db")
        launched = {str(t.number) for t in optuna_study.get_trials() if "node" in t.user_attrs}
        assert {number for role, _, number in runs if role == "trial"} == launched
        assert [status for _, status, _ in runs if status == "RUNNING"] == [], "no run left RUNNING"
        assert [status for role, status, _ in runs if role == "study"] == ["FINISHED"]


def test_a_full_optuna_disk_stops_the_study_in_one_sentence(tmp_path: Path) -> None:
    with small_disk(tmp_path / "optuna") as disk:
        storage = f"sqlite:///{disk}/optuna.db"
        path = StudyFiles(tmp_path)(n_trials=6, storage=storage)
        study = load_study(path)
        filler = FillsTheDisk(disk, after=1)
        with pytest.raises(StorageUnwritable) as stopped:
            StudyDriver(study, [filler], pool=model_pool(), tracking=study_tracker).run()
        message = str(stopped.value)
        assert message.startswith(
            f"stopped: the study's storage {storage} could not be written because the disk that holds {disk} "
            "is full (0 MiB free); free space there, then `autotune resume "
        ), message
        assert "\n" not in message
        runs = _runs(study.workdir / "mlflow.db")
        assert [status for _, status, _ in runs if status == "RUNNING"] == [], "no run left RUNNING"

        filler.free()
        optuna_study = StudyDriver(study, pool=model_pool(), tracking=study_tracker).run()
        assert not optuna_study.get_trials(states=(TrialState.RUNNING,))
        assert len([t for t in optuna_study.get_trials() if t.state.is_finished()]) >= 6


@pytest.mark.integration
def test_a_start_the_free_space_check_refuses_closes_the_parent_run(tmp_path: Path) -> None:
    """The node check (here, `df` on the log folder: 8 MiB free of the 256 MiB it wants) refuses the
    start; the study's MLflow parent run was left RUNNING."""
    path = StudyFiles(tmp_path)(
        n_trials=2,
        storage=f"sqlite:///{tmp_path}/optuna.db",
        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
        nodes=[{"name": "local", "address": "local"}],
    )
    study = load_study(path)
    from autotune.node.check import NodeCheckError
    from autotune.node.pool import in_process_pool

    with small_disk(study.workdir), pytest.raises(NodeCheckError, match="MiB free for logs"):
        StudyDriver(study, pool=in_process_pool, tracking=study_tracker).run()
    assert [status for role, status, _ in _runs(tmp_path / "mlflow.db") if role == "study"] == ["KILLED"]
    assert optuna.load_study(study_name=study.name, storage=study.storage).get_trials(
        states=(TrialState.RUNNING,)
    ) == []
