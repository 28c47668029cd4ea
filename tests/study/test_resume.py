"""Resuming a study: what a dead driver left behind, changed files, the budget across runs."""

from __future__ import annotations

import shutil
import socket
from pathlib import Path
from typing import NoReturn

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.study.loop import StudyDriver, StudyInterrupted
from autotune.study.records import DRIVER_ATTR
from autotune.study.storage import finished_count, open_study
from tests.builders import SHIPPED_SPACE, StudyFiles, model_pool


def test_a_trial_left_running_by_a_dead_driver_is_failed_and_run_again(study_file: StudyFiles) -> None:
    study = load_study(study_file(n_trials=4))
    StudyDriver(study, pool=model_pool()).run(n_trials=2)
    optuna_study = open_study(study)
    orphan = optuna_study.ask(
        {"NCCL_ALGO": optuna.distributions.CategoricalDistribution([None, "Ring", "Tree"])}
    )
    # A driver on this host whose process is gone (pid 1 with a start time no process has).
    orphan.set_user_attr(DRIVER_ATTR, f"{socket.gethostname()}:1:0")

    optuna_study = StudyDriver(study, pool=model_pool()).run()

    interrupted = optuna_study.trials[orphan.number]
    assert interrupted.state is TrialState.FAIL
    assert interrupted.user_attrs["failure_kind"] == "interrupted"
    retries = [t for t in optuna_study.trials if t.user_attrs.get("retry_of") == orphan.number]
    assert len(retries) == 1 and retries[0].params["NCCL_ALGO"] == interrupted.params["NCCL_ALGO"]
    assert retries[0].state.is_finished()
    assert not [t for t in optuna_study.trials if t.state is TrialState.RUNNING]
    assert finished_count(optuna_study) == 4  # the interrupted trial does not count against the budget


def test_a_trial_asked_for_by_a_driver_killed_before_claiming_it_is_run_again(study_file: StudyFiles) -> None:
    # A driver killed between Optuna's ask and its claim leaves a RUNNING trial with no owner and no
    # heartbeat; it held the study lock until then, so the next driver knows at once that it is dead.
    study = load_study(study_file(n_trials=3))
    StudyDriver(study, pool=model_pool()).run(n_trials=1)
    unclaimed = open_study(study).ask()

    optuna_study = StudyDriver(study, pool=model_pool()).run()

    assert optuna_study.trials[unclaimed.number].user_attrs["failure_kind"] == "interrupted"
    assert not [t for t in optuna_study.trials if t.state is TrialState.RUNNING]
    assert finished_count(optuna_study) == 3


def test_a_trial_of_a_live_driver_is_left_alone(study_file: StudyFiles) -> None:
    study = load_study(study_file(n_trials=3))
    optuna_study = open_study(study)
    other = optuna_study.ask()
    other.set_user_attr(DRIVER_ATTR, "another-host:4242:99")  # alive as far as anyone here can tell
    from autotune.study.storage import claim

    claim(optuna_study, other)  # a fresh heartbeat
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    assert optuna_study.trials[other.number].state is TrialState.RUNNING
    assert finished_count(optuna_study) == 2  # the other driver's running trial holds one unit of the budget


def test_resuming_with_a_changed_search_space_is_refused_then_accepted(
    tmp_path: Path, study_file: StudyFiles
) -> None:
    space = tmp_path / "space.yaml"
    shutil.copy(SHIPPED_SPACE, space)
    path = study_file(n_trials=2, search_space=space)
    StudyDriver(load_study(path), pool=model_pool()).run()

    space.write_text(
        space.read_text()
        .replace("low: 0.70, high: 0.95", "low: 0.75, high: 0.95")
        .replace("  NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree]}\n", "")
    )
    with pytest.raises(ConfigError) as refused:
        StudyDriver(load_study(path), pool=model_pool()).run(n_trials=3)
    message = str(refused.value)
    assert "removed NCCL_ALGO" in message and "changed --mem-fraction-static" in message
    assert "--accept-changes" in message

    optuna_study = StudyDriver(load_study(path), pool=model_pool()).run(n_trials=3, accept_changes=True)
    assert finished_count(optuna_study) == 3
    assert optuna_study.user_attrs["config"]["history"], "the earlier files are kept with the study"


def tried_study(tmp_path: Path, study_file: StudyFiles) -> tuple[Path, Path]:
    """A study (its file and its own copy of the shipped search space) whose second trial tried every knob."""
    space = tmp_path / "space.yaml"
    shutil.copy(SHIPPED_SPACE, space)
    path = study_file(n_trials=2, search_space=space)
    optuna_study = StudyDriver(load_study(path), pool=model_pool(), tracking=False).run()
    assert "NCCL_ALGO" in optuna_study.trials[1].params
    return path, space


def stored(path: Path) -> tuple[object, int]:
    """What the study recorded of its files, and its number of trials."""
    study = load_study(path)
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)  # no check of the files
    return optuna_study.user_attrs["config"], len(optuna_study.trials)


