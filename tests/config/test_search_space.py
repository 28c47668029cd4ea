"""Search space validation, and the translation of Optuna trials into TrialConfigs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.config.search_space import (
    SKIP,
    AtMost,
    Derived,
    IntParameter,
    SearchSpace,
    SpeculativeRules,
    load_search_space,
    parse_search_space,
    same_value,
)
from autotune.errors import ConfigError
from autotune.trial.launch import TrialConfig
from tests.builders import REPO

SHIPPED = REPO / "search_spaces" / "sglang-nccl-eagle3.yaml"
ALG, STEPS, TOPK, DRAFT = (
    "--speculative-algorithm",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _space(parameters: dict[str, Any], tmp_path: Path) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"parameters": parameters}, sort_keys=False))
    return load_search_space(path)


def _error(parameters: dict[str, Any], tmp_path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        _space(parameters, tmp_path)
    error = info.value
    assert error.path == tmp_path / "space.yaml"
    assert "\n" not in str(error)
    assert str(error.path) in str(error) and error.field in str(error) and error.fix in str(error)
    return error


SPEC = {
    ALG: {"kind": "speculative", "type": "categorical", "choices": [None, "EAGLE3"]},
    STEPS: {"kind": "speculative", "type": "int", "low": 1, "high": 6, "when": {ALG: "EAGLE3"}},
    TOPK: {"kind": "speculative", "type": "categorical", "choices": [1, 2, 4, 8], "when": {ALG: "EAGLE3"}},
    DRAFT: {"kind": "speculative", "type": "int", "low": 2, "high": 16, "when": {ALG: "EAGLE3"}},
}


# ---- bad input: every message names the file, the field, the value and a fix ----


def test_low_above_high_states_both_values(tmp_path: Path) -> None:
    error = _error(
        {"--mem-fraction-static": {"kind": "sglang", "type": "float", "low": 0.95, "high": 0.7}}, tmp_path
    )
    assert error.field == "parameters.--mem-fraction-static.low"
    assert error.value == 0.95
    assert "`low <= high` must hold, but got (low=0.95, high=0.7)" in error.problem
    assert "Swap" in error.fix


def test_log_needs_positive_low(tmp_path: Path) -> None:
    error = _error({"--x": {"kind": "sglang", "type": "int", "low": 0, "high": 8, "log": True}}, tmp_path)
    assert error.field == "parameters.--x.low"
    assert error.value == 0
    assert "`low > 0` must hold for `log=True`" in error.problem


def test_log_and_step_are_exclusive(tmp_path: Path) -> None:
    error = _error(
        {"--x": {"kind": "sglang", "type": "float", "low": 0.1, "high": 1.0, "step": 0.1, "log": True}},
        tmp_path,
    )
    assert error.field == "parameters.--x.step"
    assert "cannot be used together" in error.problem


def test_step_must_divide_range(tmp_path: Path) -> None:
    error = _error({"--x": {"kind": "sglang", "type": "int", "low": 1, "high": 10, "step": 4}}, tmp_path)
    assert error.field == "parameters.--x.step" and error.value == 4
    assert "Use a high of 9" in error.fix


def test_float_step_tolerates_binary_noise(tmp_path: Path) -> None:
    space = _space(
        {"--x": {"kind": "sglang", "type": "float", "low": 0.7, "high": 0.95, "step": 0.01}}, tmp_path
    )
    assert "--x" in space


def test_choices_must_be_non_empty_and_unique(tmp_path: Path) -> None:
    error = _error({"NCCL_ALGO": {"kind": "nccl", "type": "categorical", "choices": []}}, tmp_path)
    assert error.field == "parameters.NCCL_ALGO.choices"
    error = _error(
        {"NCCL_ALGO": {"kind": "nccl", "type": "categorical", "choices": ["Ring", "Ring"]}}, tmp_path
    )
    assert error.field == "parameters.NCCL_ALGO.choices[1]" and error.value == "Ring"
    assert "unique" in error.problem


def test_true_and_one_are_different_choices(tmp_path: Path) -> None:
    space = _space({"NCCL_X": {"kind": "nccl", "type": "categorical", "choices": [1, True, None]}}, tmp_path)
    assert space.possible_values("NCCL_X") == [1, True, None]


def test_choice_must_be_a_scalar(tmp_path: Path) -> None:
    error = _error({"NCCL_ALGO": {"kind": "nccl", "type": "categorical", "choices": [None, [1]]}}, tmp_path)
    assert error.field == "parameters.NCCL_ALGO.choices[1]" and error.value == [1]


def test_unknown_key_offers_did_you_mean(tmp_path: Path) -> None:
    error = _error(
        {"--x": {"kind": "sglang", "type": "float", "low": 0.1, "high": 0.9, "stepp": 0.1}}, tmp_path
    )
    assert error.field == "parameters.--x.stepp"
    assert error.value == "stepp"
    assert error.problem == "unknown key"
    assert "Did you mean 'step'?" in error.fix


def test_unknown_top_level_key(tmp_path: Path) -> None:
    path = tmp_path / "space.yaml"
    path.write_text("parameter:\n  NCCL_ALGO: {kind: nccl, type: bool}\n")
    with pytest.raises(ConfigError) as info:
        load_search_space(path)
    assert info.value.field == "parameter"
    assert "Did you mean 'parameters'?" in info.value.fix


def test_unknown_type_offers_did_you_mean(tmp_path: Path) -> None:
    error = _error({"--x": {"kind": "sglang", "type": "flaot", "low": 0.1, "high": 0.9}}, tmp_path)
    assert error.field == "parameters.--x.type" and error.value == "flaot"
    assert "Did you mean 'float'?" in error.fix
    assert "int, float, categorical, bool" in error.fix


def test_missing_type(tmp_path: Path) -> None:
    error = _error({"--x": {"kind": "sglang", "low": 1, "high": 2}}, tmp_path)
    assert error.field == "parameters.--x.type"
    assert "missing" in error.problem


def test_unknown_kind_offers_did_you_mean(tmp_path: Path) -> None:
    error = _error({"NCCL_ALGO": {"kind": "ncl", "type": "bool"}}, tmp_path)
    assert error.field == "parameters.NCCL_ALGO.kind" and error.value == "ncl"
    assert "Did you mean 'nccl'?" in error.fix


def test_int_bounds_must_be_whole_numbers(tmp_path: Path) -> None:
    error = _error({"--x": {"kind": "sglang", "type": "int", "low": 1.5, "high": 4}}, tmp_path)
    assert error.field == "parameters.--x.low" and error.value == 1.5
    assert "whole number" in error.problem


def test_nccl_keys_are_nccl_env_vars(tmp_path: Path) -> None:
    error = _error({"nccl_algo": {"kind": "nccl", "type": "bool"}}, tmp_path)
    assert error.field == "parameters.nccl_algo" and error.value == "nccl_algo"
    assert "NCCL_" in error.problem


def test_flag_keys_start_with_dashes(tmp_path: Path) -> None:
    error = _error(
        {"mem-fraction-static": {"kind": "sglang", "type": "float", "low": 0.7, "high": 0.9}}, tmp_path
    )
    assert error.field == "parameters.mem-fraction-static"
    assert "'--mem-fraction-static'" in error.fix


def test_speculative_flags_need_kind_speculative(tmp_path: Path) -> None:
    error = _error({ALG: {"kind": "sglang", "type": "categorical", "choices": [None, "EAGLE3"]}}, tmp_path)
    assert error.field == f"parameters.{ALG}.kind" and error.value == "sglang"


def test_flags_autotune_sets_cannot_be_tuned(tmp_path: Path) -> None:
    error = _error({"--port": {"kind": "sglang", "type": "int", "low": 30000, "high": 30010}}, tmp_path)
    assert "server.port" in error.fix


def test_condition_on_unknown_parameter(tmp_path: Path) -> None:
    spec = dict(SPEC)
    spec[STEPS] = {**SPEC[STEPS], "when": {"--speculative-algoritm": "EAGLE3"}}
    error = _error(spec, tmp_path)
    assert error.field == f"parameters.{STEPS}.when.--speculative-algoritm"
    assert error.value == "--speculative-algoritm"
    assert "unknown parameter" in error.problem
    assert f"Did you mean '{ALG}'?" in error.fix


def test_condition_on_later_parameter(tmp_path: Path) -> None:
    error = _error(
        {
            "--a": {"kind": "sglang", "type": "bool", "when": {"--b": True}},
            "--b": {"kind": "sglang", "type": "bool"},
        },
        tmp_path,
    )
    assert error.field == "parameters.--a.when.--b"
    assert "declared later" in error.problem and "Declare --b above --a" in error.fix


def test_condition_value_must_be_possible(tmp_path: Path) -> None:
    spec = dict(SPEC)
    spec[STEPS] = {**SPEC[STEPS], "when": {ALG: "EAGEL3"}}
    error = _error(spec, tmp_path)
    assert error.value == "EAGEL3"
    assert "Did you mean 'EAGLE3'?" in error.fix


def test_speculative_knob_must_be_conditioned_on_algorithm(tmp_path: Path) -> None:
    spec = dict(SPEC)
    spec[STEPS] = {k: v for k, v in SPEC[STEPS].items() if k != "when"}
    error = _error(spec, tmp_path)
    assert error.field == f"parameters.{STEPS}"
    assert f"when: {{{ALG}: EAGLE3}}" in error.fix


def test_topk_must_come_before_draft_tokens(tmp_path: Path) -> None:
    spec = {ALG: SPEC[ALG], STEPS: SPEC[STEPS], DRAFT: SPEC[DRAFT], TOPK: SPEC[TOPK]}
    error = _error(spec, tmp_path)
    assert error.field == f"parameters.{DRAFT}"
    assert f"Declare {TOPK} above {DRAFT}" in error.fix


def test_unknown_speculative_algorithm(tmp_path: Path) -> None:
    error = _error(
        {ALG: {"kind": "speculative", "type": "categorical", "choices": [None, "EAGLE-3"]}}, tmp_path
    )
    assert error.field == f"parameters.{ALG}.choices[1]"
    assert "Did you mean 'EAGLE3'?" in error.fix


def test_empty_search_space(tmp_path: Path) -> None:
    error = _error({}, tmp_path)
    assert error.field == "parameters"


def test_field_errors_come_before_cross_field_errors(tmp_path: Path) -> None:
    # Both layers: pydantic runs the model validators only once every field is valid.
    spec = dict(SPEC)
    spec[STEPS] = {**SPEC[STEPS], "when": {"--nope": "EAGLE3"}}
    spec[TOPK] = {**SPEC[TOPK], "choises": [1, 2]}
    error = _error(spec, tmp_path)
    assert error.field == f"parameters.{TOPK}.choises" and "Did you mean 'choices'?" in error.fix
    spec[TOPK] = SPEC[TOPK]
    error = _error(spec, tmp_path)
    assert error.field == f"parameters.{STEPS}.when.--nope"


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_search_space(tmp_path / "nope.yaml")
    assert info.value.path == tmp_path / "nope.yaml" and "not found" in info.value.problem


# ---- suggest(): Optuna trials into TrialConfigs ----


def test_shipped_search_space_loads() -> None:
    space = load_search_space(SHIPPED)
    assert list(space)[:2] == ["NCCL_ALGO", "NCCL_PROTO"]
    for name in (STEPS, TOPK, DRAFT):
        assert space.parameters[name].when == {ALG: ["EAGLE3"]}
    assert space.parameters["--mem-fraction-static"].when is None
    assert space.possible_values("NCCL_P2P_LEVEL") == [None, "PIX", "PXB", "PHB", "SYS"]


def test_baseline_is_empty() -> None:
    baseline = load_search_space(SHIPPED).baseline()
    assert baseline == TrialConfig()
    assert baseline.env == {} and baseline.flags == {} and baseline.params == {} and baseline.derived == {}
    assert baseline.is_baseline


def _asked(space: SearchSpace, params: dict[str, Any]) -> tuple[optuna.Study, optuna.Trial, TrialConfig]:
    study = optuna.create_study()
    study.enqueue_trial(params)
    trial = study.ask()
    return study, trial, space.suggest(trial)


def test_speculative_knobs_only_when_algorithm_is_on() -> None:
    space = load_search_space(SHIPPED)
    _, trial, config = _asked(space, {ALG: None})
    assert ALG in trial.params and trial.params[ALG] is None
    assert not any(name in trial.params for name in (STEPS, TOPK, DRAFT))
    assert not any(flag.startswith("--speculative") for flag in config.flags)


def test_topk_one_derives_draft_tokens() -> None:
    space = load_search_space(SHIPPED)
    _, trial, config = _asked(space, {ALG: "EAGLE3", STEPS: 3, TOPK: 1})
    assert DRAFT not in trial.params  # never asked of Optuna
    assert config.derived == {DRAFT: 4}
    assert DRAFT not in config.params
    assert config.flags[ALG] == "EAGLE3" and config.flags[STEPS] == "3" and config.flags[TOPK] == "1"
    assert config.flags[DRAFT] == "4"
    assert list(config.flags)[-4:] == [ALG, STEPS, TOPK, DRAFT]


def test_topk_above_one_samples_draft_tokens() -> None:
    space = load_search_space(SHIPPED)
    _, trial, config = _asked(space, {ALG: "EAGLE3", STEPS: 3, TOPK: 4, DRAFT: 9})
    assert trial.params[DRAFT] == 9
    assert config.flags[DRAFT] == "9" and config.derived == {}


def test_random_trials_keep_sglang_rules() -> None:
    space = load_search_space(SHIPPED)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen_derived = seen_sampled_draft = seen_off = False
    for _ in range(60):
        trial = study.ask()
        config = space.suggest(trial)
        study.tell(trial, 0.0)
        assert set(config.params) == set(trial.params)
        if config.flags.get(ALG) is None:
            seen_off = True
            assert not any(f.startswith("--speculative") for f in config.flags)
        elif config.flags[TOPK] == "1":
            seen_derived = True
            assert int(config.flags[DRAFT] or 0) == int(config.flags[STEPS] or 0) + 1
        else:
            seen_sampled_draft = True
            assert DRAFT in trial.params
        assert "--mem-fraction-static" in config.flags
    assert seen_derived and seen_sampled_draft and seen_off


def test_values_become_env_strings_and_flags(tmp_path: Path) -> None:
    space = _space(
        {
            "NCCL_BUFFSIZE": {"kind": "nccl", "type": "categorical", "choices": [None, 1048576]},
            "NCCL_ALGO": {"kind": "nccl", "type": "categorical", "choices": [None, "Ring"]},
            "NCCL_CUMEM_ENABLE": {"kind": "nccl", "type": "bool"},
            "NCCL_NET_GDR_LEVEL": {"kind": "nccl", "type": "bool"},
            "--disable-custom-all-reduce": {"kind": "sglang", "type": "bool"},
            "--enable-torch-symm-mem": {"kind": "sglang", "type": "bool"},
            "--cuda-graph-max-bs-decode": {"kind": "sglang", "type": "categorical", "choices": [None, 128]},
            "--mem-fraction-static": {
                "kind": "sglang",
                "type": "float",
                "low": 0.7,
                "high": 0.95,
                "step": 0.01,
            },
        },
        tmp_path,
    )
    trial = optuna.trial.FixedTrial(
        {
            "NCCL_BUFFSIZE": 1048576,
            "NCCL_ALGO": None,
            "NCCL_CUMEM_ENABLE": True,
            "NCCL_NET_GDR_LEVEL": False,
            "--disable-custom-all-reduce": True,
            "--enable-torch-symm-mem": False,
            "--cuda-graph-max-bs-decode": None,
            "--mem-fraction-static": 0.8999999999999999,
        }
    )
    config = space.suggest(trial)
    assert config.env == {"NCCL_BUFFSIZE": "1048576", "NCCL_CUMEM_ENABLE": "1", "NCCL_NET_GDR_LEVEL": "0"}
    assert config.flags == {"--disable-custom-all-reduce": None, "--mem-fraction-static": "0.9"}
    assert config.params["NCCL_ALGO"] is None and config.params["--enable-torch-symm-mem"] is False


def test_stored_trial_rebuilds_the_same_config() -> None:
    space = load_search_space(SHIPPED)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    configs = []
    for _ in range(10):
        trial = study.ask()
        configs.append(space.suggest(trial))
        study.tell(trial, 1.0)
    assert [space.suggest(frozen) for frozen in study.trials] == configs


def test_a_stored_trial_from_before_a_rule_narrowed_a_range_is_rebuilt_as_it_ran() -> None:
    space = load_search_space(SHIPPED)
    study = optuna.create_study()
    study.enqueue_trial({ALG: "EAGLE3", STEPS: 2, TOPK: 2})
    trial = study.ask()
    space.suggest(trial)
    study.tell(trial, 1.0)
    narrowed = trial.distributions[DRAFT]
    full = space.parameters[DRAFT]
    assert isinstance(narrowed, optuna.distributions.IntDistribution) and isinstance(full, IntParameter)
    assert narrowed.high < full.high  # the draft tree holds at most this many tokens: a live trial asks so
    stored = study.trials[0]
    older = optuna.trial.create_trial(
        params={**stored.params, DRAFT: full.high},
        distributions={
            **stored.distributions,
            DRAFT: optuna.distributions.IntDistribution(full.low, full.high),
        },
        value=1.0,
    )
    assert space.suggest(older).params[DRAFT] == full.high


def test_fixed_trial_with_topk_one_needs_no_draft_tokens() -> None:
    space = load_search_space(SHIPPED)
    params: dict[str, Any] = {name: None for name in space if space.possible_values(name) is not None}
    params.update({"--mem-fraction-static": 0.85, "--disable-custom-all-reduce": False})
    params.update({"--enable-flashinfer-allreduce-fusion": False, "--enable-torch-symm-mem": False})
    params.update({ALG: "EAGLE3", STEPS: 5, TOPK: 1})
    config = space.suggest(optuna.trial.FixedTrial(params))
    assert config.derived == {DRAFT: 6}
    assert config.env == {}
    assert config.flags == {"--mem-fraction-static": "0.85", ALG: "EAGLE3", STEPS: "5", TOPK: "1", DRAFT: "6"}


def test_condition_chain_and_lists(tmp_path: Path) -> None:
    space = _space(
        {
            "--a": {"kind": "sglang", "type": "categorical", "choices": ["x", "y", "z"]},
            "--b": {"kind": "sglang", "type": "bool", "when": {"--a": ["x", "y"]}},
            "--c": {"kind": "sglang", "type": "int", "low": 1, "high": 3, "when": {"--b": True}},
        },
        tmp_path,
    )
    assert space.suggest(optuna.trial.FixedTrial({"--a": "z"})).params == {"--a": "z"}
    assert space.suggest(optuna.trial.FixedTrial({"--a": "y", "--b": False})).params == {
        "--a": "y",
        "--b": False,
    }
    config = space.suggest(optuna.trial.FixedTrial({"--a": "x", "--b": True, "--c": 2}))
    assert config.flags == {"--a": "x", "--b": None, "--c": "2"}


# ---- SGLang's rules, unit by unit ----


def test_rules_decide() -> None:
    declared = [ALG, STEPS, TOPK, DRAFT]
    decide = SpeculativeRules.decide
    assert decide(STEPS, {ALG: None}, declared) == SKIP
    assert decide(STEPS, {ALG: "EAGLE3"}, declared) is None
    assert decide(TOPK, {ALG: "EAGLE3"}, declared) == SKIP  # steps unset: topk unset too
    assert decide(DRAFT, {ALG: "EAGLE3", STEPS: 2}, declared) is None
    assert decide(DRAFT, {ALG: "EAGLE3", STEPS: 2, TOPK: 1}, declared) == Derived(3)
    assert decide(DRAFT, {ALG: "EAGLE3", STEPS: 2, TOPK: 2}, declared) == AtMost(7)  # the draft tree
    assert decide("--mem-fraction-static", {}, declared) is None
    # With the algorithm fixed outside the search space, the knobs are always suggested.
    assert decide(STEPS, {}, [STEPS, TOPK]) is None


def test_needs_draft_model() -> None:
    assert SpeculativeRules.needs_draft_model("EAGLE3")
    assert not SpeculativeRules.needs_draft_model("NGRAM")
    assert not SpeculativeRules.needs_draft_model(None)


def test_parse_search_space_without_file() -> None:
    space = parse_search_space({"parameters": {"NCCL_ALGO": {"kind": "nccl", "type": "bool"}}}, "inline.yaml")
    assert space.path == Path("inline.yaml") and "NCCL_ALGO" in space


def test_ngram_takes_draft_tokens_alone_and_eagle_keeps_its_tree(tmp_path: Path) -> None:
    """SGLang's `_handle_ngram` needs no steps for draft tokens (0.5.17 defaults them to 12) and sets topk
    from --speculative-ngram-max-bfs-breadth; `_handle_eagle_family` asserts steps for both."""
    declared = [ALG, STEPS, TOPK, DRAFT]
    decide = SpeculativeRules.decide
    assert decide(STEPS, {ALG: "NGRAM"}, declared) == SKIP
    assert decide(TOPK, {ALG: "NGRAM"}, declared) == SKIP
    assert decide(DRAFT, {ALG: "NGRAM"}, declared) is None
    ngram_only = {
        ALG: {"kind": "speculative", "type": "categorical", "choices": [None, "NGRAM"]},
        DRAFT: {"kind": "speculative", "type": "int", "low": 4, "high": 16, "when": {ALG: ["NGRAM"]}},
    }
    space = _space(ngram_only, tmp_path)
    flags = space.suggest(optuna.trial.FixedTrial({ALG: "NGRAM", DRAFT: 8})).flags
    assert flags == {ALG: "NGRAM", DRAFT: "8"}
    # Both: an EAGLE-3 trial gets its tree, an NGRAM trial its draft tokens alone.
    either = {ALG: ["EAGLE3", "NGRAM"]}
    both = {
        ALG: {"kind": "speculative", "type": "categorical", "choices": [None, "EAGLE3", "NGRAM"]},
        STEPS: {"kind": "speculative", "type": "int", "low": 1, "high": 6, "when": {ALG: ["EAGLE3"]}},
        TOPK: {"kind": "speculative", "type": "categorical", "choices": [1, 4], "when": {ALG: ["EAGLE3"]}},
        DRAFT: {"kind": "speculative", "type": "int", "low": 2, "high": 16, "when": either},
    }
    (tmp_path / "both").mkdir()
    space = _space(both, tmp_path / "both")
    ngram = space.suggest(optuna.trial.FixedTrial({ALG: "NGRAM", STEPS: 3, TOPK: 4, DRAFT: 10}))
    assert ngram.flags == {ALG: "NGRAM", DRAFT: "10"}
    eagle = space.suggest(optuna.trial.FixedTrial({ALG: "EAGLE3", STEPS: 3, TOPK: 4, DRAFT: 10}))
    assert eagle.flags == {ALG: "EAGLE3", STEPS: "3", TOPK: "4", DRAFT: "10"}
    # Without NGRAM, draft tokens declared before steps still mean nothing: the rule's error stays.
    eagle_only = {**ngram_only, ALG: {**ngram_only[ALG], "choices": [None, "EAGLE3"]}}
    eagle_only[DRAFT] = {**ngram_only[DRAFT], "when": {ALG: ["EAGLE3"]}}
    (tmp_path / "eagle").mkdir()
    assert "needs --speculative-num-steps declared before it" in str(_error(eagle_only, tmp_path / "eagle"))


def test_one_rule_says_when_two_knob_values_are_one() -> None:
    # YAML's types stay apart: `true` is not `1`, `null` only equals `null`; equal numbers are one value.
    assert not same_value(True, 1) and not same_value(None, 0) and not same_value(0, False)
    assert same_value(None, None) and same_value("lpm", "lpm") and same_value(8, 8.0)
    # Screening's tolerance: a parser's default and a range's step computed in floats are one value.
    assert not same_value(0.3, 0.1 * 3)
    assert same_value(0.3, 0.1 * 3, tolerance=1e-9) and not same_value(0.3, 0.31, tolerance=1e-9)
    assert not same_value(True, 1, tolerance=1e-9)
