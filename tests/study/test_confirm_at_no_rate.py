"""A max_load study whose defaults met the SLO at no rate tried (every launch of them measured 0): no gain in
percent of 0 can decide its confirmation, which ran all `max_rounds` (RESULTS-peers.md: 6 rounds and the
answer still unconfirmed on 4x L40S). The rounds decide once the leader met the SLO in each of `min_rounds`
rounds where the defaults, launched beside it, measured 0 again; where a later lease serves the defaults at
a rate, the percent rule decides as before."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.study.trust.answer import study_answer
from autotune.study.trust.confirm import confirmation, confirmation_rounds
from tests.builders import FLAT, StudyFiles, stored_trial, study_of_trials

TRUST = {"repeat_baseline_after": 0, "confirm": {"top": 2, "min_rounds": 2, "max_rounds": 6}}


def searched() -> list[optuna.trial.FrozenTrial]:
    """The defaults launched twice, both at max_load 0 (trials 0 and 1), and two candidates (2 and 3)."""
    defaults = [
        stored_trial({}, 0.0, baseline=True, node="n"),
        stored_trial({}, 0.0, baseline=True, remeasure_of=0, node="n"),
    ]
    found = [stored_trial({"--stream-interval": i}, v, node="n") for i, v in ((2, 0.82), (4, 0.80))]
    return [*defaults, *found]


def confirmed_rounds(rounds: list[dict[int, float]], configs: list[int], zero: bool = True) -> optuna.Study:
    """The search above, and confirmation rounds of the defaults (0) and `configs` as measured; `zero`: the
    confirmation started with the defaults at 0 in every launch (`decide_at_no_rate`)."""
    settings: dict[str, Any] = {
        "enabled": True, "top": 2, "min_rounds": 2, "max_rounds": 6, "target_pct": 1.0, "confidence": 0.95,
        "baseline": 0, "configs": configs, "since": 3, "queued": len(rounds),
        "defaults_at_zero": [0, 1] if zero else [],
    }  # fmt: skip
    trials = searched()
    for index, values in enumerate(rounds):
        for position, (of, value) in enumerate(values.items()):
            mark = {"round": index, "position": position}
            trials.append(stored_trial({}, value, confirm=mark, remeasure_of=of, node="n"))
    return study_of_trials(*trials, confirm=settings)


def test_the_leader_meeting_the_slo_in_each_round_beside_the_defaults_at_no_rate_is_confirmed() -> None:
    optuna_study = confirmed_rounds([{0: 0.0, 2: 0.83, 3: 0.79}, {3: 0.80, 2: 0.84, 0: 0.0}], configs=[2, 3])
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 2 and state.pairs == 2 and state.gain is None
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "confirmed" and answer.trial == 2
    assert answer.value is not None and abs(answer.value - 0.835) < 1e-9 and answer.baseline_value == 0.0
    assert answer.gain_pct is None  # no percent of 0
    assert answer.text.startswith(
        "confirmed: SGLang's defaults meet your SLO at no rate tried (max_load 0 in each of their 4 "
        "launches, the rounds' included); trial 2's config meets it at max_load 0.835 (the mean of 2 rounds, "
        "each above 0 beside the defaults at 0)"
    )
    # Switched off (no `defaults_at_zero` recorded), rounds without a percent gain decide nothing.
    off = confirmed_rounds([{0: 0.0, 2: 0.83, 3: 0.79}, {3: 0.80, 2: 0.84, 0: 0.0}], [2, 3], zero=False)
    answer = study_answer(off)
    assert answer is not None and answer.verdict != "confirmed"


def test_a_candidate_that_missed_the_slo_in_a_round_is_not_the_one_confirmed() -> None:
    optuna_study = confirmed_rounds([{0: 0.0, 2: 0.83, 3: 0.79}, {0: 0.0, 3: 0.80, 2: 0.0}], configs=[2, 3])
    state = confirmation(optuna_study)
    assert state is not None and state.leader == 3 and state.pairs == 2
    none_met = confirmed_rounds([{0: 0.0, 2: 0.0}, {0: 0.0, 2: 0.83}], configs=[2])
    answer = study_answer(none_met)
    assert answer is not None and answer.verdict != "confirmed"


def test_defaults_served_at_a_rate_in_a_round_leave_the_decision_to_the_rounds_differences() -> None:
    # A later lease served the defaults at 0.097 req/s (seed 0 of the L40S max_load runs): a config equal
    # to them meeting the SLO there is no gain, and only the rounds' paired differences can say how much one
    # is (`floor_gain`: in req/s, every round's, in percent of the defaults' mean).
    flat = confirmed_rounds([{0: 0.097, 2: 0.098}, {2: 0.096, 0: 0.0}], configs=[2])
    state = confirmation(flat)
    assert state is not None and state.defaults_at_zero == ()
    answer = study_answer(flat)
    assert answer is not None and answer.verdict != "confirmed"


def test_a_leader_far_above_defaults_near_the_floor_in_every_round_is_confirmed() -> None:
    # Seed 6 of the L40S max_load runs: the leader at 0.875 req/s in each round beside the defaults at 0.078,
    # 0.0625 and 0: in percent of each round's defaults, the rounds at 0 left out, it was "no gain" (+1163%,
    # 99.5% CI -16706% to +19032% from 2 rounds) and the answer SGLang's defaults.
    rounds = [{0: 0.078, 2: 0.877}, {2: 0.877, 0: 0.0625}, {0: 0.0, 2: 0.875}]
    state = confirmation(confirmed_rounds(rounds, configs=[2]))
    assert state is not None and state.leader == 2 and state.pairs == 3 and state.gain is not None
    differences = [0.877 - 0.078, 0.877 - 0.0625, 0.875]
    assert abs(state.gain.difference.mean - sum(differences) / 3) < 1e-9
    assert abs(state.gain.pct - 100 * (sum(differences) / 3) / ((0.078 + 0.0625) / 3)) < 1e-6
    answer = study_answer(confirmed_rounds(rounds, configs=[2]))
    assert answer is not None and answer.verdict == "confirmed" and answer.trial == 2, answer.text


def test_the_rounds_launch_the_defaults_beside_the_candidates(study_file: StudyFiles) -> None:
    study = load_study(study_file(n_trials=4, search_space=FLAT, trust=TRUST))
    optuna_study = study_of_trials(*searched())
    next(confirmation_rounds(study, optuna_study))  # queues the first round
    assert optuna_study.user_attrs["confirm"]["defaults_at_zero"] == [0, 1]
    queued = optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
    assert sorted(t.user_attrs["remeasure_of"] for t in queued) == [0, 2, 3]
