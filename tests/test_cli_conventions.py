"""The command line's own conventions (issue 39.7): the same option means the same thing in every command,
an error in a command's arguments shows that command's usage, `--version`, `--trial N` naming the trials
there are, init's option errors naming the option, and `list` / `delete` of the studies in a folder."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import optuna
import pytest

from autotune.cli import _parser, main
from autotune.config import load_study
from autotune.node.pool import LocalNodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.views.tracked import study_tracker
from tests.builders import StudyFiles


def model_pool(_study: object) -> LocalNodePool:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return LocalNodePool({"n": ModelNodeExecutor("n", hw, model)}, {"n": node_report("n", hw, model)})


def ran(files: StudyFiles, tracking: bool = False, **keys: object) -> Path:
    path = files(n_trials=3, nccl_stage=False, trust=False, **keys)
    StudyDriver(load_study(path), pool=model_pool, tracking=study_tracker if tracking else False).run()
    return path


def test_every_command_that_runs_trials_takes_no_ray_and_every_json_is_a_switch() -> None:
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in commands.choices.items():
        options = {o: a for a in command._actions for o in a.option_strings}
        if "--no-tracking" in options:  # it runs trials
            assert "--no-ray" in options, name
        if "--json" in options:
            assert options["--json"].nargs == 0, f"{name} --json takes a value"


def test_compare_json_is_a_switch_and_out_names_the_file() -> None:
    args = _parser().parse_args(["compare", "s.yaml", "--json", "--out", "c.json", "--no-ray"])
    assert (args.json, args.out, args.no_ray) == (True, Path("c.json"), True)
    assert _parser().parse_args(["compare", "s.yaml", "--ray"]).ray  # the old switch still parses


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("autotune ")


def test_an_unknown_option_shows_the_commands_usage_not_the_top_level(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["best", "s.yaml", "--bogus", "3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: autotune best ") and "unrecognized arguments: --bogus 3" in err


def test_status_trial_shows_that_trials_row(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    path = ran(study_file)
    assert main(["status", str(path), "--trial", "1"]) == 0
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines() if line[:4].strip().isdigit()]
    assert rows == ["1"]
    assert main(["status", str(path), "--trial", "999"]) == 1
    assert "has no trial 999: its trials are 0-2" in capsys.readouterr().err


def test_best_of_a_trial_that_does_not_exist_says_which_exist(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ran(study_file)
    assert main(["best", str(path), "--trial", "999"]) == 1
    assert capsys.readouterr().err.strip() == "autotune: study 't' has no trial 999: its trials are 0-2"


def test_number_ranges() -> None:
    from autotune.cli.common import number_ranges

    assert number_ranges([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7-8"
    assert number_ranges([4]) == "4"


def test_an_init_option_error_names_the_option_not_a_file_that_does_not_exist(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert main(["init", "--model", str(tmp_path), "--env", "NOT A PAIR"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: autotune init: --env: not KEY=VALUE"), err
    assert "study.yaml" not in err and not (tmp_path / "study.yaml").exists()


def test_list_shows_each_study_file_and_how_far_it_ran(
    study_file: StudyFiles,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran(study_file)
    StudyFiles(tmp_path / "other")(n_trials=3, study="other")
    (tmp_path / "space.yaml").write_text("parameters: {}\n")  # not a study file
    monkeypatch.chdir(tmp_path)
    assert main(["list"]) == 0  # the current folder
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].split() == ["other/study.yaml", "other:", "not", "run", "yet"]
    assert lines[1].split()[:4] == ["study.yaml", "t:", "3", "trials"]
    assert main(["list", ".", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["study"] for r in rows] == ["other", "t"] and rows[0]["trials"] is None
    assert sum(rows[1]["trials"].values()) == 3


@pytest.mark.integration  # `mlflow gc`, a process
def test_delete_removes_the_studys_records_and_folder_and_nothing_else(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    shared = {"storage": f"sqlite:///{tmp_path / 'shared-optuna.db'}"}
    shared["tracking_uri"] = f"sqlite:///{tmp_path / 'shared-mlflow.db'}"
    doomed = ran(StudyFiles(tmp_path / "a"), tracking=True, **shared)
    kept = ran(StudyFiles(tmp_path / "b"), tracking=True, study="kept", **shared)
    workdir = load_study(doomed).workdir
    (workdir / "nodes").mkdir(parents=True, exist_ok=True)
    capsys.readouterr()

    monkeypatch.setattr("sys.stdin", io.StringIO("n\n"))
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    assert main(["delete", str(doomed)]) == 0
    out = capsys.readouterr().out
    assert "Optuna study t (3 trials)" in out and "MLflow experiment t (4 runs" in out
    assert out.endswith("not deleted\n")
    assert "t" in optuna.get_all_study_names(shared["storage"]) and workdir.is_dir()

    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    assert main(["delete", str(doomed)]) == 1
    assert "Pass --yes" in capsys.readouterr().err

    assert main(["delete", str(doomed), "--yes"]) == 0
    assert optuna.get_all_study_names(shared["storage"]) == ["kept"]
    client = MlflowClient(tracking_uri=shared["tracking_uri"])
    names = {e.name for e in client.search_experiments(view_type=ViewType.ALL)}
    assert names == {"Default", "kept"}, "deleted for good: the name can be used again"
    assert not workdir.exists() and doomed.exists() and load_study(kept).workdir.is_dir()
    assert main(["status", str(kept)]) == 0

    ran(StudyFiles(tmp_path / "a"), tracking=True, **shared)  # the same study again, from nothing
    assert len(optuna.load_study(study_name="t", storage=shared["storage"]).trials) == 3


@pytest.mark.integration  # `mlflow gc`, a process
def test_delete_of_a_study_with_its_own_stores_removes_its_folder(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ran(study_file, tracking=True)
    workdir = load_study(path).workdir
    assert (workdir / "optuna.db").is_file() and (workdir / "mlflow.db").is_file()
    assert main(["delete", str(path), "--yes"]) == 0
    assert not workdir.exists() and path.exists()
    assert main(["delete", str(path), "--yes"]) == 0
    assert "nothing to delete" in capsys.readouterr().out


def test_every_commands_help_prints(capsys: pytest.CaptureFixture[str]) -> None:
    parser = _parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in commands.choices:
        with pytest.raises(SystemExit) as exit_:
            main([name, "--help"])
        assert exit_.value.code == 0 and capsys.readouterr().out.startswith(f"usage: autotune {name} ")
