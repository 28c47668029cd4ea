"""The NCCL all-reduce benchmark one trial runs: one process per GPU, timed by CUDA-graph replay.

    python -m autotune.measure.nccl --messages 42K:122,14K:0 --gpus 2

It prints one line `AUTOTUNE_RESULT {...}` (see `autotune.node.job`) with each message size's time per
all-reduce and their weighted mean `allreduce_us`, or exits non-zero for `autotune.trial.failures` to
classify; a graph capture that does not finish is measured again eagerly. How it measures, and why:
docs/design.md, "The NCCL benchmark".
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import os
import queue as queue_module
import re
import sys
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import Field, asdict, dataclass, field, fields
from typing import Any, Literal, get_args

from autotune.errors import AutotuneError
from autotune.measure.result_line import print_result
from autotune.measure.stats import MeanCI, mean_ci, t_quantile

__all__ = [
    "DTYPE_BYTES",
    "BenchSettings",
    "CaptureFailed",
    "Message",
    "format_size",
    "main",
    "parse_messages",
    "parse_size",
    "summarize",
]

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
Timing = Literal["graph", "eager"]
_SIZE = re.compile(r"^\s*(\d+)\s*([KMG]?)(?:i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_POLL_S = 0.2
# A rank's phases, in order; each rank writes its index into a shared array as it enters one. Shared
# memory, not the queue: a rank stuck in a CUDA call that holds the GIL never flushes a queued message.
PHASES = ("starting", "initializing NCCL", "checking sums", "warming up", "capture", "timing", "reporting")
_CAPTURE, _TIMING = PHASES.index("capture"), PHASES.index("timing")
_EXIT_WAIT_S = 10.0  # after the results: NCCL's teardown takes a second or two
MIB = float(1 << 20)


def parse_size(text: str) -> int:
    """Bytes from `43008`, `42K`, `42KiB` or `1M` (binary units)."""
    match = _SIZE.match(str(text))
    if match is None:
        raise ValueError(f"a message size is bytes with an optional K, M or G (1024s), but got {text!r}.")
    size = int(match.group(1)) * _UNITS[match.group(2).upper()]
    if size <= 0:
        raise ValueError(f"a message size must be positive, but got {text!r}.")
    return size


def format_size(size: int) -> str:
    """`42K` for 43008 bytes, `1M` for 1048576, `1000` for 1000."""
    for unit in ("G", "M", "K"):
        if size % _UNITS[unit] == 0:
            return f"{size // _UNITS[unit]}{unit}"
    return str(size)


@dataclass(frozen=True)
class Message:
    """One all-reduce message size and its weight in `allreduce_us` (how many per step; 0: reported only)."""

    bytes: int
    weight: float = 1.0

    def __post_init__(self) -> None:
        if self.bytes <= 0:
            raise ValueError(f"`bytes > 0` must hold, but got ({self.bytes=}).")
        if not (self.weight >= 0 and math.isfinite(self.weight)):
            raise ValueError(f"`weight >= 0` must hold, but got ({self.weight=}).")

    @property
    def label(self) -> str:
        return format_size(self.bytes)

    def spec(self) -> str:
        weight = int(self.weight) if float(self.weight).is_integer() else self.weight
        return f"{self.label}:{weight}"


def parse_messages(text: str) -> tuple[Message, ...]:
    """Messages from `42K:122,14K:0,1M` (SIZE[:WEIGHT], weight 1 when left out)."""
    messages = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        size, _, weight = item.partition(":")
        try:
            messages.append(Message(parse_size(size), float(weight) if weight else 1.0))
        except ValueError as exc:
            raise ValueError(f"bad message {item!r}: {exc}") from None
    if not messages:
        raise ValueError(f"at least one message size is needed, but got {text!r}.")
    if len({m.bytes for m in messages}) != len(messages):
        raise ValueError(f"each message size may appear once, but got {text!r}.")
    if not any(m.weight > 0 for m in messages):
        raise ValueError(f"at least one message needs a weight above 0, but got {text!r}.")
    return tuple(messages)


@dataclass(frozen=True)
class BenchSettings:
    """What one run of the benchmark measures, and how; `to_argv` and `from_argv` are inverses, and each
    setting's option, default and help are written once, here."""

    # Each setting's help; its option is `--name-with-dashes` unless the metadata names another.
    messages: tuple[Message, ...]
    gpus: int = field(default=2, metadata={"help": "processes, one per GPU"})
    dtype: str = field(default="bfloat16", metadata={"help": "the all-reduced tensors' dtype"})
    graph_iters: int = field(default=100, metadata={"help": "all-reduces captured in one CUDA graph"})
    replays: int = field(default=20, metadata={"help": "graph replays timed together: one sample"})
    repeats: int = field(default=10, metadata={"help": "samples per message size: the interval's n"})
    warmup: int = field(default=20, metadata={"help": "eager all-reduces per size before capture"})
    capture_timeout_s: float = field(
        default=60.0, metadata={"help": "seconds for graph capture", "option": "--capture-timeout"}
    )
    timing: Timing = field(default="graph", metadata={"help": "CUDA-graph replay, or an eager launch each"})

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"`dtype` must be one of {sorted(DTYPE_BYTES)}, but got {self.dtype!r}.")
        for name in ("gpus", "graph_iters", "replays", "warmup"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name} >= 1` must hold, but got ({name}={getattr(self, name)!r}).")
        if self.repeats < 2:
            raise ValueError(f"`repeats >= 2` must hold for an interval, but got ({self.repeats=}).")
        if self.capture_timeout_s <= 0:
            raise ValueError(f"`capture_timeout_s > 0` must hold, but got ({self.capture_timeout_s=}).")
        if self.timing not in ("graph", "eager"):
            raise ValueError(f"`timing` must be graph or eager, but got {self.timing!r}.")
        element = DTYPE_BYTES[self.dtype]
        for message in self.messages:
            if message.bytes % element:
                raise ValueError(
                    f"a {self.dtype} message must be a multiple of {element} bytes, but got {message.bytes}."
                )

    def flags(self) -> tuple[tuple[str, str], ...]:
        """The job's command-line options, each with its value, in the order `to_argv` writes them."""
        options = [("--messages", ",".join(m.spec() for m in self.messages))]
        for setting in _SETTINGS:
            value = getattr(self, setting.name)
            options.append((_option(setting), f"{value:g}" if isinstance(value, float) else str(value)))
        return tuple(options)

    def to_argv(self) -> list[str]:
        return [word for option in self.flags() for word in option]

    @classmethod
    def from_argv(cls, argv: Sequence[str] | None = None) -> BenchSettings:
        """Parse the command line (argparse exits 2 with a message on a bad one)."""
        parser = _parser()
        args = parser.parse_args(argv)
        try:
            values = {setting.name: getattr(args, setting.name) for setting in _SETTINGS}
            return cls(messages=parse_messages(args.messages), **values)
        except ValueError as exc:
            parser.error(str(exc))


_SETTINGS = [f for f in fields(BenchSettings) if f.name != "messages"]
_CHOICES: Mapping[str, Sequence[str]] = {"dtype": sorted(DTYPE_BYTES), "timing": get_args(Timing)}


def _option(setting: Field[Any]) -> str:
    return str(setting.metadata.get("option") or "--" + setting.name.replace("_", "-"))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autotune.measure.nccl", description=__doc__.splitlines()[0] if __doc__ else None
    )
    parser.add_argument("--messages", required=True, help="SIZE[:WEIGHT],... e.g. 42K:122,14K:0")
    for setting in _SETTINGS:
        parser.add_argument(
            _option(setting),
            dest=setting.name,
            type=type(setting.default),
            default=setting.default,
            choices=_CHOICES.get(setting.name),
            help=f"{setting.metadata['help']} (default {setting.default})",
        )
    return parser


# -- the result ------------------------------------------------------------------------------------------
@dataclass
class RankReport:
    """What one GPU process measured: per-size samples (us per all-reduce) and its memory (bytes)."""

    rank: int
    samples_us: dict[int, list[float]]
    memory: dict[str, float]
    versions: dict[str, str] = field(default_factory=dict)


def summarize(
    settings: BenchSettings,
    reports: Sequence[RankReport],
    timing: Timing,
    note: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The result payload: per-size intervals of the slowest rank's samples, the weighted mean, memory."""
    sizes = []
    weighted = []
    per_size: dict[str, float] = {}
    for message in settings.messages:
        per_repeat = [max(r.samples_us[message.bytes][i] for r in reports) for i in range(settings.repeats)]
        ci = mean_ci(per_repeat)
        sizes.append(
            {
                "bytes": message.bytes,
                "label": message.label,
                "weight": message.weight,
                "mean_us": ci.mean,
                "ci95_us": ci.half_width,
                "std_us": ci.std,
                "min_us": min(per_repeat),
                "samples_us": per_repeat,
            }
        )
        per_size[f"allreduce_us.{message.label}"] = ci.mean
        per_size[f"allreduce_us_ci95.{message.label}"] = ci.half_width
        if message.weight > 0:
            weighted.append((message.weight, ci))
    overall = _weighted(weighted)
    memory = {key: max(r.memory[key] for r in reports) / MIB for key in reports[0].memory}
    metrics: dict[str, float] = {
        "allreduce_us": overall.mean,
        "allreduce_us_ci95": overall.half_width,
        "nccl_memory_mib": memory["nccl"],
        "nccl_init_memory_mib": memory["nccl_init"],
        "gpu_used_mib": memory["gpu_used"],
        "cuda_graph": 1.0 if timing == "graph" else 0.0,
        **per_size,
    }
    return {
        "benchmark": "nccl_allreduce",
        "metrics": metrics,
        "timing": "cuda_graph" if timing == "graph" else "eager",
        "note": note,
        "sizes": sizes,
        "memory_mib_per_rank": [{k: v / MIB for k, v in r.memory.items()} for r in reports],
        "settings": {**asdict(settings), "messages": [asdict(m) for m in settings.messages]},
        "versions": reports[0].versions,
        "env": dict(sorted((env or {}).items())),
    }


def _weighted(parts: Sequence[tuple[float, MeanCI]]) -> MeanCI:
    """The weighted mean of independent means, with an interval from their standard errors."""
    total = math.fsum(w for w, _ in parts)
    mean = math.fsum(w * ci.mean for w, ci in parts) / total
    n = min(ci.n for _, ci in parts)
    se = math.sqrt(math.fsum((w / total) ** 2 * ci.std**2 / ci.n for w, ci in parts))
    return MeanCI(mean, t_quantile(0.95, n - 1) * se, n, se * math.sqrt(n))


# -- the processes ------------------------------------------------------------------------------------------
class CaptureFailed(AutotuneError):
    """CUDA-graph capture hung past its timeout or failed on a rank: the run is made again eagerly."""


class RankFailed(AutotuneError):
    """A GPU process failed outside capture (its traceback is already in the output)."""


def run(settings: BenchSettings) -> dict[str, Any]:
    """Measure with CUDA graphs, or eagerly when capture fails or hangs; return the result payload."""
    env = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    if settings.timing == "eager":
        return summarize(settings, _run_ranks(settings, "eager"), "eager", None, env)
    try:
        return summarize(settings, _run_ranks(settings, "graph"), "graph", None, env)
    except CaptureFailed as exc:
        note = f"CUDA-graph capture {exc}; timed eagerly instead (launch overhead included)"
        print(f"autotune.measure.nccl: {note}", file=sys.stderr, flush=True)
        return summarize(settings, _run_ranks(settings, "eager"), "eager", note, env)


def _run_ranks(settings: BenchSettings, timing: Timing) -> list[RankReport]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")  # CUDA cannot be used in forked children
    messages: Any = context.Queue()
    progress: Any = context.Array("i", settings.gpus, lock=False)
    with tempfile.TemporaryDirectory(prefix="autotune-nccl-") as tmp:
        rendezvous = os.path.join(tmp, "rendezvous")
        processes = [
            context.Process(
                target=_rank_main,
                args=(rank, settings, timing, rendezvous, messages, progress),
                name=f"rank{rank}",
            )
            for rank in range(settings.gpus)
        ]
        for process in processes:
            process.start()
        try:
            return _collect(settings, timing, processes, messages, progress)
        finally:
            for process in processes:
                process.join(timeout=_EXIT_WAIT_S)
                if process.is_alive():
                    process.kill()
                    process.join(timeout=_EXIT_WAIT_S)


def _collect(
    settings: BenchSettings, timing: Timing, processes: Sequence[Any], messages: Any, progress: Any
) -> list[RankReport]:
    """Follow the ranks' messages until every report is in; enforce the capture timeout."""
    reports: dict[int, RankReport] = {}
    capture_deadline: float | None = None
    while len(reports) < settings.gpus:
        phases = list(progress)
        if capture_deadline is None and max(phases) >= _CAPTURE and min(phases) < _TIMING:
            capture_deadline = time.monotonic() + settings.capture_timeout_s
        elif capture_deadline is not None and min(phases) >= _TIMING:
            capture_deadline = math.inf  # every rank captured: no deadline from here on
        try:
            kind, rank, data = messages.get(timeout=_POLL_S)
        except queue_module.Empty:
            if capture_deadline is not None and time.monotonic() > capture_deadline:
                _stop(processes)
                done = [r for r, phase in enumerate(phases) if phase >= _TIMING]
                raise CaptureFailed(
                    f"did not finish within {settings.capture_timeout_s:g} s "
                    f"(ranks done: {done or 'none'} of {settings.gpus})"
                ) from None
            dead = [p for p in processes if p.exitcode not in (None, 0)]
            if dead:
                _stop(processes)
                why = f"{dead[0].name} exited with status {dead[0].exitcode}"
                if capture_deadline is not None and capture_deadline < math.inf and timing == "graph":
                    raise CaptureFailed(f"failed: {why}") from None
                raise RankFailed(why) from None
            continue
        if kind == "error":
            phase, line = data
            _stop(processes)
            if phase.startswith("capture") and timing == "graph":
                raise CaptureFailed(f"failed on rank {rank}: {line}")
            raise RankFailed(f"rank {rank} failed while {phase}: {line}")
        elif kind == "report":
            reports[rank] = data
    return [reports[rank] for rank in range(settings.gpus)]


def _stop(processes: Sequence[Any]) -> None:
    for process in processes:
        if process.is_alive():
            process.kill()  # a rank stuck in NCCL does not answer SIGTERM in time
    for process in processes:
        process.join(timeout=_EXIT_WAIT_S)


def _rank_main(
    rank: int, settings: BenchSettings, timing: Timing, rendezvous: str, messages: Any, progress: Any
) -> None:
    """One GPU's process: report to `messages`, or print the traceback and exit 1. Each phase it enters
    goes to `progress` and, timed, to stderr (the trial's log shows where a hang began)."""
    phase = "starting"
    started = time.monotonic()

    def enter(name: str) -> None:
        nonlocal phase
        phase = name
        progress[rank] = PHASES.index("capture" if name.startswith("capture") else name)
        elapsed = time.monotonic() - started
        print(f"autotune.measure.nccl: rank {rank} +{elapsed:.1f}s {name}", file=sys.stderr)

    try:
        report = _measure_rank(rank, settings, timing, rendezvous, enter)
        messages.put(("report", rank, report))
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.flush()
        messages.put(("error", rank, (phase, f"{type(exc).__name__}: {exc}".splitlines()[0][:300])))
        messages.close()
        messages.join_thread()
        os._exit(1)
    messages.close()
    messages.join_thread()  # the report is in the pipe
    sys.stderr.flush()
    os._exit(0)  # skips the interpreter's and torch's exit handlers, which tear NCCL down


def _measure_rank(
    rank: int, settings: BenchSettings, timing: Timing, rendezvous: str, enter: Any
) -> RankReport:
    import torch
    import torch.distributed as dist

    n = settings.gpus
    if torch.cuda.device_count() < n:
        raise RuntimeError(f"--gpus {n} needs {n} GPUs, but {torch.cuda.device_count()} are visible")
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    torch.empty(1, device=device)  # the CUDA context, before the first memory reading
    torch.cuda.synchronize()
    used_start = _used_bytes(torch, device)
    reserved_start = torch.cuda.memory_reserved(device)

    enter("initializing NCCL")
    # device_id: the communicator is created here, not at the first collective.
    dist.init_process_group(
        "nccl", init_method=f"file://{rendezvous}", rank=rank, world_size=n, device_id=device
    )
    torch.cuda.synchronize()
    used_init = _used_bytes(torch, device)

    enter("checking sums")
    dtype = getattr(torch, settings.dtype)
    buffers = {
        m.bytes: torch.empty(m.bytes // DTYPE_BYTES[settings.dtype], dtype=dtype, device=device)
        for m in settings.messages
    }
    expected = n * (n + 1) / 2
    for size, buffer in buffers.items():
        buffer.fill_(rank + 1)
        dist.all_reduce(buffer)
        if not bool(torch.all(buffer == expected)):
            wrong = buffer[buffer != expected][:4].tolist()
            raise RuntimeError(
                f"NCCL error: the all-reduce of {format_size(size)} returned wrong sums ({wrong}, expected "
                f"{expected}): this setting corrupts data"
            )
        buffer.zero_()  # zeros stay zeros however often they are summed

    enter("warming up")
    for buffer in buffers.values():
        for _ in range(settings.warmup):
            dist.all_reduce(buffer)
    torch.cuda.synchronize()
    used_warm = _used_bytes(torch, device)
    reserved_warm = torch.cuda.memory_reserved(device)
    tensors = reserved_warm - reserved_start  # torch's own allocations (the buffers), not NCCL's
    memory = {
        "nccl_init": float(used_init - used_start),
        "nccl": float(used_warm - used_start - tensors),
        "gpu_used": float(used_warm),
    }

    K = settings.graph_iters
    run_once: dict[int, Any] = {}
    if timing == "graph":
        dist.barrier()
        torch.cuda.synchronize()
        # Where a capture hangs, the parent stops this rank at the timeout: print its stack just before.
        faulthandler.dump_traceback_later(max(1.0, settings.capture_timeout_s - 2.0))
        for size, buffer in buffers.items():
            enter(f"capture {format_size(size)}")
            graph = torch.cuda.CUDAGraph()
            # thread_local: NCCL's and torch's watchdog threads may not invalidate the capture.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                for _ in range(K):
                    dist.all_reduce(buffer)
            graph.replay()
            torch.cuda.synchronize()
            run_once[size] = graph.replay
        faulthandler.cancel_dump_traceback_later()
    else:
        for size, buffer in buffers.items():
            run_once[size] = _eager(dist, buffer, K)

    enter("timing")
    samples: dict[int, list[float]] = {}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for size in buffers:
        samples[size] = []
        for _ in range(settings.repeats):
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            for _ in range(settings.replays):
                run_once[size]()
            end.record()
            end.synchronize()
            samples[size].append(start.elapsed_time(end) * 1000.0 / (settings.replays * K))
    enter("reporting")
    # No destroy_process_group(): with graphs of NCCL kernels alive it hung on the H200s (nccl 2.28.9,
    # torch 2.11). The rank exits after reporting and the driver frees its communicator.
    return RankReport(rank, samples, memory, _versions(torch) if rank == 0 else {})


def _eager(dist: Any, buffer: Any, count: int) -> Any:
    def run() -> None:
        for _ in range(count):
            dist.all_reduce(buffer)

    return run


def _used_bytes(torch: Any, device: Any) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return int(total - free)


def _versions(torch: Any) -> dict[str, str]:
    nccl = torch.cuda.nccl.version()
    versions = {
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda),
        "nccl": ".".join(str(part) for part in nccl) if isinstance(nccl, tuple) else str(nccl),
        "gpu": torch.cuda.get_device_name(),
    }
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        versions["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:  # the driver version is a courtesy; nvidia-ml-py may be missing
        pass
    return versions


def main(argv: Sequence[str] | None = None) -> int:
    settings = BenchSettings.from_argv(argv)
    return print_result("autotune.measure.nccl", lambda: run(settings), (RankFailed,))


if __name__ == "__main__":
    sys.exit(main())
