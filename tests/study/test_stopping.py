"""The stopping rule (autotune.study.trust.stopping, `trust.stop_early`): a search that stops finding stops,
and a resume given a larger budget continues it; run fast on nodes answered by the simulated node's model."""

from __future__ import annotations

import optuna

from autotune.config import load_study
from autotune.study.loop import StudyDriver
from autotune.study.storage import budget_used
from autotune.study.trust.noise import noise_estimate
from autotune.study.trust.stopping import why_stop
from tests.builders import FLAT, StudyFiles, launched, model_pool, stored_trial, study_of_trials


def test_a_flat_search_stops_early_and_a_resume_with_a_larger_budget_continues_it(
    study_file: StudyFiles,
) -> None:
    trust = {
        "repeat_baseline_after": 2,
        "confirm": False,
        "stop_early": {"min_trials": 5, "patience": 3},
        "screen": False,  # the stopping rule alone (screening would hold both knobs)
    }
    path = study_file(n_trials=30, search_space=FLAT, trust=trust)
    study = load_study(path)
    driver = StudyDriver(study, pool=model_pool(noise=0.01))
    optuna_study = driver.run()
    used = budget_used(optuna_study)
    assert used < 30 and driver.stopped is not None and "within the run-to-run noise band" in driver.stopped
    assert optuna_study.user_attrs["stopped"]["why"] == driver.stopped
    # The baseline ran again twice early (after 2 and 4 launches): the rule stops on 2 degrees of freedom.
    repeats = [t.number for t in launched(optuna_study) if t.user_attrs.get("baseline") and t.number > 0]
    assert len(repeats) == 2 and noise_estimate(optuna_study).dof >= 2  # type: ignore[union-attr]
    # A plain resume does not search again (it would finish a confirmation); the rest of the budget is left,
    # and a resume given --n-trials gets `patience` more search trials before the rule looks again.
    assert budget_used(StudyDriver(study, pool=model_pool(noise=0.01)).run()) == used
    again = StudyDriver(study, pool=model_pool(noise=0.01))
    optuna_study = again.run(n_trials=30)
    assert budget_used(optuna_study) >= used + 3


def test_without_the_rule_a_flat_search_spends_its_budget(study_file: StudyFiles) -> None:
    trust = {"repeat_baseline_after": 2, "confirm": False, "stop_early": False, "screen": False}
    # Within its 8 configs (fcfs is SGLang's own policy: the launch that leaves it unset) and 2 repeats.
    path = study_file(n_trials=8, search_space=FLAT, trust=trust)
    driver = StudyDriver(load_study(path), pool=model_pool(noise=0.01))
    assert budget_used(driver.run()) == 8 and driver.stopped is None


def _searched(node_s: float) -> optuna.Study:
    """SGLang's defaults at 0, 3 and 6 (the noise: 2 degrees of freedom), six flat search launches between,
    each launch `node_s` seconds of the node."""
    trials = []
    for number, value in enumerate((100.0, 101.0, 100.0, 98.0, 100.5, 99.0, 102.0, 100.0, 100.0)):
        if number % 3 == 0:
            repeat = {"remeasure_of": 0} if number else {}
            trials.append(stored_trial({}, value, node="n", node_s=node_s, baseline=True, **repeat))
        else:
            trials.append(stored_trial({"--stream-interval": number}, value, node="n", node_s=node_s))
    return study_of_trials(*trials)


def test_a_stretch_of_node_hours_holds_five_search_launches_before_it_stops_a_study(
    study_file: StudyFiles,
) -> None:
    # A load search on 4x L40S costs 1.25 node h a launch: 2 node hours were 2 launches, and the rule
    # stopped a study 4 launches into its search at 0.10 of the best known (RESULTS-peers.md, max_load).
    study = load_study(study_file(n_trials=40, trust={"stop_early": {"min_trials": 100, "patience": 100}}))
    assert why_stop(study, _searched(node_s=4500.0)) is None
    stopped = why_stop(study, _searched(node_s=1440.0))  # 0.4 node h a launch: 5 in the last 2 node hours
    assert stopped is not None and "(5 trials)" in stopped


def _raised_at(position: int) -> optuna.Study:
    """SGLang's defaults at 0, 3 and 6 (the noise: 2 degrees of freedom) and seven search launches, the best
    raised 20% by the search's `position`-th launch and flat after it."""
    trials, searched = [], 0
    for number in range(10):
        if number in (0, 3, 6):
            repeat = {"remeasure_of": 0} if number else {}
            value = (100.0, 101.0, 100.0)[number // 3]
            trials.append(stored_trial({}, value, node="n", baseline=True, **repeat))
            continue
        searched += 1
        value = 120.0 - 0.5 * (searched % 2) if searched >= position else 100.0 + 0.5 * (searched % 2)
        trials.append(stored_trial({"--stream-interval": number}, value, node="n"))
    return study_of_trials(*trials)


def test_a_patience_that_grows_with_the_search_stops_sooner_after_a_best_raised_early(
    study_file: StudyFiles,
) -> None:
    rule = {"min_trials": 5, "patience": 10, "min_node_hours": None, "patience_node_hours": None}
    fixed = load_study(study_file(n_trials=40, trust={"stop_early": {**rule, "min_patience": None}}))
    grows = load_study(study_file(n_trials=40, trust={"stop_early": {**rule, "min_patience": 3}}))
    assert why_stop(fixed, _raised_at(2)) is None  # 7 search launches: fewer than `patience`
    stopped = why_stop(grows, _raised_at(2))  # raised at the 2nd: waited on max(3, 0.75 x 2) launches
    assert stopped is not None and stopped.startswith("stopped early: the last 3 search trials")
    assert why_stop(grows, _raised_at(6)) is None  # raised at the 6th: 5 launches to wait, 1 so far