def test_other_choices_for_a_tried_knob_are_refused_even_with_accept_changes(
    tmp_path: Path, study_file: StudyFiles
) -> None:
    # Seen on the H200: Optuna refused every trial's NCCL_ALGO ("CategoricalDistribution does not support
    # dynamic value space"), so the study ran nothing but failing trials.
    path, space = tried_study(tmp_path, study_file)
    before = stored(path)
    space.write_text(
        space.read_text().replace("choices: [null, Ring, Tree]}", "choices: [null, Ring, Tree, NVLS]}")
    )

    with pytest.raises(ConfigError) as refused:
        open_study(load_study(path))
    assert "--accept-changes cannot change the choices or type of NCCL_ALGO" in str(refused.value)

    with pytest.raises(ConfigError) as refused:
        open_study(load_study(path), accept_changes=True)
    message = str(refused.value)
    assert message.startswith(f"{space}: study 't' cannot take other choices or another type"), message
    assert "NCCL_ALGO: choices [null, Ring, Tree] -> choices [null, Ring, Tree, NVLS]" in message
    assert "or name a new study (`study:` in the study file)" in message
    assert stored(path) == before


def test_enqueue_with_accept_changes_says_so_in_one_line_and_queues_nothing(
    tmp_path: Path, study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path, space = tried_study(tmp_path, study_file)
    before = stored(path)
    space.write_text(space.read_text().replace("choices: [null, Ring, Tree]}", "choices: [null, Ring]}"))
    capsys.readouterr()

    assert main(["enqueue", str(path), "--set=--mem-fraction-static=0.85", "--accept-changes"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: ") and err.count("\n") == 1, err
    assert "NCCL_ALGO: choices [null, Ring, Tree] -> choices [null, Ring]" in err
    assert stored(path) == before


def test_a_widened_range_and_a_new_knob_are_accepted_and_the_next_trial_runs(
    tmp_path: Path, study_file: StudyFiles
) -> None:
    # What Optuna accepts within a study stays acceptable: a range's bounds, a knob added or removed.
    path, space = tried_study(tmp_path, study_file)
    space.write_text(
        space.read_text()
        .replace("low: 0.70, high: 0.95", "low: 0.60, high: 0.95")
        .replace(
            "  NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree]}\n",
            "  NCCL_NTHREADS: {kind: nccl, type: categorical, choices: [null, 256, 512]}\n",
        )
    )
    optuna_study = StudyDriver(load_study(path), pool=model_pool(), tracking=False).run(
        n_trials=3, accept_changes=True
    )
    resumed = optuna_study.trials[2]
    assert resumed.state.is_finished() and "failure_kind" not in resumed.user_attrs, resumed.user_attrs
    assert {"--mem-fraction-static", "NCCL_NTHREADS"} <= set(resumed.params)
    assert optuna_study.user_attrs["config"]["history"]


# SGLang knobs only, as on one GPU: nothing in the space steers the sampler's first draws elsewhere.
ONE_GPU_SPACE = {
    "parameters": {
        "--mem-fraction-static": {"kind": "sglang", "type": "float", "low": 0.6, "high": 0.95, "step": 0.01},
        "--chunked-prefill-size": {"kind": "sglang", "type": "categorical", "choices": [None, 4096, 16384]},
        "--schedule-conservativeness": {"kind": "sglang", "type": "float", "low": 0.3, "high": 1.5},
    }
}


def test_a_resumed_seeded_study_does_not_replay_its_first_proposals(study_file: StudyFiles) -> None:
    # Seen on the H200: a study resumed with its file's seed proposed trials 1 and 2 again, word for word.
    study = load_study(study_file(n_trials=3, search_space=ONE_GPU_SPACE))
    StudyDriver(study, pool=model_pool()).run()
    optuna_study = StudyDriver(study, pool=model_pool()).run(n_trials=5)

    first, resumed = optuna_study.trials[1:3], optuna_study.trials[3:5]
    assert [t.params for t in resumed] != [t.params for t in first]
    assert not any(t.params == f.params for t in resumed for f in first)


def test_a_study_resumed_at_the_same_point_proposes_the_same_trials(study_file: StudyFiles) -> None:
    runs = []
    for copy in ("a", "b"):
        study = load_study(study_file(n_trials=3, search_space=ONE_GPU_SPACE, file=f"{copy}/study.yaml"))
        StudyDriver(study, pool=model_pool()).run()
        runs.append([t.params for t in StudyDriver(study, pool=model_pool()).run(n_trials=5).trials[3:5]])
    assert runs[0] == runs[1]


def test_ctrl_c_while_the_nodes_start_ends_the_study_as_interrupted(study_file: StudyFiles) -> None:
    # Seen with --no-ray and Ray drivers taking turns: a Ctrl-C inside ray.init() left a traceback, exit 1.
    study = load_study(study_file(n_trials=2))

    def pool_interrupted_while_starting(_study: object) -> NoReturn:
        raise KeyboardInterrupt

    with pytest.raises(StudyInterrupted, match="while the nodes started"):
        StudyDriver(study, pool=pool_interrupted_while_starting, tracking=False).run()
    assert [t.state for t in open_study(study).trials] == [TrialState.WAITING]  # the baseline, still to run
