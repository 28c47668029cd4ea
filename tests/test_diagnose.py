"""`autotune diagnose` on logs the simulated node really wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.node.runner import free_port


def sim_log(tmp_path: Path, *flags: str) -> Path:
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "autotune.sim.sglang_server",
                "--model-path",
                "/m",
                "--tp-size",
                "8",
                "--port",
                str(free_port()),
                *flags,
            ],
            env={"SGLANG_SIM_TIME_SCALE": "0.0005", "PATH": "/usr/bin:/bin"},
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=20,
            check=False,
        )
    return log


def diagnose(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "diagnose", *args], capture_output=True, text=True
    )


@pytest.mark.parametrize(
    ("flags", "kind", "evidence"),
    [
        # SGLang 0.5.15+ wording (mem_cache/kv_cache_configurator.py), as the simulated 0.5.17 prints it.
        (
            ("--mem-fraction-static", "0.55"),
            "kv_pool_too_small",
            "Loaded weights leave no GPU memory for the KV cache",
        ),
        # 0.5.17 layers/flashinfer_comm_fusion.py: the fusion needs SM90/SM10X; the simulated node is SM120.
        (
            ("--enable-flashinfer-allreduce-fusion",),
            "unsupported",
            "FlashInfer allreduce fusion requires SM90 or SM10X",
        ),
        (
            ("--mem-fraction-static", "0.95", "--cuda-graph-max-bs-decode", "1024"),
            "cuda_graph_oom",
            "Capture cuda graph failed",
        ),
        (("--attention-backend", "flash"), "invalid_arguments", "invalid choice: 'flash'"),
        # 547 GB of weights on one 96 GB GPU: torch's OOM inside the model loader's traceback.
        (("--tp-size", "1"), "weights_do_not_fit", "0.51 GiB is free"),
    ],
    ids=["kv-pool", "fusion", "graph-oom", "argparse", "weights"],
)
@pytest.mark.integration
def test_diagnose_names_the_kind_the_line_and_the_advice(
    tmp_path: Path, flags: tuple[str, ...], kind: str, evidence: str
) -> None:
    log = sim_log(tmp_path, *flags)
    text = diagnose(str(log))
    assert text.returncode == 1
    assert f": {kind}:" in text.stdout and evidence in text.stdout and "advice:" in text.stdout
    data = json.loads(diagnose(str(log), "--json").stdout)
    assert data["failure"]["kind"] == kind and evidence in data["failure"]["line"]


@pytest.mark.integration
def test_weights_that_do_not_fit_are_not_cured_by_smaller_graphs(tmp_path: Path) -> None:
    text = diagnose(str(sim_log(tmp_path, "--tp-size", "1"))).stdout
    assert "weights_do_not_fit" in text and "--tp-size" in text and "quantized model" in text
    assert "cuda-graph-max-bs" not in text and "cuda_graph_oom" not in text


@pytest.mark.integration
def test_an_argparse_rejection_is_reported_with_sglangs_message_and_culprit(tmp_path: Path) -> None:
    # Real SGLang 0.5.23 on a flag it no longer has (argparse; exit status 2, nothing else logged).
    log = tmp_path / "server.log"
    log.write_text(
        "usage: sglang serve [-h] --model-path MODEL_PATH\n"
        "                    [--cuda-graph-max-bs-decode CUDA_GRAPH_MAX_BS_DECODE]\n"
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill\n"
    )
    text = diagnose(str(log))
    assert text.returncode == 1 and ": invalid_arguments:" in text.stdout
    assert "line:   sglang serve: error: ambiguous option: --cuda-graph-max-bs could match" in text.stdout
    assert "culprits: --cuda-graph-max-bs" in text.stdout
    data = json.loads(diagnose(str(log), "--json").stdout)
    assert data["failure"]["kind"] == "invalid_arguments"
    assert data["failure"]["culprits"] == ["--cuda-graph-max-bs"]


@pytest.mark.integration
def test_a_healthy_log_has_no_failure(tmp_path: Path) -> None:
    log = tmp_path / "ok.log"
    log.write_text(
        "[2026-02-27 11:50:37] The server is fired up and ready to roll!\n"
        "[2026-02-27 11:50:40 TP0] Decode batch [40], #running-req: 4, error_handler=None\n"
    )
    result = diagnose(str(log))
    assert result.returncode == 0 and "no known failure pattern" in result.stdout


@pytest.mark.integration
def test_a_missing_log_is_a_usage_error(tmp_path: Path) -> None:
    result = diagnose(str(tmp_path / "nope.log"))
    assert result.returncode == 2 and "nope.log" in result.stderr and "Traceback" not in result.stderr


def test_status_quotes_sglangs_message_for_a_rejected_flag() -> None:
    from autotune.cli.answers import _status_notes

    line = "sglang serve: error: argument --attention-backend: invalid choice: 'flash' (choose from 'fa3')"
    record = {
        "over_limits": None, "pruned_by": None, "remeasure_of": None, "proposed": None, "queued": None,
        "load_warning": None, "confirm": None, "same_as": None,
    }
    notes = _status_notes({**record, "failure_kind": "invalid_arguments", "failure": line})
    assert notes == [f"SGLang says: {line}"]
    assert _status_notes({**record, "failure_kind": "cuda_graph_oom", "failure": "x"}) == []
