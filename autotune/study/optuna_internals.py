"""Every use of Optuna's private internals, in one place; the rest of autotune uses Optuna's public API.

Each function says what Optuna offers no public form of. `PRIVATE_METHODS` and `PRIVATE_ATTRIBUTES` list
what this module relies on; tests/study/test_optuna_internals.py checks them against the installed Optuna and
fails naming its version and the hook, and pyproject.toml pins the Optuna versions they were checked on.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import TPESampler
from optuna.samplers._tpe.parzen_estimator import _ParzenEstimator
from optuna.storages import BaseStorage, RDBStorage
from optuna.storages._cached_storage import _CachedStorage
from optuna.study import Study
from optuna.trial import FrozenTrial, Trial, TrialState

ParzenEstimator = _ParzenEstimator  # what TPE's density is: `log_pdf(samples)` scores candidates

# Class -> private method -> its parameters as this module calls or overrides it.
PRIVATE_METHODS: dict[type, dict[str, tuple[str, ...]]] = {
    TPESampler: {
        "_build_parzen_estimator": ("self", "study", "search_space", "trials", "handle_below"),
        "_compute_acquisition_func": ("self", "samples", "mpe_below", "mpe_above"),
        "_sample": ("self", "study", "trial", "search_space"),  # calls the two above, in that order
    },
    _ParzenEstimator: {"log_pdf": ("self", "samples_dict")},
    RDBStorage: {"_get_stale_trial_ids": ("self", "study_id")},
    Study: {"_get_trials": ("self", "deepcopy", "states", "use_cache")},
}
# Instance attributes read here: a study's storage and id, a trial's storage id, the cache's RDB storage.
PRIVATE_ATTRIBUTES: dict[type, tuple[str, ...]] = {
    Study: ("_storage", "_study_id"),
    Trial: ("_trial_id",),
    FrozenTrial: ("_trial_id",),
    _CachedStorage: ("_backend",),
}


def trial_id(trial: Trial | FrozenTrial) -> int:
    """The storage's id of a trial: Optuna's API names trials by number, its storage by id."""
    return cast(int, trial._trial_id)


def storage_of(study: Study) -> BaseStorage:
    """The storage a study reads and writes (a `Study` does not expose it)."""
    return study._storage


def rdb_storage_of(study: Study) -> RDBStorage | None:
    """The RDB storage under a study (Optuna wraps one in a cache), or None for another kind."""
    storage = study._storage
    if isinstance(storage, _ReadsOnce):
        storage = storage.storage
    if isinstance(storage, _CachedStorage):
        storage = storage._backend
    return storage if isinstance(storage, RDBStorage) else None


class _ReadsOnce:
    """A study's storage that answers the study's trials and user attributes from one read until the
    next write through it (any call but a get_/check_/is_ one)."""

    def __init__(self, storage: BaseStorage) -> None:
        self.storage = storage
        self._trials: dict[int, list[FrozenTrial]] = {}
        self._attrs: dict[int, dict[str, Any]] = {}

    def get_all_trials(
        self, study_id: int, deepcopy: bool = True, states: Container[TrialState] | None = None
    ) -> list[FrozenTrial]:
        if deepcopy:
            return self.storage.get_all_trials(study_id, deepcopy=True, states=states)
        if study_id not in self._trials:
            self._trials[study_id] = self.storage.get_all_trials(study_id, deepcopy=False)
        return [t for t in self._trials[study_id] if states is None or t.state in states]

    def get_study_user_attrs(self, study_id: int) -> dict[str, Any]:
        if study_id not in self._attrs:
            self._attrs[study_id] = self.storage.get_study_user_attrs(study_id)
        return self._attrs[study_id]

    def __getattr__(self, name: str) -> Any:
        if not name.startswith(("get_", "check_", "is_")):
            self._trials.clear()
            self._attrs.clear()
        return getattr(self.storage, name)


@contextmanager
def reads_once(study: Study) -> Iterator[Study]:
    """`study` reading its trials and user attributes once while nothing writes through it: the driver's
    checks between two trials each read them, and each read is a query of the whole study."""
    storage = study._storage
    study._storage = cast(BaseStorage, _ReadsOnce(storage))
    try:
        yield study
    finally:
        study._storage = storage


def set_user_attr(study: Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """A user attribute on a trial this process holds no `Trial` of (one a dead driver left RUNNING):
    `Trial.set_user_attr` is the public way, for the process that asked for the trial."""
    study._storage.set_trial_user_attr(trial._trial_id, key, value)


def set_system_attr(study: Study, trial: FrozenTrial, key: str, value: Any) -> None:
    """A system attribute set by a sampler, as Optuna's own samplers record theirs: no public API sets one."""
    study._storage.set_trial_system_attr(trial._trial_id, key, value)


