"""The shared study rules agree with Optuna's own."""

from __future__ import annotations

import optuna
from optuna.study._constrained_optimization import _get_feasible_trials
from optuna.trial import TrialState, create_trial

from autotune.study.rules import is_feasible, within_limits


def _trial(constraints: dict[str, float] | None) -> optuna.trial.FrozenTrial:
    return create_trial(state=TrialState.COMPLETE, value=1.0, constraints=constraints)


def test_feasible_is_every_constraint_at_most_zero_as_in_optuna() -> None:
    trials = [
        _trial(None),
        _trial({}),
        _trial({"ttft": 0.0}),
        _trial({"ttft": -1.0, "oom": 0.5}),
        _trial({"a": 2.0}),
    ]
    assert [is_feasible(t) for t in trials] == [True, True, True, False, False]
    assert [t in _get_feasible_trials(trials) for t in trials] == [is_feasible(t) for t in trials]


def test_no_constraints_are_within_limits() -> None:
    assert within_limits({})
    assert not within_limits({"ttft": 1e-9})


def test_the_direction_sign_reads_optuna_and_study_file_spellings() -> None:
    from optuna.study import StudyDirection

    from autotune.study.rules import direction_sign, maximizes

    assert maximizes(StudyDirection.MAXIMIZE) and maximizes("maximize")
    assert not maximizes(StudyDirection.MINIMIZE) and not maximizes("minimize")
    assert [direction_sign(d) for d in (StudyDirection.MAXIMIZE, "minimize")] == [1.0, -1.0]


def test_the_best_measured_trial_is_feasible_complete_and_first_among_equals() -> None:
    from autotune.study.rules import best_measured

    values = [(3.0, {}), (9.0, {"ttft": 1.0}), (5.0, {}), (5.0, {}), (1.0, {})]
    trials = [create_trial(state=TrialState.COMPLETE, value=v, constraints=c) for v, c in values]
    trials += [create_trial(state=TrialState.FAIL)]
    for number, trial in enumerate(trials):
        trial.number = number
    best, least = best_measured(trials, "maximize"), best_measured(trials, "minimize")
    assert (best and best.number, least and least.number) == (2, 4)  # 9.0 broke a limit
    assert best_measured(trials[-1:], "maximize") is None


def test_addresses_and_env_names_have_one_rule_each() -> None:
    from autotune.config.hosts import is_any_address, is_loopback, reachable_here
    from autotune.trial.launch import is_env_name

    assert all(is_loopback(h) for h in ("127.0.0.1", "127.0.0.2", "::1", "localhost"))
    assert not any(is_loopback(h) for h in ("0.0.0.0", "10.0.0.5", "::", "example.org"))
    assert [reachable_here(h) for h in ("0.0.0.0", "::", "", "10.0.0.5")] == ["127.0.0.1"] * 3 + ["10.0.0.5"]
    assert is_any_address("0.0.0.0") and not is_any_address("127.0.0.1")
    assert [is_env_name(n) for n in ("NCCL_ALGO", "_X1", "1X", "A-B", "A\n", "")] == [True, True] + [
        False
    ] * 4
