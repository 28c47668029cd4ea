"""Per-GPU memory as SGLang lays it out at start-up: weights, KV pool, CUDA graphs, and the limits and
automatic defaults SGLang derives from them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.sim.model.settings import GB, MIB
from autotune.sim.profiles import HardwareProfile

if TYPE_CHECKING:
    from autotune.sim.model.node import NodePerformanceModel


@dataclass(frozen=True)
class MemoryPlan:
    """Per-GPU memory as SGLang lays it out at startup, in GB, plus the limits it derives."""

    total_gb: float
    init_used_gb: float
    nccl_gb: float
    weights_gb: float
    avail_after_weights_gb: float
    kv_gb: float
    kv_tokens: int
    avail_after_kv_gb: float
    graph_gb: float
    avail_after_graph_gb: float
    activation_gb_per_token: float
    mem_fraction_static: float
    chunked_prefill_size: int
    max_prefill_tokens: int
    max_running_requests: int
    cuda_graph_max_bs: int
    captured_batch_sizes: list[int]
    context_len: int
    prefill_graph_gb: float = 0.0
    prefill_graph_sizes: list[int] = field(default_factory=list)
    prefill_graph_max_tokens: int = 0  # SGLang resolves it whether or not prefill graphs are on
    # GiB free when 0.5.17's gate dropped the prefill graphs it had chosen (versions.py); None: kept
    prefill_graph_dropped_at_gb: float | None = None
    static_rest_gb: float = 1.0
    pre_load_avail_gb: float = 1.0


def captured_batch_sizes(
    max_bs: int, speculative: bool = False, max_requests: int | None = None
) -> list[int]:
    """The decode batch sizes SGLang captures: `_generate_decode_cuda_graph_batch_sizes` (server_args.py
    4930-4968; its own list with speculation, max_bs always included), then clamped to the request pool at
    capture (`get_batch_sizes_to_capture`, base_cuda_graph_runner.py:61-99)."""
    if speculative:
        sizes = [
            *range(1, 9),
            *range(10, 33, 2),
            *range(40, 65, 4),
            *range(72, 257, 8),
            *range(272, max_bs + 1, 16),
        ]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    if max_requests is not None and max(sizes) > max_requests:
        sizes = [s for s in sizes if s < max_requests] + [max_requests]
    return sizes


def prefill_graph_token_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures prefill graphs for (`_generate_prefill_cuda_graph_batch_sizes`)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64)]
    sizes += [*range(1280, 4097, 256), *range(4608, max_tokens + 1, 512)]
    return [s for s in sizes if s <= max_tokens]


def _gpu_mib(hw: HardwareProfile) -> float:
    return hw.gpu_memory_gb * GB / MIB


def auto_chunked_prefill(hw: HardwareProfile) -> int:
    """SGLang 0.5.17's table by GPU memory in MiB (server_args.py:4634-4690)."""
    mib = _gpu_mib(hw)
    return 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else 8192 if mib < 160 * 1024 else 16384


def auto_cuda_graph_max_bs(hw: HardwareProfile, tp: int) -> int:
    mib, small_tp = _gpu_mib(hw), tp < 4
    if mib < 20 * 1024:
        return 8
    if mib < 35 * 1024:
        return 24 if small_tp else 80
    if mib < 60 * 1024:
        return 32 if small_tp else 160
    if mib < 160 * 1024:
        return 256 if small_tp else 512
    return 512


def _prefill_graph_max_tokens(node: NodePerformanceModel, chunked: int) -> int:
    # The flag as given (real 0.5.17 logged max_bs=4096 for 4096), else server_args.py:4723-4731: the chunk
    # size, or 2048 for MLA backends.
    return node.settings.prefill_cuda_graph_max_tokens or (2048 if node.uses_mla else chunked)


def auto_mem_fraction(node: NodePerformanceModel, chunked: int, max_bs: int) -> float:
    """The reservation the seed's figures were calibrated with (SGLang 0.5.4's, in MB), not 0.5.17's (B2:
    no EAGLE term, a prefill-graph reserve, x0.91 for Kimi-K2.5's vision tower). 0.5.17's would take the
    seed's baseline from 80 to 71.5 tok/s, and with the vision factor leave Kimi no KV pool at all, so the
    seed cannot have run it; taking it needs the profiles re-fitted on a 0.5.17 measurement."""
    total_mb = node.hw.gpu_memory_gb * 1000
    reserved = 512 + max(chunked, 2048) * 1.5 + node.tp / 8 * 1024
    if not node.settings.disable_cuda_graph:
        reserved += max_bs * 2  # 0.5.17 reserves for the decode graphs only when there are any
    if node.hw.gpu_memory_gb > 60:
        reserved = max(reserved, 10240)
    if node.spec:
        reserved += 2048
    return round((total_mb - reserved) / total_mb, 3)


def kv_bytes_per_token(node: NodePerformanceModel) -> float:
    """KV cache bytes one token takes on one GPU (the draft model's included under speculation)."""
    m = node.model
    per_gpu = m.kv_bytes_per_token / (node.tp if m.kv_sharded_by_tp else 1)
    if node.settings.kv_cache_dtype.startswith("fp8"):
        per_gpu /= 2
    if node.spec and m.draft:
        per_gpu += m.draft.kv_bytes_per_token
    return per_gpu


