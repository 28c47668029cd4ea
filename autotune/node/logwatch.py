"""Follow a server's log while it starts: ready, failed (seconds after a fatal line), or timed out."""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from autotune.node.runner import ServerProcess, bytes_from
from autotune.node.startup_phases import StartupPhaseReader
from autotune.trial.failures import Failure, FailureKind, classify, is_fatal_line
from autotune.trial.memory_fraction import MEM_FRACTION

__all__ = [
    "READY_LINE",
    "LogFollower",
    "StartupOutcome",
    "StartupStatus",
    "follow_log",
    "wait_until_ready",
]

READY_LINE = "The server is fired up and ready to roll!"

# Log markers of the start-up phases, recorded the first time any rank logs them. The graph captures are
# "Capture cuda graph begin/end" before 0.5.15, and one per graph since: "Capture target decode CUDA graph
# begin. backend=full, ..." / "... CUDA graph end. elapsed=...", with "target verify", "draft decode",
# "target prefill" (model_executor/model_runner_components/cuda_graph_setup.py, eagle_worker_v2.py).
_CAPTURE = r"Capture (?:[a-z]+ ){0,3}cuda graph "
_MARKERS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"Load weight begin"), "load_weight_begin"),
    (re.compile(r"Load weight end"), "load_weight_end"),
    (re.compile(_CAPTURE + r"begin\b", re.IGNORECASE), "capture_cuda_graph_begin"),
    (re.compile(_CAPTURE + r"end\b", re.IGNORECASE), "capture_cuda_graph_end"),
    (re.compile(re.escape(READY_LINE)), "ready"),
)
# Which marker starts which live-progress phase for `on_phase`.
_PHASE_OF_MARKER = {"load_weight_begin": "loading", "capture_cuda_graph_begin": "capturing", "ready": "ready"}

# After the first fatal line, keep reading this long: the traceback and the other ranks' errors arrive
# just after it, and the root cause is often among them. Well inside the 2 s promised to callers.
_SETTLE_S = 0.8
# Noticing a fatal line takes at most one poll, then the settle: together under 2 s.
_MAX_POLL_S = 1.0


class LogFollower:
    """Reads a growing log file incrementally and hands out complete new lines.

    Only bytes after the last read are read; a partial last line is held back until its newline arrives
    (or `flush()` is called), and a multi-byte character split across reads is decoded whole.
    The file may not exist yet; if it shrinks (truncated or replaced), reading restarts at its start.
    `reader(offset)` returns the file's size and its bytes from `offset` on; by default it reads `path`
    here (a server's own `read_log_bytes` also fetches a remote log first: see `follow_log`).
    """

    def __init__(
        self,
        path: Path | str,
        offset: int = 0,
        reader: Callable[[int], tuple[int, bytes]] | None = None,
    ) -> None:
        self.path = Path(path)
        self._offset = offset
        self._partial = b""
        self._reader = reader or functools.partial(bytes_from, self.path)

    @property
    def offset(self) -> int:
        """Bytes of the file consumed so far (including a held-back partial line)."""
        return self._offset

    def poll_new_lines(self) -> list[str]:
        """Return the complete lines written since the last call, without their newlines."""
        data = self._read_new()
        if not data:
            return []
        buf = self._partial + data
        *complete, self._partial = buf.split(b"\n")
        return [_decode(line) for line in complete]

    def flush(self) -> list[str]:
        """Return new complete lines plus the unterminated last line, if any (the writer has exited)."""
        lines = self.poll_new_lines()
        if self._partial:
            lines.append(_decode(self._partial))
            self._partial = b""
        return lines

    def _read_new(self) -> bytes:
        size, data = self._reader(self._offset)
        if size < self._offset:
            self._offset = 0
            self._partial = b""
            size, data = self._reader(0)
        self._offset += len(data)
        return data


def follow_log(process: ServerProcess, *, from_end: bool = False) -> LogFollower:
    """A follower of `process`'s own log, from where this process began writing (or from its end now).

    It reads through the process, so a remote server's log is fetched as it grows; reading raises
    `NodeUnreachableError` when the node stops answering.
    """
    offset = process.log_size() if from_end else process.log_offset
    return LogFollower(process.log_path, offset, reader=process.read_log_bytes)


