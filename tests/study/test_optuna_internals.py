"""Optuna's private internals that autotune uses (autotune.study.optuna_internals) are still there and
still work as that module assumes. A failure names the Optuna version and the hook: upgrading Optuna past
the range pinned in pyproject.toml means checking each hook again."""

from __future__ import annotations

import inspect
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.distributions import BaseDistribution
from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial
from packaging.requirements import Requirement

from autotune.study import optuna_internals
from autotune.study.optuna_internals import PRIVATE_ATTRIBUTES, PRIVATE_METHODS, HookedTPESampler

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _changed(hook: str, what: str) -> str:
    return (
        f"Optuna {optuna.__version__} changed {hook}, which autotune.study.optuna_internals relies on: "
        f"{what}. Adapt that module (and the pin in pyproject.toml), or install a supported Optuna."
    )


@pytest.mark.parametrize(
    ("owner", "name"),
    [(owner, name) for owner, methods in PRIVATE_METHODS.items() for name in methods],
    ids=lambda x: x if isinstance(x, str) else x.__name__,
)
def test_each_private_method_is_there_with_the_parameters_used(owner: type, name: str) -> None:
    hook = f"{owner.__module__}.{owner.__qualname__}.{name}"
    method = getattr(owner, name, None)
    assert callable(method), _changed(hook, "it is gone")
    parameters = tuple(inspect.signature(method).parameters)
    expected = PRIVATE_METHODS[owner][name]
    assert parameters == expected, _changed(hook, f"its parameters are {parameters}, not {expected}")


def _objects(tmp_path: Path) -> dict[type, object]:
    """One real object of each class whose private attributes are read, from a SQLite study."""
    storage = RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    study.tell(trial, 1.0)
    return {
        optuna.Study: study,
        optuna.Trial: trial,
        FrozenTrial: study.trials[0],
        type(study._storage): study._storage,  # Optuna's cache around the RDB storage
    }


def test_each_private_attribute_is_there(tmp_path: Path) -> None:
    objects = _objects(tmp_path)
    assert set(objects) == set(PRIVATE_ATTRIBUTES), "an object of each class in PRIVATE_ATTRIBUTES"
    for owner, names in PRIVATE_ATTRIBUTES.items():
        for name in names:
            hook = f"{owner.__module__}.{owner.__qualname__}.{name}"
            assert hasattr(objects[owner], name), _changed(hook, "an instance has no such attribute")


def test_the_storage_helpers_reach_the_rdb_storage(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = RDBStorage(url, heartbeat_interval=1, grace_period=1)
    study = optuna.create_study(storage=storage)
    assert optuna_internals.rdb_storage_of(study) is storage, _changed("_CachedStorage._backend", "not it")
    trial = study.ask()
    frozen = study.trials[0]
    assert optuna_internals.trial_id(trial) == optuna_internals.trial_id(frozen)
    optuna_internals.set_user_attr(study, frozen, "failure_kind", "interrupted")
    optuna_internals.set_system_attr(study, frozen, "autotune:proposed", "a move")
    again = optuna.load_study(study_name=study.study_name, storage=url).trials[0]
    assert again.user_attrs["failure_kind"] == "interrupted"
    assert again.system_attrs["autotune:proposed"] == "a move"
    optuna_internals.record_heartbeat(study, [trial])
    assert not optuna_internals.stale_trial_ids(study)
    time.sleep(2.2)  # past the grace period without a heartbeat
    assert optuna_internals.stale_trial_ids(study) == {optuna_internals.trial_id(trial)}, _changed(
        "RDBStorage._get_stale_trial_ids", "a trial silent past the grace period is not among them"
    )
    in_memory = optuna.create_study()
    assert optuna_internals.rdb_storage_of(in_memory) is None
    assert optuna_internals.stale_trial_ids(in_memory) == set()


def test_a_study_reads_its_trials_and_attributes_once_until_something_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = RDBStorage(f"sqlite:///{tmp_path / 'optuna.db'}")
    study = optuna.create_study(storage=storage, direction="maximize")
    study.add_trial(optuna.trial.create_trial(value=1.0))
    study.enqueue_trial({"x": 1})
    reads = {"trials": 0, "attrs": 0}
    cache = study._storage
    get_trials, get_attrs = cache.get_all_trials, cache.get_study_user_attrs

    def counted_trials(*args: Any, **kwargs: Any) -> list[FrozenTrial]:
        reads["trials"] += 1
        return get_trials(*args, **kwargs)

    def counted_attrs(*args: Any, **kwargs: Any) -> dict[str, Any]:
        reads["attrs"] += 1
        return get_attrs(*args, **kwargs)

    monkeypatch.setattr(cache, "get_all_trials", counted_trials)
    monkeypatch.setattr(cache, "get_study_user_attrs", counted_attrs)
    with optuna_internals.reads_once(study) as same:
        assert same is study
        assert len(study.get_trials(deepcopy=False)) == 2
        waiting = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.WAITING,))
        assert [t.number for t in waiting] == [1]
        assert study.user_attrs == {} and study.user_attrs == {}
        assert reads == {"trials": 1, "attrs": 1}
        study.set_user_attr("stopped", {"why": "a write"})  # a write: the next reads see it
        study.enqueue_trial({"x": 2})
        assert study.user_attrs == {"stopped": {"why": "a write"}}
        assert len(study.get_trials(deepcopy=False)) == 3
        assert reads == {"trials": 2, "attrs": 2}
        assert optuna_internals.rdb_storage_of(study) is storage  # heartbeats still reach the RDB storage
    assert study._storage is cache
    study.get_trials(deepcopy=False)
    assert reads["trials"] == 3  # outside, every read queries the storage


