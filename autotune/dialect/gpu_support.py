"""Which SGLang flag values a GPU architecture cannot run: the one table, each row with the SGLang source that
fails it, so that a proposal the node's GPU cannot run is refused before a ten-minute launch.

Only failures SGLang itself raises, every time, on that architecture are listed (`REQUIREMENTS`). Left out
on purpose: `--ep-size` on SM120 (the seed's assertion was under `--moe-a2a-backend flashinfer`, unverified:
B10). A flag value SGLang ignores on an architecture, warning and running without it, is in `IGNORED`
instead: a trial of it measures the config without it again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass

Capability = tuple[int, int]  # (major, minor), as torch.cuda.get_device_capability() gives it

# nvidia-smi's GPU names to their compute capability (NVIDIA's "CUDA GPUs" table), the first match wins:
# more specific names first ("H20" is not "H200", "RTX PRO 6000 Blackwell" is not an Ada "RTX 6000").
_NAMES: tuple[tuple[re.Pattern[str], Capability], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), capability)
    for pattern, capability in (
        (r"\bG?B300\b", (10, 3)),  # B300, GB300
        (r"\bG?B200\b|\bB100\b", (10, 0)),  # B200, GB200, B100
        (r"Blackwell|\bRTX 50[0-9]0\b", (12, 0)),  # RTX PRO 6000 Blackwell (Server Edition), GeForce RTX 50x0
        (r"\bGH200\b|\bH100\b|\bH200\b|\bH800\b|\bH20\b", (9, 0)),
        (r"\bL40S?\b|\bL4\b|\bL20\b|\bRTX [0-9]000 Ada\b|\bRTX 40[0-9]0\b", (8, 9)),
        (r"\bA100\b|\bA800\b|\bA30\b", (8, 0)),
        (r"\bA10G?\b|\bA40\b|\bA16\b|\bA2\b|\bRTX A[0-9]000\b|\bRTX 30[0-9]0\b", (8, 6)),
        (r"\bV100\b", (7, 0)),
        (r"\bT4\b", (7, 5)),
    )
)


def compute_capability(gpu_name: str) -> Capability | None:
    """The compute capability of a GPU nvidia-smi names `gpu_name` (e.g. 'NVIDIA H200' -> (9, 0)), or None
    for a name this table does not know (then nothing is refused for its architecture)."""
    return next((capability for regex, capability in _NAMES if regex.search(gpu_name)), None)


@dataclass(frozen=True)
class GpuRequirement:
    """One flag value SGLang runs only on some architectures: `runs_on(capability)`, and SGLang's words."""

    flags: tuple[str, ...]  # every spelling of the flag (a deprecated switch and its replacement)
    values: tuple[object, ...] | None  # the values that need it (None: any value set)
    needs: str  # what it needs, in the words of SGLang's message
    runs_on: Callable[[Capability], bool]
    source: str  # the SGLang source (or reference) that fails it

    def blocks(self, value: object) -> bool:
        if value is None or value is False:
            return False  # unset: SGLang's own choice, which never asks for what the GPU lacks
        return self.values is None or value in self.values


def _major(*majors: int) -> Callable[[Capability], bool]:
    return lambda capability: capability[0] in majors


REQUIREMENTS: tuple[GpuRequirement, ...] = (
    GpuRequirement(
        ("--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend"),
        None,
        "FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs",
        _major(9, 10),
        # 0.5.17 layers/flashinfer_comm_fusion.py:46-50 `_resolve_backend` (reference/sglang-versions.md A5);
        # the flag's help in both dialect tables; the seed's SM120 node failed it.
        "layers/flashinfer_comm_fusion.py:46-50",
    ),
    GpuRequirement(
        ("--attention-backend", "--decode-attention-backend", "--prefill-attention-backend"),
        ("fa3",),
        "FlashAttention v3 Backend requires SM>=80 and SM<=90",
        # major 8 only without MLA, which the proposal does not say: SM8x is left to the launch.
        _major(8, 9),
        "layers/attention/attention_registry.py `create_flashattention_v3_backend`",
    ),
    GpuRequirement(
        ("--attention-backend", "--decode-attention-backend"),
        ("trtllm_mla", "trtllm_mha"),
        "the TensorRT-LLM attention backends are only supported on Blackwell GPUs",
        # SM100 in every version, SM12x only in the newest (`is_blackwell_supported`): older GPUs refused.
        lambda capability: capability[0] >= 10,
        "server_args.py 'TRTLLM MLA backend is only supported on Blackwell GPUs'; reference/sglang.md",
    ),
)


# Flag values SGLang runs without on the architectures `runs_on` refuses, with the warning it logs.
IGNORED: tuple[GpuRequirement, ...] = (
    GpuRequirement(
        ("--enable-torch-symm-mem",),
        None,
        "TorchSymmMemCommunicator: Device capability not supported, communicator is not available",
        # all_reduce_utils.py:3-16 sizes only SM 9 and 10 (reference/sglang-versions.md B7).
        _major(9, 10),
        "distributed/device_communicators/torch_symm_mem.py:80-89",
    ),
)


def ignored(
    params: Mapping[str, object], capability: Capability
) -> tuple[str, object, GpuRequirement] | None:
    """The first (flag, value) among `params` that SGLang ignores on a GPU of `capability`, with its row, or
    None."""
    return _first(IGNORED, params, capability)


def cannot_run(
    params: Mapping[str, object], capability: Capability
) -> tuple[str, object, GpuRequirement] | None:
    """The first (flag, value) among `params` (flag -> value) a GPU of `capability` cannot run, with the
    row that says so, or None."""
    return _first(REQUIREMENTS, params, capability)


def _first(
    rows: tuple[GpuRequirement, ...], params: Mapping[str, object], capability: Capability
) -> tuple[str, object, GpuRequirement] | None:
    for requirement in rows:
        for flag in requirement.flags:
            value = params.get(flag)
            if requirement.blocks(value) and not requirement.runs_on(capability):
                return flag, value, requirement
    return None
