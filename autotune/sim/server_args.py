"""SGLang's `sglang serve` command line (0.5.17 or 0.5.23), as the simulated node parses it.

`build_parser(version)` accepts what that release's `sglang serve` accepts for the flags the tuner and its
users touch, with SGLang's option strings, types, defaults, choices and destination names (the `ServerArgs`
field names, so `ns.tp_size` and not argparse's `ns.tensor_parallel_size`). An unknown flag is argparse's
usage error (exit status 2), as in SGLang. Flags the performance model ignores are still accepted, because
SGLang accepts them.

`check_server_args(ns)` raises what SGLang's `ServerArgs.__post_init__` raises before anything is launched
(the speculative-decoding rules, for one), and returns the warnings it logs on the way.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any

from autotune.sim.versions import DEFAULT_VERSION, VERSIONS, SglangVersion

# The program name SGLang's usage and error lines carry (server_args.py:9355, [23] :679).
PROG = "sglang serve"

# Choice lists as SGLang 0.5.17 declares them (server_args.py; checked against its parser's own dump,
# autotune/dialect/tables/sglang-0.5.17.json); `SglangVersion.choices_added/removed` change them per release.
ATTENTION_BACKEND_CHOICES = [
    "triton",
    "torch_native",
    "flex_attention",
    "dsa",
    "nsa",
    "dsv4",
    "compressed",
    "cutlass_mla",
    "fa3",
    "fa4",
    "flashinfer",
    "flashmla",
    "trtllm_mla",
    "cutedsl_mla",
    "tokenspeed_mla",
    "trtllm_mha",
    "dual_chunk_flash_attn",
    "hpc_ops",
    "aiter",
    "wave",
    "intel_amx",
    "ascend",
    "intel_xpu",
]

MOE_RUNNER_BACKEND_CHOICES = [
    "auto",
    "deep_gemm",
    "triton",
    "triton_kernel",
    "flashinfer_trtllm",
    "experimental_sgl_trtllm",
    "flashinfer_trtllm_routed",
    "flashinfer_cutlass",
    "flashinfer_mxfp4",
    "flashinfer_cutedsl",
    "cutlass",
    "aiter",
    "marlin",
    "humming",
    "experimental_sgl_marlin",
    "hpc_ops",
]

MOE_A2A_BACKEND_CHOICES = [
    "none",
    "deepep",
    "mooncake",
    "nixl",
    "mori",
    "ascend_fuseep",
    "flashinfer",
    "megamoe",
    "pplx",
    "ascend_tp",
]

SCHEDULE_POLICY_CHOICES = ["lpm", "random", "fcfs", "dfs-weight", "lof", "priority", "routing-key"]

KV_CACHE_DTYPE_CHOICES = [
    "auto",
    "fp8_e5m2",
    "fp8_e4m3",
    "mxfp8",
    "bf16",
    "bfloat16",
    "nvfp4",
    "fp4_mx_block16",
    "fp4_e2m1",
]

# Free text in SGLang: builtins plus plugin-registered names (speculative/spec_info.py:30-60).
SPECULATIVE_ALGORITHMS = (
    "DFLASH",
    "DSPARK",
    "EAGLE",
    "EAGLE3",
    "FROZEN_KV_MTP",
    "NEXTN",
    "STANDALONE",
    "NGRAM",
)

DTYPE_CHOICES = ["auto", "half", "float16", "bfloat16", "float", "float32"]

LOAD_FORMAT_CHOICES = [
    "auto",
    "pt",
    "safetensors",
    "npcache",
    "dummy",
    "sharded_state",
    "presharded",
    "gguf",
    "bitsandbytes",
    "mistral",
    "layered",
    "flash_rl",
    "remote",
    "remote_instance",
    "fastsafetensors",
    "private",
    "runai_streamer",
]

QUANTIZATION_CHOICES = [
    "awq",
    "fp8",
    "mxfp8",
    "gptq",
    "marlin",
    "gptq_marlin",
    "awq_marlin",
    "bitsandbytes",
    "gguf",
    "modelopt",
    "modelopt_fp8",
    "modelopt_fp4",
    "nvfp4_online",
    "modelopt_mixed",
    "petit_nvfp4",
    "w8a8_int8",
    "w8a8_fp8",
    "moe_wna16",
    "w4afp8",
    "mxfp4",
    "auto-round",
    "auto-round-int8",
    "compressed-tensors",
    "modelslim",
    "mxfp_w4a8",
    "quark",
    "quark_int4fp8_moe",
    "quark_mxfp4",
    "mlx_q4",
    "mlx_q8",
    "unquant",
    "humming",
]

DEEPEP_MODE_CHOICES = ["auto", "normal", "low_latency"]

SAMPLING_BACKEND_CHOICES = ["ascend", "flashinfer", "pytorch"]

FLASHINFER_ALLREDUCE_FUSION_BACKEND_CHOICES = ["auto", "trtllm", "mnnvl"]

CUDA_GRAPH_BACKEND_CHOICES = ["full", "breakable", "tc_piecewise", "disabled"]

GRAMMAR_BACKEND_CHOICES = ["xgrammar", "outlines", "llguidance", "none"]

# Speculative algorithms of the EAGLE family: SGLang applies the same step/topk/draft rules to all of them.
EAGLE_LIKE_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE")


def deprecation_warning(message: str) -> str:
    """The line SGLang's `print_deprecated_warning` writes: `logger.warning` in bold yellow before logging
    is configured, so Python's last-resort handler prints the bare text (argparse_actions.py:28-29)."""
    return f"\033[1;33m{message}\033[0m"


