"""The ablation plan (autotune.study.ablation) on a real Optuna storage: which settings of the best config
are reverted, and to what."""

from __future__ import annotations

from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution, FloatDistribution

from autotune.study.ablation import enqueue_ablation, plan_ablation
from autotune.study.records import BASELINE_ATTR, SERVER_CHOICES_ATTR
from tests.builders import stored_trial, study_of_trials

MEM, PROTO = "--mem-fraction-static", "NCCL_PROTO"
DISTRIBUTIONS = {
    MEM: FloatDistribution(0.70, 0.95, step=0.01),
    PROTO: CategoricalDistribution([None, "LL", "Simple"]),
}


def study_with_best(
    tmp_path: Path, best_fraction: float, server_choices: dict[str, float] | None
) -> optuna.Study:
    return study_of_trials(
        stored_trial({MEM: 0.89, PROTO: None}, 100.0, spaces=DISTRIBUTIONS, **{BASELINE_ATTR: True}),
        stored_trial({MEM: best_fraction, PROTO: "LL"}, 130.0, spaces=DISTRIBUTIONS),
        storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        # What the baseline's log said SGLang chose (the loop records it), unless None.
        **({} if server_choices is None else {SERVER_CHOICES_ATTR: server_choices}),
    )


def test_a_range_without_unset_reverts_to_sglangs_own_choice_in_the_baseline(tmp_path: Path) -> None:
    optuna_study = study_with_best(tmp_path, 0.84, {MEM: 0.893, "--chunked-prefill-size": 8192.0})
    plan = plan_ablation(optuna_study)
    assert plan.reverts == {MEM: 0.89, PROTO: None}  # 0.893 on the space's step
    assert plan.server_chosen == (MEM,) and plan.not_ablated == {}
    assert sorted(enqueue_ablation(optuna_study, plan)) == sorted([MEM, PROTO])
    queued = [t for t in optuna_study.get_trials() if t.state == optuna.trial.TrialState.WAITING]
    fixed = [t.system_attrs["fixed_params"] for t in queued]
    assert {MEM: 0.89, PROTO: "LL"} in fixed and {MEM: 0.84, PROTO: None} in fixed


def test_without_a_recorded_choice_or_with_it_already_the_range_is_not_reverted(tmp_path: Path) -> None:
    plan = plan_ablation(study_with_best(tmp_path, 0.84, None))
    assert plan.reverts == {PROTO: None} and "recorded no value SGLang chose" in plan.not_ablated[MEM]
    (tmp_path / "again").mkdir()
    plan = plan_ablation(study_with_best(tmp_path / "again", 0.89, {MEM: 0.893}))
    assert plan.reverts == {PROTO: None} and "SGLang's own choice already" in plan.not_ablated[MEM]
