"""scripts/quickstart prints next commands that work in the shell that started it, whose PATH lacks the
clone's .venv (the script activates it for itself only)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.builders import REPO

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # the quickstart study itself, one trial long

FILES = (
    "scripts/quickstart",
    "examples/quickstart.yaml",
    "search_spaces/sglang-nccl-eagle3.yaml",
    "objectives/quickstart.yaml",
)


@pytest.mark.timeout(900)  # the NCCL stage's 26 jobs and a trial: minutes on a loaded machine
def test_the_next_commands_run_where_they_are_printed(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    for name in FILES:
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, clone / name)
    # The install is this checkout's .venv, already made: the clone's bootstrap has nothing left to do.
    (clone / ".venv").symlink_to(REPO / ".venv")
    (clone / "scripts" / "bootstrap").write_text("#!/usr/bin/env bash\nexit 0\n")
    (clone / "scripts" / "bootstrap").chmod(0o755)
    home = os.environ.get("HOME", str(tmp_path))
    shell = {"PATH": "/usr/bin:/bin", "HOME": home, "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run(
        ["bash", "scripts/quickstart", "--n-trials", "1", "--no-tracking"],
        cwd=clone,
        env=shell,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    printed = [line.split("#")[0].strip() for line in done.stdout.splitlines() if line.startswith("  .venv/")]
    assert "next:" in done.stdout and len(printed) == 4, done.stdout
    assert not any(line.startswith("  autotune ") for line in done.stdout.splitlines())
    status = next(line for line in printed if " status " in line)
    assert status == ".venv/bin/autotune status examples/quickstart.yaml"
    ran = subprocess.run(status.split(), cwd=clone, env=shell, capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr  # as printed, in the shell that started the script
    assert "source .venv/bin/activate" in done.stdout
