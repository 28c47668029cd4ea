"""YAML loading, objectives and study files: every bad input is one clear ConfigError."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.config import (
    METRICS,
    Objective,
    load_objective,
    load_study,
    load_yaml,
    parse_objective,
)
from autotune.config.objective import InFlight
from autotune.config.study import DEFAULT_NEVER_LAUNCH_FLAGS
from autotune.dialect import Dialect, committed_table, committed_versions, table_from_help
from autotune.errors import ConfigError, ForbiddenLaunchError
from autotune.study import samplers
from autotune.trial.launch import TrialConfig, launch_script
from tests.builders import REPO, StudyFiles, model_server, study_data

SHIPPED_SPACE = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
SHIPPED_OBJECTIVE = REPO / "objectives" / "throughput.yaml"
ALG = "--speculative-algorithm"


def _check(error: ConfigError, path: Path, field: str) -> None:
    """The message names the file and field, shows the value and ends with a fix, on one line."""
    text = str(error)
    assert error.path == path, text
    assert error.field == field, text
    assert text.startswith(f"{path}: {field}: " if field else f"{path}: ")
    assert f"(got {error.value!r})" in text
    assert error.fix and text.endswith(error.fix)
    assert "\n" not in text


# ---- load_yaml ----


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    _check(info.value, path, "")
    assert "not found" in info.value.problem


def test_directory_instead_of_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="directory"):
        load_yaml(tmp_path)


def test_malformed_yaml_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("study: ok\nserver:\n  model_path: [unclosed\n  port: 1\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    _check(info.value, path, info.value.field)
    assert info.value.field.startswith("line 4, column")
    assert "malformed YAML" in info.value.problem


def test_tab_indentation_is_malformed(tmp_path: Path) -> None:
    path = tmp_path / "tab.yaml"
    path.write_text("a:\n\tb: 1\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert info.value.field == "line 2, column 1"
    assert info.value.value == "b: 1"


@pytest.mark.parametrize(("text", "kind"), [("", "empty"), ("- a\n- b\n", "a list"), ("42\n", "a int")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = tmp_path / "top.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    _check(info.value, path, "")
    assert kind in info.value.problem


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text("parameters:\n  NCCL_ALGO: 1\n  NCCL_ALGO: 2\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert info.value.field == "line 3, column 3"
    assert "duplicate key 'NCCL_ALGO' (first at line 2)" in info.value.problem


def test_load_yaml_returns_mapping(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("a: 1\nb: [null, x]\n")
    assert load_yaml(path) == {"a": 1, "b": [None, "x"]}


# ---- objectives ----

WORKLOAD = {"num_prompts": 16, "input_len": 28000, "output_len": 500, "concurrency": 4}


def _objective_error(data: dict[str, Any], tmp_path: Path) -> ConfigError:
    path = tmp_path / "objective.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_objective(path)
    _check(info.value, path, info.value.field)
    return info.value


def test_shipped_objective_loads() -> None:
    objective = load_objective(SHIPPED_OBJECTIVE)
    assert objective.metric == "output_throughput" and objective.goal == "maximize"
    assert objective.workload.input_len == 28000 and objective.workload.warmup_requests == 1


def test_metrics_match_benchmark_fields() -> None:
    from autotune.config.allreduce import ALLREDUCE_METRICS  # the all-reduce job's (test_nccl_allreduce)

    assert set(METRICS) - set(ALLREDUCE_METRICS) == {
        "output_throughput",
        "request_throughput",
        "mean_ttft_ms",
        "p50_ttft_ms",
        "p99_ttft_ms",
        "mean_itl_ms",
        "p50_itl_ms",
        "p99_itl_ms",
        "p50_e2e_latency_ms",
        "p99_e2e_latency_ms",
        "request_goodput",  # with workload.slo (test_workloads)
        "slo_attainment",
        "max_load",  # with load_search
        "mean_ttft_first_turn_ms",  # with workload.sessions (tests/measure/test_sharing.py)
        "mean_ttft_later_turns_ms",
    }
    assert METRICS["output_throughput"] == "maximize" and METRICS["p99_itl_ms"] == "minimize"


def test_unknown_metric_offers_did_you_mean(tmp_path: Path) -> None:
    error = _objective_error({"name": "t", "metric": "output_througput", "workload": WORKLOAD}, tmp_path)
    assert error.field == "metric" and error.value == "output_througput"
    assert "Did you mean 'output_throughput'?" in error.fix


@pytest.mark.parametrize("key", sorted(WORKLOAD))
def test_workload_ints_must_be_positive(tmp_path: Path, key: str) -> None:
    error = _objective_error(
        {"name": "t", "metric": "output_throughput", "workload": {**WORKLOAD, key: 0}}, tmp_path
    )
    assert error.field == f"workload.{key}" and error.value == 0
    assert error.problem == "must be > 0"


def test_the_requests_a_workload_keeps_in_flight_where_its_load_and_lengths_say_it() -> None:
    objective = Objective(name="t", metric="output_throughput", workload=WORKLOAD)
    assert objective.in_flight() == InFlight(4, 28_500)
    assert objective.in_flight(replicas=3) == InFlight(2, 28_500)  # 4 requests over 3 replicas: 2 at most
    assert InFlight(4, 28_500).tokens() == 4 * 28_500
    assert InFlight(4, 28_500).tokens(running=2) == 2 * 28_500  # --max-running-requests 2: 2 at once
    assert InFlight(4, 28_500).tokens(running=64) == 4 * 28_500
    few = Objective(name="t", metric="output_throughput", workload={**WORKLOAD, "num_prompts": 2})
    assert few.in_flight() == InFlight(2, 28_500)
    for varying in ({"lengths": "uniform"}, {"request_rate": 2.0}):
        objective = Objective(name="t", metric="output_throughput", workload={**WORKLOAD, **varying})
        assert objective.in_flight() is None, varying
    levels = {"concurrency": [2, 4]}
    ladder = Objective(name="t", metric="output_throughput", workload=WORKLOAD, ladder=levels)
    assert ladder.in_flight() is None


def test_a_study_shares_the_workloads_requests_among_the_servers_replicas(study_file: StudyFiles) -> None:
    # The quickstart's 4 requests of 28,000 + 1,000 tokens; --dp-size 2 (or its alias) gives each 2.
    assert load_study(study_file()).in_flight() == InFlight(4, 29_000)
    for dp in ("--dp-size", "--data-parallel-size"):
        study = load_study(study_file(server=model_server(flags={"--tp-size": 4, dp: 2})))
        assert study.in_flight() == InFlight(2, 29_000), dp
        # A trial whose search space set the replicas: its own, over the server section's.
        assert study.in_flight({dp: 4, "--mem-fraction-static": 0.85}) == InFlight(1, 29_000), dp
        assert study.in_flight({dp: None}) == InFlight(2, 29_000), dp  # left at the section's
    assert load_study(study_file()).in_flight({"--dp-size": 2}) == InFlight(2, 29_000)


def test_workload_unknown_key(tmp_path: Path) -> None:
    error = _objective_error(
        {"name": "t", "metric": "output_throughput", "workload": {**WORKLOAD, "concurency": 4}}, tmp_path
    )
    assert error.field == "workload.concurency"
    assert "Did you mean 'concurrency'?" in error.fix


def test_direction_must_match_metric(tmp_path: Path) -> None:
    error = _objective_error(
        {"name": "t", "metric": "p99_ttft_ms", "direction": "maximize", "workload": WORKLOAD}, tmp_path
    )
    assert error.field == "direction" and error.value == "maximize"
    assert "direction: minimize" in error.fix
    error = _objective_error(
        {"name": "t", "metric": "p99_ttft_ms", "direction": "minimise", "workload": WORKLOAD}, tmp_path
    )
    assert "Did you mean 'minimize'?" in error.fix


def test_direction_defaults_to_metric_and_limits_become_constraints() -> None:
    objective = parse_objective(
        {
            "name": "fast",
            "metric": "mean_itl_ms",
            "workload": WORKLOAD,
            "limits": {"p99_ttft_ms": 5000, "output_throughput": 50},
        }
    )
    assert objective.goal == "minimize" and objective.direction == "minimize"
    result = {"mean_itl_ms": 12.5, "p99_ttft_ms": 6000.0, "output_throughput": 80.0}
    assert objective.value(result) == 12.5
    assert objective.constraints(result) == {"p99_ttft_ms": 1000.0, "output_throughput": -30.0}


def test_limits_need_known_metrics() -> None:
    with pytest.raises(ConfigError) as info:
        parse_objective(
            {"name": "x", "metric": "output_throughput", "workload": WORKLOAD, "limits": {"p99_ttft": 1}},
            "o.yaml",
        )
    assert info.value.field == "limits.p99_ttft" and "Did you mean 'p99_ttft_ms'?" in info.value.fix


# ---- study files ----


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project folder with the shipped search space and objective, and a studies/ folder."""
    (tmp_path / "search_spaces").mkdir()
    (tmp_path / "objectives").mkdir()
    (tmp_path / "studies").mkdir()
    shutil.copy(SHIPPED_SPACE, tmp_path / "search_spaces" / SHIPPED_SPACE.name)
    shutil.copy(SHIPPED_OBJECTIVE, tmp_path / "objectives" / SHIPPED_OBJECTIVE.name)
    return tmp_path


