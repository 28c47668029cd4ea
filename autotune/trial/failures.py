"""Why a trial failed: the kinds of failure and the one table of SGLang log patterns that tell them apart.

Every pattern is SGLang's (or torch's, NCCL's, FlashInfer's, argparse's) own wording, as SGLang 0.5.17 to
0.5.23 print it (and older wording that still occurs), and each is tested against the real message it
matches (the version and SGLang source file beside it) and against benign lines it must not match.
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
    "before_shutdown",
    "classify",
    "is_fatal_line",
]

Phase = Literal["starting", "benchmarking"]
_PHASES: tuple[str, ...] = ("starting", "benchmarking")


class FailureKind(StrEnum):
    """What went wrong with a trial, in the words a person tuning SGLang would use."""

    WEIGHTS_DO_NOT_FIT = "weights_do_not_fit"
    KV_POOL_TOO_SMALL = "kv_pool_too_small"
    CUDA_GRAPH_OOM = "cuda_graph_oom"
    PREFILL_GRAPH_OOM = "prefill_graph_oom"
    OOM_UNDER_LOAD = "oom_under_load"
    UNSUPPORTED = "unsupported"
    INVALID_ARGUMENTS = "invalid_arguments"
    KERNEL_BUILD_FAILED = "kernel_build_failed"
    NCCL_ERROR = "nccl_error"
    STARTUP_TIMEOUT = "startup_timeout"
    SERVER_DIED = "server_died"
    BENCHMARK_ERROR = "benchmark_error"
    LAUNCH_ERROR = "launch_error"
    UNKNOWN_CRASH = "unknown_crash"
    INTERRUPTED = "interrupted"
    NODE_UNREACHABLE = "node_unreachable"
    NODE_LOST = "node_lost"
    # Kinds the driver records itself, for proposals that never reached a node.
    FORBIDDEN = "forbidden"
    PREDICTED_OOM = "predicted_oom"
    KNOWN_INCOMPATIBLE = "known_incompatible"

    @property
    def advice(self) -> str:
        """What a person who has seen this failure before would tell you to try."""
        return _ADVICE[self]

    @property
    def is_oom(self) -> bool:
        """True for the out-of-memory kinds (a penalized, pruned trial rather than a broken one)."""
        return self in (
            FailureKind.WEIGHTS_DO_NOT_FIT,
            FailureKind.KV_POOL_TOO_SMALL,
            FailureKind.CUDA_GRAPH_OOM,
            FailureKind.PREFILL_GRAPH_OOM,
            FailureKind.OOM_UNDER_LOAD,
            FailureKind.PREDICTED_OOM,  # the same failure, foreseen before a launch
        )

    @property
    def flag_to_lower(self) -> str | None:
        """The server flag whose smaller value SGLang's own message names as the fix, when there is one."""
        return _FLAG_TO_LOWER.get(self)

    @property
    def deterministic(self) -> bool:
        """True when the same settings fail the same way on the same hardware every time: the values of the
        flags the failure names (`Failure.culprits`) are remembered and not launched again."""
        return self in (FailureKind.UNSUPPORTED, FailureKind.INVALID_ARGUMENTS)

    @property
    def retried_once(self) -> bool:
        """True when the trial says nothing about its settings, so its parameters run once more."""
        return self in (FailureKind.INTERRUPTED, FailureKind.NODE_UNREACHABLE, FailureKind.NODE_LOST)


# The out-of-memory kinds of a start (graph captures, buffers): the same errors while serving are
# OOM_UNDER_LOAD (classify), and a start's failure does not depend on what acts only while serving.
STARTUP_OOMS = frozenset({FailureKind.CUDA_GRAPH_OOM, FailureKind.PREFILL_GRAPH_OOM})

# The one home of "which flag cures which failure". SGLang's "Possible solutions: ... 2. set
# --cuda-graph-max-bs-decode to a smaller value (e.g., 16)" (0.5.17+, runner_backend_utils/__init__.py;
# `--cuda-graph-max-bs` before 0.5.15, a deprecated alias until 0.5.19, gone in 0.5.21). The other solution
# it names, a smaller --mem-fraction-static, shrinks the KV cache that the throughput lives on. A prefill
# graph that runs out of memory is cured by fewer captured prefill batch sizes.
_FLAG_TO_LOWER: dict[FailureKind, str] = {
    FailureKind.CUDA_GRAPH_OOM: "--cuda-graph-max-bs-decode",
    FailureKind.PREFILL_GRAPH_OOM: "--cuda-graph-max-bs-prefill",
}

