"""One contract for every sampler autotune builds, as Optuna's tests/samplers_tests run theirs: seeded runs
repeat, proposals stay in the search space (conditional knobs and the baseline's empty trial included),
pruned and failed trials and a resumed study are handled, and a wrapper hands its base each trial.

A new wrapper joins by adding itself to WRAPPERS (a factory around a base sampler); a new sampler that
wraps nothing, to SAMPLERS.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optuna
import pytest
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.study.samplers import DefaultsStartSampler, IncumbentMoves, WithoutBaseline, tpe

STARTUP = 5  # trials before a sampler models the study: the contract covers both sides of it
WRAPPERS: dict[str, Callable[[BaseSampler, int | None], BaseSampler]] = {
    "defaults-start": lambda base, seed: DefaultsStartSampler(base, n_startup_trials=STARTUP, seed=seed),
    "incumbent-moves": lambda base, seed: IncumbentMoves(base, n_startup_trials=STARTUP, seed=seed),
    "without-baseline": lambda base, seed: WithoutBaseline(base),
}


def _around_tpe(
    wrap: Callable[[BaseSampler, int | None], BaseSampler],
) -> Callable[[int | None], BaseSampler]:
    return lambda seed: wrap(optuna.samplers.TPESampler(seed=seed, n_startup_trials=STARTUP), seed)


SAMPLERS: dict[str, Callable[[int | None], BaseSampler]] = {
    **{name: _around_tpe(wrap) for name, wrap in WRAPPERS.items()},
    # The default: the wrappers around one another and around feasibility-weighted TPE.
    "autotune-tpe": lambda seed: tpe(seed, n_startup_trials=STARTUP),
}
parametrize_sampler = pytest.mark.parametrize("name", list(SAMPLERS))
parametrize_wrapper = pytest.mark.parametrize("name", list(WRAPPERS))

MEM = "--mem-fraction-static"
SPEC = "--speculative-algorithm"
SPACE: dict[str, BaseDistribution] = {
    MEM: FloatDistribution(0.70, 0.95, step=0.01),
    "--chunked-prefill-size": IntDistribution(2048, 16384, step=2048),
    "--max-running-requests": IntDistribution(1, 256, log=True),
    "NCCL_ALGO": CategoricalDistribution([None, "Ring", "Tree"]),
    "--enable-torch-symm-mem": CategoricalDistribution([False, True]),
    SPEC: CategoricalDistribution([None, "EAGLE3", "NGRAM"]),
}
# Only under a speculative algorithm, as the shipped space's tree knobs.
DRAFT_TOKENS = ("--speculative-num-draft-tokens", IntDistribution(2, 16))


def suggest_one(trial: optuna.Trial, name: str, distribution: BaseDistribution) -> Any:
    if isinstance(distribution, CategoricalDistribution):
        return trial.suggest_categorical(name, distribution.choices)
    if isinstance(distribution, IntDistribution):
        return trial.suggest_int(
            name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
        )
    assert isinstance(distribution, FloatDistribution)
    return trial.suggest_float(
        name, distribution.low, distribution.high, step=distribution.step, log=distribution.log
    )


def suggest(trial: optuna.Trial) -> dict[str, Any]:
    params = {name: suggest_one(trial, name, distribution) for name, distribution in SPACE.items()}
    if params[SPEC] is not None:
        params[DRAFT_TOKENS[0]] = suggest_one(trial, *DRAFT_TOKENS)
    return params


def objective(trial: optuna.Trial) -> float:
    """A landscape with a memory limit: past it the trial is pruned with its constraint broken, as the
    driver records an out-of-memory launch; one config fails outright."""
    params = suggest(trial)
    if params[MEM] > 0.92:
        trial.set_constraint("memory", 1.0)
        raise optuna.TrialPruned()
    trial.set_constraint("memory", 0.0)
    if params["NCCL_ALGO"] == "Tree" and params["--enable-torch-symm-mem"]:
        raise RuntimeError("a config that crashes the server")
    return params[MEM] * 100 + (params["NCCL_ALGO"] == "Ring") * 5 + params["--chunked-prefill-size"] / 4096


def with_baseline(study: Study) -> Study:
    """Trial 0 as the driver runs it: SGLang's defaults, so no parameter at all."""
    study.add_trial(create_trial(params={}, distributions={}, value=80.0, user_attrs={"baseline": True}))
    return study


def run(
    sampler: BaseSampler, n_trials: int, storage: optuna.storages.BaseStorage | None = None, name: str = "s"
) -> Study:
    study = with_baseline(
        optuna.create_study(direction="maximize", sampler=sampler, storage=storage, study_name=name)
    )
    study.optimize(objective, n_trials=n_trials, catch=(RuntimeError,))
    return study


