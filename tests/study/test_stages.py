"""The NCCL all-reduce stage (autotune.study.stages): its messages, its coordinate ascent, and the study loop
running it before the server trials on the model node, in real Optuna storage."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.config import Study, load_study
from autotune.config.study import Budget
from autotune.errors import ConfigError
from autotune.measure.client import Workload
from autotune.measure.nccl import BenchSettings, Message
from autotune.measure.result_line import parse_result
from autotune.node.pool import LocalNodePool, Submitted
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.nccl_job import allreduce_payload
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study import stages
from autotune.study.callbacks import KnobHeld, StudyCallback
from autotune.study.loop import StudyDriver, StudyInterrupted
from autotune.study.stages import STAGE_SUFFIX, allreduce_messages, ascent, ascent_size, point_key
from autotune.study.trust.answer import study_answer
from autotune.trial.wire import TrialRequest, TrialResult
from autotune.views.status import nccl_stage as status_nccl_stage
from tests.builders import REPO, SIM_TIMEOUTS, StudyFiles, model_server, simulated_server, small_objective

HARDWARE, MODEL = "rtx-pro-6000-pcie-x8", "kimi-k2.5-int4"
NCCL_KNOBS = (
    "NCCL_ALGO",
    "NCCL_PROTO",
    "NCCL_MIN_NCHANNELS",
    "NCCL_MAX_NCHANNELS",
    "NCCL_BUFFSIZE",
    "NCCL_P2P_LEVEL",
)


class Lines(StudyCallback):
    """The NCCL stage's notices (not the others a study gives: what the node's GPU cannot run, ...)."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def knob_held(self, event: KnobHeld) -> None:
        if event.text.startswith("NCCL stage"):
            self.lines.append(event.text)


ENVS: dict[int, dict[str, str]] = {}  # the env of each server launch the model node received, by trial


class RecordingNode(ModelNodeExecutor):
    def run(self, request: TrialRequest) -> TrialResult:
        if not request.job:
            ENVS[request.number] = dict(request.launch.env)
        return super().run(request)


def model_pool() -> Callable[[Study], LocalNodePool]:
    hw, model = load_hardware_profile(HARDWARE), load_model_profile(MODEL)
    ENVS.clear()
    node = RecordingNode("n", hw, model)
    return lambda _study: LocalNodePool({"n": node}, {"n": node_report("n", hw, model)})


def run(path: Path, n_trials: int | None = None) -> tuple[optuna.Study, list[str]]:
    lines = Lines()
    optuna_study = StudyDriver(load_study(path), [lines], pool=model_pool(), tracking=False).run(n_trials)
    return optuna_study, lines.lines


def stage_trials(path: Path) -> list[optuna.trial.FrozenTrial]:
    study = load_study(path)
    optuna_study = optuna.load_study(study_name=study.name + STAGE_SUFFIX, storage=study.storage)
    return optuna_study.get_trials(deepcopy=False)


def stage_exists(path: Path) -> bool:
    study = load_study(path)
    return study.name + STAGE_SUFFIX in optuna.get_all_study_names(study.storage)


@pytest.fixture
def files(tmp_path: Path) -> StudyFiles:
    return StudyFiles(tmp_path)


def staged_study(files: StudyFiles, **keys: Any) -> Path:
    """The shipped space on the seed node, the model's hidden size given (its model_path is not here)."""
    return files(n_trials=4, nccl_stage={"hidden_size": 7168}, **keys)


# -- the messages and the ascent -------------------------------------------------------------------------
def test_the_messages_are_a_decode_step_per_output_token_and_the_prompts_prefill_chunks() -> None:
    workload = Workload(num_prompts=8, input_len=20000, output_len=512, concurrency=4)
    token = 7168 * 2
    assert allreduce_messages(7168, workload, 8192) == {
        token * 4: 512 / 4,  # one step decodes a token of each of the 4 requests
        token * 8192: 2,  # two whole chunks
        token * (20000 - 2 * 8192): 1,  # and the rest
    }


