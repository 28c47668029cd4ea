"""How a launch fails: the start-up failure SGLang would die with, in its phase and with its exact lines,
and the out-of-memory a prefill batch meets under load."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.sim.model.memory import MemoryPlan
    from autotune.sim.model.node import NodePerformanceModel


@dataclass(frozen=True)
class StartupFailure:
    """SGLang dying during startup: the phase, the failing rank and the exact lines it prints."""

    phase: str  # init | load | kv | runner | capture | prefill_capture | warmup
    lines: list[str]
    rank: int = 0
    # What SGLang's own logger says before the traceback, one record (a prefill backend's hint).
    logged: tuple[str, ...] = ()

    @property
    def log(self) -> str:
        """Every line the failure writes, in order."""
        return "\n".join([*self.logged, *self.lines])


def _traceback(frames: list[tuple[str, int, str, str]], error: str) -> list[str]:
    lines = ["Traceback (most recent call last):"]
    for path, line, func, code in frames:
        lines.append(
            f'  File "/usr/local/lib/python3.12/dist-packages/sglang/{path}", line {line}, in {func}'
        )
        lines.append(f"    {code}")
    return [*lines, error]


_SCHEDULER_INIT = [
    ("srt/managers/scheduler.py", 2923, "run_scheduler_process", "scheduler = Scheduler("),
    ("srt/managers/scheduler.py", 312, "__init__", "self.tp_worker = TpModelWorker("),
    ("srt/managers/tp_worker.py", 94, "__init__", "self.model_runner = ModelRunner("),
]


_DRAFT_FORWARD = [
    ("srt/managers/scheduler.py", 1024, "event_loop_overlap", "batch_result = self.run_batch(batch)"),
    (
        "srt/speculative/eagle_worker_v2.py",
        718,
        "draft_forward",
        "parent_list, top_scores_index, draft_tokens = (",
    ),
    ("srt/speculative/eagle_utils.py", 106, "organize_draft_results", "top_scores = torch.topk("),
]


def startup_failure(node: NodePerformanceModel) -> StartupFailure | None:
    """The first failure this launch meets at start-up, or None when it becomes ready."""
    s, hw, plan = node.settings, node.hw, node.plan
    if s.tp_size * s.dp_size > hw.num_gpus:
        return StartupFailure(
            "init",
            _traceback(
                [
                    *_SCHEDULER_INIT,
                    (
                        "srt/model_executor/model_runner.py",
                        512,
                        "init_torch_distributed",
                        "torch.get_device_module(self.device).set_device(self.gpu_id)",
                    ),
                ],
                "torch.AcceleratorError: CUDA error: invalid device ordinal",
            ),
            rank=hw.num_gpus,
        )
    if plan.weights_gb > plan.total_gb - plan.init_used_gb:
        return StartupFailure(
            "load",
            _traceback(
                [
                    *_SCHEDULER_INIT,
                    ("srt/model_loader/loader.py", 601, "load_model", "model = _initialize_model("),
                ],
                "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a "
                f"total capacity of {hw.gpu_memory_gb / 1.0737:.2f} GiB of which 0.51 GiB is free.",
            ),
        )
    if s.attention_backend == "fa3" and "fa3" in hw.unsupported:
        return StartupFailure(
            "init",
            _traceback(
                _SCHEDULER_INIT,
                "AssertionError: FlashAttention v3 Backend requires SM>=80 and SM<=90. "
                "Please use `--attention-backend flashinfer`.",
            ),
        )
    if s.ep_size > 1 and "expert_parallel_flashinfer_a2a" in hw.unsupported:
        return StartupFailure(
            "load",
            _traceback(
                [
                    *_SCHEDULER_INIT,
                    (
                        "srt/layers/moe/token_dispatcher/flashinfer.py",
                        88,
                        "__init__",
                        "assert self.num_local_experts * self.ep_size == self.num_experts"
                        " and is_sm100_supported()",
                    ),
                ],
                "AssertionError",
            ),
            rank=3,
        )
    if plan.static_rest_gb <= 0 or plan.kv_tokens <= 0:
        return StartupFailure("kv", _kv_pool_failure(plan), rank=3)
    if node.flashinfer_fusion and "flashinfer_allreduce_fusion" in hw.unsupported:
        return StartupFailure(
            "runner",
            _traceback(
                [
                    *_SCHEDULER_INIT,
                    ("srt/model_executor/runner/base_runner.py", 231, "warmup", "self._init_ar_fusion()"),
                    ("srt/layers/flashinfer_comm_fusion.py", 46, "_resolve_backend", "raise ValueError("),
                ],
                "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs.",
            ),
        )
    # Both releases capture the prefill graphs first, then the decode graphs (cuda_graph_setup.py:127-148).
    if plan.prefill_graph_sizes and plan.avail_after_kv_gb - plan.prefill_graph_gb < 0.5:
        return _prefill_capture_failed(node, plan)
    if plan.avail_after_graph_gb < 0.5:
        need = plan.graph_gb / max(len(plan.captured_batch_sizes), 1) * 4
        free = plan.avail_after_kv_gb - plan.prefill_graph_gb
        return StartupFailure("capture", _capture_failed(_torch_oom(node, need, free)))
    if node.spec and not node.spec.tree_has_enough_candidates:
        # The draft graph capture fails, or without graphs the first draft forward (at warm-up).
        if plan.captured_batch_sizes:
            return StartupFailure("capture", _capture_failed("selected index k out of range", draft=True))
        return StartupFailure(
            "warmup", _traceback(_DRAFT_FORWARD, "RuntimeError: selected index k out of range")
        )
    return None


def _torch_oom(node: NodePerformanceModel, need_gb: float, free_gb: float) -> str:
    """torch's out-of-memory text; the model's GB shown in GiB as torch does."""
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {need_gb / 1.0737:.2f} GiB. "
        f"GPU 0 has a total capacity of {node.hw.gpu_memory_gb / 1.0737:.2f} GiB of which "
        f"{max(free_gb, 0.0) / 1.0737:.2f} GiB is free."
    )


def _kv_pool_failure(plan: MemoryPlan) -> list[str]:
    frames = [
        *_SCHEDULER_INIT,
        ("srt/model_executor/model_runner.py", 612, "initialize", "self.init_memory_pool("),
    ]
    if plan.static_rest_gb <= 0:
        minimum = 1 - plan.avail_after_weights_gb / plan.pre_load_avail_gb
        return _traceback(
            [
                *frames,
                (
                    "srt/mem_cache/kv_cache_configurator.py",
                    1646,
                    "profile_max_num_token",
                    "raise ValueError(",
                ),
            ],
            "ValueError: Loaded weights leave no GPU memory for the KV cache under "
            f"--mem-fraction-static={plan.mem_fraction_static}. Raise --mem-fraction-static above "
            f"{math.ceil(minimum * 1000) / 1000:.3f} "
            f"(minimum viable = 1 - available/pre = {minimum:.4f}). "
            "If using speculative decoding, draft weights are now counted.",
        )
    # A positive remainder too small for one token (model_executor/pool_configurator.py:62-67).
    return _traceback(
        [
            *frames,
            ("srt/model_executor/pool_configurator.py", 67, "__post_init__", "raise RuntimeError(msg)"),
        ],
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. "
        f"Current value: mem_fraction_static={plan.mem_fraction_static}",
    )


def _prefill_capture_failed(node: NodePerformanceModel, plan: MemoryPlan) -> StartupFailure:
    """Prefill graphs run out of memory. The backend's capture context logs the error with its hint and
    re-raises it (breakable_cuda_graph/context.py:36-49, tc_piecewise_cuda_graph/context_manager.py:48-62);
    only tc_piecewise's construction wraps it again (prefill_cuda_graph_runner.py:372-381). Real H200,
    0.5.17, breakable: tests/data/sglang-0.5.17-h200/prefill-capture-oom-breakable.log."""
    backend = node.prefill_graph_backend
    torch_error = _torch_oom(node, plan.prefill_graph_gb, plan.avail_after_kv_gb)
    message = torch_error.removeprefix("torch.OutOfMemoryError: ")  # str() of torch's error
    if backend == "tc_piecewise":
        alternative = ["change to breakable by --cuda-graph-backend-prefill=breakable"]
    elif node.version.breakable_hint_names_tc_piecewise:
        alternative = ["change to tc_piecewise by --cuda-graph-backend-prefill=tc_piecewise"]
    else:
        alternative = []
    suggestions = [
        *alternative,
        "disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled",
        "if it is an OOM problem, set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7) "
        "or set --cuda-graph-max-bs-prefill to a smaller value (e.g., 2048)",
    ]
    hint = [
        f"Fail when using backend: {backend} for prefill runner.",
        "Possible suggestions:",
        *(f"{number}. {text}" for number, text in enumerate(suggestions, 1)),
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ",
    ]
    logged = (f"OutOfMemoryError: {message}", *hint, "")
    if backend == "tc_piecewise":
        frames = [
            *_SCHEDULER_INIT,
            (
                "srt/model_executor/runner/prefill_cuda_graph_runner.py",
                378,
                "__init__",
                "raise RuntimeError(",
            ),
        ]
        lines = [
            *_traceback(frames, f"RuntimeError: Capture prefill CUDA graph failed: {message}"),
            *hint,
        ]
        return StartupFailure("prefill_capture", lines, logged=logged)
    frames = [
        *_SCHEDULER_INIT,
        (
            "srt/model_executor/runner/prefill_cuda_graph_runner.py",
            1399,
            "capture_one_shape",
            "self.backend.capture_one(",
        ),
        ("srt/layers/quantization/unquant.py", 255, "apply", "return F.linear(x, layer.weight, bias)"),
    ]
    return StartupFailure("prefill_capture", _traceback(frames, torch_error), logged=logged)


def _capture_failed(torch_error: str, draft: bool = False) -> list[str]:
    """SGLang's decode (or EAGLE draft) capture wrapper and `CUDA_GRAPH_CAPTURE_FAILED_MSG`
    (decode_cuda_graph_runner.py:414-419, runner_backend_utils/__init__.py:14-21)."""
    runner = (
        ("srt/speculative/eagle_draft_cuda_graph_runner.py", 273, "__init__", "raise Exception(")
        if draft
        else (
            "srt/model_executor/runner/decode_cuda_graph_runner.py",
            417,
            "__init__",
            "raise Exception(",
        )
    )
    return [
        *_traceback([*_SCHEDULER_INIT, runner], f"Exception: Capture cuda graph failed: {torch_error}"),
        "Possible solutions:",
        "1. set --mem-fraction-static to a smaller value (e.g., 0.8 or 0.7)",
        "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)",
        "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled. "
        "(Not recommended. Huge performance loss)",
        "Open an issue on GitHub https://github.com/sgl-project/sglang/issues/new/choose ",
    ]


def oom_under_load_lines(node: NodePerformanceModel, prefill_tokens: int) -> list[str]:
    """What a scheduler prints when a prefill batch's activations overflow what is left."""
    need = prefill_tokens * node.plan.activation_gb_per_token
    return _traceback(
        [
            ("srt/managers/scheduler.py", 1024, "event_loop_normal", "result = self.run_batch(batch)"),
            (
                "srt/managers/scheduler.py",
                1876,
                "run_batch",
                "logits_output, next_token_ids, can_run_cuda_graph = (",
            ),
            ("srt/model_executor/model_runner.py", 1987, "forward_extend", "return self.model.forward("),
        ],
        _torch_oom(node, need, node.plan.avail_after_graph_gb),
    )


def presharded_plan_lines(dump: str, version: object) -> list[str]:
    """What a rank prints when the presharded dump it reads back has a plan of another version (0.5.17
    loader.py: _load_from_presharded)."""
    return _traceback(
        [
            *_SCHEDULER_INIT,
            ("srt/model_loader/loader.py", 601, "load_model", "return self._load_from_presharded("),
            ("srt/model_loader/loader.py", 2431, "_load_from_presharded", "raise ValueError("),
        ],
        f"ValueError: Unsupported presharded plan version {version!r} at {dump}; expected 1.",
    )
