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
