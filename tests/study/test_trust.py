"""Answers a user can trust (the study file's `trust`): no launch made twice, the noise measured, the winner
confirmed in interleaved rounds, a search that stops when it stops finding; run fast on nodes answered by
the simulated node's model (with its run-to-run noise), real Optuna storage."""

from __future__ import annotations

import json
import socket
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import Study, load_study
from autotune.errors import ConfigError
from autotune.node.pool import LocalNodePool, NodePool
from autotune.sim.model_node import ModelNodeExecutor, node_report
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.answer import study_answer
from autotune.study.callbacks import StudyCallback, TrialFinished
from autotune.study.confirm import confirmation, round_order
from autotune.study.loop import StudyDriver, StudyInterrupted
from autotune.study.noise import noise_estimate, pooled
from autotune.study.records import DRIVER_ATTR
from autotune.study.rules import ConfigMeasurements, launch_identity, same_launch
from autotune.study.storage import budget_used, open_study
from autotune.study.summary import study_summary
from autotune.trial.redaction import Secrets
from tests.builders import StudyFiles


def model_pool(noise: float = 0.0) -> Callable[[Study], NodePool]:
    """One node answered by the model of the seed's node, with `noise` (relative SD) on every launch."""
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    return lambda study: LocalNodePool(
        {"n0": ModelNodeExecutor("n0", hw, model, noise=noise)}, {"n0": node_report("n0", hw, model)}
    )


OFF: dict[str, Any] = {
    "skip_same_launch": False,
    "repeat_baseline_after": 0,
    "confirm": False,
    "stop_early": False,
    "screen": False,
}
# Knobs the model's throughput does not depend on: a flat landscape, where only noise differs.
FLAT = {
    "parameters": {
        "--schedule-policy": {"kind": "sglang", "type": "categorical", "choices": [None, "lpm", "fcfs"]},
        "--stream-interval": {"kind": "sglang", "type": "categorical", "choices": [None, 2, 4, 16]},
    }
}


def one_value_space(name: str, value: object) -> dict[str, object]:
    return {"parameters": {name: {"kind": "sglang", "type": "categorical", "choices": [value]}}}


