"""What a launch of SGLang would do on a profiled node: memory plan, startup failure, step times.

Everything here is a pure function of (hardware profile, model profile, launch settings): the simulated
server prints and serves what this module says, and tests and benchmarks ask it directly. Times are in
model seconds (the server scales them); memory is in GB (1e9 bytes) per GPU.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from autotune.sim.predictability import request_accept_rate
from autotune.sim.profiles import P2P_LEVELS, HardwareProfile, LinkProfile, ModelProfile

if TYPE_CHECKING:
    from autotune.sim.engine import Engine

GB = 1e9
MIB = 1 << 20
CUSTOM_ALLREDUCE_MAX_BYTES = 8 * MIB
# Architectures SGLang 0.5.17 turns FlashInfer all-reduce fusion on for (arg_groups/overrides.py:1863-1882).
FLASHINFER_FUSION_ARCHITECTURES = frozenset(
    {
        "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "GptOssForCausalLM", "GlmMoeDsaForCausalLM",
        "Glm4MoeForCausalLM", "Glm4MoeLiteForCausalLM", "MistralLarge3ForCausalLM", "Qwen3MoeForCausalLM",
        "Qwen3VLMoeForConditionalGeneration", "Qwen3NextForCausalLM", "KimiK25ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration", "InternS2PreviewForConditionalGeneration",
        "Qwen3_5ForConditionalGeneration", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    }
)  # fmt: skip
EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN")
PROTOCOLS = ("LL", "LL128", "Simple")
LL_MAX_BYTES = 64 * 1024  # NCCL's tuner picks LL below this on one node, LL128 (NVLink) or Simple above
LL128_MAX_BYTES = 8 * MIB
CHANNEL_BYTES = 256 * 1024  # NCCL spreads a message over more channels only once it is this large
LINK_SATURATING_CHANNELS = 2
NCCL_BASE_GB = 0.25  # communicator, proxy and work FIFOs, whatever the channels
SHM_GPU_MIB_PER_CONNECTION = 0.5  # shared-memory buffers live in host memory; only flags stay on the GPU
LL_MIB, LL128_MIB = 0.25, 4.6


@dataclass(frozen=True)
class NcclSettings:
    """The NCCL_* variables the model reads, after NCCL's own parsing (unknown values ignored)."""

    algo: str | None = None
    proto: str | None = None
    min_channels: int | None = None
    max_channels: int | None = None
    buffsize: int = 4 * MIB
    p2p_level: str | None = None
    p2p_disable: bool = False
    shm_disable: bool = False
    nvls_enable: bool = False

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> NcclSettings:
        def number(name: str) -> int | None:
            raw = env.get(name)
            if raw is None or raw == "":
                return None
            try:
                return int(raw)
            except ValueError:
                return 0  # NCCL parses with strtoll: a non-number quietly becomes 0

        algo = env.get("NCCL_ALGO")
        proto = env.get("NCCL_PROTO")
        level = env.get("NCCL_P2P_LEVEL")
        return cls(
            algo=algo if algo in ("Ring", "Tree") else None,
            proto=proto if proto in PROTOCOLS else None,
            min_channels=number("NCCL_MIN_NCHANNELS"),
            max_channels=number("NCCL_MAX_NCHANNELS"),
            buffsize=number("NCCL_BUFFSIZE") or 4 * MIB,
            p2p_level=level if level in P2P_LEVELS else None,  # case-sensitive; unknown is ignored
            p2p_disable=env.get("NCCL_P2P_DISABLE") == "1",
            shm_disable=env.get("NCCL_SHM_DISABLE") == "1",
            nvls_enable=env.get("NCCL_NVLS_ENABLE", "0") not in ("0", ""),
        )


