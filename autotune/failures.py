"""Why a trial failed: the kinds of failure and the one table of SGLang log patterns that tell them apart.

Every pattern is SGLang's (or torch's, NCCL's, FlashInfer's) own wording, quoted in
/work/shared/reference/sglang.md, and each is tested against the real message it matches and against
benign lines it must not match.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

__all__ = [
    "PATTERNS",
    "Failure",
    "FailureKind",
    "FailurePattern",
    "Phase",
    "classify",
    "is_fatal_line",
]

Phase = Literal["starting", "benchmarking"]
_PHASES: tuple[str, ...] = ("starting", "benchmarking")


class FailureKind(StrEnum):
    """What went wrong with a trial, in the words a person tuning SGLang would use."""

    KV_POOL_TOO_SMALL = "kv_pool_too_small"
    CUDA_GRAPH_OOM = "cuda_graph_oom"
    OOM_UNDER_LOAD = "oom_under_load"
    UNSUPPORTED = "unsupported"
    NCCL_ERROR = "nccl_error"
    STARTUP_TIMEOUT = "startup_timeout"
    SERVER_DIED = "server_died"
    BENCHMARK_ERROR = "benchmark_error"
    LAUNCH_ERROR = "launch_error"
    UNKNOWN_CRASH = "unknown_crash"
    INTERRUPTED = "interrupted"
    NODE_UNREACHABLE = "node_unreachable"
    NODE_LOST = "node_lost"

    @property
    def advice(self) -> str:
        """What a person who has seen this failure before would tell you to try."""
        return _ADVICE[self]

    @property
    def is_oom(self) -> bool:
        """True for the out-of-memory kinds (a penalized, pruned trial rather than a broken one)."""
        return self in (FailureKind.KV_POOL_TOO_SMALL, FailureKind.CUDA_GRAPH_OOM, FailureKind.OOM_UNDER_LOAD)

    @property
    def flag_to_lower(self) -> str | None:
        """The server flag whose smaller value SGLang's own message names as the fix, when there is one."""
        return _FLAG_TO_LOWER.get(self)

    @property
    def deterministic(self) -> bool:
        """True when the same settings fail the same way on the same hardware every time."""
        return self is FailureKind.UNSUPPORTED

    @property
    def retried_once(self) -> bool:
        """True when the trial says nothing about its settings, so its parameters run once more."""
        return self in (FailureKind.INTERRUPTED, FailureKind.NODE_UNREACHABLE, FailureKind.NODE_LOST)


# "Possible solutions: ... 2. set --cuda-graph-max-bs to a smaller value" (cuda_graph_runner.py). The other
# solution it names, a smaller --mem-fraction-static, shrinks the KV cache that the throughput lives on.
_FLAG_TO_LOWER: dict[FailureKind, str] = {FailureKind.CUDA_GRAPH_OOM: "--cuda-graph-max-bs"}

_ADVICE: dict[FailureKind, str] = {
    FailureKind.KV_POOL_TOO_SMALL: (
        "The weights leave no room for the KV cache inside --mem-fraction-static: raise "
        "--mem-fraction-static, or shard the weights over more GPUs (--tp-size)."
    ),
    FailureKind.CUDA_GRAPH_OOM: (
        "CUDA graph capture or start-up ran out of GPU memory: lower --mem-fraction-static (e.g. 0.8 or "
        "0.7) to leave more for graphs and activations, or lower --cuda-graph-max-bs (e.g. 128)."
    ),
    FailureKind.OOM_UNDER_LOAD: (
        "The server ran out of GPU memory while serving: lower --mem-fraction-static, "
        "--max-running-requests or --chunked-prefill-size to leave room for activations."
    ),
    FailureKind.UNSUPPORTED: (
        "A kernel or feature does not support this GPU architecture; the same flags fail the same way "
        "every time: drop the flag or choose another backend."
    ),
    FailureKind.NCCL_ERROR: (
        "NCCL failed: check the NCCL_* environment variables of this trial (protocol, algorithm, "
        "buffer sizes) and run with NCCL_DEBUG=INFO for details."
    ),
    FailureKind.STARTUP_TIMEOUT: (
        "The server neither became ready nor failed before the start-up timeout: it may hang (look at "
        "the last phase in the log) or need a longer timeout for weight loading."
    ),
    FailureKind.SERVER_DIED: (
        "The server process exited during the benchmark: read the end of its log for the cause."
    ),
    FailureKind.BENCHMARK_ERROR: (
        "The server stayed up but requests failed or the benchmark timed out: check the first error "
        "and the server log."
    ),
    FailureKind.LAUNCH_ERROR: (
        "The node was not ready for a launch (command not found, port taken, GPUs held by another "
        "process): fix the node, not the settings; this trial says nothing about the settings."
    ),
    FailureKind.UNKNOWN_CRASH: (
        "The server crashed with no recognized cause: read the traceback in its log; if it is a new "
        "failure mode, add its pattern to autotune.failures.PATTERNS."
    ),
    FailureKind.INTERRUPTED: "The trial was interrupted (Ctrl-C, driver or actor stopped); it can be rerun.",
    FailureKind.NODE_UNREACHABLE: (
        "The connection to the node was lost mid-trial: check the network and sshd on the node; the trial "
        "runs again once the node answers."
    ),
    FailureKind.NODE_LOST: (
        "The node's actor died or the node left the Ray cluster: the trial runs again on another node."
    ),
}