def _decode(line: bytes) -> str:
    return line.decode("utf-8", errors="replace").rstrip("\r")


# What SGLang decides for itself when a flag is left unset, as its `server_args=` line shows it (resolved
# before it is logged), under autotune's name for each flag (SGLang's newest spelling). Three formats:
#   <= 0.5.13  server_args=ServerArgs(..., mem_fraction_static=0.893, chunked_prefill_size=8192,
#              cuda_graph_max_bs=512, ...)
#   0.5.15-17  server_args=ServerArgs(..., cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(
#              backend='full', max_bs=512, ...), prefill=PhaseConfig(...)),
#              cuda_graph_max_bs_decode=None, ...)
#   0.5.19+    server_args={'model_path': ..., 'mem_fraction_static': 0.893, 'cuda_graph_config':
#              {'decode': {'backend': 'full', 'max_bs': 512, ...}, 'prefill': {...}}, ...}
# (srt/entrypoints/engine.py: f"{server_args=}", then server_args.resolved_dict()).
def _field(name: str, number: str) -> re.Pattern[str]:
    """`name=N` (a dataclass repr) or `'name': N` (a dict)."""
    return re.compile(rf"(?:\b{name}=|'{name}': )({number})(?=[,)}}\s]|$)")


_FLOAT, _INT = r"[0-9]+(?:\.[0-9]+)?(?:[eE]-?[0-9]+)?", r"-?\d+"
_FLAT: dict[str, tuple[re.Pattern[str], ...]] = {
    MEM_FRACTION: (_field("mem_fraction_static", _FLOAT),),
    "--chunked-prefill-size": (_field("chunked_prefill_size", _INT),),
    "--cuda-graph-max-bs-decode": (
        _field("cuda_graph_max_bs_decode", _INT),
        _field("cuda_graph_max_bs", _INT),
    ),
    "--cuda-graph-max-bs-prefill": (_field("cuda_graph_max_bs_prefill", _INT),),
}
# One phase of `cuda_graph_config`: `decode=PhaseConfig(...)` or `'decode': {...}` (no nested brackets of
# either kind inside a phase but the `bs` list).
_PHASE = {
    "--cuda-graph-max-bs-decode": re.compile(r"(?:\bdecode=PhaseConfig\(|'decode': \{)([^(){}]*)"),
    "--cuda-graph-max-bs-prefill": re.compile(r"(?:\bprefill=PhaseConfig\(|'prefill': \{)([^(){}]*)"),
}
_PHASE_MAX_BS = _field("max_bs", r"\d+")
# Where the logged values are: from the start of the line's `server_args=`.
_SERVER_ARGS = re.compile(r"\bserver_args=(?:ServerArgs\(|\{)")

CHOSEN_BY_SERVER = tuple(_FLAT)


def server_choices(line: str) -> dict[str, float]:
    """The values a `server_args=` log line shows for the flags in CHOSEN_BY_SERVER (every format SGLang
    0.5.11 to 0.5.23 prints); a graph's batch is what its phase in `cuda_graph_config` captures up to,
    else the flat field (None there means "SGLang's choice", found in the phase)."""
    start = _SERVER_ARGS.search(line)
    if start is None:
        return {}
    text = line[start.start() :]
    found: dict[str, float] = {}
    for flag, regexes in _FLAT.items():
        phase = _PHASE.get(flag)
        if phase is not None and (inside := phase.search(text)) is not None:
            if (match := _PHASE_MAX_BS.search(inside.group(1))) is not None:
                found[flag] = float(match.group(1))
                continue
        for regex in regexes:
            if (match := regex.search(text)) is not None:
                found[flag] = float(match.group(1))
                break
    return found


