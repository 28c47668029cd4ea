"""Shared fixtures: one small study run through the real CLI, reused by the tests that read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from autotune.node.runner import free_port

REPO = Path(__file__).resolve().parents[1]
N_TRIALS = 6


def write_study(tmp_path: Path, n_trials: int = N_TRIALS) -> Path:
    objective = {
        "name": "small-throughput",
        "metric": "output_throughput",
        "workload": {"num_prompts": 6, "input_len": 2000, "output_len": 64, "concurrency": 3},
    }
    (tmp_path / "objective.yaml").write_text(yaml.safe_dump(objective))
    study = {
        "study": "e2e",
        "search_space": str(REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"),
        "objective": "objective.yaml",
        "nodes": [
            {
                "name": "local",
                "address": "local",
                "nvidia_smi": [sys.executable, "-m", "autotune.sim.nvidia_smi"],
            }
        ],
        "server": {
            "command": [sys.executable, "-m", "autotune.sim.sglang_server"],
            "model_path": "/models/Kimi-K2.5",
            "draft_model_path": "/models/Kimi-K2.5-EAGLE3",
            "model_weight_gb": 547,
            "port": free_port(),
            "flags": {"--tp-size": 8},
            "env": {"SGLANG_SIM_TIME_SCALE": "0.001", "HF_TOKEN": "hf_secret_value_123"},
        },
        "budget": {"n_trials": n_trials},
        "sampler": {"name": "tpe", "seed": 3},
        "timeouts": {"startup_s": 60, "benchmark_s": 60},
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(study, sort_keys=False))
    return path


def run_cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    """`python -m autotune ARGS` in `cwd`, with this environment plus `env`."""
    env = dict(os.environ, RAY_AUTH_MODE="disabled", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    from autotune.config import load_study
    from autotune.study.storage import open_study

    tmp_path = tmp_path_factory.mktemp("study")
    path = write_study(tmp_path)
    # A trial that fails on the simulated SM120 node every time (FlashInfer's all-reduce fusion needs SM90
    # or SM10X), so the finished study has a failure to explain whatever the sampler proposes.
    open_study(load_study(path)).enqueue_trial({"--enable-flashinfer-allreduce-fusion": True})
    return path, run_cli("run", str(path), cwd=tmp_path)


@pytest.fixture(scope="session")
def postgres_url(tmp_path_factory: pytest.TempPathFactory):
    """A real PostgreSQL server started for the test session."""
    import shutil
    import tempfile

    from tests.postgres import postgres_server

    # Not under pytest's temporary folder: that one is private to this user, and PostgreSQL runs as another.
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    try:
        with postgres_server(root) as url:
            yield url
    finally:
        shutil.rmtree(root, ignore_errors=True)
