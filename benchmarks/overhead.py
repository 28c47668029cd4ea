"""Overhead: the time autotune adds to each trial beyond the server's own start-up and benchmark, and the
teardown time until the server's port is free again.

A real study (SQLite storage, MLflow tracking, the default sampler) runs simulated SGLang servers as real
processes on this machine, their clock sped up so a ten-minute weight load takes 0.6 s, through each pool
in turn: `LocalNodePool` with a `TrialExecutor` (no Ray) and `RayNodePool` (one Ray actor). The same seed
proposes the same trials in both. A trial's overhead is the wall time from the end of the trial before it
to its own end, less the start-up and benchmark seconds the node reports for it; the first trial, which
also pays for the node's first start (a Ray worker, imports), is left out of the median. Where the time
goes is measured by timing the calls that make it up (Optuna, MLflow, the launch and teardown on the node).

    python benchmarks/overhead.py             # 20 trials through each pool
    python benchmarks/overhead.py --quick     # 4 trials, local pool only
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import statistics
import tempfile
import threading
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
from model_studies import BENCHMARKS, SEARCH_SPACE, write_sim_study

import autotune.study.loop
import autotune.study.run_state
from autotune.config import Study
from autotune.config.search_space import SearchSpace
from autotune.node.executor import TrialExecutor
from autotune.node.pool import LocalNodePool, NodePool, RayNodePool
from autotune.node.runner import LocalCommandRunner, ServerProcess, free_port
from autotune.study.callbacks import StudyCallback, TrialFinished
from autotune.study.loop import StudyDriver
from autotune.tracking.tracker import StudyTracker
from autotune.trial.redaction import Secrets
from autotune.views.tracked import study_tracker

warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
TARGET_S = 0.5
OBJECTIVE = BENCHMARKS / "objectives" / "overhead.yaml"
SIM_ENV = {
    "SGLANG_SIM_HARDWARE": "rtx-pro-6000-pcie-x8",
    "SGLANG_SIM_MODEL": "kimi-k2.5-int4",
    "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001",  # a ten-minute weight load takes 0.6 s
    "SGLANG_SIM_TIME_SCALE": "0.01",
}
PLOTS = "MLflow: study view (description, best launch.sh, plots)"
# Where the driver's time goes, by what it calls; each label adds up every call from any thread.
DRIVER_CALLS: Sequence[tuple[Any, str, str]] = (
    (optuna.study.Study, "ask", "Optuna: ask"),
    (SearchSpace, "suggest", "Optuna: sample the trial's parameters"),
    (optuna.study.Study, "tell", "Optuna: tell"),
    (optuna.trial.Trial, "set_user_attr", "Optuna: trial attributes and constraints"),
    (optuna.trial.Trial, "set_constraint", "Optuna: trial attributes and constraints"),
    (optuna.trial.Trial, "report", "Optuna: trial attributes and constraints"),
    (autotune.study.run_state, "study_summary", "study summary (reads every trial)"),  # after each trial
    (autotune.study.loop, "study_summary", "study summary (reads every trial)"),  # the study's end
    (StudyTracker, "start_trial", "MLflow: create the trial's run"),
    (StudyTracker, "finish_trial", "MLflow: finish the trial's run, log and artifacts"),
    (StudyTracker, "update_summary", "MLflow: study summary metrics"),
    (StudyTracker, "refresh_study_view", PLOTS),
)
CONCURRENT = "MLflow: live phase of the running trial"  # runs while the node works, off the critical path
LAUNCH, PORT_CHECK, STOP, PORT_FREE = (
    "node: start the server process",
    "node: check the port is free before launch",
    "node: stop the server's process group",
    "node: wait until the port is free after stop",
)


class Stopwatch:
    """Adds up the wall time spent in chosen functions, by label, from any thread; restores them on exit."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.longest: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        self._restore = ExitStack()

    def add(self, label: str, seconds: float) -> None:
        with self._lock:
            self.seconds[label] += seconds
            self.calls[label] += 1
            self.longest[label] = max(self.longest[label], seconds)

    def timed(
        self, label: str, function: Callable[..., Any], spy: Callable[..., None] | None = None
    ) -> Callable[..., Any]:
        """`function`, timed under `label`; `spy` sees the arguments of each call first."""

        @functools.wraps(function)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if spy is not None:
                spy(*args, **kwargs)
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.add(label, time.perf_counter() - started)

        return timed

    def watch(self, owner: Any, name: str, label: str, spy: Callable[..., None] | None = None) -> None:
        original = getattr(owner, name)
        setattr(owner, name, self.timed(label, original, spy))
        self._restore.callback(setattr, owner, name, original)

    def __enter__(self) -> Stopwatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore.close()


