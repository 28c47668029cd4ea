"""autotune installed from a wheel, not a checkout (issue 41.8): the shipped search spaces, objectives and
examples come with it, and `autotune init` on the simulated node writes a study whose files exist."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.builders import REPO

pytestmark = pytest.mark.integration  # builds, creates a virtualenv, runs the installed CLI


def _run(*argv: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{argv}: {done.stdout}\n{done.stderr}"
    return done


def _install(tmp_path: Path) -> Path:
    """Build the sdist and the wheel from it (as a release would), install the wheel into a new virtualenv
    with its dependencies; the virtualenv's python."""
    dist, venv = tmp_path / "dist", tmp_path / "venv"
    python = venv / "bin" / "python"
    if importlib.util.find_spec("uv") is not None:  # scripts/bootstrap installs it: seconds, from its cache
        uv = (sys.executable, "-m", "uv")
        _run(*uv, "build", "--quiet", "--out-dir", dist, REPO)
        _run(*uv, "venv", "--quiet", "--python", sys.executable, venv)
        _run(*uv, "pip", "install", "--quiet", "--python", python, *dist.glob("*.whl"))
    else:
        _run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, REPO)
        _run(sys.executable, "-m", "venv", venv)
        _run(python, "-m", "pip", "install", "--quiet", *dist.glob("*.whl"))
    return python


def test_init_from_a_wheel_writes_a_study_whose_files_ship_with_it(tmp_path: Path) -> None:
    python = _install(tmp_path)
    autotune = python.parent / "autotune"
    where = _run(python, "-c", "import autotune; print(autotune.__file__)", cwd=tmp_path).stdout.strip()
    package = Path(where).parent
    assert not package.is_relative_to(REPO), "the installed package, not the checkout"
    for name in ("search_spaces", "objectives", "examples"):
        shipped = {p.name for p in (package / "shipped" / name).glob("*.yaml")}
        assert shipped == {p.name for p in (REPO / name).glob("*.yaml")}, name

    work = tmp_path / "work"
    work.mkdir()
    model = REPO / "tests" / "data" / "models" / "llama-3-8b-shape"
    server = f"{python} -m autotune.sim.sglang_server"
    simulated = ("--server-command", server, "--env", "SGLANG_SIM_HARDWARE=h200-x1")
    _run(autotune, "init", "--model", model, *simulated, cwd=work)
    study = yaml.safe_load((work / "study.yaml").read_text())
    for key in ("search_space", "objective"):
        path = Path(study[key])
        assert path.is_file() and path.is_relative_to(package), (key, path)
    assert ": OK" in _run(autotune, "validate", "study.yaml", cwd=work).stdout
    # The examples name the shipped files beside them, as in the checkout.
    assert ": OK" in _run(autotune, "validate", package / "shipped" / "examples" / "quickstart.yaml").stdout
