"""The study file's `trust` and its first part, no launch made twice; run fast on nodes answered by the
simulated node's model, real Optuna storage. The noise, the confirmation and the stopping rule have files
of their own (test_noise.py, test_confirm.py, test_stopping.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.study.loop import StudyDriver
from autotune.study.rules import launch_identity, same_launch
from autotune.study.storage import budget_used
from autotune.study.trust.noise import noise_estimate
from autotune.trial.launch import ServerLaunch
from autotune.trial.redaction import Secrets
from tests.builders import TRUST_OFF, StudyFiles, launched, model_pool, one_value_space


# -- the study file ---------------------------------------------------------------------------------------
def test_trust_is_on_by_default_and_each_part_switches_off(study_file: StudyFiles) -> None:
    trust = load_study(study_file(trust=None)).file.trust
    assert trust.skip_same_launch and trust.repeat_baseline_after == 3
    assert trust.confirm.enabled and trust.confirm.top == 2 and trust.confirm.max_rounds == 6
    assert trust.confirm.pool_noise and trust.confirm.min_rounds == 2  # RESULTS.md, issue 37 item 4
    assert trust.stop_early.enabled and trust.stop_early.min_patience == 8  # RESULTS.md, session 12
    off = load_study(study_file(trust={"confirm": False, "stop_early": {"patience": 4}})).file.trust
    assert not off.confirm.enabled and off.stop_early.enabled and off.stop_early.patience == 4
    assert off.stop_early.min_patience == 4  # unset, it starts at a patience set below its default
    fixed = load_study(study_file(trust={"stop_early": {"min_patience": None}})).file.trust
    assert fixed.stop_early.min_patience is None and fixed.stop_early.patience == 15
    everything = load_study(study_file(trust=False)).file.trust
    assert not (everything.skip_same_launch or everything.confirm.enabled or everything.stop_early.enabled)


@pytest.mark.parametrize(
    ("trust", "words"),
    [
        ({"confirm": 3}, ["trust.confirm", "not a switch nor a section", "`confirm: off`"]),
        ({"confirm": {"min_rounds": 5, "max_rounds": 3}}, ["trust.confirm.min_rounds", "5", "max_rounds"]),
        (
            {"confirm": {"min_rounds": 1, "pool_noise": False}},
            ["trust.confirm.min_rounds", "1", "pool_noise: true"],
        ),
        ({"stop_early": {"patience": 0}}, ["trust.stop_early.patience"]),
        (
            {"stop_early": {"min_patience": 20}},
            ["trust.stop_early.min_patience", "20", "Lower min_patience to 15"],
        ),
        (
            {"stop_early": {"patience": 4, "min_patience": 8}},
            ["trust.stop_early.min_patience", "8", "Lower min_patience to 4"],
        ),
        ({"skip_repeats": True}, ["trust.skip_repeats"]),
    ],
)
def test_a_wrong_trust_setting_names_the_file_the_field_and_the_fix(
    study_file: StudyFiles, trust: dict[str, Any], words: list[str]
) -> None:
    path = study_file(trust=trust)
    with pytest.raises(ConfigError) as error:
        load_study(path)
    message = str(error.value)
    assert str(path) in message or path.name in message
    for word in words:
        assert word in message


# -- the same launch --------------------------------------------------------------------------------------
BASE = (("--model-path", "/m"), ("--tp-size", "8"), ("--trust-remote-code", None))


def _identity(
    *flags: tuple[str, str | None], env: dict[str, str], secrets: Secrets | None = None
) -> dict[str, object]:
    command = ("python", "-m", "sglang.launch_server")
    launch = ServerLaunch(command, env, "127.0.0.1", 30000, flags=(*BASE, *flags))
    return launch_identity(launch, secrets)


def test_the_same_launch_is_the_same_flags_as_the_server_reads_them() -> None:
    env = {"NCCL_ALGO": "Ring"}
    a = _identity(("--mem-fraction-static", "0.80"), ("--port", "30000"), env=env)
    b = _identity(("--port", "30000"), ("--mem-fraction-static", "0.8"), env=env)
    assert same_launch(a, b, {})
    assert not same_launch(a, _identity(("--mem-fraction-static", "0.81"), env=env), {})
    tree = _identity(("--mem-fraction-static", "0.8"), env={"NCCL_ALGO": "Tree"})
    assert not same_launch(a, tree, {})
    switch = _identity(("--disable-radix-cache", None), env={})
    assert not same_launch(_identity(env={}), switch, {})


def test_a_knob_left_unset_is_the_value_the_server_chose_for_itself() -> None:
    unset = _identity(env={})
    chosen = _identity(("--mem-fraction-static", "0.88"), env={})
    assert same_launch(unset, chosen, {"--mem-fraction-static": 0.88})
    assert not same_launch(unset, chosen, {"--mem-fraction-static": 0.85})
    assert not same_launch(unset, chosen, {})  # before the baseline said what it chose


def test_a_secret_flag_is_not_kept_in_the_clear() -> None:
    identity = _identity(("--api-key", "sk-secret-123"), env={"HF_TOKEN": "hf_secret"})
    assert "sk-secret-123" not in json.dumps(identity) and "hf_secret" not in json.dumps(identity)
    other = _identity(("--api-key", "other"), env={"HF_TOKEN": "hf_secret"})
    assert not same_launch(identity, other, {})
    # A value the study reads from a `${NAME}` is secret whatever the flag's name.
    study_secrets = Secrets.of(values=["served-name-3e8d1c"])
    named = _identity(("--served-model-name", "served-name-3e8d1c"), env={}, secrets=study_secrets)
    assert "served-name-3e8d1c" not in json.dumps(named)


def test_a_config_launched_before_is_recorded_with_its_result_not_launched_again(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=4, search_space=space, trust={**TRUST_OFF, "skip_same_launch": True})
    driver = StudyDriver(load_study(path), pool=model_pool())
    optuna_study = driver.run()
    trials = optuna_study.get_trials(deepcopy=False)
    same = [t for t in trials if "same_as" in t.user_attrs]
    # Only the baseline and trial 1 ran; every later proposal was trial 1's launch again.
    assert [t.number for t in launched(optuna_study)] == [0, 1]
    assert same and all(t.user_attrs["same_as"] == 1 for t in same)
    assert all(t.state == TrialState.COMPLETE and t.value == trials[1].value for t in same)
    assert all("node_s" not in t.user_attrs and t.user_attrs["skipped"] for t in same)
    # no budget spent on them; the search stopped: nothing new was proposed
    assert budget_used(optuna_study) == 2
    assert driver.stopped is not None and "launched before" in driver.stopped
    # Never a second measurement of the config: the noise has nothing to pool.
    assert noise_estimate(optuna_study) is None
    assert main(["status", str(path)]) == 0
    assert "same as trial 1: its launch again, not run" in capsys.readouterr().out


def test_a_knob_set_to_its_parser_default_is_the_launch_that_leaves_it_unset(study_file: StudyFiles) -> None:
    # SGLang's parser defaults --schedule-conservativeness to 1.0 (the committed flag tables): the baseline.
    space = one_value_space("--schedule-conservativeness", 1.0)
    path = study_file(n_trials=3, search_space=space, trust={**TRUST_OFF, "skip_same_launch": True})
    optuna_study = StudyDriver(load_study(path), pool=model_pool()).run()
    assert [t.number for t in launched(optuna_study)] == [0]
    assert all(t.user_attrs["same_as"] == 0 for t in optuna_study.get_trials(deepcopy=False) if t.number > 0)


def test_without_the_switch_the_same_config_is_launched_again(study_file: StudyFiles) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=4, search_space=space, trust=TRUST_OFF)
    optuna_study = StudyDriver(load_study(path), pool=model_pool()).run()
    assert [t.number for t in launched(optuna_study)] == [0, 1, 2, 3]


def test_a_config_queued_by_hand_is_launched_even_when_it_ran_before(study_file: StudyFiles) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=2, search_space=space, trust={**TRUST_OFF, "skip_same_launch": True})
    study = load_study(path)
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    optuna_study.enqueue_trial({"--chunked-prefill-size": 4096}, user_attrs={"queued": {"set": {}}})
    optuna_study = StudyDriver(study, pool=model_pool()).run(n_trials=3)
    assert [t.number for t in launched(optuna_study)] == [0, 1, 2]
