"""One contract for every tracker the study loop may be given: the MLflow one (`StudyTracker`, on a SQLite
store) and the one that records nothing (`NullTracker`, for studies run by the thousand). Each takes the
whole study as the loop tells it (files, trials in every state, phases, a dead driver's trial, the
summary, the study view) without raising, writes nothing outside its store and no secret anywhere, and
answers every call the loop makes with the loop's arguments.

A tracker joins by adding itself to TRACKERS.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState, create_trial

from autotune.config import load_study
from autotune.tracking.tracker import NullTracker, StudyTracker
from autotune.trial.launch import ServerLaunch, TrialConfig
from autotune.trial.redaction import Secrets
from tests.builders import StudyFiles, e2e_study

HF_TOKEN = "hf_contract_token_5c1e9a"  # in the launch's env: a secret by its name
API_KEY = "sk-contract-key-77d0b2"  # after --api-key: a secret by its flag


def store(root: Path) -> Path:
    """A folder for a tracker's files (its MLflow store starts as a copy of an empty one: conftest.py)."""
    folder = root / "store"
    folder.mkdir()
    return folder


TRACKERS: dict[str, Callable[[Path], StudyTracker]] = {
    "mlflow": lambda store: StudyTracker(
        f"sqlite:///{store / 'mlflow.db'}",
        "contract",
        store / "artifacts",
        secrets=Secrets.of(values=(HF_TOKEN, API_KEY)),
    ),
    "null": lambda store: NullTracker(),
}
parametrize_tracker = pytest.mark.parametrize("name", list(TRACKERS))


def launch() -> ServerLaunch:
    argv = ("python", "-m", "sglang.launch_server", "--tp-size", "8", "--api-key", API_KEY, "--port", "30000")
    return ServerLaunch(argv, {"NCCL_PROTO": "LL", "HF_TOKEN": HF_TOKEN}, "127.0.0.1", 30000)


def record_a_study(tracker: StudyTracker, study_file: StudyFiles) -> list[str]:
    """What the study loop tells a tracker over a study: trials that complete, are pruned, fail, and one
    left by a dead driver; every phase; the summary and the study view. Returns the trials' run ids."""
    study = load_study(study_file(e2e_study()))
    tracker.log_study_files({"study.yaml": f"server:\n  env: {{HF_TOKEN: {HF_TOKEN}}}\n"})
    config = TrialConfig(env={"NCCL_PROTO": "LL"}, params={"NCCL_PROTO": "LL"})
    outcomes: list[tuple[str, float | None, dict[str, str]]] = [
        ("COMPLETE", 212.5, {}),
        ("PRUNED", -1.0, {"autotune.failure_kind": "kv_pool_too_small", "autotune.advice": "Raise it."}),
        ("FAIL", None, {"autotune.failure_kind": "unknown_crash", "autotune.failure": f"key {API_KEY}"}),
    ]
    run_ids = []
    for number, (state, value, tags) in enumerate(outcomes):
        run_id = tracker.start_trial(number, config, {"NCCL_PROTO": "nccl"}, launch(), number == 0, "n0")
        assert isinstance(run_id, str)
        tracker.set_phase(run_id, "loading", None)
        tracker.phase_took(run_id, "launching", 1.5)
        tracker.set_phase(run_id, "benchmarking", 2.0)
        tracker.finish_trial(
            run_id,
            number=number,
            state=state,
            value=value,
            baseline=number == 0,
            metrics={"output_throughput": value} if value is not None else {},
            tags=tags,
            artifacts={"server.log": f"server_args=ServerArgs(api_key='{API_KEY}')\nready\n"},
        )
        run_ids.append(run_id)
    orphan = tracker.start_trial(3, config, {"NCCL_PROTO": "nccl"}, launch(), False, "n1")
    tracker.close_interrupted(orphan)  # its driver died: the next one closes its run
    tracker.update_summary({"best_value": 212.5, "trials": 4.0}, {"autotune.best_trial": "0"})
    tracker.log_parent_text(f"#!/bin/sh\nexport HF_TOKEN={HF_TOKEN}\n", "best/launch.sh")
    ostudy = optuna.create_study(direction="maximize")
    ostudy.add_trial(create_trial(state=TrialState.COMPLETE, value=212.5, user_attrs={"baseline": True}))
    tracker.refresh_study_view(ostudy, study, force=True)
    tracker.close()
    return [*run_ids, orphan]


@dataclass
class Recorded:
    store: Path  # everything the tracker was given to write in
    cwd: Path  # the working directory it ran in
    run_ids: list[str]


@pytest.fixture(scope="module", params=list(TRACKERS))
def recorded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """One study told to each tracker, from an empty working directory (MLflow's default store is
    ./mlruns of wherever it runs)."""
    root = tmp_path_factory.mktemp(request.param)
    (root / "cwd").mkdir()
    before = os.getcwd()
    os.chdir(root / "cwd")
    try:
        tracker = TRACKERS[request.param](store(root))
        run_ids = record_a_study(tracker, StudyFiles(root))
    finally:
        os.chdir(before)
    return Recorded(root / "store", root / "cwd", run_ids)


def test_a_whole_study_is_taken_trial_by_trial(recorded: Recorded) -> None:
    assert len(recorded.run_ids) == 4 and all(isinstance(run_id, str) for run_id in recorded.run_ids)


def test_no_secret_is_written_anywhere(recorded: Recorded) -> None:
    written = [p for p in recorded.store.rglob("*") if p.is_file()]
    leaks = [(p.name, s) for p in written for s in (HF_TOKEN, API_KEY) if s.encode() in p.read_bytes()]
    assert leaks == []


def test_nothing_is_written_outside_the_store(recorded: Recorded) -> None:
    assert list(recorded.cwd.iterdir()) == []


@parametrize_tracker
def test_a_study_view_that_cannot_be_drawn_never_stops_the_study(name: str, tmp_path: Path) -> None:
    tracker = TRACKERS[name](store(tmp_path))
    broken: Any = SimpleNamespace(name="broken")  # a study config missing all a summary needs
    tracker.refresh_study_view(optuna.create_study(), broken, force=True)
    tracker.close()


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if not name.startswith("_")
    }


@parametrize_tracker
def test_every_call_of_the_loop_is_answered_with_the_loops_arguments(name: str, tmp_path: Path) -> None:
    kind = type(TRACKERS[name](store(tmp_path)))
    reference = _public(StudyTracker)
    answered = _public(kind)
    assert {n: answered.get(n) for n in reference} == reference
    # A tracker other than MLflow's answers each call itself, never through StudyTracker's MLflow code.
    inherited = [n for n in reference if getattr(kind, n) is getattr(StudyTracker, n)]
    assert inherited == (list(reference) if kind is StudyTracker else [])
