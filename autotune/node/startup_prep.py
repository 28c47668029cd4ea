"""What the node adds to a launch before it starts it, for a cheaper start-up: its JIT and compile cache
folder (kept across trials), multithreaded weight loading turned down where the host's free memory
cannot hold the shards it reads at once, and presharded weights where they help (node.presharded)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from autotune.node.presharded import dump_folders, dump_room, presharded_launch, wants_presharded
from autotune.node.runner import CommandRunner, NodeUnreachableError
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import (
    DEFAULT_LOAD_THREADS,
    LOADER_FLAG,
    MULTITHREAD_KEY,
    THREADS_KEY,
    compile_cache_env,
    maps_shards,
    multithread_config,
    threaded_loader_bytes,
)

__all__ = ["COMPILE_CACHE_FOLDER", "HostMemory", "fit_loader", "loader_for_memory", "prepare_launch"]

COMPILE_CACHE_FOLDER = "compile-cache"  # in the node's work folder, shared by every trial on it
# The share of MemAvailable the loaders may fill: the rest is the page cache's and every other process's.
HOST_MEMORY_SHARE = 0.9
# MemAvailable in bytes, then the largest *.safetensors file under the model folder ($1) and all of them
# together, in bytes.
_PROBE = (
    "awk '/^MemAvailable:/ {printf \"%.0f\\n\", $2 * 1024}' /proc/meminfo; "
    "find -L \"$1\" -maxdepth 1 -name '*.safetensors' -printf '%s\\n' 2>/dev/null | sort -n | "
    "awk '{largest = $1; total += $1} END {if (NR) printf \"%.0f\\n%.0f\\n\", largest, total}'"
)


@dataclass(frozen=True)
class HostMemory:
    """The node's free host memory and the model's weight shards (the largest, all together), in bytes."""

    available_bytes: int
    largest_shard_bytes: int
    checkpoint_bytes: int = 0  # every shard together


def prepare_launch(
    runner: CommandRunner,
    launch: ServerLaunch,
    cache_folder: Path | None,
    presharded_root: Path | None = None,
) -> tuple[ServerLaunch, list[str]]:
    """`launch` with the node's compile caches under `cache_folder` (None: none), its weight loading fitted
    to the host's free memory, and presharded weights under `presharded_root` where they make its load
    cheaper (None: never); with a sentence for each change a user should know of."""
    notes: list[str] = []
    if cache_folder is not None:
        launch = replace(
            launch, env={**launch.env, **compile_cache_env(runner.node_path(cache_folder), launch.env)}
        )
    if multithread_config(launch) is None and presharded_root is None:
        return launch, notes
    memory = host_memory(runner, launch.model_path)
    if memory is None:
        return launch, notes
    launch, note = fit_loader(launch, memory)
    if note is not None:
        notes.append(note)
    if presharded_root is not None and wants_presharded(launch, memory):
        folders = dump_folders(launch, runner.node_path(presharded_root))
        room = dump_room(runner, folders[0])
        if room is not None:
            launch, why_not = presharded_launch(launch, folders, memory, room)
            notes += [why_not] if why_not is not None else []
    return launch, notes


def fit_loader(launch: ServerLaunch, memory: HostMemory) -> tuple[ServerLaunch, str | None]:
    """`launch` with its multithreaded weight loading fitted to `memory` (`loader_for_memory`), and the
    sentence that says why, or as given and None when it fits, the launch does not load multithreaded, or
    SGLang maps the shards (its default: their pages are the page cache's, not the loader's own)."""
    config = multithread_config(launch)
    if config is None or maps_shards(launch):
        return launch, None
    fitted, note = loader_for_memory(config, _ranks(launch), memory)
    if note is None:
        return launch, None
    return launch.with_flag(LOADER_FLAG, json.dumps(fitted)), note


def loader_for_memory(
    config: dict[str, object], ranks: int, memory: HostMemory
) -> tuple[dict[str, object], str | None]:
    """The loader settings that fit: as given when they do, fewer threads, or multithreading off, with
    the sentence that says why (trial.startup.threaded_loader_bytes: what the loader holds)."""
    threads = int(str(config.get(THREADS_KEY, DEFAULT_LOAD_THREADS)))
    shard, budget = memory.largest_shard_bytes, memory.available_bytes * HOST_MEMORY_SHARE
    need = threaded_loader_bytes(ranks, threads, shard)
    if shard <= 0 or need <= budget:
        return config, None
    fits = math.floor(budget / (ranks * shard)) - 2
    why = (
        f"{ranks} rank(s) x ({threads} threads + 2) shards of {shard / 1e9:.1f} GB need "
        f"{need / 1e9:.0f} GB of host memory and {memory.available_bytes / 1e9:.0f} GB is free"
    )
    if fits >= 1:
        return {
            **config,
            THREADS_KEY: fits,
        }, f"weight loading uses {fits} threads instead of {threads}: {why}"
    return {MULTITHREAD_KEY: False}, f"multithreaded weight loading left off: {why}"


def host_memory(runner: CommandRunner, model_path: str | None) -> HostMemory | None:
    """The node's MemAvailable and the model folder's largest shard, or None where either is unknown."""
    if model_path is None:
        return None
    try:
        done = runner.run(["sh", "-c", _PROBE, "sh", model_path], {}, timeout_s=30)
    except (NodeUnreachableError, TimeoutError):
        return None
    words = done.stdout.split()
    if done.returncode != 0 or len(words) != 3 or not all(w.isdigit() for w in words):
        return None
    return HostMemory(int(words[0]), int(words[1]), int(words[2]))


def _ranks(launch: ServerLaunch) -> int:
    """The server's tensor-parallel ranks: each runs a loader of its own over every shard."""
    try:
        return max(launch.tensor_parallel_size, 1)
    except ValueError:
        return 1