class _DeprecatedAlias(argparse.Action):
    """SGLang's `DeprecatedAliasStoreAction` / `DeprecatedStoreTrueAction`: store and warn at parse time."""

    def __init__(self, option_strings: Sequence[str], dest: str, new_flag: str, **kwargs: Any) -> None:
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True if self.nargs == 0 else values)
        message = (
            f"'{option_string}' is deprecated and will be removed in a future release. "
            f"Use '{self.new_flag}' instead."
        )
        namespace.deprecation_warnings = [*namespace.deprecation_warnings, deprecation_warning(message)]


def human_readable_int(value: str) -> int:
    """SGLang's integer type for token counts: 1k, 25.6k, 1Mi (utils/common.py:2917-2952)."""
    value = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * 2 ** (10 * "KMGT".index(suffix[0]) + 10)
        return int(Decimal(number) * 10 ** (3 * "kMGT".index(suffix) + 3))
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        ) from None


class _VersionedParser(argparse.ArgumentParser):
    """An `ArgumentParser` whose choice lists follow one release: `add_argument` applies its changes."""

    def __init__(self, release: SglangVersion, **kwargs: Any) -> None:
        self.release = release
        super().__init__(**kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        if action.choices is not None:
            added = self.release.choices_added.get(action.dest, ())
            removed = self.release.choices_removed.get(action.dest, ())
            action.choices = [c for c in action.choices if c not in removed] + list(added)
        return action


def build_parser(version: SglangVersion | str = DEFAULT_VERSION) -> argparse.ArgumentParser:
    """Return a parser for one SGLang release's `sglang serve` flags (the subset the simulator knows).

    Arguments are added in `ServerArgs` field order, so `vars(ns)` lists them as SGLang's repr does.
    """
    release = VERSIONS[version] if isinstance(version, str) else version
    parser = _VersionedParser(release, prog=PROG)
    parser.set_defaults(deprecation_warnings=[], sglang_version=release.name)
    _add_model_args(parser)
    _add_http_args(parser)
    _add_quantization_args(parser)
    _add_memory_and_scheduling_args(parser)
    _add_runtime_args(parser)
    _add_logging_args(parser)
    _add_api_args(parser)
    _add_data_parallel_args(parser)
    _add_kernel_backend_args(parser)
    _add_speculative_args(parser)
    _add_expert_parallel_args(parser)
    _add_optimization_args(parser, release)
    _add_deprecated_args(parser, release)
    return parser


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-path",
        "--model",
        dest="model_path",
        type=str,
        required=True,
        help="The path of the model weights. This can be a local folder or a Hugging Face repo ID.",
    )
    parser.add_argument("--tokenizer-path", type=str, default=None, help="The path of the tokenizer.")
    parser.add_argument("--tokenizer-mode", type=str, default="auto", choices=["auto", "slow"])
    parser.add_argument("--skip-tokenizer-init", action="store_true")
    parser.add_argument("--load-format", type=str, default="auto", choices=LOAD_FORMAT_CHOICES)
    # JSON read by the default loader (model_loader/loader.py): enable_multithread_load, num_threads.
    parser.add_argument("--model-loader-extra-config", type=str, default="{}")
    parser.add_argument("--trust-remote-code", action="store_true", help="Allow custom models from the Hub.")
    parser.add_argument(
        "--context-length", type=human_readable_int, default=None, help="The model's maximum context length."
    )
    parser.add_argument("--revision", type=str, default=None)
    parser.add_argument("--weight-loader-disable-mmap", action="store_true")  # read shards, not map them
    # SGLang's weight cache (server_args.py 3388-3416 in 0.5.17): a client maps a daemon's weights.
    parser.add_argument("--weight-cache-mode", type=str, default="off", choices=["off", "daemon", "client"])
    parser.add_argument("--weight-cache-socket", type=str, default=None)
    parser.add_argument("--weight-cache-timeout", type=int, default=1800)


