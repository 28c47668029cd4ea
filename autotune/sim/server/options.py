"""The simulated server's options: the simulator-only `SGLANG_SIM_*` settings, the arguments SGLang
resolves from its flags, and the environment its ranks run with."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autotune.errors import ConfigError
from autotune.sim.model import NodePerformanceModel, prefill_graph_token_sizes
from autotune.sim.model.noise import NO_NOISE, SimNoise
from autotune.sim.profiles import load_hardware_profile
from autotune.sim.server_args import CudaGraphConfig, PhaseConfig
from autotune.sim.versions import DEFAULT_VERSION, VERSIONS, SglangVersion, sglang_version

DEFAULT_HARDWARE = "rtx-pro-6000-pcie-x8"
DEFAULT_MODEL = "kimi-k2.5-int4"
FAULTS = ("hang_load", "crash_benchmark", "slow_health", "linger")
DEFAULT_CRASH_AFTER_TOKENS = 200


@dataclass(frozen=True)
class SimOptions:
    """The simulator-only settings, read from `SGLANG_SIM_*` environment variables."""

    hardware: str = DEFAULT_HARDWARE
    model: str | None = None  # None: the model at --model-path (sim.model_folder), else DEFAULT_MODEL
    time_scale: float = 1.0
    startup_time_scale: float = 1.0
    seed: int = 0
    noise: SimNoise = NO_NOISE
    faults: frozenset[str] = frozenset()
    crash_after_tokens: int = DEFAULT_CRASH_AFTER_TOKENS
    version: SglangVersion = VERSIONS[DEFAULT_VERSION]

    @classmethod
    def from_env(cls, env: Mapping[str, str], default_seed: int | None = None) -> SimOptions:
        """Parse the environment; a malformed value is a `ConfigError` naming the variable and the fix."""
        scale = _env_number(env, "SGLANG_SIM_TIME_SCALE", 1.0, float)
        if scale <= 0:
            raise _env_error("SGLANG_SIM_TIME_SCALE", scale, "must be positive", "Use e.g. 1.0 or 0.001.")
        startup = _env_number(env, "SGLANG_SIM_STARTUP_TIME_SCALE", scale, float)
        if startup <= 0:
            raise _env_error(
                "SGLANG_SIM_STARTUP_TIME_SCALE", startup, "must be positive", "Use e.g. 0.005 or unset it."
            )
        hardware = env.get("SGLANG_SIM_HARDWARE") or DEFAULT_HARDWARE
        lease = int(_env_number(env, "SGLANG_SIM_LEASE", 0, int))
        try:
            spreads = load_hardware_profile(hardware).noise
            noise = SimNoise.parse(env.get("SGLANG_SIM_NOISE", ""), spreads, lease)
        except ValueError:
            raise _env_error(
                "SGLANG_SIM_NOISE",
                env.get("SGLANG_SIM_NOISE"),
                "must be off, calibrated, or a spread in [0, 1)",
                "Use calibrated (the hardware profile's noise), 0.03 for 3%, or off.",
            ) from None
        fresh = default_seed if default_seed is not None else int.from_bytes(os.urandom(4), "little")
        seed = int(_env_number(env, "SGLANG_SIM_SEED", fresh, int))
        faults, crash_after = _parse_faults(env.get("SGLANG_SIM_FAULT", ""))
        return cls(
            hardware=hardware,
            model=env.get("SGLANG_SIM_MODEL") or None,
            time_scale=scale,
            startup_time_scale=startup,
            seed=seed,
            noise=noise,
            faults=faults,
            crash_after_tokens=crash_after,
            version=sglang_version(env),
        )


def _env_error(name: str, value: object, problem: str, fix: str) -> ConfigError:
    return ConfigError("environment", name, value, problem, fix)


def _env_number(env: Mapping[str, str], name: str, default: float, kind: type[float] | type[int]) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return kind(raw)
    except ValueError:
        raise _env_error(name, raw, f"is not {'an integer' if kind is int else 'a number'}", "") from None


def _parse_faults(raw: str) -> tuple[frozenset[str], int]:
    faults: set[str] = set()
    crash_after = DEFAULT_CRASH_AFTER_TOKENS
    for item in filter(None, (part.strip() for part in raw.split(","))):
        name, _, arg = item.partition(":")
        if name not in FAULTS:
            raise _env_error("SGLANG_SIM_FAULT", item, "names no known fault", f"Use one of {list(FAULTS)}.")
        if arg:
            if name != "crash_benchmark" or not arg.isdigit():
                raise _env_error(
                    "SGLANG_SIM_FAULT", item, "has an argument it cannot take", "Only crash_benchmark:N does."
                )
            crash_after = int(arg)
        faults.add(name)
    return frozenset(faults), crash_after


def resolved_server_args(ns: argparse.Namespace, node: NodePerformanceModel, seed: int) -> dict[str, Any]:
    """The arguments as SGLang holds them after `ServerArgs.__post_init__`: automatic values filled in."""
    values = {k: v for k, v in vars(ns).items() if k not in ("deprecation_warnings", "sglang_version")}
    plan = node.plan
    values["tokenizer_path"] = ns.tokenizer_path or ns.model_path
    values["served_model_name"] = ns.served_model_name or ns.model_path
    values["mem_fraction_static"] = plan.mem_fraction_static
    values["chunked_prefill_size"] = (
        ns.chunked_prefill_size if ns.chunked_prefill_size is not None else plan.chunked_prefill_size
    )
    dropped = plan.prefill_graph_dropped_at_gb is not None
    graphs = CudaGraphConfig(
        decode=PhaseConfig(
            backend="disabled"
            if node.settings.disable_cuda_graph
            else ns.cuda_graph_backend_decode or "full",
            max_bs=plan.cuda_graph_max_bs,
            bs=plan.captured_batch_sizes or None,
        ),
        prefill=PhaseConfig(
            backend=node.prefill_graph_backend if node.settings.prefill_cuda_graph else "disabled",
            max_bs=plan.prefill_graph_max_tokens,
            # resolved before 0.5.17's memory gate can drop them, so logged either way
            bs=plan.prefill_graph_sizes
            or (prefill_graph_token_sizes(plan.prefill_graph_max_tokens) if dropped else None),
        ),
    )
    # ServerArgs declares cuda_graph_config just before the per-phase flags (server_args.py:1799).
    at = list(values).index("cuda_graph_backend_decode")
    items = list(values.items())
    values = dict([*items[:at], ("cuda_graph_config", graphs), *items[at:]])
    values["page_size"] = ns.page_size if ns.page_size is not None else 1
    values["random_seed"] = ns.random_seed if ns.random_seed is not None else seed
    values["device"] = ns.device or "cuda"
    values["attention_backend"] = ns.attention_backend or node.attention_backend
    if ns.moe_a2a_backend in ("deepep", "mooncake"):
        values["ep_size"] = ns.tp_size
    if ns.speculative_algorithm is not None:
        values["max_running_requests"] = ns.max_running_requests or 48  # spec v2 keeps overlap (B1)
    if ns.speculative_algorithm == "NEXTN":
        values["speculative_algorithm"] = "EAGLE"
    if node.spec is not None:
        values["speculative_num_steps"] = node.spec.num_steps
        values["speculative_eagle_topk"] = node.spec.topk
        values["speculative_num_draft_tokens"] = node.spec.num_draft_tokens
    return values


def sglang_environment(ns: argparse.Namespace, env: Mapping[str, str]) -> dict[str, str]:
    """The environment SGLang's ranks run with: `_set_envs_and_config` (engine.py:1582-1591, [23] 1898-1916)
    sets the two NCCL variables only where they are unset (or a symmetric-memory/NVLS flag asks), so a tuned
    `NCCL_CUMEM_ENABLE` takes effect."""
    ran_with = dict(env)
    if ns.enable_symm_mem or "NCCL_CUMEM_ENABLE" not in env:
        ran_with["NCCL_CUMEM_ENABLE"] = str(int(ns.enable_symm_mem))
    if ns.enable_nccl_nvls or ns.enable_symm_mem or "NCCL_NVLS_ENABLE" not in env:
        ran_with["NCCL_NVLS_ENABLE"] = str(int(ns.enable_nccl_nvls or ns.enable_symm_mem))
    ran_with["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
    ran_with["CUDA_MODULE_LOADING"] = "AUTO"
    return ran_with
