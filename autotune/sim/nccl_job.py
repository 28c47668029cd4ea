"""A simulated `python -m autotune.measure.nccl`: `python -m autotune.sim.nccl_job [its arguments]`.

It takes the real benchmark's command line (`BenchSettings.from_argv`) and NCCL environment, and prints the
real benchmark's result line (`autotune.measure.nccl.summarize`, through `autotune.measure.result_line`)
with the times the simulated node's model gives for each message (`NodePerformanceModel.allreduce_us`: in a
CUDA graph for `--timing graph`, eagerly otherwise; NCCL's all-reduces alone, as the benchmark calls NCCL
directly).
The hardware and model are the simulated server's (`SGLANG_SIM_HARDWARE`, `SGLANG_SIM_MODEL`), so a serving
study's NCCL stage on the simulated node runs it with the server's environment. `ModelNodeExecutor` answers
job requests with the same `allreduce_payload`, without a process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.errors import ConfigError
from autotune.measure.nccl import BenchSettings, RankReport, summarize
from autotune.measure.result_line import print_result
from autotune.sim.model import NodePerformanceModel
from autotune.sim.predict import settings_for
from autotune.sim.profiles import HardwareProfile, ModelProfile, load_hardware_profile, load_model_profile
from autotune.sim.server.options import DEFAULT_MODEL, SimOptions

# Node seconds one benchmark run takes on a node: process start, NCCL init, warm-up, capture, the replays.
JOB_SECONDS = 30.0
_MIB = float(1 << 20)


def allreduce_payload(
    hardware: HardwareProfile, model: ModelProfile, settings: BenchSettings, env: Mapping[str, str]
) -> dict[str, Any]:
    """The result payload `autotune.measure.nccl` would print for `settings` under the NCCL `env`."""
    if settings.gpus > hardware.num_gpus:  # the real benchmark's own check, worded as it is
        raise RuntimeError(
            f"--gpus {settings.gpus} needs {settings.gpus} GPUs, but {hardware.num_gpus} are visible"
        )
    nccl_env = {name: value for name, value in env.items() if name.startswith("NCCL_")}
    flags = ["--tp-size", str(settings.gpus), "--disable-custom-all-reduce"]  # NCCL's all-reduces alone
    node = NodePerformanceModel(hardware, model, settings_for(flags, nccl_env))
    graph = settings.timing == "graph"
    samples = {m.bytes: [node.allreduce_us(m.bytes, graph)] * settings.repeats for m in settings.messages}
    nccl_bytes = node.nccl.memory_gb() * 1e9
    memory = {"nccl_init": nccl_bytes, "nccl": nccl_bytes, "gpu_used": nccl_bytes + 512 * _MIB}
    reports = [RankReport(rank, samples, memory) for rank in range(settings.gpus)]
    return summarize(settings, reports, settings.timing, None, nccl_env)


def main(argv: Sequence[str] | None = None) -> int:
    settings = BenchSettings.from_argv(argv)

    def measure() -> dict[str, Any]:
        options = SimOptions.from_env(os.environ)
        hardware = load_hardware_profile(options.hardware)
        model = load_model_profile(options.model or DEFAULT_MODEL)
        return allreduce_payload(hardware, model, settings, os.environ)

    # An unknown profile (ConfigError: only the profiles raise it) or more GPUs than the hardware has
    # (RuntimeError, worded as the real job's).
    return print_result("autotune.sim.nccl_job", measure, (ConfigError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
