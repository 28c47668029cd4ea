"""The confirmation (autotune.study.trust.confirm): the best configs and SGLang's defaults run again in
interleaved rounds, and the answer says whether a gain survives the noise; run fast on nodes answered by the
simulated node's model (with its run-to-run noise), on real Optuna storage, and on the real H200 studies'
stores."""

from __future__ import annotations

import dataclasses
import json
import math
import socket
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import Study, load_study
from autotune.study.callbacks import StudyCallback, TrialFinished
from autotune.study.loop import StudyDriver, StudyInterrupted
from autotune.study.records import DRIVER_ATTR
from autotune.study.rules import measurement_groups
from autotune.study.storage import budget_used, open_study
from autotune.study.summary import study_summary
from autotune.study.trust.answer import study_answer
from autotune.study.trust.confirm import Confirmation, confirmation, round_order
from autotune.study.trust.node_budget import node_hours
from autotune.study.trust.noise import NoiseEstimate, noise_estimate
from tests.builders import FLAT, TRUST_OFF, StudyFiles, launched, model_pool


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
    _, optuna_study = confirmed
    state = confirmation(optuna_study)
    assert state is not None and 1 <= len(state.configs) <= 2  # the runner-up within noise of the leader
    rounds: dict[int, list[int]] = {}
    for trial in sorted(launched(optuna_study), key=lambda t: t.number):
        if "confirm" in trial.user_attrs:
            assert trial.state == TrialState.COMPLETE
            mark = trial.user_attrs["confirm"]
            rounds.setdefault(mark["round"], []).append(trial.user_attrs["remeasure_of"])
    assert 2 - state.searched <= len(rounds) <= 4 - state.searched  # with the search's paired launches
    order = (state.baseline, *state.configs)
    for index, configs in rounds.items():
        assert tuple(configs) == round_order(index, order)  # each a launch of its own, in the round's order
    assert budget_used(optuna_study) == 10 + len(order) * len(rounds)  # beyond the search's budget


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
    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    state = confirmation(optuna_study)
    # Two rounds, one of them the search's launches when the leader ran right beside a baseline repeat.
    assert state is not None and state.queued + state.searched == 2 and state.pairs == 2
    assert sorted(state.rounds)[-state.queued :] == list(range(state.queued))
    assert all(len(v) == 2 for v in state.rounds.values())
    assert budget_used(optuna_study) == 5 + 2 * state.queued  # no round measured twice, none lost


def test_best_reports_the_confirmed_gain_with_its_interval(
    confirmed: tuple[Path, optuna.Study], capsys: pytest.CaptureFixture[str]
) -> None:
    path, optuna_study = confirmed
    answer = study_answer(optuna_study)
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
    optuna_study = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    answer = study_answer(optuna_study)
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
    path = study_file(n_trials=6, trust={**TRUST_OFF, "repeat_baseline_after": 2})
    optuna_study = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "unconfirmed"
    assert answer.confirmed is False and answer.gain_interval_pct is None
    assert answer.text.startswith(f"unconfirmed: trial {answer.trial}'s config measured")
    assert answer.noise is not None and "run-to-run noise" in answer.text


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
    optuna_study = run4(tmp_path, "study-cut-short.tar.gz")
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "under way" and answer.confirmed is False
    assert answer.trial == 0
    said = "unconfirmed: the best single measurement is SGLang's defaults (trial 0)"
    assert answer.text.startswith(said)
    assert "confirmation under way (1 of at least 2 rounds measured): `autotune resume` finishes it" in (
        answer.text
    )
    # One answer: the confirmation's, not also the means of its launches computed another way.
    assert study_summary(optuna_study).remeasured is None


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
    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    started = optuna_study.user_attrs["confirm"]
    leader = confirmation(optuna_study).leader  # type: ignore[union-attr]
    params = next(t.params for t in optuna_study.trials if t.number == leader)
    # `autotune ablate` queues configs it means to measure, a launch made before among them.
    optuna_study.enqueue_trial(dict(params), user_attrs={"ablation_of": leader, "ablation_param": "all"})
    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run(n_trials=budget_used(optuna_study) + 1)
    ablation = optuna_study.trials[-1]
    assert ablation.user_attrs["ablation_of"] == leader and "node" in ablation.user_attrs
    assert "same_as" not in ablation.user_attrs
    assert optuna_study.user_attrs["confirm"] == started  # no second confirmation


