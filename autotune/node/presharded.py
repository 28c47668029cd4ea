"""SGLang's presharded weights (`--load-format presharded`, 0.5.17 to 0.5.23) where they make a launch's
weight load cheaper. SGLang's default loader has every tensor-parallel rank read the whole checkpoint and
keep its own slice of it; with presharded weights the first launch of a model and layout writes each rank's
share, as loaded, into a dump folder, and every later launch of that layout reads only its own share
(model_loader/loader.py, PreshardedModelLoader)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.node.check import FREE_KB
from autotune.node.page_cache import PAGE_CACHE_SHARE
from autotune.node.runner import CommandRunner, NodeUnreachableError
from autotune.trial.startup import (
    DRAFT_PRESHARDED_PATH_KEY,
    LOAD_FORMAT_FLAG,
    LOADER_FLAG,
    PRESHARDED,
    PRESHARDED_PATH_KEY,
    WEIGHT_CACHE_FLAG,
)

if TYPE_CHECKING:
    from autotune.node.startup_prep import HostMemory
    from autotune.trial.launch import ServerLaunch

__all__ = [
    "DUMP_FILE_BYTES", "PRESHARDED_FOLDER", "DumpRoom", "dump_folders", "dump_note", "dump_room", "off_note",
    "presharded_failure", "presharded_launch", "wants_presharded",
]  # fmt: skip

PRESHARDED_FOLDER = "presharded"  # in the node's work folder: the dumps outlive trials and resumes
# The disk a dump needs over the checkpoint's size (SGLang's manifests beside the weights, which after
# loading can be larger than on disk: an INT4 checkpoint repacked for its kernels).
DUMP_ROOM = 1.1
# Disk a dump leaves free beside it: the node's logs, compile caches and study stores share that disk.
DISK_HEADROOM = 50 * 10**9
# SGLang's dump files (`max_file_bytes`, 20 GiB by default). While it writes them it holds one per rank in
# host memory (measured on 0.5.17: 1.3 GB more than a reload with 1.3 GB files); its read-back holds none.
DUMP_FILE_BYTES = 20 * 1024**3
# Where the ranks' files would fill more than this share of MemAvailable, smaller files: the launch that
# writes them needs less memory, and the page cache step keeps the dump in finer parts.
DUMP_FILES_SHARE = 0.1
DRAFT_MODEL_FLAG = "--speculative-draft-model-path"
# Flags that leave the weights as SGLang holds them after loading unchanged: launches that differ only in
# these share one dump. Every other flag keys a dump of its own (an EP size, a MoE backend or a quantization
# can lay the weights out differently after loading); the draft model's dump adds its path. The attention
# backends act on the KV cache only: in 0.5.17 no quantization, MoE or linear layer and no model's
# post_load_weights reads them, and SGLang's own dump key leaves them out (loader.py, _collect_shard_config).
SAME_WEIGHTS_FLAGS = frozenset(
    {
        "--host", "--port", "--api-key", "--log-level", "--random-seed", "--skip-server-warmup",
        "--attention-backend", "--prefill-attention-backend", "--decode-attention-backend",
        "--mem-fraction-static", "--max-running-requests", "--max-total-tokens", "--max-prefill-tokens",
        "--chunked-prefill-size", "--schedule-policy", "--schedule-conservativeness", "--stream-interval",
        "--cuda-graph-max-bs", "--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill", "--cuda-graph-bs",
        "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill", "--disable-cuda-graph",
        "--disable-radix-cache", "--disable-custom-all-reduce", "--enable-torch-symm-mem",
        "--enable-flashinfer-allreduce-fusion", "--speculative-algorithm", "--speculative-num-steps",
        "--speculative-eagle-topk", "--speculative-num-draft-tokens", DRAFT_MODEL_FLAG, LOADER_FLAG,
        LOAD_FORMAT_FLAG,
    }
)  # fmt: skip
# The presharded loader's own errors (0.5.17 loader.py: PreshardedModelLoader's raises) and its frames in a
# traceback: a launch that died there failed for the setting, not for its config.
_LOADER_ERROR = re.compile(
    r"^\w*Error: (Presharded .*|Unsupported presharded plan .*|Missing keys .* in presharded checkpoint.*"
    r"|Rank-\d+ checksum mismatch for presharded .*|Plan at .* has no rank_checksums .*)$",
    re.MULTILINE,
)
_LOADER_FRAME = re.compile(
    r"model_loader/loader\.py\", line \d+, in (_first_time_load_and_dump|_load_from_presharded"
    r"|_dump_state_to_disk|_dump_files_for_rank|_read_presharded_file|_apply_presharded_file)\b"
)
_RAISED = re.compile(r"^\w+(Error|Exception)\b")
# Free KiB on the dump folder's file system (as the node check reads its log folder's), then the READY file
# of a dump SGLang finished there ($1: the folder; SGLang appends TP-<n>-sig-<hash> per shard config).
_PROBE = f'{FREE_KB} && find "$1" -maxdepth 2 -name READY'


@dataclass(frozen=True)
class DumpRoom:
    """The dump folder's file system: its free bytes, and whether a finished dump is there already."""

    free_bytes: int
    ready: bool


