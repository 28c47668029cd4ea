"""The SGLang releases the simulated server emulates, and what differs between them.

One description per release; the parser, the log lines and the behaviour read it, so a difference between
releases lives here once. Facts: shared/reference/sglang-versions.md (read from the 0.5.17 and 0.5.23 wheels).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune.errors import ConfigError

VERSION_ENV = "SGLANG_SIM_VERSION"


@dataclass(frozen=True)
class SglangVersion:
    """What one SGLang release does differently, as far as a tuning trial can tell."""

    name: str
    # 0.5.15-0.5.19 keep `--cuda-graph-max-bs`/`--cuda-graph-bs` as deprecated aliases
    # (server_args.py:8315-8331);
    # 0.5.21 removes them, so argparse's prefix matching makes `--cuda-graph-max-bs` ambiguous.
    legacy_cuda_graph_aliases: bool
    # `--stream-output` is a deprecated alias of `--incremental-streaming-output` until 0.5.21.
    stream_output_alias: bool
    # engine.py logs `server_args=ServerArgs(...)` (0.5.17:1059) or a dict (0.5.23:1185, resolved_dict()).
    server_args_as_dict: bool
    # cuda_graph_setup.py logs `bs=[...]` at "begin" (0.5.17:429-433) or at "end" (0.5.23:788-792).
    capture_bs_at_end: bool
    # 0.5.23 deprecates `--enable-dp-attention` for `--attn-dp-size`.
    dp_attention_deprecated: bool
    # Speculative algorithms allowed with `--pp-size` > 1, and the assertion that rejects the others.
    pipeline_speculation: tuple[str, ...]
    pipeline_speculation_error: str
    # 0.5.17 drops the prefill graphs it chose itself when less than this is free (GiB) after the KV pool
    # and the eager buffers (cuda_graph_setup.py:56, 342-356); a backend set by hand skips the gate. 0.5.23
    # has no gate: it captures, and a capture that does not fit fails at start-up.
    prefill_graph_min_free_gb: float | None
    # The breakable prefill backend's failure hint suggests tc_piecewise first in 0.5.17 only
    # (runner_backend_utils/breakable_cuda_graph/context.py BCG_FAILURE_HINT).
    breakable_hint_names_tc_piecewise: bool
    # Choice lists that differ from 0.5.17's, by argparse destination (the releases' parser dumps,
    # autotune/dialect/tables/sglang-<version>.json).
    choices_added: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    choices_removed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


_NEW_ATTENTION_BACKENDS = ("qsa", "llada2_cfg_flashinfer", "minicpm_flashattn", "minicpm_flashinfer")
_GONE_ATTENTION_BACKENDS = ("cutlass_mla", "dual_chunk_flash_attn")

VERSIONS: dict[str, SglangVersion] = {
    "0.5.17": SglangVersion(
        "0.5.17",
        legacy_cuda_graph_aliases=True,
        stream_output_alias=True,
        server_args_as_dict=False,
        capture_bs_at_end=False,
        dp_attention_deprecated=False,
        # server_args.py:8721-8724
        pipeline_speculation=(),
        pipeline_speculation_error="Pipeline parallelism is not compatible with overlap schedule, "
        "speculative decoding",
        prefill_graph_min_free_gb=4.0,
        breakable_hint_names_tc_piecewise=True,
    ),
    "0.5.23": SglangVersion(
        "0.5.23",
        legacy_cuda_graph_aliases=False,
        stream_output_alias=False,
        server_args_as_dict=True,
        capture_bs_at_end=True,
        dp_attention_deprecated=True,
        # arg_groups/validation_hook.py:131-137
        pipeline_speculation=("EAGLE",),
        pipeline_speculation_error="Pipeline parallelism currently only supports EAGLE (non-multi-layer) "
        "speculative decoding",
        prefill_graph_min_free_gb=None,
        breakable_hint_names_tc_piecewise=False,
        choices_added={
            "attention_backend": _NEW_ATTENTION_BACKENDS,
            "decode_attention_backend": _NEW_ATTENTION_BACKENDS,
            "prefill_attention_backend": _NEW_ATTENTION_BACKENDS,
            "load_format": ("instanttensor", "expert_pack"),
            "schedule_policy": ("hrrn", "shortest-prefill-first"),
            "moe_a2a_backend": ("deepep_v2", "flashinfer_megamoe"),
            "moe_runner_backend": (
                "flashinfer_megamoe",
                "lora_cutedsl",
                "lora_triton",
                "lora_marlin",
                "megamoe",
                "intel_xpu",
            ),
            "sampling_backend": ("intel_xpu",),
            "flashinfer_allreduce_fusion_backend": ("cutedsl",),
        },
        choices_removed={
            "attention_backend": _GONE_ATTENTION_BACKENDS,
            "decode_attention_backend": _GONE_ATTENTION_BACKENDS,
            "prefill_attention_backend": _GONE_ATTENTION_BACKENDS,
            "kv_cache_dtype": ("fp4_e2m1",),
            "quantization": ("marlin",),
            "cuda_graph_backend_decode": ("tc_piecewise",),
            "cuda_graph_backend_prefill": ("tc_piecewise",),
        },
    ),
}
DEFAULT_VERSION = "0.5.17"


def sglang_version(env: Mapping[str, str]) -> SglangVersion:
    """The release `SGLANG_SIM_VERSION` selects (0.5.17 when unset); another value is a `ConfigError`."""
    raw = env.get(VERSION_ENV, "").strip() or DEFAULT_VERSION
    try:
        return VERSIONS[raw]
    except KeyError:
        raise ConfigError(
            "environment",
            VERSION_ENV,
            raw,
            f"is not an SGLang version the simulated server emulates ({', '.join(VERSIONS)})",
            f"Set {VERSION_ENV} to one of {', '.join(VERSIONS)}, or unset it for {DEFAULT_VERSION}.",
        ) from None
