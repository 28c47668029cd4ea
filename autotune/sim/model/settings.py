"""What the model reads from a launch: SGLang's flags, the NCCL environment, speculative decoding.

Memory is in GB (1e9 bytes) per GPU throughout the model; `MIB` is NCCL's and torch's unit.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.sim.model.startup import DEFAULT_LOAD_THREADS, load_threads, presharded_path
from autotune.sim.profiles import P2P_LEVELS

GB = 1e9
MIB = 1 << 20
PROTOCOLS = ("LL", "LL128", "Simple")


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
    prefill_cuda_graph_max_tokens: int | None = None  # `--cuda-graph-max-bs-prefill`; None: SGLang's default
    page_size: int = 1
    chunked_prefill_size: int | None = None
    disable_radix_cache: bool = False
    schedule_policy: str = "fcfs"
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
    load_threads: int = DEFAULT_LOAD_THREADS  # the weight loader's (--model-loader-extra-config)
    load_format: str = "auto"
    presharded_path: str | None = None  # the presharded dumps' folder (--model-loader-extra-config)
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
            prefill_cuda_graph_max_tokens=getattr(ns, "cuda_graph_max_bs_prefill", None),
            page_size=int(arg("page_size", 1)),  # type: ignore[call-overload]
            chunked_prefill_size=getattr(ns, "chunked_prefill_size", None),
            disable_radix_cache=bool(arg("disable_radix_cache", False)),
            schedule_policy=str(arg("schedule_policy", "fcfs")),
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
            load_threads=load_threads(getattr(ns, "model_loader_extra_config", None)),
            load_format=str(arg("load_format", "auto")),
            presharded_path=presharded_path(getattr(ns, "model_loader_extra_config", None)),
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
