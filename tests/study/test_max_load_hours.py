"""Node hours a max_load study does not spend: a search launch's load search stops below the study's best
max_load (autotune.measure.load_search; the driver hands it the best measured, never to the baseline nor to
a re-measurement, and tells it PRUNED), and the search stops once SGLang's defaults met the SLO at the
highest load it tries (autotune.study.trust.stopping `at_load_max`)."""

from __future__ import annotations

from typing import Any

import pytest
from optuna.trial import TrialState

from autotune.config import Study, load_study
from autotune.study.loop import StudyDriver
from autotune.study.storage import budget_used, open_study
from autotune.study.trust.node_budget import launch_s, spent_s
from tests.builders import FLAT, StudyFiles, model_pool


def max_load_objective(stop_below_best: bool) -> dict[str, Any]:
    """The highest request rate at which 90% of 8 short requests meet a loose SLO on the seed's node."""
    return {
        "name": "max-load",
        "metric": "max_load",
        "workload": {
            "num_prompts": 8,
            "input_len": 200,
            "output_len": 64,
            "concurrency": 8,
            "slo": {"ttft_ms": 1000, "tpot_ms": 200},
        },
        "load_search": {
            "start": 0.5, "max": 16, "min": 0.0625, "steps": 6, "stop_below_best": stop_below_best,
        },
    }  # fmt: skip


SPACE = {"parameters": {"--max-running-requests": {"kind": "sglang", "type": "categorical", "choices": [1]}}}


@pytest.mark.parametrize("stop_below_best", [True, False])
def test_a_search_launch_that_misses_at_or_below_the_best_stops_there_and_is_told_pruned(
    study_file: StudyFiles, stop_below_best: bool
) -> None:
    study = load_study(
        study_file(n_trials=2, search_space=SPACE, objective=max_load_objective(stop_below_best))
    )
    StudyDriver(study, pool=model_pool()).run(n_trials=1)  # the baseline: SGLang's defaults
    baseline = open_study(study).trials[0]
    assert baseline.state == TrialState.COMPLETE and baseline.value is not None and baseline.value >= 0.5
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    one_at_a_time = optuna_study.trials[1]  # one request in flight: it misses at the first rate
    steps = one_at_a_time.user_attrs.get("load_stopped_by", "")
    if stop_below_best:
        assert one_at_a_time.state == TrialState.PRUNED
        assert steps.startswith("stopped below the study's best: the SLO missed at 0.5")
        assert one_at_a_time.user_attrs["pruned_by"].startswith("load search: stopped below the study's best")
    else:
        assert one_at_a_time.state == TrialState.COMPLETE
        assert not steps.startswith("stopped below")


@pytest.mark.parametrize("at_load_max", [True, False])
def test_a_search_whose_defaults_met_the_slo_at_its_max_load_twice_stops_there(
    study_file: StudyFiles, at_load_max: bool
) -> None:
    # Every config of the H200 profile met the cookbook's SLO at the shipped max of 16 req/s: 2.9 node h of
    # launches that could not measure more than the defaults did (benchmarks/RESULTS-peers.md).
    trust = {
        "repeat_baseline_after": 2,
        "confirm": False,
        "screen": False,
        "stop_early": {"at_load_max": at_load_max, "min_node_hours": None, "patience_node_hours": None},
    }
    study = load_study(
        study_file(n_trials=8, search_space=FLAT, objective=max_load_objective(True), trust=trust)
    )
    driver = StudyDriver(study, pool=model_pool())
    optuna_study = driver.run()
    defaults = [t.value for t in optuna_study.trials if t.user_attrs.get("baseline")]
    assert defaults[:2] == [16.0, 16.0]  # the load search's max, in the baseline and its repeat
    if at_load_max:
        assert budget_used(optuna_study) == 3  # the baseline, one search launch, the repeat
        assert driver.stopped is not None and driver.stopped.startswith(
            "stopped early: SGLang's defaults met the SLO at the highest load the search tries "
            "(load_search.max 16) in each of their 2 launches"
        )
    else:
        assert budget_used(optuna_study) == 8 and driver.stopped is None


def test_a_budget_that_leaves_no_search_launch_after_defaults_at_max_load_names_the_fix(
    study_file: StudyFiles,
) -> None:
    # The H200 profile under 2x auto_benchmark's node hours: the baseline met the SLO at max (16 req/s) and
    # the confirmation's reserve left no search launch. More hours would only buy launches that measure 16.
    def study(**hours: float) -> Study:
        budget = {"n_trials": 8, **hours}
        trust = {"repeat_baseline_after": 0, "confirm": {"top": 2, "min_rounds": 2, "max_rounds": 2}}
        files = study_file(search_space=FLAT, objective=max_load_objective(True), budget=budget, trust=trust)
        return load_study(files)

    first = StudyDriver(study(), pool=model_pool()).run(n_trials=1)  # the baseline alone
    assert [t.value for t in first.trials] == [16.0]
    spent, launch = spent_s(first), launch_s(first)
    assert launch is not None
    # 1.5 launches left: short of a search launch and a round with its spare launch (all at the baseline's
    # launch as it would run again, its dump left out), which a search's first launch keeps back.
    driver = StudyDriver(study(node_hours=(spent + 1.5 * launch) / 3600), pool=model_pool())
    optuna_study = driver.run()
    assert budget_used(optuna_study) == 1  # no launch after the baseline
    assert driver.stopped is not None and driver.stopped.startswith("search ended before its first launch")
    assert "met the SLO at the highest load the search tries (load_search.max 16)" in driver.stopped
    assert driver.stopped.endswith("raise load_search.max to tell configs apart"), driver.stopped