def test_a_confirmation_round_where_the_defaults_measured_zero_is_left_out_not_divided_by() -> None:
    """A max_load study whose defaults met the SLO at no rate tried measured 0 for them: the gain, in percent
    of that, has no value there (it raised ZeroDivisionError, ending a study of benchmarks/peers/run.py)."""
    from autotune.study.trust.confirm import _pooled

    rounds: dict[int, dict[int, float | None]] = {
        1: {0: 0.0, 5: 2.0},
        2: {0: 1.0, 5: 2.1},
        3: {0: 1.0, 5: 1.9},
    }
    gain, pairs, _ = _pooled(rounds, 0, 5, True, 0.95, None)
    assert pairs == 2 and gain is not None and gain.pct == pytest.approx(100.0)


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

    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run()

    assert optuna_study.trials[orphan.number].user_attrs["failure_kind"] == "interrupted"
    retry = next(t for t in optuna_study.trials if t.user_attrs.get("retry_of") == orphan.number)
    assert retry.state == TrialState.COMPLETE and retry.params == orphan.params
    state = confirmation(optuna_study)
    # The config is the retry's: confirmed, or left out (on this flat landscape it may measure below the
    # defaults), never the interrupted trial's.
    chosen = (*state.configs, *optuna_study.user_attrs["confirm"]["left_out"]) if state is not None else ()
    assert retry.number in chosen and orphan.number not in chosen
    assert state is not None
    rows = [t for t in launched(optuna_study) if "confirm" in t.user_attrs]
    assert rows and {t.user_attrs["remeasure_of"] for t in rows} == {state.baseline, *state.configs}
    answer = study_answer(optuna_study)
    assert answer is not None and f"trial {orphan.number}'s" not in answer.text


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
    optuna_study = optuna.create_study(direction="maximize")
    optuna_study.set_user_attr("confirm", {**CONFIRM_SETTINGS, "queued": len(rounds)})
    for index, values in enumerate(rounds):
        for position, (of, value) in enumerate(values.items()):
            attrs: dict[str, Any] = {"confirm": {"round": index, "position": position}, "remeasure_of": of}
            attrs = attrs | {"baseline": of == 0}
            optuna_study.add_trial(optuna.trial.create_trial(value=value, user_attrs=attrs))
    return optuna_study


FLAT_L40S_SEED_7 = [
    {0: 160.5187519336417, 1: 161.31301078841176, 8: 161.07332324038137},
    {8: 161.43195203563553, 1: 160.95053011554594, 0: 160.86126126723943},
]


def test_two_lucky_rounds_on_a_flat_landscape_are_no_confirmed_gain() -> None:
    """At 97.5% per look the first look (2 rounds) cleared zero, the rounds stopped and the answer claimed
    +0.4% that is not there; spent over the 5 looks (99.5%) the interval holds zero (and is narrower than
    +-1%: the rounds stop with no gain)."""
    from autotune.study.trust.confirm import _decided

    optuna_study = confirmation_study(FLAT_L40S_SEED_7)
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 8 and state.pairs == 2 and state.gain is not None
    assert state.gain.verdict == "no gain"  # at 97.5%: "gain", +0.23% to +0.47%
    assert state.gain.confidence == pytest.approx(1 - 0.05 / (2 * 5))
    assert _decided(state, {**CONFIRM_SETTINGS, "queued": 2})
    answer = study_answer(optuna_study)
    assert answer is not None and answer.beats_defaults is False and answer.trial == 0
    assert "(99.5% CI" in answer.text


