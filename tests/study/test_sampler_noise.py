"""The sampler reading the noise (`trust.noise_ties`): the default sampler's moves start from any config
within the run-to-run noise band of the best, not always from the best single draw; real Optuna storage."""

from __future__ import annotations

import random

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import create_trial

from autotune.config import load_study
from autotune.study.loop import StudyDriver
from autotune.study.noise import move_from
from autotune.study.records import BASELINE_ATTR, REMEASURE_OF_ATTR
from autotune.study.samplers import IncumbentMoves, _best_of
from tests.builders import StudyFiles
from tests.study.test_trust import model_pool

KNOB = "--stream-interval"


def _study(values: list[float], baseline: list[float]) -> optuna.Study:
    ostudy = optuna.create_study(direction="maximize")
    for i, value in enumerate(baseline):
        attrs = {BASELINE_ATTR: True, **({REMEASURE_OF_ATTR: 0} if i else {})}
        ostudy.add_trial(create_trial(value=value, user_attrs=attrs))
    space = CategoricalDistribution([None, 1, 2, 4, 8, 16])
    for choice, value in zip([1, 2, 4, 8, 16], values, strict=False):
        ostudy.add_trial(create_trial(params={KNOB: choice}, distributions={KNOB: space}, value=value))
    return ostudy


def test_moves_start_from_any_config_tied_with_the_best_within_the_noise_band() -> None:
    # The baseline three times: 0.2% apart, a band of about 0.8%; 100.3 and 100.0 are tied, 95 is not.
    ostudy = _study([100.0, 100.3, 95.0], baseline=[99.8, 100.0, 100.2])
    trials = [t for t in ostudy.get_trials() if t.params]
    rng = random.Random(0)
    starts = {move_from(ostudy, trials, rng).number for _ in range(40)}  # type: ignore[union-attr]
    assert starts == {3, 4}


def test_before_the_noise_is_measured_moves_start_from_the_best() -> None:
    ostudy = _study([100.0, 100.3, 95.0], baseline=[99.8, 100.0])  # one degree of freedom
    trials = [t for t in ostudy.get_trials() if t.params]
    rng = random.Random(0)
    assert {move_from(ostudy, trials, rng).number for _ in range(20)} == {3}  # type: ignore[union-attr]


def test_the_switch_gives_the_study_loop_s_sampler_the_rule(study_file: StudyFiles) -> None:
    trust = {"repeat_baseline_after": 0, "confirm": False, "stop_early": False}
    space = {"parameters": {KNOB: {"kind": "sglang", "type": "categorical", "choices": [2, 4]}}}
    path = study_file(n_trials=2, search_space=space, trust={**trust, "noise_ties": True})
    driver = StudyDriver(load_study(path), pool=model_pool())
    driver.run()
    assert isinstance(driver.base_sampler, IncumbentMoves) and driver.base_sampler.reference is move_from
    assert IncumbentMoves(driver.base_sampler.base).reference is _best_of  # without the switch: the best