def _add_http_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", type=str, default="127.0.0.1", help="The host of the HTTP server.")
    parser.add_argument("--port", type=int, default=30000, help="The port of the HTTP server.")
    parser.add_argument("--skip-server-warmup", action="store_true", help="If set, skip warmup.")
    parser.add_argument("--nccl-port", type=int, default=None)


def _add_quantization_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dtype", type=str, default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--quantization", type=str, default=None, choices=QUANTIZATION_CHOICES)
    parser.add_argument("--kv-cache-dtype", type=str, default="auto", choices=KV_CACHE_DTYPE_CHOICES)


def _add_memory_and_scheduling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mem-fraction-static",
        type=float,
        default=None,
        help="The fraction of the memory for static allocation (model weights and KV cache memory pool).",
    )
    parser.add_argument("--max-running-requests", type=int, default=None)
    parser.add_argument("--max-queued-requests", type=int, default=None)
    parser.add_argument("--max-total-tokens", type=human_readable_int, default=None)
    parser.add_argument(
        "--chunked-prefill-size", type=int, default=None, help="Tokens per prefill chunk; -1 disables."
    )
    parser.add_argument("--max-prefill-tokens", type=human_readable_int, default=16384)
    parser.add_argument("--schedule-policy", type=str, default="fcfs", choices=SCHEDULE_POLICY_CHOICES)
    parser.add_argument("--schedule-conservativeness", type=float, default=1.0)
    parser.add_argument("--page-size", type=int, default=None, help="The number of tokens in a page.")


