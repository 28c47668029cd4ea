"""A run's opening: the study opened or resumed, its node-hour budget checked before anything is launched or
written, the trials a dead driver left RUNNING recovered, the baseline queued again where it never ran,
and the observers told that the study started.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import optuna

from autotune.config import Study
from autotune.study.callbacks import CallbackList, StudyStarted
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.interrupts import recover
from autotune.study.node_failing import requeue_baseline
from autotune.study.run_state import RunOptions, RunState
from autotune.study.storage import finished_count, open_study, rdb_storage, trials_so_far
from autotune.study.trust import node_budget
from autotune.study.trust.stopping import stopped_early


def open_run(
    study: Study,
    options: RunOptions,
    observers: Callable[[Study], CallbackList],
    storage: optuna.storages.BaseStorage | None,
    sampler: optuna.samplers.BaseSampler | None,
    n_trials: int | None,
    accept_changes: bool,
) -> RunState:
    """Open or resume `study` for a run of `n_trials` (None: the study file's budget), in `storage` (None:
    the study file's), its sampler replaced by `sampler` when given, told to `observers(study)`."""
    study.check_launchable()
    budget = n_trials or study.file.budget.n_trials
    deadline = time.monotonic() + study.file.budget.timeout_s if study.file.budget.timeout_s else None
    study.ensure_workdir()
    storage = storage if storage is not None else rdb_storage(study.storage)
    trials_before = trials_so_far(storage, study.name)  # before a new study's baseline is queued
    optuna_study = open_study(study, accept_changes=accept_changes, sampler=sampler, storage=storage)
    if not options.queued_only:
        node_budget.check_budget(study, optuna_study, options.hours_from)  # before any launch or write
        node_budget.record_budget(study, optuna_study)
    known = KnownIncompatibilities(optuna_study, study.search_space)
    base_sampler = optuna_study.sampler
    # A search that stopped early stays stopped on a plain resume (which then finishes the confirmation);
    # a resume given --n-trials asks for more search.
    stopped = stopped_early(optuna_study) if n_trials is None else None
    run = RunState(
        study=study,
        optuna_study=optuna_study,
        storage=storage,
        observers=observers(study),
        known=known,
        sampler=sampler,
        options=options,
        accept_changes=accept_changes,
        trials_before=trials_before,
        budget=budget,
        deadline=deadline,
        stopped=stopped,
        total=budget or 0,
        done=0,
        base_sampler=base_sampler,
    )
    recovered = recover(run)
    if not options.queued_only:
        requeue_baseline(study, optuna_study)  # its node may have been fixed since (study.node_failing)
    run.done = finished_count(optuna_study)
    run.refresh_standing()
    run.observers.study_started(StudyStarted(study, tuple(recovered)))
    return run
