"""Start-up settings autotune adds to every launch where they help: multithreaded weight loading (a flag
the node's SGLang version must take), one JIT/compile cache folder per node (env vars), and what tells
whether the version takes the weight cache daemon and presharded weights."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from autotune.dialect import Dialect, committed_table, committed_versions

if TYPE_CHECKING:
    from autotune.trial.launch import ServerLaunch

LOADER_FLAG = "--model-loader-extra-config"
MULTITHREAD_KEY, THREADS_KEY = "enable_multithread_load", "num_threads"
# SGLang 0.5.17 to 0.5.23's default loader: multithreaded, 8 threads, unless the extra config says otherwise
# (model_loader/loader.py: DEFAULT_NUM_THREADS = 8, extra_config.get("enable_multithread_load", True)).
DEFAULT_LOAD_THREADS = 8
DISABLE_MMAP_FLAG = "--weight-loader-disable-mmap"
# A server that maps its weights from SGLang's weight cache daemon (0.5.17 to 0.5.23: server_args.py).
WEIGHT_CACHE_FLAG, WEIGHT_CACHE_CLIENT = "--weight-cache-mode", "client"
# SGLang's presharded weights (0.5.17 to 0.5.23: model_loader/loader.py PreshardedModelLoader): the load
# format, and the --model-loader-extra-config keys it takes out of the loader's settings for its dumps'
# folders, the target model's and the draft model's (which loads with the target's format).
LOAD_FORMAT_FLAG, PRESHARDED = "--load-format", "presharded"
PRESHARDED_PATH_KEY, DRAFT_PRESHARDED_PATH_KEY = "presharded_path", "draft_presharded_path"

# The JIT and compile caches SGLang and its kernels read (sglang wheels 0.5.17 and 0.5.23):
# SGLANG_CACHE_DIR (srt/environ.py; 0.5.23 also points the others under it: third_party_cache_defaults),
# SGLANG_DG_CACHE_DIR (DeepGEMM: layers/deep_gemm_wrapper/compile_utils.py sets DG_JIT_CACHE_DIR from it),
# FLASHINFER_WORKSPACE_BASE (FlashInfer appends .cache/flashinfer), TVM_FFI_CACHE_DIR
# (kernels/jit/utils/compile.py), and Triton's, torch inductor's, TileLang's and the CUDA driver's own.
# Name -> subfolder of the node's cache folder.
COMPILE_CACHE_ENV = {
    "SGLANG_CACHE_DIR": "sglang",
    "SGLANG_DG_CACHE_DIR": "deep_gemm",
    "TRITON_CACHE_DIR": "triton",
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TVM_FFI_CACHE_DIR": "tvm-ffi",
    "TILELANG_CACHE_DIR": "tilelang",
    "CUDA_CACHE_PATH": "nv",
}


def loader_defaults(dialect: Dialect | None) -> Mapping[str, Any] | None:
    """What the node's SGLang takes in --model-loader-extra-config, with its defaults; None where it is not
    known to take `enable_multithread_load` (a version autotune has no table for). Without a dialect (a
    launch script written away from the node): the newest committed version's."""
    table = dialect.table if dialect is not None else committed_table(committed_versions()[-1])
    defaults = table.loader_defaults if table is not None else None
    return defaults if defaults is not None and MULTITHREAD_KEY in defaults else None


def multithread_loading_flag(
    flags: Mapping[str, str | None], dialect: Dialect | None, threads: int | None
) -> dict[str, str]:
    """{--model-loader-extra-config: '{"enable_multithread_load": true, "num_threads": N}'} to add to a
    launch whose flags do not set it already, where the version takes it; else {}. `threads` None: the
    version's own default."""
    if LOADER_FLAG in flags:
        return {}  # the user's own loader settings stand
    defaults = loader_defaults(dialect)
    if defaults is None:
        return {}
    count = threads if threads is not None else int(defaults.get(THREADS_KEY, 8))
    return {LOADER_FLAG: json.dumps({MULTITHREAD_KEY: True, THREADS_KEY: count})}


def takes_weight_cache(dialect: Dialect | None) -> bool:
    """Whether the node's SGLang takes `--weight-cache-mode client` (its flag table says so); without a
    dialect, the newest committed version's."""
    return _takes_choice(dialect, WEIGHT_CACHE_FLAG, WEIGHT_CACHE_CLIENT)


def loader_config(launch: ServerLaunch) -> dict[str, object]:
    """The launch's `--model-loader-extra-config` ({} where none, or not a JSON object)."""
    return _loader_object(launch.flag(LOADER_FLAG)) or {}


def multithread_config(launch: ServerLaunch) -> dict[str, object] | None:
    """The launch's `--model-loader-extra-config` where it loads multithreaded by it, else None (no flag,
    the user's own text that is not a JSON object: SGLang says what is wrong with it, or threading off)."""
    config = _loader_object(launch.flag(LOADER_FLAG))
    return config if config is not None and config.get(MULTITHREAD_KEY, True) else None


def _loader_object(text: str | None) -> dict[str, object] | None:
    try:
        config = json.loads(text) if text is not None else None
    except ValueError:
        return None
    return config if isinstance(config, dict) else None


def threaded_loader_bytes(ranks: int, threads: int, shard_bytes: int) -> int:
    """The host memory SGLang's multithreaded loader reads shards into where it does not map them
    (`--weight-loader-disable-mmap`): up to threads + 2 whole shards per rank
    (buffered_multi_thread_safetensors_weights_iterator: "Peak CPU RAM ~ (max_workers + 2) x
    shard_file_size"). By default it maps them instead (`maps_shards`)."""
    return ranks * (threads + 2) * shard_bytes


def maps_shards(launch: ServerLaunch) -> bool:
    """Whether SGLang maps the checkpoint's shards rather than reading them into its own memory: its default
    (safetensors' safe_open; `--weight-loader-disable-mmap` reads them). Mapped, a shard's pages are the
    page cache's, which the kernel reclaims: measured on 0.5.17 (benchmarks/RESULTS-sglang-h200.md, "The
    page cache step on real SGLang"), 8 threads over 4 shards of 3.6 GB took 2.6 GB of MemAvailable, the
    server's own, and raised its mapped pages by 3.1 GB, about the shard in flight."""
    return all(name != DISABLE_MMAP_FLAG for name, _ in launch.flags)


def takes_presharded(dialect: Dialect | None) -> bool:
    """Whether the node's SGLang takes `--load-format presharded` (its flag table says so); without a
    dialect, the newest committed version's."""
    return _takes_choice(dialect, LOAD_FORMAT_FLAG, PRESHARDED)


def _takes_choice(dialect: Dialect | None, option: str, choice: str) -> bool:
    """Whether the node's SGLang takes `option choice`; without a dialect, the newest committed version's."""
    table = dialect.table if dialect is not None else committed_table(committed_versions()[-1])
    flag = table.get(option) if table is not None else None
    return flag is not None and flag.choices is not None and choice in flag.choices


def compile_cache_env(folder: str, env: Mapping[str, str]) -> dict[str, str]:
    """The cache env vars under `folder` (a node path) that `env` does not already set."""
    return {name: f"{folder.rstrip('/')}/{sub}" for name, sub in COMPILE_CACHE_ENV.items() if name not in env}