# The memory report a starting server prints (0.5.11 to 0.5.23, every rank; the first one is read):
#   KV Cache is allocated. dtype: torch.bfloat16, #tokens: 3806725, K size: 58.09 GB, V size: 58.09 GB
#   (MLA: "..., #tokens: N, KV size: X GB"; srt/mem_cache/memory_pool.py)
#   max_total_num_tokens=3806725, chunked_prefill_size=8192, max_prefill_tokens=16384,
#   max_running_requests=4096, context_len=8192, available_gpu_mem=20.35 GB  (srt/managers/scheduler.py)
#   Load weight end. elapsed=4.12 s, type=LlamaForCausalLM, avail mem=136.90 GB, mem usage=13.51 GB.
#   (srt/model_executor/model_runner.py; the weights one GPU holds, in SGLang's GB: GiB)
_KV_ALLOCATED = re.compile(r"KV Cache is allocated\. [^\n]*?#tokens: (\d+)")
_WEIGHTS = re.compile(r"Load weight end\. [^\n]*?\bmem usage=([0-9.]+) GB")
_KV_SIZES = re.compile(r"\b(?:K|V|KV) size: ([0-9.]+) GB")
_SCHEDULER_MEMORY = {
    "max_total_num_tokens": re.compile(r"\bmax_total_num_tokens=(\d+)"),
    "max_running_requests": re.compile(r"\bmax_total_num_tokens=\d+,[^\n]*?\bmax_running_requests=(\d+)"),
    "context_len": re.compile(r"\bmax_total_num_tokens=\d+,[^\n]*?\bcontext_len=(\d+)"),
    "available_gpu_mem_gb": re.compile(r"\bmax_total_num_tokens=\d+,[^\n]*?\bavailable_gpu_mem=([0-9.]+) GB"),
}
_MEMORY_KEYS = ("weights_gb", "kv_cache_tokens", "kv_cache_gb", *_SCHEDULER_MEMORY)


def server_memory(line: str) -> dict[str, float]:
    """What one log line of the server's memory report says: `weights_gb` (one GPU's), `kv_cache_tokens`,
    `kv_cache_gb` (K and V together), `max_total_num_tokens`, `max_running_requests`, `context_len`,
    `available_gpu_mem_gb`."""
    found: dict[str, float] = {}
    if (weights := _WEIGHTS.search(line)) is not None:
        found["weights_gb"] = float(weights.group(1))
    if (kv := _KV_ALLOCATED.search(line)) is not None:
        found["kv_cache_tokens"] = float(kv.group(1))
        sizes = _KV_SIZES.findall(line[kv.end() :])
        if sizes:
            found["kv_cache_gb"] = round(sum(float(size) for size in sizes), 2)
    for key, regex in _SCHEDULER_MEMORY.items():
        if (match := regex.search(line)) is not None:
            found[key] = float(match.group(1))
    return found


class StartupStatus(StrEnum):
    """How a server's start-up ended."""

    READY = "ready"
    FAILED = "failed"
    TIMEOUT = "timeout"


@dataclass(frozen=True)
class StartupOutcome:
    """The end of a start-up: status, the failure (when not READY), timings, and how it was decided.

    `phase_times` maps load_weight_begin, load_weight_end, capture_cuda_graph_begin,
    capture_cuda_graph_end and ready to monotonic seconds since the wait began, for those seen.
    `ready_via` is "log" (the ready line) or "check" (ready_check() succeeded) when READY.
    `returncode` is the process's exit status when it had exited, else None (it may still be running
    after a fatal line: the caller stops it). `server_memory` is the server's memory report (see
    `server_memory`), as far as it got.
    """

    status: StartupStatus
    elapsed_s: float
    failure: Failure | None = None
    phase_times: dict[str, float] = field(default_factory=dict)
    returncode: int | None = None
    ready_via: str | None = None
    server_choices: dict[str, float] = field(default_factory=dict)  # see `server_choices`
    server_memory: dict[str, float] = field(default_factory=dict)  # see `server_memory`
    # Seconds per start-up phase the log shows (autotune.node.startup_phases; no ready_s: the caller's).
    startup_phases: dict[str, float] = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.status is StartupStatus.READY