def _add_runtime_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", type=str, default=None)
    # No `--tp` option: argparse's prefix matching takes it for `--tp-size`, as in SGLang.
    parser.add_argument("--tensor-parallel-size", "--tp-size", dest="tp_size", type=int, default=1)
    parser.add_argument("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
    parser.add_argument(
        "--stream-interval", type=int, default=1, help="The interval (in tokens) between streamed chunks."
    )
    parser.add_argument("--incremental-streaming-output", action="store_true")
    parser.add_argument("--random-seed", type=int, default=None)
    parser.add_argument("--watchdog-timeout", type=float, default=300)
    parser.add_argument("--dist-timeout", type=int, default=None)
    parser.add_argument("--download-dir", type=str, default=None)
    parser.add_argument("--base-gpu-id", type=int, default=0)
    parser.add_argument("--gpu-id-step", type=int, default=1)


def _add_logging_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--log-level", type=str, default="info", help="The logging level of all loggers.")
    parser.add_argument("--log-level-http", type=str, default=None)
    parser.add_argument("--log-requests", action="store_true")
    parser.add_argument("--crash-dump-folder", type=str, default=None)
    parser.add_argument("--show-time-cost", action="store_true")
    parser.add_argument("--enable-metrics", action="store_true", help="Enable log prometheus metrics.")
    parser.add_argument(
        "--decode-log-interval", type=int, default=40, help="The log interval of decode batch."
    )


def _add_api_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", type=str, default=None)
    parser.add_argument(
        "--served-model-name", type=str, default=None, help="The model name the v1/models endpoint returns."
    )
    parser.add_argument("--chat-template", type=str, default=None)
    parser.add_argument("--enable-cache-report", action="store_true")
    parser.add_argument("--reasoning-parser", type=str, default=None)
    parser.add_argument("--tool-call-parser", type=str, default=None)


def _add_data_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
    parser.add_argument(
        "--load-balance-method",
        type=str,
        default="auto",
        choices=["auto", "round_robin", "follow_bootstrap_room", "total_requests", "total_tokens"],
    )
    parser.add_argument("--dist-init-addr", "--nccl-init-addr", dest="dist_init_addr", type=str, default=None)
    parser.add_argument("--nnodes", type=int, default=1)
    parser.add_argument("--node-rank", type=int, default=0)


def _add_kernel_backend_args(parser: argparse.ArgumentParser) -> None:
    backends = ATTENTION_BACKEND_CHOICES
    parser.add_argument("--attention-backend", type=str, default=None, choices=backends)
    parser.add_argument("--decode-attention-backend", type=str, default=None, choices=backends)
    parser.add_argument("--prefill-attention-backend", type=str, default=None, choices=backends)
    parser.add_argument("--sampling-backend", type=str, default=None, choices=SAMPLING_BACKEND_CHOICES)
    parser.add_argument("--grammar-backend", type=str, default=None, choices=GRAMMAR_BACKEND_CHOICES)


def _add_speculative_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--speculative-algorithm", type=str, default=None)
    parser.add_argument(
        "--speculative-draft-model-path",
        "--speculative-draft-model",
        dest="speculative_draft_model_path",
        type=str,
        default=None,
    )
    parser.add_argument("--speculative-draft-model-revision", type=str, default=None)
    parser.add_argument("--speculative-num-steps", type=int, default=None)
    parser.add_argument("--speculative-eagle-topk", type=int, default=None)
    parser.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    parser.add_argument("--speculative-ngram-max-bfs-breadth", type=int, default=10)  # NGRAM's topk
    parser.add_argument("--speculative-accept-threshold-single", type=float, default=1.0)
    parser.add_argument("--speculative-accept-threshold-acc", type=float, default=1.0)
    parser.add_argument("--speculative-token-map", type=str, default=None)
    parser.add_argument(
        "--speculative-attention-mode", type=str, default="prefill", choices=["prefill", "decode"]
    )


def _add_expert_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--expert-parallel-size", "--ep-size", "--ep", dest="ep_size", type=int, default=1)
    parser.add_argument("--moe-a2a-backend", type=str, default="none", choices=MOE_A2A_BACKEND_CHOICES)
    parser.add_argument("--moe-runner-backend", type=str, default="auto", choices=MOE_RUNNER_BACKEND_CHOICES)
    parser.add_argument(
        "--flashinfer-allreduce-fusion-backend",
        type=str,
        default=None,
        choices=FLASHINFER_ALLREDUCE_FUSION_BACKEND_CHOICES,
    )
    parser.add_argument("--deepep-mode", type=str, default="auto", choices=DEEPEP_MODE_CHOICES)
    parser.add_argument("--ep-num-redundant-experts", type=int, default=0)
    parser.add_argument("--enable-eplb", action="store_true")


def _add_optimization_args(parser: argparse.ArgumentParser, release: SglangVersion) -> None:
    parser.add_argument("--disable-radix-cache", action="store_true")
    parser.add_argument(
        "--cuda-graph-backend-decode", type=str, default=None, choices=CUDA_GRAPH_BACKEND_CHOICES
    )
    parser.add_argument(
        "--cuda-graph-backend-prefill", type=str, default=None, choices=CUDA_GRAPH_BACKEND_CHOICES
    )
    parser.add_argument(
        "--cuda-graph-max-bs-decode",
        type=int,
        default=None,
        help="Maximum batch size captured for the decode cuda graph.",
    )
    parser.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+", default=None)
    parser.add_argument("--cuda-graph-bs-prefill", type=int, nargs="+", default=None)
    parser.add_argument("--disable-cuda-graph-padding", action="store_true")
    parser.add_argument("--enable-nccl-nvls", action="store_true")
    parser.add_argument("--enable-symm-mem", action="store_true")
    parser.add_argument("--disable-custom-all-reduce", action="store_true")
    parser.add_argument("--enable-mscclpp", action="store_true")
    parser.add_argument("--enable-torch-symm-mem", action="store_true")
    parser.add_argument("--disable-overlap-schedule", action="store_true")
    parser.add_argument("--enable-mixed-chunk", action="store_true")
    if not release.dp_attention_deprecated:
        parser.add_argument("--enable-dp-attention", action="store_true")
    parser.add_argument("--enable-two-batch-overlap", action="store_true")
    parser.add_argument("--enable-torch-compile", action="store_true")
    parser.add_argument("--torch-compile-max-bs", type=int, default=32)
    parser.add_argument("--enable-p2p-check", action="store_true")
    parser.add_argument("--allow-auto-truncate", action="store_true")
    parser.add_argument("--disable-chunked-prefix-cache", action="store_true")
    parser.add_argument("--enable-deterministic-inference", action="store_true")


def _add_deprecated_args(parser: argparse.ArgumentParser, release: SglangVersion) -> None:
    """SGLang's deprecated spellings, registered last as in `add_cli_args` (server_args.py:8260)."""
    if release.stream_output_alias:
        parser.add_argument(
            "--stream-output",
            action=_DeprecatedAlias,
            nargs=0,
            default=False,
            dest="incremental_streaming_output",
            new_flag="--incremental-streaming-output",
        )
    if release.legacy_cuda_graph_aliases:
        parser.add_argument(
            "--cuda-graph-max-bs",
            type=int,
            action=_DeprecatedAlias,
            new_flag="--cuda-graph-max-bs-decode",
            dest="cuda_graph_max_bs_decode",
        )
        parser.add_argument(
            "--cuda-graph-bs",
            type=int,
            nargs="+",
            action=_DeprecatedAlias,
            new_flag="--cuda-graph-bs-decode",
            dest="cuda_graph_bs_decode",
        )
    parser.add_argument(
        "--disable-cuda-graph",
        action=_DeprecatedAlias,
        nargs=0,
        default=False,
        new_flag="--cuda-graph-backend-{decode,prefill}=disabled",
    )
    if release.dp_attention_deprecated:  # [23] server_args.py:418-424
        parser.add_argument(
            "--enable-dp-attention",
            action=_DeprecatedAlias,
            nargs=0,
            default=False,
            new_flag="--attn-dp-size <dp-size>",
        )
    # Still a plain flag; `__post_init__` warns and maps it to the backend `auto` (server_args.py:3950-3959).
    parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")


def check_server_args(ns: argparse.Namespace, attention_backend: str | None = None) -> list[str]:
    """Raise what SGLang raises while it handles these arguments; return the warnings it logs meanwhile.

    `attention_backend` is the backend SGLang resolves when the flag is unset (it depends on the GPU).
    Only validates: the model resolves the automatic values (speculative steps, memory) itself, from the
    same namespace, so `ns` is left as parsed.
    """
    warnings: list[str] = list(ns.deprecation_warnings)
    if ns.enable_flashinfer_allreduce_fusion and ns.flashinfer_allreduce_fusion_backend is None:
        warnings.append(
            "--enable-flashinfer-allreduce-fusion is deprecated. "
            "Please use --flashinfer-allreduce-fusion-backend=auto instead."
        )
    if ns.moe_a2a_backend in ("deepep", "mooncake") and ns.ep_size != ns.tp_size:
        name = "DeepEP" if ns.moe_a2a_backend == "deepep" else "Mooncake"
        warnings.append(
            f"{name} MoE is enabled. The expert parallel size is adjusted to be the same as the "
            f"tensor parallel size[{ns.tp_size}]."
        )
    if ns.enable_dp_attention and ns.tp_size % ns.dp_size != 0:
        raise AssertionError(f"tp_size ({ns.tp_size}) must be divisible by dp_size ({ns.dp_size}).")
    if ns.speculative_algorithm is None:
        return warnings
    if ns.weight_cache_mode != "off":  # 0.5.17 server_args.py:7326-7332, 0.5.23 model_path_hook.py:281-287
        raise ValueError(
            "--weight-cache-mode is not supported together with speculative "
            "decoding (--speculative-algorithm): the weight cache daemon does "
            "not export the draft model's weights. Disable one of them "
            "(--weight-cache-mode off) for this configuration."
        )
    algorithm = ns.speculative_algorithm.upper()
    if algorithm not in SPECULATIVE_ALGORITHMS:
        raise ValueError(f"Unknown speculative algorithm name: {ns.speculative_algorithm}")
    if ns.pp_size > 1:
        _check_pipeline_speculation(ns, algorithm)
    algorithm = "EAGLE" if algorithm == "NEXTN" else algorithm
    if algorithm == "DFLASH" and ns.speculative_draft_model_path is None:
        # Printed by real 0.5.17 on an H200 (shared/device-kit/README.md "Real failure lines").
        raise ValueError("DFLASH speculative decoding requires setting --speculative-draft-model-path.")
    if algorithm in EAGLE_LIKE_ALGORITHMS:
        warnings.extend(_check_eagle_args(ns, algorithm, ns.attention_backend or attention_backend))
    elif algorithm == "NGRAM":
        warnings.extend(_check_ngram_args(ns, ns.attention_backend or attention_backend))
    return warnings


def _check_ngram_args(ns: argparse.Namespace, attention_backend: str | None) -> list[str]:
    """SGLang 0.5.17's `_handle_ngram` (arg_groups/speculative_hook.py:684-753; [23] 1285-1370): no steps
    needed, topk is --speculative-ngram-max-bfs-breadth, draft tokens 12 unless set."""
    warnings: list[str] = []
    if ns.max_running_requests is None:
        warnings.append(_MAX_RUNNING_RESET)
    if ns.speculative_num_draft_tokens is None:
        warnings.append(
            "speculative_num_draft_tokens is set to 12 by default for ngram speculative decoding. "
            "You can override this by explicitly setting --speculative-num-draft-tokens."
        )
    warnings.append("The mixed chunked prefill are disabled because of using ngram speculative decoding.")
    topk, page_size = ns.speculative_ngram_max_bfs_breadth, 1 if ns.page_size is None else ns.page_size
    if topk > 1 and page_size > 1 and attention_backend != "flashinfer":
        raise ValueError(
            f"speculative_eagle_topk({topk}) > 1 with page_size({page_size}) > 1 is unstable and produces "
            "incorrect results for paged attention backends. This combination is only supported for the "
            "'flashinfer' backend."
        )
    if ns.enable_dp_attention:
        raise ValueError("Currently ngram speculative decoding does not support dp attention.")
    return warnings


def _check_pipeline_speculation(ns: argparse.Namespace, algorithm: str) -> None:
    """Speculation with pipeline parallelism: SGLang asserts all but the release's allowed algorithms away."""
    release = VERSIONS[ns.sglang_version]
    if algorithm not in release.pipeline_speculation:
        raise AssertionError(release.pipeline_speculation_error)


_MAX_RUNNING_RESET = (
    "Max running requests is reset to 48 for speculative decoding. You can override this by explicitly "
    "setting --max-running-requests."
)
# arg_groups/speculative_hook.py:672: topk > 1 with pages needs a two-pass draft decode only these implement.
_PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")


def _check_eagle_args(ns: argparse.Namespace, algorithm: str, attention_backend: str | None) -> list[str]:
    """SGLang 0.5.17's `_handle_eagle` (arg_groups/speculative_hook.py:530-681; [23] 1130-1282)."""
    warnings: list[str] = []
    if algorithm == "STANDALONE" and ns.enable_dp_attention:
        raise ValueError("Currently standalone speculative decoding does not support dp attention.")
    if ns.max_running_requests is None:
        warnings.append(_MAX_RUNNING_RESET)
    # Spec v2 keeps the overlap scheduler; SGLang only notes it when the user turns overlap off.
    if ns.disable_overlap_schedule:
        warnings.append(
            "Non-overlap (synchronous) spec v2 is used for eagle/eagle3/standalone speculative decoding."
        )
    if ns.speculative_num_steps is None:
        # SGLang asserts this bare, so the traceback ends in a message-less AssertionError.
        if ns.speculative_eagle_topk is not None or ns.speculative_num_draft_tokens is not None:
            raise AssertionError()
        return warnings
    topk = ns.speculative_eagle_topk
    backends = (ns.attention_backend, ns.prefill_attention_backend, ns.decode_attention_backend)
    if "trtllm_mha" in backends and topk is not None and topk > 1:
        raise ValueError("trtllm_mha backend only supports topk = 1 for speculative decoding.")
    if topk == 1 and ns.speculative_num_draft_tokens != ns.speculative_num_steps + 1:
        warnings.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            "speculative_eagle_topk == 1"
        )
    if topk is None:
        # Steps without topk reach `speculative_eagle_topk > 1` unset (speculative_hook.py:673).
        raise TypeError("'>' not supported between instances of 'NoneType' and 'int'")
    page_size = 1 if ns.page_size is None else ns.page_size
    if topk > 1 and page_size > 1 and attention_backend not in _PAGE_TREE_SPEC_BACKENDS:
        raise ValueError(
            f"speculative_eagle_topk > 1 with page_size > 1 is only supported on {_PAGE_TREE_SPEC_BACKENDS}; "
            f"got attention_backend={attention_backend!r}. Use page_size == 1 or one of those backends."
        )
    return warnings


