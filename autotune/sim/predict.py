"""The model's own answer for a launch, without a server: tok/s, memory, or the failure SGLang would hit.

`predict` parses the same SGLang flags and NCCL environment as the simulated server and plays the same
scheduler, instantly, so tests and benchmarks can ask what a config is worth.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.sim.engine import WorkloadResult, run_workload
from autotune.sim.model import LaunchSettings, MemoryPlan, NodePerformanceModel
from autotune.sim.model.noise import SimNoise
from autotune.sim.profiles import HardwareProfile, ModelProfile, StandardWorkload
from autotune.sim.server_args import build_parser, check_server_args
from autotune.sim.versions import DEFAULT_VERSION, VERSIONS, SglangVersion


@dataclass(frozen=True)
class Prediction:
    """What a launch would do: its memory plan, and either a startup failure or a workload result."""

    node: NodePerformanceModel
    plan: MemoryPlan
    failure_phase: str | None
    failure_line: str | None
    result: WorkloadResult | None

    @property
    def output_throughput(self) -> float:
        """Output tok/s on the workload; 0 when the launch fails or runs out of memory under load."""
        if self.result is None or self.result.oom_lines:
            return 0.0
        return self.result.output_throughput


@functools.cache
def _parser() -> argparse.ArgumentParser:
    """The default release's parser, built once a process: parsing leaves it as it was."""
    return build_parser()


def settings_for(argv: Sequence[str], env: Mapping[str, str]) -> LaunchSettings:
    """SGLang launch_server flags (without the program) and env, read as the simulated server reads them."""
    argv = list(argv)
    if "--model-path" not in argv:
        argv = ["--model-path", "/models/simulated", *argv]
    ns = _parser().parse_args(argv)
    check_server_args(ns)  # raises what SGLang raises for inconsistent flags; its warnings do not matter here
    return LaunchSettings.from_args(ns, env)


def predict(
    hardware: HardwareProfile,
    model: ModelProfile,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    workload: StandardWorkload | None = None,
    *,
    seed: int = 0,
    noise: SimNoise | float = 0.0,
    version: SglangVersion = VERSIONS[DEFAULT_VERSION],
    play: bool = True,
    gpu_held_gb: float = 0.0,
    weights_mapped: bool = False,
) -> Prediction:
    """The model's answer for one launch on `workload` (the model profile's standard one by default);
    `play=False` starts the launch only (no result), for a caller that plays requests of its own;
    `gpu_held_gb`, `weights_mapped`: a weight cache daemon's memory, and a client of it (NodePerformanceModel.
    share_gpu)."""
    node = NodePerformanceModel(hardware, model, settings_for(argv, env or {}), version)
    if gpu_held_gb or weights_mapped:
        node.share_gpu(gpu_held_gb, weights_mapped)
    failure = node.startup_failure
    if failure is not None:
        return Prediction(node, node.plan, failure.phase, failure.lines[-1], None)
    if not play:
        return Prediction(node, node.plan, None, None, None)
    w = workload or model.standard_workload
    result = run_workload(
        node, w.num_prompts, w.input_len, w.output_len, w.concurrency, seed=seed, noise=noise
    )
    return Prediction(node, node.plan, None, None, result)
