"""docs/troubleshooting.md's failure kinds, written from the failure catalogue (`autotune.trial.failures`).

One entry per `FailureKind`: what the user sees (SGLang's own log line, for the kinds the pattern table
reads from a server log, or the sentence autotune records), what autotune does about it (from the kind's
properties) and what to do (the kind's advice, the text MLflow and `autotune diagnose` show). A kind
without an entry here is an error, and tests/views/test_troubleshooting.py checks that
docs/troubleshooting.md holds exactly what `section()` writes: `python scripts/troubleshooting.py`
rewrites it.
"""

from __future__ import annotations

import functools
import textwrap
from typing import NamedTuple

from autotune.trial.failures import FailureKind, Phase

BEGIN = (
    "<!-- troubleshooting: written by `python scripts/troubleshooting.py` from autotune/trial/failures.py -->"
)
END = "<!-- end of troubleshooting -->"
WIDTH = 110  # the docs' line length


class Seen(NamedTuple):
    """What a failure of one kind looks like to the user."""

    title: str
    # SGLang's (torch's, NCCL's, argparse's) line in the server log, which the pattern table classifies
    # as this kind in `phase`; None for the kinds autotune records itself.
    log_line: str | None
    # Where there is no log line: the sentence autotune records (status, MLflow, the console).
    sentence: str | None = None
    phase: Phase = "starting"
    # The traceback frame above `log_line` that tells its kind apart, where the line alone does not.
    frame: str | None = None

    @property
    def log_text(self) -> str | None:
        """What the pattern table reads: the frame (where there is one) and the log line."""
        if self.log_line is None:
            return None
        return self.log_line if self.frame is None else f"{self.frame}\n{self.log_line}"


# Real lines, each from tests/trial/test_failures.py (with the SGLang version and file that print it).
SEEN: dict[FailureKind, Seen] = {
    FailureKind.WEIGHTS_DO_NOT_FIT: Seen(
        "the weights do not fit on the GPUs",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total capacity "
        "of 140.40 GiB of which 0.51 GiB is free.",
        frame='  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_loader/loader.py", line 601, '
        "in load_model",
    ),
    FailureKind.KV_POOL_TOO_SMALL: Seen(
        "the KV cache does not fit",
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.01. "
        "Raise --mem-fraction-static above 0.016 (minimum viable = 1 - available/pre = 0.0154).",
    ),
    FailureKind.CUDA_GRAPH_OOM: Seen(
        "out of memory capturing CUDA graphs (or starting)",
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 139.81 GiB of which 1.12 GiB is free.",
    ),
    FailureKind.PREFILL_GRAPH_OOM: Seen(
        "out of memory capturing prefill CUDA graphs",
        "RuntimeError: Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 1.50 GiB.",
    ),
    FailureKind.OOM_UNDER_LOAD: Seen(
        "out of memory while serving",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.28 GiB.",
        phase="benchmarking",
    ),
    FailureKind.UNSUPPORTED: Seen(
        "a feature this GPU does not have",
        "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
    ),
    FailureKind.INVALID_ARGUMENTS: Seen(
        "SGLang rejected a flag",
        "sglang serve: error: argument --attention-backend: invalid choice: 'flash' (choose from 'triton', "
        "'torch_native', 'flex_attention', 'flashinfer', 'fa3')",
    ),
    FailureKind.KERNEL_BUILD_FAILED: Seen(
        "a GPU kernel did not compile",
        "Exception: Capture cuda graph failed: Ninja build failed. Ninja output:",
    ),
    FailureKind.NCCL_ERROR: Seen(
        "NCCL failed",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details)",
    ),
    FailureKind.STARTUP_TIMEOUT: Seen(
        "the server never became ready",
        None,
        "not ready after 900 s (last phase seen: load_weight_begin)",
    ),
    FailureKind.SERVER_DIED: Seen(
        "the server died during the benchmark",
        None,
        "server died during the benchmark",
    ),
    FailureKind.BENCHMARK_ERROR: Seen(
        "the benchmark failed",
        None,
        "the job did not finish within 60 s (a hang: look at its last lines)",
    ),
    FailureKind.LAUNCH_ERROR: Seen(
        "the node was not ready for a launch",
        "RuntimeError: Port is already in use. dist_init_port=None port_base=30000 detokenizer_port=30001 "
        "nccl_port=30002 scheduler_input_port=30003",
    ),
    FailureKind.UNKNOWN_CRASH: Seen(
        "the server crashed for a reason autotune does not know",
        "RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit code is -9 "
        "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
    ),
    FailureKind.INTERRUPTED: Seen("the trial was interrupted", None, "stopped by the driver"),
    FailureKind.NODE_UNREACHABLE: Seen(
        "the node stopped answering",
        None,
        "cannot connect to ssh://root@gpu-node-1:22 ([Errno 111] Connection refused)",
    ),
    FailureKind.NODE_LOST: Seen("the node's Ray actor died", None, "the node's actor died: ..."),
    FailureKind.FORBIDDEN: Seen(
        "a launch the study forbids",
        None,
        "refusing to launch with NCCL_NVLS_ENABLE=1: the study's never_launch forbids it",
    ),
    FailureKind.PREDICTED_OOM: Seen(
        "out of memory foreseen, not launched",
        None,
        "predicted OOM: the weights take 68.4 GB per GPU (547 GB over TP 8), more than the static pool of "
        "--mem-fraction-static 0.7 x 89.0 GB = 62.3 GB; ...",
    ),
    FailureKind.KNOWN_INCOMPATIBLE: Seen(
        "known to fail on this node, not launched",
        None,
        "known incompatible with this node: --enable-flashinfer-allreduce-fusion=True",
    ),
}

