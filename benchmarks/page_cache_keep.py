"""Weights larger than the page cache, read launch after launch: what the page cache serves by itself, and
with autotune's step before each launch (autotune.node.page_cache: drop what lies beyond the part that
fits, read that part in). Measured on this machine's own kernel, not modelled.

A set of files stands for a checkpoint; a memory cgroup (v1, `memory.limit_in_bytes`; needs root) stands
for a host whose memory is smaller than the checkpoint, at the seed's proportions (547 GB of weights on a
512 GB host, the page cache's share 0.8). Each pass reads every file once, in order, as a loader does,
from a process inside the cgroup; the bytes it read from disk are /proc/vmstat's pgpgin over the pass.
The step runs inside the cgroup too, with node.page_cache's own choice of files and its own shell step.
The step's rate over the part already in the page cache is printed too (the simulated node's
KEEP_READ_GBPS assumes a server's 8 readers).

    sudo python benchmarks/page_cache_keep.py [--set-mb 2048] [--passes 6]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autotune.node.page_cache import KEEP_STEP, PAGE_CACHE_SHARE, READERS, WeightFile, kept_part

CGROUP = Path("/sys/fs/cgroup/memory/autotune-page-cache-keep")
SEED_WEIGHTS_GB, SEED_HOST_GB = 547, 512
FILES = 16
LOADER = 'for f in "$@"; do dd if="$f" of=/dev/null bs=16M status=none; done'


def pgpgin_bytes() -> int:
    """KiB read from block devices since boot (/proc/vmstat), in bytes."""
    with open("/proc/vmstat") as vmstat:
        return next(int(line.split()[1]) for line in vmstat if line.startswith("pgpgin ")) * 1024


def in_cgroup(argv: list[str]) -> None:
    """Run `argv` as a process of the cgroup, so the pages it reads are charged to it."""
    enter = f"echo $$ > {CGROUP}/cgroup.procs && exec \"$@\""
    subprocess.run(["sh", "-c", enter, "sh", *argv], check=True)


def drop(paths: list[str]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)


def load(paths: list[str]) -> tuple[int, float]:
    """One pass, as a loader reads: every file in order. Bytes from disk, seconds."""
    before, started = pgpgin_bytes(), time.monotonic()
    in_cgroup(["sh", "-c", LOADER, "sh", *paths])
    return pgpgin_bytes() - before, time.monotonic() - started


def passes(
    files: list[WeightFile], limit: int, keep: bool, count: int
) -> list[Pass]:
    """`count` loads in a row, each after the node's step where `keep`: per load, the share of the weights
    the step read from disk and its seconds, then the load's."""
    paths = [f.path for f in files]
    drop(paths)
    kept = kept_part(files, int(PAGE_CACHE_SHARE * limit)) if keep else []
    rest = [f.path for f in files if f not in kept]
    total = sum(f.bytes for f in files)
    out = []
    for _ in range(count):
        before, started = pgpgin_bytes(), time.monotonic()
        if keep:  # the node's step, before each launch
            in_cgroup(["sh", "-c", KEEP_STEP, "sh", *rest, "--keep", *(f.path for f in kept)])
        step = ((pgpgin_bytes() - before) / total, time.monotonic() - started) if keep else (0.0, 0.0)
        from_disk, seconds = load(paths)
        out.append((*step, from_disk / total, seconds))
    drop(paths)
    return out


Pass = tuple[float, float, float, float]  # the step's share from disk and seconds, then the load's


def report(plain: list[Pass], kept: list[Pass], size: int) -> None:
    print("per pass: the share of the weights read from disk, and seconds")
    header = ("load, page cache alone", "the step before it", "load after the step")
    print(f"{'pass':<6}" + "".join(f"{h:>24}" for h in header))
    for n, ((_, _, a, sa), (k, sk, b, sb)) in enumerate(zip(plain, kept, strict=True)):
        print(f"{n:<6}{a:>14.0%} {sa:>7.2f} s{k:>14.0%} {sk:>7.2f} s{b:>14.0%} {sb:>7.2f} s")
    alone = sum(p[2] for p in plain[1:]) / len(plain[1:])
    step = sum(p[0] + p[2] for p in kept[1:]) / len(kept[1:])
    print(f"\nafter the first pass, per launch: {alone:.0%} of the weights read from disk by the page cache")
    print(f"alone, {step:.0%} with the step (its own reads counted): {1 - step:.0%} served from memory")
    rates = [(1 - p[2]) * size / p[1] / 1e9 for p in kept[1:]]
    print(f"the step read its part from the page cache at {min(rates):.1f}-{max(rates):.1f} GB/s (its")
    print(f"{READERS} readers on this machine's {os.cpu_count()} cores, processes started included)")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--set-mb", type=int, default=2048, help="the files' total size (default 2048 MB)")
    parser.add_argument("--passes", type=int, default=6, help="launches read in a row (default 6)")
    args = parser.parse_args()
    if not (CGROUP.parent / "memory.limit_in_bytes").exists() or os.geteuid() != 0:
        print("needs root and a cgroup v1 memory controller at /sys/fs/cgroup/memory", file=sys.stderr)
        return 2
    size = args.set_mb * 1024 * 1024
    limit = int(size * SEED_HOST_GB / SEED_WEIGHTS_GB)
    CGROUP.mkdir(exist_ok=True)
    try:
        (CGROUP / "memory.limit_in_bytes").write_text(str(limit))
        with tempfile.TemporaryDirectory(dir=Path(__file__).resolve().parent.parent) as folder:
            files = []
            for i in range(FILES):
                path = Path(folder) / f"model-{i + 1:05d}-of-{FILES:05d}.safetensors"
                path.write_bytes(os.urandom(size // FILES))
                files.append(WeightFile(str(path), size // FILES))
            os.sync()
            each = size // FILES / 2**20
            print(f"{FILES} files of {each:.0f} MiB ({args.set_mb} MiB) read {args.passes} times")
            print(f"in a memory cgroup of {limit / 2**20:.0f} MiB (the seed's {SEED_WEIGHTS_GB} GB on "
                  f"{SEED_HOST_GB} GB); kept: what {PAGE_CACHE_SHARE} of the cgroup holds\n")  # fmt: skip
            plain = passes(files, limit, keep=False, count=args.passes)
            kept = passes(files, limit, keep=True, count=args.passes)
            report(plain, kept, size)
    finally:
        CGROUP.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