def _study_data(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "study": "quickstart",
        "search_space": "../search_spaces/sglang-nccl-eagle3.yaml",
        "objective": "../objectives/throughput.yaml",
        "server": {
            "model_path": "/models/Kimi-K2.5",
            "draft_model_path": "/models/Kimi-K2.5-eagle3",
            "flags": {"--tp-size": 8, "--trust-remote-code": None},
        },
    }
    return study_data(**{**data, "sampler": None, **changes})  # the sampler left to its default


def _write(project: Path, data: dict[str, Any], name: str = "study.yaml") -> Path:
    return StudyFiles(project / "studies")(data, file=name)


def _study_error(project: Path, data: dict[str, Any]) -> ConfigError:
    path = _write(project, data)
    with pytest.raises(ConfigError) as info:
        load_study(path)
    _check(info.value, info.value.path, info.value.field)
    return info.value


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_study_loads_with_defaults_and_creates_nothing(project: Path) -> None:
    path = _write(project, _study_data())
    before = _tree(project)
    study = load_study(path)
    assert _tree(project) == before
    study_dir = project / "studies"
    assert study.name == "quickstart"
    assert study.workdir == study_dir / ".autotune" / "quickstart"
    assert study.storage == f"sqlite:///{study_dir}/.autotune/quickstart/optuna.db"
    assert study.tracking_uri == f"sqlite:///{study_dir}/.autotune/quickstart/mlflow.db"
    assert study.search_space.path == project / "search_spaces" / SHIPPED_SPACE.name
    assert study.objective.metric == "output_throughput"
    assert [(n.name, n.address) for n in study.file.nodes] == [("local", "local")]
    assert study.file.server.command == ["python", "-m", "sglang.launch_server"]
    assert study.file.server.flags == {"--tp-size": "8", "--trust-remote-code": None}
    assert study.file.budget.n_trials == 20 and study.file.timeouts.startup_s == 1800
    assert study.file.never_launch.env == {"NCCL_NVLS_ENABLE": ["1", "2"]}
    assert study.file.never_launch.flags == list(DEFAULT_NEVER_LAUNCH_FLAGS)
    assert study.ensure_workdir() == study.workdir and study.workdir.is_dir()