def test_a_large_gain_is_still_confirmed_at_the_first_look() -> None:
    from autotune.study.trust.confirm import _decided

    optuna_study = confirmation_study(
        [{0: 100.0, 1: 150.2, 8: 101.0}, {8: 100.8, 1: 149.9, 0: 100.1}]
    )  # +50%
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 1 and state.gain is not None
    assert state.gain.verdict == "gain" and _decided(state, {**CONFIRM_SETTINGS, "queued": 2})
    answer = study_answer(optuna_study)
    assert answer is not None and answer.beats_defaults is True and answer.trial == 1


@pytest.mark.parametrize(
    ("top", "min_rounds", "max_rounds", "expected"),
    [(2, 2, 6, 1 - 0.05 / 10), (1, 2, 2, 0.95), (2, 3, 4, 1 - 0.05 / 4), (3, 2, 4, 1 - 0.05 / 9)],
)
def test_each_look_spends_the_confidence_over_the_candidates_and_the_looks(
    top: int, min_rounds: int, max_rounds: int, expected: float
) -> None:
    from autotune.study.trust.confirm import look_confidence

    settings = {"confidence": 0.95, "min_rounds": min_rounds, "max_rounds": max_rounds}
    assert look_confidence(settings, top) == pytest.approx(expected)


def test_a_store_that_credited_an_interrupted_trial_goes_on_with_its_confirmation(
    study_file: StudyFiles,
) -> None:
    """A study confirming when autotune named a config by its interrupted first trial (before issue 41):
    its next round is queued under that name, as its first round was, instead of ending in a KeyError."""
    from autotune.study.trust.confirm import confirmation_rounds

    study = load_study(study_file(search_space=FLAT, trust={"confirm": {"top": 1, "max_rounds": 4}}))
    space = {
        "--schedule-policy": CategoricalDistribution([None, "lpm", "fcfs"]),
        "--stream-interval": CategoricalDistribution([None, 2, 4, 16]),
    }
    chosen = {"--schedule-policy": "lpm", "--stream-interval": 4}
    optuna_study = optuna.create_study(direction="maximize")
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
        optuna_study.add_trial(trial)
    record = {**study.file.trust.confirm.model_dump(), "baseline": 0, "configs": [1], "queued": 1, "since": 2}
    optuna_study.set_user_attr("confirm", record)

    next(confirmation_rounds(study, optuna_study))

    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 1]
    assert all(t.user_attrs["confirm"]["round"] == 1 for t in queued)


# -- issue 37 item 4: fewer launches for trust -------------------------------------------------------------
def _search_study(values: dict[int, float], baselines: tuple[int, ...] = (0, 3, 6)) -> optuna.Study:
    """A finished search on one node: trial n measured `values[n]`; the trials in `baselines` are SGLang's
    defaults (the first, then its repeats), the others each a config of their own."""
    from tests.builders import stored_trial, study_of_trials

    trials = []
    for number, value in sorted(values.items()):
        if number in baselines:
            repeat = {"remeasure_of": baselines[0]} if number != baselines[0] else {}
            trials.append(stored_trial({}, value, node="n", node_s=600.0, baseline=True, **repeat))
        else:
            trials.append(stored_trial({"--stream-interval": number}, value, node="n", node_s=600.0))
    return study_of_trials(*trials)


def _run_round(optuna_study: optuna.Study, values: dict[int, float]) -> None:
    """Measure the round the confirmation queued: each config's launch gets `values[config]`."""
    while waiting := optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
        trial = optuna_study.ask({"--stream-interval": CategoricalDistribution([None, *range(10)])})
        of = waiting[0].user_attrs["remeasure_of"]
        assert trial.user_attrs["remeasure_of"] == of
        trial.set_user_attr("node", "n")
        optuna_study.tell(trial, values[of])