class _Recording(HookedTPESampler):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.calls: list[str] = []

    def build_parzen_estimator(
        self,
        study: optuna.Study,
        search_space: dict[str, BaseDistribution],
        trials: list[FrozenTrial],
        handle_below: bool,
    ) -> optuna_internals.ParzenEstimator:
        self.calls.append("below" if handle_below else "above")
        return super().build_parzen_estimator(study, search_space, trials, handle_below)

    def compute_acquisition_func(
        self,
        samples: dict[str, np.ndarray],
        mpe_below: optuna_internals.ParzenEstimator,
        mpe_above: optuna_internals.ParzenEstimator,
    ) -> np.ndarray:
        self.calls.append("score")
        score = super().compute_acquisition_func(samples, mpe_below, mpe_above)
        # The feasibility-weighted TPE adds the log densities of other trials to the score.
        assert mpe_below.log_pdf(samples).shape == score.shape, _changed("_ParzenEstimator.log_pdf", "shape")
        return score


@pytest.mark.parametrize("multivariate", [False, True])
def test_tpe_builds_the_good_density_then_the_bad_one_then_scores(multivariate: bool) -> None:
    sampler = _Recording(seed=1, n_startup_trials=3, multivariate=multivariate)
    study = optuna.create_study(sampler=sampler)
    study.optimize(lambda t: (t.suggest_float("x", -1, 1) - 0.3) ** 2, n_trials=5)
    after_start = sampler.calls
    assert after_start, _changed("TPESampler._sample", "it no longer calls the two hooks")
    per_proposal = ["below", "above", "score"]
    assert after_start == per_proposal * (len(after_start) // 3), _changed(
        "TPESampler._sample", f"it calls the hooks as {after_start[:6]}, not {per_proposal} each proposal"
    )


def test_a_filtered_study_hides_trials_from_public_and_private_reads() -> None:
    study = optuna.create_study()
    study.enqueue_trial({})
    study.optimize(lambda t: t.suggest_float("x", 0, 1) if t.number else 0.0, n_trials=3)
    filtered = optuna_internals.study_with_trials(study, lambda t: bool(t.params))
    assert [t.number for t in filtered.trials] == [1, 2]
    assert [t.number for t in filtered._get_trials(deepcopy=False, use_cache=False)] == [1, 2]


def test_the_pinned_optuna_range_holds_the_installed_version() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    pin = next(Requirement(d) for d in dependencies if Requirement(d).name == "optuna")
    assert pin.specifier.contains(optuna.__version__), (
        f"Optuna {optuna.__version__} is installed, outside the range {pin.specifier} that "
        "autotune.study.optuna_internals was checked on"
    )
    # Private APIs change between minor versions: the next one is not supported until checked.
    major, minor = (int(part) for part in optuna.__version__.split(".")[:2])
    assert not pin.specifier.contains(f"{major}.{minor + 1}.0"), (
        f"{pin.specifier} admits Optuna {major}.{minor + 1}"
    )
