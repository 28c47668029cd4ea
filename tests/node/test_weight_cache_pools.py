"""The weight cache daemon ends with the pool that started it, in-process (`--no-ray`) and through Ray's
node actor (whose kill runs no clean-up: the actor stops its daemon first), on the simulated node."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from autotune.config import Study, load_study
from autotune.node.pool import NodePool, RayNodePool, in_process_pool
from autotune.sim.weight_cache_daemon import live_daemons
from autotune.trial.wire import TrialRequest
from tests.builders import StudyFiles, e2e_study

pytestmark = pytest.mark.integration

POOLS: dict[str, Callable[[Study], NodePool]] = {"local": in_process_pool, "ray": RayNodePool}


@pytest.mark.parametrize("kind", list(POOLS))
def test_the_daemon_ends_with_its_pool(kind: str, tmp_path: Path) -> None:
    data = e2e_study(study=f"wcache-{kind}")
    cache = tmp_path / "weight-cache"
    data["server"]["model_path"] = "/models/Llama-70B"
    data["server"]["env"].update(
        SGLANG_SIM_HARDWARE="h200-nvlink-x8", SGLANG_SIM_MODEL="llama-70b-bf16",
        SGLANG_SIM_STARTUP_TIME_SCALE="0.0002", SGLANG_SIM_WEIGHT_CACHE_DIR=str(cache),
    )  # fmt: skip
    study = load_study(StudyFiles(tmp_path)(data))
    launch = study.server_launch(study.search_space.baseline())
    workload = study.objective.workload
    assert workload is not None
    pool = POOLS[kind](study)
    try:
        for number in (0, 1):  # the first loads from disk; the daemon starts for the second
            pool.submit("local", TrialRequest(number, launch, workload, 60, 60, weight_cache=True))
            deadline = time.monotonic() + 120
            done: list[object] = []
            while not done:
                assert time.monotonic() < deadline
                done = pool.wait(0.5)
            result = done[0][1]  # type: ignore[index]
            assert result.ok, result.failure
        assert any("weights from the weight cache daemon" in n for n in result.startup_notes)
        env = {"SGLANG_SIM_WEIGHT_CACHE_DIR": str(cache)}
        daemons = live_daemons(env)
        assert daemons, "the daemon runs between trials"
    finally:
        pool.close()
        if kind == "ray":
            import ray

            ray.shutdown()
    assert not live_daemons(env)
    for daemon in daemons:
        with pytest.raises(ProcessLookupError):
            os.killpg(daemon.pid, 0)


def test_a_trial_stopped_while_its_daemon_starts_does_not_wait_for_it(tmp_path: Path) -> None:
    import sys
    import threading

    from autotune.measure.client import Workload
    from autotune.node.executor import TrialExecutor
    from autotune.node.runner import LocalCommandRunner, free_port
    from autotune.trial.failures import FailureKind
    from autotune.trial.launch import ServerLaunch

    nvidia_smi = (sys.executable, "-m", "autotune.sim.nvidia_smi")
    executor = TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=5, nvidia_smi=nvidia_smi)
    workload = Workload(num_prompts=2, input_len=100, output_len=8, concurrency=2)
    env = {
        "SGLANG_SIM_HARDWARE": "h200-nvlink-x8", "SGLANG_SIM_MODEL": "llama-70b-bf16",
        "SGLANG_SIM_TIME_SCALE": "0.01", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.1",  # a 5.6 s daemon load
        "SGLANG_SIM_WEIGHT_CACHE_DIR": str(tmp_path / "weight-cache"),
    }  # fmt: skip

    def request(number: int) -> TrialRequest:
        port = free_port()
        argv = (sys.executable, "-m", "autotune.sim.sglang_server")
        flags = (
            ("--model-path", "/models/Llama-70B"),
            ("--tp-size", "8"),
            ("--mem-fraction-static", "0.85"),
            ("--port", str(port)),
        )
        launch = ServerLaunch(argv, env, "127.0.0.1", port, flags=flags)
        return TrialRequest(number, launch, workload, 60, 60, weight_cache=True)

    try:
        assert executor.run(request(0)).ok  # from disk: the readings
        aborted_at: list[float] = []

        def stop_once_the_daemon_starts() -> None:
            _wait_for(lambda: executor.weight_cache.daemon_pgid is not None)
            aborted_at.append(time.monotonic())
            executor.abort()

        threading.Thread(target=stop_once_the_daemon_starts, daemon=True).start()
        result = executor.run(request(1))
        returned_at = time.monotonic()
        assert result.failure is not None and result.failure.kind is FailureKind.INTERRUPTED, (
            result.startup_notes
        )
        assert any("start was stopped with the trial" in n for n in result.startup_notes), (
            result.startup_notes
        )
        # timed from the stop, not the launch: a loaded machine's imports are not the daemon's load
        assert aborted_at and returned_at - aborted_at[0] < 4.0
    finally:
        executor.close()
    assert not live_daemons(env)


def _wait_for(condition: Callable[[], bool], timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
