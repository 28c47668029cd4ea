"""How long things take, in model seconds: the start-up phases, and one forward of the target model
(weights, compute, attention, all-reduces, launches) as a prefill, decode or speculative step uses it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from autotune.sim.model import startup
from autotune.sim.model.memory import kv_bytes_per_token
from autotune.sim.model.settings import GB, MIB

if TYPE_CHECKING:
    from autotune.sim.model.node import NodePerformanceModel

CUSTOM_ALLREDUCE_MAX_BYTES = 8 * MIB


def init_seconds(node: NodePerformanceModel) -> float:
    return 15.0


def load_seconds(node: NodePerformanceModel) -> float:
    return startup.load_seconds(node)


def prefill_capture_seconds(node: NodePerformanceModel) -> float:
    return 0.05 * len(node.plan.prefill_graph_sizes) * startup.compile_share(node)


def capture_seconds(node: NodePerformanceModel) -> float:
    per_size = 0.4 * (1 + (node.spec.num_steps if node.spec else 0))
    return per_size * len(node.plan.captured_batch_sizes) * startup.compile_share(node)


# -- performance ------------------------------------------------------------------------------------
def _attention_factor(node: NodePerformanceModel) -> float:
    """Attention's time over reading the context's KV once at the profile's bandwidth: the hardware
    profile's measured factor for the backend, else an estimate."""
    backend = node.settings.attention_backend or node.model.default_attention_backend
    measured = node.hw.attention_factors.get(backend)
    return measured or {"triton": 1.18, "fa3": 0.9, "flashinfer": 1.0}.get(backend, 1.05)


def forward_s(
    node: NodePerformanceModel,
    tokens: int,
    context_tokens: int,
    in_graph: bool,
    routed_tokens: float | None = None,
) -> float:
    """One target-model forward over `tokens` new tokens attending to `context_tokens` in all.

    `routed_tokens` is how many independently routed tokens the MoE layers see (fewer than `tokens`
    when several come from one sequence, as a verify pass's draft tokens do)."""
    m, hw = node.model, node.hw
    if m.num_experts:
        routed = tokens if routed_tokens is None else routed_tokens
        distinct = m.num_experts * (1 - (1 - m.experts_per_token / m.num_experts) ** routed)
        read_gb = m.dense_read_gb + distinct * m.expert_gb
    else:
        read_gb = m.dense_read_gb
    weights_s = read_gb / node.tp / hw.memory_bandwidth_gbps
    compute_s = 2 * m.active_params_b * 1e9 * tokens / (node.tp * hw.compute_tflops * 1e12)
    attention_s = context_tokens * kv_bytes_per_token(node) / (hw.memory_bandwidth_gbps * GB)
    attention_s *= _attention_factor(node)
    count = m.num_layers * m.allreduces_per_layer
    comm_s = count * node.allreduce_us(tokens * m.hidden_size * 2, in_graph) * 1e-6
    if node.settings.ep_size > 1:
        comm_s *= 1.1  # all-to-all dispatch of tokens to experts on top of the attention all-reduces
    device_s = max(weights_s, compute_s) + attention_s + comm_s
    if not in_graph:
        ops = m.num_layers * m.kernels_per_layer
        if hw.eager_op_us:
            # Eager, the host dispatches every op through Python and PyTorch while the GPU runs the ones
            # before it (queued kernels start back to back): the forward takes the longer of the two.
            device_s = max(device_s, ops * hw.eager_op_us * node.eager_host * 1e-6)
        else:
            device_s += ops * hw.kernel_launch_us * 1e-6  # no measured host: a launch per kernel on top
    return device_s + m.step_overhead_ms * 1e-3


def _in_graph(node: NodePerformanceModel, batch: int) -> bool:
    return batch <= max(node.plan.captured_batch_sizes, default=0)


def decode_step_s(node: NodePerformanceModel, batch: int, context_tokens: int) -> float:
    """One decode step of `batch` requests; with speculation, draft + verify + draft extend."""
    # Each request's next token is sampled after the forward (softmax, top-k/p over the vocabulary).
    sampling_s = batch * node.model.sampling_us_per_request * 1e-6
    if not node.spec:
        return forward_s(node, batch, context_tokens, _in_graph(node, batch)) + sampling_s
    draft = node.model.draft
    assert draft is not None  # _resolve_spec returns None without a draft profile
    in_graph = _in_graph(node, batch)
    verify_in_graph = in_graph and draft.verify_in_cuda_graph
    ar_bytes = batch * node.spec.topk * node.model.hidden_size * 2
    draft_step_s = draft.step_ms * 1e-3 * (1 + 0.03 * batch * node.spec.topk)
    draft_step_s += draft.allreduces_per_step * node.allreduce_us(ar_bytes, in_graph) * 1e-6
    verify_tokens = batch * node.spec.num_draft_tokens
    # Draft tokens of one sequence follow its context, so they mostly route to the same experts.
    routed = batch * (1 + (node.spec.num_draft_tokens - 1) * draft.routing_overlap)
    verify_s = forward_s(node, verify_tokens, context_tokens + verify_tokens, verify_in_graph, routed)
    return (node.spec.num_steps + 1) * draft_step_s + verify_s + sampling_s


def verify_allreduce_s(node: NodePerformanceModel, batch: int) -> float:
    """Time the verify pass spends in all-reduces at `batch` (0 without speculation)."""
    if not node.spec:
        return 0.0
    assert node.model.draft is not None  # no spec without a draft profile
    in_graph = _in_graph(node, batch) and node.model.draft.verify_in_cuda_graph
    tokens = batch * node.spec.num_draft_tokens
    count = node.model.num_layers * node.model.allreduces_per_layer
    return count * node.allreduce_us(tokens * node.model.hidden_size * 2, in_graph) * 1e-6


def prefill_step_s(node: NodePerformanceModel, tokens: int, context_tokens: int) -> float:
    """One prefill (extend) batch of `tokens` new tokens: replayed from the prefill CUDA graphs when one
    was captured for that many tokens (SGLang logs `cuda graph: True` on such a batch), else eager."""
    in_graph = tokens <= max(node.plan.prefill_graph_sizes, default=0)
    return forward_s(node, tokens, context_tokens, in_graph)


def allreduce_us(node: NodePerformanceModel, nbytes: float, in_graph: bool) -> float:
    """One tensor-parallel all-reduce as SGLang dispatches it: custom first, then NCCL."""
    if node.tp == 1:
        return 0.0
    launch = 0.0 if in_graph else 2 * node.hw.kernel_launch_us
    if not in_graph and node.nccl.link()[0] != "p2p":
        # Eager collectives over host memory wait on NCCL's proxy thread; a graph pre-posts its work.
        launch += node.hw.proxy_wait_us
    if node.custom_allreduce and nbytes < CUSTOM_ALLREDUCE_MAX_BYTES:
        return node.hw.custom_allreduce_us * (1 + nbytes / (512 * 1024)) + launch
    cost = node.nccl.allreduce_us(nbytes)
    if node.settings.enable_torch_symm_mem and "torch_symm_mem" not in node.hw.unsupported:
        cost *= 0.7
    if node.flashinfer_fusion and node.hw.interconnect == "nvlink":
        cost *= 0.8
    return cost + launch
