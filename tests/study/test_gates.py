"""The checks before a launch (autotune.study.gates): the driver runs `GATES` in order and acts on the first
verdict, so a new check is one function and one line in the list; nodes answered by the simulated node's
model, real Optuna storage."""

from __future__ import annotations

import pytest
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.study import gates
from autotune.study.gates import KnownIncompatible, PredictedOom, Proposal
from autotune.study.loop import StudyDriver
from autotune.study.records import FAILURE_ATTR, NODE_ATTR
from tests.builders import StudyFiles, model_pool


def refuse_trials_1_and_2(proposal: Proposal) -> KnownIncompatible | None:
    return KnownIncompatible("refused by the test's gate") if proposal.trial.number in (1, 2) else None


def test_a_gate_added_to_the_list_records_its_proposals_unlaunched_with_its_verdict(
    study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(gates, "GATES", (refuse_trials_1_and_2, *gates.GATES))
    optuna_study = StudyDriver(load_study(study_file(n_trials=3)), pool=model_pool()).run()
    refused = [
        t for t in optuna_study.trials if t.user_attrs.get(FAILURE_ATTR) == "refused by the test's gate"
    ]
    assert [t.number for t in refused] == [1, 2]
    assert all(t.state is TrialState.FAIL and NODE_ATTR not in t.user_attrs for t in refused)
    # Refusals cost no budget: three trials still ran on the node.
    assert len([t for t in optuna_study.trials if NODE_ATTR in t.user_attrs]) == 3


def test_the_first_verdict_stands_and_an_oom_verdict_prunes(
    study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    def oom_for_trial_1(proposal: Proposal) -> PredictedOom | None:
        return PredictedOom("predicted by the test's gate") if proposal.trial.number == 1 else None

    monkeypatch.setattr(gates, "GATES", (oom_for_trial_1, refuse_trials_1_and_2, *gates.GATES))
    optuna_study = StudyDriver(load_study(study_file(n_trials=2)), pool=model_pool()).run()
    first, second = optuna_study.trials[1], optuna_study.trials[2]
    assert first.state is TrialState.PRUNED
    assert first.user_attrs[FAILURE_ATTR] == "predicted by the test's gate"
    assert second.state is TrialState.FAIL
    assert second.user_attrs[FAILURE_ATTR] == "refused by the test's gate"
