"""`autotune init` for real: the node inspected through its runner (the simulated node's nvidia-smi and
server, real processes), what is missing reported with what to do, and the written study validated and run."""

from __future__ import annotations

import json
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.config.init import InitError, ModelFacts, NodeFacts
from autotune.config.study import StudyFile
from autotune.node.inspect import inspect_node
from autotune.node.runner import LocalCommandRunner
from tests.builders import REPO
from tests.conftest import run_cli
from tests.processes import ended_side_by_side, own_node_locks

pytestmark = pytest.mark.integration  # the node's commands and the CLI are processes

MODELS = REPO / "tests" / "data" / "models"
SIM_SERVER = f"{sys.executable} -m autotune.sim.sglang_server"
SIM_NVIDIA_SMI = [sys.executable, "-m", "autotune.sim.nvidia_smi"]
TOKEN = "hf_notarealtoken123"


def _inspect(hardware: str, **kwargs: Any) -> tuple[NodeFacts, ModelFacts, ModelFacts | None]:
    arguments: dict[str, Any] = {
        "name": "local",
        "address": "local",
        "command": SIM_SERVER.split(),
        "env": {"SGLANG_SIM_HARDWARE": hardware},
        "nvidia_smi": SIM_NVIDIA_SMI,
        "model_path": str(MODELS / "llama-3-8b-shape"),
        **kwargs,
    }
    return inspect_node(LocalCommandRunner(), **arguments)


def test_the_simulated_node_is_read_as_a_real_one() -> None:
    node, model, draft = _inspect("h200-nvlink-x8", draft_path=str(MODELS / "eagle3-draft"))
    assert (node.gpus, node.gpu_name, node.links, node.nvlink) == (8, "NVIDIA H200", "NV18", True)
    assert node.sglang_version == "0.5.17" and node.flags is not None and "--tp-size" in node.flags
    assert (model.weight_bytes, model.hidden_size, model.moe) == (14496047104, 4096, False)
    assert draft is not None and draft.eagle3
    pcie, _, _ = _inspect(
        "rtx-pro-6000-pcie-x8",
        env={"SGLANG_SIM_HARDWARE": "rtx-pro-6000-pcie-x8", "CUDA_VISIBLE_DEVICES": "0,1"},
    )
    assert (pcie.gpus, pcie.links, pcie.nvlink) == (2, "PIX", False)  # the two GPUs the server would see


def test_what_is_missing_is_named_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(InitError) as caught:
        _inspect(
            "h200-x1",
            command=[sys.executable, "-m", "sglang_not_installed.launch_server"],
            nvidia_smi=["nvidia-smi-not-installed"],
            model_path=str(tmp_path),
        )
    text = str(caught.value)
    assert "module 'sglang_not_installed.launch_server' cannot be imported" in text
    assert "--server-command" in text and "--env KEY=VALUE" in text
    assert (
        "no nvidia-smi-not-installed on the node, so no NVIDIA GPU to tune. Install the NVIDIA driver" in text
    )
    assert f"no config.json in the model folder {tmp_path} on the node" in text


def test_a_node_whose_gpus_are_hidden_has_none(tmp_path: Path) -> None:
    with pytest.raises(InitError, match="nvidia-smi lists no GPU the server would see"):
        _inspect("h200-x1", env={"SGLANG_SIM_HARDWARE": "h200-x1", "CUDA_VISIBLE_DEVICES": "5"})


@pytest.fixture(scope="module")
def studies(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[None]]:
    """The two tests below that init a study and run it, side by side (each mostly waits on its servers,
    on a node lock of its own); each test meets its own run's failure."""
    return ended_side_by_side(
        {
            "short": lambda: _init_then_validate_then_a_short_study(tmp_path_factory.mktemp("short")),
            "readme": lambda: _the_readmes_simulated_init_runs_as_printed(tmp_path_factory.mktemp("readme")),
        }
    )


def test_init_then_validate_then_a_short_study(studies: dict[str, Future[None]]) -> None:
    studies["short"].result()


def test_the_readmes_simulated_init_runs_as_printed(studies: dict[str, Future[None]]) -> None:
    studies["readme"].result()