def plan_memory(node: NodePerformanceModel) -> MemoryPlan:
    """The launch's memory plan; NCCL's buffers and the resolved settings must already be on `node`."""
    s, m, hw = node.settings, node.model, node.hw
    flag_chunked = s.chunked_prefill_size or auto_chunked_prefill(hw)
    # -1 disables chunking: a prompt is prefilled whole (SGLang's reservation still counts 2048).
    chunked = m.context_len if flag_chunked < 0 else flag_chunked
    max_bs = s.cuda_graph_max_bs or auto_cuda_graph_max_bs(hw, node.tp)
    mfs = s.mem_fraction_static or auto_mem_fraction(node, flag_chunked, max_bs)
    # What this launch sees: a weight cache daemon's share of the GPU is not free.
    total = hw.gpu_memory_gb - node.gpu_held_gb
    nccl_gb = node.nccl.memory_gb()
    init_used = hw.cuda_context_gb + nccl_gb + (0.12 if node.custom_allreduce else 0.0)
    disk_weights = m.weight_gb / node.tp + (m.draft.weight_gb / node.tp if node.spec and m.draft else 0.0)
    # A weight cache client's load takes no memory: the weights are the daemon's (mem usage=0.00 GB, H200).
    weights = 0.0 if node.weights_mapped else disk_weights
    avail_after_weights = total - init_used - weights
    kv_fraction = mfs
    if node.gpu_held_gb:
        # SGLang 0.5.17 sizes the pool as (free before the load) x f less the load's memory, T' x f - W'
        # (kv_cache_configurator._profile_available_bytes); this model's sizing is calibrated for a whole
        # GPU, so a launch beside a daemon gets the pool of the whole-GPU fraction whose SGLang pool is the
        # same: (T' x f - W' + W) / T, T the free memory a whole GPU has before the load.
        whole = hw.gpu_memory_gb - init_used
        kv_fraction = ((whole - node.gpu_held_gb) * mfs - weights + disk_weights) / whole
    # SGLang sizes the KV pool as what is left of the static fraction after everything before it.
    kv_gb = kv_fraction * hw.gpu_memory_gb - init_used - disk_weights - m.runtime_overhead_gb
    kv_tokens = max(0, int(kv_gb * GB / kv_bytes_per_token(node)))
    avail_after_kv = avail_after_weights - m.runtime_overhead_gb - max(kv_gb, 0.0)
    # Weights that leave the static budget no room at all (kv_cache_configurator.py:1639-1655).
    static_rest_gb = kv_fraction * hw.gpu_memory_gb - init_used - disk_weights
    default_running = 48 if node.spec else 4096
    max_running = s.max_running_requests or max(1, min(default_running, kv_tokens // 2))
    speculative = s.speculative_algorithm is not None
    sizes = [] if s.disable_cuda_graph else captured_batch_sizes(max_bs, speculative, max_running)
    tokens_per_bs = node.spec.num_draft_tokens if node.spec else 1
    graph_gb = (m.graph_mb_per_bs * max(sizes, default=0) * tokens_per_bs + 12 * len(sizes)) / 1000
    prefill_max_tokens = _prefill_graph_max_tokens(node, chunked)
    prefill_sizes = prefill_graph_token_sizes(prefill_max_tokens) if s.prefill_cuda_graph else []
    gate = node.version.prefill_graph_min_free_gb
    dropped_at = None
    if prefill_sizes and s.prefill_cuda_graph_backend is None and gate is not None and avail_after_kv < gate:
        prefill_sizes, dropped_at = [], avail_after_kv
    if not prefill_sizes:
        prefill_graph_gb = 0.0
    elif node.uses_mla:
        prefill_graph_gb = 1.5 * 1024 * MIB / GB  # tc_piecewise, as Kimi-K2.5 took it (B12)
    else:
        # Breakable graphs keep their largest graph's activations in the pool: real 0.5.17 took 1.38 GiB
        # for graphs up to 8192 tokens of the 8B Llama and 2.51 GiB up to 16384 (RESULTS-sglang-h200.md).
        prefill_graph_gb = (
            len(prefill_sizes) * 8 * MIB / GB + prefill_max_tokens * m.prefill_graph_mb_per_token / 1000
        )
    return MemoryPlan(
        total_gb=total,
        init_used_gb=init_used,
        nccl_gb=nccl_gb,
        weights_gb=weights,
        avail_after_weights_gb=avail_after_weights,
        kv_gb=kv_gb,
        kv_tokens=kv_tokens,
        avail_after_kv_gb=avail_after_kv,
        graph_gb=graph_gb,
        avail_after_graph_gb=avail_after_kv - graph_gb - prefill_graph_gb,
        prefill_graph_gb=prefill_graph_gb,
        prefill_graph_sizes=prefill_sizes,
        prefill_graph_max_tokens=prefill_max_tokens,
        prefill_graph_dropped_at_gb=dropped_at,
        static_rest_gb=static_rest_gb,
        pre_load_avail_gb=total - init_used,
        activation_gb_per_token=m.activation_mb_per_token / 1000,
        mem_fraction_static=mfs,
        chunked_prefill_size=chunked,
        max_prefill_tokens=max(16384, chunked),
        max_running_requests=max_running,
        cuda_graph_max_bs=max_bs,
        captured_batch_sizes=sizes,
        context_len=m.context_len,
    )