def test_study_path_may_be_relative_to_cwd(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(project, _study_data())
    monkeypatch.chdir(project)
    study = load_study("studies/study.yaml")
    assert study.workdir == project / "studies" / ".autotune" / "quickstart"


def test_explicit_storage_and_command_string(project: Path) -> None:
    data = _study_data(storage="postgresql://db/optuna", tracking_uri="http://mlflow:5000")
    data["server"]["command"] = "python -m 'sglang.launch_server'"
    data["sampler"] = {"name": "random", "seed": 7}
    study = load_study(_write(project, data))
    assert study.storage == "postgresql://db/optuna" and study.tracking_uri == "http://mlflow:5000"
    assert study.file.server.command == ["python", "-m", "sglang.launch_server"]
    sampler = samplers.build(study.file.sampler)
    assert isinstance(sampler, optuna.samplers.RandomSampler)


def test_missing_search_space_file_names_the_study_file(project: Path) -> None:
    error = _study_error(project, _study_data(search_space="../search_spaces/nope.yaml"))
    assert error.path == project / "studies" / "study.yaml"
    assert error.field == "search_space" and error.value == "../search_spaces/nope.yaml"
    assert str(project / "search_spaces" / "nope.yaml") in error.problem
    assert "relative path starts at the study file's folder" in error.fix


def test_search_space_errors_name_the_search_space_file(project: Path) -> None:
    space = project / "search_spaces" / "broken.yaml"
    space.write_text("parameters:\n  --x: {kind: sglang, type: int, low: 9, high: 1}\n")
    error = _study_error(project, _study_data(search_space="../search_spaces/broken.yaml"))
    assert error.path == space and error.field == "parameters.--x.low"


def test_objective_errors_name_the_objective_file(project: Path) -> None:
    objective = project / "objectives" / "bad.yaml"
    objective.write_text(yaml.safe_dump({"name": "x", "metric": "tok_s", "workload": WORKLOAD}))
    error = _study_error(project, _study_data(objective="../objectives/bad.yaml"))
    assert error.path == objective and error.field == "metric"


def test_unknown_study_key(project: Path) -> None:
    data = _study_data()
    data["sampeler"] = {"name": "tpe"}
    error = _study_error(project, data)
    assert error.field == "sampeler" and "Did you mean 'sampler'?" in error.fix


def test_misspelled_required_key_reports_the_typo(project: Path) -> None:
    data = _study_data()
    data["server"]["modelpath"] = data["server"].pop("model_path")
    error = _study_error(project, data)
    assert error.field == "server.modelpath" and "Did you mean 'model_path'?" in error.fix


def test_missing_required_key(project: Path) -> None:
    data = _study_data()
    del data["objective"]
    error = _study_error(project, data)
    assert error.field == "objective" and "missing" in error.problem and "Add 'objective'" in error.fix


def test_wrong_type(project: Path) -> None:
    data = _study_data()
    data["server"]["port"] = "thirty"
    error = _study_error(project, data)
    assert error.field == "server.port" and error.value == "thirty" and "whole number" in error.problem


def test_ssh_node_needs_a_user(project: Path) -> None:
    error = _study_error(project, _study_data(nodes=[{"name": "gpu1", "address": "ssh://gpu1"}]))
    assert error.field == "nodes[0].address" and error.value == "ssh://gpu1"
    assert "no user" in error.problem and "ssh://user@host:port" in error.fix


def test_unknown_node_address(project: Path) -> None:
    error = _study_error(project, _study_data(nodes=[{"name": "a", "address": "gpu1:22"}]))
    assert error.field == "nodes[0].address"


def test_duplicate_node_names(project: Path) -> None:
    error = _study_error(project, _study_data(nodes=[{"name": "a"}, {"name": "a"}]))
    assert error.field == "nodes[1].name"


def test_bad_study_name(project: Path) -> None:
    error = _study_error(project, _study_data(study="../escape"))
    assert error.field == "study" and error.value == "../escape"


def test_unknown_sampler_offers_did_you_mean(project: Path) -> None:
    error = _study_error(project, _study_data(sampler={"name": "tpe2"}))
    assert error.field == "sampler.name" and "Did you mean 'tpe'?" in error.fix


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="PyTorch is installed here")
def test_sampler_gp_without_pytorch_is_refused_before_the_study(project: Path) -> None:
    # Optuna's GPSampler imports torch at its first proposal after the start, trials into the study.
    error = _study_error(project, _study_data(sampler={"name": "gp"}))
    assert error.field == "sampler.name" and error.value == "gp"
    assert "needs PyTorch" in error.problem and "pip install torch" in error.fix


