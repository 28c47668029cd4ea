"""`nvidia-smi --query-gpu=...` for the simulated node: its GPUs from the hardware profile.

A study on the simulated node names `[python, -m, autotune.sim.nvidia_smi]` as the node's `nvidia_smi`,
so the node check reads GPU inventory and memory the same way it does from a real node. It answers the
CSV query form only (`--query-gpu=a,b,... --format=csv,noheader,nounits`), from `SGLANG_SIM_HARDWARE`.
"""

from __future__ import annotations

import argparse
import os
import sys

from autotune.sim.profiles import load_hardware_profile

DRIVER_VERSION = "580.159.04-sim"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nvidia-smi")
    parser.add_argument("--query-gpu", required=True)
    parser.add_argument("--format", default="csv")
    args = parser.parse_args(argv)
    hw = load_hardware_profile(os.environ.get("SGLANG_SIM_HARDWARE") or "rtx-pro-6000-pcie-x8")
    mib = hw.gpu_memory_gb * 1000 / 1.048576
    values = {
        "name": hw.gpu_name,
        "memory.total": f"{mib:.0f}",
        "memory.free": f"{mib - 500:.0f}",  # the CUDA context of a desktop-less node
        "driver_version": DRIVER_VERSION,
        "compute_cap": hw.compute_capability,
    }
    fields = args.query_gpu.split(",")
    for index in range(hw.num_gpus):
        row = [str(index) if f == "index" else values.get(f, "[N/A]") for f in fields]
        print(", ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