def test_the_ascent_sweeps_each_knob_with_the_ones_before_at_their_best() -> None:
    knobs = {"A": [None, "x", "y"], "B": [None, 1, 2]}
    times = {(): 10.0, (("A", "x"),): 8.0, (("A", "y"),): 9.0, (("A", "x"), ("B", "1")): 9.0}
    times[(("A", "x"), ("B", "2"))] = 7.0
    asked = []
    values: dict[Any, float] = {}
    while (point := ascent(knobs, values)[0]) is not None:
        asked.append(point)
        values[point_key(point)] = times[point_key(point)]
    assert asked == [
        {"A": None, "B": None},
        {"A": "x", "B": None},
        {"A": "y", "B": None},
        {"A": "x", "B": 1},  # B's default with A at x was measured already
        {"A": "x", "B": 2},
    ]
    assert len(asked) == ascent_size(knobs)
    assert ascent(knobs, values)[1] == {"A": "x", "B": 2}


def _stage_trials(knobs: stages.Knobs, times: dict[Any, float]) -> list[optuna.trial.FrozenTrial]:
    """The ascent's trials over `knobs` as far as `times` measured them, in its order."""
    trials = []
    while (point := ascent(knobs, {point_key(t.params): t.value for t in trials})[0]) is not None:
        if point_key(point) not in times:
            break
        distributions = {n: optuna.distributions.CategoricalDistribution(v) for n, v in knobs.items()}
        trials.append(
            optuna.trial.create_trial(
                params=point, distributions=distributions, value=times[point_key(point)]
            )
        )
    return trials


def test_a_pass_cut_short_holds_its_best_point_measured() -> None:
    knobs = {"A": [None, "x"], "B": [None, 1, 2, 4, 8], "C": [None, 8]}
    times = {(): 10.0, (("A", "x"),): 11.0, (("B", "1"),): 12.0, (("B", "2"),): 9.0, (("B", "4"),): 9.5}
    trials = _stage_trials(knobs, times)
    assert len(trials) == 5  # cut while B was swept (8 not measured): C never ran
    assert stages.stage_result(knobs, trials) is None  # a pass still to finish
    result = stages.stage_result(knobs, trials, shortened="its share of the node-hour budget")
    assert result is not None and result.held == {"A": None, "B": 2, "C": None} and result.best_us == 9.0
    assert result.in_part == "B" and result.unreached == ("C",)
    assert "NCCL stage: B swept in part, its best value measured held" in result.lines("s")
    assert "NCCL stage: A held at NCCL's defaults" in result.lines("s")
    # Cut before any of B's values ran: B is not reached, and NCCL's default held.
    early = stages.stage_result(knobs, trials[:2], shortened="the study's time")
    assert early is not None and early.held == {"A": None, "B": None, "C": None}
    assert early.in_part is None and early.unreached == ("B", "C")
    # A whole pass is not cut short, whatever the caller says.
    times |= {(("B", "8"),): 9.9, (("B", "2"), ("C", "8")): 9.2}
    whole = stages.stage_result(knobs, _stage_trials(knobs, times), shortened="the study's time")
    assert whole is not None and whole.shortened is None and whole.held == {"A": None, "B": 2, "C": None}


def test_the_knobs_sweep_transport_then_channels_and_forcing_ones_last(files: StudyFiles) -> None:
    study = load_study(staged_study(files))
    order = ["NCCL_P2P_LEVEL", "NCCL_MAX_NCHANNELS", "NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS"]
    assert list(stages.stage_knobs(study)) == [*order, "NCCL_PROTO", "NCCL_ALGO"]
    assert stages.stage_knobs(study)["NCCL_P2P_LEVEL"] == [None, "PIX", "PXB", "PHB", "SYS"]
    # Every pair on NVLink: no P2P level changes the transport, so NCCL's default is held and not swept.
    nvlink = stages.stage_knobs(study, nvlink=True)
    assert nvlink["NCCL_P2P_LEVEL"] == [None] and list(nvlink) == list(stages.stage_knobs(study))
    assert stages.ascent_size(nvlink) == stages.ascent_size(stages.stage_knobs(study)) - 4


