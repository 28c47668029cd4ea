"""Knob screening (`trust.screen`): a knob that moved alone changes nothing beyond the run-to-run noise is
held at SGLang's default, said so, and takes no more budget; run fast on a node answered by the simulated
node's model, real Optuna storage."""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest
from optuna.distributions import CategoricalDistribution

from autotune.cli import main
from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.study.loop import StudyDriver
from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR, SCREEN_ATTR
from autotune.study.storage import budget_used
from autotune.study.trust.screening import held_knobs, screen
from tests.builders import FLAT, Said, StudyFiles, launched, model_pool, stored_trial, study_of_trials

POLICY, STREAM, CHUNKED = "--schedule-policy", "--stream-interval", "--chunked-prefill-size"
# Two knobs the model ignores and one it does not: a chunk of 512 tokens costs the seed's node a third.
MIXED = {
    "parameters": {
        **FLAT["parameters"],
        CHUNKED: {"kind": "sglang", "type": "categorical", "choices": [None, 512, 1024, 2048, 4096, 16384]},
    }
}
ALONE = {
    "repeat_baseline_after": 2,
    "confirm": False,
    "stop_early": False,
    "screen": {"method": "alone"},
}


def test_screening_reads_the_search_s_moves_by_default_and_switches_off(study_file: StudyFiles) -> None:
    screening = load_study(study_file(trust=None)).file.trust.screen
    assert screening.enabled and screening.method == "moves" and screening.min_pairs == 2
    assert load_study(study_file(trust={"screen": {"method": "alone"}})).file.trust.screen.method == "alone"
    assert not load_study(study_file(trust={"screen": False})).file.trust.screen.enabled
    assert not load_study(study_file(trust=False)).file.trust.screen.enabled


@pytest.mark.parametrize(
    ("screen_", "words"),
    [
        (3, ["trust.screen", "not a switch nor a section", "`screen: off`"]),
        ({"method": "grid"}, ["trust.screen.method", "grid", "alone", "moves"]),
        ({"min_pairs": 1}, ["trust.screen.min_pairs", "1"]),
    ],
)
def test_a_wrong_screen_setting_names_the_file_the_field_and_the_fix(
    study_file: StudyFiles, screen_: Any, words: list[str]
) -> None:
    path = study_file(trust={"screen": screen_})
    with pytest.raises(ConfigError) as error:
        load_study(path)
    message = str(error.value)
    assert path.name in message
    for word in words:
        assert word in message


