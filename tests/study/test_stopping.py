"""The stopping rule (autotune.study.trust.stopping, `trust.stop_early`): a search that stops finding stops,
and a resume given a larger budget continues it; run fast on nodes answered by the simulated node's model."""

from __future__ import annotations

from autotune.config import load_study
from autotune.study.loop import StudyDriver
from autotune.study.storage import budget_used
from autotune.study.trust.noise import noise_estimate
from tests.builders import FLAT, StudyFiles, launched, model_pool


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
