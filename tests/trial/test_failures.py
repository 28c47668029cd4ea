"""Every failure pattern against the real message it matches, every benign line against all patterns."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.trial.failures import PATTERNS, Failure, FailureKind, classify, is_fatal_line

P = "[2026-02-27 11:50:37 TP3] "

# (real message, kind at start): SGLang's, torch's, NCCL's, FlashInfer's and argparse's wording, each with
# the SGLang version and source file that prints it (paths inside the `sglang` package; see
# shared/reference/sglang-versions.md, whose "Exact real log strings" table and A2, A5, C3 quote them, and
# the device kit's "Real failure lines", seen on a real H200 with 0.5.17).
REAL_MESSAGES: list[tuple[str, FailureKind]] = [
    (
        # All versions: managers/utils.py validate_input_length, as the abort message of a request.
        "Input length (28000 tokens) exceeds the maximum allowed length (20511 tokens). Use a shorter input "
        "or enable --allow-auto-truncate.",
        FailureKind.KV_POOL_TOO_SMALL,
    ),
    (
        # 0.5.15+: srt/mem_cache/kv_cache_configurator.py (0.5.17 :1646-1655, 0.5.23 :3050-3057);
        # real H200, 0.5.17, --mem-fraction-static 0.01.
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.01. "
        "Raise --mem-fraction-static above 0.016 (minimum viable = 1 - available/pre = 0.0154). If using "
        "speculative decoding, draft weights are now counted.",
        FailureKind.KV_POOL_TOO_SMALL,
    ),
    (
        # <= 0.5.13: model_runner.py; 0.5.15+ the residual case, model_executor/pool_configurator.py:62-67.
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        "Current value: mem_fraction_static=0.55",
        FailureKind.KV_POOL_TOO_SMALL,
    ),
    (
        # 0.5.17: model_executor/runner/decode_cuda_graph_runner.py:414-419 wrapping torch's OOM.
        "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 2.00 GiB. "
        "GPU 3 has a total capacity of 139.81 GiB of which 1.12 GiB is free.",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        # 0.5.17: the same wrapper around the CUDA driver's own allocation failure.
        "Exception: Capture cuda graph failed: CUDA error: out of memory",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        # 0.5.17: model_executor/runner/prefill_cuda_graph_runner.py:378-381 (0.5.23 :521).
        "RuntimeError: Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 1.50 GiB. "
        "GPU 0 has a total capacity of 139.80 GiB of which 1.02 GiB is free.",
        FailureKind.PREFILL_GRAPH_OOM,
    ),
    (
        # torch's caching allocator (any version); real H200, 0.5.17, --mem-fraction-static 0.999 while
        # allocating the KV pool.
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.28 GiB. GPU 0 has a total "
        "capacity of 139.80 GiB of which 4.27 GiB is free. Including non-PyTorch memory, this process has "
        "135.52 GiB memory in use.",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        "RuntimeError: CUDA out of memory. Tried to allocate 512.00 MiB (GPU 0; 139.81 GiB total capacity)",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        # torch's wording for cudaErrorMemoryAllocation from a driver call (C3): an OOM, not a crash.
        "RuntimeError: CUDA error: out of memory",
        FailureKind.CUDA_GRAPH_OOM,
    ),
    (
        # flashinfer compilation_context.py (JIT), wrapped in a capture failure on older servers.
        "RuntimeError: No supported CUDA architectures found for major versions [9, 10].",
        FailureKind.UNSUPPORTED,
    ),
    (
        # 0.5.17: srt/layers/flashinfer_comm_fusion.py:46-50 (_resolve_backend), on SM120.
        "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
        FailureKind.UNSUPPORTED,
    ),
    # The simulated node's wording for torch symmetric memory on an unsupported architecture.
    (
        "RuntimeError: SymmetricMemory is not supported on device with compute capability 12.0",
        FailureKind.UNSUPPORTED,
    ),
    (
        # All versions: srt/layers/attention/flashattention_backend.py.
        "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
        "Please use `--attention-backend flashinfer`.",
        FailureKind.UNSUPPORTED,
    ),
    (
        # 0.5.17 real H200 (argparse, prog `sglang serve`, exit 2).
        "sglang serve: error: argument --attention-backend: invalid choice: 'flash' (choose from 'triton', "
        "'torch_native', 'flex_attention', 'flashinfer', 'fa3')",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # 0.5.23 (server_args.py has --cuda-graph-max-bs-decode/-prefill, no --cuda-graph-max-bs).
        "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match --cuda-graph-max-bs-decode, "
        "--cuda-graph-max-bs-prefill",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # Any version, `python -m sglang.launch_server` (prog launch_server.py); 0.5.23 for --stream-output.
        "launch_server.py: error: unrecognized arguments: --stream-output --cuda-graph-bs 8",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # 0.5.17 real H200: srt/arg_groups/speculative_hook.py, EAGLE with --speculative-eagle-topk 4.
        "ValueError: --speculative-use-rejection-sampling requires --speculative-eagle-topk=1.",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # 0.5.17 real H200: srt/arg_groups/speculative_hook.py.
        "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # 0.5.17 (source reading, A4): torch.topk in speculative/eagle_utils.py inside the draft graph's
        # capture, wrapped by speculative/eagle_draft_cuda_graph_runner.py:273-276.
        "Exception: Capture cuda graph failed: selected index k out of range",
        FailureKind.INVALID_ARGUMENTS,
    ),
    (
        # 0.5.17 real H200: a broken FlashInfer JIT (missing norm.cu; CUB/Thrust mismatch) in capture.
        "Exception: Capture cuda graph failed: Ninja build failed. Ninja output:",
        FailureKind.KERNEL_BUILD_FAILED,
    ),
    (
        # A capture that fails for another reason is not an OOM (decode_cuda_graph_runner.py wrapper).
        "Exception: Capture cuda graph failed: Expected all tensors to be on the same device",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        "RuntimeError: Capture prefill CUDA graph failed: Dynamo failed to run FX node",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        # All versions: distributed/bootstrap.py (C4).
        "ValueError: The memory capacity is unbalanced. Some GPUs may be occupied by other processes. "
        "min_per_gpu_memory=70.12, local_gpu_memory=139.81, local_gpu_memory * 0.9=125.83",
        FailureKind.LAUNCH_ERROR,
    ),
    (
        # Real H200, 0.5.17 (data/sglang-0.5.17-h200/oom-gpu-held-by-another-process.log): torch's OOM
        # names the other server that held the GPU.
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB. GPU 0 has a total "
        "capacity of 139.80 GiB of which 71.94 MiB is free. Process 4306 has 129.77 GiB memory in use. "
        "Including non-PyTorch memory, this process has 9.95 GiB memory in use.",
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
        # 0.5.17: srt/utils/network.py:93-96 wait_port_available.
        "ValueError: --port at 30000 is not available in 30 seconds. --port is used by a process already.",
        FailureKind.LAUNCH_ERROR,
    ),
    (
        # 0.5.17: srt/server_args.py:9538-9541.
        "RuntimeError: Port is already in use. dist_init_port=None port_base=30000 detokenizer_port=30001 "
        "nccl_port=30002 scheduler_input_port=30003",
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
    # Propagation markers (C3).
    # 0.5.17: managers/scheduler.py:4949-4952.
    ("Scheduler hit an exception: Traceback (most recent call last):", FailureKind.UNKNOWN_CRASH),
    (
        # 0.5.17: entrypoints/engine.py:1649-1653 (launch phase).
        "Received sigquit from a child process. It usually means the child failed.",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        # 0.5.17: managers/tokenizer_manager.py:3753-3756 (running phase).
        "SIGQUIT received. signum=3, frame=<frame at 0x7f1c2c0b5a40, file "
        "'/usr/lib/python3.12/selectors.py', "
        "line 468, code select>. It usually means one child failed.",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        # 0.5.17: srt/utils/watchdog.py:153-156 (the hard watchdog).
        "Scheduler watchdog timeout (self.watchdog_timeout=300, self.soft=False)",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        # 0.5.17: srt/utils/watchdog.py SubprocessWatchdog._check_processes.
        "Subprocess scheduler_0 (pid=41235) crashed with exit code -9. Triggering SIGQUIT for cleanup...",
        FailureKind.UNKNOWN_CRASH,
    ),
    (
        # 0.5.17: entrypoints/engine.py:1677-1684 (0.5.23 :2006).
        "RuntimeError: Rank 3 scheduler died during initialization (exit code: -9). If exit code is -9 "
        "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
        FailureKind.UNKNOWN_CRASH,
    ),
    # Older servers (before 0.5.15).
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
    # 0.5.17's own lines around a healthy start (shared/reference/sglang-versions.md, device kit).
    "[2026-12-01 10:01:02 TP0] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, "
    "bs=[1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64], avail mem=20.44 GB",
    "[2026-12-01 10:02:15 TP0] Capture target decode CUDA graph end. elapsed=72.68 s, mem usage=0.08 GB, "
    "avail mem=20.35 GB.",
    "[2026-12-01 10:00:01] '--cuda-graph-max-bs' is deprecated and will be removed in a future release. "
    "Use '--cuda-graph-max-bs-decode' instead.",
    "[2026-12-01 10:00:01] --enable-flashinfer-allreduce-fusion is deprecated. Please use "
    "--flashinfer-allreduce-fusion-backend=auto instead.",
    "[2026-12-01 10:00:02] port 30000 is in use. Waiting for 1 seconds for --port to be available. ",
    "[2026-12-01 10:00:02] Watchdog Scheduler initialized.",
    "[2026-12-01 10:30:00 TP0] Scheduler watchdog timeout (self.watchdog_timeout=60, self.soft=True)",
    "[2026-12-01 10:00:03] Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for "
    "KimiK25ForConditionalGeneration",
    "[2026-12-01 10:00:03 TP0] TorchSymmMemCommunicator: Device capability 12 not supported, communicator "
    "is not available.",
    "usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]",
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
    # Three are more than one line: a traceback's last frame, a loader frame above an OOM, a prefill hint.
    breakable = (REAL_H200_LOGS / "prefill-capture-oom-breakable.log").read_text()
    held = (REAL_H200_LOGS / "oom-gpu-held-by-another-process.log").read_text()
    texts = [m for m, _ in REAL_MESSAGES] + [FLASHINFER_A2A_TRACEBACK, breakable, held]
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
        FailureKind.WEIGHTS_DO_NOT_FIT,
        FailureKind.KV_POOL_TOO_SMALL,
        FailureKind.CUDA_GRAPH_OOM,
        FailureKind.PREFILL_GRAPH_OOM,
        FailureKind.OOM_UNDER_LOAD,
        FailureKind.PREDICTED_OOM,
    }
    assert {k for k in FailureKind if k.deterministic} == {
        FailureKind.UNSUPPORTED,
        FailureKind.INVALID_ARGUMENTS,
    }
    # The one home of "which flag cures which failure", in SGLang's newest spelling.
    assert {k: k.flag_to_lower for k in FailureKind if k.flag_to_lower} == {
        FailureKind.CUDA_GRAPH_OOM: "--cuda-graph-max-bs-decode",
        FailureKind.PREFILL_GRAPH_OOM: "--cuda-graph-max-bs-prefill",
    }
    assert all(k.advice for k in FailureKind)
    assert "raise --mem-fraction-static" in FailureKind.KV_POOL_TOO_SMALL.advice
    assert "lower --mem-fraction-static" in FailureKind.CUDA_GRAPH_OOM.advice
    assert FailureKind("kv_pool_too_small") is FailureKind.KV_POOL_TOO_SMALL
    # The kinds the driver records for proposals never launched keep the strings existing studies hold.
    assert [FailureKind(s) for s in ("forbidden", "predicted_oom", "known_incompatible")] == [
        FailureKind.FORBIDDEN,
        FailureKind.PREDICTED_OOM,
        FailureKind.KNOWN_INCOMPATIBLE,
    ]


def test_a_capture_failure_is_an_oom_only_when_it_wraps_one() -> None:
    # Real H200, 0.5.17: a broken JIT inside the decode graph's capture, with SGLang's "Possible
    # solutions" that name the graph batch: neither an OOM nor repaired with a smaller batch.
    ninja = (
        P + "Exception: Capture cuda graph failed: Ninja build failed. Ninja output:\n"
        "FAILED: norm.cuda.o\n"
        "#error The version of CUB in your include path is not compatible with this release of Thrust.\n"
        "Possible solutions:\n"
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)\n"
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n"
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. (Not recommended. Huge "
        "performance loss)\n"
    )
    failure = classify(ninja, "starting")
    assert failure is not None and failure.kind is FailureKind.KERNEL_BUILD_FAILED
    assert not failure.kind.is_oom and failure.kind.flag_to_lower is None and not failure.kind.deterministic
    tree = P + "Exception: Capture cuda graph failed: selected index k out of range\nPossible solutions:\n"
    failure = classify(tree, "starting")
    assert failure is not None and failure.kind is FailureKind.INVALID_ARGUMENTS
    assert not failure.kind.is_oom and failure.culprits == ()  # a combination: no one value is to blame
    oom = ninja.replace(
        "Ninja build failed. Ninja output:", "CUDA out of memory. Tried to allocate 2.00 GiB."
    )
    failure = classify(oom, "starting")
    assert failure is not None and failure.kind is FailureKind.CUDA_GRAPH_OOM
    assert failure.kind.flag_to_lower == "--cuda-graph-max-bs-decode"


def test_a_prefill_graph_oom_lowers_the_prefill_knob() -> None:
    log = "\n".join(
        [
            P + "Capture target prefill CUDA graph begin. backend=tc_piecewise, num_tokens=[4, 8], avail "
            "mem=3.10 GB",
            P + "RuntimeError: Capture prefill CUDA graph failed: CUDA out of memory. Tried to allocate 1.50 "
            "GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.02 GiB is free.",
            "Fail when using backend: tc_piecewise for prefill runner.",
            "Possible suggestions:",
            "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
            "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled",
        ]
    )
    failure = classify(log, "starting")
    assert failure is not None and failure.kind is FailureKind.PREFILL_GRAPH_OOM
    assert failure.kind.is_oom and failure.kind.flag_to_lower == "--cuda-graph-max-bs-prefill"
    assert "--cuda-graph-max-bs-prefill" in failure.advice


ARGPARSE_LOG = (
    "usage: sglang serve [-h] --model-path MODEL_PATH [--tokenizer-path TOKENIZER_PATH]\n"
    "                    [--attention-backend {triton,torch_native,flex_attention,flashinfer,fa3}]\n"
    "sglang serve: error: argument --attention-backend: invalid choice: 'flash' (choose from 'triton', "
    "'torch_native', 'flex_attention', 'flashinfer', 'fa3')\n"
)


@pytest.mark.parametrize(
    ("log", "culprits"),
    [
        (ARGPARSE_LOG, ("--attention-backend",)),
        (
            "launch_server.py: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'x'\n",
            ("--tp-size", "--tensor-parallel-size"),
        ),
        (
            "sglang serve: error: ambiguous option: --cuda-graph-max-bs=512 could match "
            "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill\n",
            ("--cuda-graph-max-bs",),
        ),
        (
            "sglang serve: error: unrecognized arguments: --stream-output --cuda-graph-bs 8\n",
            ("--stream-output", "--cuda-graph-bs"),
        ),
        (
            "sglang serve: error: the following arguments are required: --model-path/--model\n",
            ("--model-path", "--model"),
        ),
        (
            P + "ValueError: --speculative-use-rejection-sampling requires --speculative-eagle-topk=1.\n",
            ("--speculative-use-rejection-sampling",),
        ),
        (
            P + "ValueError: DFLASH speculative decoding requires setting --speculative-draft-model-path.\n",
            ("--speculative-algorithm",),
        ),
        (
            P + "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.\n",
            ("--enable-flashinfer-allreduce-fusion", "--flashinfer-allreduce-fusion-backend"),
        ),
    ],
    ids=[
        "invalid-choice",
        "aliases",
        "ambiguous",
        "unrecognized",
        "required",
        "requires",
        "dflash",
        "fusion",
    ],
)
def test_a_deterministic_failure_names_the_flags_of_sglangs_message(
    log: str, culprits: tuple[str, ...]
) -> None:
    for phase in ("starting", "benchmarking"):
        failure = classify(log, phase)
        assert failure is not None and failure.kind.deterministic and not failure.kind.is_oom
        assert failure.culprits == culprits
        assert failure.line in log.splitlines()  # SGLang's own message, shown by status and diagnose


def test_an_argparse_rejection_shows_sglangs_own_line() -> None:
    failure = classify(ARGPARSE_LOG, "starting")
    assert failure is not None and failure.kind is FailureKind.INVALID_ARGUMENTS
    assert failure.line.startswith(
        "sglang serve: error: argument --attention-backend: invalid choice: 'flash'"
    )


def test_a_driver_oom_depends_on_phase_like_torchs() -> None:
    log = P + "RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported"
    starting, benchmarking = classify(log, "starting"), classify(log, "benchmarking")
    assert starting is not None and starting.kind is FailureKind.CUDA_GRAPH_OOM
    assert benchmarking is not None and benchmarking.kind is FailureKind.OOM_UNDER_LOAD


def test_runtime_oom_under_load_with_the_real_h200_text() -> None:
    # Real H200, 0.5.17, --mem-fraction-static 0.995: up, then 64 long prompts (managers/scheduler.py).
    log = "\n".join(
        [
            "[2026-12-01 12:01:10] The server is fired up and ready to roll!",
            "[2026-12-01 12:03:41 TP0] Scheduler hit an exception: Traceback (most recent call last):",
            '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 4947, '
            "in run_scheduler_process",
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 46.00 MiB. GPU 0 has a total "
            "capacity of 139.80 GiB of which 34.31 MiB is free.",
            "[2026-12-01 12:03:41] SIGQUIT received. signum=3, frame=None. It usually means one child "
            "failed.",
        ]
    )
    failure = classify(log, "benchmarking")
    assert failure is not None and failure.kind is FailureKind.OOM_UNDER_LOAD
    assert failure.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 46.00 MiB")


def test_the_new_kv_message_beats_the_markers_of_its_death() -> None:
    # Real H200, 0.5.17: the scheduler raises, the launcher reports the rank dead.
    log = "\n".join(
        [
            P + "Scheduler hit an exception: Traceback (most recent call last):",
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            "--mem-fraction-static=0.01. Raise --mem-fraction-static above 0.016 (minimum viable = "
            "1 - available/pre = 0.0154). If using speculative decoding, draft weights are now counted.",
            "[2026-12-01 10:00:09] Received sigquit from a child process. It usually means the child failed.",
            "RuntimeError: Rank 0 scheduler died during initialization (exit code: -3). If exit code is -9 "
            "(SIGKILL), a common cause is the OS OOM killer. Run `dmesg -T | grep -i oom` to check.",
        ]
    )
    failure = classify(log, "starting")
    assert failure is not None and failure.kind is FailureKind.KV_POOL_TOO_SMALL
    assert failure.line.startswith("ValueError: Loaded weights leave no GPU memory")


REAL_H200_LOGS = Path(__file__).parents[1] / "data" / "sglang-0.5.17-h200"


def test_an_oom_with_another_process_holding_the_gpu_is_the_nodes_problem() -> None:
    # Real H200, 0.5.17: a second driver's server held 129.77 GiB of the GPU.
    log = (REAL_H200_LOGS / "oom-gpu-held-by-another-process.log").read_text()
    for phase in ("starting", "benchmarking"):
        failure = classify(log, phase)
        assert failure is not None and failure.kind is FailureKind.LAUNCH_ERROR
        assert not failure.kind.is_oom and "Process 4306 has 129.77 GiB memory in use" in failure.line
    # A process of a few hundred MiB (another rank's stray context) does not make it the node's fault.
    alone = P + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 139.80 GiB of which 1.10 GiB is free. Process 4306 has 512.00 MiB memory in use. Including "
        "non-PyTorch memory, this process has 138.10 GiB memory in use."
    )
    failure = classify(alone, "starting")
    assert failure is not None and failure.kind is FailureKind.CUDA_GRAPH_OOM
    # In a container with its own pid namespace torch lists the server itself as "Process N" and writes
    # no "this process has": the server's own OOM, not another process's.
    contained = P + (
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
        "of 139.80 GiB of which 1.10 GiB is free. Process 88412 has 138.74 GiB memory in use. Of the "
        "allocated memory 137.90 GiB is allocated by PyTorch."
    )
    started, served = classify(contained, "starting"), classify(contained, "benchmarking")
    assert started is not None and started.kind is FailureKind.CUDA_GRAPH_OOM
    assert served is not None and served.kind is FailureKind.OOM_UNDER_LOAD


def test_an_oom_while_loading_the_weights_is_weights_do_not_fit() -> None:
    # Real H200, 0.5.17: the OOM raised in the model loader (loader.py load_model, then the model's layers
    # and torch). Without the other process torch names, the weights are what does not fit.
    held = (REAL_H200_LOGS / "oom-gpu-held-by-another-process.log").read_text()
    alone = re.sub(r" Process 4306 has 129\.77 GiB memory in use\.", "", held)
    assert alone != held
    failure = classify(alone, "starting")
    assert failure is not None and failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT and failure.kind.is_oom
    assert failure.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB")
    assert "--tp-size" in failure.advice and "quantized" in failure.advice
    assert "--cuda-graph-max-bs" not in failure.advice
    # The simulated node's load failure (autotune/sim/model/failures.py), as it prints it on one H200.
    from autotune.sim.model import LaunchSettings, NodePerformanceModel
    from autotune.sim.profiles import load_hardware_profile, load_model_profile
    from autotune.sim.server_args import build_parser
    from autotune.sim.versions import sglang_version

    version = sglang_version({})
    ns = build_parser(version).parse_args(["--model-path", "/m"])
    settings = LaunchSettings.from_args(ns, {})
    node = NodePerformanceModel(
        load_hardware_profile("h200-x1"), load_model_profile("kimi-k2.5-int4"), settings, version
    )
    assert node.startup_failure is not None and node.startup_failure.phase == "load"
    simulated = node.startup_failure.log
    assert "GPU 0 has a total capacity of 140.40 GiB of which 0.51 GiB is free." in simulated
    failure = classify(simulated, "starting")
    assert failure is not None and failure.kind is FailureKind.WEIGHTS_DO_NOT_FIT
    # A capture's OOM has no loader frame: still a graph OOM.
    capture = classify(P + "Exception: Capture cuda graph failed: CUDA out of memory.", "starting")
    assert capture is not None and capture.kind is FailureKind.CUDA_GRAPH_OOM


def test_a_real_healthy_start_has_no_failure() -> None:
    log = (REAL_H200_LOGS / "start-ready.log").read_text()
    assert classify(log, "starting") is None and classify(log, "benchmarking") is None
    assert not any(is_fatal_line(line) for line in log.splitlines())


def test_a_real_clean_shutdown_is_no_failure() -> None:
    # Real H200, 0.5.17: the end of a trial that completed. autotune's SIGTERM makes SGLang report its own
    # scheduler as crashed (exit code -15) and a SIGQUIT; both follow "SIGTERM received" and are ignored.
    log = (REAL_H200_LOGS / "clean-shutdown.log").read_text()
    assert "SIGQUIT received. signum=None, frame=None. It usually means one child failed." in log
    assert classify(log, "benchmarking") is None
    # The same lines without the SIGTERM before them are a failure: the cut is what makes them benign.
    crashed = "\n".join(line for line in log.splitlines() if "SIGTERM received" not in line)
    failure = classify(crashed, "benchmarking")
    assert failure is not None and failure.kind is FailureKind.UNKNOWN_CRASH


def test_a_failure_before_the_shutdown_is_still_read() -> None:
    log = (
        "[2026-12-01 15:06:22] Scheduler hit an exception: Traceback (most recent call last):\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 46.00 MiB. GPU 0 has a total capacity"
        " of 139.80 GiB of which 34.31 MiB is free.\n"
        "[2026-12-01 15:06:23] SIGTERM received. signum=None frame=None. Draining requests and shutting"
        " down...\n"
    )
    failure = classify(log, "benchmarking")
    assert failure is not None and failure.kind is FailureKind.OOM_UNDER_LOAD


def test_the_real_kv_pool_message_is_kv_pool_too_small_and_names_the_fraction_to_raise_to() -> None:
    # Real H200, 0.5.17 (mem_cache/kv_cache_configurator.py): a start at 0.91 while another server held
    # most of the GPU, so SGLang asked for more than the GPU could give (above 0.983).
    log = (REAL_H200_LOGS / "kv-pool-too-small.log").read_text()
    failure = classify(log, "starting")
    assert failure is not None and failure.kind is FailureKind.KV_POOL_TOO_SMALL and failure.kind.is_oom
    assert failure.line.startswith("ValueError: Loaded weights leave no GPU memory for the KV cache under")
    assert "Raise --mem-fraction-static above 0.983" in failure.line


def test_a_real_oom_under_load_after_sglang_dropped_its_prefill_graphs() -> None:
    # Real H200, 0.5.17, trial 22 of the real study (--mem-fraction-static 0.99): 1.10 GiB was free after the
    # KV pool, so SGLang dropped the prefill graphs it had chosen (a warning, not a failure), became ready,
    # and ran out of memory on the benchmark's first 8192-token prefill, eagerly.
    log = (REAL_H200_LOGS / "oom-under-load-prefill-graphs-dropped.log").read_text()
    gate = next(line for line in log.splitlines() if "Disabling auto-selected prefill CUDA graph" in line)
    assert not is_fatal_line(gate)
    assert classify(log[: log.index("The server is fired up")], "starting") is None
    failure = classify(log, "benchmarking")
    assert failure is not None and failure.kind is FailureKind.OOM_UNDER_LOAD and failure.kind.is_oom
    assert failure.line.startswith("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 224.00 MiB")


def test_a_real_prefill_graph_capture_oom_is_a_prefill_graph_oom() -> None:
    # Real H200, 0.5.17, trial 1 of sglang-h200-startup-oom (--mem-fraction-static 0.99 with
    # --cuda-graph-backend-prefill breakable set by hand, which skips the 4 GiB gate): the first prefill
    # shape (8192 tokens) met the 1.10 GiB left. The breakable backend logs torch's error with its own hint
    # and re-raises it unwrapped, so only the hint says the prefill graphs failed.
    log = (REAL_H200_LOGS / "prefill-capture-oom-breakable.log").read_text()
    assert "Capture prefill CUDA graph failed" not in log  # no wrapper to read, unlike tc_piecewise's
    failure = classify(log, "starting")
    assert failure is not None and failure.kind is FailureKind.PREFILL_GRAPH_OOM and failure.kind.is_oom
    assert failure.line.startswith("[2026-12-02 02:45:47] OutOfMemoryError: CUDA out of memory.")
    assert failure.kind.flag_to_lower == "--cuda-graph-max-bs-prefill"
    # The backend logs the same lines around a replay's error: while serving it is an OOM under load.
    served = classify(log, "benchmarking")
    assert served is not None and served.kind is FailureKind.OOM_UNDER_LOAD
    # Without the hint, torch's error alone at start-up is the decode capture's kind.
    bare = "\n".join(line for line in log.splitlines() if "for prefill runner" not in line)
    failure = classify(bare, "starting")
    assert failure is not None and failure.kind is FailureKind.CUDA_GRAPH_OOM
