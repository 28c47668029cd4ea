"""One contract for every node pool the study loop hands trials to: the in-process pool of model nodes
(the tuner's benchmarks), the in-process pool of the study's nodes (`autotune run --no-ray`) and the Ray
pool (the product), the last two on the simulated SGLang server. A node is idle until given a trial and
busy until its result is collected; every submitted trial comes back through wait(), aborted ones too;
the node check's facts are there before the first trial.

A pool joins by adding itself to POOLS; one that starts processes carries the integration mark.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

from autotune.config import Study, load_study
from autotune.node.check import NodeReport
from autotune.node.pool import LocalNodePool, NodePool, RayNodePool, Submitted, in_process_pool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.trial.wire import TRIAL_PHASES, TrialRequest, TrialResult
from tests.builders import StudyFiles, e2e_study


def model_pool(study: Study) -> NodePool:
    hardware, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return LocalNodePool(
        {"n0": ModelNodeExecutor("n0", hardware, model)}, {"n0": node_report("n0", hardware, model)}
    )


def ray_pool(study: Study) -> NodePool:
    return RayNodePool(study)


POOLS: dict[str, Callable[[Study], NodePool]] = {
    "model": model_pool,
    "local": in_process_pool,
    "ray": ray_pool,
}
STARTS_PROCESSES = {"local", "ray"}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[pytest.mark.integration] if name in STARTS_PROCESSES else [])
        for name in POOLS
    ],
)
def pool_and_study(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodePool, Study]]:
    # The simulated node's start-up at a ten-thousandth of real time: the pool is tested, not the server.
    data = e2e_study(study=f"pool-{request.param}")
    data["server"]["env"]["SGLANG_SIM_STARTUP_TIME_SCALE"] = "0.0002"
    study = load_study(StudyFiles(tmp_path_factory.mktemp(request.param))(data))
    pool = POOLS[request.param](study)
    yield pool, study
    pool.close()
    if request.param == "ray":
        import ray

        ray.shutdown()


@pytest.fixture
def pool(pool_and_study: tuple[NodePool, Study]) -> NodePool:
    return pool_and_study[0]


def request_for(study: Study, number: int) -> TrialRequest:
    workload = study.objective.workload
    assert workload is not None
    return TrialRequest(
        number, study.server_launch(study.search_space.baseline()), workload, 60, 60, seed=number
    )


def collect(pool: NodePool, count: int, timeout_s: float = 120.0) -> list[tuple[Submitted, TrialResult]]:
    done: list[tuple[Submitted, TrialResult]] = []
    deadline = time.monotonic() + timeout_s
    while len(done) < count:
        assert time.monotonic() < deadline, f"{len(done)} of {count} trials came back"
        done += pool.wait(0.5)
    return done


def test_the_node_checks_facts_are_there_before_any_trial(pool: NodePool) -> None:
    [node] = pool.idle_nodes()
    facts = pool.facts(node)
    assert isinstance(facts, NodeReport) and facts.node == node and facts.ok
    assert facts.hardware is not None and facts.hardware.startswith("8x NVIDIA RTX PRO 6000")
    assert pool.facts("no-such-node") is None


def test_a_node_is_busy_from_submit_until_its_result_is_collected(
    pool_and_study: tuple[NodePool, Study],
) -> None:
    pool, study = pool_and_study
    [node] = pool.idle_nodes()
    submitted = pool.submit(node, request_for(study, 1))
    assert submitted.node == node and submitted.request.number == 1
    assert pool.idle_nodes() == []
    phase = pool.phase(submitted)
    assert phase is None or phase in TRIAL_PHASES, phase
    [(back, result)] = collect(pool, 1)
    assert back == submitted
    assert (result.number, result.node) == (1, node) and result.ok, result.failure
    assert pool.idle_nodes() == [node]


def test_wait_with_nothing_running_returns_nothing_after_its_timeout(pool: NodePool) -> None:
    started = time.monotonic()
    assert pool.wait(0.3) == []
    assert time.monotonic() - started < 10


def test_an_aborted_trial_still_comes_back_through_wait(pool_and_study: tuple[NodePool, Study]) -> None:
    pool, study = pool_and_study
    [node] = pool.idle_nodes()
    submitted = pool.submit(node, request_for(study, 2))
    pool.abort_all()
    [(back, result)] = collect(pool, 1)
    assert back == submitted and result.number == 2
    assert result.ok or result.failure is not None  # stopped, or done before the abort arrived
    assert pool.idle_nodes() == [node]
