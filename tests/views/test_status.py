"""`autotune status` for a person (autotune.views.status): rows that fit the terminal and a sentence for
every failure, read from a real study run on the model node."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest

from autotune.cli import main
from autotune.cli.answers import _status_notes, _trial_record
from autotune.config import load_study
from autotune.node.pool import LocalNodePool
from autotune.sim.model.startup import DUMP_OVER_READ, SHARDED_READ_EXPONENT
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.study.storage import open_study
from autotune.views.startup import startup_summary
from autotune.views.status import fitted
from tests.builders import StudyFiles, stored_trial

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
    optuna_study = open_study(load_study(path))
    optuna_study.enqueue_trial(WIDE)
    optuna_study.enqueue_trial({"--ep-size": 8, "--mem-fraction-static": 0.85})
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
    assert lines[0] == "  7  FAIL", "a word too wide beside the row goes under it"
    assert "".join(lines[1:]).replace(" ", "") == "a" + "x" * 60 + "b"


def test_at_80_columns_no_flag_is_cut_mid_word(
    ran: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["status", str(ran)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    words = {word for line in lines for word in line.split()}
    for name, value in WIDE.items():
        assert f"{name}={value}" in words or f"{name}={str(value).lower()}" in words, (name, lines)
    rows = [line for line in lines if re.match(r"\s+\d+  [A-Z]", line)]
    assert len(rows) == 3 and not any("=" in row or "baseline" in row for row in rows), "one way a table"


def staged(study_file: StudyFiles, trials: int | None) -> Path:
    """A study with the NCCL stage on the seed's node: run whole, or (trials=N) stopped after N of the
    stage's all-reduce trials, as a Ctrl-C during the stage leaves it (the study's baseline queued)."""
    from autotune.study import stages

    path = study_file(n_trials=3, nccl_stage={"hidden_size": 7168})
    study = load_study(path)
    if trials is None:
        StudyDriver(study, pool=model_pool, tracking=False).run()
        return path
    stage = stages.stage_study(study, 96.0, None)
    sampler = stages.CoordinateAscent(stages.stage_knobs(study))
    StudyDriver(stage, pool=model_pool, sampler=sampler, tracking=False).run(trials)
    open_study(study)
    return path


def test_the_values_the_nccl_stage_held_are_said_once_above_the_table(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    path = staged(study_file, None)
    assert main(["status", str(path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#  state"))
    held = [line for line in lines[:table] if "held in every server trial" in line]
    assert held, lines
    end = next(i for i, line in enumerate(lines) if line.startswith("study t:"))  # the answer: after the rows
    assert not any("NCCL_" in line for line in lines[table:end]), "\n".join(lines)


def test_a_stage_a_budget_cut_short_is_shown_as_the_study_held_it(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    # 0.4 node h on the seed's node: the stage gets a fifth of what the search may spend, 7 of its jobs.
    budget = {"node_hours": 0.4, "n_trials": 3}
    path = study_file(
        n_trials=None, nccl_stage={"hidden_size": 7168}, budget=budget, startup={"presharded_weights": False}
    )
    StudyDriver(load_study(path), pool=model_pool, tracking=False).run()
    assert main(["status", str(path), "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["nccl_stage"]
    assert stage["text"][0].startswith("NCCL stage t.nccl-stage: 7 all-reduce trials, cut short by its share")
    assert stage["held"] == {"NCCL_P2P_LEVEL": "SYS"}  # not "not finished": a resume does not continue it
    assert not any("not finished" in line for line in stage["text"])


def test_status_after_a_ctrl_c_in_the_nccl_stage_shows_its_progress(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = staged(study_file, 5)
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"NCCL stage t\.nccl-stage: 5 of \d+ all-reduce trials measured", out), out
    assert f"autotune resume {path}" in out
    assert main(["status", str(path), "--json"]) == 0
    stage = json.loads(capsys.readouterr().out)["nccl_stage"]
    assert stage["text"][0].startswith("NCCL stage t.nccl-stage: 5") and stage["held"] == {}


@pytest.mark.parametrize(
    ("trials", "line"),
    [
        ((), "stopping: no trial was running; a resume continues where the study stopped"),
        ((3,), "stopping trial 3 (Ctrl-C again to stop at once)"),
        ((3, 4), "stopping trials 3, 4 (Ctrl-C again to stop at once)"),
    ],
)
def test_a_ctrl_c_says_which_trials_it_stops_in_a_sentence(trials: tuple[int, ...], line: str) -> None:
    from autotune.cli.console import ConsoleReporter
    from autotune.study.callbacks import StudyInterrupting

    stream = io.StringIO()
    ConsoleReporter(stream).study_interrupting(StudyInterrupting(trials))
    assert stream.getvalue() == line + "\n"


def test_a_sigterm_says_what_stops_at_once_in_its_own_words() -> None:
    # After `timeout` sent SIGTERM on the H200 the console still said "Ctrl-C again to stop at once".
    from autotune.cli.console import ConsoleReporter
    from autotune.study.callbacks import StudyInterrupting

    stream = io.StringIO()
    ConsoleReporter(stream).study_interrupting(StudyInterrupting((8,), "SIGTERM"))
    assert stream.getvalue() == "stopping trial 8 (SIGTERM again to stop at once)\n"


@pytest.mark.integration  # the CLI, the simulated node's all-reduce jobs, a Ctrl-C
def test_a_ctrl_c_in_the_nccl_stage_leaves_a_status_that_shows_the_stage(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import optuna

    from tests.builders import SIM_TIMEOUTS, simulated_server

    nvidia_smi = [sys.executable, "-m", "autotune.sim.nvidia_smi"]
    path = study_file(
        n_trials=3,
        nodes=[{"name": "local", "address": "local", "nvidia_smi": nvidia_smi}],
        server=simulated_server(model_weight_gb=547, draft_model_path="/models/Kimi-K2.5-EAGLE3"),
        timeouts=SIM_TIMEOUTS,
        nccl_stage={"hidden_size": 7168, "command": [sys.executable, "-m", "autotune.sim.nccl_job"]},
    )
    study = load_study(path)
    run = subprocess.Popen(
        [sys.executable, "-m", "autotune", "run", str(path), "--no-ray", "--no-tracking"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            time.sleep(0.5)
            if not (study.workdir / "optuna.db").exists():
                continue
            try:
                stage = optuna.load_study(study_name="t.nccl-stage", storage=study.storage)
            except KeyError:
                continue
            if sum(t.state.is_finished() for t in stage.get_trials(deepcopy=False)) >= 3:
                break
        run.send_signal(signal.SIGINT)
        _out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 130, err
    assert "[]" not in err, err
    assert re.search(r"stopping(?: trials? [\d, ]+ \(Ctrl-C|: no trial was running)", err), err
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["status", str(path)]) == 0
    out = capsys.readouterr().out
    found = re.search(r"NCCL stage t\.nccl-stage: (\d+) of 26 all-reduce trials measured", out)
    assert found and int(found.group(1)) >= 3, out


def test_status_and_the_trial_show_where_start_up_went(ran: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The baseline: 547 GB at 0.91 GB/s with SGLang's 8 loader threads (4.0x on this node; it maps the
    # shards, so the 512 GB host's memory asks for no fewer: startup_prep.fit_loader), then its presharded
    # dump (the host's page cache cannot keep the weights: node.presharded), graphs, ready. No page cache
    # step before it: the checkpoint is read this once.
    trial = open_study(load_study(ran)).trials[0]
    phases = _trial_record(trial)["startup_phases"]
    dump = DUMP_OVER_READ * 601.1 / 8**SHARDED_READ_EXPONENT
    assert phases["weight_load_s"] == pytest.approx(601.1 / 4.0 + dump, abs=0.1)
    assert set(phases) == {"init_s", "weight_load_s", "weight_dump_s", "kv_pool_s", "cuda_graph_s", "ready_s"}
    assert phases["weight_dump_s"] == pytest.approx(dump, abs=0.1)
    assert main(["status", str(ran)]) == 0
    out = capsys.readouterr().out
    # the median of the baseline's load without its dump (150 s) and the next launch's read of its share
    # (67 s: 0.68 of it from the page cache, node.page_cache, whose step read that part from disk first);
    # the dump said apart, a one-time cost
    shown = "start-up (median of 2 launches): page cache 102 s, init 15 s, weights 109 s, KV pool 0 s, CUDA "
    assert shown in " ".join(out.split())
    assert "; 1 of them also wrote a presharded dump (306 s, once per layout)" in " ".join(out.split())
    # Loading is most of it: the setting that skips it, and what SGLang's weight cache serves.
    assert re.search(
        r"; loading the weights is (7\d|8\d|9\d)% of it: .* `startup: \{weight_cache: true\}`",
        " ".join(out.split()),
    )


SEED_STARTUP = {"init_s": 15.0, "weight_load_s": 240.0, "cuda_graph_s": 23.0, "ready_s": 278.0}


@pytest.mark.parametrize(
    ("phases", "notes", "hint"),
    [
        (SEED_STARTUP, [], True),
        # the study used the weight cache, or the daemon refused the model: nothing to suggest
        (SEED_STARTUP, ["weights from the weight cache daemon, at --mem-fraction-static 0.83794 ..."], False),
        (SEED_STARTUP, ["weights loaded from disk: the weight cache daemon refused this model: ..."], False),
        # loading is a small share of the start-up (the page cache), or a few seconds
        ({**SEED_STARTUP, "weight_load_s": 35.0, "ready_s": 73.0}, [], False),
        ({"weight_load_s": 2.0, "ready_s": 3.0}, [], False),
    ],
)
def test_the_start_up_summary_suggests_the_weight_cache_only_where_loading_dominates(
    phases: dict[str, float], notes: list[str], hint: bool
) -> None:
    summary = startup_summary([stored_trial(startup_phases=phases, startup_notes=notes)])
    assert summary is not None and summary.startswith("start-up (launch): ")
    assert ("`startup: {weight_cache: true}`" in summary) is hint, summary


def test_the_weight_cache_hint_counts_the_logged_phases_where_the_stopwatch_ran_faster() -> None:
    # A simulated node with its start-up sped up 200x: SGLang's log says 150 s of weights, the driver's
    # stopwatch 2 s to ready (the hint said "6210% of it").
    phases = {"init_s": 15.0, "weight_load_s": 150.0, "kv_pool_s": 0.0, "cuda_graph_s": 15.0, "ready_s": 2.0}
    summary = startup_summary([stored_trial(startup_phases=phases)])
    assert summary is not None and "; loading the weights is 83% of it: " in summary, summary