_ADVICE: dict[FailureKind, str] = {
    FailureKind.WEIGHTS_DO_NOT_FIT: (
        "The model's weights ran out of GPU memory while loading: they do not fit on these GPUs whatever "
        "the memory flags say. Shard them over more GPUs (a larger --tp-size, on a node with more GPUs), "
        "serve a quantized model (FP8, INT4), or a smaller model."
    ),
    FailureKind.KV_POOL_TOO_SMALL: (
        "The weights leave no room for the KV cache inside --mem-fraction-static: raise "
        "--mem-fraction-static, or shard the weights over more GPUs (--tp-size)."
    ),
    FailureKind.CUDA_GRAPH_OOM: (
        "CUDA graph capture or start-up ran out of GPU memory: lower --mem-fraction-static (e.g. 0.8 or "
        "0.7) to leave more for graphs and activations, or lower --cuda-graph-max-bs-decode (e.g. 128)."
    ),
    FailureKind.PREFILL_GRAPH_OOM: (
        "Prefill CUDA graph capture ran out of GPU memory: lower --cuda-graph-max-bs-prefill or "
        "--mem-fraction-static, or turn prefill graphs off (--cuda-graph-backend-prefill=disabled)."
    ),
    FailureKind.OOM_UNDER_LOAD: (
        "The server ran out of GPU memory while serving: lower --mem-fraction-static, "
        "--max-running-requests or --chunked-prefill-size to leave room for activations."
    ),
    FailureKind.UNSUPPORTED: (
        "A kernel or feature does not support this GPU architecture; the same flags fail the same way "
        "every time: drop the flag or choose another backend."
    ),
    FailureKind.INVALID_ARGUMENTS: (
        "SGLang rejected the command line before starting (its argument parser or its own checks of the "
        "flags; its message says which flag and why): the same flags fail the same way every time. Fix "
        "the search space or server.flags: a flag or choice this SGLang version does not have, or a setting "
        "another flag requires."
    ),
    FailureKind.KERNEL_BUILD_FAILED: (
        "A GPU kernel failed to compile at start (FlashInfer/JIT: Ninja build failed): the node's CUDA "
        "toolkit or SGLang/FlashInfer install is broken or incomplete (missing sources, mismatched "
        "headers); fix the environment, not the settings; this trial says little about the settings."
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
        "failure mode, add its pattern to autotune.trial.failures.PATTERNS."
    ),
    FailureKind.INTERRUPTED: "The trial was interrupted (Ctrl-C, driver or actor stopped); it can be rerun.",
    FailureKind.NODE_UNREACHABLE: (
        "The connection to the node was lost mid-trial: check the network and sshd on the node; the trial "
        "runs again once the node answers."
    ),
    FailureKind.NODE_LOST: (
        "The node's actor died or the node left the Ray cluster: the trial runs again on another node."
    ),
    FailureKind.FORBIDDEN: (
        "The launch would use a value that never_launch in the study file forbids: not started."
    ),
    FailureKind.PREDICTED_OOM: (
        "Not launched: the weights per GPU would not fit inside --mem-fraction-static of the node's GPU "
        "memory (autotune.study.preflight), or the baseline's memory report shows the KV pool left at this "
        "--mem-fraction-static cannot hold the workload's longest prompt (autotune.study.before_launch), so "
        "SGLang would fail with kv_pool_too_small: raise --mem-fraction-static, or shard the weights over "
        "more GPUs (--tp-size)."
    ),
    FailureKind.KNOWN_INCOMPATIBLE: (
        "Not launched: a setting in it failed deterministically on this hardware before, or SGLang cannot "
        "run it on this GPU's architecture (autotune.dialect.gpu_support), so the proposal was recorded "
        "without running (it costs no node time)."
    ),
}


