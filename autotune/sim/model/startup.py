"""How a launch's start-up time depends on what the node kept from earlier launches and on the loader:
weights read from cold disk or from the page cache, SGLang's multithreaded loader, presharded weights, and
a warm JIT/compile cache. From published figures, each with its source beside it."""

from __future__ import annotations

import hashlib
import json
import math
from typing import TYPE_CHECKING

from autotune.node.page_cache import PAGE_CACHE_SHARE
from autotune.trial.startup import DEFAULT_LOAD_THREADS, MULTITHREAD_KEY, THREADS_KEY

if TYPE_CHECKING:
    from autotune.sim.model.node import NodePerformanceModel
    from autotune.sim.profiles import HardwareProfile, ModelProfile

# SGLang PR 18124: Kimi-K2.5, 64 shards of ~10 GB, loaded in 24m46s single-threaded and 6m11s multithreaded;
# the hardware profile's `multithread_load_speedup` is that ratio where its storage is like theirs.
PR_18124_SINGLE_S, PR_18124_THREADED_S = 24 * 60 + 46, 6 * 60 + 11
# A Qwen3.5-122B FP8 server on 8x B200: ready in 695 s cold (531 s of it weights) against 88 s warm (31 s of
# it weights): weights from the page cache load 531/31 = 17x faster, and the rest of start-up (compile and
# CUDA-graph capture with its caches warm) takes (88 - 31) / (695 - 531) = 0.35 of its cold time.
QWEN_COLD_S, QWEN_COLD_WEIGHTS_S, QWEN_WARM_S, QWEN_WARM_WEIGHTS_S = 695.0, 531.0, 88.0, 31.0
PAGE_CACHE_SPEEDUP = QWEN_COLD_WEIGHTS_S / QWEN_WARM_WEIGHTS_S
WARM_COMPILE_SHARE = (QWEN_WARM_S - QWEN_WARM_WEIGHTS_S) / (QWEN_COLD_S - QWEN_COLD_WEIGHTS_S)
# A weight cache client maps the daemon's weights over CUDA IPC: 0.05-0.07 s on one H200 for an 8B's 196
# tensors (benchmarks/RESULTS-sglang-h200.md, SGLang 0.5.17), against 2.03 s from the page cache.
IPC_LOAD_S = 0.07
# vllm-ascend PR 6058 (Llama3-70B; vLLM's sharded_state format, where each rank reads only its own files,
# against the default loader, where every rank reads the whole checkpoint): TP=4 10.54 -> 3.94 s (2.7x),
# TP=16 7.22 -> 0.99 s (7.3x). A power law through both, tp ** 0.717 (4.4x at TP=8), is assumed for
# SGLang's presharded weights, which read the same way (each rank its own files, one thread), on any storage:
# it was measured there, not on a disk like the seed's.
SHARDED_READ_EXPONENT = math.log(7.3) / math.log(16)
# SGLang 0.5.17's first presharded launch on one H100 (benchmarks/RESULTS-sglang-h200.md, an 8B of 14.5 GB,
# tp=1): its weights load took 38.52 s against 11.8 s for the default loader from the same cold disk, so the
# dump (hashing every tensor, then writing it at 0.86 GB/s) took 26.7 s, 2.26x the read of the same bytes;
# each rank's dump of its share is assumed to take that many times its own read.
DUMP_OVER_READ = (38.52 - 11.8) / 11.8
PRESHARDED = "presharded"
# The node's page cache step (autotune.node.page_cache) reads the part it keeps with 8 readers: 7.3-9.6 GB/s
# over pages already in the page cache on the 2-core machine this was written on (processes started
# included; benchmarks/page_cache_keep.txt); a server node's cores are assumed to reach 40.
KEEP_READ_GBPS = 40.0


def load_threads(extra_config: str | None) -> int:
    """The loader threads a `--model-loader-extra-config` value gives (1: single-threaded)."""
    try:
        config = json.loads(extra_config or "{}")
    except ValueError:
        config = {}
    if not isinstance(config, dict) or not config.get(MULTITHREAD_KEY, True):
        return 1
    threads = config.get(THREADS_KEY, DEFAULT_LOAD_THREADS)
    return max(int(threads), 1) if isinstance(threads, int | float) else DEFAULT_LOAD_THREADS


