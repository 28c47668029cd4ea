"""Where a server's start-up went, read from its log: distributed init, weight load, KV pool, CUDA-graph
capture, and the time to ready.

SGLang's own `elapsed=` where it says it, else the log's timestamps. The log lines it reads, version by
version: docs/design.md, "Start-up phases".
"""

from __future__ import annotations

import re
from datetime import datetime

__all__ = ["DUMP_PHASE", "PAGE_CACHE_PHASE", "STARTUP_PHASES", "StartupPhaseReader", "startup_phases_text"]

# The node's step before the launch that keeps the part of its weights the page cache holds there
# (autotune.node.page_cache): node time, not part of the server's time to ready.
PAGE_CACHE_PHASE = "page_cache_s"
# The phases, in start-up order, under the names the trial records them by (seconds).
STARTUP_PHASES = (PAGE_CACHE_PHASE, "init_s", "weight_load_s", "kv_pool_s", "cuda_graph_s", "ready_s")
_LABELS = {
    PAGE_CACHE_PHASE: "page cache",
    "init_s": "init",
    "weight_load_s": "weights",
    "kv_pool_s": "KV pool",
    "cuda_graph_s": "CUDA graphs",
    "ready_s": "ready",
}

_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)[^\]]*\]")
_ELAPSED = r"(?:elapsed=|Time elapsed: )([0-9]+(?:\.[0-9]+)?) ?s"
_INIT_BEGIN = re.compile(r"Init torch distributed begin\.")
_INIT_END = re.compile(r"Init torch distributed ends\.")
_LOAD_BEGIN = re.compile(r"Load weight begin\.")
_LOAD_END = re.compile(r"Load weight end\.")
_KV_ALLOCATED = re.compile(r"KV Cache is allocated\.")
_KV_END = re.compile(r"Memory pool end\.")  # after the allocation line, where the version logs it
# One graph's capture end; the name ("target decode", "draft decode", ...; "" on 0.5.4) tells graphs
# apart, so each is counted once however many ranks log it.
_GRAPH_END = re.compile(r"Capture ((?:[a-z]+ ){0,3})cuda graph end\b", re.IGNORECASE)
_ELAPSED_IN = re.compile(_ELAPSED)
# A presharded launch that writes its dump (0.5.17 loader.py: load_model), and the checkpoint's shard bar at
# 100% (tqdm: `... shards: 100% Completed | 64/64 [04:00<00:00, ...]`): the weight load's time past the bar
# is the dump's, a one-time cost (`weight_dump_s`, part of weight_load_s).
DUMP_PHASE = "weight_dump_s"
_DUMPING = re.compile(r"No presharded checkpoint at \S+; doing first-time load and dump\.")
_SHARDS_DONE = re.compile(r"shards: +100% Completed \| (\d+)/\1 \[(?:(\d+):)?(\d+):(\d+)<")
# Phases timed between two markers where SGLang logs no `elapsed=` (before 0.5.17).
_MEASURED_BETWEEN = (("init_s", "init_begin", "init_end"), ("weight_load_s", "load_begin", "load_end"))