def test_the_runner_up_is_confirmed_only_within_the_noise_of_the_leader(study_file: StudyFiles) -> None:
    """The baseline's repeats put the noise at about 0.4%; the runner-up measured 6% below the leader, far
    beyond the noise band: its launches in every round would measure a config already ranked below. Only
    the leader and the defaults are launched, and its interval is split over one candidate."""
    from autotune.study.trust.confirm import LEFT_OUT_KEY, confirmation_rounds, contenders

    study = load_study(study_file(n_trials=8, search_space=FLAT, trust={"confirm": {"top": 2}}))
    optuna_study = _search_study({0: 100.0, 1: 101.0, 2: 150.0, 3: 100.5, 4: 141.0, 5: 99.0, 6: 99.8})
    next(confirmation_rounds(study, optuna_study))

    state = confirmation(optuna_study)
    assert state is not None and state.configs == (2,)
    assert optuna_study.user_attrs["confirm"][LEFT_OUT_KEY] == [4]
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 2]  # 2 launches a round, not 3
    # Within the band, the runner-up is confirmed as before; with the noise unknown, too.
    groups = {g.of: g for g in measurement_groups(optuna_study)}
    noise = noise_estimate(optuna_study)
    near = dataclasses.replace(groups[4], values=(149.0,))
    kept, left = contenders([groups[2], near], noise, maximize=True, confidence=0.95)
    assert [g.of for g in kept] == [2, 4] and not left
    unknown = contenders([groups[2], groups[4]], None, maximize=True, confidence=0.95)
    assert unknown == ([groups[2], groups[4]], [])


def test_a_runner_up_the_search_measured_no_better_than_the_defaults_is_not_confirmed(
    study_file: StudyFiles,
) -> None:
    """With the noise unknown (the defaults measured once) every candidate used to be confirmed, a runner-up
    below the defaults too: a launch a round for a config the search already ranked under SGLang's."""
    from autotune.study.trust.confirm import LEFT_OUT_KEY, confirmation_rounds

    study = load_study(study_file(n_trials=4, search_space=FLAT, trust={"confirm": {"top": 2}}))
    optuna_study = _search_study({0: 100.0, 1: 104.0, 2: 97.0, 3: 98.0}, baselines=(0,))
    next(confirmation_rounds(study, optuna_study))
    state = confirmation(optuna_study)
    assert state is not None and state.configs == (1,)
    assert optuna_study.user_attrs["confirm"][LEFT_OUT_KEY] == [3]
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 1]


def test_a_baseline_repeat_and_a_candidate_launched_one_after_the_other_count_as_a_round(
    study_file: StudyFiles,
) -> None:
    """Trial 3 (the baseline's repeat) ran right before trial 4, the leader: one round already measured,
    paired in time. With min_rounds 2 one launched round decides a large gain, not two; the answer rests
    on both rounds' trials."""
    from autotune.study.trust.confirm import SEARCH_ROUNDS_KEY, confirmation_rounds, search_rounds

    trust = {"confirm": {"top": 1, "min_rounds": 2, "max_rounds": 6}}
    study = load_study(study_file(n_trials=8, search_space=FLAT, trust=trust))
    optuna_study = _search_study({0: 100.0, 1: 101.0, 2: 99.0, 3: 100.4, 4: 150.0, 5: 99.5, 6: 99.8})
    groups = {g.of: g for g in measurement_groups(optuna_study)}
    assert search_rounds(optuna_study, groups[0], [groups[4]]) == [[(0, 3), (4, 4)]]
    assert search_rounds(optuna_study, groups[0], [groups[5]]) == [[(0, 6), (5, 5)]]  # trial 5 ran before 6
    assert search_rounds(optuna_study, groups[0], [groups[1]]) == [[(0, 0), (1, 1)]]
    assert search_rounds(optuna_study, groups[0], [groups[2]]) == [[(0, 3), (2, 2)]]

    rounds = confirmation_rounds(study, optuna_study)
    next(rounds)
    assert optuna_study.user_attrs["confirm"][SEARCH_ROUNDS_KEY] == [[[0, 3], [4, 4]]]
    # With the round queued and the search's, min_rounds are paid for: a node-hour budget keeps nothing back.
    assert node_hours(study, optuna_study).reserve_s == 0.0
    _run_round(optuna_study, {0: 100.2, 4: 150.5})
    with pytest.raises(StopIteration):  # decided: +50% over 2 rounds, one of them the search's
        next(rounds)
    state = confirmation(optuna_study)
    assert state is not None and state.searched == 1 and state.pairs == 2 and state.queued == 1
    answer = study_answer(optuna_study)
    assert answer is not None and answer.beats_defaults is True and answer.trial == 4
    assert {3, 4} <= set(answer.trials) and len(answer.trials) == 4
    assert "2 rounds, 1 of them the search's launches paired in time, their spread pooled" in answer.text


