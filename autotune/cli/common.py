"""What the command groups share: the exit statuses, and opening a study that must already exist."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.config import Study
from autotune.errors import AutotuneError

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_NO_ANSWER = 3  # the study ran, but its baseline never completed: no gain to measure, no answer
EXIT_INTERRUPTED = 130
# The reader of stdout went away (`autotune status | head`): the status a Unix tool killed by SIGPIPE has.
EXIT_BROKEN_PIPE = 141


def existing_study(study: Study) -> Any:
    """Load the study from its storage without creating anything when it does not exist."""
    import optuna

    if study.storage.startswith("sqlite:///") and not Path(study.storage[len("sqlite:///") :]).exists():
        raise AutotuneError(
            f"no study {study.name!r} yet in {study.storage}: start it with `autotune run {study.path}`"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        return optuna.load_study(study_name=study.name, storage=study.storage)
    except KeyError:
        raise AutotuneError(
            f"no study {study.name!r} in {study.storage}: start it with `autotune run {study.path}`"
        ) from None