def _init_then_validate_then_a_short_study(tmp_path: Path) -> None:
    out = tmp_path / "study.yaml"
    init = [
        "init",
        "--model",
        str(MODELS / "llama-3-8b-shape"),
        "--server-command",
        SIM_SERVER,
        "--env",
        "SGLANG_SIM_HARDWARE=h200-x1",
        "--env",
        "SGLANG_SIM_MODEL=llama-8b-dummy",
        "--env",
        "SGLANG_SIM_TIME_SCALE=0.001",
        "--env",
        f"HF_TOKEN={TOKEN}",
        "--port",
        "auto",
        "--out",
        str(out),
    ]
    out.write_text("study: an older one\n")
    done = run_cli(*init, "--force", cwd=tmp_path)  # replaces it (without --force: tests/config/test_init.py)
    assert done.returncode == 0, done.stderr
    assert (
        "node local: 1x NVIDIA H200" in done.stdout
        and "search space: search_spaces/one-gpu.yaml" in done.stdout
    )
    written = yaml.safe_load(out.read_text())
    assert written["server"]["model_weight_gb"] == 14.5 and written["server"]["port"] == "auto"
    assert written["server"]["env"]["HF_TOKEN"] == "${HF_TOKEN}" and TOKEN not in out.read_text()
    assert "note: HF_TOKEN is written as ${HF_TOKEN}: export it" in done.stdout and TOKEN not in done.stdout
    secret = {"HF_TOKEN": TOKEN, **own_node_locks()}  # the commands that read the study take it from the env

    validated = run_cli("validate", str(out), cwd=tmp_path, env=secret)
    assert validated.returncode == 0, validated.stderr
    assert "search space: 9 parameters (sglang)" in validated.stdout

    if "trust" in StudyFile.model_fields:  # a tree with the trust section: this test is about the written
        out.write_text(out.read_text() + "trust: off\n")  # file's trials, not the confirmation rounds after
    ran = run_cli("run", str(out), "--n-trials", "2", "--no-ray", "--no-tracking", cwd=tmp_path, env=secret)
    assert ran.returncode == 0, ran.stderr
    status = run_cli("status", str(out), "--json", cwd=tmp_path, env=secret)
    trials = json.loads(status.stdout)["trials"]
    assert [t["state"] for t in trials][:2] == ["COMPLETE", "COMPLETE"]


def _the_readmes_simulated_init_runs_as_printed(tmp_path: Path) -> None:
    # The README's no-GPU path, nothing added: the simulated node serves the model the study names (its
    # config.json), on the clock init writes, so the baseline completes in seconds.
    init = ["init", "--model", str(MODELS / "llama-3-8b-shape"), "--server-command"]
    done = run_cli(*init, SIM_SERVER, "--env", "SGLANG_SIM_HARDWARE=h200-x1", "--out", "s.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    server = yaml.safe_load((tmp_path / "s.yaml").read_text())["server"]
    env = server["env"]
    assert server["port"] == "auto"  # a free one for each launch: studies side by side
    assert env["SGLANG_SIM_TIME_SCALE"] == "0.2" and env["SGLANG_SIM_STARTUP_TIME_SCALE"] == "0.001"
    # Noise as on real GPUs: the simulated server is timed exactly, so without it any gain would hold up.
    assert env["SGLANG_SIM_NOISE"] == "calibrated"
    started = time.monotonic()
    ran = run_cli(
        "run", "s.yaml", "--n-trials", "2", "--no-ray", "--no-tracking", cwd=tmp_path, env=own_node_locks()
    )
    assert ran.returncode == 0, ran.stderr
    assert time.monotonic() - started < 120
    trials = json.loads(run_cli("status", "s.yaml", "--json", cwd=tmp_path).stdout)["trials"]
    assert trials[0]["state"] == "COMPLETE", trials[0]
    log = next((tmp_path / ".autotune").glob("*/nodes/local/trial-0000/server.log")).read_text()
    assert "type=LlamaForCausalLM" in log and "0.51 GiB is free" not in log


def test_a_model_folder_without_config_json_is_refused_by_the_cli(tmp_path: Path) -> None:
    done = run_cli("init", "--model", str(tmp_path), "--server-command", SIM_SERVER, cwd=tmp_path)
    assert done.returncode == 1
    assert f"no config.json in the model folder {tmp_path} on the node" in done.stderr
    assert not (tmp_path / "study.yaml").exists()


def test_a_node_reached_over_ssh(sshd: Any, tmp_path: Path) -> None:
    # The node is this machine through a real sshd: init asks it over SSH and writes what a study needs there.
    out = tmp_path / "study.yaml"
    done = run_cli(
        "init",
        "--node",
        sshd.address,
        "--key-file",
        str(sshd.user_key),
        "--known-hosts",
        str(sshd.known_hosts),
        "--model",
        str(MODELS / "mixtral-8x7b-shape"),
        "--server-command",
        SIM_SERVER,
        "--env",
        "SGLANG_SIM_HARDWARE=h200-nvlink-x8",
        "--out",
        str(out),
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "node 127.0.0.1: 8x NVIDIA H200" in done.stdout and "NVLink (NV18)" in done.stdout
    node = yaml.safe_load(out.read_text())["nodes"][0]
    assert node == {
        "name": "127.0.0.1",
        "address": sshd.address,
        "key_file": str(sshd.user_key),
        "known_hosts": str(sshd.known_hosts),
        "nvidia_smi": [sys.executable, "-m", "autotune.sim.nvidia_smi"],
    }
    assert yaml.safe_load(out.read_text())["server"]["host"] == "0.0.0.0"
    assert run_cli("validate", str(out), cwd=tmp_path).returncode == 0
