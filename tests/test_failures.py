"""Every failure pattern against the real message it matches, every benign line against all patterns."""

from __future__ import annotations

import pytest

from autotune.failures import PATTERNS, Failure, FailureKind, classify, is_fatal_line

P = "[2026-02-27 11:50:37 TP3] "

# (real message, kind at start, kind while benchmarking); the messages are SGLang's, torch's, NCCL's and
# FlashInfer's wording from /work/shared/reference/sglang.md.
REAL_MESSAGES: list[tuple[str, FailureKind]] = [
    (
        # SGLang's scheduler (validate_input_length), as the abort message of a request.
        "Input length (28000 tokens) exceeds the maximum allowed length (20511 tokens). Use a shorter input "
        "or enable --allow-auto-truncate.",
        FailureKind.KV_POOL_TOO_SMALL,
    ),
    (
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: self.server_args.mem_fraction_static=0.55",
        FailureKind.KV_POOL_TOO_SMALL,
    ),
    (
        "Exception: Capture cuda graph failed: CUDA error: an illegal memory access was encountered",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 139.81 GiB of which 1.12 GiB is free.",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has a total "
        "capacity of 139.81 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has "
        "138.68 GiB memory in use.",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 139.81 GiB total capacity)",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        "RuntimeError: No supported CUDA architectures found for major versions [9, 10].",
        FailureKind.UNSUPPORTED,
    ),
    # The simulated node's wording for torch symmetric memory on an unsupported architecture.
    (
        "RuntimeError: SymmetricMemory is not supported on device with compute capability 12.0",
        FailureKind.UNSUPPORTED,
    ),
    (
        "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
        "Please use `--attention-backend flashinfer`.",
        FailureKind.UNSUPPORTED,
    ),
    (
        "ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        "min_per_gpu_memory=70.12, local_gpu_memory=139.81, local_gpu_memory * 0.9=125.83",
        FailureKind.LAUNCH_ERROR,
    ),
    ("OSError: [Errno 98] Address already in use", FailureKind.LAUNCH_ERROR),
    (
        "ERROR:    [Errno 98] error while attempting to bind on address ('0.0.0.0', 30000): "
        "address already in use",
        FailureKind.LAUNCH_ERROR,
    ),
    (
        "torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
        "address. port: 29500, useIPv6: 0, code: -98, name: EADDRINUSE, message: address already in use",
        FailureKind.LAUNCH_ERROR,
    ),
    (
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/"
        "ProcessGroupNCCL.cpp:3356, unhandled system error (run with NCCL_DEBUG=INFO for details), "
        "NCCL version 2.21.5",
        FailureKind.NCCL_ERROR,
    ),
    ("ncclInternalError: Internal check failed.", FailureKind.NCCL_ERROR),
    ("ncclUnhandledCudaError: Call to CUDA function failed.", FailureKind.NCCL_ERROR),
    (
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device error.",
        FailureKind.NCCL_ERROR,
    ),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", FailureKind.UNKNOWN_CRASH),
    (
        "torch.AcceleratorError: CUDA error: an illegal instruction was encountered",
        FailureKind.UNKNOWN_CRASH,
    ),
    ("Scheduler hit an exception: Traceback (most recent call last):", FailureKind.UNKNOWN_CRASH),
    (
        "Received sigquit from a child process. It usually means the child failed.",
        FailureKind.UNKNOWN_CRASH,
    ),
    ("Rank 0 scheduler is dead. Please check if there are relevant logs.", FailureKind.UNKNOWN_CRASH),
    ("Initialization failed. Please see the error messages above.", FailureKind.UNKNOWN_CRASH),
    ("Initialization failed. warmup error: Traceback (most recent call last):", FailureKind.UNKNOWN_CRASH),
]

FLASHINFER_A2A_TRACEBACK = (
    P + "Scheduler hit an exception: Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 2788, '
    "in run_scheduler_process\n"
    "    scheduler = Scheduler(server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, dp_rank)\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/layers/moe/token_dispatcher/flashinfer.py", '
    "line 312, in dispatch\n"
    "    assert global_scale is not None\n"
    "           ^^^^^^^^^^^^^^^^^^^^^^^^\n"
    "AssertionError\n"
    "\n"
    "[2026-02-27 11:50:38] Received sigquit from a child process. It usually means the child failed.\n"
)

