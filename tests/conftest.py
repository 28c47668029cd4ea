"""Shared fixtures: the study-file builder, and one small study run through the real CLI, reused by the
tests that read it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.builders import StudyFiles, e2e_study

N_TRIALS = 6


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


@pytest.fixture
def study_file(tmp_path: Path) -> StudyFiles:
    """Writes study files into the test's tmp_path (tests/builders.py says how)."""
    return StudyFiles(tmp_path)


@pytest.fixture(scope="session")
def finished_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    from autotune.config import load_study
    from autotune.study.storage import open_study

    tmp_path = tmp_path_factory.mktemp("study")
    path = StudyFiles(tmp_path)(e2e_study(N_TRIALS))
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
