"""A load search's value is known to the bracket it ended in: launches that end in one bracket can measure
one value to the digit (on 4x L40S a leader measured 0.8144 req/s in each of 3 launches), and the study read
"run-to-run noise: 0.00%" and confirmed "+100.0% (99.0% CI +100.0% to +100.0%)". The noise and a round's
differences now spread no less than the bracket's resolution (rules.resolution)."""

from __future__ import annotations

import math

import pytest

from autotune.measure.load_search import BUDGET_FLOOR_SAID, LoadSearchPlan
from autotune.study.rules import measurement_groups
from autotune.study.trust.answer import study_answer
from autotune.study.trust.confirm import floor_gain
from autotune.study.trust.noise import noise_estimate
from tests.builders import stored_trial, study_of_trials
from tests.measure.test_load_search import search


def test_a_search_records_the_width_of_the_bracket_it_ended_in() -> None:
    plan = LoadSearchPlan("request_rate", start=0.5, max=16, min=0.0625, steps=8, tolerance=0.1)
    result = search(plan, lambda load: 1.0 if load <= 0.83 else 0.08)
    assert result.load_bracket == pytest.approx(0.875 - 0.8125)  # 0.8125 met the SLO, 0.875 did not
    at_max = search(plan, lambda load: 1.0)
    assert at_max.load_bracket is None  # no load missed: nothing to bracket


def test_launches_that_measured_one_value_have_the_noise_of_their_bracket() -> None:
    leader = [stored_trial({"--stream-interval": 2}, 0.8144, load_bracket=0.0625) for _ in range(3)]
    optuna_study = study_of_trials(stored_trial({}, 0.0, baseline=True), *leader)
    noise = noise_estimate(optuna_study)
    assert noise is not None and noise.dof == 2
    assert noise.relative_sd == pytest.approx(0.0625 / math.sqrt(12) / 0.8144)  # 2.2%, not 0
    assert (
        "pooled relative SD, at least its load search's resolution, 2 degrees of freedom" in noise.describe()
    )
    # Without a bracket (another metric) the same values are no spread, as before.
    plain = study_of_trials(
        stored_trial({}, 0.0, baseline=True), *(stored_trial({"a": 1}, 0.8144) for _ in "ab")
    )
    assert noise_estimate(plain) is not None and noise_estimate(plain).relative_sd == 0.0  # type: ignore[union-attr]
    # A spread wider than the bracket is the noise itself.
    wide = [stored_trial({"b": 1}, v, load_bracket=0.0625) for v in (0.70, 0.80, 0.90)]
    noise = noise_estimate(study_of_trials(*wide))
    assert noise is not None and not noise.resolution and noise.relative_sd > 0.1
    groups = measurement_groups(study_of_trials(*wide))
    assert groups[0].resolutions == pytest.approx(
        tuple(0.0625 / math.sqrt(12) / v for v in (0.70, 0.80, 0.90))
    )


def test_rounds_of_one_value_have_an_interval_as_wide_as_their_resolution() -> None:
    exact = floor_gain([0.407, 0.407, 0.407], [0.8144, 0.8144, 0.8144], 0.99)
    assert exact.low_pct == exact.high_pct == pytest.approx(100.1, abs=0.1)
    resolved = floor_gain([0.407, 0.407, 0.407], [0.8144, 0.8144, 0.8144], 0.99, floor_sd=0.018)
    assert resolved.pct == pytest.approx(exact.pct)
    assert resolved.low_pct is not None and resolved.high_pct is not None
    assert resolved.low_pct < 90 < 110 < resolved.high_pct


def test_an_answer_of_no_rate_under_a_budget_says_the_budget_kept_the_search_from_slower_rates() -> None:
    floored = "the SLO missed down to the lowest load tried (0.125): the SLO missed at 0.125 (50% good); "
    said = f"{floored}{BUDGET_FLOOR_SAID}"
    answer = study_answer(study_of_trials(stored_trial({}, 0.0, baseline=True, load_stopped_by=said)))
    assert answer is not None and answer.value == 0.0
    assert answer.text.endswith(
        "under this node-hour budget no load search went slower than the rate at which a step takes 10% of "
        "the hours left (`autotune status` says where each stopped): more hours reach slower rates"
    )
    own_floor = "the SLO missed down to the lowest load tried (0.0625): the SLO missed at 0.0625 (50% good)"
    plain = study_answer(study_of_trials(stored_trial({}, 0.0, baseline=True, load_stopped_by=own_floor)))
    assert plain is not None and "node-hour budget" not in plain.text
