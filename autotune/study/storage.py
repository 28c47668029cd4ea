"""The study's Optuna side: open or resume it, lock it between drivers, find what a dead driver left.

Several drivers may share one study (PostgreSQL): each takes the study lock around "is budget left? ask",
records a heartbeat for its running trials, and marks its trials with its identity, so a driver that
starts later fails only the trials of drivers that are gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import warnings
import zlib
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    IntDistribution,
    check_distribution_compatibility,
)
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study, load_yaml_text
from autotune.errors import ConfigError
from autotune.study import optuna_internals, samplers
from autotune.study.records import (
    StudyRecord,
    TrialRecord,
    marks,
    record_driver,
    record_study_config,
    retry_marks,
)
from autotune.study.rules import counts  # the rule is rules.py's; its users import it from here too

HEARTBEAT_S = 10
# Optuna warns that heartbeats are meant for Study.optimize; this ask/tell loop records its own.
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
GRACE_S = 60  # a trial whose driver is silent this long is interrupted


def _process_start(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot), to tell a process from a reused pid."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


DRIVER_ID = f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


def driver_alive(driver_id: str) -> bool | None:
    """True/False for a driver on this host; None for one elsewhere (only its heartbeat can tell)."""
    host, _, rest = driver_id.partition(":")
    if host != socket.gethostname():
        return None
    pid, _, started = rest.partition(":")
    return pid.isdigit() and _process_start(int(pid)) == started


def rdb_storage(url: str) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage with heartbeats; a SQLite file in WAL mode, which survives a crash of the
    process without an fsync per write (each costs milliseconds, and a trial makes dozens)."""
    storage = optuna.storages.RDBStorage(url, heartbeat_interval=HEARTBEAT_S, grace_period=GRACE_S)
    if url.startswith("sqlite"):
        from sqlalchemy import event

        def pragmas(connection: Any, _record: Any) -> None:
            cursor = connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        event.listen(storage.engine, "connect", pragmas)
        storage.engine.dispose()  # connections made before the listener reconnect with it
    return storage


def _study_record(study: Study) -> dict[str, Any]:
    return {
        "study_file": str(study.path.resolve()),
        "search_space": study.search_space_text,
        "objective": study.objective_text,
    }


def config_changes(recorded: Mapping[str, Any], study: Study) -> list[str]:
    """What differs between the search space and objective a study was created with and the current ones."""
    changes = []
    old_space = (load_yaml_text(recorded.get("search_space") or "") or {}).get("parameters") or {}
    new_space = (load_yaml_text(study.search_space_text) or {}).get("parameters") or {}
    changes += [f"search space: added {name}" for name in new_space if name not in old_space]
    changes += [f"search space: removed {name}" for name in old_space if name not in new_space]
    changes += [
        f"search space: changed {name} ({old_space[name]} -> {new_space[name]})"
        for name in new_space
        if name in old_space and old_space[name] != new_space[name]
    ]
    old_objective = load_yaml_text(recorded.get("objective") or "") or {}
    new_objective = load_yaml_text(study.objective_text) or {}
    changes += [
        f"objective: {key} {old_objective.get(key)!r} -> {new_objective.get(key)!r}"
        for key in sorted(set(old_objective) | set(new_objective))
        if old_objective.get(key) != new_objective.get(key)
    ]
    return changes


def refused_knobs(optuna_study: optuna.Study, study: Study) -> dict[str, str]:
    """Knobs the study has tried whose new definition Optuna's storage would refuse (other choices, another
    type, log scale switched), each with its old and new definition; Optuna itself decides which."""
    tried: dict[str, BaseDistribution] = {}
    for trial in optuna_study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            tried.setdefault(name, distribution)  # Optuna stored none it would refuse: any trial's will do
    refused = {}
    for name, new in _distributions(study).items():
        if name not in tried:
            continue
        try:
            check_distribution_compatibility(tried[name], new)
        except ValueError:
            refused[name] = f"{_describe(tried[name])} -> {_describe(new)}"
    return refused


def _distributions(study: Study) -> dict[str, BaseDistribution]:
    """Each knob's Optuna distribution, as its `suggest` builds it (on a throwaway in-memory trial)."""
    trial = optuna.create_study(
        storage=optuna.storages.InMemoryStorage(), sampler=optuna.samplers.RandomSampler()
    ).ask()
    for name, parameter in study.search_space.parameters.items():
        parameter.suggest(name, trial)
    return trial.distributions


def _describe(distribution: BaseDistribution) -> str:
    """A knob's distribution in the search space file's words."""
    if isinstance(distribution, CategoricalDistribution):
        return "choices " + yaml.safe_dump(list(distribution.choices), default_flow_style=True).strip()
    kind = "int" if isinstance(distribution, IntDistribution) else "float"
    return f"type {kind}" + (", log: true" if getattr(distribution, "log", False) else "")


def open_study(
    study: Study,
    *,
    accept_changes: bool = False,
    sampler: optuna.samplers.BaseSampler | None = None,
    storage: optuna.storages.BaseStorage | None = None,
) -> optuna.Study:
    """Create the Optuna study (trial 0: the baseline) or load it to continue with the same settings.

    Resuming with a changed search space or objective raises ConfigError saying what changed, unless
    `accept_changes`, which records the new files with the study. `sampler` and `storage` replace the
    study file's (e.g. Optuna's InMemoryStorage, where nothing needs to outlive the process).
    """
    study.ensure_workdir()  # the default SQLite file lives there
    storage = storage if storage is not None else rdb_storage(study.storage)
    if sampler is None:
        sampler = samplers.build(study.file.sampler, trials_so_far=trials_so_far(storage, study.name))
    try:
        optuna_study = optuna.create_study(
            storage=storage, study_name=study.name, directions=study.objective.directions, sampler=sampler
        )
    except optuna.exceptions.DuplicatedStudyError:
        optuna_study = optuna.load_study(study_name=study.name, storage=storage, sampler=sampler)
        _check_unchanged(optuna_study, study, accept_changes)
        return optuna_study
    record_study_config(optuna_study, _study_record(study))
    # The baseline is SGLang's own defaults: no tuned parameter at all, so nothing to enqueue.
    optuna_study.enqueue_trial({}, user_attrs=marks(baseline=True))
    return optuna_study