class FailurePattern(NamedTuple):
    """One row of the pattern table: what to look for, what it means, and a short description."""

    regex: re.Pattern[str]
    kind: FailureKind
    description: str
    culprits: tuple[str, ...] = ()  # the flags an UNSUPPORTED message names, so they are not tried again


# Python traceback: a frame line, its indented source/caret lines, then the exception (no "File" line in
# between, so the frame is the one that raised).
_LAST_FRAME_IN = (
    r'  File "[^"\n]*(?:{where})[^"\n]*", line \d+, in [^\n]*\n(?:(?![ \t]*File ")[ \t][^\n]*\n)*'
)

# ONE ordered table. classify() picks the first row (most specific first) that matches anywhere in the
# log, so a root cause beats the errors it causes in other ranks (an OOM on one rank makes the others
# report NCCL errors) and the propagation markers at the end decide only when nothing else matched.
PATTERNS: tuple[FailurePattern, ...] = (
    # Deterministic incompatibilities first: a capture that fails because a kernel has no build for this
    # architecture is not a memory problem, whatever the surrounding "Capture cuda graph failed" says.
    FailurePattern(
        re.compile(r"No supported CUDA architectures found for major versions"),
        FailureKind.UNSUPPORTED,
        "FlashInfer JIT has no kernel for this GPU architecture",
        ("--enable-flashinfer-allreduce-fusion",),
    ),
    FailurePattern(
        # Torch's wording is version-dependent; this is the simulated node's wording
        # ("RuntimeError: SymmetricMemory is not supported on device with compute capability 12.0").
        re.compile(r"SymmetricMemory is not supported on device"),
        FailureKind.UNSUPPORTED,
        "torch symmetric memory (--enable-torch-symm-mem) unsupported on this GPU",
        ("--enable-torch-symm-mem",),
    ),
    FailurePattern(
        re.compile(r"FlashAttention v3 Backend requires SM>=80 and SM<=90"),
        FailureKind.UNSUPPORTED,
        "--attention-backend fa3 unsupported on this GPU",
        ("--attention-backend",),
    ),
    FailurePattern(
        # A bare `assert` in SGLang's FlashInfer all-to-all dispatcher (--moe-a2a-backend flashinfer)
        # or in FlashInfer's comm module: the traceback's last frame is there, then `AssertionError`.
        re.compile(
            _LAST_FRAME_IN.format(where=r"token_dispatcher/flashinfer|flashinfer/comm/")
            + r"AssertionError\b[^\n]*"
        ),
        FailureKind.UNSUPPORTED,
        "expert-parallel FlashInfer all-to-all backend assertion failed",
        ("--ep-size", "--moe-a2a-backend"),
    ),
    FailurePattern(
        re.compile(r"Not enough memory\. Please try to increase --mem-fraction-static"),
        FailureKind.KV_POOL_TOO_SMALL,
        "KV cache pool does not fit inside --mem-fraction-static",
    ),
    FailurePattern(
        # SGLang aborts a request whose prompt cannot fit the KV pool (max_total_num_tokens).
        re.compile(r"Input length \(\d+ tokens\) exceeds the maximum allowed length"),
        FailureKind.KV_POOL_TOO_SMALL,
        "a prompt of the workload does not fit the KV cache pool",
    ),
    FailurePattern(
        re.compile(r"Capture cuda graph failed"),
        FailureKind.CUDA_GRAPH_OOM,
        "CUDA graph capture failed",
    ),
    FailurePattern(
        re.compile(r"torch\.OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate"),
        FailureKind.CUDA_GRAPH_OOM,  # classify() turns this into OOM_UNDER_LOAD while benchmarking
        "torch CUDA out of memory",
    ),
    FailurePattern(
        re.compile(r"The memory capacity is unbalanced\. Some GPUs may be occupied by other processes"),
        FailureKind.LAUNCH_ERROR,
        "another process holds GPU memory",
    ),
    FailurePattern(
        # Python's OSError says "Address already in use", uvicorn and torch's TCPStore say it lower-case.
        re.compile(r"[Aa]ddress already in use|EADDRINUSE"),
        FailureKind.LAUNCH_ERROR,
        "port already taken",
    ),
    FailurePattern(
        re.compile(r"\bNCCL error\b|\bnccl(?:InternalError|UnhandledCudaError|SystemError)\b"),
        FailureKind.NCCL_ERROR,
        "NCCL error",
    ),
    # torch's wording for a failed kernel or CUDA call (an OOM says "out of memory" and matched above).
    FailurePattern(
        re.compile(r"(?:Error|Exception): CUDA error: "),
        FailureKind.UNKNOWN_CRASH,
        "CUDA error",
    ),
    # Propagation markers: the server is dying, but they do not say why.
    FailurePattern(
        re.compile(r"Scheduler hit an exception"),
        FailureKind.UNKNOWN_CRASH,
        "a scheduler process raised an exception",
    ),
    FailurePattern(
        re.compile(r"Received sigquit from a child process"),
        FailureKind.UNKNOWN_CRASH,
        "a child process failed and the server is killing its tree",
    ),
    FailurePattern(
        re.compile(r"Rank 0 scheduler is dead"),
        FailureKind.UNKNOWN_CRASH,
        "rank 0 scheduler is dead",
    ),
    FailurePattern(
        re.compile(r"Initialization failed\."),
        FailureKind.UNKNOWN_CRASH,
        "server initialization failed",
    ),
)


