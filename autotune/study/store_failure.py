"""The study's Optuna storage cannot be written (a full disk, a database gone): the study stops, with one
sentence saying what filled and how to resume. MLflow failing is not this: the tracker writes its runs
later (autotune.tracking.tracker.StudyTracker.catch_up); the storage is the study's record.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from optuna.exceptions import StorageInternalError

from autotune.config import Study
from autotune.errors import AutotuneError

# SQLAlchemy's "(sqlite3.OperationalError) database or disk is full", within MLflow's and Optuna's messages.
_DRIVER_ERROR = re.compile(r"\((?:\w+\.)*\w+\) (.+)")
_FULL = ("database or disk is full", "no space left on device", "disk full", "could not extend file")


class StorageUnwritable(AutotuneError):
    """The study's storage refused a write; the running trials were stopped, a resume runs them again."""


def storage_unwritable(study: Study, error: BaseException) -> StorageUnwritable | None:
    """The error to stop the study with when `error` is the storage refusing a write, else None."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    if not any(isinstance(e, StorageInternalError) for e in chain):
        return None
    reason = short_reason(error)
    resume = f"then `autotune resume {study.path}` (the trials that were running run again)"
    if any(words in reason.lower() for words in _FULL):
        where = _database_folder(study.storage)
        disk = f"the disk that holds {where}" if where is not None else "the database server's disk"
        free = f" ({shutil.disk_usage(where).free >> 20} MiB free)" if where is not None else ""
        return StorageUnwritable(
            f"stopped: the study's storage {study.storage} could not be written because {disk} is "
            f"full{free}; free space there, {resume}"
        )
    return StorageUnwritable(
        f"stopped: the study's storage {study.storage} could not be written ({reason}); fix it, {resume}"
    )


def short_reason(error: BaseException) -> str:
    """What a database error says, in its own words, without the SQL and the library's advice: the
    database driver's message where the chain of causes holds one, else the first line."""
    chain: list[BaseException] = []
    cause: BaseException | None = error
    while cause is not None and cause not in chain:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    for exc in reversed(chain):
        for line in str(exc).splitlines():
            if found := _DRIVER_ERROR.search(line):
                return found.group(1).strip()
    lines = [line for line in str(error).splitlines() if line.strip()]
    return lines[0].strip() if lines else type(error).__name__


def _database_folder(url: str) -> Path | None:
    if not url.startswith("sqlite:///"):
        return None
    folder = Path(url[len("sqlite:///") :]).parent
    return folder if folder.is_dir() else None
