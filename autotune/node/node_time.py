"""A launch's node time in the node's own clock, where that clock is not the driver's.

A real node's start-up and benchmark seconds are the driver's stopwatch. A simulated node runs its clock
scaled (SGLANG_SIM_TIME_SCALE, SGLANG_SIM_STARTUP_TIME_SCALE: a ten-minute weight load in 0.6 s), so the
stopwatch says little about the hours a real node would have spent. Its log says them, as real SGLang's
does: the `elapsed=` of each start-up phase (init, weight load, CUDA-graph capture), in the node's time;
and the benchmark reports how long the server served in its own time (`time_scale`, from its /server_info,
converts the client's clock). On a real node (scale 1, phases inside the wall time) both give the stopwatch
back, so the rule needs no switch.
"""

from __future__ import annotations

from autotune.node.startup_phases import StartupPhaseReader

__all__ = ["logged_startup_s", "node_seconds"]


def logged_startup_s(log: str) -> float:
    """The start-up phases' seconds the server's log reports, each phase once (every TP rank prints it)."""
    reader = StartupPhaseReader()
    for line in log.splitlines():
        reader.take(line, 0.0)
    return reader.logged_s()


def node_seconds(
    startup_s: float | None,
    benchmark_s: float | None,
    log: str,
    time_scale: float | None = None,
    served_s: float | None = None,
) -> float | None:
    """The launch's node seconds: start-up as the longer of the stopwatch and the phases the log reports;
    the benchmark's stopwatch with the `served_s` seconds the server served (in its own time, every run of
    the measurement) counted at the node's pace instead of at `time_scale` (real seconds per server second;
    1 on a real node): the client's own seconds are the same on either clock."""
    if startup_s is None and benchmark_s is None:
        return None
    startup = max(startup_s, logged_startup_s(log)) if startup_s is not None else 0.0
    bench = benchmark_s or 0.0
    if time_scale is not None and time_scale > 0 and served_s is not None and bench:
        bench += served_s * (1.0 - time_scale)
    return startup + bench