def wants_presharded(launch: ServerLaunch, memory: HostMemory | None) -> bool:
    """Whether presharded weights would make `launch`'s load cheaper: a tensor-parallel server that reads its
    weights from disk (the checkpoint larger than the page cache keeps), not a weight cache client, and no
    load format of the user's own. Unknown host facts: no."""
    if memory is None or memory.checkpoint_bytes <= 0:
        return False
    if launch.flag(LOAD_FORMAT_FLAG) not in (None, "auto") or launch.flag(WEIGHT_CACHE_FLAG) is not None:
        return False
    try:
        tensor_parallel = launch.tensor_parallel_size > 1
    except ValueError:
        return False
    # Where the weights fit the page cache, every launch after the first reads them from memory already.
    return tensor_parallel and memory.checkpoint_bytes > PAGE_CACHE_SHARE * memory.available_bytes


def dump_folders(launch: ServerLaunch, root: str) -> tuple[str, str]:
    """The target model's and the draft model's dump folders under `root` (a node path) for `launch`: one
    per model and weight layout, so a search over scheduling flags and speculative settings shares one."""
    weights = sorted((flag, value) for flag, value in launch.flags if flag not in SAME_WEIGHTS_FLAGS)
    key = hashlib.sha1(json.dumps(weights).encode()).hexdigest()[:12]
    draft = hashlib.sha1(json.dumps([key, launch.flag(DRAFT_MODEL_FLAG)]).encode()).hexdigest()[:12]
    base = root.rstrip("/")
    return f"{base}/{key}", f"{base}/{key}-draft-{draft}"


def presharded_launch(
    launch: ServerLaunch, folders: tuple[str, str], memory: HostMemory, room: DumpRoom
) -> tuple[ServerLaunch, str | None]:
    """`launch` loading presharded weights from `folders` (dump_folders'), or as given with the sentence
    that says why not: a first dump needs the checkpoint's size on disk."""
    target, draft = folders
    need = memory.checkpoint_bytes * DUMP_ROOM + DISK_HEADROOM
    if not room.ready and room.free_bytes < need:
        return launch, (
            f"presharded weights left off: a dump of this layout needs {need / 1e9:.0f} GB of disk and "
            f"{target} has {room.free_bytes / 1e9:.0f} GB free (startup.presharded_weights: false stops "
            "trying)"
        )
    try:
        config = json.loads(launch.flag(LOADER_FLAG) or "{}")
    except ValueError:
        return launch, "presharded weights left off: --model-loader-extra-config is not JSON"
    config = {**config, PRESHARDED_PATH_KEY: target, DRAFT_PRESHARDED_PATH_KEY: draft}
    file_bytes = int(memory.available_bytes * DUMP_FILES_SHARE / max(launch.tensor_parallel_size, 1))
    if file_bytes < DUMP_FILE_BYTES:
        config["max_file_bytes"] = max(file_bytes, 1024**3)
    return launch.with_node_flags({LOAD_FORMAT_FLAG: PRESHARDED, LOADER_FLAG: json.dumps(config)}), None


def dump_note(launch: ServerLaunch) -> str:
    """The trial's note when its launch wrote a presharded dump (a dear launch, once per layout)."""
    try:
        folder = json.loads(launch.flag(LOADER_FLAG) or "{}").get(PRESHARDED_PATH_KEY)
    except (ValueError, AttributeError):
        folder = None
    return (
        f"wrote a presharded dump of the weights to {folder}: later launches of this model and layout read "
        "their own share of it instead of the checkpoint"
    )


def dump_room(runner: CommandRunner, folder: str) -> DumpRoom | None:
    """The free disk at `folder` (made if missing) and whether it holds a finished dump; None where the node
    cannot say."""
    try:
        done = runner.run(["sh", "-c", _PROBE, "sh", folder], {}, timeout_s=30)
    except (NodeUnreachableError, TimeoutError):
        return None
    lines = done.stdout.split()
    if done.returncode != 0 or not lines or not lines[0].isdigit():
        return None
    return DumpRoom(int(lines[0]) * 1024, len(lines) > 1)


def presharded_failure(log: str) -> str | None:
    """The error line of a start-up the presharded loader failed (its own message, or any error raised
    inside it), or None where the log shows no such failure."""
    own = _LOADER_ERROR.search(log)
    if own is not None:
        return own.group(0)
    frame = _LOADER_FRAME.search(log)
    if frame is None:
        return None
    lines = log[frame.end() :].splitlines()
    return next((line.strip() for line in lines if _RAISED.match(line)), frame.group(0))


def off_note(error: str) -> str:
    """The trial's note when its presharded launch failed and it ran again without."""
    return (
        f"presharded weights failed on this node ({error}): this trial ran again without them, and they stay "
        "off on this node until the study stops (a resume tries them again; startup.presharded_weights)"
    )