def test_budget_must_stop(project: Path) -> None:
    error = _study_error(project, _study_data(budget={"n_trials": None, "timeout_s": None}))
    assert error.field == "budget.n_trials" and "n_trials or timeout_s" in error.fix


def test_autotune_managed_base_flag(project: Path) -> None:
    data = _study_data()
    data["server"]["flags"]["--port"] = 1234
    error = _study_error(project, data)
    assert error.field == "server.flags.--port" and "server.port" in error.fix


def test_flag_without_dashes(project: Path) -> None:
    data = _study_data()
    data["server"]["flags"]["tp-size"] = 2
    error = _study_error(project, data)
    _check(error, project / "studies" / "study.yaml", "server.flags.tp-size")
    assert error.problem.startswith("a server flag must start with '--'")
    assert error.fix == "Write '--tp-size'; env vars go under server.env."
    error = _study_error(project, _study_data(never_launch={"env": {}, "flags": ["enable-nccl-nvls"]}))
    _check(error, project / "studies" / "study.yaml", "never_launch.flags[0]")
    assert error.problem.startswith("a flag must start with '--'")
    assert error.fix == "Write '--enable-nccl-nvls'."


def test_base_flag_also_tuned(project: Path) -> None:
    data = _study_data()
    data["server"]["flags"]["--mem-fraction-static"] = 0.9
    error = _study_error(project, data)
    assert error.path == project / "studies" / "study.yaml"
    assert error.field == "server.flags.--mem-fraction-static"
    assert "also tuned by the search space" in error.problem


