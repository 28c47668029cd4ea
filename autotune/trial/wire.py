"""What a node is asked to run and what it answers: the driver builds a request, a node returns a result.

Both cross a process boundary (a Ray actor, or the in-process pool's thread), so they hold plain data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from autotune.measure.client import BenchmarkResult, Workload
from autotune.measure.plan import MeasurementPlan
from autotune.trial.failures import Failure
from autotune.trial.launch import ServerLaunch

# Where a trial is on its node, as a pool reports it while it runs (the console and MLflow show it).
TRIAL_PHASES = (
    "idle", "waiting", "launching", "starting", "loading", "capturing", "ready", "benchmarking", "measuring",
    "stopping",
)  # fmt: skip


@dataclass(frozen=True)
class TrialRequest:
    """Everything a node needs to run one trial; built by the driver, run by the node."""

    number: int
    launch: ServerLaunch
    workload: Workload | None  # None for a job (see `job`), which sends no requests
    startup_timeout_s: float
    benchmark_timeout_s: float
    seed: int = 0
    # What to measure on the launch (a ladder, a short run first); None: one benchmark of `workload`.
    plan: MeasurementPlan | None = None
    # True: the launch is a job that measures itself and exits within benchmark_timeout_s (autotune.node.job).
    job: bool = False
    # Where its log goes in the node's folder: "" for the server study (trial-NNNN/), a subfolder for a
    # study of its own that shares the node (the NCCL stage: nccl-stage/trial-NNNN/), whose numbers repeat.
    log_folder: str = ""
    # One JIT/compile cache folder per node, kept across trials (the study file's startup.compile_cache).
    compile_cache: bool = True
    # SGLang's weight cache daemon kept across trials where it can serve the launch (startup.weight_cache,
    # where the node's SGLang version takes --weight-cache-mode; autotune.node.weight_cache).
    weight_cache: bool = False
    # SGLang's presharded weights where they make the launch's load cheaper (startup.presharded_weights,
    # where the node's SGLang version takes --load-format presharded; autotune.node.presharded).
    presharded_weights: bool = False
    # The part of the weights the page cache can hold kept there before the launch (autotune.node.page_cache).
    weights_in_page_cache: bool = False

    @property
    def serving_workload(self) -> Workload:
        """The workload of a server trial."""
        if self.workload is None:
            raise ValueError(f"`workload` must be set for a server trial, but trial {self.number} has none.")
        return self.workload


@dataclass(frozen=True)
class TrialResult:
    """What happened to one trial on the node: a benchmark result or a classified failure."""

    number: int
    node: str
    benchmark: BenchmarkResult | None
    failure: Failure | None
    startup_s: float | None
    benchmark_s: float | None
    phase_times: dict[str, float] = field(default_factory=dict)
    log: str = ""
    returncode: int | None = None
    server_pgid: int | None = None  # the process group the trial's server ran in (gone when this returns)
    port: int | None = None  # the port the server listened on (the node picks it for `port: auto`)
    metrics: dict[str, float] = field(default_factory=dict)  # a job trial's measurement
    details: dict[str, Any] = field(default_factory=dict)  # a job trial's whole result line
    # What the server chose for flags left unset (--mem-fraction-static, ...), from its log.
    server_choices: dict[str, float] = field(default_factory=dict)
    # The server's memory report (KV cache tokens and GB, max_total_num_tokens, available_gpu_mem_gb, ...).
    server_memory: dict[str, float] = field(default_factory=dict)
    # Where the start-up went, in seconds: init_s, weight_load_s, kv_pool_s, cuda_graph_s, ready_s (those the
    # log showed; autotune.node.startup_phases).
    startup_phases: dict[str, float] = field(default_factory=dict)
    # What the node changed in the launch to start it faster, in a sentence each (autotune.node.startup_prep).
    startup_notes: tuple[str, ...] = ()
    # The node's own seconds for the launch where its clock is not the driver's (a simulated node's scaled
    # time: autotune.node.node_time); None where start-up and benchmark seconds are the node's.
    node_s: float | None = None
    # Logs of the node's own processes for this trial beside the server's (the weight cache daemon's), by
    # the artifact name they are kept under.
    other_logs: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.failure is None and (self.benchmark is not None or bool(self.metrics))

    @property
    def node_seconds(self) -> float | None:
        """The node time this launch spent (start-up, benchmark, or both until it failed), in the node's
        own clock: the one count of node hours that budgets, status, MLflow and the benchmarks share."""
        if self.node_s is not None:
            return self.node_s
        if self.startup_s is None and self.benchmark_s is None:
            return None
        return (self.startup_s or 0.0) + (self.benchmark_s or 0.0)

    def summary(self) -> dict[str, object]:
        """A JSON-ready record of the result (the log left out)."""
        data = asdict(self)
        data.pop("log")
        data.pop("other_logs")
        return data
