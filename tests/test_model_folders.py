"""What fails a real node's study at once is found in seconds: a model folder SGLang cannot load, from
`autotune validate` (asked of the node through its runner, over SSH too), and a taken port, before Ray
starts. The simulated node, which reads no weights, says so."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.builders import REPO
from tests.conftest import run_cli

pytestmark = pytest.mark.integration  # the node is asked through processes (sh, ssh), the CLI is one

MODELS = REPO / "tests" / "data" / "models"
SGLANG = ["python3", "-m", "sglang.launch_server"]


def _study(folder: Path, server: dict[str, Any], nodes: list[dict[str, Any]] | None = None) -> Path:
    data = {
        "study": "s",
        "search_space": str(REPO / "search_spaces" / "one-gpu.yaml"),
        "objective": str(REPO / "objectives" / "serving-throughput.yaml"),
        "nodes": nodes or [{"name": "local", "address": "local"}],
        "server": {"command": SGLANG, **server},
    }
    path = folder / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_validate_refuses_a_model_folder_sglang_cannot_load(tmp_path: Path) -> None:
    missing = run_cli("validate", str(_study(tmp_path, {"model_path": "/does/not/exist"})), cwd=tmp_path)
    assert missing.returncode == 1 and "OK" not in missing.stdout
    said = "server.model_path /does/not/exist does not exist on the node. Set server.model_path"
    assert said in missing.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    bare = run_cli("validate", str(_study(tmp_path, {"model_path": str(empty)})), cwd=tmp_path)
    assert bare.returncode == 1 and f"server.model_path {empty} on the node has no config.json" in bare.stderr
    model = str(MODELS / "llama-3-8b-shape")
    with_draft = _study(tmp_path, {"model_path": model, "draft_model_path": "/no/draft"})
    draft = run_cli("validate", str(with_draft), cwd=tmp_path)
    assert draft.returncode == 1 and "server.draft_model_path /no/draft does not exist" in draft.stderr
    found = run_cli("validate", str(_study(tmp_path, {"model_path": model})), cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert f"model: {model}: config.json found on the node" in found.stdout
    # A Hugging Face id is SGLang's to download.
    hub = run_cli("validate", str(_study(tmp_path, {"model_path": "meta-llama/Llama-3.1-8B"})), cwd=tmp_path)
    assert hub.returncode == 0, hub.stderr


def test_validate_asks_a_node_reached_over_ssh(sshd: Any, tmp_path: Path) -> None:
    node = {
        "name": "gpu1",
        "address": sshd.address,
        "key_file": str(sshd.user_key),
        "known_hosts": str(sshd.known_hosts),
    }
    server = {"model_path": "/does/not/exist", "host": "0.0.0.0"}
    done = run_cli("validate", str(_study(tmp_path, server, [node])), cwd=tmp_path)
    assert done.returncode == 1 and "gpu1: server.model_path /does/not/exist does not exist" in done.stderr
    server["model_path"] = str(MODELS / "llama-3-8b-shape")
    done = run_cli("validate", str(_study(tmp_path, server, [node])), cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_the_simulated_node_says_it_reads_no_weights(tmp_path: Path) -> None:
    sim = ["python", "-m", "autotune.sim.sglang_server"]
    server = {"command": sim, "model_path": "/does/not/exist"}
    done = run_cli("validate", str(_study(tmp_path, server)), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "model: the simulated node reads no weights" in done.stdout


def test_a_taken_port_fails_the_run_before_ray_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = {"model_path": str(MODELS / "llama-3-8b-shape"), "port": port}
        started = time.monotonic()
        done = run_cli("run", str(_study(tmp_path, server)), "--no-tracking", cwd=tmp_path)
        elapsed = time.monotonic() - started
    assert done.returncode == 1
    assert f"local: port {port} is already in use on the node" in done.stderr
    assert elapsed < 30, elapsed  # seconds of Python's start, not Ray's minute nor SGLang's import
    assert not (tmp_path / ".autotune" / "s" / "nodes").exists()  # no actor made its node folder