def test_a_baseline_and_a_candidate_with_the_nccl_stage_between_them_make_no_round() -> None:
    """The baseline (trial 0) runs before the NCCL stage's all-reduces, the search after: trial 1 came right
    after it in number, not in time, so the two are no pair."""
    from autotune.study.records import record_nccl_stage
    from autotune.study.trust.confirm import search_rounds

    optuna_study = _search_study({0: 100.0, 1: 101.0, 2: 99.0, 3: 100.4, 4: 150.0, 5: 99.5, 6: 99.8})
    groups = {g.of: g for g in measurement_groups(optuna_study)}
    assert search_rounds(optuna_study, groups[0], [groups[1]]) == [[(0, 0), (1, 1)]]  # no stage recorded
    record_nccl_stage(optuna_study, {"held": {}, "node_s": 780.0, "after_trials": [0]})
    assert search_rounds(optuna_study, groups[0], [groups[1]]) == []
    assert search_rounds(optuna_study, groups[0], [groups[4]]) == [[(0, 3), (4, 4)]]  # both after the stage


def test_the_rounds_stop_when_the_gain_is_known_within_the_target_without_claiming_it() -> None:
    """Three rounds within +-0.2% of the defaults: the interval at the candidates' confidence (97.5%) is
    narrower than +-1%, so the rounds stop with no gain, though the interval that could claim a gain
    (99.5%, spent over the looks too) is still wider: stopping sooner only takes looks away from a false
    gain. Rounds that went on to their sixth look cost 3 launches a round on every flat study."""
    from autotune.study.trust.confirm import _decided

    optuna_study = confirmation_study(
        [{0: 100.0, 1: 100.2, 8: 99.0}, {8: 99.1, 1: 99.9, 0: 100.0}, {8: 99.0, 1: 100.1, 0: 100.0}]
    )
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 1 and state.gain is not None and state.precision is not None
    assert state.gain.percent.half_width > 1.0 and state.gain.verdict == "no gain"
    assert state.precision.percent.half_width < 1.0
    assert _decided(state, {**CONFIRM_SETTINGS, "queued": 3})
    answer = study_answer(optuna_study)
    assert answer is not None and answer.beats_defaults is False


def test_the_leader_s_interval_pools_its_rounds_spread_with_the_study_s_noise() -> None:
    """Two rounds, +50% and +51%, and a study whose other launches measured 1% noise on 4 degrees of
    freedom: a round's difference spreads sqrt(2) x 1% x 1.505 (the candidate's value over the defaults')
    by the noise, 0.71 points by the rounds; pooled on 1 + 4 degrees of freedom, the 95% interval is +-3.5
    points where the rounds alone give +-6.4 (t on 1 degree of freedom: 12.7)."""
    from autotune.study.trust.confirm import pooled_gain

    noise = NoiseEstimate(0.01, 4, ())
    gain, dof = pooled_gain([100.0, 100.0], [150.0, 151.0], noise, minimize=False, confidence=0.95)
    predicted = 100 * math.sqrt(2) * 0.01 * 1.505  # 2.128 points
    pooled_sd = math.sqrt((1 * 0.5 + 4 * predicted**2) / (1 + 4))  # the rounds' variance 0.5 on 1 dof
    assert dof == 5 and gain.pct == pytest.approx(50.5)
    assert gain.percent.std == pytest.approx(pooled_sd)
    assert gain.percent.half_width == pytest.approx(2.570582 * pooled_sd / math.sqrt(2), rel=1e-5)  # 3.508
    own, none = pooled_gain([100.0, 100.0], [150.0, 151.0], None, minimize=False, confidence=0.95)
    assert none is None and own.percent.half_width == pytest.approx(12.7062 * math.sqrt(0.5) / math.sqrt(2))
    # One round: the noise alone, on its 4 degrees of freedom.
    one, dof = pooled_gain([100.0], [150.0], noise, minimize=False, confidence=0.95)
    assert dof == 4 and one.percent.half_width == pytest.approx(2.776445 * 100 * math.sqrt(2) * 0.01 * 1.5)


