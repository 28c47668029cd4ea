"""Every figure autotune names, once: which way is better, whether a study may optimize it, what reports it.

The serving benchmark's figures are fields of `autotune.measure.client.BenchmarkResult`; the NCCL all-reduce
job's are keys of its result's `metrics` (`autotune.measure.nccl`, which also reports each message size's
`allreduce_us.<size>`). The objective's metrics, the figures MLflow logs of a serving trial and the figures
`compare` measures are views of this one catalogue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Literal

__all__ = [
    "ALLREDUCE_METRICS",
    "BENCHMARK_FIGURES",
    "CATALOGUE",
    "OBJECTIVE_METRICS",
    "Direction",
    "Metric",
    "maximizes",
]

Direction = Literal["maximize", "minimize"]


def maximizes(direction: Enum | str) -> bool:
    """Higher is better: Optuna's `StudyDirection.MAXIMIZE`, or "maximize" as a study file writes it."""
    # By name, so the node side (which reads a study file's goal) need not load Optuna for this rule.
    return (direction if isinstance(direction, str) else direction.name).lower() == "maximize"


@dataclass(frozen=True)
class Metric:
    """One figure: `better` is the direction that means better (None: a record of the run, such as its
    duration); `objective`: a study may optimize it or put a limit on it; `job`: the all-reduce job reports
    it, otherwise the serving benchmark does; `needs_slo`: it counts requests that met workload.slo."""

    better: Direction | None
    objective: bool = True
    job: bool = False
    needs_slo: bool = False
    needs_turns: bool = False  # only a workload of sessions (or a trace with session ids) measures it
    unit: str = ""  # as the console prints it after a value


_RECORD = Metric(None, objective=False)

CATALOGUE: Mapping[str, Metric] = MappingProxyType(
    {
        "output_throughput": Metric("maximize", unit="tok/s"),
        "request_throughput": Metric("maximize", unit="req/s"),
        # set by the workload, not by the config
        "input_throughput": Metric("maximize", objective=False, unit="tok/s"),
        "mean_ttft_ms": Metric("minimize", unit="ms"),
        "p50_ttft_ms": Metric("minimize", unit="ms"),
        "p99_ttft_ms": Metric("minimize", unit="ms"),
        "mean_itl_ms": Metric("minimize", unit="ms"),
        "p50_itl_ms": Metric("minimize", unit="ms"),
        "p99_itl_ms": Metric("minimize", unit="ms"),
        "mean_e2e_latency_ms": Metric("minimize", objective=False, unit="ms"),
        "p50_e2e_latency_ms": Metric("minimize", unit="ms"),
        "p99_e2e_latency_ms": Metric("minimize", unit="ms"),
        "duration_s": Metric(None, objective=False, unit="s"),
        "completed": _RECORD,
        "failed": _RECORD,
        "time_scale": _RECORD,
        # With workload.slo: good requests per second, and the share of requests that were good.
        "request_goodput": Metric("maximize", needs_slo=True, unit="req/s"),
        "slo_attainment": Metric("maximize", needs_slo=True),
        # With load_search: the highest request rate (or concurrency) at which the SLO held.
        "max_load": Metric("maximize", needs_slo=True),
        # With a workload that shares prefixes (autotune.measure.sharing): the share of prompt tokens the
        # server served from its prefix cache, the share the workload was designed to share, and sessions'
        # TTFT of their first turns and of their later ones.
        "cache_hit_rate": Metric("maximize", objective=False),
        "designed_hit_rate": _RECORD,
        "mean_ttft_first_turn_ms": Metric("minimize", needs_turns=True, unit="ms"),
        "mean_ttft_later_turns_ms": Metric("minimize", needs_turns=True, unit="ms"),
        # `kind: nccl_allreduce` objectives' (see autotune.config.allreduce).
        # us per all-reduce, the messages' weighted mean
        "allreduce_us": Metric("minimize", job=True, unit="µs"),
        # GPU memory NCCL took on the hungriest rank
        "nccl_memory_mib": Metric("minimize", job=True, unit="MiB"),
        # GPU memory in use after warm-up, CUDA context too
        "gpu_used_mib": Metric("minimize", job=True, unit="MiB"),
    }
)

# What an objective may name, each with the direction that means better.
OBJECTIVE_METRICS: Mapping[str, Direction] = MappingProxyType(
    {name: m.better for name, m in CATALOGUE.items() if m.objective and m.better is not None}
)
# The all-reduce job's objective metrics (all lower is better).
ALLREDUCE_METRICS: Mapping[str, Direction] = MappingProxyType(
    {name: better for name, better in OBJECTIVE_METRICS.items() if CATALOGUE[name].job}
)
# The serving benchmark's figures, as MLflow logs each measurement (BenchmarkResult fields).
BENCHMARK_FIGURES: tuple[str, ...] = tuple(name for name, m in CATALOGUE.items() if not m.job)