def trials_so_far(storage: optuna.storages.BaseStorage, name: str) -> int:
    """How many trials the study named `name` has in `storage` (none when it does not exist yet): what
    seeds a continued study's sampler (samplers.continued_seed)."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return 0
    return len(storage.get_all_trials(study_id, deepcopy=False))


def _check_unchanged(optuna_study: optuna.Study, study: Study, accept_changes: bool) -> None:
    created = [d.name.lower() for d in optuna_study.directions]
    if created != study.objective.directions:
        raise ConfigError(
            study.objective_path,
            "direction",
            study.objective.directions,
            f"the study was created to {' and '.join(created)}, its directions cannot change",
            "Use a new study name for other directions or another number of objectives.",
        )
    recorded = StudyRecord.of(optuna_study).config
    changes = config_changes(recorded, study)
    if not changes:
        return
    refused = refused_knobs(optuna_study, study)
    if not accept_changes:
        fix = "Pass --accept-changes to continue with the new files anyway, or use a new study name."
        if refused:
            fix += f" --accept-changes cannot change the choices or type of {', '.join(refused)}, though."
        raise ConfigError(
            study.search_space_path if changes[0].startswith("search space") else study.objective_path,
            "",
            "; ".join(changes),
            f"study {study.name!r} was created with other settings, so its trials would not compare",
            fix,
        )
    if refused:
        raise ConfigError(
            study.search_space_path,
            "",
            "; ".join(f"{name}: {change}" for name, change in refused.items()),
            f"study {study.name!r} cannot take other choices or another type for a knob it has tried "
            "(Optuna keeps them for the whole study, to read its trials' values)",
            "Keep the old choices and type, "
            "or name a new study (`study:` in the study file) for the new ones.",
        )
    history = [*recorded.get("history", []), {k: v for k, v in recorded.items() if k != "history"}]
    record_study_config(optuna_study, {**_study_record(study), "history": history})


def budget_used(optuna_study: optuna.Study) -> int:
    """Trials counted against the budget: finished or running on a node, by any driver."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)
    return sum(1 for t in optuna_study.get_trials(deepcopy=False, states=states) if counts(t))


def finished_count(optuna_study: optuna.Study) -> int:
    """Finished trials counted against the budget."""
    states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return sum(1 for t in optuna_study.get_trials(deepcopy=False, states=states) if counts(t))


def abandoned_trials(optuna_study: optuna.Study, *, locked: bool = False) -> list[FrozenTrial]:
    """RUNNING trials whose driver is gone: dead on this host, or silent past the grace period.

    `locked`: the caller holds the study lock, which a driver holds from asking for a trial until it
    has claimed it, so a trial nobody claimed was asked for by a driver that died in between."""
    stale_ids = optuna_internals.stale_trial_ids(optuna_study)
    now = datetime.now()
    abandoned = []
    for trial in optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = TrialRecord.of(trial).driver
        if owner == DRIVER_ID:
            continue
        alive = driver_alive(owner) if owner else None
        silent = optuna_internals.trial_id(trial) in stale_ids or (
            owner is None
            and trial.datetime_start is not None
            and now - trial.datetime_start > timedelta(seconds=GRACE_S)
        )
        if alive is False or (alive is None and silent) or (owner is None and locked):
            abandoned.append(trial)
    return abandoned


def claim(optuna_study: optuna.Study, trial: optuna.Trial) -> None:
    """Mark a trial as this driver's and record its first heartbeat."""
    record_driver(trial, DRIVER_ID)
    heartbeat(optuna_study, [trial])


def heartbeat(optuna_study: optuna.Study, trials: list[optuna.Trial]) -> None:
    """Tell other drivers these trials are alive."""
    optuna_internals.record_heartbeat(optuna_study, trials)


def enqueue_retry(
    optuna_study: optuna.Study,
    number: int,
    params: dict[str, Any],
    retried: TrialRecord,
    *,
    once: bool = True,
) -> bool:
    """Queue a trial's parameters again. With `once` (a node lost or unreachable), not when it already
    was a retry: a config that keeps killing nodes is not retried forever. A trial interrupted by its
    driver (a crash, Ctrl-C) is always run again: that said nothing about its settings."""
    if once and retried.retry_of is not None:
        return False
    optuna_study.enqueue_trial(dict(params), user_attrs=retry_marks(retried, number))
    return True


@contextlib.contextmanager
def study_lock(study: Study) -> Iterator[bool]:
    """Serialize "is budget left? ask for a trial" between drivers of one study; yields whether it did.

    PostgreSQL: an advisory lock keyed by the study name. SQLite: a lock file beside the database.
    Both end with the process that holds them, so a killed driver never keeps the study locked.
    """
    url = study.storage
    if url.startswith("postgresql"):
        import sqlalchemy

        engine = _lock_engines.setdefault(
            url, sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        )
        key = zlib.crc32(f"autotune:{study.name}".encode())
        with engine.connect() as connection:
            connection.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), {"k": key})
            try:
                yield True
            finally:
                connection.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), {"k": key})
                connection.commit()
        return
    if url.startswith("sqlite:///"):
        lock_path = Path(url[len("sqlite:///") :] + ".lock")
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield True
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    yield False


_lock_engines: dict[str, Any] = {}