@dataclass(frozen=True)
class Failure:
    """A classified failure: its kind, the log line that shows it, what the line means, and advice."""

    kind: FailureKind
    line: str
    description: str
    advice: str
    culprits: tuple[str, ...] = ()

    @classmethod
    def of(cls, kind: FailureKind, line: str, description: str, culprits: tuple[str, ...] = ()) -> Failure:
        """Build a Failure whose advice is the kind's advice."""
        return cls(kind=kind, line=line, description=description, advice=kind.advice, culprits=culprits)


def classify(log_text: str, phase: Phase) -> Failure | None:
    """Classify a server log: the most specific matching pattern wins; None when no pattern matches.

    `phase` is "starting" or "benchmarking": a CUDA out-of-memory error at start is a capture or
    start-up OOM (CUDA_GRAPH_OOM), the same error while benchmarking is OOM_UNDER_LOAD.
    """
    if phase not in _PHASES:
        raise ValueError(f"`phase` must be one of {_PHASES}, but got {phase!r}.")
    for pattern in PATTERNS:
        match = pattern.regex.search(log_text)
        if match is None:
            continue
        kind = pattern.kind
        if phase == "benchmarking" and kind is FailureKind.CUDA_GRAPH_OOM:
            kind = FailureKind.OOM_UNDER_LOAD  # a CUDA OOM; a prompt the KV pool cannot hold stays KV
        return Failure.of(kind, _line_at(log_text, match.end() - 1), pattern.description, pattern.culprits)
    return None


def is_fatal_line(line: str) -> bool:
    """True when one log line shows the server is failing (a cause or a propagation marker).

    Multi-line patterns (traceback frames) never match a single line; their tracebacks are announced
    by a propagation marker or by the process exiting.
    """
    return any(pattern.regex.search(line) for pattern in PATTERNS)


def _line_at(text: str, index: int) -> str:
    """The whole line of `text` containing position `index`, without its newline."""
    index = max(index, 0)
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end != -1 else len(text)].rstrip("\r")