@dataclass
class PhaseConfig:
    """SGLang's per-phase CUDA graph settings (model_executor/cuda_graph_config.py:88-111): same fields, same
    order, so the dataclass repr is the one SGLang logs."""

    backend: str = "disabled"
    max_bs: int | None = None
    bs: list[int] | None = None
    tc_compiler: str = "eager"
    full_prefill_max_req: int | None = None
    full_prefill_prefix_chunk_tokens: int | None = None


@dataclass
class CudaGraphConfig:
    """SGLang's `CudaGraphConfig` (cuda_graph_config.py:123-131), resolved."""

    decode: PhaseConfig = field(default_factory=lambda: PhaseConfig(backend="full"))
    prefill: PhaseConfig = field(default_factory=lambda: PhaseConfig(backend="breakable"))


def server_args_repr(values: dict[str, Any], version: SglangVersion) -> str:
    """Render resolved arguments the way that release logs them after `server_args=`: the `ServerArgs`
    dataclass repr (0.5.17, engine.py:1059) or the resolved dict (0.5.23, engine.py:1185)."""
    if version.server_args_as_dict:
        return repr({k: asdict(v) if isinstance(v, CudaGraphConfig) else v for k, v in values.items()})
    fields = ", ".join(f"{name}={value!r}" for name, value in values.items())
    return f"ServerArgs({fields})"
