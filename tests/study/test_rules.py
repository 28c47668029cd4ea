"""The shared study rules agree with Optuna's own."""

from __future__ import annotations

import optuna
from optuna.study._constrained_optimization import _get_feasible_trials
from optuna.trial import TrialState, create_trial

from autotune.study.rules import is_feasible, non_dominated, within_limits
from tests.builders import stored_trial, study_of_trials


def test_feasible_is_every_constraint_at_most_zero_as_in_optuna() -> None:
    trials = [
        stored_trial(constraints=None),
        stored_trial(constraints={}),
        stored_trial(constraints={"ttft": 0.0}),
        stored_trial(constraints={"ttft": -1.0, "oom": 0.5}),
        stored_trial(constraints={"a": 2.0}),
    ]
    assert [is_feasible(t) for t in trials] == [True, True, True, False, False]
    assert [t in _get_feasible_trials(trials) for t in trials] == [is_feasible(t) for t in trials]


def test_no_constraints_are_within_limits() -> None:
    assert within_limits({})
    assert not within_limits({"ttft": 1e-9})


def test_the_direction_sign_reads_optuna_and_study_file_spellings() -> None:
    from optuna.study import StudyDirection

    from autotune.measure.metrics import maximizes
    from autotune.study.rules import direction_sign

    assert maximizes(StudyDirection.MAXIMIZE) and maximizes("maximize")
    assert not maximizes(StudyDirection.MINIMIZE) and not maximizes("minimize")
    assert [direction_sign(d) for d in (StudyDirection.MAXIMIZE, "minimize")] == [1.0, -1.0]


def test_the_best_measured_trial_is_feasible_complete_and_first_among_equals() -> None:
    from autotune.study.rules import best_measured

    values = [(3.0, {}), (9.0, {"ttft": 1.0}), (5.0, {}), (5.0, {}), (1.0, {})]
    trials = [stored_trial(value=v, constraints=c) for v, c in values] + [stored_trial(value=None)]
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


X = {"x": optuna.distributions.CategoricalDistribution([1, 2, 3, True])}


def _add(study: optuna.Study, x: object, value: float | None, **attrs: object) -> None:
    """A trial of config `x` (None for the baseline, which sets no parameter)."""
    study.add_trial(stored_trial({} if x is None else {"x": x}, value, spaces=X, **attrs))


def test_the_best_trial_is_the_best_single_measurement_until_a_config_is_measured_again() -> None:
    from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR
    from autotune.study.rules import best_trial

    study = study_of_trials()
    _add(study, None, 5.0, **{BASELINE_ATTR: True})
    _add(study, 1, 9.0)  # trial 1: the best single measurement
    _add(study, 2, 8.0)
    _add(study, 2, 7.6)  # proposed again by chance: one more draw, not a re-measurement
    best = best_trial(study)
    assert best is not None and best.number == 1
    _add(study, 2, 7.7, **{REMEASURE_OF_ATTR: 2})  # re-measured: a mean of 7.77, the only reliable one
    best = best_trial(study)
    assert best is not None and best.number == 2
    _add(study, 3, 9.5)  # better once, but not measured again
    best = best_trial(study)
    assert best is not None and best.number == 2


def test_a_config_that_failed_once_is_not_the_best_however_good_its_mean() -> None:
    from autotune.study.records import REMEASURE_OF_ATTR
    from autotune.study.rules import best_trial

    study = study_of_trials(direction="minimize")
    _add(study, 1, 3.0)  # trial 0
    _add(study, 2, 2.0)  # trial 1: lower is better
    _add(study, 2, 2.2, **{REMEASURE_OF_ATTR: 1})
    _add(study, 2, None, **{REMEASURE_OF_ATTR: 1})  # failed when measured again: unreliable
    _add(study, 1, 3.4, **{REMEASURE_OF_ATTR: 0})
    best = best_trial(study)
    assert best is not None and best.number == 0


def test_the_best_among_chosen_trials_and_none_for_several_objectives() -> None:
    from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR
    from autotune.study.rules import best_trial

    study = study_of_trials()
    _add(study, None, 9.0, **{BASELINE_ATTR: True})  # the baseline is the best config by its mean
    _add(study, 1, 8.0)
    _add(study, None, 9.2, **{BASELINE_ATTR: True, REMEASURE_OF_ATTR: 0})
    _add(study, 1, 8.2, **{REMEASURE_OF_ATTR: 1})
    _add(study, True, 8.9)  # True is not the config 1
    best = best_trial(study)
    assert best is not None and best.number == 0
    # The sampler moves from a trial that sets parameters: it asks among those.
    with_params = best_trial(study, [t for t in study.trials if t.params])
    assert with_params is not None and with_params.number == 1
    assert best_trial(optuna.create_study(directions=["maximize", "minimize"])) is None
    assert best_trial(study_of_trials()) is None


def test_configs_compare_with_their_types() -> None:
    from autotune.study.rules import config_key

    assert config_key({"a": 1, "b": None}) == config_key({"b": None, "a": 1})
    assert config_key({"a": True}) != config_key({"a": 1})


def test_the_pareto_front_is_the_one_optuna_finds() -> None:
    directions = [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    points = [(10, 5), (12, 6), (8, 4), (9, 6), (12, 6), (11, 9), (7, 3), (12, 7)]
    study = optuna.create_study(directions=directions)
    for tok_s, ttft in points:
        study.add_trial(create_trial(state=TrialState.COMPLETE, values=[tok_s, ttft]))
    front = non_dominated(study.trials, directions)
    assert [t.number for t in front] == sorted(t.number for t in study.best_trials)
    assert [t.number for t in front] == [0, 1, 2, 4, 6]  # equal points both stay; (9, 6) and (12, 7) do not