BENIGN_LINES = [
    "[2026-02-27 11:40:01 TP0] WARNING: error_handler is not set; falling back to the default error handler",
    "[2026-02-27 11:40:01 TP0] Custom allreduce is disabled because it's not supported on more than two "
    "PCIe-only GPUs. To silence this warning, specify --disable-custom-all-reduce explicitly.",
    "[2026-02-27 11:39:58] server_args=ServerArgs(model_path='/models/DeepSeek-V3', tp_size=8, "
    "mem_fraction_static=0.55, cuda_graph_max_bs=512, disable_custom_all_reduce=False, "
    "enable_torch_symm_mem=False, enable_nccl_nvls=False, enable_symm_mem=False, "
    "moe_a2a_backend='none', speculative_algorithm='EAGLE3', watchdog_timeout=300, "
    "skip_server_warmup=False, warmups=None, nccl_port=None, enable_memory_saver=False)",
    "[2026-02-27 11:55:02 TP0] Decode batch [412], #running-req: 48, #token: 61440, token usage: 0.31, "
    "accept len: 2.41, accept rate: 0.60, cuda graph: True, gen throughput (token/s): 89.52, #queue-req: 0,",
    "[2026-02-27 11:55:02 TP0] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, "
    "token usage: 0.00, #running-req: 0, #queue-req: 0,",
    "[2026-02-27 11:50:37 TP3] Load weight begin. avail mem=139.20 GB",
    "[2026-02-27 11:52:10 TP3] Load weight end. type=DeepseekV3ForCausalLM, dtype=torch.bfloat16, "
    "avail mem=70.75 GB, mem usage=68.45 GB.",
    "[2026-02-27 11:52:11 TP3] KV Cache is allocated. #tokens: 403264, K size: 12.31 GB, V size: 12.31 GB",
    "[2026-02-27 11:52:12 TP3] Capture cuda graph begin. This can take up to several minutes. "
    "avail mem=44.10 GB",
    "[2026-02-27 11:53:40 TP3] Capture cuda graph end. Time elapsed: 88.12 s. mem usage=2.31 GB. "
    "avail mem=41.79 GB.",
    "[2026-02-27 11:53:41 TP0] max_total_num_tokens=403264, chunked_prefill_size=8192, "
    "max_prefill_tokens=16384, max_running_requests=48, context_len=163840, available_gpu_mem=41.79 GB",
    "[2026-02-27 11:53:45] The server is fired up and ready to roll!",
    '[2026-02-27 11:53:45] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK',
    '[2026-02-27 11:53:44] INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 503 Service Unavailable',
    "[2026-02-27 11:50:30 TP0] Init torch distributed ends. mem usage=0.75 GB",
    "[2026-02-27 11:50:30 TP0] NCCL version 2.21.5+cuda12.4",
    "node0:1234:1234 [0] NCCL INFO NCCL_ALGO set by environment to Ring,Tree",
    "[2026-02-27 11:50:30 TP0] Set NCCL_CUMEM_ENABLE=0, NCCL_NVLS_ENABLE=0",
    "[2026-02-27 11:55:02 TP0] The request was aborted because of an error in the client; error count: 0",
    "AssertionError",  # alone: not known to be the FlashInfer all-to-all backend's
]


@pytest.mark.parametrize(("message", "kind"), REAL_MESSAGES)
def test_each_real_message_classifies_and_is_fatal(message: str, kind: FailureKind) -> None:
    line = P + message
    assert is_fatal_line(line)
    failure = classify(line, "starting")
    assert failure is not None
    assert failure.kind is kind
    assert failure.line == line
    assert failure.advice == kind.advice


@pytest.mark.parametrize("line", BENIGN_LINES)
def test_benign_line_matches_no_pattern(line: str) -> None:
    assert not is_fatal_line(line)
    for pattern in PATTERNS:
        assert pattern.regex.search(line) is None, pattern.description
    assert classify(line, "starting") is None
    assert classify(line, "benchmarking") is None


def test_every_pattern_is_covered_by_a_real_message() -> None:
    texts = [m for m, _ in REAL_MESSAGES] + [FLASHINFER_A2A_TRACEBACK]
    for pattern in PATTERNS:
        assert any(pattern.regex.search(t) for t in texts), pattern.description


