"""The part of a launch's weights that the host's page cache can hold, kept there from one launch to the next.

Where the weights are larger than the page cache, every launch reads all of them from disk although the
cache holds most of them between launches: a read larger than memory, repeated, evicts each page before
its next read (the kernel's LRU). Before each launch the node drops from the cache what the launch will
read beyond the part that fits, and reads that part once: pages read twice sit on the kernel's active
list, which the rest of the load streams past, so every later launch reads that part from memory
(benchmarks/page_cache_keep.py measures it on this kernel: of a set of files 1.07x a memory cgroup, 0%
served from the cache launch after launch, against 69% with the part kept, the step's own reads counted; on
real SGLang 0.5.17 with MemAvailable held at the seed's proportion, a reload read 15.0 GB from disk a launch
alone against 10.2 GB after the step, its weights in 5.5-5.9 s against 10.2-11.2 s: RESULTS-sglang-h200.md).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from autotune.node.runner import CommandRunner, NodeUnreachableError
from autotune.trial.startup import (
    DEFAULT_LOAD_THREADS,
    LOAD_FORMAT_FLAG,
    PRESHARDED,
    PRESHARDED_PATH_KEY,
    THREADS_KEY,
    loader_config,
    maps_shards,
    multithread_config,
    threaded_loader_bytes,
)

if TYPE_CHECKING:
    from autotune.trial.launch import ServerLaunch

__all__ = [
    "KEEP_STEP", "PAGE_CACHE_SHARE", "READERS", "SERVER_HOST_BYTES", "WeightFile", "WeightListing",
    "cache_weights", "keep_plan", "keep_weights", "kept_part", "loader_peak_bytes",
    "weight_files",
]  # fmt: skip

# The share of MemAvailable the page cache keeps weights in from one launch to the next, the server's own
# memory and its loaders' taken from it (the rest: the kernel's room to read what is not kept).
PAGE_CACHE_SHARE = 0.8
# The host memory of SGLang's own processes per rank, which they take once the step has run: SGLang 0.5.17's
# at tp=1 (scheduler, tokenizer, detokenizer, launcher) held 2.32 GB of anonymous memory through every load
# (benchmarks/RESULTS-sglang-h200.md); per rank it overstates tp > 1, where the tokenizer is shared.
SERVER_HOST_BYTES = 2_300_000_000
READERS = 8  # files read at once when the kept part is read: memory, not one reader, is the limit
STEP_KILL_S = 5  # after the step's time is up, its readers get this long to end on SIGTERM
# SGLang 0.5.17's presharded dump files (loader.py, PreshardedModelLoader._make_filename): one every rank
# reads, or one the listed ranks read.
_DUMP_FILE = re.compile(r"model-(\d+)-(?:common|rank-(\d{3}(?:,\d{3})*))\.safetensor$")
# MemAvailable in bytes; then the weights a launch of `$1` (the checkpoint) reads: a finished presharded
# dump's files under `$2` where there is one (D), else the checkpoint's shards (C).
_LIST = (
    "awk '/^MemAvailable:/ {printf \"%.0f\\n\", $2 * 1024}' /proc/meminfo && "
    'if [ -n "$2" ] && [ -n "$(find "$2" -maxdepth 2 -name READY 2>/dev/null)" ]; then '
    "find \"$2\" -maxdepth 2 -name '*.safetensor' -printf 'D %s %p\\n'; fi; "
    "find \"$1\" -maxdepth 1 -name '*.safetensors' -printf 'C %s %p\\n'"
)
# Drop from the page cache every file before `--keep` (GNU dd: "iflag=nocache count=0" drops a whole
# file's cache), then read the files after it, READERS at a time, as the loader reads them (read(2)).
KEEP_STEP = (
    'drop=1; for f in "$@"; do if [ "$f" = --keep ]; then drop=; continue; fi; '
    'if [ -n "$drop" ]; then dd if="$f" iflag=nocache count=0 status=none; else printf "%s\\0" "$f"; fi; '
    f"done | xargs -0 -r -P {READERS} -n 1 sh -c 'dd if=\"$0\" of=/dev/null bs=16M status=none'"
)


@dataclass(frozen=True)
class WeightFile:
    """One file a launch reads its weights from: its bytes, and the tensor-parallel ranks that read it
    (None: every rank, as every checkpoint shard under SGLang's default loader)."""

    path: str
    bytes: int
    ranks: tuple[int, ...] | None = None


class WeightListing(NamedTuple):
    """What the node's listing (_LIST) found: MemAvailable, the files a launch reads its weights from, the
    ones it no longer reads (a checkpoint its finished dump replaced), and whether it reads a dump."""

    available: int
    files: list[WeightFile]
    unread: list[WeightFile]
    reads_dump: bool


def weight_files(listing: str) -> WeightListing | None:
    """The node's listing (_LIST) read; None where it is not one."""
    lines = listing.splitlines()
    if not lines or not lines[0].strip().isdigit():
        return None
    available, dump, checkpoint = int(lines[0]), [], []
    for line in lines[1:]:
        kind, size, path = [*line.split(" ", 2), "", ""][:3]
        if not size.isdigit() or not path:
            continue
        if kind == "D" and (name := _DUMP_FILE.search(path)) is not None:
            ranks = tuple(int(r) for r in name.group(2).split(",")) if name.group(2) else None
            dump.append(WeightFile(path, int(size), ranks))
        elif kind == "C":
            checkpoint.append(WeightFile(path, int(size)))
    if dump:
        return WeightListing(available, dump, checkpoint, reads_dump=True)
    return WeightListing(available, checkpoint, [], reads_dump=False)


def kept_part(files: list[WeightFile], budget: int) -> list[WeightFile]:
    """The files kept within `budget` bytes: those every rank reads first, then a rank's own, always
    adding to the rank that keeps least (a launch's load ends with its slowest rank's)."""
    kept: list[WeightFile] = []
    used = 0
    for f in sorted((f for f in files if f.ranks is None), key=lambda f: f.path):
        if used + f.bytes <= budget:
            kept.append(f)
            used += f.bytes
    by_rank: dict[int, int] = {}
    left = sorted((f for f in files if f.ranks is not None), key=lambda f: f.path)
    while left:
        fits = [f for f in left if used + f.bytes <= budget]
        if not fits:
            break
        chosen = min(fits, key=lambda f: max(by_rank.get(r, 0) + f.bytes for r in f.ranks or ()))
        left.remove(chosen)
        kept.append(chosen)
        used += chosen.bytes
        for rank in chosen.ranks or ():
            by_rank[rank] = by_rank.get(rank, 0) + chosen.bytes
    return kept


def loader_peak_bytes(launch: ServerLaunch, largest_shard: int, reads_dump: bool) -> int:
    """The host memory the launch's server holds at once beside the kept weights: per rank its processes'
    own (SERVER_HOST_BYTES), and where it loads the checkpoint, the shard it maps (its pages pass through the
    page cache), or with `--weight-loader-disable-mmap` the threads + 2 shards the multithreaded loader reads
    into its own memory. A dump's read-back holds none of its files (measured on 0.5.17: no more memory than
    the server's own)."""
    try:
        ranks = max(launch.tensor_parallel_size, 1)
    except ValueError:
        return 0
    own = ranks * SERVER_HOST_BYTES
    if reads_dump:
        return own
    config = multithread_config(launch)
    if config is None or maps_shards(launch):
        return own + ranks * largest_shard
    threads = int(str(config.get(THREADS_KEY, DEFAULT_LOAD_THREADS)))
    return own + threaded_loader_bytes(ranks, threads, largest_shard)


def keep_budget(available: int, launch: ServerLaunch, largest_shard: int, reads_dump: bool) -> int:
    """The bytes of weights the page cache can keep beside the launch's loaders."""
    return max(int(PAGE_CACHE_SHARE * available) - loader_peak_bytes(launch, largest_shard, reads_dump), 0)


def keep_weights(runner: CommandRunner, launch: ServerLaunch, timeout_s: float) -> float | None:
    """Before `launch`: where its weights are larger than the page cache keeps, the part that fits read
    into the cache and the rest (and a checkpoint a finished dump replaced) dropped from it; the step's
    seconds (node time). None where the weights fit (the cache keeps them whole), the node's listing is
    unreadable, or nothing fits."""
    if launch.model_path is None:
        return None
    config = loader_config(launch)
    dump = str(config.get(PRESHARDED_PATH_KEY) or "") if launch.flag(LOAD_FORMAT_FLAG) == PRESHARDED else ""
    try:
        listed = runner.run(["sh", "-c", _LIST, "sh", launch.model_path, dump], {}, timeout_s=60)
    except (NodeUnreachableError, TimeoutError):
        return None
    found = weight_files(listed.stdout) if listed.returncode == 0 else None
    plan = keep_plan(launch, found) if found is not None else None
    if plan is None:
        return None
    kept, drop, _ = plan
    started = time.monotonic()
    try:
        done = cache_weights(runner, kept, drop, timeout_s)
    except (NodeUnreachableError, TimeoutError):
        return None
    return round(time.monotonic() - started, 2) if done else None


def keep_plan(
    launch: ServerLaunch, listing: WeightListing
) -> tuple[list[WeightFile], list[WeightFile], int] | None:
    """The files to keep in the page cache and to drop from it before `launch`, and the bytes of weights
    it reads; None where they fit the page cache whole or no file fits beside the loaders."""
    available, files, unread, reads_dump = listing
    total = sum(f.bytes for f in files)
    if not files or total <= PAGE_CACHE_SHARE * available:
        return None
    if launch.flag(LOAD_FORMAT_FLAG) == PRESHARDED and not reads_dump:
        return None  # it writes the dump: the checkpoint is read this once, every later launch reads the dump
    largest = max((f.bytes for f in files if f.ranks is None), default=0)
    kept = kept_part(files, keep_budget(available, launch, largest, reads_dump))
    if not kept:
        return None
    return kept, [f for f in (*files, *unread) if f not in kept], total


def cache_weights(
    runner: CommandRunner, kept: list[WeightFile], drop: list[WeightFile], timeout_s: float
) -> bool:
    """`drop` out of the node's page cache, then `kept` read into it (KEEP_STEP); whether it finished
    within `timeout_s`. The node's `timeout` ends the step's whole process group, its readers too, a little
    before the runner stops waiting (a runner's timeout ends only the command it started)."""
    paths = [*(f.path for f in drop), "--keep", *(f.path for f in kept)]
    bound = ["timeout", "-k", str(STEP_KILL_S), f"{max(timeout_s - 2 * STEP_KILL_S, 1):.0f}"]
    done = runner.run([*bound, "sh", "-c", KEEP_STEP, "sh", *paths], {}, timeout_s=timeout_s)
    return done.returncode == 0
