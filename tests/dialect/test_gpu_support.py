"""Which flag values a GPU architecture cannot run: nvidia-smi's names read as compute capabilities, and the
table's rows against SGLang's own rules."""

from __future__ import annotations

import pytest

from autotune.dialect.gpu_support import cannot_run, compute_capability, ignored


@pytest.mark.parametrize(
    ("name", "capability"),
    [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", (12, 0)),  # the seed's node
        ("NVIDIA GeForce RTX 5090", (12, 0)),
        ("NVIDIA H200", (9, 0)),
        ("NVIDIA H100 80GB HBM3", (9, 0)),
        ("NVIDIA H20", (9, 0)),
        ("NVIDIA GH200 480GB", (9, 0)),
        ("NVIDIA B200", (10, 0)),
        ("NVIDIA GB200", (10, 0)),
        ("NVIDIA B300 SXM6 AC", (10, 3)),
        ("NVIDIA L40S", (8, 9)),
        ("NVIDIA RTX 6000 Ada Generation", (8, 9)),
        ("NVIDIA A100-SXM4-80GB", (8, 0)),
        ("NVIDIA A10G", (8, 6)),
        ("Tesla T4", (7, 5)),
    ],
)
def test_nvidia_smi_names_give_their_compute_capability(name: str, capability: tuple[int, int]) -> None:
    assert compute_capability(name) == capability


def test_a_gpu_the_table_does_not_know_refuses_nothing() -> None:
    assert compute_capability("AMD Instinct MI300X") is None
    assert compute_capability("NVIDIA Future GPU") is None


def test_flashinfer_allreduce_fusion_runs_on_sm90_and_sm10x_only() -> None:
    # 0.5.17 layers/flashinfer_comm_fusion.py `_resolve_backend`; the seed's SM120 node failed it.
    for flag, value in (
        ("--enable-flashinfer-allreduce-fusion", True),
        ("--flashinfer-allreduce-fusion-backend", "auto"),  # the deprecated switch's replacement
        ("--flashinfer-allreduce-fusion-backend", "trtllm"),
    ):
        found = cannot_run({flag: value}, (12, 0))
        assert found is not None and found[:2] == (flag, value)
        assert "requires SM90 or SM10X" in found[2].needs
        assert cannot_run({flag: value}, (9, 0)) is None and cannot_run({flag: value}, (10, 0)) is None
        assert cannot_run({flag: value}, (8, 9)) is not None
    # Unset or off: SGLang's own choice, which never turns it on where it cannot run.
    assert cannot_run({"--enable-flashinfer-allreduce-fusion": False}, (12, 0)) is None
    assert cannot_run({"--flashinfer-allreduce-fusion-backend": None}, (12, 0)) is None


def test_fa3_runs_on_sm8x_and_sm90_and_trtllm_attention_on_blackwell() -> None:
    assert cannot_run({"--attention-backend": "fa3"}, (12, 0)) is not None
    assert cannot_run({"--attention-backend": "fa3"}, (10, 0)) is not None
    assert cannot_run({"--decode-attention-backend": "fa3"}, (10, 0)) is not None
    assert cannot_run({"--attention-backend": "fa3"}, (9, 0)) is None
    assert (
        cannot_run({"--attention-backend": "fa3"}, (8, 0)) is None
    )  # without MLA it runs: left to the launch
    assert cannot_run({"--attention-backend": "trtllm_mla"}, (9, 0)) is not None
    assert cannot_run({"--attention-backend": "trtllm_mha"}, (8, 9)) is not None
    assert cannot_run({"--attention-backend": "trtllm_mla"}, (10, 0)) is None
    assert cannot_run({"--attention-backend": "trtllm_mla"}, (12, 0)) is None  # the newest SGLang runs it
    assert cannot_run({"--attention-backend": "triton"}, (12, 0)) is None


def test_what_real_sglang_runs_on_sm120_is_not_refused() -> None:
    # torch symmetric memory is a warning there, not a failure (reference/sglang-versions.md B7); expert
    # parallelism without the FlashInfer all-to-all backend is not known to fail (B10).
    assert cannot_run({"--enable-torch-symm-mem": True, "--ep-size": 8}, (12, 0)) is None


def test_torch_symmetric_memory_is_ignored_outside_sm90_and_sm10x() -> None:
    # all_reduce_utils.py sizes only SM 9 and 10; elsewhere TorchSymmMemCommunicator warns and is skipped.
    for capability in ((12, 0), (8, 9), (8, 0)):
        found = ignored({"--enable-torch-symm-mem": True}, capability)
        assert found is not None and found[:2] == ("--enable-torch-symm-mem", True)
    for capability in ((9, 0), (10, 0), (10, 3)):
        assert ignored({"--enable-torch-symm-mem": True}, capability) is None
    assert ignored({"--enable-torch-symm-mem": False}, (12, 0)) is None