@dataclass(frozen=True)
class LaunchSettings:
    """The server flags and environment that the model reads, as SGLang would see them."""

    tp_size: int = 1
    dp_size: int = 1
    ep_size: int = 1
    mem_fraction_static: float | None = None
    cuda_graph_max_bs: int | None = None  # the decode graph's (`--cuda-graph-max-bs-decode`)
    disable_cuda_graph: bool = False  # no decode graph
    prefill_cuda_graph: bool = True  # breakable prefill graphs are on by default on CUDA since 0.5.15
    prefill_cuda_graph_backend: str | None = None  # None: SGLang's default for the model
    page_size: int = 1
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None
    attention_backend: str | None = None
    moe_a2a_backend: str = "none"
    disable_custom_all_reduce: bool = False
    enable_flashinfer_allreduce_fusion: bool = False
    enable_torch_symm_mem: bool = False
    kv_cache_dtype: str = "auto"
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    force_custom_allreduce: bool = False
    nccl: NcclSettings = field(default_factory=NcclSettings)

    @classmethod
    def from_args(cls, ns: argparse.Namespace, env: Mapping[str, str]) -> LaunchSettings:
        """Read SGLang's parsed launch_server arguments and the process environment."""

        def arg(name: str, default: object = None) -> object:
            value = getattr(ns, name, default)
            return default if value is None else value

        algorithm = arg("speculative_algorithm")
        return cls(
            tp_size=int(arg("tp_size", 1)),  # type: ignore[call-overload]
            dp_size=int(arg("dp_size", 1)),  # type: ignore[call-overload]
            ep_size=int(arg("ep_size", 1)),  # type: ignore[call-overload]
            mem_fraction_static=getattr(ns, "mem_fraction_static", None),
            cuda_graph_max_bs=getattr(ns, "cuda_graph_max_bs_decode", None),
            disable_cuda_graph=bool(arg("disable_cuda_graph", False))
            or getattr(ns, "cuda_graph_backend_decode", None) == "disabled",
            prefill_cuda_graph=not arg("disable_cuda_graph", False)
            and getattr(ns, "cuda_graph_backend_prefill", None) != "disabled",
            prefill_cuda_graph_backend=getattr(ns, "cuda_graph_backend_prefill", None),
            page_size=int(arg("page_size", 1)),  # type: ignore[call-overload]
            chunked_prefill_size=getattr(ns, "chunked_prefill_size", None),
            max_running_requests=getattr(ns, "max_running_requests", None),
            attention_backend=getattr(ns, "attention_backend", None),
            moe_a2a_backend=str(arg("moe_a2a_backend", "none")),
            disable_custom_all_reduce=bool(arg("disable_custom_all_reduce", False)),
            # The deprecated flag means the backend `auto` (server_args.py:3950-3959).
            enable_flashinfer_allreduce_fusion=bool(arg("enable_flashinfer_allreduce_fusion", False))
            or getattr(ns, "flashinfer_allreduce_fusion_backend", None) is not None,
            enable_torch_symm_mem=bool(arg("enable_torch_symm_mem", False)),
            kv_cache_dtype=str(arg("kv_cache_dtype", "auto")),
            speculative_algorithm=str(algorithm).upper() if algorithm else None,
            speculative_num_steps=getattr(ns, "speculative_num_steps", None),
            speculative_eagle_topk=getattr(ns, "speculative_eagle_topk", None),
            speculative_num_draft_tokens=getattr(ns, "speculative_num_draft_tokens", None),
            force_custom_allreduce=env.get("SGLANG_SIM_FORCE_CUSTOM_ALLREDUCE") == "1",
            nccl=NcclSettings.from_env(env),
        )


@dataclass(frozen=True)
class SpecSettings:
    """Speculative decoding after SGLang's rules: (steps, topk, draft tokens) and the accept length."""

    num_steps: int
    topk: int
    num_draft_tokens: int
    accept_length: float

    @property
    def tree_has_enough_candidates(self) -> bool:
        """SGLang verifies the `draft - 1` best of topk + (steps-1)*topk^2 draft candidates with `torch.topk`
        (speculative/eagle_utils.py:106-110), which fails when there are fewer."""
        return self.num_draft_tokens - 1 <= self.topk + (self.num_steps - 1) * self.topk**2


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
    static_rest_gb: float = 1.0
    pre_load_avail_gb: float = 1.0


@dataclass(frozen=True)
class StartupFailure:
    """SGLang dying during startup: the phase, the failing rank and the exact lines it prints."""

    phase: str  # init | load | kv | runner | capture | prefill_capture | warmup
    lines: list[str]
    rank: int = 0


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


def accept_length(accept_rate: float, steps: int, topk: int, num_draft_tokens: int) -> float:
    """Expected tokens per verify pass of an EAGLE tree: the bonus token plus the accepted draft depth.

    SGLang verifies only the `num_draft_tokens - 1` best draft nodes. Each depth needs one node to be
    reached; nodes left over widen the shallowest depths first (up to `topk` candidates each). The best
    candidate is accepted with `accept_rate`, each lower-ranked one half as often, so a depth with `w`
    candidates is accepted with 1 - (1 - p) * (1 - p / 2) ** (w - 1). A chain (topk 1) gets
    1 + sum(p ** i).
    """
    budget = max(num_draft_tokens - 1, 0)
    widths = [1] * min(steps, budget)
    budget -= len(widths)
    for depth in range(len(widths)):
        extra = min(topk - 1, budget)
        widths[depth] += extra
        budget -= extra
    expected, reach = 1.0, 1.0
    for width in widths:
        reach *= 1 - (1 - accept_rate) * (1 - accept_rate / 2) ** (width - 1)
        expected += reach
    return expected