def test_a_leader_whose_rounds_spread_beyond_the_study_s_noise_keeps_their_own_interval() -> None:
    """+50% and +60%: a round's difference spread 7.1 points where 1% noise predicts 2.1 (variance ratio
    11, beyond F's 90% quantile on 1 and 4 degrees of freedom, 4.5): this config's noise is not the study's,
    and pooling would narrow its interval on another config's spread."""
    from autotune.measure.stats import paired_gain
    from autotune.study.trust.confirm import pooled_gain

    noise = NoiseEstimate(0.01, 4, ())
    gain, dof = pooled_gain([100.0, 100.0], [150.0, 160.0], noise, minimize=False, confidence=0.95)
    assert dof is None
    assert gain == paired_gain([100.0, 100.0], [150.0, 160.0], minimize=False, confidence=0.95)


@pytest.mark.parametrize(("pool_noise", "min_rounds"), [(True, 1), (True, 2), (False, 2)])
def test_with_the_study_s_noise_one_round_confirms_a_gain_far_beyond_it(
    study_file: StudyFiles, pool_noise: bool, min_rounds: int
) -> None:
    """The baseline's repeats put the noise near 0.3% (2 degrees of freedom); the leader, trial 8, ran next
    to no baseline launch, so the search made no round of it. One round measures +50%: with `pool_noise`
    it has an interval from the noise of the defaults' other launches, which decides with `min_rounds: 1`
    (each look's confidence split over rounds 1 to 6); else a second round is launched."""
    from autotune.study.trust.confirm import confirmation_rounds, look_confidence

    trust = {"confirm": {"top": 1, "pool_noise": pool_noise, "min_rounds": min_rounds}}
    study = load_study(study_file(n_trials=9, search_space=FLAT, trust=trust))
    values = {0: 100.0, 1: 101.0, 2: 99.0, 3: 100.4, 4: 101.2, 5: 99.5, 6: 99.8, 7: 100.3, 8: 150.0}
    optuna_study = _search_study(values)
    rounds = confirmation_rounds(study, optuna_study)
    next(rounds)
    _run_round(optuna_study, {0: 100.1, 8: 150.3})
    state = confirmation(optuna_study)
    assert state is not None and state.searched == 0  # pairs: those with a gain
    assert state.pairs == (1 if pool_noise else 0)
    settings = optuna_study.user_attrs["confirm"]
    assert look_confidence(settings, 1) == pytest.approx(1 - 0.05 / (6 - min_rounds + 1))
    if min_rounds == 1:
        with pytest.raises(StopIteration):  # decided after one round
            next(rounds)
        assert state.gain is not None and state.gain.verdict == "gain" and state.pooled_dof == 2
        assert state.gain.confidence == pytest.approx(1 - 0.05 / 6)
        answer = study_answer(optuna_study)
        assert answer is not None and answer.beats_defaults is True and answer.trial == 8
        assert "1 round, its spread pooled with the study's run-to-run noise (2 degrees of freedom)" in (
            answer.text
        )
    else:
        next(rounds)  # a second round
        assert state.gain is None or state.pooled_dof == 2


