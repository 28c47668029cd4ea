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

# What each exit status means: `autotune --help` prints it, the README's table holds the same rows.
EXIT_STATUSES: tuple[tuple[int, str], ...] = (
    (0, "done: the command did what it was asked (a study: ran and printed its answer)"),
    (
        EXIT_FAILED,
        "an error stopped it (a node check, a storage that cannot be written): its message says what to do",
    ),
    (EXIT_USAGE, "bad input: a study file, an option, or the tracking store it names; nothing was started"),
    (EXIT_NO_ANSWER, "the study ran but has no answer: its baseline (SGLang's defaults) never completed"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C): the running trials were stopped; resume runs them again"),
    (EXIT_BROKEN_PIPE, "the reader of its output went away (a `head` that stopped reading)"),
)


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