# -- the study loop --------------------------------------------------------------------------------------
def test_the_baseline_runs_before_the_stage_and_every_search_trial_holds_its_best(files: StudyFiles) -> None:
    path = staged_study(files)
    optuna_study, lines = run(path)
    stage = stage_trials(path)
    knobs = stages.stage_knobs(load_study(path))
    assert len(stage) == ascent_size(knobs)  # one pass, no point measured twice
    assert len({point_key(t.params) for t in stage}) == len(stage)
    result = stages.stage_result(knobs, stage)
    assert result is not None and result.best_us is not None and result.baseline_us is not None
    # The seed's GPUs sit behind host bridges: NCCL's default level sends all-reduces through host memory.
    assert result.held["NCCL_P2P_LEVEL"] == "SYS" and result.best_us < result.baseline_us
    server = optuna_study.get_trials(deepcopy=False)
    # A measured server after the first launch: the baseline, then the stage's all-reduces, then the search.
    baseline, search = server[0], server[1:]
    assert baseline.user_attrs["baseline"] and baseline.state is optuna.trial.TrialState.COMPLETE
    assert baseline.datetime_complete <= min(t.datetime_start for t in stage)
    assert max(t.datetime_complete for t in stage) <= min(t.datetime_start for t in search)
    assert not baseline.params  # SGLang's and NCCL's defaults: no stage value in its launch
    assert not any(name in ENVS[0] for name in NCCL_KNOBS)  # as the node received it
    assert all(ENVS[t.number].get(name) == str(v) for t in search for name, v in result.held.items() if v)
    for trial in search:
        assert {name: trial.params[name] for name in NCCL_KNOBS} == result.held
    assert optuna_study.user_attrs["nccl_stage"]["after_trials"] == [0]  # the launches before its jobs
    assert lines[0].startswith(f"NCCL stage t{STAGE_SUFFIX}: {len(stage)} all-reduce trials, 780 s")
    assert "NCCL stage: NCCL_P2P_LEVEL=SYS held in every server trial" in lines
    answer = study_answer(optuna_study)  # the answer names the values the stage held
    assert answer is not None and answer.nccl is not None and answer.nccl.held == result.held
    assert answer.record()["nccl_stage"] == result.held and "NCCL_P2P_LEVEL=SYS" in answer.nccl.text()


def test_a_resumed_study_reuses_a_finished_stage(files: StudyFiles) -> None:
    path = staged_study(files)
    run(path)
    before = [(t.number, t.datetime_start) for t in stage_trials(path)]
    optuna_study, lines = run(path, 7)
    assert [(t.number, t.datetime_start) for t in stage_trials(path)] == before
    held = stages.stage_result(stages.stage_knobs(load_study(path)), stage_trials(path))
    assert held is not None
    assert all(t.params["NCCL_P2P_LEVEL"] == held.held["NCCL_P2P_LEVEL"] for t in optuna_study.trials[1:])
    assert len(optuna_study.trials) == 7 and "NCCL_P2P_LEVEL=SYS" in "\n".join(lines)


class CtrlCInTheStage(LocalNodePool):
    """A Ctrl-C while the stage's first all-reduce job runs (`in_job`), or while the first server launch
    runs (the baseline)."""

    in_job = True
    job: bool | None = None
    pressed = False

    def submit(self, node: str, request: TrialRequest) -> Submitted:
        self.job = request.job
        return super().submit(node, request)

    def wait(self, timeout_s: float) -> list[tuple[Submitted, TrialResult]]:
        if self.job is self.in_job and not self.pressed:
            self.pressed = True
            raise KeyboardInterrupt
        return super().wait(timeout_s)


class CtrlCInTheBaseline(CtrlCInTheStage):
    in_job = False


def interrupt(path: Path, pool: type[CtrlCInTheStage]) -> None:
    """Run the study on the seed's model node until `pool`'s Ctrl-C stops it."""
    hw, model = load_hardware_profile(HARDWARE), load_model_profile(MODEL)
    nodes = {"n": ModelNodeExecutor("n", hw, model)}, {"n": node_report("n", hw, model)}
    with pytest.raises(StudyInterrupted):
        StudyDriver(load_study(path), pool=lambda _study: pool(*nodes), tracking=False).run()


def test_a_study_stopped_in_its_baseline_runs_it_again_before_the_stage(files: StudyFiles) -> None:
    path = staged_study(files)
    interrupt(path, CtrlCInTheBaseline)
    assert not stage_exists(path)  # no all-reduce job before a measured server
    optuna_study, _lines = run(path)
    trials = optuna_study.get_trials(deepcopy=False)
    first = min(t.datetime_start for t in stage_trials(path))
    before = [(t.number, t.state.name, t.user_attrs["baseline"]) for t in trials if t.datetime_start < first]
    assert before == [(0, "FAIL", True), (1, "COMPLETE", True)]  # interrupted, then run again first
    assert optuna_study.user_attrs["nccl_stage"]["after_trials"] == [0, 1]


