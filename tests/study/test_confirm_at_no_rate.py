"""A max_load study whose defaults met the SLO at no rate tried (every launch of them measured 0): no gain in
percent of 0 can decide its confirmation, which ran all `max_rounds` and launched the defaults in each (1.25
node h apiece on 4x L40S; RESULTS-peers.md). The rounds leave the defaults out and confirm that the leader
meets the SLO again in each of `min_rounds` rounds; the reserve of a node-hour budget prices them so."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.study.trust.answer import study_answer
from autotune.study.trust.confirm import confirmation, confirmation_rounds
from autotune.study.trust.node_budget import node_hours
from tests.builders import FLAT, StudyFiles, stored_trial, study_of_trials

TRUST = {"repeat_baseline_after": 0, "confirm": {"top": 2, "min_rounds": 2, "max_rounds": 6}}
DEFAULTS_S = 2740.0  # the defaults' load search down to 1/16 req/s on 4x L40S: 0.76 node h
CANDIDATE_S = 680.0  # a config that meets the SLO near 0.8 req/s: 0.19 node h


def searched(candidates: dict[int, float] | None = None) -> list[optuna.trial.FrozenTrial]:
    """The defaults launched twice, both at max_load 0, and candidates with their measured max_load."""
    defaults = [
        stored_trial({}, 0.0, baseline=True, node="n", node_s=DEFAULTS_S),
        stored_trial({}, 0.0, baseline=True, remeasure_of=0, node="n", node_s=DEFAULTS_S),
    ]
    found = [
        stored_trial({"--stream-interval": interval}, value, node="n", node_s=CANDIDATE_S)
        for interval, value in (candidates or {}).items()
    ]
    return [*defaults, *found]


def confirmed_rounds(rounds: list[dict[int, float]], configs: list[int]) -> optuna.Study:
    """The search above, and confirmation rounds of `configs` (no launch of the defaults) as measured."""
    settings: dict[str, Any] = {
        "enabled": True, "top": 2, "min_rounds": 2, "max_rounds": 6, "target_pct": 1.0, "confidence": 0.95,
        "baseline": 0, "configs": configs, "since": 3, "queued": len(rounds), "defaults_at_zero": [0, 1],
    }  # fmt: skip
    trials = searched({2: 0.82, 4: 0.80})
    for index, values in enumerate(rounds):
        for position, (of, value) in enumerate(values.items()):
            mark = {"round": index, "position": position}
            trials.append(
                stored_trial({}, value, confirm=mark, remeasure_of=of, node="n", node_s=CANDIDATE_S)
            )
    return study_of_trials(*trials, confirm=settings)


def test_the_leader_meeting_the_slo_in_each_round_confirms_it_with_the_defaults_at_no_rate() -> None:
    optuna_study = confirmed_rounds([{2: 0.83, 3: 0.79}, {3: 0.80, 2: 0.84}], configs=[2, 3])
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 2 and state.pairs == 2 and state.gain is None
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "confirmed" and answer.trial == 2
    assert answer.value is not None and abs(answer.value - 0.835) < 1e-9 and answer.baseline_value == 0.0
    assert answer.gain_pct is None  # no percent of 0
    assert answer.text.startswith(
        "confirmed: SGLang's defaults meet your SLO at no rate tried (max_load 0 in each of their 2 "
        "launches); trial 2's config meets it at max_load 0.835 (the mean of 2 rounds, each above 0)"
    )


def test_a_candidate_that_missed_the_slo_in_a_round_is_not_the_one_confirmed() -> None:
    optuna_study = confirmed_rounds([{2: 0.83, 3: 0.79}, {3: 0.80, 2: 0.0}], configs=[2, 3])
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 3 and state.pairs == 2
    none_met = confirmed_rounds([{2: 0.0}, {2: 0.83}], configs=[2])
    answer = study_answer(none_met)
    assert answer is not None and answer.verdict != "confirmed"


def test_the_rounds_leave_out_defaults_that_measured_zero_in_every_launch(study_file: StudyFiles) -> None:
    study = load_study(study_file(n_trials=4, search_space=FLAT, trust=TRUST))
    optuna_study = study_of_trials(*searched({2: 0.82, 4: 0.80}))
    next(confirmation_rounds(study, optuna_study))  # queues the first round
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [2, 3]  # no launch of the defaults
    # A study whose defaults measured above 0 once keeps them in its rounds, as before.
    measured = study_of_trials(
        stored_trial({}, 0.0, baseline=True, node="n", node_s=DEFAULTS_S),
        stored_trial({}, 0.1, baseline=True, remeasure_of=0, node="n", node_s=DEFAULTS_S),
        *searched({2: 0.82, 4: 0.80})[2:],
    )
    next(confirmation_rounds(study, measured))
    queued = measured.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 2, 3]


def test_the_reserve_keeps_back_rounds_of_the_candidates_alone_with_the_defaults_at_no_rate(
    study_file: StudyFiles,
) -> None:
    study = load_study(study_file(search_space=FLAT, trust=TRUST, budget={"n_trials": 40, "node_hours": 3.0}))
    # Before a candidate completed there is none to confirm: nothing kept back, the search may launch.
    before = node_hours(study, study_of_trials(*searched()))
    assert before.reserve_s == 0.0 and before.search_may_launch()
    # Then 2 rounds of the 2 candidates at the dearest candidate's launch, not of 3 at the defaults' 0.76 h.
    after = node_hours(study, study_of_trials(*searched({2: 0.82, 4: 0.80})))
    assert after.reserve_s == 2 * 2 * CANDIDATE_S


def test_switched_off_the_rounds_launch_the_defaults_at_no_rate_as_before(study_file: StudyFiles) -> None:
    confirm = {"top": 2, "min_rounds": 2, "max_rounds": 6, "leave_out_defaults_at_zero": False}
    trust = {"repeat_baseline_after": 0, "confirm": confirm}
    study = load_study(study_file(n_trials=4, search_space=FLAT, trust=trust))
    optuna_study = study_of_trials(*searched({2: 0.82, 4: 0.80}))
    next(confirmation_rounds(study, optuna_study))
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 2, 3]