def _traceback(frames: list[tuple[str, int, str, str]], error: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(
            f'  File "/usr/local/lib/python3.12/dist-packages/sglang/{path}", line {line}, in {func}'
        )
        lines.append(f"    {code}")
    return [*lines, error]


_SCHEDULER_INIT = [
    ("srt/managers/scheduler.py", 2923, "run_scheduler_process", "scheduler = Scheduler("),
    ("srt/managers/scheduler.py", 312, "__init__", "self.tp_worker = TpModelWorker("),
    ("srt/managers/tp_worker.py", 94, "__init__", "self.model_runner = ModelRunner("),
]


_DRAFT_FORWARD = [
    ("srt/managers/scheduler.py", 1024, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    (
        "srt/speculative/eagle_worker_v2.py",
        718,
        "draft_forward",
        "parent_list, top_scores_index, draft_tokens = (",
    ),
    ("srt/speculative/eagle_utils.py", 106, "organize_draft_results", "top_scores = torch.topk("),
]


class NodeModel:
    """The model's answer for one launch on one node: memory, failures, and step times."""

    def __init__(self, hw: HardwareProfile, model: ModelProfile, settings: LaunchSettings) -> None:
        self.hw = hw
        self.model = model
        self.settings = settings
        self.tp = settings.tp_size
        self.warnings: list[str] = []
        self.notes: list[str] = []  # what SGLang logs at info level while it resolves its arguments
        self.spec = self._resolve_spec()
        self.custom_allreduce = self._custom_allreduce_enabled()
        if self._auto_flashinfer_fusion and not settings.enable_flashinfer_allreduce_fusion:
            self.notes.append(
                f"Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for {model.architecture}"
            )
        if settings.enable_torch_symm_mem and "torch_symm_mem" in hw.unsupported:
            # Only SM 9 and 10 have sizes (all_reduce_utils.py:3-16): the communicator is skipped, no crash.
            self.warnings.append(
                f"TorchSymmMemCommunicator: Device capability {hw.compute_capability.split('.')[0]} not "
                "supported, communicator is not available."
            )
        self.plan = self._plan_memory()
        self.startup_failure = self._startup_failure()

    # -- settings ---------------------------------------------------------------------------------------
    @property
    def accept_length(self) -> float | None:
        return self.spec.accept_length if self.spec else None

    def accept_length_for(self, predictability: float) -> float | None:
        """The accept length of a request whose prompt has this predictability (see sim.predictability)."""
        spec, draft = self.spec, self.model.draft
        if spec is None or draft is None or predictability <= 0:
            return self.accept_length
        rate = request_accept_rate(draft.accept_rate, predictability)
        return accept_length(rate, spec.num_steps, spec.topk, spec.num_draft_tokens)

    def _resolve_spec(self) -> SpecSettings | None:
        s, draft = self.settings, self.model.draft
        if s.speculative_algorithm not in EAGLE_ALGORITHMS or draft is None:
            return None
        steps, topk, tokens = (
            s.speculative_num_steps,
            s.speculative_eagle_topk,
            s.speculative_num_draft_tokens,
        )
        if steps is None:
            steps, topk, tokens = draft.default_spec
        topk = topk or 1
        if topk == 1:
            tokens = steps + 1  # SGLang forces a chain: one draft token per step plus the bonus token
        tokens = tokens or steps + 1
        return SpecSettings(steps, topk, tokens, accept_length(draft.accept_rate, steps, topk, tokens))

    def _custom_allreduce_enabled(self) -> bool:
        s, hw = self.settings, self.hw
        if s.disable_custom_all_reduce or self.tp not in (2, 4, 6, 8):
            return False
        if hw.interconnect == "nvlink" or self.tp == 2 or s.force_custom_allreduce:
            return True
        self.warnings.append(
            "Custom allreduce is disabled because it's not supported on more than two PCIe-only GPUs. "
            "To silence this warning, specify --disable-custom-all-reduce explicitly."
        )
        return False

    # -- NCCL -------------------------------------------------------------------------------------------
    def nccl_link(self) -> tuple[str, LinkProfile]:
        """The transport NCCL uses between the node's GPUs under these settings."""
        nccl, hw = self.settings.nccl, self.hw
        level = nccl.p2p_level or "PXB"  # by default NCCL does not use P2P across host bridges
        if not nccl.p2p_disable and P2P_LEVELS.index(level) >= P2P_LEVELS.index(hw.gpu_path):
            return "p2p", hw.p2p
        if not nccl.shm_disable:
            return "shm", hw.shm
        return "socket", hw.socket

    def nccl_channels(self) -> int:
        nccl = self.settings.nccl
        channels = self.hw.nccl_default_channels
        if nccl.max_channels:
            channels = min(channels, nccl.max_channels)
        if nccl.min_channels:
            channels = max(channels, nccl.min_channels)
        return max(1, min(64, channels))  # NCCL clamps silently

    def nccl_memory_gb(self) -> float:
        nccl = self.settings.nccl
        transport, _ = self.nccl_link()
        connections = 2 if nccl.algo else 4  # ring send/recv, plus tree up/down unless one is forced
        if transport != "p2p":
            per_connection_mib = SHM_GPU_MIB_PER_CONNECTION
        else:
            ll128 = self.hw.interconnect == "nvlink" or nccl.proto == "LL128"
            per_connection_mib = nccl.buffsize / MIB + LL_MIB + (LL128_MIB if ll128 else 0.0)
        return NCCL_BASE_GB + self.nccl_channels() * connections * per_connection_mib * MIB / GB

    def nccl_protocol(self, nbytes: float) -> tuple[str, str]:
        """NCCL's (algorithm, protocol) for one all-reduce: forced by the env, else NCCL's size thresholds."""
        nccl = self.settings.nccl
        if nccl.proto:
            proto = nccl.proto
        elif nbytes <= LL_MAX_BYTES:
            proto = "LL"
        elif self.hw.interconnect == "nvlink" and nbytes <= LL128_MAX_BYTES:
            proto = "LL128"  # NCCL only enables LL128 over NVLink
        else:
            proto = "Simple"
        return nccl.algo or "Ring", proto  # within one node NCCL's tuner keeps to rings

    def nccl_allreduce_us(self, nbytes: float) -> float:
        """One NCCL all-reduce of `nbytes` on all TP ranks over the transport these settings give."""
        n = self.tp
        _, link = self.nccl_link()
        algo, proto = self.nccl_protocol(nbytes)
        hops = 2 * (n - 1) if algo == "Ring" else 2 * math.ceil(math.log2(n))
        moved = 2 * (n - 1) / n * nbytes if algo == "Ring" else 2 * nbytes
        if proto == "LL":
            hop_us, bw_share = link.ll_hop_us, 0.5  # LL sends a flag with every 4 bytes of data
        elif proto == "LL128" and self.hw.interconnect == "nvlink":
            hop_us, bw_share = link.ll_hop_us * 1.3, 0.92
        elif proto == "LL128":
            hop_us, bw_share = link.simple_hop_us * 1.3, 0.92  # forced off NVLink: no fast path
        else:
            hop_us, bw_share = link.simple_hop_us, 1.0
        if algo == "Tree":
            bw_share *= 0.5  # a tree's links carry the data up and down
        channels = self.nccl_channels()
        used = max(1, min(channels, math.ceil(nbytes / CHANNEL_BYTES)))
        bandwidth = link.bandwidth_gbps * 1e3 * bw_share * min(used, LINK_SATURATING_CHANNELS)
        bandwidth /= LINK_SATURATING_CHANNELS  # bytes per us
        sync_us = hops * 0.1 * (used - 1) + 0.05 * channels  # every channel is polled on every op
        refills = 0.0
        if proto == "Simple":  # Simple moves data in buffsize/8 slices; each extra slice is a hop's wait
            refills = max(0.0, moved / used / (self.settings.nccl.buffsize / 8) - 1) * hop_us * 0.25
        return hops * hop_us + moved / bandwidth + sync_us + refills

    def allreduce_us(self, nbytes: float, in_graph: bool) -> float:
        """One tensor-parallel all-reduce as SGLang dispatches it: custom first, then NCCL."""
        if self.tp == 1:
            return 0.0
        launch = 0.0 if in_graph else 2 * self.hw.kernel_launch_us
        if not in_graph and self.nccl_link()[0] != "p2p":
            # Eager collectives over host memory wait on NCCL's proxy thread; a graph pre-posts its work.
            launch += self.hw.proxy_wait_us
        if self.custom_allreduce and nbytes < CUSTOM_ALLREDUCE_MAX_BYTES:
            return self.hw.custom_allreduce_us * (1 + nbytes / (512 * 1024)) + launch
        cost = self.nccl_allreduce_us(nbytes)
        if self.settings.enable_torch_symm_mem and "torch_symm_mem" not in self.hw.unsupported:
            cost *= 0.7
        if self.flashinfer_fusion and self.hw.interconnect == "nvlink":
            cost *= 0.8
        return cost + launch

    # -- memory -----------------------------------------------------------------------------------------
    @property
    def _gpu_mib(self) -> float:
        return self.hw.gpu_memory_gb * GB / MIB

    def _auto_chunked_prefill(self) -> int:
        """SGLang 0.5.17's table by GPU memory in MiB (server_args.py:4634-4690)."""
        mib = self._gpu_mib
        return 2048 if mib < 35 * 1024 else 4096 if mib < 60 * 1024 else 8192 if mib < 160 * 1024 else 16384

    def _auto_cuda_graph_max_bs(self) -> int:
        mib, small_tp = self._gpu_mib, self.tp < 4
        if mib < 20 * 1024:
            return 8
        if mib < 35 * 1024:
            return 24 if small_tp else 80
        if mib < 60 * 1024:
            return 32 if small_tp else 160
        if mib < 160 * 1024:
            return 256 if small_tp else 512
        return 512

    @property
    def attention_backend(self) -> str:
        """The flag, else the backend SGLang picks for this GPU (B9; harness: Kimi-K2.5 gets triton on SM120
        and fa3 on SM90; on SM90 an EAGLE tree (topk > 1) gets triton, other models fa3)."""
        if self.settings.attention_backend:
            return self.settings.attention_backend
        major = int(self.hw.compute_capability.split(".")[0])
        if major != 9:
            return "triton" if self.uses_mla else self.model.default_attention_backend
        return "triton" if self.spec and self.spec.topk > 1 else "fa3"

    @property
    def flashinfer_fusion(self) -> bool:
        """FlashInfer all-reduce fusion: asked for, or turned on by SGLang for the architectures it lists on
        SM90 and SM10X (B8; arg_groups/overrides.py:1863-1907)."""
        return self.settings.enable_flashinfer_allreduce_fusion or self._auto_flashinfer_fusion

    @property
    def _auto_flashinfer_fusion(self) -> bool:
        s = self.settings
        return (
            self.model.architecture in FLASHINFER_FUSION_ARCHITECTURES
            and self.hw.compute_capability.split(".")[0] in ("9", "10")
            and s.tp_size > 1
            and s.moe_a2a_backend == "none"
        )

    @property
    def uses_mla(self) -> bool:
        return not self.model.kv_sharded_by_tp  # an MLA latent cache is the one every rank holds whole

    def _prefill_graph_max_tokens(self, chunked: int) -> int:
        # server_args.py:4723-4731: the chunk size, or 2048 for MLA backends.
        return 2048 if self.uses_mla else chunked

    def _auto_mem_fraction(self, chunked: int, max_bs: int) -> float:
        """The reservation the seed's figures were calibrated with (SGLang 0.5.4's, in MB), not 0.5.17's (B2:
        no EAGLE term, a prefill-graph reserve, x0.91 for Kimi-K2.5's vision tower). 0.5.17's would take the
        seed's baseline from 80 to 71.5 tok/s, and with the vision factor leave Kimi no KV pool at all, so the
        seed cannot have run it; taking it needs the profiles re-fitted on a 0.5.17 measurement."""
        total_mb = self.hw.gpu_memory_gb * 1000
        reserved = 512 + max(chunked, 2048) * 1.5 + self.tp / 8 * 1024
        if not self.settings.disable_cuda_graph:
            reserved += max_bs * 2  # 0.5.17 reserves for the decode graphs only when there are any
        if self.hw.gpu_memory_gb > 60:
            reserved = max(reserved, 10240)
        if self.spec:
            reserved += 2048
        return round((total_mb - reserved) / total_mb, 3)

    def kv_bytes_per_token(self) -> float:
        m = self.model
        per_gpu = m.kv_bytes_per_token / (self.tp if m.kv_sharded_by_tp else 1)
        if self.settings.kv_cache_dtype.startswith("fp8"):
            per_gpu /= 2
        if self.spec and m.draft:
            per_gpu += m.draft.kv_bytes_per_token
        return per_gpu

    def _plan_memory(self) -> MemoryPlan:
        s, m, hw = self.settings, self.model, self.hw
        flag_chunked = s.chunked_prefill_size or self._auto_chunked_prefill()
        # -1 disables chunking: a prompt is prefilled whole (SGLang's reservation still counts 2048).
        chunked = m.context_len if flag_chunked < 0 else flag_chunked
        max_bs = s.cuda_graph_max_bs or self._auto_cuda_graph_max_bs()
        mfs = s.mem_fraction_static or self._auto_mem_fraction(flag_chunked, max_bs)
        total = hw.gpu_memory_gb
        nccl_gb = self.nccl_memory_gb()
        init_used = hw.cuda_context_gb + nccl_gb + (0.12 if self.custom_allreduce else 0.0)
        weights = m.weight_gb / self.tp + (m.draft.weight_gb / self.tp if self.spec and m.draft else 0.0)
        avail_after_weights = total - init_used - weights
        # SGLang sizes the KV pool as what is left of the static fraction after everything before it.
        kv_gb = mfs * total - init_used - weights - m.runtime_overhead_gb
        kv_tokens = max(0, int(kv_gb * GB / self.kv_bytes_per_token()))
        avail_after_kv = avail_after_weights - m.runtime_overhead_gb - max(kv_gb, 0.0)
        # Weights that leave the static budget no room at all (kv_cache_configurator.py:1639-1655).
        static_rest_gb = mfs * total - init_used - weights
        default_running = 48 if self.spec else 4096
        max_running = s.max_running_requests or max(1, min(default_running, kv_tokens // 2))
        speculative = s.speculative_algorithm is not None
        sizes = [] if s.disable_cuda_graph else captured_batch_sizes(max_bs, speculative, max_running)
        tokens_per_bs = self.spec.num_draft_tokens if self.spec else 1
        graph_gb = (m.graph_mb_per_bs * max(sizes, default=0) * tokens_per_bs + 12 * len(sizes)) / 1000
        prefill_max_tokens = self._prefill_graph_max_tokens(chunked)
        prefill_sizes = prefill_graph_token_sizes(prefill_max_tokens) if s.prefill_cuda_graph else []
        # Only the prefill graphs' non-torch memory stays (server_args.py:4905-4910); MLA's is far larger.
        prefill_graph_gb = (
            1.5 * 1024 * MIB / GB if self.uses_mla else len(prefill_sizes) * 8 * MIB / GB
        ) * bool(prefill_sizes)
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

    # -- failures ---------------------------------------------------------------------------------------
    def _startup_failure(self) -> StartupFailure | None:
        s, hw, plan = self.settings, self.hw, self.plan
        if s.tp_size * s.dp_size > hw.num_gpus:
            return StartupFailure(
                "init",
                _traceback(
                    [
                        *_SCHEDULER_INIT,
                        (
                            "srt/model_executor/model_runner.py",
                            512,
                            "init_torch_distributed",
                            "torch.get_device_module(self.device).set_device(self.gpu_id)",
                        ),
                    ],
                    "torch.AcceleratorError: CUDA error: invalid device ordinal",
                ),
                rank=hw.num_gpus,
            )
        if plan.weights_gb > plan.total_gb - plan.init_used_gb:
            return StartupFailure(
                "load",
                _traceback(
                    [
                        *_SCHEDULER_INIT,
                        ("srt/model_loader/loader.py", 601, "load_model", "model = _initialize_model("),
                    ],
                    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
                    f"total capacity of {hw.gpu_memory_gb / 1.0737:.2f} GiB of which 0.51 GiB is free.",
                ),
            )
        if s.attention_backend == "fa3" and "fa3" in hw.unsupported:
            return StartupFailure(
                "init",
                _traceback(
                    _SCHEDULER_INIT,
                    "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
                    "Please use `--attention-backend flashinfer`.",
                ),
            )
        if s.ep_size > 1 and "expert_parallel_flashinfer_a2a" in hw.unsupported:
            return StartupFailure(
                "load",
                _traceback(
                    [
                        *_SCHEDULER_INIT,
                        (
                            "srt/layers/moe/token_dispatcher/flashinfer.py",
                            88,
                            "__init__",
                            "assert self.num_local_experts * self.ep_size == self.num_experts"
                            " and is_sm100_supported()",
                        ),
                    ],
                    "AssertionError",
                ),
                rank=3,
            )
        if plan.static_rest_gb <= 0 or plan.kv_tokens <= 0:
            return StartupFailure("kv", self._kv_pool_failure(), rank=3)
        if self.flashinfer_fusion and "flashinfer_allreduce_fusion" in hw.unsupported:
            return StartupFailure(
                "runner",
                _traceback(
                    [
                        *_SCHEDULER_INIT,
                        ("srt/model_executor/runner/base_runner.py", 231, "warmup", "self._init_ar_fusion()"),
                        ("srt/layers/flashinfer_comm_fusion.py", 46, "_resolve_backend", "raise ValueError("),
                    ],
                    "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
                ),
            )
        if plan.avail_after_graph_gb + plan.prefill_graph_gb < 0.5:
            need = plan.graph_gb / max(len(plan.captured_batch_sizes), 1) * 4
            return StartupFailure(
                "capture", self._capture_failed(self._torch_oom(need, plan.avail_after_kv_gb))
            )
        if self.spec and not self.spec.tree_has_enough_candidates:
            # The draft graph capture fails, or without graphs the first draft forward (at warm-up).
            if plan.captured_batch_sizes:
                return StartupFailure(
                    "capture", self._capture_failed("selected index k out of range", draft=True)
                )
            return StartupFailure(
                "warmup", _traceback(_DRAFT_FORWARD, "RuntimeError: selected index k out of range")
            )
        if plan.avail_after_graph_gb < 0.5:
            return StartupFailure("prefill_capture", self._prefill_capture_failed(plan))
        return None

    def _torch_oom(self, need_gb: float, free_gb: float) -> str:
        """torch's out-of-memory text; the model's GB shown in GiB as torch does."""
        return (
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gb / 1.0737:.2f} GiB. "
            f"GPU 0 has a total capacity of {self.hw.gpu_memory_gb / 1.0737:.2f} GiB of which "
            f"{max(free_gb, 0.0) / 1.0737:.2f} GiB is free."
        )

    @property
    def prefill_graph_backend(self) -> str:
        """The prefill graph backend: the flag, else tc_piecewise for MLA models (as SGLang resolved
        Kimi-K2.5, B12) and breakable otherwise (`default_prefill_backend`, cuda_graph_config.py:113)."""
        explicit = self.settings.prefill_cuda_graph_backend
        return explicit or ("tc_piecewise" if self.uses_mla else "breakable")

    def _kv_pool_failure(self) -> list[str]:
        plan = self.plan
        frames = [
            *_SCHEDULER_INIT,
            ("srt/model_executor/model_runner.py", 612, "initialize", "self.init_memory_pool("),
        ]
        if plan.static_rest_gb <= 0:
            minimum = 1 - plan.avail_after_weights_gb / plan.pre_load_avail_gb
            return _traceback(
                [
                    *frames,
                    (
                        "srt/mem_cache/kv_cache_configurator.py",
                        1646,
                        "profile_max_num_token",
                        "raise ValueError(",
                    ),
                ],
                "ValueError: Loaded weights leave no GPU memory for the KV cache under "
                f"--mem-fraction-static={plan.mem_fraction_static}. Raise --mem-fraction-static above "
                f"{math.ceil(minimum * 1000) / 1000:.3f} "
                f"(minimum viable = 1 - available/pre = {minimum:.4f}). "
                "If using speculative decoding, draft weights are now counted.",
            )
        # A positive remainder too small for one token (model_executor/pool_configurator.py:62-67).
        return _traceback(
            [
                *frames,
                ("srt/model_executor/pool_configurator.py", 67, "__post_init__", "raise RuntimeError(msg)"),
            ],
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={plan.mem_fraction_static}",
        )

    def _prefill_capture_failed(self, plan: MemoryPlan) -> list[str]:
        """Prefill graphs run out of memory: only tc_piecewise wraps the error (prefill_cuda_graph_runner.py
        372-381); breakable lets torch's error through."""
        backend = self.prefill_graph_backend
        torch_error = self._torch_oom(
            plan.prefill_graph_gb, plan.avail_after_graph_gb + plan.prefill_graph_gb
        )
        frames = [
            *_SCHEDULER_INIT,
            (
                "srt/model_executor/runner/prefill_cuda_graph_runner.py",
                378,
                "__init__",
                "raise RuntimeError(",
            ),
        ]
        if backend != "tc_piecewise":
            return _traceback(frames, torch_error)
        return [
            *_traceback(frames, f"RuntimeError: Capture prefill CUDA graph failed: {torch_error}"),
            "Fail when using backend: tc_piecewise for prefill runner.",
            "Possible suggestions:",
            "1. change to breakable by --cuda-graph-backend-prefill=breakable",
            "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled",
            "3. if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
            "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)",
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ",
        ]

    def _capture_failed(self, torch_error: str, draft: bool = False) -> list[str]:
        """SGLang's decode (or EAGLE draft) capture wrapper and `CUDA_GRAPH_CAPTURE_FAILED_MSG`
        (decode_cuda_graph_runner.py:414-419, runner_backend_utils/__init__.py:14-21)."""
        runner = (
            ("srt/speculative/eagle_draft_cuda_graph_runner.py", 273, "__init__", "raise Exception(")
            if draft
            else (
                "srt/model_executor/runner/decode_cuda_graph_runner.py",
                417,
                "__init__",
                "raise Exception(",
            )
        )
        return [
            *_traceback([*_SCHEDULER_INIT, runner], f"Exception: Capture cuda graph failed: {torch_error}"),
            "Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
            "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
            "(Not recommended. Huge performance loss)",
            "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ",
        ]

    def oom_under_load_lines(self, prefill_tokens: int) -> list[str]:
        """What a scheduler prints when a prefill batch's activations overflow what is left."""
        need = prefill_tokens * self.plan.activation_gb_per_token
        return _traceback(
            [
                ("srt/managers/scheduler.py", 1024, "event_loop_normal", "result = self.run_batch(batch)"),
                (
                    "srt/managers/scheduler.py",
                    1876,
                    "run_batch",
                    "logits_output, next_token_ids, can_run_cuda_graph = (",
                ),
                ("srt/model_executor/model_runner.py", 1987, "forward_extend", "return self.model.forward("),
            ],
            self._torch_oom(need, self.plan.avail_after_graph_gb),
        )

    # -- timings ----------------------------------------------------------------------------------------
    @property
    def init_seconds(self) -> float:
        return 15.0

    @property
    def load_seconds(self) -> float:
        return self.model.weight_gb / self.model.load_gbps

    @property
    def prefill_capture_seconds(self) -> float:
        return 0.05 * len(self.plan.prefill_graph_sizes)

    @property
    def capture_seconds(self) -> float:
        per_size = 0.4 * (1 + (self.spec.num_steps if self.spec else 0))
        return per_size * len(self.plan.captured_batch_sizes)

    # -- performance ------------------------------------------------------------------------------------
    def _attention_factor(self) -> float:
        backend = self.settings.attention_backend or self.model.default_attention_backend
        return {"triton": 1.18, "fa3": 0.9, "flashinfer": 1.0}.get(backend, 1.05)

    def forward_s(
        self, tokens: int, context_tokens: int, in_graph: bool, routed_tokens: float | None = None
    ) -> float:
        """One target-model forward over `tokens` new tokens attending to `context_tokens` in all.

        `routed_tokens` is how many independently routed tokens the MoE layers see (fewer than `tokens`
        when several come from one sequence, as a verify pass's draft tokens do)."""
        m, hw = self.model, self.hw
        if m.num_experts:
            routed = tokens if routed_tokens is None else routed_tokens
            distinct = m.num_experts * (1 - (1 - m.experts_per_token / m.num_experts) ** routed)
            read_gb = m.dense_read_gb + distinct * m.expert_gb
        else:
            read_gb = m.dense_read_gb
        weights_s = read_gb / self.tp / hw.memory_bandwidth_gbps
        compute_s = 2 * m.active_params_b * 1e9 * tokens / (self.tp * hw.compute_tflops * 1e12)
        attention_s = context_tokens * self.kv_bytes_per_token() / (hw.memory_bandwidth_gbps * GB)
        attention_s *= self._attention_factor()
        count = m.num_layers * m.allreduces_per_layer
        comm_s = count * self.allreduce_us(tokens * m.hidden_size * 2, in_graph) * 1e-6
        if self.settings.ep_size > 1:
            comm_s *= 1.1  # all-to-all dispatch of tokens to experts on top of the attention all-reduces
        launch_s = 0.0 if in_graph else m.num_layers * m.kernels_per_layer * hw.kernel_launch_us * 1e-6
        return max(weights_s, compute_s) + attention_s + comm_s + launch_s + m.step_overhead_ms * 1e-3

    def _in_graph(self, batch: int) -> bool:
        return batch <= max(self.plan.captured_batch_sizes, default=0)

    def decode_step_s(self, batch: int, context_tokens: int) -> float:
        """One decode step of `batch` requests; with speculation, draft + verify + draft extend."""
        if not self.spec:
            return self.forward_s(batch, context_tokens, self._in_graph(batch))
        draft = self.model.draft
        assert draft is not None  # _resolve_spec returns None without a draft profile
        in_graph = self._in_graph(batch)
        verify_in_graph = in_graph and draft.verify_in_cuda_graph
        ar_bytes = batch * self.spec.topk * self.model.hidden_size * 2
        draft_step_s = draft.step_ms * 1e-3 * (1 + 0.03 * batch * self.spec.topk)
        draft_step_s += draft.allreduces_per_step * self.allreduce_us(ar_bytes, in_graph) * 1e-6
        verify_tokens = batch * self.spec.num_draft_tokens
        # Draft tokens of one sequence follow its context, so they mostly route to the same experts.
        routed = batch * (1 + (self.spec.num_draft_tokens - 1) * draft.routing_overlap)
        verify_s = self.forward_s(verify_tokens, context_tokens + verify_tokens, verify_in_graph, routed)
        return (self.spec.num_steps + 1) * draft_step_s + verify_s

    def verify_allreduce_s(self, batch: int) -> float:
        """Time the verify pass spends in all-reduces at `batch` (0 without speculation)."""
        if not self.spec:
            return 0.0
        assert self.model.draft is not None  # no spec without a draft profile
        in_graph = self._in_graph(batch) and self.model.draft.verify_in_cuda_graph
        tokens = batch * self.spec.num_draft_tokens
        count = self.model.num_layers * self.model.allreduces_per_layer
        return count * self.allreduce_us(tokens * self.model.hidden_size * 2, in_graph) * 1e-6

    def prefill_step_s(self, tokens: int, context_tokens: int) -> float:
        """One prefill (extend) batch of `tokens` new tokens; prefill is not graph-captured."""
        return self.forward_s(tokens, context_tokens, in_graph=False)

    def new_engine(self, seed: int = 0, noise: float = 0.0) -> Engine:
        """A scheduler for this launch, in model time; `noise` is the run-to-run spread (0.03 = 3%)."""
        from autotune.sim.engine import Engine

        return Engine(self, seed=seed, noise=noise)
