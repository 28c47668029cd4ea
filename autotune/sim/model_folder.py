"""The model the simulated server serves where `SGLANG_SIM_MODEL` names none: the one at `--model-path`.

Its config.json and weights are read as `autotune init` reads them (`autotune.node.inspect.read_model`):
the shipped profile of that shape where there is one (the tests' llama-3-8b-shape folder is
llama-8b-dummy), else a profile built from the shape (layers, hidden size, heads, experts, the weights'
size) on the shipped dense profile nearest in size, whose measured overheads it borrows. A folder without
config.json (the quickstart's /models/Kimi-K2.5, which is not on disk) serves the default profile.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.config.init import ModelFacts
from autotune.node.inspect import read_model
from autotune.node.runner import LocalCommandRunner
from autotune.sim.profiles import (
    PROFILE_DIR,
    HardwareProfile,
    ModelProfile,
    load_hardware_profile,
    load_model_profile,
)
from autotune.sim.server.options import DEFAULT_MODEL, SimOptions

__all__ = ["profile_from_config", "served_model", "shipped_profile_for", "what_is_served"]

# A shipped profile stands for a folder whose weights are within this share of its own.
WEIGHT_MATCH = 0.05
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def served_model(model_path: str) -> ModelProfile | None:
    """The profile of the model at `model_path` on this machine, or None where it has no readable
    config.json."""
    facts, _why = read_model(LocalCommandRunner(), model_path)
    if facts is None:
        return None
    config = json.loads((Path(model_path) / "config.json").read_text())
    shipped = shipped_profile_for(facts, config)
    if shipped is not None:  # served under its path, as SGLang names a model by default
        return shipped.model_copy(update={"served_model_name": model_path})
    return profile_from_config(facts, config)


def what_is_served(env: Mapping[str, str]) -> str:
    """What the simulated server with `env` serves, for `autotune validate`: it loads no weights."""
    named = env.get("SGLANG_SIM_MODEL")
    if named:
        return (
            f"the simulated node reads no weights: it serves the profile SGLANG_SIM_MODEL names ({named}) "
            "and does not read model_path"
        )
    return (
        "the simulated node reads no weights: it serves a model of the shape model_path's config.json "
        f"gives, where that folder is on the node, else the profile {DEFAULT_MODEL}"
    )


def _shipped() -> list[ModelProfile]:
    return [load_model_profile(path.stem) for path in sorted((PROFILE_DIR / "models").glob("*.yaml"))]


def _text(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """The text model's section of a multimodal config.json, else the file itself."""
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(config.get(key), Mapping):
            return config[key]
    return config