def test_alone_moves_each_knob_to_its_extremes_and_holds_those_without_effect(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_file(n_trials=11, search_space=MIXED, trust=ALONE)
    said = Said()
    optuna_study = StudyDriver(load_study(path), [said], pool=model_pool(noise=0.0005)).run()
    trials = launched(optuna_study)
    moved = [t.user_attrs[SCREEN_ATTR] for t in trials if SCREEN_ATTR in t.user_attrs]
    # Right after the baseline, each knob alone at its extremes, the others at their defaults (fcfs is
    # SGLang's own schedule policy: the baseline's already).
    assert [t.number for t in trials if SCREEN_ATTR in t.user_attrs] == list(range(1, 6))
    assert moved == [{POLICY: "lpm"}, {STREAM: 2}, {STREAM: 16}, {CHUNKED: 512}, {CHUNKED: 16384}]
    assert held_knobs(optuna_study) == {POLICY: None, STREAM: None}  # the chunk size changes the throughput
    # Once held, no launch moves them: the rest of the budget goes to the knob with an effect.
    decided = max(t.number for t in trials if {SCREEN_ATTR, REMEASURE_OF_ATTR} & set(t.user_attrs))
    later = [t for t in trials if t.number > decided and REMEASURE_OF_ATTR not in t.user_attrs]
    assert later and all(t.params[POLICY] is None and t.params[STREAM] is None for t in later)
    why = optuna_study.user_attrs["screened"][POLICY]["why"]
    assert why.startswith(f"{POLICY} held at its default: moving it alone (")
    assert "inside the run-to-run noise band of" in why and why in said.lines
    # status says it, and --json keeps it.
    assert main(["status", str(path)]) == 0
    assert f"{STREAM} held at its default" in capsys.readouterr().out
    assert main(["status", str(path), "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["screened"]) == 2


def test_a_search_whose_every_knob_is_held_stops_and_says_why(study_file: StudyFiles) -> None:
    path = study_file(n_trials=30, search_space=FLAT, trust=ALONE)
    driver = StudyDriver(load_study(path), pool=model_pool(noise=0.0005))
    optuna_study = driver.run()
    assert set(held_knobs(optuna_study)) == {POLICY, STREAM}
    assert driver.stopped is not None and "nothing is left to search" in driver.stopped
    assert budget_used(optuna_study) < 12  # the baseline, its two repeats, five moves alone, no more


def test_a_resumed_study_holds_its_screened_knobs_and_says_so(study_file: StudyFiles) -> None:
    path = study_file(n_trials=10, search_space=MIXED, trust=ALONE)
    study = load_study(path)
    first = StudyDriver(study, pool=model_pool(noise=0.0005)).run()
    held = held_knobs(first)
    assert held
    said = Said()
    optuna_study = StudyDriver(study, [said], pool=model_pool(noise=0.0005)).run(n_trials=12)
    assert budget_used(optuna_study) > 10
    assert [line for line in said.lines if "held at its default" in line][: len(held)] == [
        first.user_attrs["screened"][k]["why"] for k in held
    ]
    new = [t for t in launched(optuna_study) if t.number >= 10 and REMEASURE_OF_ATTR not in t.user_attrs]
    assert new and all(t.params[k] is None for t in new for k in held)
    # its moves alone ran once
    assert sum(SCREEN_ATTR in t.user_attrs for t in optuna_study.get_trials()) == 5


# -- the evidence, on a study written by hand (the `moves` method reads what the search launched) ----------
SPACES = {
    POLICY: CategoricalDistribution([None, "lpm", "dfs-weight"]),
    STREAM: CategoricalDistribution([None, 2, 4, 16]),
    CHUNKED: CategoricalDistribution([None, 512, 16384]),
}
# A launch on node n0 of these knobs: measured a value, or failed (None).
on_n0 = functools.partial(stored_trial, spaces=SPACES, node="n0")


def test_moves_holds_a_knob_whose_moves_alone_stay_inside_the_noise_and_not_one_that_failed(
    study_file: StudyFiles,
) -> None:
    study = load_study(study_file(search_space=MIXED, trust={"screen": {"method": "moves"}}))
    base = {BASELINE_ATTR: True}
    again = {**base, REMEASURE_OF_ATTR: 0}
    optuna_study = study_of_trials(
        on_n0({}, 100.0, **base),
        on_n0({}, 100.2, **again),
        on_n0({}, 99.8, **again),
        on_n0({POLICY: "lpm", STREAM: None, CHUNKED: None}, 100.1),
        on_n0({POLICY: "dfs-weight", STREAM: None, CHUNKED: None}, 99.9),
        on_n0({POLICY: None, STREAM: None, CHUNKED: 512}, 66.0),
        on_n0({POLICY: None, STREAM: None, CHUNKED: 16384}, 100.1),
        on_n0({POLICY: None, STREAM: 16, CHUNKED: None}, 100.0),
        on_n0({POLICY: None, STREAM: 2, CHUNKED: None}, None),  # a move that failed is an effect
    )
    found = screen(study, optuna_study)
    assert [h.knob for h in found] == [POLICY]
    # lpm and dfs-weight against the defaults, and against each other.
    assert "moving it alone (3 times, to 'dfs-weight', 'lpm')" in found[0].why
    # Without a noise estimate of 2 degrees of freedom nothing is held.
    policy = [on_n0({POLICY: "lpm"}, 100.1), on_n0({POLICY: "dfs-weight"}, 99.9)]
    once = [on_n0({}, 100.0, **base), on_n0({}, 100.2, **again)]
    assert screen(study, study_of_trials(*once, *policy)) == []