class FailurePattern(NamedTuple):
    """One row of the pattern table: what to look for, what it means, and a short description."""

    regex: re.Pattern[str]
    kind: FailureKind
    description: str
    # The flags a deterministic failure implicates, so their values are not tried again; a regex group
    # whose name starts with "flags" adds the flags the message itself names (an argparse error's).
    culprits: tuple[str, ...] = ()

    def culprits_in(self, match: re.Match[str]) -> tuple[str, ...]:
        """This row's culprits, with the flags named in `match`'s `flags*` groups."""
        named = [
            flag
            for group, text in match.groupdict().items()
            if group.startswith("flags") and text
            for flag in _FLAG.findall(text)
        ]
        return tuple(dict.fromkeys([*self.culprits, *named]))


# Python traceback: a frame line, its indented source/caret lines, then the exception (no "File" line in
# between, so the frame is the one that raised).
_LAST_FRAME_IN = (
    r'  File "[^"\n]*(?:{where})[^"\n]*", line \d+, in [^\n]*\n(?:(?![ \t]*File ")[ \t][^\n]*\n)*'
)

# An out-of-memory error as torch words it (`torch.OutOfMemoryError: CUDA out of memory. Tried to ...`) or
# as the CUDA driver does (`CUDA error: out of memory`), inside a wrapper's message on the same line.
_OOM_TEXT = r"[^\n]*(?:out of memory|OutOfMemoryError)"