def test_never_launch_choice_in_search_space(project: Path) -> None:
    space = project / "search_spaces" / "nvls.yaml"
    space.write_text(
        "parameters:\n  NCCL_NVLS_ENABLE: {kind: nccl, type: categorical, choices: [null, 0, 1]}\n"
    )
    error = _study_error(project, _study_data(search_space="../search_spaces/nvls.yaml"))
    assert error.path == space
    assert error.field == "parameters.NCCL_NVLS_ENABLE.choices[2]" and error.value == 1
    assert "NCCL_NVLS_ENABLE=1" in error.problem and "never_launch" in error.problem
    assert "Remove that value" in error.fix


def test_never_launch_bool_env_and_int_range(project: Path) -> None:
    space = project / "search_spaces" / "nvls.yaml"
    space.write_text("parameters:\n  NCCL_NVLS_ENABLE: {kind: nccl, type: bool}\n")
    error = _study_error(project, _study_data(search_space="../search_spaces/nvls.yaml"))
    assert error.field == "parameters.NCCL_NVLS_ENABLE.type"
    space.write_text("parameters:\n  NCCL_NVLS_ENABLE: {kind: nccl, type: int, low: 2, high: 3}\n")
    error = _study_error(project, _study_data(search_space="../search_spaces/nvls.yaml"))
    assert error.field == "parameters.NCCL_NVLS_ENABLE" and error.value == "2"


def test_never_launch_flag_in_search_space(project: Path) -> None:
    space = project / "search_spaces" / "nvls.yaml"
    space.write_text("parameters:\n  --enable-symm-mem: {kind: sglang, type: bool}\n")
    error = _study_error(project, _study_data(search_space="../search_spaces/nvls.yaml"))
    assert error.path == space and error.field == "parameters.--enable-symm-mem"
    assert "can pass --enable-symm-mem" in error.problem


def test_never_launch_only_off_choice_is_fine(project: Path) -> None:
    space = project / "search_spaces" / "off.yaml"
    space.write_text(
        "parameters:\n  NCCL_NVLS_ENABLE: {kind: nccl, type: categorical, choices: [null, 0]}\n"
        "  --enable-nccl-nvls: {kind: sglang, type: categorical, choices: [null, false]}\n"
    )
    load_study(_write(project, _study_data(search_space="../search_spaces/off.yaml")))


def test_never_launch_base_env_and_flag(project: Path) -> None:
    data = _study_data()
    data["server"]["env"] = {"NCCL_NVLS_ENABLE": 1}
    error = _study_error(project, data)
    assert error.field == "server.env.NCCL_NVLS_ENABLE" and error.value == "1"
    data = _study_data()
    data["server"]["flags"]["--enable-nccl-nvls"] = None
    error = _study_error(project, data)
    assert error.field == "server.flags.--enable-nccl-nvls"


def test_custom_never_launch(project: Path) -> None:
    data = _study_data(never_launch={"env": {"NCCL_ALGO": "Tree"}, "flags": []})
    error = _study_error(project, data)
    assert error.field == "parameters.NCCL_ALGO.choices[2]" and error.value == "Tree"
    # NVLS flags were dropped on purpose here, so they may be tuned.
    data = _study_data(never_launch={"env": {}, "flags": []})
    data["server"]["flags"]["--enable-nccl-nvls"] = True
    assert load_study(_write(project, data)).file.server.flags["--enable-nccl-nvls"] is None