def wait_until_ready(
    process: ServerProcess,
    log_path: Path | str,
    ready_check: Callable[[], bool] | None,
    timeout_s: float,
    poll_s: float = 0.2,
    *,
    on_phase: Callable[[str], None] | None = None,
) -> StartupOutcome:
    """Watch a starting server until it is ready, fails, or `timeout_s` passes: READY on the ready line or
    `ready_check()`; FAILED soon after the first fatal log line, or when the process exits before ready,
    classified from the log; TIMEOUT (STARTUP_TIMEOUT) otherwise, naming the last phase seen. `on_phase` hears
    "loading", "capturing" and "ready"; the process is never stopped here. The whole contract:
    docs/design.md, "Waiting for a server"."""
    start = time.monotonic()
    log_path = Path(log_path)
    follower = follow_log(process) if log_path == process.log_path else LogFollower(log_path)
    lines: list[str] = []
    phase_times: dict[str, float] = {}
    choices: dict[str, float] = {}
    memory: dict[str, float] = {}
    phases = StartupPhaseReader()
    last_marker: list[str] = ["none"]
    fatal_at: float | None = None

    def elapsed() -> float:
        return time.monotonic() - start

    def take(new_lines: list[str]) -> bool:
        """Record new lines; True when the ready line was among them."""
        nonlocal fatal_at
        ready = False
        for line in new_lines:
            lines.append(line)
            phases.take(line, elapsed())
            if not choices:
                choices.update(server_choices(line))
            if fatal_at is None and is_fatal_line(line):
                fatal_at = time.monotonic()
            if not all(memory.get(key) is not None for key in _MEMORY_KEYS):
                memory.update({k: v for k, v in server_memory(line).items() if k not in memory})
            for marker, name in _MARKERS:
                if marker.search(line) is None:
                    continue
                last_marker[0] = name  # a later graph's capture after the first one's end counts
                if name not in phase_times:
                    phase_times[name] = elapsed()
                    if name in _PHASE_OF_MARKER and on_phase is not None:
                        on_phase(_PHASE_OF_MARKER[name])
            ready = ready or READY_LINE in line
        return ready

    def outcome(
        status: StartupStatus,
        failure: Failure | None = None,
        returncode: int | None = None,
        ready_via: str | None = None,
    ) -> StartupOutcome:
        return StartupOutcome(
            status,
            elapsed(),
            failure,
            dict(phase_times),
            returncode,
            ready_via,
            choices,
            dict(memory),
            phases.phases(),
        )

    def failed(returncode: int | None) -> StartupOutcome:
        text = "\n".join(lines)
        failure = classify(text, "starting")
        if failure is None:
            failure = Failure.of(
                FailureKind.UNKNOWN_CRASH,
                _last_line(lines),
                f"server exited with status {returncode} before it was ready",
            )
        return outcome(StartupStatus.FAILED, failure, returncode=returncode)

    while True:
        saw_ready = take(follower.poll_new_lines())
        if fatal_at is not None:
            # A fatal line outranks a ready line or a passing health check seen in the same poll.
            returncode = process.poll()
            if returncode is not None or time.monotonic() - fatal_at >= _SETTLE_S:
                if returncode is not None:
                    take(follower.flush())
                return failed(returncode)
        elif saw_ready:
            return outcome(StartupStatus.READY, ready_via="log")
        else:
            returncode = process.poll()
            if returncode is not None:
                # The process is gone: its last words are in the file now, read them all.
                take(follower.flush())
                return failed(returncode)
            if ready_check is not None and _check(ready_check):
                return outcome(StartupStatus.READY, ready_via="check")
            if elapsed() >= timeout_s:
                last = last_marker[0]
                return outcome(
                    StartupStatus.TIMEOUT,
                    Failure.of(
                        FailureKind.STARTUP_TIMEOUT,
                        _last_line(lines),
                        f"not ready after {timeout_s:g} s (last phase seen: {last})",
                    ),
                )
        # Sleep less while a fatal line settles so FAILED comes promptly.
        time.sleep(min(poll_s, 0.1) if fatal_at is not None else min(poll_s, _MAX_POLL_S))


def _check(ready_check: Callable[[], bool]) -> bool:
    try:
        return bool(ready_check())
    except OSError:
        return False  # connection refused or reset while the server starts


def _last_line(lines: list[str]) -> str:
    return next((line for line in reversed(lines) if line.strip()), "")
