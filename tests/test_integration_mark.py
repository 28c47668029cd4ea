"""The rule behind `scripts/test --fast`: a test that starts a process, or uses a fixture that started one,
is marked integration, or it fails. Checked on a small suite of its own, run as pytest runs ours."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.builders import REPO

SUITE = """
import subprocess, sys
import pytest

def start():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

@pytest.fixture(scope="module")
def server():
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()

def test_unmarked_starts_one():
    start()

@pytest.mark.integration
def test_marked_starts_one():
    start()

def test_unmarked_starts_none():
    assert sum([1, 1]) == 2

@pytest.mark.integration
def test_marked_is_first_to_use_the_server(server):
    assert server.poll() is None

def test_unmarked_uses_the_server_after(server):
    assert server.poll() is None
"""


@pytest.mark.integration
def test_an_unmarked_test_that_starts_a_process_or_uses_one_fails(tmp_path: Path) -> None:
    hooks = "_no_process_unless_integration, pytest_fixture_setup, pytest_runtest_setup"
    (tmp_path / "conftest.py").write_text(f"from tests.conftest import {hooks}\n")
    (tmp_path / "test_suite.py").write_text(textwrap.dedent(SUITE))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rE",
            "-W",
            "ignore",
            str(tmp_path),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    failed = sorted(
        line.split("::")[1].split()[0] for line in done.stdout.splitlines() if line.startswith("ERROR")
    )
    assert failed == ["test_unmarked_starts_one", "test_unmarked_uses_the_server_after"], done.stdout
    assert "started 1 process(es)" in done.stdout and "uses ['server']" in done.stdout
    assert "5 passed, 2 errors" in done.stdout  # each ran; the two fail at teardown