NEVER_LAUNCHED = frozenset({FailureKind.FORBIDDEN, FailureKind.PREDICTED_OOM, FailureKind.KNOWN_INCOMPATIBLE})


def what_autotune_does(kind: FailureKind) -> str:
    """What the study makes of a trial that failed this way, from the kind's properties."""
    if kind is FailureKind.PREDICTED_OOM:
        return "PRUNED with the OOM penalty, without a launch: no node time, not counted in the budget."
    if kind is FailureKind.KNOWN_INCOMPATIBLE:
        return "FAIL without a launch: no node time, not counted in the budget."
    if kind in NEVER_LAUNCHED:
        return "FAIL without a launch."
    if kind.is_oom:
        done = "PRUNED with the OOM penalty (`failures.oom_penalty`): the sampler learns to avoid it."
        if kind.flag_to_lower:
            done += f" The config runs once more with the search space's smallest `{kind.flag_to_lower}`."
        return done
    if kind.deterministic:
        return (
            "FAIL; the values of the flags SGLang's message names are remembered with the node's hardware "
            "and not launched again (`known_incompatible`); `autotune status` quotes the message."
        )
    if kind is FailureKind.INTERRUPTED:
        return "FAIL; the same settings run again when the study goes on (`autotune resume`)."
    if kind.retried_once:
        return "FAIL; the same settings run once more."
    return "FAIL; the study goes on."


def entry(kind: FailureKind) -> str:
    """One kind's entry: a heading with its title, then what the user sees, what autotune does, what to do."""
    seen = SEEN[kind]
    if seen.log_line is not None and seen.frame is not None:
        frame, line = _code(seen.frame.strip()), _code(seen.log_line)
        shown = f"You see, in the server log, a traceback through {frame} ending in {line}"
    elif seen.log_line is not None:
        shown = f"You see, in the server log: {_code(seen.log_line)}"
    else:
        shown = f"autotune says: {_code(seen.sentence or '')}"
    items = [shown, f"autotune: {what_autotune_does(kind)}", f"What to do: {kind.advice}"]
    wrap = functools.partial(
        textwrap.fill, width=WIDTH, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
    )
    return "\n".join([f"#### `{kind.value}`: {seen.title}", "", *(wrap(f"- {item}") for item in items)])


def _code(text: str) -> str:
    """`text` as inline code, fenced with two backticks where it holds one."""
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def section() -> str:
    """docs/troubleshooting.md's entries, one paragraph per kind in the catalogue's order, between the
    markers."""
    missing = [kind.value for kind in FailureKind if kind not in SEEN]
    if missing:
        raise KeyError(f"no troubleshooting entry for the failure kinds {missing}: add them to SEEN")
    return "\n\n".join([BEGIN, *(entry(kind) for kind in FailureKind), END])
