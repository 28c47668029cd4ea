"""The simulated node's SGLang weight cache daemon: `python -m autotune.sim.weight_cache_daemon` with
0.5.17's command line (`python -m sglang.srt.weight_cache.daemon`, its multi-rank mode), as a real process.

It "loads" the model's weights for the profile's load time (cold disk, at the loader's threads), then holds
each rank's share of them (and its own CUDA context) in the simulated GPUs' memory until SIGTERM: the
simulated nvidia-smi shows it (`held_gb`), a simulated server on those GPUs sees that much less free memory,
and a server started with `--weight-cache-mode client` maps the weights instead of loading them. What it
logs and how it refuses a quantization are real 0.5.17's (weight_cache/daemon.py and protocol.py); where it
keeps its ready files: `SGLANG_SIM_WEIGHT_CACHE_DIR`, else the system's temp folder (real SGLang: /tmp).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import ConfigError
from autotune.sim.model.startup import disk_load_seconds, load_threads
from autotune.sim.model_folder import node_profiles
from autotune.sim.profiles import HardwareProfile, ModelProfile

DIR_ENV = "SGLANG_SIM_WEIGHT_CACHE_DIR"
READY_FILE = "sglang_weight_cache_rank{rank}.ready"  # 0.5.17 protocol.py WEIGHT_CACHE_READY_TEMPLATE's name
# 0.5.17 protocol.py IPC_QUANT_ALLOWLIST: unquantized, and FP8 (block-wise: the profiles' FP8 models are).
IPC_QUANTIZATIONS = (None, "fp8")
# What the daemon exports: 196 tensors for the 32-layer Llama on the H200 (6 a layer, and 4 more).
TENSORS_PER_LAYER = 6


def exported_tensors(model: ModelProfile) -> int:
    """The tensors a daemon exports (and a client fetches) for `model`: 6 a layer, and 4 more."""
    return model.num_layers * TENSORS_PER_LAYER + 4


def daemon_held_gb(hardware: HardwareProfile, model: ModelProfile, ranks: int) -> float:
    """What a daemon holds on each of its GPUs: its share of the weights and a CUDA context."""
    return model.weight_gb / ranks + hardware.cuda_context_gb


def quant_refusal(quant_method: str, where: str) -> str:
    """0.5.17's UnsupportedQuantForIPCError message (weight_cache/protocol.py check_ipc_quant_support)."""
    verified = "'' (unquantized), 'fp8'"
    return (
        f"[weight_cache:{where}] quantization method {quant_method!r} is not "
        f"verified for CUDA IPC zero-copy weight sharing. Its "
        f"process_weights_after_loading may stamp Python-side metadata "
        f"(e.g. format_ue8m0) or repack/transpose weights into shapes the "
        f"meta-initialized client cannot reproduce, which would silently serve "
        f"wrong-numerics weights. Verified methods: {verified}. Note: FP8 is "
        f"only verified for block-wise configs (weight_block_size set), not "
        f"per-tensor FP8. Disable the weight cache (--weight-cache-mode off) "
        f"for this model."
    )


def state_dir(env: Mapping[str, str]) -> Path:
    """Where the simulated daemons keep their ready files."""
    return Path(env.get(DIR_ENV) or tempfile.gettempdir())


@dataclass(frozen=True)
class HeldWeights:
    """One live daemon rank: its process, the GPU it holds memory on, and what it serves."""

    pid: int
    gpu: int
    held_gb: float
    model_path: str
    tp_size: int
    pp_size: int


def live_daemons(env: Mapping[str, str]) -> list[HeldWeights]:
    """The daemon ranks whose ready file names a live process."""
    found = []
    for path in sorted(state_dir(env).glob(READY_FILE.format(rank="*"))):
        try:
            lines = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
            pid, config = int(lines["pid"]), json.loads(lines["config"])
            os.kill(pid, 0)
        except (OSError, KeyError, ValueError):
            continue
        found.append(
            HeldWeights(
                pid, int(config["gpu_id"]), float(config["held_gb"]), str(config["model_path"]),
                int(config["tp_size"]), int(config["pp_size"]),
            )
        )  # fmt: skip
    return found


def held_gb(env: Mapping[str, str], gpu: int) -> float:
    """GPU memory the live daemons hold on GPU `gpu`, in GB."""
    return sum(d.held_gb for d in live_daemons(env) if d.gpu == gpu)