class StartupPhaseReader:
    """Reads a starting server's log lines, one at a time, and says how long each start-up phase took."""

    def __init__(self) -> None:
        self._at: dict[str, float] = {}  # marker -> seconds (log timestamp, else when seen)
        self._said: dict[str, float] = {}  # phase -> the seconds SGLang itself logged
        self._graphs: dict[str, float] = {}  # graph name -> its capture's logged seconds
        self._first_stamp: datetime | None = None
        self._first_seen: float | None = None
        self._dumping = False  # the launch loads its checkpoint to write a presharded dump
        self._shards_s: float | None = None  # the checkpoint's shard bar's time at 100%

    def take(self, line: str, seen_s: float) -> None:
        """One log line, seen `seen_s` seconds after the wait began."""
        at = self._when(line, seen_s)
        for name, marker in (
            ("init_begin", _INIT_BEGIN),
            ("init_end", _INIT_END),
            ("load_begin", _LOAD_BEGIN),
            ("load_end", _LOAD_END),
            ("kv_allocated", _KV_ALLOCATED),
            ("kv_end", _KV_END),
        ):
            if name in self._at or marker.search(line) is None:
                continue
            self._at[name] = at
            said = _ELAPSED_IN.search(line)
            if said is not None and name in ("init_end", "load_end"):
                self._said["init_s" if name == "init_end" else "weight_load_s"] = float(said.group(1))
        self._dumping = self._dumping or _DUMPING.search(line) is not None
        if self._dumping and "load_end" not in self._at:
            for hours, minutes, seconds in (m.groups()[1:] for m in _SHARDS_DONE.finditer(line)):
                self._shards_s = int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)
        graph = _GRAPH_END.search(line)
        if graph is not None:
            said = _ELAPSED_IN.search(line)
            key = graph.group(1).strip().lower()
            if said is not None and key not in self._graphs:
                self._graphs[key] = float(said.group(1))

    def logged_s(self) -> float:
        """The seconds SGLang itself logged for its phases (`elapsed=`), each phase and graph once: the
        node's own clock, where the driver's stopwatch runs another (a simulated node's scaled time)."""
        return sum(self._said.values()) + sum(self._graphs.values())

    def phases(self, ready_s: float | None = None) -> dict[str, float]:
        """Seconds per phase seen (STARTUP_PHASES' names, and DUMP_PHASE of a launch that wrote a presharded
        dump); `ready_s`, the launch-to-ready time the caller measured, is recorded as given."""
        found: dict[str, float] = {}
        found.update(self._said)
        for phase, (begin, end) in (
            ("init_s", ("init_begin", "init_end")),
            ("weight_load_s", ("load_begin", "load_end")),
        ):
            if phase not in found and begin in self._at and end in self._at:
                found[phase] = self._at[end] - self._at[begin]
        kv_end = self._at.get("kv_end", self._at.get("kv_allocated"))
        if "load_end" in self._at and kv_end is not None:
            found["kv_pool_s"] = max(kv_end - self._at["load_end"], 0.0)
        if self._graphs:
            found["cuda_graph_s"] = sum(self._graphs.values())
        if ready_s is not None:
            found["ready_s"] = ready_s
        phases = {phase: round(found[phase], 2) for phase in STARTUP_PHASES if phase in found}
        if self._shards_s is not None and "weight_load_s" in phases:
            phases[DUMP_PHASE] = round(max(phases["weight_load_s"] - self._shards_s, 0.0), 2)
        return phases

    def _when(self, line: str, seen_s: float) -> float:
        """Seconds since the first timestamped line, by the log's clock; else when the line was seen."""
        stamp = _STAMP.match(line)
        if stamp is None:
            return seen_s
        try:
            when = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return seen_s
        if self._first_stamp is None:
            self._first_stamp, self._first_seen = when, seen_s
        assert self._first_seen is not None  # set with the first stamp
        return self._first_seen + (when - self._first_stamp).total_seconds()


def startup_phases_text(phases: dict[str, float]) -> str:
    """`weights 601 s, KV pool 1 s, CUDA graphs 67 s, other 45 s, ready 714 s` for the phases recorded;
    `other` is what the named phases leave of the time to ready (Python imports and process start: 45 of
    55 s of a warm 8B start-up on the H200, benchmarks/RESULTS-sglang-h200.md)."""
    shown = [f"{_LABELS[p]} {phases[p]:.0f} s" for p in STARTUP_PHASES if phases.get(p) is not None]
    ready = phases.get("ready_s")
    if ready is not None:
        inside = [p for p in STARTUP_PHASES if p not in ("ready_s", PAGE_CACHE_PHASE)]
        other = ready - sum(phases.get(p) or 0.0 for p in inside)
        if other >= 1.0:
            shown.insert(len(shown) - 1, f"other {other:.0f} s")
    return ", ".join(shown)
