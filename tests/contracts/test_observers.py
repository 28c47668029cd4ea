"""One contract for every observer of the study loop (`StudyCallback`, the trackers): the MLflow tracker,
the console's progress lines, and the observer that does nothing (a study run without tracking). Each takes
a whole study as the loop tells it (a dead driver's trial recovered, trials that complete, fail, or are
refused before launch) without stopping it, writes nothing outside the study's folder and no secret
anywhere, and answers each hook with the loop's event.

An observer joins by adding itself to OBSERVERS.
"""

from __future__ import annotations

import inspect
import io
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from autotune.cli.console import ConsoleReporter
from autotune.config import Study, load_study
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.callbacks import StudyCallback
from autotune.study.loop import StudyDriver
from autotune.study.records import DRIVER_ATTR
from autotune.study.storage import finished_count, open_study
from autotune.views.tracked import study_tracker
from tests.builders import StudyFiles, model_server

HF_TOKEN = "hf_contract_token_5c1e9a"  # in the server's env: a secret by its name
API_KEY = "sk-contract-key-77d0b2"  # after --api-key: a secret by its flag
BUDGET = 6
OBSERVERS: dict[str, Callable[[Study, io.StringIO], StudyCallback]] = {
    "mlflow": lambda study, stream: study_tracker(study),
    "console": lambda study, stream: ConsoleReporter(stream),
    "null": lambda study, stream: StudyCallback(),
}


def model_pool(study: Study) -> NodePool:
    hardware, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return LocalNodePool(
        {"n0": ModelNodeExecutor("n0", hardware, model)}, {"n0": node_report("n0", hardware, model)}
    )


@dataclass
class Observed:
    observer: StudyCallback
    study: Study
    optuna_study: optuna.Study
    cwd: Path  # the working directory the study ran in
    printed: str  # what the observer was given to print on


@pytest.fixture(scope="module", params=list(OBSERVERS))
def observed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Observed:
    root = tmp_path_factory.mktemp(request.param)
    server = model_server(flags={"--tp-size": 8, "--api-key": API_KEY}, env={"HF_TOKEN": HF_TOKEN})
    study = load_study(
        StudyFiles(root / "project")(study=f"observed-{request.param}", n_trials=BUDGET, server=server)
    )
    StudyDriver(study, pool=model_pool, tracking=False).run(n_trials=1)  # the baseline, unobserved
    optuna_study = open_study(study)
    orphan = optuna_study.ask(
        {"NCCL_ALGO": optuna.distributions.CategoricalDistribution([None, "Ring", "Tree"])}
    )
    orphan.set_user_attr(DRIVER_ATTR, f"{socket.gethostname()}:1:0")  # its driver is gone
    optuna_study.enqueue_trial({"--ep-size": 8, "--mem-fraction-static": 0.85})  # fails on the SM120 node
    optuna_study.enqueue_trial(
        {"--mem-fraction-static": 0.70}
    )  # refused before launch: the weights overflow it
    stream = io.StringIO()
    (root / "cwd").mkdir()
    before = os.getcwd()
    os.chdir(root / "cwd")  # MLflow's default store is ./mlruns of wherever it runs
    try:
        observer = OBSERVERS[request.param](study, stream)
        optuna_study = StudyDriver(study, [observer], pool=model_pool, tracking=False).run()
    finally:
        os.chdir(before)
    return Observed(observer, study, optuna_study, root / "cwd", stream.getvalue())


def test_a_whole_study_is_observed_without_stopping_it(observed: Observed) -> None:
    trials = observed.optuna_study.trials
    assert finished_count(observed.optuna_study) == BUDGET
    assert trials[1].user_attrs["failure_kind"] == "interrupted"  # the dead driver's, recovered
    kinds = {t.user_attrs.get("failure_kind") for t in trials}
    assert {"unsupported", "predicted_oom"} <= kinds, kinds


def test_no_secret_is_written_anywhere(observed: Observed) -> None:
    # The Optuna storage is the loop's, not an observer's; everything else in the study's folder is theirs.
    written = [p for p in observed.study.workdir.rglob("*") if p.is_file() and p.name != "optuna.db"]
    leaks = [(p.name, s) for p in written for s in (HF_TOKEN, API_KEY) if s.encode() in p.read_bytes()]
    assert leaks == []
    assert HF_TOKEN not in observed.printed and API_KEY not in observed.printed


def test_nothing_is_written_outside_the_study_folder(observed: Observed) -> None:
    assert list(observed.cwd.iterdir()) == []


def _hooks(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in inspect.getmembers(cls, inspect.isfunction)
        if name in vars(StudyCallback) and not name.startswith("_")
    }


def test_every_hook_takes_the_loops_event(observed: Observed) -> None:
    hooks = _hooks(StudyCallback)
    assert len(hooks) >= 10 and _hooks(type(observed.observer)) == hooks
