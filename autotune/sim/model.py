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
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
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
            cuda_graph_max_bs=getattr(ns, "cuda_graph_max_bs", None),
            disable_cuda_graph=bool(arg("disable_cuda_graph", False)),
            chunked_prefill_size=getattr(ns, "chunked_prefill_size", None),
            max_running_requests=getattr(ns, "max_running_requests", None),
            attention_backend=getattr(ns, "attention_backend", None),
            moe_a2a_backend=str(arg("moe_a2a_backend", "none")),
            disable_custom_all_reduce=bool(arg("disable_custom_all_reduce", False)),
            enable_flashinfer_allreduce_fusion=bool(arg("enable_flashinfer_allreduce_fusion", False)),
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


@dataclass(frozen=True)
class StartupFailure:
    """SGLang dying during startup: the phase, the failing rank and the exact lines it prints."""

    phase: str  # init | load | kv | capture | warmup
    lines: list[str]
    rank: int = 0


def captured_batch_sizes(max_bs: int) -> list[int]:
    """SGLang 0.5.4's captured decode batch sizes, cut at --cuda-graph-max-bs."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    return [s for s in sizes if s <= max_bs]


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


class NodeModel:
    """The model's answer for one launch on one node: memory, failures, and step times."""

    def __init__(self, hw: HardwareProfile, model: ModelProfile, settings: LaunchSettings) -> None:
        self.hw = hw
        self.model = model
        self.settings = settings
        self.tp = settings.tp_size
        self.warnings: list[str] = []
        self.spec = self._resolve_spec()
        self.custom_allreduce = self._custom_allreduce_enabled()
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
        if self.settings.enable_flashinfer_allreduce_fusion and self.hw.interconnect == "nvlink":
            cost *= 0.8
        return cost + launch

    # -- memory -----------------------------------------------------------------------------------------
    def _auto_chunked_prefill(self) -> int:
        return 8192 if self.hw.gpu_memory_gb >= 60 else 4096

    def _auto_cuda_graph_max_bs(self) -> int:
        return 512 if self.tp >= 4 and self.hw.gpu_memory_gb >= 80 else 256

    def _auto_mem_fraction(self, chunked: int, max_bs: int) -> float:
        """SGLang 0.5.4's `_handle_gpu_memory_settings` reservation, in MB."""
        total_mb = self.hw.gpu_memory_gb * 1000
        reserved = 512 + max(chunked, 2048) * 1.5 + max_bs * 2 + self.tp / 8 * 1024
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
        sizes = [] if s.disable_cuda_graph else captured_batch_sizes(max_bs)
        tokens_per_bs = self.spec.num_draft_tokens if self.spec else 1
        graph_gb = (m.graph_mb_per_bs * max(sizes, default=0) * tokens_per_bs + 12 * len(sizes)) / 1000
        default_running = 48 if self.spec else 4096
        max_running = s.max_running_requests or max(1, min(default_running, kv_tokens // 2))
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
            avail_after_graph_gb=avail_after_kv - graph_gb,
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
        cc = hw.compute_capability
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
        if s.enable_torch_symm_mem and "torch_symm_mem" in hw.unsupported:
            return StartupFailure(
                "init",
                _traceback(
                    [
                        *_SCHEDULER_INIT[:2],
                        (
                            "srt/distributed/device_communicators/torch_symm_mem.py",
                            58,
                            "__init__",
                            "self.max_size = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
                            "[self.device_capability][self.world_size]",
                        ),
                    ],
                    f"RuntimeError: SymmetricMemory is not supported on device with compute capability {cc}",
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
        if plan.kv_tokens <= 0:
            return StartupFailure(
                "kv",
                _traceback(
                    [
                        *_SCHEDULER_INIT,
                        ("srt/model_executor/model_runner.py", 354, "initialize", "self.init_memory_pool("),
                        (
                            "srt/model_executor/model_runner.py",
                            1543,
                            "init_memory_pool",
                            "raise RuntimeError(",
                        ),
                    ],
                    "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
                    f"Current value: self.server_args.mem_fraction_static={plan.mem_fraction_static}",
                ),
                rank=3,
            )
        if s.enable_flashinfer_allreduce_fusion and "flashinfer_allreduce_fusion" in hw.unsupported:
            return StartupFailure(
                "capture",
                self._capture_failed(
                    "RuntimeError: No supported CUDA architectures found for major versions [9, 10]."
                ),
            )
        if plan.avail_after_graph_gb < 0.5:
            need = plan.graph_gb / max(len(plan.captured_batch_sizes), 1) * 4
            return StartupFailure(
                "capture",
                self._capture_failed(
                    f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need:.2f} GiB. "
                    f"GPU 0 has a total capacity of {hw.gpu_memory_gb / 1.0737:.2f} GiB of which "
                    f"{max(plan.avail_after_kv_gb, 0.0) / 1.0737:.2f} GiB is free."
                ),
            )
        return None

    def _capture_failed(self, torch_error: str) -> list[str]:
        return [
            *_traceback(
                [
                    *_SCHEDULER_INIT,
                    ("srt/model_executor/cuda_graph_runner.py", 385, "__init__", "raise Exception("),
                ],
                f"Exception: Capture cuda graph failed: {torch_error}",
            ),
            "Possible solutions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. set --cuda-graph-max-bs to a smaller value (e.g., 16)",
            "3. disable torch compile by not using --enable-torch-compile",
            "4. disable CUDA graph by --disable-cuda-graph. (Not recommended. Huge performance loss)",
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
            f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need / 1.0737:.2f} GiB. "
            f"GPU 0 has a total capacity of {self.hw.gpu_memory_gb / 1.0737:.2f} GiB of which "
            f"{max(self.plan.avail_after_graph_gb, 0.0) / 1.0737:.2f} GiB is free.",
        )

    # -- timings ----------------------------------------------------------------------------------------
    @property
    def init_seconds(self) -> float:
        return 15.0

    @property
    def load_seconds(self) -> float:
        return self.model.weight_gb / self.model.load_gbps

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
        return not self.settings.disable_cuda_graph and batch <= self.plan.cuda_graph_max_bs

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
