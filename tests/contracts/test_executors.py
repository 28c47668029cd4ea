"""One contract for both executors a node pool runs trials on: `TrialExecutor` launching the simulated
SGLang server through a local runner (the product), and `ModelNodeExecutor` answering from the server's model
(the tuner's benchmarks). The same request must come back the same way: a benchmark for a launch that
serves, the same classified failure for one that cannot start, a ladder measured on one launch, each a
result that crosses a process boundary whole.

An executor joins by adding itself to EXECUTORS; one that starts processes carries the integration mark.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.config.objective import parse_objective
from autotune.measure.client import Workload
from autotune.measure.plan import MeasurementPlan, plan_for
from autotune.node.executor import TrialExecutor
from autotune.node.pool import Executor
from autotune.node.runner import LocalCommandRunner, free_port
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest, TrialResult
from tests.builders import SIM_SEED_ARGV, SIM_SERVER

SIM = tuple(SIM_SERVER)
SERVER = SIM_SEED_ARGV[len(SIM) :]  # the seed node's default hardware
# Short prompts: the quickstart's 28000-token ones leave most static pools too small for them.
WORKLOAD = Workload(num_prompts=4, input_len=2000, output_len=32, concurrency=2)
EXECUTORS: dict[str, Callable[[Path], Executor]] = {
    "real": lambda folder: TrialExecutor("n0", LocalCommandRunner(folder / "state"), folder, port_wait_s=5),
    "model": lambda folder: ModelNodeExecutor(
        "n0", load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    ),
}
STARTS_PROCESSES = {"real"}


@pytest.fixture(
    params=[
        pytest.param(name, marks=[pytest.mark.integration] if name in STARTS_PROCESSES else [])
        for name in EXECUTORS
    ]
)
def executor(request: pytest.FixtureRequest, tmp_path: Path) -> Executor:
    return EXECUTORS[request.param](tmp_path)


def trial(number: int, flags: tuple[str, ...] = (), plan: MeasurementPlan | None = None) -> TrialRequest:
    port = free_port()
    argv = (*SIM, *SERVER, *flags, "--host", "127.0.0.1", "--port", str(port))
    env = {"SGLANG_SIM_TIME_SCALE": "0.001", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.0005"}
    workload = plan.levels[0] if plan is not None else WORKLOAD
    return TrialRequest(
        number, ServerLaunch(argv, env, "127.0.0.1", port), workload, 60, 60, seed=number, plan=plan
    )


def assert_crosses_a_process_boundary(result: TrialResult) -> None:
    assert pickle.loads(pickle.dumps(result)) == result  # what a Ray actor sends back, whole
    summary = json.loads(json.dumps(result.summary()))  # what the study records
    assert summary["number"] == result.number and "log" not in summary


def test_a_launch_that_serves_returns_its_benchmark(executor: Executor) -> None:
    assert executor.phase == "idle"
    result = executor.run(trial(3))
    assert result.ok and result.failure is None, result.failure
    assert (result.number, result.node) == (3, "n0")
    assert result.benchmark is not None and result.benchmark.completed == WORKLOAD.num_prompts
    assert result.benchmark.workload == WORKLOAD and result.benchmark.output_throughput > 0
    assert result.startup_s is not None and result.startup_s > 0
    assert result.benchmark_s is not None and result.benchmark_s > 0
    assert result.server_choices.get("--mem-fraction-static", 0) > 0  # what the server chose, read back
    assert executor.phase == "idle"
    assert_crosses_a_process_boundary(result)


FAILURES = {
    "a feature this GPU lacks": (("--enable-flashinfer-allreduce-fusion",), FailureKind.UNSUPPORTED),
    "weights that leave no KV pool": (("--mem-fraction-static", "0.70"), FailureKind.KV_POOL_TOO_SMALL),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_a_launch_that_cannot_start_returns_its_classified_failure(executor: Executor, case: str) -> None:
    flags, kind = FAILURES[case]
    result = executor.run(trial(4, flags))
    assert not result.ok and result.benchmark is None
    assert result.failure is not None and result.failure.kind is kind, result.failure
    assert result.failure.line and result.failure.line in result.log  # the line that shows it, from the log
    assert result.failure.advice == kind.advice
    if kind is FailureKind.UNSUPPORTED:
        assert flags[0] in result.failure.culprits
    assert executor.phase == "idle"
    assert_crosses_a_process_boundary(result)


def test_a_ladder_is_measured_level_by_level_on_one_launch(executor: Executor) -> None:
    workload = {"num_prompts": 4, "input_len": 2000, "output_len": 32, "concurrency": 2}
    ladder = {"concurrency": [1, 2], "prompts_per_concurrency": 2}
    plan = plan_for(
        parse_objective({"name": "t", "metric": "output_throughput", "workload": workload, "ladder": ladder})
    )
    result = executor.run(trial(5, plan=plan))
    assert result.ok, result.failure
    assert result.benchmark is not None
    assert [level.workload.concurrency for level in result.benchmark.levels] == [1, 2]
    assert [level.completed for level in result.benchmark.levels] == [2, 4]


def test_an_abort_while_idle_leaves_the_next_trial_alone(executor: Executor) -> None:
    executor.abort()
    result = executor.run(trial(8))
    assert result.ok, result.failure
