"""Scaling: trials per hour with 1, 2 and 4 simulated GPU nodes in one Ray cluster, Optuna's constant
liar on, and a check that no trial ran twice.

For each node count, `ray.cluster_utils.Cluster` starts a head and that many nodes on this machine, each
advertising one `gpu_node`; the study joins the cluster (`ray.address`) and runs one trial per discovered
node at a time (`ray.discover_nodes`), each node's simulated SGLang server on a port of its own
(`server.port: auto`). Storage, tracking and sampler are the product's defaults (the default TPE has
`constant_liar=True`, so parallel proposals stay apart). Trials per hour are in wall time at the
simulator's time scale (a ten-minute load takes 3 s), so only their ratios carry over to real nodes.

    python benchmarks/scaling.py            # 24 trials on 1, 2 and 4 nodes
    python benchmarks/scaling.py --quick    # a smoke run: 4 trials on 2 nodes, the clock 2.5x faster
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from model_studies import BENCHMARKS, SEARCH_SPACE, write_sim_study
from optuna.trial import TrialState

from autotune.config import Study
from autotune.errors import ConfigError
from autotune.node.pool import GPU_NODE_RESOURCE, NodePool, RayNodePool
from autotune.study.callbacks import StudyCallback, TrialFinished
from autotune.study.loop import StudyDriver
from autotune.study.records import BASELINE_ATTR, NODE_ATTR
from autotune.views.tracked import study_tracker

warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
OBJECTIVE = BENCHMARKS / "objectives" / "overhead.yaml"
SIM_ENV = {
    "SGLANG_SIM_HARDWARE": "rtx-pro-6000-pcie-x8",
    "SGLANG_SIM_MODEL": "kimi-k2.5-int4",
    "SGLANG_SIM_TIME_SCALE": "0.05",
}
STARTUP_SCALE, QUICK_STARTUP_SCALE = 0.005, 0.002  # a ten-minute weight load takes 3 s, or 1.2 s
NEEDS = (
    "a study on an existing Ray cluster that runs one node actor per `gpu_node` node "
    "(`ray: {address: ..., discover_nodes: true}`), and `server.port: auto` so that the simulated "
    "servers of several nodes on one machine do not collide"
)


@dataclass(frozen=True)
class Scaled:
    """One study on `nodes` nodes: its wall time and what ran where."""

    nodes: int
    trials: int
    wall_s: float
    nodes_used: int
    runs_per_trial: Counter[int]
    repeated_params: int
    states: Counter[str]
    trial_s: list[float]  # each launched trial, from Optuna's ask to its tell

    @property
    def busy(self) -> float:
        """The share of the nodes' wall time that trials held them."""
        return sum(self.trial_s) / (self.nodes * self.wall_s)

    @property
    def per_hour(self) -> float:
        return self.trials / self.wall_s * 3600


def write_study(folder: Path, n_trials: int, address: str, startup_scale: float = STARTUP_SCALE) -> Study:
    return write_sim_study(
        folder,
        "scaling",
        search_space=SEARCH_SPACE,
        objective=OBJECTIVE,
        n_trials=n_trials,
        server={"port": "auto", "env": {**SIM_ENV, "SGLANG_SIM_STARTUP_TIME_SCALE": str(startup_scale)}},
        nodes=[{"name": "sim", "address": "local"}],  # the template every discovered node shares
        sampler={"seed": 0},
        timeouts={"startup_s": 120, "benchmark_s": 120},
        ray={"address": address, "discover_nodes": True},
    )


def measure(nodes: int, n_trials: int, startup_scale: float) -> Scaled:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, resources={GPU_NODE_RESOURCE: 1})
        cluster.wait_for_nodes()
        marks: list[float] = []

        def pool(study: Study) -> NodePool:
            made = RayNodePool(study)
            marks.append(time.perf_counter())
            return made

        class Marks(StudyCallback):
            def trial_finished(self, event: TrialFinished) -> None:
                marks.append(time.perf_counter())

        with tempfile.TemporaryDirectory(prefix="autotune-scaling-") as folder:
            study = write_study(Path(folder), n_trials, cluster.address, startup_scale)
            optuna_study = StudyDriver(study, [Marks()], pool=pool, tracking=study_tracker).run()
            # Each launch leaves its trial's folder on the node that ran it: a trial run twice shows twice.
            runs = Counter(int(p.name.split("-")[1]) for p in (study.workdir / "nodes").glob("*/trial-*"))
            nodes_used = sum(1 for p in (study.workdir / "nodes").iterdir() if any(p.glob("trial-*")))
        launched = [t for t in optuna_study.trials if t.state.is_finished() and t.user_attrs.get(NODE_ATTR)]
        seen: set[tuple[tuple[str, str], ...]] = set()
        repeated = 0
        for trial in launched:
            key = tuple(sorted((k, repr(v)) for k, v in trial.params.items()))
            repeated += key in seen and not trial.user_attrs.get(BASELINE_ATTR)
            seen.add(key)
        states = Counter(t.state.name for t in optuna_study.trials if t.state is not TrialState.WAITING)
        spans = [
            (t.datetime_complete - t.datetime_start).total_seconds()
            for t in launched
            if t.datetime_complete and t.datetime_start
        ]
        return Scaled(nodes, len(launched), marks[-1] - marks[0], nodes_used, runs, repeated, states, spans)
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="1,2,4", help="comma-separated node counts")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--quick", action="store_true", help="a smoke run: 4 trials on 2 nodes, faster clock")
    args = parser.parse_args(argv)
    scale = STARTUP_SCALE
    if args.quick:
        args.nodes, args.trials, scale = "2", 4, QUICK_STARTUP_SCALE
    counts = sorted(int(n) for n in args.nodes.split(","))
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    with tempfile.TemporaryDirectory() as folder:
        try:
            write_study(Path(folder), 1, "127.0.0.1:6379")
        except ConfigError as exc:
            print(f"scaling.py needs {NEEDS}; this autotune does not have it yet:\n  {exc}")
            return 3
    started, load = time.monotonic(), os.getloadavg()[0]
    results = [measure(n, args.trials, scale) for n in counts]
    one = results[0]
    head = f"{'nodes':>5} {'trials':>7} {'wall s':>8} {'trials/hour':>12} {'vs ' + str(one.nodes):>8}"
    print(f"{head} {'mean trial s':>13} {'nodes busy':>11} {'same-length':>12}  checks")
    for r in results:
        twice = sorted(n for n, c in r.runs_per_trial.items() if c > 1)
        checks = (
            f"{r.nodes_used} nodes ran trials; "
            + (f"trials run twice: {twice}" if twice else "no trial run twice")
            + f"; {r.repeated_params} repeated configs; "
            + " ".join(f"{n} {s.lower()}" for s, n in sorted(r.states.items()))
        )
        ratio = r.per_hour / one.per_hour
        row = f"{r.nodes:>5} {r.trials:>7} {r.wall_s:>8.1f} {r.per_hour:>12.0f} {ratio:>7.2f}x"
        # What the ratio would be if trials kept their 1-node length: servers sharing this machine's CPUs
        # slow each other down, which GPU nodes of their own do not.
        same = ratio * statistics.mean(r.trial_s) / statistics.mean(one.trial_s)
        print(f"{row} {statistics.mean(r.trial_s):>13.2f} {r.busy:>11.0%} {same:>11.2f}x  {checks}")
    print(
        f"\n{time.monotonic() - started:.0f} s; {os.cpu_count()} CPU cores shared by every node and server; "
        f"load average (1 min) {load:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