def test_a_study_stopped_between_its_baseline_and_its_stage_resumes_with_the_stage(files: StudyFiles) -> None:
    path = staged_study(files)
    interrupt(path, CtrlCInTheStage)
    study = load_study(path)
    stopped = optuna.load_study(study_name=study.name, storage=study.storage).get_trials(deepcopy=False)
    assert [(t.number, t.state.name, t.user_attrs["baseline"]) for t in stopped] == [(0, "COMPLETE", True)]
    assert stages.finished_stage(study, study.storage) is None and stage_exists(path)
    optuna_study, lines = run(path)
    trials = optuna_study.get_trials(deepcopy=False)
    stage = [t for t in stage_trials(path) if t.state.is_finished()]
    assert stages.finished_stage(study, study.storage) is not None  # its interrupted job ran again
    assert [t.number for t in trials if t.datetime_start < max(t.datetime_complete for t in stage)] == [0]
    assert len(trials) == 4 and optuna_study.user_attrs["nccl_stage"]["after_trials"] == [0]
    assert any("NCCL_P2P_LEVEL=SYS held" in line for line in lines)


def test_an_interrupted_stage_continues_where_it_stopped(files: StudyFiles) -> None:
    path = staged_study(files)
    study = load_study(path)
    knobs = stages.stage_knobs(study)
    stage = stages.stage_study(study, 96.0, None)
    StudyDriver(stage, pool=model_pool(), sampler=stages.CoordinateAscent(knobs), tracking=False).run(5)
    assert len(stage_trials(path)) == 5
    run(path)
    trials = stage_trials(path)
    assert len(trials) == ascent_size(knobs)  # continued, not started again
    assert len({point_key(t.params) for t in trials}) == len(trials)


def test_under_a_node_hour_budget_the_stage_gets_a_fifth_of_what_the_search_may(files: StudyFiles) -> None:
    # 0.4 node h on the seed node: the baseline's 307 s leave 1133 s for the search (this study keeps no
    # confirmation back), so the stage may spend 227 s, 7 of its 26 jobs of 30 s; the search still runs.
    # (No presharded dump: its one-time cost would make the baseline the only, and dear, launch price.)
    budget, startup = {"node_hours": 0.4, "n_trials": 8}, {"presharded_weights": False}
    path = files(nccl_stage={"hidden_size": 7168}, n_trials=None, budget=budget, startup=startup)
    optuna_study, lines = run(path)
    stage, knobs = stage_trials(path), stages.stage_knobs(load_study(path))
    baseline_s = optuna_study.trials[0].user_attrs["node_s"]
    assert sum(t.user_attrs["node_s"] for t in stage) <= (0.4 * 3600 - baseline_s) / 5
    assert 0 < len(stage) < ascent_size(knobs)
    record = optuna_study.user_attrs["nccl_stage"]
    assert record["shortened"] == "its share of the node-hour budget"
    # Knob order: the transport's first (the seed's PCIe GPUs reach each other over P2P only at SYS), then
    # the channels', those that force one choice for every message size last.
    assert list(knobs) == [
        "NCCL_P2P_LEVEL",
        "NCCL_MAX_NCHANNELS",
        "NCCL_BUFFSIZE",
        "NCCL_MIN_NCHANNELS",
        "NCCL_PROTO",
        "NCCL_ALGO",
    ]
    assert record["held"]["NCCL_P2P_LEVEL"] == "SYS"
    # Cut short while sweeping NCCL_MAX_NCHANNELS: the best of its values measured (at SYS) is held.
    at_sys = {
        t.params.get("NCCL_MAX_NCHANNELS"): t.value for t in stage if t.params.get("NCCL_P2P_LEVEL") == "SYS"
    }
    assert len(at_sys) == 3 and record["in_part"] == "NCCL_MAX_NCHANNELS"
    channels = min(at_sys, key=lambda value: at_sys[value])  # here NCCL's default: 1 and 2 were slower
    assert record["held"]["NCCL_MAX_NCHANNELS"] == channels
    unreached = ["NCCL_BUFFSIZE", "NCCL_MIN_NCHANNELS", "NCCL_PROTO", "NCCL_ALGO"]
    assert record["unreached"] == unreached
    assert lines[0].startswith(f"NCCL stage t{STAGE_SUFFIX}: 7 all-reduce trials, cut short by its share")
    assert "NCCL stage: NCCL_MAX_NCHANNELS swept in part, its best value measured held" in lines
    assert f"NCCL stage: {', '.join(unreached)} not reached, held at NCCL's defaults" in lines
    search = optuna_study.trials[1:]
    assert search and all(t.params["NCCL_P2P_LEVEL"] == "SYS" for t in search)
    assert all(t.params["NCCL_MAX_NCHANNELS"] == channels for t in search)
    assert all(t.params["NCCL_BUFFSIZE"] is None for t in search)
    launched = len(optuna_study.trials)
    # A resume given more hours holds the values its search ran with: the shortened stage is not continued.
    study = load_study(path)
    more = replace(study, file=study.file.model_copy(update={"budget": Budget(node_hours=0.7, n_trials=8)}))
    again = Lines()
    resumed = StudyDriver(more, [again], pool=model_pool(), tracking=False).run(6)
    assert len(stage_trials(path)) == len(stage) and again.lines[0] == lines[0]
    assert len(resumed.trials) > launched
    assert all(t.params["NCCL_BUFFSIZE"] is None for t in resumed.trials[1:])


