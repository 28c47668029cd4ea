"""Node hours a max_load study does not spend: a search launch's load search stops below the study's best
max_load (autotune.measure.load_search; the driver hands it the best measured, never to the baseline nor to
a re-measurement, and tells it PRUNED), and the search stops once SGLang's defaults met the SLO at the
highest load it tries (autotune.study.trust.stopping `at_load_max`)."""

from __future__ import annotations

from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import Study, load_study
from autotune.study.loop import StudyDriver
from autotune.study.stages import STAGE_SUFFIX
from autotune.study.storage import budget_used, open_study
from autotune.study.trust.answer import study_answer
from autotune.study.trust.node_budget import launch_s, node_hours, spent_s
from tests.builders import FLAT, Said, StudyFiles, max_load_objective, model_pool

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
        assert steps.startswith("stopped below the study's best max_load: the SLO missed at 0.5")
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
        assert budget_used(optuna_study) == 2  # the baseline and its repeat, queued at once
        assert driver.stopped is not None and driver.stopped.startswith(
            "stopped early: SGLang's defaults met the SLO at the highest load the search tries "
            "(load_search.max 16) in each of their 2 launches"
        )
    else:
        assert budget_used(optuna_study) == 8 and driver.stopped is None


def study_at_max(study_file: StudyFiles, **keys: Any) -> Study:
    """The H200 profile's case on the seed's node: SGLang's defaults meet the SLO at the load search's max;
    the shipped space (its NCCL knobs: a stage to run), confirmation on."""
    trust = {"repeat_baseline_after": 0, "confirm": {"top": 2, "min_rounds": 2, "max_rounds": 2}}
    objective = max_load_objective(True)
    return load_study(study_file(objective=objective, trust=trust, nccl_stage={"hidden_size": 7168}, **keys))


def test_defaults_at_max_load_twice_are_the_answer_with_no_stage_search_or_round(
    study_file: StudyFiles,
) -> None:
    # Before: the stage's 22 all-reduce jobs, two search launches and a round of 2 (0.96 node h on the H200
    # profile) to tell what the defaults' second launch at max already did.
    study = study_at_max(study_file, budget={"n_trials": 8})
    said = Said()
    optuna_study = StudyDriver(study, [said], pool=model_pool(), tracking=False).run()
    trials = optuna_study.get_trials(deepcopy=False)
    assert [(t.value, bool(t.user_attrs.get("baseline"))) for t in trials] == [(16.0, True), (16.0, True)]
    assert study.name + STAGE_SUFFIX not in optuna.get_all_study_names(study.storage)
    assert any(
        line.startswith("NCCL stage skipped: SGLang's defaults met the SLO at the highest load")
        for line in said.lines
    )
    answer = study_answer(optuna_study)
    assert answer is not None and answer.confirmed and answer.verdict == "no gain" and answer.rounds == 0
    assert answer.trial == 0 and answer.value == 16.0 and answer.trials == (0, 1)
    assert answer.text.startswith(
        "no config can beat SGLang's defaults: they met your SLO at the highest load the search tries "
        "(max_load 16, load_search.max, in each of their 2 launches)"
    ), answer.text
    assert node_hours(study, optuna_study).reserve_s == 0  # no round is kept back for
    resumed = StudyDriver(
        study, pool=model_pool(), tracking=False
    ).run()  # settled: a resume launches nothing
    assert budget_used(resumed) == 2 and study_answer(resumed) == answer


def test_under_a_budget_defaults_at_max_load_get_their_repeat_and_no_round(study_file: StudyFiles) -> None:
    # The H200 profile under 2x auto_benchmark's node hours: 0.51 of 0.74 node h (the search's share spent,
    # then a round of 2 the budget could not follow with a second) ended unconfirmed at SGLang's defaults.
    first = StudyDriver(study_at_max(study_file), pool=model_pool(), tracking=False).run(n_trials=1)
    spent, launch = spent_s(first), launch_s(first)
    assert launch is not None
    study = study_at_max(study_file, budget={"n_trials": 8, "node_hours": (spent + 1.5 * launch) / 3600})
    optuna_study = StudyDriver(study, pool=model_pool(), tracking=False).run()
    assert budget_used(optuna_study) == 2 and spent_s(optuna_study) <= (spent + 1.5 * launch)
    answer = study_answer(optuna_study)
    assert answer is not None and answer.confirmed and answer.verdict == "no gain", answer