def test_speculation_needs_draft_model(project: Path) -> None:
    data = _study_data()
    del data["server"]["draft_model_path"]
    error = _study_error(project, data)
    assert error.path == project / "studies" / "study.yaml"
    assert error.field == "server.draft_model_path" and "EAGLE3" in error.problem


def test_speculative_knobs_need_an_algorithm(project: Path) -> None:
    space = project / "search_spaces" / "steps.yaml"
    space.write_text(
        "parameters:\n  --speculative-num-steps: {kind: speculative, type: int, low: 1, high: 4}\n"
    )
    error = _study_error(project, _study_data(search_space="../search_spaces/steps.yaml"))
    assert error.path == space and error.field == "parameters.--speculative-num-steps"
    # With the algorithm fixed in the study file, tuning steps alone is fine.
    data = _study_data(search_space="../search_spaces/steps.yaml")
    data["server"]["flags"][ALG] = "EAGLE3"
    study = load_study(_write(project, data))
    launch = study.server_launch(
        study.search_space.suggest(optuna.trial.FixedTrial({"--speculative-num-steps": 2}))
    )
    assert launch.argv[-2:] == ("--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3")


def test_the_start_speculates_with_the_first_algorithm_with_a_tree_the_space_offers(project: Path) -> None:
    # The sampler's start where SGLang's defaults met the SLO at no rate (samplers.DefaultsStartSampler).
    assert load_study(_write(project, _study_data())).tree_algorithms == ("EAGLE3",)
    space = project / "search_spaces" / "ngram.yaml"
    ngram_only = "{kind: speculative, type: categorical, choices: [null, NGRAM]}"
    space.write_text(f"parameters:\n  {ALG}: {ngram_only}\n")
    ngram = _study_data(search_space="../search_spaces/ngram.yaml")
    assert load_study(_write(project, ngram)).tree_algorithms == ()  # NGRAM drafts no tree


# ---- server launches from a study ----


def test_server_launch_for_a_speculative_trial(project: Path) -> None:
    data = _study_data()
    data["server"]["env"] = {"HF_HOME": "/cache"}
    study = load_study(_write(project, data))
    config = TrialConfig(
        env={"NCCL_ALGO": "Ring"},
        flags={"--mem-fraction-static": "0.88", ALG: "EAGLE3", "--speculative-num-steps": "3"},
    )
    launch = study.server_launch(config, port=31001)
    assert launch.argv == (
        "python", "-m", "sglang.launch_server",
        "--model-path", "/models/Kimi-K2.5",
        "--tp-size", "8", "--trust-remote-code", LOADER, THREADED,
        "--mem-fraction-static", "0.88", ALG, "EAGLE3", "--speculative-num-steps", "3",
        "--host", "127.0.0.1", "--port", "31001",
        "--speculative-draft-model-path", "/models/Kimi-K2.5-eagle3",
    )  # fmt: skip
    assert launch.env == {"HF_HOME": "/cache", "NCCL_ALGO": "Ring"}
    assert launch.port == 31001


def test_baseline_launch_has_only_base_settings(project: Path) -> None:
    study = load_study(_write(project, _study_data()))
    launch = study.server_launch(study.search_space.baseline())
    assert launch.argv == (
        "python", "-m", "sglang.launch_server", "--model-path", "/models/Kimi-K2.5",
        "--tp-size", "8", "--trust-remote-code", LOADER, THREADED, "--host", "127.0.0.1", "--port", "30000",
    )  # fmt: skip
    assert launch.env == {}


# SGLang 0.5.17 to 0.5.23's own default loader settings, passed on so that the launch script keeps them.
LOADER, THREADED = "--model-loader-extra-config", '{"enable_multithread_load": true, "num_threads": 8}'


