"""What the command groups share: the exit statuses, and opening a study that must already exist."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from autotune.config import Study
from autotune.errors import STOP_SIGNALS, AutotuneError, interrupt

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_NO_ANSWER = 3  # the study ran, but its baseline never completed: no gain to measure, no answer
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
    (130, "interrupted (Ctrl-C): the running trials were stopped; resume runs them again"),
    (129, "stopped by SIGHUP (a closed terminal), as by Ctrl-C"),
    (143, "stopped by SIGTERM (`timeout`, systemd, Slurm), as by Ctrl-C"),
    (EXIT_BROKEN_PIPE, "the reader of its output went away (a `head` that stopped reading)"),
)


def exit_interrupted(signum: int) -> int:
    """The status of a command stopped by a stop signal, as a shell reports a process it killed: 128 + n
    (Ctrl-C 130, SIGTERM 143, SIGHUP 129)."""
    return 128 + int(signum)


@contextmanager
def stop_signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise KeyboardInterrupt for the body, as Ctrl-C does, so that a command stopped by
    `timeout`, systemd, Slurm or a closed terminal stops its trials cleanly (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, interrupt) for sig in STOP_SIGNALS if sig is not signal.SIGINT}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


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


def no_such_trial(name: str, number: int, numbers: list[int]) -> AutotuneError:
    """`--trial N` names no trial of the study: the error says which trials it has."""
    if not numbers:
        return AutotuneError(f"study {name!r} has no trial {number}: it has no trials yet")
    return AutotuneError(f"study {name!r} has no trial {number}: its trials are {number_ranges(numbers)}")


def number_ranges(numbers: list[int]) -> str:
    """0, 1, 2, 3, 5, 7, 8 as `0-3, 5, 7-8`."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
