"""The part of a launch's weights the page cache can hold, kept there (autotune.node.page_cache): the rule,
the files chosen, and the step itself on this machine's real page cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from autotune.node.page_cache import (
    PAGE_CACHE_SHARE,
    SERVER_HOST_BYTES,
    WeightFile,
    WeightListing,
    cache_weights,
    keep_plan,
    keep_weights,
    kept_part,
    loader_peak_bytes,
    weight_files,
)
from autotune.node.runner import LocalCommandRunner
from autotune.trial.launch import ServerLaunch, TrialConfig, build_server_launch
from autotune.trial.startup import DISABLE_MMAP_FLAG

GB = 10**9
SHARD = 8_546_875_000  # the seed's checkpoint: 64 shards, 547 GB


def _rank_file(file_id: int, rank: int, size: int) -> WeightFile:
    return WeightFile(f"/d/model-{file_id:05d}-rank-{rank:03d}.safetensor", size, (rank,))


def _launch(*flags: str, model: str = "/models/kimi", switch: str | None = None) -> ServerLaunch:
    valued: dict[str, str | None] = dict(zip(flags[::2], flags[1::2], strict=True))
    return build_server_launch(
        command=("python", "-m", "sglang.launch_server"),
        model_path=model,
        config=TrialConfig(flags={**valued, **({switch: None} if switch else {})}),
        host="127.0.0.1",
        port=30000,
        base_flags={"--tp-size": "8"},
    )


def test_a_finished_dump_is_what_the_launch_reads_and_its_checkpoint_is_dropped() -> None:
    listing = "\n".join(
        [
            "490000000000",
            "D 3000000000 /w/presharded/ab/TP-8-sig-1/model-00000-common.safetensor",
            "D 9000000000 /w/presharded/ab/TP-8-sig-1/model-00001-rank-000.safetensor",
            "D 9000000000 /w/presharded/ab/TP-8-sig-1/model-00002-rank-001,003.safetensor",
            "D 70 /w/presharded/ab/TP-8-sig-1/checksum.json",
            "C 8500000000 /models/kimi/model-00001-of-00064.safetensors",
        ]
    )
    assert weight_files(listing) == WeightListing(
        490 * GB,
        [
            WeightFile("/w/presharded/ab/TP-8-sig-1/model-00000-common.safetensor", 3 * GB, None),
            WeightFile("/w/presharded/ab/TP-8-sig-1/model-00001-rank-000.safetensor", 9 * GB, (0,)),
            WeightFile("/w/presharded/ab/TP-8-sig-1/model-00002-rank-001,003.safetensor", 9 * GB, (1, 3)),
        ],
        [WeightFile("/models/kimi/model-00001-of-00064.safetensors", 8_500_000_000)],
        reads_dump=True,
    )
    checkpoint_only = "490000000000\nC 8500000000 /models/kimi/model-00001-of-00064.safetensors\n"
    assert weight_files(checkpoint_only) == WeightListing(
        490 * GB,
        [WeightFile("/models/kimi/model-00001-of-00064.safetensors", 8_500_000_000)],
        [],
        reads_dump=False,
    )
    assert weight_files("sh: awk: not found\n") is None


def test_the_kept_part_fills_the_ranks_evenly_after_the_files_every_rank_reads() -> None:
    common = WeightFile("/d/model-00000-common.safetensor", 4 * GB)
    own = [_rank_file(i + 1, i % 4, 10 * GB) for i in range(8)]
    kept = kept_part([*own, common], 4 * GB + 4 * 10 * GB + 5 * GB)
    assert kept[0] == common
    # one file of each rank's two, not the first four files by name (ranks 0-3 once each: the same here) ...
    assert sorted(f.ranks for f in kept[1:]) == [(0,), (1,), (2,), (3,)]
    # ... and where the budget holds six, no rank gets a second before every rank has one
    uneven = [WeightFile(f"/d/model-{i:05d}-rank-000.safetensor", 10 * GB, (0,)) for i in range(3)]
    other = [WeightFile(f"/d/model-{i + 3:05d}-rank-001.safetensor", 10 * GB, (1,)) for i in range(3)]
    kept = kept_part([*uneven, *other], 40 * GB)
    assert sorted(f.ranks for f in kept) == [(0,), (0,), (1,), (1,)]


def test_the_budget_leaves_the_server_and_its_loaders_their_memory() -> None:
    dump = json.dumps({"presharded_path": "/w/presharded/ab", "max_file_bytes": 4 * 1024**3})
    presharded = _launch("--load-format", "presharded", "--model-loader-extra-config", dump)
    own = 8 * SERVER_HOST_BYTES  # 8 ranks' processes
    assert loader_peak_bytes(presharded, 9 * GB, reads_dump=True) == own  # the read-back holds no file
    threaded = _launch("--model-loader-extra-config", json.dumps({"num_threads": 4}))
    assert loader_peak_bytes(threaded, 9 * GB, reads_dump=False) == own + 8 * 9 * GB  # a mapped shard each
    single = _launch("--model-loader-extra-config", json.dumps({"enable_multithread_load": False}))
    assert loader_peak_bytes(single, 9 * GB, reads_dump=False) == own + 8 * 9 * GB
    # told not to map them, the multithreaded loader reads threads + 2 shards per rank into its own memory
    copies = _launch("--model-loader-extra-config", json.dumps({"num_threads": 4}), switch=DISABLE_MMAP_FLAG)
    assert loader_peak_bytes(copies, 9 * GB, reads_dump=False) == own + 8 * (4 + 2) * 9 * GB
    # The seed's node: 547 GB of weights, 490 GB free. Kept: 0.8 x 490 less the 8 ranks' own memory.
    files = [_rank_file(i, i % 8, 4_273_437_500) for i in range(128)]
    unread = [WeightFile("/models/kimi/a.safetensors", GB)]
    plan = keep_plan(presharded, WeightListing(490 * GB, files, unread, reads_dump=True))
    assert plan is not None
    kept, drop, total = plan
    budget = PAGE_CACHE_SHARE * 490 * GB - own
    assert total == 547 * GB and budget - 4_273_437_500 < sum(f.bytes for f in kept) <= budget
    assert len(kept) + len(drop) == 129 and drop[-1].path == "/models/kimi/a.safetensors"
    # Weights the page cache holds whole need nothing; nor do loaders that leave it no room.
    assert keep_plan(presharded, WeightListing(1000 * GB, files, [], reads_dump=True)) is None
    shards = [WeightFile(f"/models/kimi/model-{i:05d}-of-00064.safetensors", SHARD) for i in range(64)]
    # 8 ranks x (4 threads + 2) shards read into memory: 410 GB of buffers leave the page cache nothing
    assert keep_plan(copies, WeightListing(490 * GB, shards, [], reads_dump=False)) is None
    # the launch that writes the dump reads the checkpoint this once: nothing of it is worth keeping
    assert keep_plan(presharded, WeightListing(490 * GB, shards, [], reads_dump=False)) is None
    for mapped in (threaded, single):  # 392 GB less 8 ranks' own and mapped shard: 35 of the 8.5 GB shards
        kept_shards = keep_plan(mapped, WeightListing(490 * GB, shards, [], reads_dump=False))
        assert kept_shards is not None and len(kept_shards[0]) == 35


def _resident(path: Path) -> int:
    """Bytes of `path` in the page cache, as util-linux's fincore reads them (mincore)."""
    out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(path)], capture_output=True, text=True)
    return int(out.stdout.split()[0])


