"""`autotune status` for a person (autotune.views.status): rows that fit the terminal and a sentence for
every failure, read from a real study run on the model node."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.cli import main
from autotune.cli.answers import _status_notes, _trial_record
from autotune.config import load_study
from autotune.node.pool import LocalNodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.study.storage import open_study
from autotune.views.status import fitted
from tests.builders import StudyFiles

# Every switch of the shipped space on at once: a row of 300+ columns unwrapped.
WIDE = {
    "--mem-fraction-static": 0.85,
    "--chunked-prefill-size": 4096,
    "--max-running-requests": 64,
    "--speculative-algorithm": "EAGLE3",
    "--speculative-num-steps": 3,
    "--speculative-eagle-topk": 4,
    "--speculative-num-draft-tokens": 8,
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "LL128",
}


def model_pool(_study: object) -> LocalNodePool:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return LocalNodePool({"n": ModelNodeExecutor("n", hw, model)}, {"n": node_report("n", hw, model)})


@pytest.fixture
def ran(study_file: StudyFiles) -> Path:
    """Three trials: the baseline, a wide config, and --ep-size 8, which SGLang's FlashInfer dispatcher
    refuses on the seed node's SM120 GPUs with a bare `AssertionError`."""
    path = study_file(n_trials=3, nccl_stage=False)
    ostudy = open_study(load_study(path))
    ostudy.enqueue_trial(WIDE)
    ostudy.enqueue_trial({"--ep-size": 8, "--mem-fraction-static": 0.85})
    StudyDriver(load_study(path), pool=model_pool, tracking=False).run()
    return path


def test_status_rows_fit_the_terminal_and_keep_every_setting(
    ran: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["status", str(ran)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    text = " ".join(lines)
    for name, value in WIDE.items():
        assert f"{name}={value}" in text or f"{name}={str(value).lower()}" in text, name


def test_every_failure_says_what_went_wrong_in_a_sentence(ran: Path) -> None:
    trial = open_study(load_study(ran)).trials[2]
    record = _trial_record(trial)
    assert (record["failure_kind"], record["failure"]) == ("unsupported", "AssertionError")
    assert _status_notes(record) == [
        "expert-parallel FlashInfer all-to-all backend assertion failed: SGLang says: AssertionError"
    ]


def test_a_long_word_is_cut_at_the_edge_and_goes_on() -> None:
    lines = fitted("  7  FAIL  ", "a " + "x" * 60 + " b", 40)
    assert all(len(line) <= 40 for line in lines)
    assert "".join(line[len("  7  FAIL  ") :] for line in lines).replace(" ", "") == "a" + "x" * 60 + "b"


def test_status_and_the_trial_show_where_start_up_went(ran: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The baseline: 547 GB at 0.91 GB/s with SGLang's 8 loader threads (4x on this node), graphs, ready.
    trial = open_study(load_study(ran)).trials[0]
    phases = _trial_record(trial)["startup_phases"]
    assert phases["weight_load_s"] == pytest.approx(601.1 / 4, abs=0.1)
    assert set(phases) == {"init_s", "weight_load_s", "kv_pool_s", "cuda_graph_s", "ready_s"}
    assert main(["status", str(ran)]) == 0
    out = capsys.readouterr().out
    shown = "start-up (median of 2 launches): init 15 s, weights 150 s, KV pool 0 s, CUDA graphs "
    assert shown in " ".join(out.split())
