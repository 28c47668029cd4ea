"""Several GPU nodes on one Ray cluster (Ray's cluster_utils, every node a `gpu_node`), real servers."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from typing import Any

import pytest
import ray
from optuna.trial import TrialState
from ray.cluster_utils import Cluster

from autotune.config import load_study
from autotune.errors import interrupt
from autotune.node.pool import ACTOR_NAMESPACE, GPU_NODE_RESOURCE, connect_ray
from autotune.node.runner import _group_members
from autotune.study.loop import StudyDriver
from autotune.study.storage import finished_count
from tests.builders import SIM_TIMEOUTS, StudyFiles, simulated_server, small_objective, study_data

pytestmark = pytest.mark.integration
NODES = 3
BUDGET = 7


@pytest.fixture(scope="module")
def cluster():
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    for _ in range(NODES):
        cluster.add_node(num_cpus=1, resources={GPU_NODE_RESOURCE: 1})
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def cluster_study(address: str, name: str, startup_scale: str = "0.002") -> dict[str, Any]:
    return study_data(
        study=name,
        objective=small_objective(),
        nodes=[{"name": "gpu", "address": "local"}],
        ray={"address": address, "discover_nodes": True},
        server=simulated_server(
            draft_model_path="/models/eagle3",
            port="auto",
            env={"SGLANG_SIM_STARTUP_TIME_SCALE": startup_scale},
        ),
        n_trials=BUDGET,
        sampler={"name": "random", "seed": 5},
        timeouts=SIM_TIMEOUTS,
    )


def test_joining_the_cluster_keeps_the_sigterm_handler_set_before(cluster, study_file: StudyFiles) -> None:
    # ray.init takes SIGTERM for itself (its core worker dumps and aborts on it): the CLI's, which stops
    # a study as Ctrl-C does, must stay.
    study = load_study(study_file(cluster_study(cluster.address, "sigterm")))
    ray.shutdown()
    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        connect_ray(study)
        assert signal.getsignal(signal.SIGTERM) is interrupt
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_trials_run_in_parallel_on_every_node_and_none_twice(cluster, study_file: StudyFiles) -> None:
    study = load_study(study_file(cluster_study(cluster.address, "parallel")))
    optuna_study = StudyDriver(study).run()

    trials = [t for t in optuna_study.trials if not t.user_attrs.get("skipped")]
    assert finished_count(optuna_study) == BUDGET == len(trials)
    assert len({t.number for t in trials}) == len(trials)
    nodes = {t.user_attrs["node"] for t in trials}
    assert len(nodes) == NODES, nodes  # every discovered node ran trials
    # Trials overlap in time: some trial started before another one finished.
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    assert any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans))
    # Each trial ran once on its node: one server log per trial, across the nodes' folders.
    logs = list((study.workdir / "nodes").glob("*/trial-*/server.log"))
    assert sorted(int(p.parent.name.split("-")[1]) for p in logs) == sorted(t.number for t in trials)


def test_a_node_lost_mid_trial_fails_that_trial_and_runs_it_again(cluster, study_file: StudyFiles) -> None:
    # A slower start-up (a 3 s weight load) leaves time to kill a node's actor while its server loads.
    study = load_study(study_file(cluster_study(cluster.address, "lost", startup_scale="0.005")))
    killed: list[str] = []

    def kill_one_actor() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            for name in ray.util.list_named_actors(all_namespaces=True):
                if name["namespace"] == ACTOR_NAMESPACE and name["name"].startswith("lost:"):
                    actor = ray.get_actor(name["name"], namespace=ACTOR_NAMESPACE)
                    if ray.get(actor.phase.remote(), timeout=10) == "loading":
                        ray.kill(actor, no_restart=True)
                        killed.append(name["name"])
                        return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_one_actor, daemon=True)
    killer.start()
    optuna_study = StudyDriver(study).run()
    killer.join(timeout=5)

    assert killed, "an actor was killed while its server was loading"
    lost = [t for t in optuna_study.trials if t.user_attrs.get("failure_kind") == "node_lost"]
    assert len(lost) == 1 and lost[0].state is TrialState.FAIL
    retries = [t for t in optuna_study.trials if t.user_attrs.get("retry_of") == lost[0].number]
    assert len(retries) == 1 and retries[0].params == lost[0].params and retries[0].state.is_finished()
    assert finished_count(optuna_study) == BUDGET  # the lost trial does not count; the study carried on
    # The dead actor's server was stopped by the actor that took over its node (or never outlived it).
    for path in (study.workdir / "nodes").glob("*/servers.json"):
        pytest.fail(f"a server is still recorded as running: {path.read_text()}")
    for trial in optuna_study.trials:  # every server the study started is gone
        if trial.user_attrs.get("server_pgid"):
            assert not _group_members(int(trial.user_attrs["server_pgid"])), trial.number