class _Log:
    """The daemon's log format (`%(asctime)s [Daemon gpu=G tp_rank=R] LEVEL message`, its logging config)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, message: str, level: str = "INFO") -> None:
        now = datetime.datetime.now()
        stamp = now.strftime("%Y-%m-%d %H:%M:%S") + f",{now.microsecond // 1000:03d}"
        print(f"{stamp} {self.prefix} {level} {message}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    """0.5.17's daemon command line (weight_cache/daemon.py `__main__`)."""
    parser = argparse.ArgumentParser(description="SGLang Weight Cache Daemon")
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--gpu-id", type=int, default=None)
    parser.add_argument("--tp-rank", type=int, default=None)
    for name in ("--dp-size", "--ep-size", "--pp-size", "--nnodes"):
        parser.add_argument(name, type=int, default=1)
    for name in ("--pp-rank", "--base-gpu-id", "--node-rank"):
        parser.add_argument(name, type=int, default=0)
    parser.add_argument("--gpu-id-step", type=int, default=1)
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--quantization", default=None)
    parser.add_argument("--model-loader-extra-config", default="{}")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--revision", default=None)
    parser.add_argument("--dist-init-method", default=None)
    parser.add_argument("--timeout", type=int, default=1800)
    parser.add_argument("--force", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        options, hardware, model = node_profiles(ns.model_path, os.environ)
    except ConfigError as exc:
        print(f"autotune.sim.weight_cache_daemon: {exc}", file=sys.stderr)
        return 1
    ranks = ns.tp_size * ns.pp_size
    gpus = [ns.base_gpu_id + r * ns.gpu_id_step for r in range(ranks)]
    folder = state_dir(os.environ)
    ready = [folder / READY_FILE.format(rank=r) for r in range(ranks)]
    launcher = _Log("[DaemonLauncher]")
    if not ns.force and any(d.gpu in gpus for d in live_daemons(os.environ)):
        raise RuntimeError(  # protocol.py cleanup_stale_daemon_files
            "Weight cache daemon for rank 0 is already running (pid=?). Stop the existing daemon before "
            "starting a new one, or pass --force to take over."
        )
    for rank, gpu in enumerate(gpus):
        launcher(f"Launched weight cache daemon gpu={gpu} pp_rank=0 tp_rank={rank} pid={os.getpid()}")
    log = _Log(f"[Daemon gpu={gpus[0]} tp_rank=0]")
    scale = options.startup_time_scale
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    log("[WeightCacheDaemon gpu=0 tp_rank=0] Distributed backend initialized "
        f"(tp_size={ns.tp_size}, pp_size={ns.pp_size}, world_size={ranks})")  # fmt: skip
    quant = ns.quantization or model.quantization
    if quant not in IPC_QUANTIZATIONS:
        # check_ipc_quant_support, before the load: each rank dies, then the launcher says so.
        print("Traceback (most recent call last):", file=sys.stderr)
        print('  File "sglang/srt/weight_cache/daemon.py", line 275, in load', file=sys.stderr)
        error = "sglang.srt.weight_cache.protocol.UnsupportedQuantForIPCError"
        print(f"{error}: {quant_refusal(str(quant), 'daemon')}", file=sys.stderr)
        launcher("Weight cache daemon exited prematurely with code 1", "ERROR")
        print("RuntimeError: Weight cache daemon exited prematurely with code 1", file=sys.stderr, flush=True)
        return 1
    log(f"[WeightCacheDaemon gpu=0 tp_rank=0] Loading model from disk: {ns.model_path}")
    threads = load_threads(ns.model_loader_extra_config)
    load_s = disk_load_seconds(hardware, model, threads, cached=False)  # its page cache is not modelled
    # A SIGTERM during the load ends it there: the daemon has nothing to hand out yet.
    loaded_at = time.monotonic() + load_s * scale
    while not stopping and (left := loaded_at - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))
    if stopping:
        log(f"[WeightCacheDaemon gpu=0] Received signal {stopping[0]} while loading, shutting down")
        return 0
    log(f"[WeightCacheDaemon gpu=0 tp_rank=0] Model loaded from disk in {load_s:.2f}s")
    tensors = exported_tensors(model)
    per_gpu = daemon_held_gb(hardware, model, ranks)
    folder.mkdir(parents=True, exist_ok=True)
    for rank, (gpu, path) in enumerate(zip(gpus, ready, strict=True)):
        config = {
            "model_path": ns.model_path, "tp_size": ns.tp_size, "pp_size": ns.pp_size, "gpu_id": gpu,
            "tp_rank": rank, "held_gb": round(per_gpu, 3), "tensors": tensors,
        }  # fmt: skip
        path.write_text(f"pid={os.getpid()}\nconfig={json.dumps(config)}\n")
    log(f"[WeightCacheDaemon gpu=0 tp_rank=0] Exported {tensors} tensors as IPC handles. Ready to serve.")
    for rank, gpu in enumerate(gpus):  # each rank's daemon (one process here)
        sock = folder / f"sglang_weight_cache_rank{rank}.sock"
        _Log(f"[Daemon gpu={gpu} tp_rank={rank}]")(f"[WeightCacheDaemon gpu={gpu}] Listening on {sock}")
    for rank in range(ranks):
        launcher(f"Weight cache daemon pp_rank=0 tp_rank={rank} is ready")
    launcher(
        f"All {ranks} weight cache daemons on node {ns.node_rank} are ready (pp_ranks=0..{ns.pp_size - 1}, "
        f"tp_ranks=0..{ns.tp_size - 1}, dist_init_method={ns.dist_init_method})"
    )
    try:
        while not stopping:
            time.sleep(0.1)
        log(f"[WeightCacheDaemon gpu=0] Received signal {stopping[0]}, shutting down")
    finally:
        for path in ready:
            path.unlink(missing_ok=True)
    log("[WeightCacheDaemon gpu=0] Shutdown complete")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
