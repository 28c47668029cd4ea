"""The run-to-run noise (autotune.study.trust.noise): measured by launching the baseline again, pooled over
the configs near the best, and read by the sampler (`trust.noise_ties`); real Optuna storage."""

from __future__ import annotations

import random

import pytest
from optuna.distributions import CategoricalDistribution

from autotune.config import load_study
from autotune.study.loop import StudyDriver
from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR
from autotune.study.rules import ConfigMeasurements
from autotune.study.samplers import IncumbentMoves, _best_of
from autotune.study.storage import budget_used
from autotune.study.trust.noise import move_from, noise_apart_from, noise_estimate, pooled, repeat_baseline
from tests.builders import (
    TRUST_OFF,
    StudyFiles,
    launched,
    max_load_objective,
    model_pool,
    stored_trial,
    study_of_trials,
)


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


def test_the_noise_apart_from_a_confirmation_s_pairs_leaves_their_launches_out_keeps_the_defaults() -> None:
    """The confirmation pools its pairs' spread with the study's noise from other launches: the pairs'
    own (the defaults' trial 2, the leader's trial 6) are left out, so no spread counts twice; the defaults,
    one side of every pair, count though they are 50% below the best."""
    groups = [group(0, [100, 102, 130], baseline=True), group(5, [200, 196]), group(8, [204, 196])]
    apart = noise_apart_from(groups, {2, 6}, keep=0)  # (100, 102) of the defaults; the leader's 200 alone
    assert apart is not None and apart.dof == 2 and [of for of, _ in apart.configs] == [0, 8]
    assert apart.relative_sd == pytest.approx(((2 * (1 / 101) ** 2 + 2 * (4 / 200) ** 2) / 2) ** 0.5)
    without = noise_apart_from(groups, {2, 6})  # the stopping rule's rule: the defaults are far below
    assert without is not None and [of for of, _ in without.configs] == [8]


def test_defaults_that_met_the_slo_at_no_rate_give_no_spread_to_the_confirmation() -> None:
    """A max_load of 0 is the load search's floor, not a draw: on 4x L40S the defaults measured (0, 0, 0.096)
    req/s, a relative SD of 173% that, pooled, widened a +816% gain's interval to -700%..+2332% ("no gain",
    the answer SGLang's defaults at 0 req/s) where the rounds' own said +68%..+1563%."""
    groups = [group(0, [0.0, 0.0, 0.096], baseline=True), group(5, [0.825, 0.83]), group(8, [0.823, 0.82])]
    apart = noise_apart_from(groups, set(), keep=0)
    assert apart is not None and [of for of, _ in apart.configs] == [5, 8]
    assert apart.relative_sd < 0.01


def test_the_baseline_is_launched_again_early_and_gives_the_noise(study_file: StudyFiles) -> None:
    path = study_file(n_trials=7, trust={**TRUST_OFF, "repeat_baseline_after": 3})
    optuna_study = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    repeats = [t for t in launched(optuna_study) if t.user_attrs.get("baseline") and t.number > 0]
    assert [t.number for t in repeats] == [3] and repeats[0].user_attrs["remeasure_of"] == 0
    noise = noise_estimate(optuna_study)
    assert noise is not None and noise.dof == 1 and noise.configs[0] == (0, (0, 3))
    assert 0 < noise.relative_sd < 0.05  # the model's 1% noise, from one pair
    assert budget_used(optuna_study) == 7  # the repeat is a launch: it counts


@pytest.mark.parametrize(("defaults", "repeated"), [(0.0, False), (0.067, True)])
def test_defaults_at_no_rate_are_not_launched_again_for_the_noise(
    study_file: StudyFiles, defaults: float, repeated: bool
) -> None:
    # 4x L40S under 2x auto_benchmark's node hours: the defaults' repeat at 0 req/s took 1608 s (0.45 node
    # h) to measure 0 again, a spread of nothing; their rounds beside the leader still launch them.
    objective = max_load_objective()
    study = load_study(study_file(objective=objective, trust={**TRUST_OFF, "repeat_baseline_after": 2}))
    trials = [stored_trial(value=defaults, baseline=True), stored_trial({KNOB: 1}, value=0.65)]
    optuna_study = study_of_trials(*trials)
    assert (repeat_baseline(study, optuna_study) == 0) is repeated
    waiting = [t for t in optuna_study.get_trials(deepcopy=False) if not t.state.is_finished()]
    assert len(waiting) == repeated


# -- the sampler reading it (`trust.noise_ties`) -----------------------------------------------------------
# The default sampler's moves start from any config within the run-to-run noise band of the best, not always
# from the best single draw.
KNOB = "--stream-interval"
SPACE = {KNOB: CategoricalDistribution([None, 1, 2, 4, 8, 16])}
BASE, AGAIN = {BASELINE_ATTR: True}, {BASELINE_ATTR: True, REMEASURE_OF_ATTR: 0}
# Three settings of the knob (trials 3, 4, 5 after a baseline measured three times; 2, 3, 4 after two).
MOVES = ((1, 100.0), (2, 100.3), (4, 95.0))


def test_moves_start_from_any_config_tied_with_the_best_within_the_noise_band() -> None:
    # The baseline three times: 0.2% apart, a band of about 0.8%; 100.3 and 100.0 are tied, 95 is not.
    baseline = [
        stored_trial({}, 99.8, **BASE),
        stored_trial({}, 100.0, **AGAIN),
        stored_trial({}, 100.2, **AGAIN),
    ]
    optuna_study = study_of_trials(*baseline, *[stored_trial({KNOB: c}, v, spaces=SPACE) for c, v in MOVES])
    trials = [t for t in optuna_study.get_trials() if t.params]
    rng = random.Random(0)
    starts = {move_from(optuna_study, trials, rng).number for _ in range(40)}  # type: ignore[union-attr]
    assert starts == {3, 4}


def test_before_the_noise_is_measured_moves_start_from_the_best() -> None:
    baseline = [stored_trial({}, 99.8, **BASE), stored_trial({}, 100.0, **AGAIN)]  # one degree of freedom
    optuna_study = study_of_trials(*baseline, *[stored_trial({KNOB: c}, v, spaces=SPACE) for c, v in MOVES])
    trials = [t for t in optuna_study.get_trials() if t.params]
    rng = random.Random(0)
    assert {move_from(optuna_study, trials, rng).number for _ in range(20)} == {3}  # type: ignore[union-attr]


def test_the_switch_gives_the_study_loop_s_sampler_the_rule(study_file: StudyFiles) -> None:
    trust = {"repeat_baseline_after": 0, "confirm": False, "stop_early": False}
    space = {"parameters": {KNOB: {"kind": "sglang", "type": "categorical", "choices": [2, 4]}}}
    path = study_file(n_trials=2, search_space=space, trust={**trust, "noise_ties": True})
    driver = StudyDriver(load_study(path), pool=model_pool())
    driver.run()
    assert driver.state is not None
    sampler = driver.state.base_sampler
    assert isinstance(sampler, IncumbentMoves) and sampler.reference is move_from
    assert IncumbentMoves(sampler.base).reference is _best_of  # without the switch: the best