def test_multithreaded_weight_loading_is_on_by_default_and_switchable(project: Path) -> None:
    data = _study_data()
    data["startup"] = {"weight_loading_threads": 16}
    launch = load_study(_write(project, data)).server_launch(TrialConfig())
    at = launch.argv.index(LOADER)
    assert launch.argv[at + 1] == '{"enable_multithread_load": true, "num_threads": 16}'
    assert f"{LOADER} '{launch.argv[at + 1]}'" in launch_script(launch)  # what `best --export` writes
    data["startup"] = {"multithread_weight_loading": False}
    assert LOADER not in load_study(_write(project, data)).server_launch(TrialConfig()).argv
    data["startup"] = {}
    data["server"]["flags"][LOADER] = '{"enable_multithread_load": false}'  # the user's own stands
    argv = load_study(_write(project, data)).server_launch(TrialConfig()).argv
    assert argv.count(LOADER) == 1 and argv[argv.index(LOADER) + 1] == '{"enable_multithread_load": false}'


def test_multithreaded_weight_loading_only_where_the_version_takes_it(project: Path) -> None:
    study = load_study(_write(project, _study_data()))
    for version in committed_versions():  # read from each version's model_loader/loader.py
        table = committed_table(version)
        assert table is not None and table.loader_defaults == {
            "enable_multithread_load": True,
            "num_threads": 8,
        }
        assert LOADER in study.server_launch(TrialConfig(), dialect=Dialect(table)).argv
    newer = table_from_help("  --model-loader-extra-config MODEL_LOADER_EXTRA_CONFIG\n", "0.6.0", "--help")
    assert LOADER not in study.server_launch(TrialConfig(), dialect=Dialect(newer)).argv  # keys unknown


def test_a_bad_startup_section_names_the_field(project: Path) -> None:
    data = _study_data()
    data["startup"] = {"weight_loading_threads": 0}
    error = _study_error(project, data)
    assert error.field == "startup.weight_loading_threads"


def test_server_launch_guards_never_launch(project: Path) -> None:
    study = load_study(_write(project, _study_data()))
    with pytest.raises(ForbiddenLaunchError):
        study.server_launch(TrialConfig(env={"NCCL_NVLS_ENABLE": "2"}))
    with pytest.raises(ForbiddenLaunchError):
        study.server_launch(TrialConfig(flags={"--enable-symm-mem": None}))


def test_every_shipped_yaml_loads() -> None:
    for folder in ("search_spaces", "objectives"):
        for path in sorted((REPO / folder).glob("*.yaml")):
            data = load_yaml(path)
            assert data, path
    for path in sorted((REPO / "objectives").glob("*.yaml")):
        load_objective(path)


def test_loading_shipped_files_leaves_the_repo_untouched(tmp_path: Path) -> None:
    data = _study_data(search_space=os.fspath(SHIPPED_SPACE), objective=os.fspath(SHIPPED_OBJECTIVE))
    load_study(StudyFiles(tmp_path)(data, file="s.yaml"))
    assert not (REPO / "search_spaces" / ".autotune").exists()
    assert _tree(tmp_path) == ["s.yaml"]


def test_a_seeded_simulated_launch_seeds_the_nodes_noise(project: Path) -> None:
    sim = ["python", "-m", "autotune.sim.sglang_server"]
    server = {"command": sim, "model_path": "/m", "draft_model_path": "/d"}
    seeded = load_study(_write(project, _study_data(server=server, sampler={"seed": 1})))
    launch = seeded.server_launch(seeded.search_space.baseline())
    seeds = [seeded.seeded(launch, trial).env["SGLANG_SIM_SEED"] for trial in (0, 1, 0)]
    assert seeds[0] == seeds[2] != seeds[1]  # the same trial, the same noise; the next trial, its own
    other = load_study(_write(project, _study_data(server=server, sampler={"seed": 2})))
    assert other.seeded(launch, 0).env["SGLANG_SIM_SEED"] != seeds[0]
    # A real server's noise is the hardware's; an unseeded study's stays the OS's; a seed set by hand stays.
    real = load_study(_write(project, _study_data(sampler={"seed": 1})))
    assert real.seeded(launch, 0) == launch
    unseeded = load_study(_write(project, _study_data(server=server)))
    assert unseeded.seeded(launch, 0) == launch
    own = replace(launch, env={"SGLANG_SIM_SEED": "5"})
    assert seeded.seeded(own, 3).env["SGLANG_SIM_SEED"] == "5"