# The flags a message names: a FailurePattern's `flags` group lists them (--name or --a/--b).
_FLAG = re.compile(r"--[A-Za-z0-9][\w-]*")

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
        ("--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend"),
    ),
    FailurePattern(
        # 0.5.17+ (layers/flashinfer_comm_fusion.py `_resolve_backend`), at runner warm-up on SM120.
        re.compile(r"FlashInfer allreduce fusion requires SM90 or SM10X"),
        FailureKind.UNSUPPORTED,
        "FlashInfer all-reduce fusion unsupported on this GPU",
        ("--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend"),
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
    # Rejected arguments: argparse's `{prog}: error: ...` (prog `sglang serve` or `launch_server.py`,
    # exit status 2) and SGLang's own checks of the flags, raised as ValueError before anything loads.
    FailurePattern(
        re.compile(
            r"[\w.-]: error: (?:argument (?P<flags>--[\w-]+(?:/--?[\w-]+)*): "
            r"|ambiguous option: (?P<flags2>--[\w-]+)(?:=\S*)? could match "
            r"|unrecognized arguments: (?P<flags3>[^\n]*)"
            r"|the following arguments are required: (?P<flags4>[^\n]*))"
        ),
        FailureKind.INVALID_ARGUMENTS,
        "SGLang's argument parser rejected a flag",
    ),
    FailurePattern(
        # "ValueError: --speculative-use-rejection-sampling requires --speculative-eagle-topk=1."
        # (0.5.17+, arg_groups/speculative_hook.py). The flag checked is the culprit, not the one it needs.
        re.compile(r"ValueError: (?P<flags>--[\w-]+)(?:=\S+)? requires --"),
        FailureKind.INVALID_ARGUMENTS,
        "SGLang rejected a flag that requires another setting",
    ),
    FailurePattern(
        # "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path."
        re.compile(r"ValueError: \w+ speculative decoding requires setting --"),
        FailureKind.INVALID_ARGUMENTS,
        "SGLang rejected a speculative algorithm without the setting it requires",
        ("--speculative-algorithm",),
    ),
    FailurePattern(
        # The EAGLE draft tree offers topk + (steps-1)*topk^2 candidates; asking torch.topk for
        # --speculative-num-draft-tokens - 1 of them fails in the draft graph's capture, every time
        # (speculative/eagle_utils.py, wrapped by eagle_draft_cuda_graph_runner.py). A combination of
        # three flags: no single value is to blame, so none is remembered as incompatible.
        re.compile(r"Capture cuda graph failed: [^\n]*selected index k out of range"),
        FailureKind.INVALID_ARGUMENTS,
        "speculative draft tree holds fewer than --speculative-num-draft-tokens - 1 candidates "
        "(topk + (steps-1)*topk^2)",
    ),
    FailurePattern(
        # A JIT kernel build (FlashInfer, sgl-kernel) that fails: the environment, not the settings.
        # Real H200, 0.5.17: "Exception: Capture cuda graph failed: Ninja build failed. ..."
        re.compile(r"\bNinja build failed\b|Error building extension '"),
        FailureKind.KERNEL_BUILD_FAILED,
        "a GPU kernel failed to compile (JIT build)",
    ),
    FailurePattern(
        # 0.5.15+ (mem_cache/kv_cache_configurator.py): the weights exceed the static pool.
        re.compile(r"Loaded weights leave no GPU memory for the KV cache"),
        FailureKind.KV_POOL_TOO_SMALL,
        "KV cache pool does not fit inside --mem-fraction-static",
    ),
    FailurePattern(
        # Before 0.5.15 the common case; since, the residual one (model_executor/pool_configurator.py).
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
        # torch's OOM message lists the other processes on the GPU ("Process 4306 has 129.77 GiB memory
        # in use"; real H200, 0.5.17, two servers on one GPU): one holding gigabytes makes the OOM the
        # node's problem, not the config's, in either phase and inside a capture's message too. Only when
        # torch also names "this process": in a container with its own pid namespace it knows no pid as
        # its own and lists the server itself as "Process N".
        re.compile(
            r"out of memory(?=[^\n]*this process has)[^\n]* Process \d+ has (?:\d{2,}|[2-9])(?:\.\d+)? GiB "
            r"memory in use"
        ),
        FailureKind.LAUNCH_ERROR,
        "another process holds GPU memory",
    ),
    FailurePattern(
        # An OOM raised inside SGLang's model loader (model_loader/loader.py load_model: the weights being
        # allocated), at any depth of its traceback; real H200, 0.5.17 (the frames below loader.py are the
        # model's layers and torch's). After the row above: another process's memory is the node's fault.
        re.compile(
            r'  File "[^"\n]*/model_loader/[^"\n]*", line \d+, in [^\n]*\n(?:[ \t][^\n]*\n)*'
            + r"(?:[^\n]*\b(?:torch\.)?OutOfMemoryError\b|[^\n]*CUDA out of memory)"
        ),
        FailureKind.WEIGHTS_DO_NOT_FIT,
        "the model's weights ran out of GPU memory while loading",
    ),
    FailurePattern(
        # 0.5.15+ (model_executor/runner/prefill_cuda_graph_runner.py), an OOM inside.
        re.compile(r"Capture prefill CUDA graph failed: " + _OOM_TEXT),
        FailureKind.PREFILL_GRAPH_OOM,
        "prefill CUDA graph capture ran out of GPU memory",
    ),
    FailurePattern(
        # 0.5.17+: the breakable and tc_piecewise backends log the error their capture (or replay) raised
        # with "Fail when using backend: breakable for prefill runner." and re-raise torch's own error
        # (runner_backend_utils/breakable_cuda_graph/context.py:36-49; real H200, 0.5.17, at 0.99).
        # (No leading [^\n]*: on a real log's 15 kB server_args line that backtracks for most of a second.)
        re.compile(
            r"(?:out of memory|OutOfMemoryError)(?=[^\n]*\nFail when using backend: \w+ for prefill runner\.)"
        ),
        FailureKind.PREFILL_GRAPH_OOM,  # OOM_UNDER_LOAD while benchmarking: a replay's
        "prefill CUDA graph capture ran out of GPU memory",
    ),
    FailurePattern(
        # Decode and EAGLE draft graph runners wrap the error: an OOM only when the wrapped error is one.
        re.compile(r"Capture cuda graph failed: " + _OOM_TEXT),
        FailureKind.CUDA_GRAPH_OOM,
        "CUDA graph capture ran out of GPU memory",
    ),
    FailurePattern(
        re.compile(r"torch\.OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate"),
        FailureKind.CUDA_GRAPH_OOM,  # classify() turns this into OOM_UNDER_LOAD while benchmarking
        "torch CUDA out of memory",
    ),
    FailurePattern(
        # The driver's own allocation failing (cuBLAS workspace, NCCL buffers, a graph pool): the GPU is
        # out of memory as surely as with torch's allocator, and the same fix (a smaller static pool)
        # applies, so it is an OOM too, not an unknown crash.
        re.compile(r"CUDA error: out of memory"),
        FailureKind.CUDA_GRAPH_OOM,  # OOM_UNDER_LOAD while benchmarking
        "CUDA driver out of memory",
    ),
    FailurePattern(
        re.compile(r"The memory capacity is unbalanced\. Some GPUs may be occupied by other processes"),
        FailureKind.LAUNCH_ERROR,
        "another process holds GPU memory",
    ),
    FailurePattern(
        # Python's OSError says "Address already in use", uvicorn and torch's TCPStore say it lower-case;
        # SGLang's own checks: "--port at 30000 is not available in 30 seconds." (utils/network.py) and
        # "Port is already in use. dist_init_port=..." (server_args.py).
        re.compile(
            r"[Aa]ddress already in use|EADDRINUSE|\bat \d+ is not available in \d+ seconds"
            r"|Port is already in use\."
        ),
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
    FailurePattern(
        # A capture that failed for another reason than memory: not the graph batch's fault.
        re.compile(r"Capture (?:cuda|prefill CUDA) graph failed"),
        FailureKind.UNKNOWN_CRASH,
        "CUDA graph capture failed (not out of memory)",
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
        # 0.5.17+ running phase (managers/tokenizer_manager.py): "SIGQUIT received. signum=..., frame=...".
        re.compile(r"SIGQUIT received\. signum="),
        FailureKind.UNKNOWN_CRASH,
        "a child process failed and the server is killing its tree",
    ),
    FailurePattern(
        # utils/watchdog.py SubprocessWatchdog: "Subprocess X (pid=N) crashed with exit code -9. ..."
        re.compile(r"Subprocess [^\n]* crashed with exit code"),
        FailureKind.UNKNOWN_CRASH,
        "a server subprocess crashed",
    ),
    FailurePattern(
        # utils/watchdog.py: "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)";
        # the soft watchdog only dumps its state and the server lives on.
        re.compile(r"\bwatchdog timeout \([^\n]*\bsoft=False\)"),
        FailureKind.UNKNOWN_CRASH,
        "a batch hung past --watchdog-timeout and the server kills itself",
    ),
    FailurePattern(
        # 0.5.17+ (entrypoints/engine.py): "Rank 0 scheduler died during initialization (exit code: -9).
        # If exit code is -9 (SIGKILL), a common cause is the OS OOM killer." Older: "is dead".
        re.compile(r"Rank \d+ scheduler (?:died during initialization|is dead)"),
        FailureKind.UNKNOWN_CRASH,
        "a scheduler process died",
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
    start-up OOM (CUDA_GRAPH_OOM), the same error while benchmarking is OOM_UNDER_LOAD. A failed graph
    capture is an OOM only when the error it wraps is one; a prefill graph's is PREFILL_GRAPH_OOM (and
    OOM_UNDER_LOAD while benchmarking, where the breakable backend replays with the same message).
    A rejected command line is INVALID_ARGUMENTS with the flags SGLang's message names as culprits.
    """
    if phase not in _PHASES:
        raise ValueError(f"`phase` must be one of {_PHASES}, but got {phase!r}.")
    log_text = before_shutdown(log_text)
    for pattern in PATTERNS:
        match = pattern.regex.search(log_text)
        if match is None:
            continue
        kind = pattern.kind
        if phase == "benchmarking" and kind in STARTUP_OOMS:
            kind = FailureKind.OOM_UNDER_LOAD  # a CUDA OOM; a prompt the KV pool cannot hold stays KV
        line = _line_at(log_text, match.end() - 1)
        return Failure.of(kind, line, pattern.description, pattern.culprits_in(match))
    return None


# What SGLang logs when it is told to stop (0.5.17 managers/tokenizer_manager.py:3747-3751): what follows
# is the shutdown autotune (or a person) asked for. Real 0.5.17 then logs "Subprocess scheduler_0 ...
# crashed with exit code -15" and "SIGQUIT received", which are no failure of the trial's settings.
_SHUTDOWN = re.compile(r"SIGTERM received\. signum=")


def before_shutdown(log_text: str) -> str:
    """The log up to the line where SGLang says it was told to stop (all of it when it never was)."""
    match = _SHUTDOWN.search(log_text)
    return log_text if match is None else log_text[: log_text.rfind("\n", 0, match.start()) + 1]


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