def _int(config: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _kv_bytes_per_token(facts: ModelFacts, config: Mapping[str, Any], layers: int, hidden: int) -> int:
    """KV cache bytes per token for the whole model, in bf16: the MLA latent, or K and V of each KV head."""
    if facts.kv_heads == "MLA":
        latent = (_int(config, "kv_lora_rank") or 512) + (_int(config, "qk_rope_head_dim") or 64)
        return latent * 2 * layers
    heads = _int(config, "num_attention_heads") or 1
    head_dim = _int(config, "head_dim") or hidden // heads
    kv_heads = int(facts.kv_heads) if facts.kv_heads and facts.kv_heads.isdigit() else heads
    return 2 * kv_heads * head_dim * 2 * layers


def shipped_profile_for(facts: ModelFacts, config: Mapping[str, Any]) -> ModelProfile | None:
    """The shipped profile of the folder's shape: architecture, layers, hidden size, experts and KV cache
    the same, weights within `WEIGHT_MATCH`."""
    text = _text(config)
    for profile in _shipped():
        same_shape = (
            profile.architecture == facts.architecture
            and profile.num_layers == facts.layers
            and profile.hidden_size == facts.hidden_size
            and profile.num_experts == facts.experts
            and profile.kv_bytes_per_token
            == _kv_bytes_per_token(facts, text, profile.num_layers, profile.hidden_size)
        )
        weights = facts.weight_gb
        if same_shape and (weights is None or abs(weights / profile.weight_gb - 1) <= WEIGHT_MATCH):
            return profile
    return None


def profile_from_config(facts: ModelFacts, config: Mapping[str, Any]) -> ModelProfile:
    """A profile built from the folder's shape, with the overheads of the shipped dense profile nearest in
    active parameters (its draft, workload and attention backend too)."""
    text = _text(config)
    layers = facts.layers or 32
    hidden = facts.hidden_size or 4096
    dtype = str(text.get("torch_dtype") or config.get("torch_dtype") or "bfloat16")
    per_param = _DTYPE_BYTES.get(dtype, 2)
    quant = config.get("quantization_config")
    quantization = str(quant.get("quant_method")) if isinstance(quant, Mapping) else None
    inter = _int(text, "intermediate_size") or 4 * hidden
    vocab = _int(text, "vocab_size") or 32000
    kv_bytes = _kv_bytes_per_token(facts, text, layers, hidden)
    # Parameters by shape: attention (q, o and the KV projections) and the MLP of each layer, embeddings.
    kv_width = kv_bytes // (2 * 2 * layers) if facts.kv_heads != "MLA" else hidden // 4
    attention = hidden * (2 * hidden + 2 * kv_width)
    expert_params = 3 * hidden * (_int(text, "moe_intermediate_size") or inter)
    experts = facts.experts
    mlp = expert_params * experts if experts else 3 * hidden * inter
    shaped_params = layers * (attention + mlp) + 2 * vocab * hidden
    shaped_gb = shaped_params * per_param / 1e9
    weight_gb = facts.weight_gb if facts.weight_gb and facts.weight_gb > 1 else shaped_gb
    scale = weight_gb / shaped_gb  # a quantized folder's bytes per shaped byte
    expert_gb = expert_params * layers * per_param * scale / 1e9 if experts else 0.0
    dense_read_gb = max(weight_gb - experts * expert_gb, 0.01 * weight_gb) if experts else weight_gb
    per_token = _int(text, "num_experts_per_tok", "moe_top_k", "num_experts_per_token") or min(experts, 2)
    active_gb = dense_read_gb + per_token * expert_gb
    active_params_b = active_gb / (per_param * scale)
    dense = [p for p in _shipped() if p.num_experts == 0]
    template = min(dense, key=lambda p: abs(math.log(p.active_params_b / active_params_b)))
    width = hidden / template.hidden_size
    return ModelProfile(
        name=f"{Path(facts.path.rstrip('/')).name} (from its config.json)",
        served_model_name=facts.path,
        architecture=facts.architecture,
        weight_gb=round(weight_gb, 2),
        num_shards=max(1, round(weight_gb / 5)),
        load_gbps=template.load_gbps,
        num_layers=layers,
        hidden_size=hidden,
        context_len=_int(text, "max_position_embeddings") or template.context_len,
        dtype=dtype,
        quantization=quantization,
        allreduces_per_layer=2,
        kv_bytes_per_token=kv_bytes,
        kv_sharded_by_tp=facts.kv_heads != "MLA",
        dense_read_gb=round(dense_read_gb, 3),
        num_experts=experts,
        experts_per_token=per_token if experts else 0,
        expert_gb=round(expert_gb, 4),
        active_params_b=round(active_params_b, 2),
        kernels_per_layer=template.kernels_per_layer + (4 if experts else 0),
        step_overhead_ms=template.step_overhead_ms,
        sampling_us_per_request=template.sampling_us_per_request,
        runtime_overhead_gb=template.runtime_overhead_gb,
        graph_mb_per_bs=template.graph_mb_per_bs * width,
        activation_mb_per_token=template.activation_mb_per_token * width,
        prefill_graph_mb_per_token=template.prefill_graph_mb_per_token * width,
        default_attention_backend=template.default_attention_backend,
        draft=template.draft,
        standard_workload=template.standard_workload,
    )


def node_profiles(
    model_path: str, env: Mapping[str, str], default_seed: int | None = None
) -> tuple[SimOptions, HardwareProfile, ModelProfile]:
    """What a simulated process (server or weight cache daemon) serves: its options from `env`, the node's
    hardware and the model (the environment's, else the one `model_path` holds, else the default);
    `ConfigError` on a bad value."""
    options = SimOptions.from_env(env, default_seed=default_seed)
    hardware = load_hardware_profile(options.hardware)
    found = served_model(model_path) if options.model is None else None
    return options, hardware, found or load_model_profile(options.model or DEFAULT_MODEL)
