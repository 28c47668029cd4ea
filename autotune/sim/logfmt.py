"""SGLang's log line formats, written by the simulated node to stderr.

SGLang configures Python logging as `[%(asctime)s{prefix}] %(message)s` with `%Y-%m-%d %H:%M:%S` dates, the
prefix being ` DP{d}`, ` TP{t}`, ` EP{e}` for sizes above one and empty in the main process; uvicorn's lines
add `INFO:     ` after the date; tqdm bars carry no prefix at all. Every line is flushed at once, so a
log watcher sees a fatal line the moment it is written.
"""

from __future__ import annotations

import datetime
from typing import TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}
DEBUG, INFO, WARNING, ERROR = 10, 20, 30, 40


def rank_prefix(tp_rank: int, tp_size: int, dp_rank: int = 0, dp_size: int = 1, ep_size: int = 1) -> str:
    """The part SGLang puts after the date for one scheduler rank: ' DP0 TP3 EP3', or '' for one GPU."""
    prefix = ""
    if dp_size > 1:
        prefix += f" DP{dp_rank}"
    if tp_size > 1:
        prefix += f" TP{tp_rank}"
    if ep_size > 1:
        prefix += f" EP{tp_rank // max(tp_size // ep_size, 1)}"
    return prefix


def format_interval(seconds: float) -> str:
    """tqdm's elapsed/remaining format: MM:SS, or H:MM:SS from an hour on."""
    total = int(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours:d}:{minutes:02d}:{secs:02d}" if hours else f"{minutes:02d}:{secs:02d}"


def tqdm_line(desc: str, done: int, total: int, elapsed_s: float, remaining_s: float | None = None) -> str:
    """One line of SGLang's tqdm bars: `desc:  19% Completed | 12/64 [01:54<08:02,  9.51s/it]`."""
    percentage = 100.0 * done / total if total else 100.0
    if done and elapsed_s > 0:
        rate = done / elapsed_s
        # tqdm without unit scaling: a 5.2f number, per item when slower than one a second.
        rate_fmt = f"{1 / rate:5.2f}s/it" if rate < 1 else f"{rate:5.2f}it/s"
        left = (total - done) / rate if remaining_s is None else remaining_s
        remaining = format_interval(left)
    else:
        rate_fmt, remaining = "?it/s", "?"
    return (
        f"{desc}: {percentage:3.0f}% Completed | {done}/{total} "
        f"[{format_interval(elapsed_s)}<{remaining}, {rate_fmt}]"
    )


class SimLog:
    """Writes SGLang-formatted lines to one stream, honouring `--log-level`; flushes after every line."""

    def __init__(self, stream: TextIO, level: str = "info", http_level: str | None = None) -> None:
        self.stream = stream
        self.level = LEVELS.get(level.lower(), INFO)
        self.http_level = LEVELS.get((http_level or level).lower(), INFO)

    @staticmethod
    def _now() -> str:
        return datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")

    def _write(self, text: str) -> None:
        self.stream.write(text if text.endswith("\n") else text + "\n")
        self.stream.flush()

    def log(self, message: str, prefix: str = "", level: int = INFO) -> None:
        """A logging record: `[date{prefix}] message`; a multi-line message keeps its later lines bare."""
        if level >= self.level:
            self._write(f"[{self._now()}{prefix}] {message}")

    def info(self, message: str, prefix: str = "") -> None:
        self.log(message, prefix, INFO)

    def warning(self, message: str, prefix: str = "") -> None:
        self.log(message, prefix, WARNING)

    def error(self, message: str, prefix: str = "") -> None:
        self.log(message, prefix, ERROR)

    def uvicorn(self, message: str, level: int = INFO) -> None:
        """A uvicorn line as SGLang formats it: `[date] INFO:     message`."""
        if level >= self.http_level:
            name = {DEBUG: "DEBUG", INFO: "INFO", WARNING: "WARNING", ERROR: "ERROR"}.get(level, "INFO")
            self._write(f"[{self._now()}] {name + ':':<9} {message}")

    def raw(self, text: str, level: int | None = None) -> None:
        """A line written around logging: a tqdm bar (always shown) or a bare pre-logging warning."""
        if level is None or level >= self.level:
            self._write(text)