def test_on_gpus_linked_by_nvlink_the_stage_sweeps_no_p2p_level(files: StudyFiles) -> None:
    hw, model = load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    node = ModelNodeExecutor("n", hw, model)
    report = node_report("n", hw, model)
    assert report.nvlink  # what the node check reads from nvidia-smi topo -m
    path = files(n_trials=2, nccl_stage={"hidden_size": 8192})
    lines = Lines()
    pool = LocalNodePool({"n": node}, {"n": report})
    optuna_study = StudyDriver(load_study(path), [lines], pool=lambda _: pool, tracking=False).run()
    stage = stage_trials(path)
    assert len(stage) == ascent_size(stages.stage_knobs(load_study(path))) - 4  # PIX, PXB, PHB, SYS
    assert not any(t.params.get("NCCL_P2P_LEVEL") for t in stage)
    assert all(t.params["NCCL_P2P_LEVEL"] is None for t in optuna_study.trials[1:])  # held, not searched
    assert any(
        line.startswith("NCCL stage: NCCL_P2P_LEVEL") and "NCCL's defaults" in line for line in lines.lines
    )
    # Status counts the pass by the links the study recorded: the stage's jobs as they stand, before the
    # study recorded its result (a Ctrl-C during the stage), are not "22 of 26, not finished".
    optuna_study.set_user_attr("nccl_stage", None)
    lines_now, _held = status_nccl_stage(load_study(path), load_study(path).storage, optuna_study)
    assert lines_now[0].startswith(f"NCCL stage t{STAGE_SUFFIX}: {len(stage)} all-reduce trials"), lines_now
    # A resume finds the stage finished on the same links: it is not run again.
    StudyDriver(load_study(path), pool=lambda _: pool, tracking=False).run(1)
    assert len(stage_trials(path)) == len(stage)


