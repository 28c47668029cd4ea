"""autotune's exceptions. Every exception class autotune defines derives from `AutotuneError` (the CLI
prints one as a one-line message), except private ones (a leading underscore) that never leave their
module. A function given arguments that break its documented contract raises ValueError or TypeError, as
Python's own functions do: that is a bug of the caller, not an error of the study. The stop signals
(SIGTERM, SIGHUP) raise KeyboardInterrupt, as Ctrl-C does, through `interrupt`."""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

# What stops autotune as Ctrl-C does: `timeout`, systemd and Slurm send SIGTERM, a closed terminal SIGHUP.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def interrupt(signum: int, frame: FrameType | None = None) -> NoReturn:
    """A handler for the stop signals: raise KeyboardInterrupt, as Ctrl-C does, standing for `signum`."""
    raise KeyboardInterrupt(signal.Signals(signum))


def stop_signal(exc: BaseException) -> signal.Signals:
    """The stop signal a KeyboardInterrupt stands for: the one `interrupt` was given, else SIGINT."""
    return exc.args[0] if exc.args and isinstance(exc.args[0], signal.Signals) else signal.SIGINT


class AutotuneError(Exception):
    """Root of every exception class autotune defines. Every one survives pickling (a worker process or
    a Ray actor sends it back to the driver), whatever its `__init__` takes."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Exception's own reduce rebuilds as cls(*self.args), which fails for an __init__ of other arguments.
        return (_unpickled, (type(self), self.args, self.__dict__))


def _unpickled(cls: type[AutotuneError], args: tuple[Any, ...], state: dict[str, Any]) -> AutotuneError:
    """An exception rebuilt from its message arguments and attributes without calling its `__init__`."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class ConfigError(AutotuneError):
    """A user's file is wrong: names the file, the field, the value received and the fix."""

    def __init__(self, path: Path | str, field: str, value: Any, problem: str, fix: str) -> None:
        self.path = Path(path)
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        where = f"{self.path}: {field}" if field else str(self.path)
        super().__init__(f"{where}: {problem} (got {value!r}). {fix}")


class ForbiddenLaunchError(AutotuneError):
    """A launch would use a value the study file says must never be launched."""


class ProblemError(AutotuneError):
    """What is wrong and what to do about it, read as one line: `problem. fix` (a user's file: ConfigError,
    which also names the file, the field and the value)."""

    def __init__(self, problem: str, fix: str) -> None:
        self.problem = problem
        self.fix = fix
        super().__init__(f"{problem}. {fix}")


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """Return ' Did you mean 'x'?' for the closest choice, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


# The error type of the rules autotune's own validators raise (see `rule_error`).
RULE_ERROR = "autotune_rule"


_NO_VALUE: Any = object()


def rule_error(
    problem: str, *, loc: tuple[str | int, ...] = (), value: Any = _NO_VALUE, fix: str
) -> Exception:
    """An error for a pydantic validator to raise, which `autotune.config` turns into a `ConfigError`:
    `loc` is relative to the raising model, `value` the value received (left out: none is shown)."""
    # Imported here: a job (autotune.node.job) imports this module and must not load pydantic.
    from pydantic_core import PydanticCustomError

    context: dict[str, Any] = {"loc": loc, "fix": fix}
    if value is not _NO_VALUE:
        context["value"] = value
    return PydanticCustomError(RULE_ERROR, problem, context)
