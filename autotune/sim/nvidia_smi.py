"""`nvidia-smi --query-gpu=...` and `nvidia-smi topo -m` for the simulated node, from the hardware profile.

A study on the simulated node names `[python, -m, autotune.sim.nvidia_smi]` as the node's `nvidia_smi`,
so the node check reads GPU inventory and memory the same way it does from a real node. It answers the
CSV query form (`--query-gpu=a,b,... --format=csv,noheader,nounits`) and the GPU matrix of `topo -m`
(as real nvidia-smi prints it: tab-separated, the header underlined with ANSI codes, then the legend),
from `SGLANG_SIM_HARDWARE`.
"""

from __future__ import annotations

import argparse
import os
import sys

from autotune.sim.profiles import HardwareProfile, load_hardware_profile
from autotune.sim.weight_cache_daemon import held_gb

DRIVER_VERSION = "580.159.04-sim"
# H100 and H200 SXM GPUs are joined by 18 bonded NVLinks (real 2x H200: benchmarks/gpu-run/env.txt).
NVLINKS = 18
CPU_AFFINITY = "0-31"
TOPOLOGY_LEGEND = """
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks"""


def topology(hw: HardwareProfile) -> str:
    """`nvidia-smi topo -m`'s GPU matrix: NVLink between every pair, or over PCIe the profile's path
    between GPUs behind different host bridges and PIX behind the same one."""
    n = hw.num_gpus
    bridge = [i * max(hw.host_bridges, 1) // n for i in range(n)]

    def link(a: int, b: int) -> str:
        if a == b:
            return " X "
        if hw.interconnect == "nvlink":
            return f"NV{NVLINKS}"
        return "PIX" if bridge[a] == bridge[b] else hw.gpu_path

    gpus = [f"GPU{i}" for i in range(n)]
    lines = ["\t\x1b[4m" + "\t".join([*gpus, "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"]) + "\x1b[0m"]
    for a in range(n):
        lines.append("\t".join([gpus[a], *(link(a, b) for b in range(n)), CPU_AFFINITY, "0", "", "N/A"]))
    return "\n".join(lines) + "\n" + TOPOLOGY_LEGEND


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    hw = load_hardware_profile(os.environ.get("SGLANG_SIM_HARDWARE") or "rtx-pro-6000-pcie-x8")
    if argv[:1] == ["topo"]:
        topo = argparse.ArgumentParser(prog="nvidia-smi topo")
        topo.add_argument("-m", "--matrix", action="store_true", required=True)
        topo.parse_args(argv[1:])
        print(topology(hw))
        return 0
    parser = argparse.ArgumentParser(prog="nvidia-smi")
    parser.add_argument("--query-gpu", required=True)
    parser.add_argument("--format", default="csv")
    args = parser.parse_args(argv)
    mib = hw.gpu_memory_gb * 1000 / 1.048576
    fields = args.query_gpu.split(",")
    for index in range(hw.num_gpus):
        # 500 MiB: the CUDA context of a desktop-less node; and what a simulated weight cache daemon holds
        # there (GB as SGLang logs them: GiB).
        used = 500 + held_gb(os.environ, index) * 1024
        values = {
            "name": hw.gpu_name,
            "memory.total": f"{mib:.0f}",
            "memory.used": f"{used:.0f}",
            "memory.free": f"{mib - used:.0f}",
            "driver_version": DRIVER_VERSION,
            "compute_cap": hw.compute_capability,
        }
        row = [str(index) if f == "index" else values.get(f, "[N/A]") for f in fields]
        print(", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