class TimedRunner(LocalCommandRunner):
    """A local command runner that times the launch, the server's stop, and both port waits."""

    def __init__(self, stopwatch: Stopwatch, state_dir: Path) -> None:
        super().__init__(state_dir)
        self.stopwatch = stopwatch
        self.teardowns: list[float] = []
        self._stopped_at: float | None = None

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, secrets: Secrets | None = None
    ) -> ServerProcess:
        process = self.stopwatch.timed(LAUNCH, super().start)(argv, env, log_path, secrets=secrets)
        stop = self.stopwatch.timed(STOP, process.stop)

        def stop_and_remember(grace_s: float = 10.0) -> int | None:
            if self._stopped_at is None:
                self._stopped_at = time.perf_counter()
            return stop(grace_s)

        process.stop = stop_and_remember
        return process

    def wait_port_free(self, host: str, port: int, timeout_s: float) -> bool:
        stopped_at, self._stopped_at = self._stopped_at, None
        label = PORT_CHECK if stopped_at is None else PORT_FREE
        free = self.stopwatch.timed(label, super().wait_port_free)(host, port, timeout_s)
        if stopped_at is not None:
            self.teardowns.append(time.perf_counter() - stopped_at)
        return free


@dataclass
class Measured:
    """One study through one pool: per-trial spans and node-reported times, and the stopwatch's totals."""

    pool: str
    setup_s: float = 0.0
    spans: list[float] = field(default_factory=list)  # end of the previous trial (or loop start) to this end
    node_s: list[float] = field(default_factory=list)  # start-up + benchmark as the node reports them
    states: list[str] = field(default_factory=list)
    reported: dict[int, tuple[float, str]] = field(default_factory=dict)  # trial -> (node seconds, state)
    stopwatch: Stopwatch = field(default_factory=Stopwatch)
    teardowns: list[float] = field(default_factory=list)

    @property
    def overheads(self) -> list[float]:
        return [span - node for span, node in zip(self.spans, self.node_s, strict=True)]

    @property
    def steady(self) -> list[float]:
        """Overheads without the first trial's (which also pays for the node's first start)."""
        return self.overheads[1:] or self.overheads


def write_study(folder: Path, n_trials: int, port: int) -> Study:
    return write_sim_study(
        folder,
        "overhead",
        search_space=SEARCH_SPACE,
        objective=OBJECTIVE,
        n_trials=n_trials,
        server={"port": port, "env": SIM_ENV},
        sampler={"seed": 0},
        timeouts={"startup_s": 60, "benchmark_s": 60},
    )


@contextmanager
def watched(stopwatch: Stopwatch, measured: Measured) -> Iterator[None]:
    """Time the driver's calls, and take each finished trial's node times from what it logs to MLflow."""

    def record(_tracker: StudyTracker, _run_id: str, **kwargs: Any) -> None:
        metrics = kwargs["metrics"]
        node_s = metrics.get("startup_s", 0.0) + metrics.get("benchmark_s", 0.0)
        measured.reported[kwargs["number"]] = (node_s, kwargs["state"])

    for owner, name, label in DRIVER_CALLS:
        stopwatch.watch(
            owner, name, label, record if (owner, name) == (StudyTracker, "finish_trial") else None
        )
    stopwatch.watch(StudyTracker, "set_phase", CONCURRENT)
    with stopwatch:
        yield


def measure(pool_kind: str, n_trials: int) -> Measured:
    measured = Measured(pool_kind)
    stopwatch = measured.stopwatch
    marks: list[float] = []
    finished: list[int] = []

    class Marks(StudyCallback):
        def trial_finished(self, event: TrialFinished) -> None:
            marks.append(time.perf_counter())
            finished.append(event.number)

    with tempfile.TemporaryDirectory(prefix="autotune-overhead-") as folder:
        study = write_study(Path(folder), n_trials, free_port())

        def pool(study: Study) -> NodePool:
            if pool_kind == "ray":
                made: NodePool = RayNodePool(study)
            else:  # the executor a node actor makes for `address: local`, its runner timed
                workdir = study.workdir / "nodes" / "local"
                runner = TimedRunner(stopwatch, workdir)
                measured.teardowns = runner.teardowns
                made = LocalNodePool({"local": TrialExecutor("local", runner, workdir)})
            marks.append(time.perf_counter())  # the loop starts now: what came before is set-up
            return made

        started = time.perf_counter()
        with watched(stopwatch, measured):
            StudyDriver(study, [Marks()], pool=pool, tracking=study_tracker).run()
        if pool_kind == "ray":
            import ray

            ray.shutdown()
    measured.setup_s = marks[0] - started
    measured.spans = [b - a for a, b in itertools.pairwise(marks)]
    # A trial refused before launch (never_launch) reports no node time: it ran on no node.
    measured.node_s = [measured.reported.get(n, (0.0, ""))[0] for n in finished]
    measured.states = [measured.reported.get(n, (0.0, "FAIL"))[1] for n in finished]
    return measured