@pytest.mark.integration
@pytest.mark.skipif(shutil.which("fincore") is None, reason="util-linux's fincore reads the page cache")
def test_the_step_drops_the_rest_and_reads_the_kept_part_into_the_page_cache(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    shards = [folder / f"model-{i:05d}-of-00004.safetensors" for i in range(1, 5)]
    for shard in shards:
        shard.write_bytes(os.urandom(4 * 1024 * 1024))
        os.sync()
    for shard in shards[:2]:  # resident, as the last launch left them
        shard.read_bytes()
    fd = os.open(shards[2], os.O_RDONLY)  # dropped already: the step must read it in
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    if _resident(shards[0]) == 0 or _resident(shards[2]) != 0:
        pytest.skip(f"{tmp_path}'s file system keeps no page cache of its own (tmpfs)")
    kept = [WeightFile(str(shards[2]), 4 * 1024 * 1024), WeightFile(str(shards[3]), 4 * 1024 * 1024)]
    drop = [WeightFile(str(s), 4 * 1024 * 1024) for s in shards[:2]]
    assert cache_weights(LocalCommandRunner(), kept, drop, timeout_s=30)
    assert [_resident(s) for s in shards] == [0, 0, 4 * 1024 * 1024, 4 * 1024 * 1024]


@pytest.mark.integration
def test_a_step_past_its_time_ends_with_its_readers(tmp_path: Path) -> None:
    """A reader that never finishes (a FIFO no one writes to): the step ends within its time, and no
    reader of it is left on the node."""
    fifo = tmp_path / "model-00001-of-00001.safetensors"
    os.mkfifo(fifo)
    started = time.monotonic()
    assert not cache_weights(LocalCommandRunner(), [WeightFile(str(fifo), 1)], [], timeout_s=12)
    assert time.monotonic() - started < 12
    readers = [p for p in Path("/proc").iterdir() if p.name.isdigit() and str(fifo).encode() in _cmdline(p)]
    assert readers == []


def _cmdline(process: Path) -> bytes:
    try:
        return (process / "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.integration
def test_weights_the_page_cache_holds_whole_are_left_to_it(tmp_path: Path) -> None:
    """This machine's free memory holds a small checkpoint: the node reads the listing and does nothing."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 1024)
    launch = _launch(model=str(folder))
    assert keep_weights(LocalCommandRunner(), launch, timeout_s=30) is None