def test_one_round_with_a_gain_within_the_noise_decides_nothing() -> None:
    """+0.6% in one round with 0.5% noise: the pooled interval holds zero and is wider than +-1%, so the
    rounds go on as they did."""
    from autotune.study.trust.confirm import _decided, pooled_gain

    settings = {**CONFIRM_SETTINGS, "pool_noise": True, "min_rounds": 1, "queued": 1}
    gain, dof = pooled_gain([100.0], [100.6], NoiseEstimate(0.005, 6, ()), minimize=False, confidence=0.99)
    assert dof == 6 and gain.verdict == "no gain" and gain.percent.half_width > 1.0
    state = Confirmation(0, (1,), {0: {0: 100.0, 1: 100.6}}, 1, 1, gain, 1, precision=gain, pooled_dof=dof)
    assert not _decided(state, settings)


def test_with_the_study_s_noise_the_search_s_round_alone_decides_nothing(study_file: StudyFiles) -> None:
    """Trial 3 (the baseline's repeat) ran right before trial 4, the leader: a round of the search's, +49%
    far beyond the noise. It chose the leader because it drew high, so one round of the confirmation's own
    is launched all the same, and the two decide."""
    from autotune.study.trust.confirm import confirmation_rounds

    trust = {"confirm": {"top": 1, "pool_noise": True}}  # min_rounds 2: at most 1 of the search's rounds
    study = load_study(study_file(n_trials=8, search_space=FLAT, trust=trust))
    optuna_study = _search_study({0: 100.0, 1: 101.0, 2: 99.0, 3: 100.4, 4: 150.0, 5: 99.5, 6: 99.8})
    rounds = confirmation_rounds(study, optuna_study)
    next(rounds)  # a round queued: not decided on the search's round
    state = confirmation(optuna_study)
    assert state is not None and state.searched == 1 and state.pairs == 1 and state.gain is not None
    assert state.gain.verdict == "gain" and state.queued == 1
    _run_round(optuna_study, {0: 100.2, 4: 150.5})
    with pytest.raises(StopIteration):
        next(rounds)
    # With `min_rounds: 1` none of the search's rounds counts: one round of the confirmation's own decides.
    trust = {"confirm": {"top": 1, "pool_noise": True, "min_rounds": 1}}
    study = load_study(study_file(n_trials=8, search_space=FLAT, trust=trust))
    optuna_study = _search_study({0: 100.0, 1: 101.0, 2: 99.0, 3: 100.4, 4: 150.0, 5: 99.5, 6: 99.8})
    rounds = confirmation_rounds(study, optuna_study)
    next(rounds)
    state = confirmation(optuna_study)
    assert state is not None and state.searched == 0 and state.gain is None and state.queued == 1


def test_a_runner_up_within_the_noise_is_left_out_where_the_hours_do_not_pay_for_its_rounds(
    study_file: StudyFiles,
) -> None:
    """The runner-up (149) lies within the noise of the leader (150): both would be confirmed. With node
    hours for the rounds of the defaults and one config (launches of 600 s), only the leader's are run."""
    from autotune.study.trust.confirm import LEFT_OUT_KEY, confirmation_rounds

    study = load_study(study_file(n_trials=8, search_space=FLAT, trust={"confirm": {"top": 2}}))
    values = {0: 100.0, 1: 101.0, 2: 150.0, 3: 100.5, 4: 149.0, 5: 99.0, 6: 99.8}
    asked: list[list[int]] = []

    def pays(configs: Sequence[int]) -> bool:
        asked.append(list(configs))
        return len(configs) * 2 * 600.0 <= 2 * 2 * 600.0  # 2 rounds of 2 launches, not of 3

    optuna_study = _search_study(values)
    next(confirmation_rounds(study, optuna_study, pays=pays))
    state = confirmation(optuna_study)
    assert state is not None and state.configs == (2,)
    assert optuna_study.user_attrs["confirm"][LEFT_OUT_KEY] == [4]
    assert asked == [[0, 2, 4]]  # the leader alone is not asked: its rounds always run while they pay
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 2]
    # Hours for all three: the runner-up is confirmed beside the leader.
    optuna_study = _search_study(values)
    next(confirmation_rounds(study, optuna_study, pays=lambda configs: True))
    state = confirmation(optuna_study)
    assert state is not None and state.configs == (2, 4)