@dataclass(frozen=True)
class StoredTrial:
    """A trial written through its study's storage (the `record_*` writers of study.records take it)."""

    study: Study
    trial: FrozenTrial

    def set_user_attr(self, key: str, value: Any) -> None:
        set_user_attr(self.study, self.trial, key, value)

    def set_system_attr(self, key: str, value: Any) -> None:
        set_system_attr(self.study, self.trial, key, value)


def fixed_params(trial: FrozenTrial) -> dict[str, Any]:
    """The values `Study.enqueue_trial` queued for the trial (a system attr): its params before it asked
    for any (a driver that dies between asking and suggesting leaves no params, only these)."""
    return dict(trial.system_attrs.get("fixed_params") or {})


def stale_trial_ids(study: Study) -> set[int]:
    """Storage ids of RUNNING trials whose heartbeat stopped for longer than the grace period; empty without
    RDB heartbeats. (`optuna.storages.fail_stale_trials` would fail them at once; the driver first asks
    whose they are.)"""
    rdb = rdb_storage_of(study)
    return set(rdb._get_stale_trial_ids(study._study_id)) if rdb is not None else set()


def record_heartbeat(study: Study, trials: Iterable[Trial]) -> None:
    """Tell other drivers these trials are alive (RDB storage only; others keep no heartbeat)."""
    rdb = rdb_storage_of(study)
    if rdb is not None:
        for trial in trials:
            rdb.record_heartbeat(trial._trial_id)


class _FilteredStudy:
    """A study as a sampler sees it, with only the trials `keep` accepts. Samplers read trials through
    the public `get_trials` and the private `_get_trials`; both are filtered."""

    def __init__(self, study: Study, keep: Callable[[FrozenTrial], bool]) -> None:
        self._study = study
        self._keep = keep

    def get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(*args, **kwargs) if self._keep(t)]

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs) if self._keep(t)]

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


def study_with_trials(study: Study, keep: Callable[[FrozenTrial], bool]) -> Study:
    """`study` as a sampler sees it, with only the trials `keep` accepts."""
    return cast(Study, _FilteredStudy(study, keep))  # a Study in every way a sampler uses one


class HookedTPESampler(TPESampler):
    """TPESampler whose two private steps of a proposal a subclass overrides under public names.

    `TPESampler._sample` builds the Parzen estimator of the good trials (`handle_below=True`), then the one
    of the others, draws candidates from the first and scores them with the acquisition function.
    """

    def build_parzen_estimator(
        self,
        study: Study,
        search_space: dict[str, BaseDistribution],
        trials: list[FrozenTrial],
        handle_below: bool,
    ) -> ParzenEstimator:
        """The density of `trials` (the good ones when `handle_below`); TPE's own unless overridden."""
        return TPESampler._build_parzen_estimator(self, study, search_space, trials, handle_below)

    def compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: ParzenEstimator, mpe_above: ParzenEstimator
    ) -> np.ndarray:
        """Each candidate's score, higher is better; TPE's own (log l(x) - log g(x)) unless overridden."""
        return TPESampler._compute_acquisition_func(self, samples, mpe_below, mpe_above)

    # TPESampler._sample calls the private steps, which lead to the public ones above (their parameters:
    # PRIVATE_METHODS, checked against Optuna's by tests/study/test_optuna_internals.py).
    def _build_parzen_estimator(self, *args: Any, **kwargs: Any) -> ParzenEstimator:
        return self.build_parzen_estimator(*args, **kwargs)

    def _compute_acquisition_func(self, *args: Any, **kwargs: Any) -> np.ndarray:
        return self.compute_acquisition_func(*args, **kwargs)