def test_the_switch_turns_the_stage_off(files: StudyFiles) -> None:
    path = files(n_trials=3, nccl_stage=False)
    assert load_study(path).file.nccl_stage.enabled is False
    optuna_study, lines = run(path)
    assert not stage_exists(path) and not lines
    assert len({t.params.get("NCCL_P2P_LEVEL") for t in optuna_study.trials[1:]}) >= 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("maybe", r"nccl_stage: not a switch nor a section \(got 'maybe'\)"),
        ({"enabled": "yes"}, r"nccl_stage.enabled: must be true or false \(got 'yes'\)"),
        ({"hidden": 7168}, r"nccl_stage.hidden: unknown key \(got 'hidden'\). Did you mean 'hidden_size'\?"),
        ({"hidden_size": 0}, r"nccl_stage.hidden_size: must be > 0 \(got 0\)"),
    ],
)
def test_a_bad_switch_is_a_one_line_error(files: StudyFiles, value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_study(files(n_trials=3, nccl_stage=value))


def test_one_gpu_or_no_nccl_knob_runs_no_stage(files: StudyFiles, tmp_path: Path) -> None:
    one_gpu = load_study(staged_study(files, server=model_server(flags={"--tp-size": 1})))
    assert stages.why_not(one_gpu) == "one GPU in the tensor-parallel group"
    assert stages.why_not(load_study(staged_study(files))) is None
    memory = {"kind": "sglang", "type": "float", "low": 0.8, "high": 0.9, "step": 0.01}
    no_knob = StudyFiles(tmp_path / "no-knob")(
        n_trials=3,
        search_space={"parameters": {"--mem-fraction-static": memory}},
        nccl_stage={"hidden_size": 7168},
    )
    _, lines = run(no_knob)
    assert not stage_exists(no_knob) and not lines


def test_the_stage_is_skipped_with_a_word_when_the_hidden_size_is_unknown(files: StudyFiles) -> None:
    path = files(n_trials=2)  # /models/Kimi-K2.5 is not on this machine
    _, lines = run(path)
    assert not stage_exists(path)
    assert lines == [
        "NCCL stage skipped: the model's hidden size is unknown (/models/Kimi-K2.5/config.json is not "
        "readable "
        "here); set nccl_stage.hidden_size in the study file"
    ]


def test_the_hidden_size_is_read_from_the_models_config(files: StudyFiles, tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"architectures": ["KimiK25"], "text_config": {"hidden_size": 7168}}')
    assert (
        stages.hidden_size(load_study(files(n_trials=2, server=model_server(model_path=str(model))))) == 7168
    )


# -- the simulated job ------------------------------------------------------------------------------------
@pytest.mark.integration
def test_the_simulated_job_prints_the_real_jobs_result_line() -> None:
    settings = BenchSettings(messages=(Message(14336 * 4, 128.0), Message(14336 * 8192, 2.0)), gpus=8)
    env = {"SGLANG_SIM_HARDWARE": HARDWARE, "SGLANG_SIM_MODEL": MODEL, "NCCL_P2P_LEVEL": "SYS", "PATH": ""}
    done = subprocess.run(
        [sys.executable, "-m", "autotune.sim.nccl_job", *settings.to_argv()],
        env={**env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    payload = parse_result(done.stdout)
    assert payload is not None
    expected = allreduce_payload(load_hardware_profile(HARDWARE), load_model_profile(MODEL), settings, env)
    assert payload["metrics"] == expected["metrics"] and payload["env"] == {"NCCL_P2P_LEVEL": "SYS"}


@pytest.mark.integration
def test_a_simulated_node_runs_the_stage_as_job_processes(files: StudyFiles) -> None:
    from autotune.node.pool import in_process_pool

    space = {
        "parameters": {
            "NCCL_P2P_LEVEL": {"kind": "nccl", "type": "categorical", "choices": [None, "SYS"]},
            "NCCL_PROTO": {"kind": "nccl", "type": "categorical", "choices": [None, "LL"]},
        }
    }
    nvidia_smi = [sys.executable, "-m", "autotune.sim.nvidia_smi"]
    path = files(
        n_trials=1,
        search_space=space,
        objective=small_objective(),
        nodes=[{"name": "local", "address": "local", "nvidia_smi": nvidia_smi}],
        server=simulated_server(model_weight_gb=547),
        timeouts=SIM_TIMEOUTS,
        nccl_stage={"hidden_size": 7168, "command": [sys.executable, "-m", "autotune.sim.nccl_job"]},
    )
    lines = Lines()
    optuna_study = StudyDriver(load_study(path), [lines], pool=in_process_pool, tracking=False).run()
    trials = stage_trials(path)
    assert len(trials) == 3 and all(t.state is optuna.trial.TrialState.COMPLETE for t in trials)
    assert all(t.user_attrs.get("node") == "local" for t in trials)
    assert "NCCL stage: NCCL_P2P_LEVEL=SYS held in every server trial" in lines.lines
    assert optuna_study.trials[0].state is optuna.trial.TrialState.COMPLETE
    # Both studies have a trial 0: each log in a folder of its own, nothing appended to the other's.
    node = load_study(path).workdir / "nodes" / "local"
    server_log = (node / "trial-0000" / "server.log").read_text()
    assert "AUTOTUNE_RESULT" not in server_log and "server_args=" in server_log.splitlines()[0]
    for number in range(3):
        job_log = (node / "nccl-stage" / f"trial-{number:04d}" / "server.log").read_text()
        assert job_log.count('AUTOTUNE_RESULT {"benchmark":"nccl_allreduce"') == 1