def proposals(study: Study) -> list[dict[str, Any]]:
    return [t.params for t in study.trials if t.params]


def outside_the_space(trials: list[FrozenTrial]) -> list[tuple[int, str, Any]]:
    space = dict(SPACE, **{DRAFT_TOKENS[0]: DRAFT_TOKENS[1]})
    return [
        (t.number, name, value)
        for t in trials
        for name, value in t.params.items()
        if name not in space or not space[name]._contains(space[name].to_internal_repr(value))
    ]


@parametrize_sampler
def test_a_seeded_sampler_proposes_the_same_trials_again(name: str) -> None:
    first, second = run(SAMPLERS[name](7), 16), run(SAMPLERS[name](7), 16)
    assert proposals(first) == proposals(second)
    assert proposals(run(SAMPLERS[name](8), 16)) != proposals(first), "the seed changes nothing"


@parametrize_sampler
def test_every_proposal_is_in_the_search_space_conditional_knobs_included(name: str) -> None:
    study = run(SAMPLERS[name](3), 24)
    assert outside_the_space(study.trials) == []
    tried = [t for t in study.trials if t.params]
    assert len(tried) == 24 and all(set(SPACE) <= set(t.params) for t in tried)
    for trial in tried:
        assert (DRAFT_TOKENS[0] in trial.params) == (trial.params[SPEC] is not None), trial.params
    states = {t.state for t in study.trials}
    assert {TrialState.COMPLETE, TrialState.PRUNED} <= states, "the study reached the memory limit"


@parametrize_sampler
def test_a_resumed_study_goes_on_where_it_stopped(name: str) -> None:
    storage = optuna.storages.InMemoryStorage()
    run(SAMPLERS[name](5), 8, storage)
    # As a new process would: a fresh sampler on the stored trials (past its start, pruned and failed ones).
    resumed = optuna.load_study(study_name="s", storage=storage, sampler=SAMPLERS[name](5))
    resumed.optimize(objective, n_trials=8, catch=(RuntimeError,))
    assert len(resumed.trials) == 17 and outside_the_space(resumed.trials) == []
    assert all(t.state.is_finished() for t in resumed.trials)
    configs = [tuple(sorted(p.items(), key=str)) for p in proposals(resumed)]
    assert len(set(configs)) > len(configs) // 2, "the resumed sampler keeps proposing the same config"


@parametrize_sampler
def test_a_multi_objective_study_is_sampled_in_the_space(name: str) -> None:
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=SAMPLERS[name](2))
    study.add_trial(
        create_trial(params={}, distributions={}, values=[80.0, 30.0], user_attrs={"baseline": True})
    )
    study.optimize(lambda t: (objective(t), suggest(t)[MEM] * 10), n_trials=12, catch=(RuntimeError,))
    assert outside_the_space(study.trials) == [] and len(study.trials) == 13


@parametrize_sampler
def test_reseeding_changes_what_comes_next(name: str) -> None:
    reseeded, twin = SAMPLERS[name](4), SAMPLERS[name](4)
    study_a, study_b = run(reseeded, 6, name="a"), run(twin, 6, name="b")
    assert proposals(study_a) == proposals(study_b)
    reseeded.reseed_rng()
    study_a.optimize(objective, n_trials=10, catch=(RuntimeError,))
    study_b.optimize(objective, n_trials=10, catch=(RuntimeError,))
    assert proposals(study_a)[6:] != proposals(study_b)[6:]
    assert outside_the_space(study_a.trials) == []


class Recording(optuna.samplers.RandomSampler):
    """A base sampler that notes each trial's start and end as its wrapper hands them on."""

    def __init__(self, seed: int | None) -> None:
        super().__init__(seed=seed)
        self.started: list[int] = []
        self.ended: list[tuple[int, TrialState]] = []

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.started.append(trial.number)

    def after_trial(self, study: Study, trial: FrozenTrial, state: TrialState, values: Any) -> None:
        self.ended.append((trial.number, state))


@parametrize_wrapper
def test_a_wrapper_hands_its_base_every_trials_start_and_end(name: str) -> None:
    base = Recording(seed=1)
    study = run(WRAPPERS[name](base, 1), 10)
    asked = [t.number for t in study.trials if t.number > 0]  # trial 0 was added, never asked for
    assert base.started == asked
    assert base.ended == [(t.number, t.state) for t in study.trials if t.number > 0]
