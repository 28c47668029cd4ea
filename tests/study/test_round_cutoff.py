"""A max_load confirmation whose defaults serve far less than the configs beside them: their launch in a round
stops its load search once it missed at or below half the configs' lowest value (confirm.defaults_cutoff),
as a search launch stops below the study's best. On 4x L40S their search down to the slowest rates cost 1537
to 3583 s a round beside 500-600 s for the leader, and under 2x auto_benchmark's node hours 8 of 16 studies
ended unconfirmed (RESULTS-peers.md). Their value in that round is the load they missed at, above their own:
the gain the rounds show is at most the true one, and the answer says so."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config import load_study
from autotune.measure.load_search import LoadSearchPlan
from autotune.study.request import measurement_plan
from autotune.study.rules import measurement_groups
from autotune.study.trust.answer import study_answer
from autotune.study.trust.confirm import (
    DEFAULTS_CUTOFF_IS,
    confirmation,
    defaults_cutoff,
    defaults_stop_early,
)
from tests.builders import StudyFiles, max_load_objective, stored_trial, study_of_trials

SETTINGS: dict[str, Any] = {
    "enabled": True, "top": 2, "min_rounds": 2, "max_rounds": 6, "target_pct": 1.0, "confidence": 0.95,
    "baseline": 0, "configs": [1], "since": 1, "defaults_at_zero": [],
}  # fmt: skip


def stopped_at(load: float, **attrs: Any) -> FrozenTrial:
    """A launch whose load search stopped at its cutoff after missing at `load` (PRUNED, its max_load 0)."""
    return create_trial(
        state=TrialState.PRUNED,
        value=None,
        intermediate_values={0: 0.0},
        user_attrs={
            "load_below": load,
            "load_stopped_by": f"stopped below ...: the SLO missed at {load}",
            **attrs,
        },
    )


def rounds(defaults: list[FrozenTrial | float], leader: list[float]) -> optuna.Study:
    """The defaults' search launch (0.0957 req/s) and the leader's (0.65), then a round of each pair."""
    trials = [
        stored_trial({}, 0.0957, baseline=True, node="n"),
        stored_trial({"--stream-interval": 2}, 0.65, node="n"),
    ]
    for index, (base, value) in enumerate(zip(defaults, leader, strict=True)):
        mark = {"round": index, "position": 0}
        if isinstance(base, float):
            trials.append(stored_trial({}, base, baseline=True, remeasure_of=0, confirm=mark, node="n"))
        else:
            trials.append(base)
        again = {"round": index, "position": 1}
        trials.append(stored_trial({"--stream-interval": 2}, value, remeasure_of=1, confirm=again, node="n"))
    return study_of_trials(*trials, confirm={**SETTINGS, "queued": len(leader)})


def test_defaults_stopped_at_their_cutoff_count_in_their_rounds_at_the_load_they_missed_at() -> None:
    mark = {"remeasure_of": 0, "baseline": True, "node": "n"}
    optuna_study = rounds(
        [
            stopped_at(0.325, confirm={"round": 0, "position": 0}, **mark),
            stopped_at(0.325, confirm={"round": 1, "position": 0}, **mark),
        ],
        [0.650, 0.652],
    )
    state = confirmation(optuna_study)
    assert state is not None and state.defaults_below == (2, 4)
    assert [r[0] for _, r in sorted(state.rounds.items())] == [0.325, 0.325]
    assert state.leader == 1 and state.pairs == 2 and state.gain is not None
    # Not a failure of the defaults (a failed config is never confirmed), and no measurement of them.
    defaults = next(g for g in measurement_groups(optuna_study) if g.baseline)
    assert defaults.failed == () and defaults.values == (0.0957,)
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "confirmed" and answer.trial == 1
    assert answer.baseline_at_most and answer.baseline_value == 0.325
    assert answer.gain_pct is not None and abs(answer.gain_pct - 100.3077) < 1e-3  # (0.651 - 0.325) / 0.325
    assert "beats SGLang's defaults by +100.3% or more (" in answer.text
    assert (
        "in 2 of them SGLang's defaults missed your SLO at or below 50% of the lowest max_load the configs "
        "measured and stopped there, and every round counts them at no less than the load they missed at: "
        "the gain is at least this"
    ) in answer.text
    assert set(answer.trials) == {2, 3, 4, 5}  # the rounds' launches, the stopped ones included


def test_defaults_measured_in_their_rounds_or_a_pruned_launch_without_a_bound_are_as_before() -> None:
    measured = study_answer(rounds([0.09, 0.1], [0.64, 0.66]))
    assert measured is not None and not measured.baseline_at_most and "or more" not in measured.text
    # A launch PRUNED for another reason than its cutoff says nothing of the round: no pair.
    other = create_trial(
        state=TrialState.PRUNED, value=None, intermediate_values={0: 0.0},
        user_attrs={"remeasure_of": 0, "baseline": True, "node": "n", "confirm": {"round": 0, "position": 0}},
    )  # fmt: skip
    state = confirmation(rounds([other, 0.1], [0.64, 0.66]))
    assert state is not None and state.rounds[0][0] is None and state.defaults_below == ()


def test_the_cutoff_is_half_the_configs_lowest_where_their_search_can_reach_it(
    study_file: StudyFiles,
) -> None:
    study = load_study(study_file(objective=max_load_objective()))
    optuna_study = rounds([0.09], [0.60])
    assert defaults_cutoff(study, optuna_study) == 0.30  # half of 0.60, the leader's lowest
    off = load_study(study_file(objective=max_load_objective(stop_below_best=False)))
    assert defaults_cutoff(off, optuna_study) is None
    groups = {g.of: g for g in measurement_groups(optuna_study)}
    assert defaults_stop_early(study, groups[0], [groups[1]])  # 0.0957 and 0.09 below 0.30
    assert not defaults_stop_early(off, groups[0], [groups[1]])
    # Half of a config at 0.1 req/s lies under the slowest rate the search tries (1/16): it runs down to it.
    slow = study_of_trials(stored_trial({}, 0.0, baseline=True), stored_trial({"--stream-interval": 2}, 0.1))
    slow_groups = {g.of: g for g in measurement_groups(slow)}
    assert not defaults_stop_early(study, slow_groups[0], [slow_groups[1]])


def test_a_round_that_measured_the_defaults_whole_counts_them_at_the_bound_too() -> None:
    # The unbudgeted L40S seed 2: a round of the search measured the defaults at 0.094 req/s beside a leader
    # at 0.81, five rounds stopped them at 0.41. In percent of each round's own defaults the gains ran from
    # +100% to +768%, and the answer was "no gain" (99.5% CI -320.5% to +743.4%), SGLang's defaults.
    mark = {"remeasure_of": 0, "baseline": True, "node": "n"}
    stopped = [stopped_at(0.325, confirm={"round": i, "position": 0}, **mark) for i in (1, 2)]
    optuna_study = rounds([0.047, *stopped], [0.650, 0.652, 0.651])
    state = confirmation(optuna_study)
    assert state is not None and [r[0] for _, r in sorted(state.rounds.items())] == [0.325] * 3
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "confirmed" and answer.trial == 1


def test_the_driver_hands_the_defaults_in_a_round_their_cutoff_and_a_search_launch_the_best(
    study_file: StudyFiles,
) -> None:
    study = load_study(study_file(objective=max_load_objective()))
    optuna_study = rounds([], [])  # the defaults' search launch at 0.0957 req/s, the leader's at 0.65

    def plan_of(params: dict[str, Any], **attrs: Any) -> LoadSearchPlan | None:
        optuna_study.enqueue_trial(params, user_attrs=attrs)
        trial = optuna_study.ask()
        return measurement_plan(study, optuna_study, trial, bool(attrs.get("baseline"))).load_search

    defaults = plan_of({}, baseline=True, remeasure_of=0, confirm={"round": 0, "position": 0})
    assert defaults is not None and defaults.cutoff == 0.325 and defaults.cutoff_is == DEFAULTS_CUTOFF_IS
    leader = plan_of({"--stream-interval": 2}, remeasure_of=1, confirm={"round": 0, "position": 1})
    assert leader is not None and leader.cutoff is None  # a config in a round measures whole
    searched = plan_of({"--stream-interval": 3})
    assert (
        searched is not None and searched.cutoff == 0.65 and searched.cutoff_is == "the study's best max_load"
    )
    noise = plan_of({}, baseline=True, remeasure_of=0)  # the defaults again for the noise: whole
    assert noise is not None and noise.cutoff is None