def test_cuda_oom_depends_on_phase() -> None:
    log = P + "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3 has ..."
    starting = classify(log, "starting")
    benchmarking = classify(log, "benchmarking")
    assert starting is not None and starting.kind is FailureKind.CUDA_GRAPH_OOM
    assert benchmarking is not None and benchmarking.kind is FailureKind.OOM_UNDER_LOAD
    assert benchmarking.advice == FailureKind.OOM_UNDER_LOAD.advice


def test_a_prompt_the_kv_pool_cannot_hold_is_kv_pool_too_small_in_either_phase() -> None:
    # Its fix is the opposite of an OOM under load's: raise --mem-fraction-static, not lower it.
    log = (
        "ValueError: Input length (28001 tokens) exceeds the maximum allowed length (20227 tokens). "
        "Use a shorter input or enable --allow-auto-truncate."
    )
    for phase in ("starting", "benchmarking"):
        failure = classify(log, phase)
        assert failure is not None and failure.kind is FailureKind.KV_POOL_TOO_SMALL
        assert "raise" in failure.advice.lower() and "--mem-fraction-static" in failure.advice


def test_flashinfer_a2a_assertion_is_unsupported() -> None:
    failure = classify(FLASHINFER_A2A_TRACEBACK, "starting")
    assert failure is not None
    assert failure.kind is FailureKind.UNSUPPORTED
    assert failure.line == "AssertionError"
    assert failure.kind.deterministic


def test_assertion_elsewhere_is_only_a_crash() -> None:
    log = FLASHINFER_A2A_TRACEBACK.replace("token_dispatcher/flashinfer.py", "managers/scheduler.py")
    failure = classify(log, "starting")
    assert failure is not None and failure.kind is FailureKind.UNKNOWN_CRASH
    # The dispatcher frame is not the last one: the assertion was raised elsewhere.
    deeper = FLASHINFER_A2A_TRACEBACK.replace(
        "    assert global_scale is not None\n",
        "    x = helper()\n"
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/utils.py", line 10, in helper\n'
        "    assert ok\n",
    )
    failure = classify(deeper, "starting")
    assert failure is not None and failure.kind is FailureKind.UNKNOWN_CRASH


def test_specific_cause_beats_later_markers_and_other_ranks_nccl_errors() -> None:
    log = "\n".join(
        [
            "[2026-02-27 11:52:11 TP0] Load weight end. type=DeepseekV3ForCausalLM, avail mem=70.75 GB",
            "[2026-02-27 11:52:12 TP5] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/sglang/srt/model_executor/model_runner.py", line 1700, in init_memory_pool',
            "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
            "Current value: self.server_args.mem_fraction_static=0.55",
            "[2026-02-27 11:52:12 TP2] torch.distributed.DistBackendError: NCCL error in: "
            "ProcessGroupNCCL.cpp:3356, remote process exited or there was a network error",
            "[2026-02-27 11:52:13] Received sigquit from a child process. It usually means the child failed.",
        ]
    )
    failure = classify(log, "starting")
    assert failure is not None
    assert failure.kind is FailureKind.KV_POOL_TOO_SMALL
    assert failure.line.startswith("RuntimeError: Not enough memory.")


def test_marker_alone_is_unknown_crash() -> None:
    log = P + "Scheduler hit an exception: Traceback (most recent call last):\nKeyError: 'x'\n"
    failure = classify(log, "starting")
    assert failure == Failure.of(
        FailureKind.UNKNOWN_CRASH,
        P + "Scheduler hit an exception: Traceback (most recent call last):",
        "a scheduler process raised an exception",
    )


def test_clean_log_is_none_and_bad_phase_rejected() -> None:
    assert classify("\n".join(BENIGN_LINES), "starting") is None
    assert classify("", "benchmarking") is None
    with pytest.raises(ValueError, match="phase"):
        classify("", "loading")  # type: ignore[arg-type]


def test_kind_properties() -> None:
    assert {k for k in FailureKind if k.is_oom} == {
        FailureKind.KV_POOL_TOO_SMALL,
        FailureKind.CUDA_GRAPH_OOM,
        FailureKind.OOM_UNDER_LOAD,
    }
    assert {k for k in FailureKind if k.deterministic} == {FailureKind.UNSUPPORTED}
    assert all(k.advice for k in FailureKind)
    assert "raise --mem-fraction-static" in FailureKind.KV_POOL_TOO_SMALL.advice
    assert "lower --mem-fraction-static" in FailureKind.CUDA_GRAPH_OOM.advice
    assert FailureKind("kv_pool_too_small") is FailureKind.KV_POOL_TOO_SMALL