def print_report(results: list[Measured]) -> None:
    width = 58
    print("Per-trial time autotune adds beyond the server's start-up and benchmark (seconds)")
    print(f"{'':<{width}}" + "".join(f"{m.pool + ' pool':>32}" for m in results))
    rows: list[tuple[str, Callable[[Measured], str]]] = [
        ("trials (states)", lambda m: f"{len(m.spans)} ({_states(m.states)})"),
        ("median overhead per trial, first trial left out", lambda m: f"{statistics.median(m.steady):.3f}"),
        ("max overhead per trial, first trial left out", lambda m: f"{max(m.steady):.3f}"),
        ("overhead of the first trial", lambda m: f"{m.overheads[0]:.3f}"),
        ("mean node-reported start-up + benchmark", lambda m: f"{statistics.mean(m.node_s):.3f}"),
        ("once per study: open it, MLflow, start the pool", lambda m: f"{m.setup_s:.3f}"),
    ]
    for label, cell in rows:
        print(f"{label:<{width}}" + "".join(f"{cell(m):>32}" for m in results))
    for m in results:
        median = statistics.median(m.steady)
        verdict = "under" if median < TARGET_S else "OVER"
        print(
            f"{m.pool} pool: median overhead {median:.3f} s per trial, {verdict} the target of {TARGET_S} s"
        )

    print("\nWhere it goes: seconds per trial, by what the time is spent in (all trials, means)")
    labels = list(
        dict.fromkeys([label for _, _, label in DRIVER_CALLS] + [LAUNCH, PORT_CHECK, STOP, PORT_FREE])
    )
    print(f"{'':<{width}}" + "".join(f"{m.pool + ' pool':>32}" for m in results))
    for label in labels:
        print(f"{label:<{width}}" + "".join(f"{_per_trial(m, label):>32}" for m in results))
    print(f"{'not timed above (loop, Ray, logs, storage heartbeats)':<{width}}", end="")
    for m in results:
        named = sum(m.stopwatch.seconds.get(label, 0.0) for label in labels) / len(m.spans)
        print(f"{statistics.mean(m.overheads) - named:>32.3f}", end="")
    print(
        f"\n{CONCURRENT + ' (concurrent)':<{width}}"
        + "".join(f"{_per_trial(m, CONCURRENT):>32}" for m in results)
    )
    print("(node: rows are timed on the local pool only; on the Ray pool they run inside the actor)")
    for m in results:
        print(
            f"{m.pool} pool: the study view took {m.stopwatch.longest[PLOTS]:.2f} s at its longest "
            f"({m.stopwatch.calls[PLOTS]} calls): the trials after which the plots are redrawn pay for it"
        )

    local = next((m for m in results if m.pool == "local"), None)
    if local and local.teardowns:
        t = sorted(local.teardowns)
        print(
            f"\nTeardown until the port is free (stop the process group, then bind the port), "
            f"{len(t)} servers: median {statistics.median(t):.3f} s, max {t[-1]:.3f} s"
        )


def _per_trial(m: Measured, label: str) -> str:
    if label not in m.stopwatch.seconds:
        return "-"
    return f"{m.stopwatch.seconds[label] / len(m.spans):.3f}"


def _states(states: list[str]) -> str:
    counts: dict[str, int] = defaultdict(int)
    for state in states:
        counts[state] += 1
    words = {"COMPLETE": "ok", "PRUNED": "pruned", "FAIL": "failed"}
    return " ".join(f"{n} {words.get(state, state.lower())}" for state, n in sorted(counts.items()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--pools", default="local,ray", help="comma-separated: local, ray")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 trials, local pool only")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.pools = 4, "local"
    pools = [p for p in args.pools.split(",") if p]
    if not set(pools) <= {"local", "ray"} or not pools:
        parser.error(f"--pools takes local and/or ray, but got {args.pools!r}")
    if args.trials < 2:
        parser.error(f"--trials must be at least 2 (the first is left out), but got {args.trials}")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    started, load = time.monotonic(), os.getloadavg()[0]
    results = [measure(pool, args.trials) for pool in pools]
    print_report(results)
    print(
        f"\n{time.monotonic() - started:.0f} s on {os.cpu_count()} CPU cores; load average (1 min) "
        f"{load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end: other processes slow the driver too"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
