"""The node check's words when the server command's `python` on this machine is not the one autotune runs
in (`.venv/bin/autotune run ...` without the environment activated): real processes, a stand-in `python`
first on the PATH that fails as the system Python without the simulated server's dependencies does."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from autotune.node.check import check_node
from autotune.node.runner import LocalCommandRunner

pytestmark = pytest.mark.integration

MODULE = "autotune.sim.sglang_server"


def fake_python(folder: Path) -> Path:
    """A `python` that fails an import as /usr/bin/python3 without aiohttp does."""
    folder.mkdir()
    python = folder / "python"
    python.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'aiohttp'\" >&2\nexit 1\n")
    python.chmod(0o755)
    return python


def problems(tmp_path: Path, env: dict[str, str]) -> list[str]:
    report = check_node(
        "local",
        LocalCommandRunner(),
        command=["python", "-m", MODULE],
        env=env,
        host="127.0.0.1",
        port=None,
        log_dir=str(tmp_path / "logs"),
        nvidia_smi=("true",),
    )
    return [f"{p.what} {p.fix}" for p in report.problems]


def test_a_python_that_is_not_autotunes_own_is_named_with_the_way_out(tmp_path: Path) -> None:
    python = fake_python(tmp_path / "bin")
    found = [p for p in problems(tmp_path, {"PATH": f"{python.parent}:{os.environ['PATH']}"}) if MODULE in p]
    assert len(found) == 1, found
    text = found[0]
    assert "No module named 'aiohttp'" in text
    assert f"Here `python` is {python}, not the Python autotune runs in ({sys.executable})" in text
    assert "source .venv/bin/activate" in text and f"[{sys.executable}, -m, {MODULE}]" in text


def test_autotunes_own_python_first_on_the_path_gets_no_such_words(tmp_path: Path) -> None:
    own = Path(sys.executable).parent  # first on the PATH, as an activated environment puts it
    assert (own / "python").exists()
    env = {"PATH": f"{own}:{os.environ['PATH']}"}
    found = problems(tmp_path, env)
    assert not [p for p in found if MODULE in p or "not the Python autotune runs in" in p], found


@pytest.mark.parametrize(
    ("hardware", "visible", "links"),
    [
        ("h200-nvlink-x8", None, "NV18"),
        ("rtx-pro-6000-pcie-x8", None, "SYS"),
        ("rtx-pro-6000-pcie-x8", "0,1", "PIX"),
    ],
)
def test_the_check_reads_how_the_servers_gpus_are_linked(
    tmp_path: Path, hardware: str, visible: str | None, links: str
) -> None:
    env = {"SGLANG_SIM_HARDWARE": hardware, **({"CUDA_VISIBLE_DEVICES": visible} if visible else {})}
    report = check_node(
        "local",
        LocalCommandRunner(),
        command=[sys.executable, "-m", MODULE],
        env=env,
        host="127.0.0.1",
        port=None,
        log_dir=str(tmp_path / "logs"),
        nvidia_smi=(sys.executable, "-m", "autotune.sim.nvidia_smi"),
    )
    assert report.gpu_links == links and report.nvlink == links.startswith("NV")
