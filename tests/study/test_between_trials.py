"""The steps between two trials (autotune.study.between_trials): taken in `STEPS`' order before every
proposal; a step's `SearchEnds` ends the search, kept in the study when `recorded`; nodes answered by the
simulated node's model, real Optuna storage."""

from __future__ import annotations

import pytest

from autotune.config import load_study
from autotune.study import between_trials
from autotune.study.between_trials import SearchEnds
from autotune.study.loop import StudyDriver
from autotune.study.run_state import RunState
from autotune.study.storage import budget_used
from autotune.study.trust.stopping import stopped_early
from tests.builders import StudyFiles, model_pool

WHY = "search ended by the test's step after 3 trials"


@pytest.mark.parametrize("recorded", [True, False])
def test_a_step_added_to_the_list_ends_the_search_and_is_kept_when_recorded(
    recorded: bool, study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    def after_three(run: RunState) -> SearchEnds | None:
        return SearchEnds(WHY, recorded=recorded) if budget_used(run.optuna_study) >= 3 else None

    monkeypatch.setattr(between_trials, "STEPS", (after_three, *between_trials.STEPS))
    driver = StudyDriver(load_study(study_file(n_trials=8)), pool=model_pool())
    optuna_study = driver.run()
    assert budget_used(optuna_study) == 3 and driver.stopped == WHY
    assert stopped_early(optuna_study) == (
        WHY if recorded else None
    )  # a recorded stop holds on a plain resume


def test_a_step_that_ends_the_search_at_once_skips_the_steps_after_it(
    study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken: list[int] = []

    def at_once(run: RunState) -> SearchEnds | None:
        return SearchEnds(WHY, at_once=True) if budget_used(run.optuna_study) >= 2 else None

    def later(run: RunState) -> None:
        taken.append(budget_used(run.optuna_study))

    monkeypatch.setattr(between_trials, "STEPS", (at_once, later))
    StudyDriver(load_study(study_file(n_trials=8)), pool=model_pool()).run()
    assert taken == [0, 1]  # before the baseline and the first proposal, not once the search ended