def launched(ostudy: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    return [t for t in ostudy.get_trials(deepcopy=False) if "node" in t.user_attrs]


# -- the study file ---------------------------------------------------------------------------------------
def test_trust_is_on_by_default_and_each_part_switches_off(study_file: StudyFiles) -> None:
    trust = load_study(study_file(trust=None)).file.trust
    assert trust.skip_same_launch and trust.repeat_baseline_after == 3
    assert trust.confirm.enabled and trust.confirm.top == 2 and trust.confirm.max_rounds == 6
    assert trust.stop_early.enabled
    off = load_study(study_file(trust={"confirm": False, "stop_early": {"patience": 4}})).file.trust
    assert not off.confirm.enabled and off.stop_early.enabled and off.stop_early.patience == 4
    everything = load_study(study_file(trust=False)).file.trust
    assert not (everything.skip_same_launch or everything.confirm.enabled or everything.stop_early.enabled)


@pytest.mark.parametrize(
    ("trust", "words"),
    [
        ({"confirm": 3}, ["trust.confirm", "not a switch nor a section", "`confirm: off`"]),
        ({"confirm": {"min_rounds": 5, "max_rounds": 3}}, ["trust.confirm.min_rounds", "5", "max_rounds"]),
        ({"stop_early": {"patience": 0}}, ["trust.stop_early.patience"]),
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
ARGV = ["python", "-m", "sglang.launch_server", "--model-path", "/m", "--tp-size", "8", "--trust-remote-code"]


def test_the_same_launch_is_the_same_flags_as_the_server_reads_them() -> None:
    env = {"NCCL_ALGO": "Ring"}
    a = launch_identity([*ARGV, "--mem-fraction-static", "0.80", "--port", "30000"], env)
    b = launch_identity([*ARGV, "--port=30000", "--mem-fraction-static", "0.8"], env)
    assert same_launch(a, b, {})
    assert not same_launch(a, launch_identity([*ARGV, "--mem-fraction-static", "0.81"], env), {})
    tree = launch_identity([*ARGV, "--mem-fraction-static", "0.8"], {"NCCL_ALGO": "Tree"})
    assert not same_launch(a, tree, {})
    switch = launch_identity([*ARGV, "--disable-radix-cache"], {})
    assert not same_launch(launch_identity(ARGV, {}), switch, {})


def test_a_knob_left_unset_is_the_value_the_server_chose_for_itself() -> None:
    unset = launch_identity(ARGV, {})
    chosen = launch_identity([*ARGV, "--mem-fraction-static", "0.88"], {})
    assert same_launch(unset, chosen, {"--mem-fraction-static": 0.88})
    assert not same_launch(unset, chosen, {"--mem-fraction-static": 0.85})
    assert not same_launch(unset, chosen, {})  # before the baseline said what it chose


def test_a_secret_flag_is_not_kept_in_the_clear() -> None:
    identity = launch_identity([*ARGV, "--api-key", "sk-secret-123"], {"HF_TOKEN": "hf_secret"})
    assert "sk-secret-123" not in json.dumps(identity) and "hf_secret" not in json.dumps(identity)
    other = launch_identity([*ARGV, "--api-key", "other"], {"HF_TOKEN": "hf_secret"})
    assert not same_launch(identity, other, {})
    # A value the study reads from a `${NAME}` is secret whatever the flag's name.
    study_secrets = Secrets.of(values=["served-name-3e8d1c"])
    named = launch_identity([*ARGV, "--served-model-name", "served-name-3e8d1c"], {}, study_secrets)
    assert "served-name-3e8d1c" not in json.dumps(named)


def test_a_config_launched_before_is_recorded_with_its_result_not_launched_again(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=4, search_space=space, trust={**OFF, "skip_same_launch": True})
    driver = StudyDriver(load_study(path), pool=model_pool())
    ostudy = driver.run()
    trials = ostudy.get_trials(deepcopy=False)
    same = [t for t in trials if "same_as" in t.user_attrs]
    # Only the baseline and trial 1 ran; every later proposal was trial 1's launch again.
    assert [t.number for t in launched(ostudy)] == [0, 1]
    assert same and all(t.user_attrs["same_as"] == 1 for t in same)
    assert all(t.state == TrialState.COMPLETE and t.value == trials[1].value for t in same)
    assert all("node_s" not in t.user_attrs and t.user_attrs["skipped"] for t in same)
    assert budget_used(ostudy) == 2  # no budget spent on them; the search stopped: nothing new was proposed
    assert driver.stopped is not None and "launched before" in driver.stopped
    # Never a second measurement of the config: the noise has nothing to pool.
    assert noise_estimate(ostudy) is None
    assert main(["status", str(path)]) == 0
    assert "same as trial 1: its launch again, not run" in capsys.readouterr().out


def test_a_knob_set_to_its_parser_default_is_the_launch_that_leaves_it_unset(study_file: StudyFiles) -> None:
    # SGLang's parser defaults --schedule-conservativeness to 1.0 (the committed flag tables): the baseline.
    space = one_value_space("--schedule-conservativeness", 1.0)
    path = study_file(n_trials=3, search_space=space, trust={**OFF, "skip_same_launch": True})
    ostudy = StudyDriver(load_study(path), pool=model_pool()).run()
    assert [t.number for t in launched(ostudy)] == [0]
    assert all(t.user_attrs["same_as"] == 0 for t in ostudy.get_trials(deepcopy=False) if t.number > 0)


def test_without_the_switch_the_same_config_is_launched_again(study_file: StudyFiles) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=4, search_space=space, trust=OFF)
    ostudy = StudyDriver(load_study(path), pool=model_pool()).run()
    assert [t.number for t in launched(ostudy)] == [0, 1, 2, 3]


def test_a_config_queued_by_hand_is_launched_even_when_it_ran_before(study_file: StudyFiles) -> None:
    space = one_value_space("--chunked-prefill-size", 4096)
    path = study_file(n_trials=2, search_space=space, trust={**OFF, "skip_same_launch": True})
    study = load_study(path)
    ostudy = StudyDriver(study, pool=model_pool()).run()
    ostudy.enqueue_trial({"--chunked-prefill-size": 4096}, user_attrs={"queued": {"set": {}}})
    ostudy = StudyDriver(study, pool=model_pool()).run(n_trials=3)
    assert [t.number for t in launched(ostudy)] == [0, 1, 2]


# -- the noise --------------------------------------------------------------------------------------------
def group(of: int, values: list[float], baseline: bool = False) -> ConfigMeasurements:
    trials = tuple(range(of, of + len(values)))
    return ConfigMeasurements(of, baseline, {}, trials, tuple(values), ())


def test_the_noise_is_the_pooled_relative_spread_of_the_configs_near_the_best() -> None:
    # (100, 102): mean 101, squares (1/101)^2 * 2; (200, 196, 204): mean 200, squares (4/200)^2 * 2.
    groups = [group(0, [100, 102], baseline=True), group(5, [200, 196, 204]), group(9, [180.0])]
    near = pooled(groups)  # the baseline is 50% below the best: its spread is not the top's
    assert near is not None and near.dof == 2 and [of for of, _ in near.configs] == [5]
    assert near.relative_sd == pytest.approx(((2 * (4 / 200) ** 2) / 2) ** 0.5)
    close = [group(0, [190, 194], baseline=True), group(5, [200, 196, 204])]
    both = pooled(close)
    assert both is not None and both.dof == 3 and [of for of, _ in both.configs] == [0, 5]
    assert both.relative_sd == pytest.approx(((2 * (2 / 192) ** 2 + 2 * (4 / 200) ** 2) / 3) ** 0.5)
    assert pooled([group(0, [1.0]), group(1, [2.0])]) is None


def test_the_baseline_is_launched_again_early_and_gives_the_noise(study_file: StudyFiles) -> None:
    path = study_file(n_trials=7, trust={**OFF, "repeat_baseline_after": 3})
    ostudy = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    repeats = [t for t in launched(ostudy) if t.user_attrs.get("baseline") and t.number > 0]
    assert [t.number for t in repeats] == [3] and repeats[0].user_attrs["remeasure_of"] == 0
    noise = noise_estimate(ostudy)
    assert noise is not None and noise.dof == 1 and noise.configs[0] == (0, (0, 3))
    assert 0 < noise.relative_sd < 0.05  # the model's 1% noise, from one pair
    assert budget_used(ostudy) == 7  # the repeat is a launch: it counts


# -- confirmation -----------------------------------------------------------------------------------------
def test_round_order_alternates_as_compare_does() -> None:
    assert [round_order(i, ("d", "a", "b")) for i in range(4)] == [
        ("d", "a", "b"),
        ("b", "a", "d"),
        ("b", "a", "d"),
        ("d", "a", "b"),
    ]


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, optuna.Study]:
    trust = {"repeat_baseline_after": 3, "confirm": {"top": 2, "max_rounds": 4}, "stop_early": False}
    path = StudyFiles(tmp_path_factory.mktemp("confirm"))(n_trials=10, trust=trust)
    return path, StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()


def test_the_best_configs_and_the_defaults_run_again_in_interleaved_rounds(
    confirmed: tuple[Path, optuna.Study],
) -> None:
    _, ostudy = confirmed
    state = confirmation(ostudy)
    assert state is not None and len(state.configs) == 2
    rounds: dict[int, list[int]] = {}
    for trial in sorted(launched(ostudy), key=lambda t: t.number):
        if "confirm" in trial.user_attrs:
            assert trial.state == TrialState.COMPLETE
            mark = trial.user_attrs["confirm"]
            rounds.setdefault(mark["round"], []).append(trial.user_attrs["remeasure_of"])
    assert 2 <= len(rounds) <= 4
    order = (state.baseline, *state.configs)
    for index, configs in rounds.items():
        assert tuple(configs) == round_order(index, order)  # each a launch of its own, in the round's order
    assert budget_used(ostudy) == 10 + 3 * len(rounds)  # beyond the search's budget


class CtrlCInConfirmation(StudyCallback):
    """Presses Ctrl-C once, when the first confirmation launch finished (its round's others still queued)."""

    def __init__(self, study: Study) -> None:
        self.study, self.pressed = study, False

    def trial_finished(self, event: TrialFinished) -> None:
        stored = optuna.load_study(study_name=self.study.name, storage=self.study.storage)
        if not self.pressed and "confirm" in stored.trials[event.number].user_attrs:
            self.pressed = True
            raise KeyboardInterrupt


def test_confirmation_resumes_after_ctrl_c_where_it_stopped(study_file: StudyFiles) -> None:
    trust = {"repeat_baseline_after": 3, "confirm": {"top": 1, "max_rounds": 2}, "stop_early": False}
    study = load_study(study_file(n_trials=5, trust=trust))
    with pytest.raises(StudyInterrupted):
        StudyDriver(study, [CtrlCInConfirmation(study)], pool=model_pool(noise=0.01)).run()
    ostudy = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    state = confirmation(ostudy)
    assert state is not None and state.queued == 2 and state.pairs == 2
    assert sorted(state.rounds) == [0, 1] and all(len(v) == 2 for v in state.rounds.values())
    assert budget_used(ostudy) == 5 + 4  # no round measured twice, none lost


def test_confirmation_credits_the_trial_that_measured_a_config_not_an_interrupted_one(
    study_file: StudyFiles,
) -> None:
    """Issue 41, item 6: a driver died during a trial; the resume failed it as interrupted and ran its
    config again. The confirmation rows and the answer name the retry, which measured it."""
    trust = {"confirm": {"top": 3, "max_rounds": 2}, "stop_early": False, "screen": False}
    study = load_study(study_file(n_trials=4, search_space=FLAT, trust=trust))
    StudyDriver(study, pool=model_pool(noise=0.01)).run(n_trials=1)  # the baseline: nothing to confirm yet
    stored = open_study(study)
    stored.enqueue_trial({"--schedule-policy": "lpm", "--stream-interval": 4})  # a config the search chose
    orphan = stored.ask(
        {
            "--schedule-policy": CategoricalDistribution([None, "lpm", "fcfs"]),
            "--stream-interval": CategoricalDistribution([None, 2, 4, 16]),
        }
    )
    orphan.set_user_attr(DRIVER_ATTR, f"{socket.gethostname()}:1:0")  # a driver on this host, gone

    ostudy = StudyDriver(study, pool=model_pool(noise=0.01)).run()

    assert ostudy.trials[orphan.number].user_attrs["failure_kind"] == "interrupted"
    retry = next(t for t in ostudy.trials if t.user_attrs.get("retry_of") == orphan.number)
    assert retry.state == TrialState.COMPLETE and retry.params == orphan.params
    state = confirmation(ostudy)
    assert state is not None and retry.number in state.configs and orphan.number not in state.configs
    rows = [t for t in launched(ostudy) if "confirm" in t.user_attrs]
    assert rows and {t.user_attrs["remeasure_of"] for t in rows} == {state.baseline, *state.configs}
    answer = study_answer(ostudy)
    assert answer is not None and f"trial {orphan.number}'s" not in answer.text


def test_best_reports_the_confirmed_gain_with_its_interval(
    confirmed: tuple[Path, optuna.Study], capsys: pytest.CaptureFixture[str]
) -> None:
    path, ostudy = confirmed
    answer = study_answer(ostudy)
    assert answer is not None and answer.verdict == "confirmed"
    assert answer.confirmed is True and answer.beats_defaults is True
    assert answer.gain_interval_pct is not None and answer.gain_pct is not None and answer.noise is not None
    low, high = answer.gain_interval_pct
    assert 0 < low <= answer.gain_pct <= high
    assert answer.noise.dof >= 1
    assert main(["best", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["confirmed"] is True and record["trial"] == answer.trial == answer.leader
    assert record["gain_interval_pct"] == [low, high] and record["noise"] == answer.noise.record()
    assert main(["best", str(path)]) == 0
    shown = capsys.readouterr().out
    assert f"confirmed: trial {answer.trial}'s config beats SGLang's defaults by" in shown


def test_on_a_flat_landscape_best_says_no_config_beat_the_defaults_and_exports_them(
    study_file: StudyFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trust = {"repeat_baseline_after": 3, "confirm": {"top": 2, "max_rounds": 4}, "stop_early": False}
    path = study_file(n_trials=8, search_space=FLAT, trust=trust)
    ostudy = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    answer = study_answer(ostudy)
    assert answer is not None and answer.verdict == "no gain"
    assert answer.confirmed is True and answer.beats_defaults is False
    assert answer.trial == 0  # SGLang's defaults
    export = tmp_path / "best.sh"
    assert main(["best", str(path), "--export", str(export)]) == 0
    out = capsys.readouterr().out
    assert "no config beat SGLang's defaults beyond run-to-run noise" in out
    assert "settings: SGLang's defaults" in out
    script = export.read_text()
    assert "--schedule-policy" not in script and "--stream-interval 8" not in script.replace("\\\n", "")


def test_a_study_without_confirmation_says_its_gain_is_unconfirmed(study_file: StudyFiles) -> None:
    path = study_file(n_trials=6, trust={**OFF, "repeat_baseline_after": 2})
    ostudy = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    answer = study_answer(ostudy)
    assert answer is not None and answer.verdict == "unconfirmed"
    assert answer.confirmed is False and answer.gain_interval_pct is None
    assert answer.text.startswith(f"unconfirmed: trial {answer.trial}'s config measured")
    assert answer.noise is not None and "run-to-run noise" in answer.text


# -- the stopping rule ------------------------------------------------------------------------------------
def test_a_flat_search_stops_early_and_a_resume_with_a_larger_budget_continues_it(
    study_file: StudyFiles,
) -> None:
    trust = {
        "repeat_baseline_after": 2,
        "confirm": False,
        "stop_early": {"min_trials": 5, "patience": 3},
        "screen": False,  # the stopping rule alone (screening would hold both knobs)
    }
    path = study_file(n_trials=30, search_space=FLAT, trust=trust)
    study = load_study(path)
    driver = StudyDriver(study, pool=model_pool(noise=0.01))
    ostudy = driver.run()
    used = budget_used(ostudy)
    assert used < 30 and driver.stopped is not None and "within the run-to-run noise band" in driver.stopped
    assert ostudy.user_attrs["stopped"]["why"] == driver.stopped
    # The baseline ran again twice early (after 2 and 4 launches): the rule stops on 2 degrees of freedom.
    repeats = [t.number for t in launched(ostudy) if t.user_attrs.get("baseline") and t.number > 0]
    assert len(repeats) == 2 and noise_estimate(ostudy).dof >= 2  # type: ignore[union-attr]
    # A plain resume does not search again (it would finish a confirmation); the rest of the budget is left,
    # and a resume given --n-trials gets `patience` more search trials before the rule looks again.
    assert budget_used(StudyDriver(study, pool=model_pool(noise=0.01)).run()) == used
    again = StudyDriver(study, pool=model_pool(noise=0.01))
    ostudy = again.run(n_trials=30)
    assert budget_used(ostudy) >= used + 3


def test_without_the_rule_a_flat_search_spends_its_budget(study_file: StudyFiles) -> None:
    trust = {"repeat_baseline_after": 2, "confirm": False, "stop_early": False, "screen": False}
    # Within its 8 configs (fcfs is SGLang's own policy: the launch that leaves it unset) and 2 repeats.
    path = study_file(n_trials=8, search_space=FLAT, trust=trust)
    driver = StudyDriver(load_study(path), pool=model_pool(noise=0.01))
    assert budget_used(driver.run()) == 8 and driver.stopped is None


def test_the_real_h200_study_without_confirmation_answers_unconfirmed_with_its_noise(tmp_path: Path) -> None:
    # The committed real stores (run3): trial 29's +2.0% is one measurement on another lease; the study
    # measured trial 2's config twice (0.3% apart), and trial 1's starved config (2304 and 1657 tok/s) far
    # below the best, whose spread is not the top's.
    stores = Path(__file__).parents[2] / "benchmarks" / "sglang-h200" / "run3" / "study.tar.gz"
    with tarfile.open(stores) as tar:
        tar.extractall(tmp_path, filter="data")
    storage = f"sqlite:///{tmp_path / '.autotune' / 'sglang-h200' / 'optuna.db'}"
    answer = study_answer(optuna.load_study(study_name="sglang-h200", storage=storage))
    assert answer is not None and answer.verdict == "unconfirmed" and answer.trial == 29
    assert answer.gain_pct == pytest.approx(2.0, abs=0.05) and answer.gain_interval_pct is None
    assert answer.noise is not None and answer.noise.record()["configs"] == [{"trial": 2, "trials": [2, 8]}]
    assert answer.within_noise is True
    assert answer.text.startswith("unconfirmed: trial 29's config measured +2.0% over SGLang's defaults")


def test_a_confirmation_cut_short_says_it_is_under_way_and_how_to_finish_it(tmp_path: Path) -> None:
    # The committed real stores of the trust study (run4): the device time ended in round 1 of the
    # confirmation, with the baseline's launch of that round running; by its means the best is the defaults.
    ostudy = run4(tmp_path, "study-cut-short.tar.gz")
    answer = study_answer(ostudy)
    assert answer is not None and answer.verdict == "under way" and answer.confirmed is False
    assert answer.trial == 0
    said = "unconfirmed: the best single measurement is SGLang's defaults (trial 0)"
    assert answer.text.startswith(said)
    assert "confirmation under way (1 of at least 2 rounds measured): `autotune resume` finishes it" in (
        answer.text
    )
    # One answer: the confirmation's, not also the means of its launches computed another way.
    assert study_summary(ostudy).remeasured is None


def test_the_real_h200_trust_study_resumed_to_its_end_answers_that_the_defaults_are_not_beaten(
    tmp_path: Path,
) -> None:
    # run4 resumed on a fresh machine (a plain resume: no more search) ran rounds 2 to 5 and stopped once the
    # leader's paired interval was narrower than +-1% at 97.5%; at 99.5% (the error spent over the candidates
    # and the 5 looks, issue 41) it is wider and still holds zero: on this H200 nothing beats the defaults.
    answer = study_answer(run4(tmp_path, "study.tar.gz"))
    assert answer is not None and answer.verdict == "no gain" and answer.rounds == 5
    assert answer.beats_defaults is False and answer.trial == 0 and answer.gain_interval_pct is not None
    low, high = answer.gain_interval_pct
    assert low < 0 < high and "(99.5% CI" in answer.text
    assert answer.text.startswith("no config beat SGLang's defaults beyond run-to-run noise")


def test_status_counts_confirmation_rounds_from_1_as_the_console_does(tmp_path: Path) -> None:
    from autotune.cli.answers import _status_notes, _trial_record

    trials = {t.number: t for t in run4(tmp_path, "study.tar.gz").get_trials(deepcopy=False)}
    assert _status_notes(_trial_record(trials[12])) == ["confirmation round 1: trial 0's config again"]
    assert _status_notes(_trial_record(trials[27])) == ["confirmation round 5: trial 9's config again"]


def run4(tmp_path: Path, archive: str) -> optuna.Study:
    """The real H200 trust study (benchmarks/sglang-h200/run4) from one of its committed archives."""
    with tarfile.open(Path(__file__).parents[2] / "benchmarks" / "sglang-h200" / "run4" / archive) as tar:
        tar.extractall(tmp_path, filter="data")
    storage = f"sqlite:///{tmp_path / '.autotune' / 'sglang-h200-trust' / 'optuna.db'}"
    return optuna.load_study(study_name="sglang-h200-trust", storage=storage)


def test_an_ablation_after_confirmation_launches_its_configs_and_does_not_confirm_again(
    study_file: StudyFiles,
) -> None:
    trust = {"repeat_baseline_after": 2, "confirm": {"top": 1, "max_rounds": 2}, "stop_early": False}
    study = load_study(study_file(n_trials=4, trust=trust))
    ostudy = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    started = ostudy.user_attrs["confirm"]
    leader = confirmation(ostudy).leader  # type: ignore[union-attr]
    params = next(t.params for t in ostudy.trials if t.number == leader)
    # `autotune ablate` queues configs it means to measure, a launch made before among them.
    ostudy.enqueue_trial(dict(params), user_attrs={"ablation_of": leader, "ablation_param": "all"})
    ostudy = StudyDriver(study, pool=model_pool(noise=0.01)).run(n_trials=budget_used(ostudy) + 1)
    ablation = ostudy.trials[-1]
    assert ablation.user_attrs["ablation_of"] == leader and "node" in ablation.user_attrs
    assert "same_as" not in ablation.user_attrs
    assert ostudy.user_attrs["confirm"] == started  # no second confirmation


def test_a_confirmation_round_where_the_defaults_measured_zero_is_left_out_not_divided_by() -> None:
    """A max_load study whose defaults met the SLO at no rate tried measured 0 for them: the gain, in percent
    of that, has no value there (it raised ZeroDivisionError, ending a study of benchmarks/peers/run.py)."""
    from autotune.study.confirm import _gain

    rounds: dict[int, dict[int, float | None]] = {
        1: {0: 0.0, 5: 2.0},
        2: {0: 1.0, 5: 2.1},
        3: {0: 1.0, 5: 1.9},
    }
    gain, pairs = _gain(rounds, 0, 5, maximize=True, confidence=0.95)
    assert pairs == 2 and gain is not None and gain.pct == pytest.approx(100.0)


# -- the confirmation's rule: its error spent across the rounds it looks at (issue 41, item 7) ------------
CONFIRM_SETTINGS: dict[str, Any] = {
    "enabled": True,
    "top": 2,
    "min_rounds": 2,
    "max_rounds": 6,
    "target_pct": 1.0,
    "confidence": 0.95,
    "baseline": 0,
    "configs": [1, 8],
    "since": -1,
}


def confirmation_study(rounds: list[dict[int, float]]) -> optuna.Study:
    """An Optuna study holding only confirmation rounds, each config's value per round (0: the defaults)."""
    ostudy = optuna.create_study(direction="maximize")
    ostudy.set_user_attr("confirm", {**CONFIRM_SETTINGS, "queued": len(rounds)})
    for index, values in enumerate(rounds):
        for position, (of, value) in enumerate(values.items()):
            attrs: dict[str, Any] = {"confirm": {"round": index, "position": position}, "remeasure_of": of}
            ostudy.add_trial(optuna.trial.create_trial(value=value, user_attrs=attrs | {"baseline": of == 0}))
    return ostudy


# Rounds 1 and 2 of a flat L40S x4 study (benchmarks/trust.py, heldout-l40sx4-qwen32b, seed 7): every config
# truly 162.34 tok/s; trial 8's config drew +0.34% and +0.35% over the defaults, both rounds on one lease.
FLAT_L40S_SEED_7 = [
    {0: 160.5187519336417, 1: 161.31301078841176, 8: 161.07332324038137},
    {8: 161.43195203563553, 1: 160.95053011554594, 0: 160.86126126723943},
]


def test_two_lucky_rounds_on_a_flat_landscape_are_no_confirmed_gain() -> None:
    """At 97.5% per look the first look (2 rounds) cleared zero, the rounds stopped and the answer claimed
    +0.4% that is not there; spent over the 5 looks (99.5%) the interval holds zero (and is narrower than
    +-1%: the rounds stop with no gain)."""
    from autotune.study.confirm import _decided

    ostudy = confirmation_study(FLAT_L40S_SEED_7)
    state = confirmation(ostudy)
    assert state is not None and state.leader == 8 and state.pairs == 2 and state.gain is not None
    assert state.gain.verdict == "no gain"  # at 97.5%: "gain", +0.23% to +0.47%
    assert state.gain.confidence == pytest.approx(1 - 0.05 / (2 * 5))
    assert _decided(state, {**CONFIRM_SETTINGS, "queued": 2})
    answer = study_answer(ostudy)
    assert answer is not None and answer.beats_defaults is False and answer.trial == 0
    assert "(99.5% CI" in answer.text


def test_a_large_gain_is_still_confirmed_at_the_first_look() -> None:
    from autotune.study.confirm import _decided

    ostudy = confirmation_study([{0: 100.0, 1: 150.2, 8: 101.0}, {8: 100.8, 1: 149.9, 0: 100.1}])  # +50%
    state = confirmation(ostudy)
    assert state is not None and state.leader == 1 and state.gain is not None
    assert state.gain.verdict == "gain" and _decided(state, {**CONFIRM_SETTINGS, "queued": 2})
    answer = study_answer(ostudy)
    assert answer is not None and answer.beats_defaults is True and answer.trial == 1


@pytest.mark.parametrize(
    ("top", "min_rounds", "max_rounds", "expected"),
    [(2, 2, 6, 1 - 0.05 / 10), (1, 2, 2, 0.95), (2, 3, 4, 1 - 0.05 / 4), (3, 2, 4, 1 - 0.05 / 9)],
)
def test_each_look_spends_the_confidence_over_the_candidates_and_the_looks(
    top: int, min_rounds: int, max_rounds: int, expected: float
) -> None:
    from autotune.study.confirm import look_confidence

    settings = {"confidence": 0.95, "min_rounds": min_rounds, "max_rounds": max_rounds}
    assert look_confidence(settings, top) == pytest.approx(expected)


def test_a_store_that_credited_an_interrupted_trial_goes_on_with_its_confirmation(
    study_file: StudyFiles,
) -> None:
    """A study confirming when autotune named a config by its interrupted first trial (before issue 41):
    its next round is queued under that name, as its first round was, instead of ending in a KeyError."""
    from autotune.study.confirm import confirmation_rounds

    study = load_study(study_file(search_space=FLAT, trust={"confirm": {"top": 1, "max_rounds": 4}}))
    space = {
        "--schedule-policy": CategoricalDistribution([None, "lpm", "fcfs"]),
        "--stream-interval": CategoricalDistribution([None, 2, 4, 16]),
    }
    chosen = {"--schedule-policy": "lpm", "--stream-interval": 4}
    ostudy = optuna.create_study(direction="maximize")
    runs: list[tuple[TrialState, float | None, dict[str, Any], dict[str, Any]]] = [
        (TrialState.COMPLETE, 100.0, {}, {"baseline": True}),
        (TrialState.FAIL, None, chosen, {"failure_kind": "interrupted"}),
        (TrialState.COMPLETE, 101.0, chosen, {"retry_of": 1}),
        (TrialState.COMPLETE, 100.2, {}, {"baseline": True, "remeasure_of": 0, "confirm": {"round": 0}}),
        (TrialState.COMPLETE, 100.9, chosen, {"remeasure_of": 1, "confirm": {"round": 0}}),
    ]
    for state, value, params, attrs in runs:
        distributions = {name: space[name] for name in params}
        trial = optuna.trial.create_trial(
            state=state, value=value, params=params, distributions=distributions, user_attrs=attrs
        )
        ostudy.add_trial(trial)
    record = {**study.file.trust.confirm.model_dump(), "baseline": 0, "configs": [1], "queued": 1, "since": 2}
    ostudy.set_user_attr("confirm", record)

    next(confirmation_rounds(study, ostudy))

    queued = ostudy.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 1]
    assert all(t.user_attrs["confirm"]["round"] == 1 for t in queued)