def thread_speedup(hw: HardwareProfile, threads: int) -> float:
    """The loader's speed-up over one thread on cold disk: the profile's measured figure at SGLang's 8
    threads, less in proportion below that, no more above it (the disk is the limit there)."""
    if threads <= 1:
        return 1.0
    share = min(threads, DEFAULT_LOAD_THREADS) / DEFAULT_LOAD_THREADS
    return 1.0 + (hw.multithread_load_speedup - 1.0) * share


def weights_fit_page_cache(hw: HardwareProfile, model: ModelProfile) -> bool:
    """Whether the node's host memory keeps the weights in its page cache from one launch to the next."""
    return hw.host_memory_gb is not None and model.weight_gb <= PAGE_CACHE_SHARE * hw.host_memory_gb


def presharded_path(extra_config: str | None) -> str | None:
    """The presharded dumps' folder a `--model-loader-extra-config` value names, if any."""
    try:
        config = json.loads(extra_config or "{}")
    except ValueError:
        return None
    folder = config.get("presharded_path") if isinstance(config, dict) else None
    return str(folder) if folder else None


def presharded_dump(node: NodePerformanceModel) -> str | None:
    """The folder SGLang dumps this launch's presharded weights in and reads them back from: a subfolder
    of the named folder per shard config (loader.py: `TP-<tp>-sig-<sha1 of the config>`); None where the
    launch does not load presharded weights or names no folder (autotune always names one)."""
    settings = node.settings
    if settings.load_format != PRESHARDED or settings.presharded_path is None:
        return None
    config = {
        "tp": settings.tp_size, "dp": settings.dp_size, "ep": settings.ep_size,
        "quantization": node.model.quantization, "model": node.model.name,
    }  # fmt: skip
    signature = hashlib.sha1(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return f"{settings.presharded_path.rstrip('/')}/TP-{settings.tp_size}-sig-{signature}"


def load_seconds(node: NodePerformanceModel) -> float:
    """Weight loading: from the page cache when an earlier launch left the weights there (threads barely
    matter then: SGLang PR 7943 measured 60 s against 56 s), else from disk at the threads' speed, the part
    the node kept in the page cache (node.page_cache) from memory; with presharded weights, each rank reads
    its own share, after a first launch that loads and writes them."""
    if node.weights_mapped:
        return IPC_LOAD_S
    settings = node.settings
    cached = 1.0 if node.weights_cached else node.weights_kept
    if presharded_dump(node) is not None and node.weights_presharded:
        return sharded_read_seconds(node.model, settings.tp_size, cached)
    return disk_load_seconds(node.hw, node.model, settings.load_threads, cached) + dump_part(node)


def dump_part(node: NodePerformanceModel) -> float:
    """The seconds of its weight load the launch spends writing a presharded dump: none but the first
    launch of a layout."""
    if presharded_dump(node) is None or node.weights_presharded or node.weights_mapped:
        return 0.0
    return dump_seconds(node.model, node.settings.tp_size)


def sharded_read_seconds(model: ModelProfile, tp: int, cached: float) -> float:
    """Presharded weights read back, each rank its own share: the `cached` share of them from the page
    cache, the rest at the sharded read's speed-up over one thread reading the whole checkpoint
    (SHARDED_READ_EXPONENT)."""
    cold_single = model.weight_gb / model.load_gbps
    cold = cold_single / max(tp, 1) ** SHARDED_READ_EXPONENT
    return cached * cold_single / PAGE_CACHE_SPEEDUP + (1.0 - cached) * cold


def dump_seconds(model: ModelProfile, tp: int) -> float:
    """The first launch's dump: every rank hashes and writes its share, DUMP_OVER_READ times its read."""
    return DUMP_OVER_READ * sharded_read_seconds(model, tp, cached=0.0)


def disk_load_seconds(hw: HardwareProfile, model: ModelProfile, threads: int, cached: float) -> float:
    """The whole checkpoint read and loaded: the `cached` share of it from the page cache, the rest from
    disk at the threads' speed."""
    cold_single = model.weight_gb / model.load_gbps
    cold = cold_single / thread_speedup(hw, threads)
    return cached * cold_single / PAGE_CACHE_SPEEDUP + (1.0 - cached) * cold


def compile_share(node: NodePerformanceModel) -> float:
    """The share of its cold time CUDA-graph capture takes with the node's compile caches warm."""
    return WARM_COMPILE_SHARE if node.compile_cache_warm else 1.0
