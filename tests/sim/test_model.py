"""The simulated node's model, asked directly: the seed's figures, its failures, memory and NCCL rules.

Every figure goes through `predict` (or the `NodePerformanceModel` it builds) on the seed profile: 8x RTX PRO
6000 over PCIe with Kimi-K2.5 INT4 at TP 8, on the model profile's standard workload. Times are model time.
Run with `pytest -s` to see the seed figures table.
"""

from __future__ import annotations

import itertools
import re
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import pytest

from autotune.sim.engine import run_workload
from autotune.sim.model import GB, MIB, NodePerformanceModel
from autotune.sim.predict import Prediction, predict, settings_for
from autotune.sim.profiles import HardwareProfile, ModelProfile, load_hardware_profile, load_model_profile
from autotune.trial.failures import FailureKind, classify

TP8 = ["--tp-size", "8"]
EAGLE3 = ["--speculative-algorithm", "EAGLE3"]
ONE_LOADER_THREAD = ["--model-loader-extra-config", '{"enable_multithread_load": false}']
GIB = float(1 << 30)
# SGLang 0.5.17 srt/mem_cache/kv_cache_configurator.py:1646-1655 (the line real 0.5.17 printed on an H200,
# shared/device-kit/README.md "Real failure lines").
NOT_ENOUGH_MEMORY = re.compile(
    r"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0\.55\. "
    r"Raise --mem-fraction-static above 0\.\d{3} \(minimum viable = 1 - available/pre = 0\.\d{4}\)\. "
    r"If using speculative decoding, draft weights are now counted\."
)
CAPTURE_OOM = (
    "Exception: Capture cuda graph failed: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
)
SEED_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def seed_hw() -> HardwareProfile:
    return load_hardware_profile("rtx-pro-6000-pcie-x8")


@pytest.fixture(scope="module")
def kimi() -> ModelProfile:
    return load_model_profile("kimi-k2.5-int4")


@pytest.fixture(scope="module")
def h200() -> HardwareProfile:
    return load_hardware_profile("h200-nvlink-x8")


@pytest.fixture(scope="module")
def llama() -> ModelProfile:
    return load_model_profile("llama-70b-bf16")


def node(
    hw: HardwareProfile, model: ModelProfile, argv: list[str], env: Mapping[str, str] = {}
) -> NodePerformanceModel:
    return NodePerformanceModel(hw, model, settings_for(argv, env))


def failure_text(prediction: Prediction) -> str:
    assert prediction.node.startup_failure is not None, "the launch was expected to fail"
    return "\n".join(prediction.node.startup_failure.lines)


def last_frame(prediction: Prediction) -> str:
    assert prediction.node.startup_failure is not None
    return [line for line in prediction.node.startup_failure.lines if line.startswith("  File ")][-1]


def decode_batches(n: NodePerformanceModel, model: ModelProfile) -> Counter[int]:
    """How many decode steps the standard workload runs at each batch size (requests in the step)."""
    w = model.standard_workload
    engine = n.new_engine()
    submitted = 0
    for _ in range(min(w.concurrency, w.num_prompts)):
        engine.add(f"r{submitted}", w.input_len, w.output_len)
        submitted += 1
    batches: Counter[int] = Counter()
    while engine.has_work:
        step = engine.step()
        assert not step.oom_lines
        if step.kind == "decode" and step.emitted:
            batches[len(step.emitted)] += 1
        for _ in step.finished + step.aborted:
            if submitted < w.num_prompts:
                engine.add(f"r{submitted}", w.input_len, w.output_len)
                submitted += 1
    return batches


# ---- the seed's figures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedFigure:
    """One figure the seed states, how the model answers it, and how close it must come."""

    name: str
    target: float
    unit: str
    measure: Callable[[HardwareProfile, ModelProfile], float]
    tolerance: float = SEED_TOLERANCE


def _tok_s(argv: list[str], env: Mapping[str, str] = {}) -> Callable[[HardwareProfile, ModelProfile], float]:
    return lambda hw, model: predict(hw, model, argv, env).output_throughput


def _eagle_verify_ms(hw: HardwareProfile, model: ModelProfile) -> float:
    n = node(hw, model, TP8 + EAGLE3)
    batch = decode_batches(n, model).most_common(1)[0][0]
    return n.verify_allreduce_s(batch) * 1e3


SEED_FIGURES = [
    SeedFigure("baseline, default --cuda-graph-max-bs (512)", 82.0, "tok/s", _tok_s(TP8)),
    SeedFigure(
        "baseline, --cuda-graph-max-bs 128", 89.5, "tok/s", _tok_s([*TP8, "--cuda-graph-max-bs", "128"])
    ),
    SeedFigure("EAGLE-3, default NCCL", 54.1, "tok/s", _tok_s(TP8 + EAGLE3)),
    SeedFigure("EAGLE-3 verify pass, all-reduce time", 30.0, "ms", _eagle_verify_ms, tolerance=0.15),
    SeedFigure(
        "EAGLE-3 verify pass, all-reduces",
        122,
        "per forward",
        lambda hw, model: model.num_layers * model.allreduces_per_layer,
        tolerance=0.0,
    ),
    SeedFigure(
        "custom all-reduce forced on PCIe",
        38.0,
        "tok/s",
        _tok_s(TP8, {"SGLANG_SIM_FORCE_CUSTOM_ALLREDUCE": "1"}),
    ),
    SeedFigure(  # the seed's SGLang loaded single-threaded ("Loading safetensors checkpoint shards")
        "weight loading, 547 GB",
        600.0,
        "s",
        lambda hw, model: node(hw, model, [*TP8, *ONE_LOADER_THREAD]).load_seconds,
        0.10,
    ),
]


@pytest.mark.parametrize("figure", SEED_FIGURES, ids=lambda f: f.name)
def test_seed_figure(seed_hw: HardwareProfile, kimi: ModelProfile, figure: SeedFigure) -> None:
    value = figure.measure(seed_hw, kimi)
    assert value == pytest.approx(figure.target, rel=figure.tolerance), f"{figure.name}: {value:.2f}"


def test_seed_figures_table(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    rows = [(figure, figure.measure(seed_hw, kimi)) for figure in SEED_FIGURES]
    print(f"\n{'figure':<46} {'target':>9} {'model':>9} {'error %':>8} {'allowed':>8}")
    for figure, value in rows:
        error = (value - figure.target) / figure.target * 100
        print(
            f"{figure.name:<46} {figure.target:>9.1f} {value:>9.1f} {error:>+8.1f} "
            f"{figure.tolerance * 100:>7.0f}%  {figure.unit}"
        )
    assert all(abs(value / f.target - 1) <= f.tolerance for f, value in rows)


def test_baseline_default_captures_up_to_512(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    plan = node(seed_hw, kimi, TP8).plan
    assert plan.cuda_graph_max_bs == 512
    smaller = node(seed_hw, kimi, [*TP8, "--cuda-graph-max-bs", "128"]).plan
    assert smaller.kv_tokens > plan.kv_tokens  # the +9% comes from memory freed for the KV cache


def test_mem_fraction_055_fails_after_weight_loading(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    p = predict(seed_hw, kimi, [*TP8, "--mem-fraction-static", "0.55", "--cuda-graph-max-bs", "128"])
    assert p.failure_phase == "kv"  # init and load passed: the weights were loaded
    assert p.failure_line is not None and NOT_ENOUGH_MEMORY.fullmatch(p.failure_line)
    assert "kv_cache_configurator.py" in last_frame(p)
    assert p.plan.weights_gb > 0.55 * p.plan.total_gb  # the static pool cannot even hold the weights
    assert p.output_throughput == 0.0


def test_eagle3_verify_pass_is_122_allreduces_of_about_30_ms(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    n = node(seed_hw, kimi, TP8 + EAGLE3)
    assert kimi.num_layers * kimi.allreduces_per_layer == 122
    batches = decode_batches(n, kimi)
    # Only two 28k-token requests fit beside the draft model, so the workload decodes at batch 2.
    assert set(batches) == {2}, batches
    assert n.spec is not None
    for batch in (2, 3, 4):  # the workload's batch, and the 3 or 4 of a fuller KV cache
        verify_s = n.verify_allreduce_s(batch)
        assert verify_s == pytest.approx(0.030, rel=0.15), (batch, verify_s)
        # The seed's verify pass runs eagerly: its all-reduces pay the launch and the proxy wait.
        assert kimi.draft is not None and not kimi.draft.verify_in_cuda_graph
        one_us = n.allreduce_us(batch * n.spec.num_draft_tokens * kimi.hidden_size * 2, in_graph=False)
        assert verify_s == pytest.approx(122 * one_us * 1e-6)


# ---- what the seed node cannot run, and the H200 can -----------------------------------------------


@pytest.mark.parametrize(
    "flag", [["--enable-flashinfer-allreduce-fusion"], ["--flashinfer-allreduce-fusion-backend", "auto"]]
)
def test_flashinfer_allreduce_fusion_fails_at_runner_warmup_on_sm120(
    seed_hw: HardwareProfile, kimi: ModelProfile, flag: list[str]
) -> None:
    p = predict(seed_hw, kimi, [*TP8, *flag])
    assert p.failure_phase == "runner"
    # SGLang 0.5.17 srt/layers/flashinfer_comm_fusion.py:46-50 (`_resolve_backend`).
    assert p.failure_line == "ValueError: FlashInfer allreduce fusion requires SM90 or SM10X NVIDIA GPUs."


def test_torch_symm_mem_on_sm120_is_a_warning_and_the_server_runs(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    p = predict(seed_hw, kimi, [*TP8, "--enable-torch-symm-mem"])
    assert p.failure_phase is None and p.output_throughput > 0
    # SGLang 0.5.17 srt/distributed/device_communicators/torch_symm_mem.py:80-89.
    assert (
        "TorchSymmMemCommunicator: Device capability 12 not supported, communicator is not available."
        in p.node.warnings
    )


def test_expert_parallel_fails_in_flashinfer_token_dispatcher(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    p = predict(seed_hw, kimi, [*TP8, "--ep-size", "8"])
    assert p.failure_line == "AssertionError"
    assert '/srt/layers/moe/token_dispatcher/flashinfer.py", line' in last_frame(p)


UNSUPPORTED_FLAGS = {
    "flashinfer_allreduce_fusion": ["--enable-flashinfer-allreduce-fusion"],
    "expert_parallel_flashinfer_a2a": ["--ep-size", "8"],
}


@pytest.mark.parametrize("feature", UNSUPPORTED_FLAGS)
def test_features_fail_only_where_the_profile_says(
    seed_hw: HardwareProfile, kimi: ModelProfile, h200: HardwareProfile, llama: ModelProfile, feature: str
) -> None:
    assert feature in seed_hw.unsupported
    assert predict(seed_hw, kimi, TP8 + UNSUPPORTED_FLAGS[feature]).failure_phase is not None
    p = predict(h200, llama, TP8 + UNSUPPORTED_FLAGS[feature])
    if feature in h200.unsupported:
        assert p.failure_phase is not None
    else:
        assert p.failure_phase is None and p.output_throughput > 0


# ---- memory ------------------------------------------------------------------------------------------


def test_kv_tokens_grow_with_mem_fraction_static(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    fractions = [0.75, 0.80, 0.85, 0.90, 0.95]
    tokens = [node(seed_hw, kimi, [*TP8, "--mem-fraction-static", str(f)]).plan.kv_tokens for f in fractions]
    assert tokens[0] == 0  # 72 GB is less than the 68.4 GB of weights plus workspaces and NCCL's share
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens
    # Above that, each 0.05 of 96 GB goes to the KV cache whole: 4.8 GB of 70 KB MLA tokens.
    step = 0.05 * seed_hw.gpu_memory_gb * GB / kimi.kv_bytes_per_token
    assert tokens[-1] - tokens[1] == pytest.approx(3 * step, abs=3)


@pytest.mark.parametrize(
    ("fraction", "too_large", "fits", "extra"),
    [("0.95", "1024", "128", [])],
    ids=["plain"],
)
def test_too_large_cuda_graph_max_bs_fails_capture_with_cuda_oom(
    seed_hw: HardwareProfile, kimi: ModelProfile, fraction: str, too_large: str, fits: str, extra: list[str]
) -> None:
    argv = [*TP8, "--mem-fraction-static", fraction, *extra, "--cuda-graph-max-bs"]
    p = predict(seed_hw, kimi, [*argv, too_large])
    assert p.failure_phase == "capture"
    text = failure_text(p)
    assert CAPTURE_OOM in text
    assert "GPU 0 has a total capacity of 89.41 GiB of which " in text
    # SGLang 0.5.17 model_executor/runner_backend_utils/__init__.py:14-21.
    assert "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)" in text
    assert "3. disable decode CUDA graph by --cuda-graph-backend-decode=disabled." in text
    # The prefill graphs' 1.5 GB (MLA) and activations need room too: 0.92 serves the workload.
    fitting = [*TP8, "--mem-fraction-static", "0.92", *extra, "--cuda-graph-max-bs", fits]
    assert predict(seed_hw, kimi, fitting).output_throughput > 0


def test_prefill_graphs_capture_first_and_fail_with_their_own_text(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    # B12: SGLang captures the prefill graphs before the decode graphs (cuda_graph_setup.py:127-148). At 0.98
    # 1.9 GB is left after the KV pool; the MLA model's tc_piecewise prefill graphs take 1.5 of it.
    argv = [*TP8, "--mem-fraction-static", "0.98", "--cuda-graph-max-bs", "64"]
    p = predict(seed_hw, kimi, [*argv, "--cuda-graph-backend-prefill", "tc_piecewise"])
    assert p.failure_phase == "prefill_capture"
    text = failure_text(p)
    # SGLang 0.5.17 model_executor/runner/prefill_cuda_graph_runner.py:378-381 and the tc_piecewise hint
    # (runner_backend_utils/tc_piecewise_cuda_graph/context_manager.py:125-131).
    wrapped = "RuntimeError: Capture prefill CUDA graph failed: CUDA out of memory."
    assert wrapped in text
    assert "2. disable the prefill CUDA graph by --cuda-graph-backend-prefill=disabled" in text
    # Whatever the backend, the log says the prefill graphs failed (the backend's own hint, logged first).
    for backend in ("tc_piecewise", "breakable"):
        failure = predict(
            seed_hw, kimi, [*argv, "--cuda-graph-backend-prefill", backend]
        ).node.startup_failure
        assert failure is not None and failure.logged[0].startswith("OutOfMemoryError: CUDA out of memory.")
        found = classify(failure.log, "starting")
        assert found is not None and found.kind is FailureKind.PREFILL_GRAPH_OOM
    assert predict(seed_hw, kimi, [*argv, "--cuda-graph-backend-prefill", "disabled"]).failure_phase is None
    # Left to itself 0.5.17 does not try: under 4 GiB free it drops the prefill graphs it chose.
    auto = predict(seed_hw, kimi, argv)
    assert auto.failure_phase is None and auto.plan.prefill_graph_sizes == []
    assert auto.plan.prefill_graph_dropped_at_gb == pytest.approx(auto.plan.avail_after_kv_gb)


def test_decode_graphs_meet_what_the_prefill_graphs_left(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    # At 0.93 the decode graphs up to 1024 fit in what the KV pool leaves, but not after the prefill graphs.
    argv = [*TP8, "--mem-fraction-static", "0.93", "--cuda-graph-max-bs", "1024"]
    assert predict(seed_hw, kimi, argv).failure_phase == "capture"
    assert predict(seed_hw, kimi, [*argv, "--cuda-graph-backend-prefill", "disabled"]).failure_phase is None


def test_nccl_p2p_puts_buffers_on_the_gpu(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    shm = node(seed_hw, kimi, TP8)
    p2p = node(seed_hw, kimi, TP8, {"NCCL_P2P_LEVEL": "SYS"})
    assert shm.nccl.link()[0] == "shm" and p2p.nccl.link()[0] == "p2p"
    assert p2p.plan.nccl_gb > shm.plan.nccl_gb
    assert p2p.plan.kv_tokens < shm.plan.kv_tokens
    # nccl.md: about 9 MiB per channel per peer with LL128; PCIe has no LL128, and 16 channels of rings
    # and trees land at a few hundred MiB.
    extra_mib = (p2p.plan.nccl_gb - shm.plan.nccl_gb) * GB / MIB
    assert 100 < extra_mib < 600, extra_mib


def test_nccl_buffsize_and_channels_move_gpu_memory(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    def plan(**env: str) -> tuple[float, int]:
        n = node(seed_hw, kimi, TP8, {"NCCL_P2P_LEVEL": "SYS", **env})
        return n.plan.nccl_gb, n.plan.kv_tokens

    buffsizes = [plan(NCCL_BUFFSIZE=str(b)) for b in (131072, 1 << 20, 4 << 20, 16 << 20)]
    assert plan() == buffsizes[2]  # 4 MiB is the default
    channels = [plan(NCCL_MAX_NCHANNELS=str(c)) for c in (1, 2, 4, 8, 16)]
    assert plan() == channels[-1]  # 16 channels is the seed node's default
    for series in (buffsizes, channels):
        memory, kv = zip(*series, strict=True)
        assert all(a < b for a, b in itertools.pairwise(memory)), memory
        assert all(a > b for a, b in itertools.pairwise(kv)), kv
    # 16 MiB buffers on 16 channels cost about a GB per GPU: ~14k fewer tokens than the default.
    assert buffsizes[2][1] - buffsizes[3][1] > 10_000
    # Over shared memory, the buffers live in host memory: the same settings barely move GPU memory.
    shm_default = node(seed_hw, kimi, TP8).plan.nccl_gb
    shm_big = node(seed_hw, kimi, TP8, {"NCCL_BUFFSIZE": str(16 << 20)}).plan.nccl_gb
    assert shm_big == shm_default


def _nccl_gib(hw: HardwareProfile, model: ModelProfile, env: Mapping[str, str]) -> float:
    return node(hw, model, ["--tp-size", "2"], env).nccl.memory_gb() * GB / GIB


def test_fewer_channels_free_memory_on_the_scale_measured_on_h200(
    h200: HardwareProfile, llama: ModelProfile
) -> None:
    # nccl.md, 2x H200: NCCL_MAX_NCHANNELS=1 and NCCL_P2P_DISABLE=1 each freed 0.45 GiB.
    default = _nccl_gib(h200, llama, {})
    for env in ({"NCCL_MAX_NCHANNELS": "1"}, {"NCCL_P2P_DISABLE": "1"}):
        freed = default - _nccl_gib(h200, llama, env)
        assert 0.45 / 2 < freed < 0.45 * 2, (env, freed)


@pytest.mark.xfail(
    strict=True,
    reason="model bug: NcclModel.memory_gb charges NCCL_BUFFSIZE on 4 connections per channel "
    "(ring send/recv + tree up/down): 32 channels x 64 MiB adds ~7.8 GiB where nccl.md measured +1.97 GiB "
    "(about one buffer per channel)",
)
def test_large_nccl_buffers_cost_what_was_measured_on_h200(
    h200: HardwareProfile, llama: ModelProfile
) -> None:
    # nccl.md, 2x H200: NCCL_MIN_NCHANNELS=32, NCCL_BUFFSIZE=64 MiB took 3.40 GiB against 1.43 by default.
    added = _nccl_gib(h200, llama, {"NCCL_MIN_NCHANNELS": "32", "NCCL_BUFFSIZE": str(64 << 20)})
    added -= _nccl_gib(h200, llama, {})
    assert 1.97 / 1.5 < added < 1.97 * 1.5, added


# ---- speculation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_topk_1_forces_draft_tokens_to_steps_plus_one(
    seed_hw: HardwareProfile, kimi: ModelProfile, steps: int
) -> None:
    argv = [*TP8, *EAGLE3, "--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1"]
    spec = node(seed_hw, kimi, [*argv, "--speculative-num-draft-tokens", "9"]).spec
    assert spec is not None and (spec.topk, spec.num_draft_tokens) == (1, steps + 1)


def test_default_spec_is_the_model_profiles(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    spec = node(seed_hw, kimi, TP8 + EAGLE3).spec
    assert kimi.draft is not None and spec is not None
    assert (spec.num_steps, spec.topk, spec.num_draft_tokens) == kimi.draft.default_spec == (3, 1, 4)


@pytest.mark.parametrize(("topk", "draft_tokens"), [("1", "2"), ("4", "16")])
def test_accept_length_grows_with_steps_with_diminishing_returns(
    seed_hw: HardwareProfile, kimi: ModelProfile, topk: str, draft_tokens: str
) -> None:
    def accept(steps: int) -> float:
        argv = [*TP8, *EAGLE3, "--speculative-num-steps", str(steps), "--speculative-eagle-topk", topk]
        n = node(seed_hw, kimi, [*argv, "--speculative-num-draft-tokens", draft_tokens])
        assert n.accept_length is not None
        return n.accept_length

    lengths = [accept(steps) for steps in range(1, 7)]
    gains = [b - a for a, b in itertools.pairwise(lengths)]
    assert all(g > 0 for g in gains), lengths
    assert all(a > b for a, b in itertools.pairwise(gains)), gains
    assert 1 < lengths[0] and lengths[-1] < 7  # never more than steps + 1 tokens a step


def test_wider_trees_accept_more(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    def accept(topk: str) -> float:
        argv = [*TP8, *EAGLE3, "--speculative-num-steps", "3", "--speculative-eagle-topk", topk]
        n = node(seed_hw, kimi, [*argv, "--speculative-num-draft-tokens", "16"])
        assert n.accept_length is not None
        return n.accept_length

    assert accept("1") < accept("2") < accept("4") < accept("8")


@pytest.mark.parametrize("steps", [3, 6])
def test_tree_width_needs_draft_tokens_to_verify_it(
    seed_hw: HardwareProfile, kimi: ModelProfile, steps: int
) -> None:
    def accept(topk: int) -> float:
        argv = [*TP8, *EAGLE3, "--speculative-num-steps", str(steps), "--speculative-eagle-topk", str(topk)]
        n = node(seed_hw, kimi, [*argv, "--speculative-num-draft-tokens", str(steps + 1)])
        assert n.accept_length is not None
        return n.accept_length

    assert accept(8) <= accept(1) * 1.15  # the best `steps` nodes of a tree: a little above the chain


# ---- NCCL's parsing and transport ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "transport"),
    [
        ({}, "shm"),  # GPUs behind different host bridges: no P2P by default
        ({"NCCL_P2P_LEVEL": "PIX"}, "shm"),
        ({"NCCL_P2P_LEVEL": "PXB"}, "shm"),
        ({"NCCL_P2P_LEVEL": "PHB"}, "shm"),
        ({"NCCL_P2P_LEVEL": "SYS"}, "p2p"),
        ({"NCCL_P2P_LEVEL": "SYS", "NCCL_P2P_DISABLE": "1"}, "shm"),
        ({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}, "socket"),
        ({"NCCL_SHM_DISABLE": "1"}, "socket"),
    ],
)
def test_nccl_transport_on_the_seed_node(
    seed_hw: HardwareProfile, kimi: ModelProfile, env: dict[str, str], transport: str
) -> None:
    assert node(seed_hw, kimi, TP8, env).nccl.link()[0] == transport


def test_nccl_uses_p2p_over_nvlink_by_default(h200: HardwareProfile, llama: ModelProfile) -> None:
    assert node(h200, llama, TP8).nccl.link()[0] == "p2p"


def test_slower_transports_slow_the_verify_pass(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    def verify(env: dict[str, str]) -> float:
        return node(seed_hw, kimi, TP8 + EAGLE3, env).verify_allreduce_s(4)

    p2p = verify({"NCCL_P2P_LEVEL": "SYS"})
    shm = verify({})
    socket = verify({"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"})
    assert p2p < shm < socket


@pytest.mark.parametrize("level", ["sys", "BOGUS", "", "NVLINK"])
def test_unknown_p2p_level_is_ignored(seed_hw: HardwareProfile, kimi: ModelProfile, level: str) -> None:
    n = node(seed_hw, kimi, TP8, {"NCCL_P2P_LEVEL": level})
    assert n.settings.nccl.p2p_level is None
    assert n.nccl.link()[0] == "shm"
    assert n.plan == node(seed_hw, kimi, TP8).plan


@pytest.mark.parametrize("p2p", [{}, {"NCCL_P2P_LEVEL": "SYS"}], ids=["shm", "p2p"])
def test_non_numeric_nccl_numbers_become_zero_and_mean_unset(
    seed_hw: HardwareProfile, kimi: ModelProfile, p2p: dict[str, str]
) -> None:
    default = predict(seed_hw, kimi, TP8, p2p)
    for name in ("NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_BUFFSIZE"):
        p = predict(seed_hw, kimi, TP8, {**p2p, name: "abc"})  # strtoll("abc") == 0
        assert p.failure_phase is None
        assert p.node.nccl.channels() == seed_hw.nccl_default_channels
        assert p.node.settings.nccl.buffsize == 4 * MIB
        assert p.plan == default.plan
        assert p.output_throughput == default.output_throughput
    nccl = node(seed_hw, kimi, TP8, {"NCCL_MAX_NCHANNELS": "abc"}).settings.nccl
    assert nccl.max_channels == 0


@pytest.mark.parametrize(("value", "channels"), [("0", 16), ("1000", 16)])
def test_out_of_range_channel_counts_are_clamped(
    seed_hw: HardwareProfile, kimi: ModelProfile, value: str, channels: int
) -> None:
    n = node(seed_hw, kimi, TP8, {"NCCL_P2P_LEVEL": "SYS", "NCCL_MAX_NCHANNELS": value})
    assert n.nccl.channels() == channels
    assert n.startup_failure is None


# ---- run-to-run noise ----------------------------------------------------------------------------------


def test_noise_varies_by_seed_within_a_few_percent(seed_hw: HardwareProfile, kimi: ModelProfile) -> None:
    n = node(seed_hw, kimi, [*TP8, "--cuda-graph-max-bs", "128"])
    w = kimi.standard_workload

    def tok_s(seed: int, noise: float) -> float:
        result = run_workload(
            n, w.num_prompts, w.input_len, w.output_len, w.concurrency, seed=seed, noise=noise
        )
        return result.output_throughput

    exact = tok_s(0, 0.0)
    noisy = [tok_s(seed, 0.03) for seed in range(8)]
    assert len(set(noisy)) == len(noisy)
    assert all(abs(value / exact - 1) < 0.10 for value in noisy), (exact, noisy)
    assert tok_s(5, 0.03) == noisy[5]
    assert tok_s(5, 0.0) == tok_s(6, 0.0) == exact


def test_speculation_captures_its_own_batch_sizes_up_to_the_running_requests(
    seed_hw: HardwareProfile, kimi: ModelProfile
) -> None:
    # B4: the speculative list (server_args.py ~4950), clamped to the request pool (48 with speculation), so
    # even --cuda-graph-max-bs 512 at 0.93 captures nothing above 48 and does not run out of memory.
    p = predict(seed_hw, kimi, [*TP8, "--mem-fraction-static", "0.93", *EAGLE3, "--cuda-graph-max-bs", "512"])
    assert p.failure_phase is None
    assert p.plan.captured_batch_sizes == [*range(1, 9), *range(10, 33, 2), 40, 44, 48]
    capped = node(seed_hw, kimi, [*TP8, "--max-running-requests", "20", "--cuda-graph-max-bs", "512"])
    assert capped.plan.captured_batch_sizes == [1, 2, 4, 8, 12, 16, 20]


@pytest.mark.parametrize(
    ("steps", "topk", "draft", "fails"),
    [("1", "8", "16", True), ("2", "2", "8", True), ("2", "2", "7", False), ("3", "4", "16", False)],
)
def test_draft_tree_needs_enough_candidates_or_the_draft_capture_fails(
    h200: HardwareProfile, llama: ModelProfile, steps: str, topk: str, draft: str, fails: bool
) -> None:
    argv = [*TP8, *EAGLE3, "--speculative-num-steps", steps, "--speculative-eagle-topk", topk]
    p = predict(h200, llama, [*argv, "--speculative-num-draft-tokens", draft])
    if not fails:
        assert p.failure_phase is None
        return
    # A4: torch.topk(scores, draft - 1) over topk + (steps-1)*topk^2 candidates (speculative/eagle_utils.py
    # 106-110) inside the draft graph capture, wrapped as in eagle_draft_cuda_graph_runner.py:273-276.
    assert p.failure_phase == "capture"
    text = failure_text(p)
    assert "Exception: Capture cuda graph failed: selected index k out of range" in text
    assert "eagle_draft_cuda_graph_runner.py" in text
    # Without graphs the first draft forward fails the same way, at the warm-up request.
    eager = predict(h200, llama, [*argv, "--speculative-num-draft-tokens", draft, "--disable-cuda-graph"])
    assert eager.failure_phase == "warmup"
    assert eager.failure_line == "RuntimeError: selected index k out of range"


def test_auto_chunked_prefill_and_graph_max_bs_follow_sglangs_memory_table(
    h200: HardwareProfile, llama: ModelProfile
) -> None:
    # B3: server_args.py:4634-4690; the H200's 143 GB (136 Gi... MiB below 160 GiB): 8192 and 512 at TP 8.
    plan = node(h200, llama, TP8).plan
    assert (plan.chunked_prefill_size, plan.cuda_graph_max_bs) == (8192, 512)
    assert node(h200, llama, ["--tp-size", "2"]).plan.cuda_graph_max_bs == 256


def test_flashinfer_fusion_turns_itself_on_for_kimi_on_sm90(
    h200: HardwareProfile, kimi: ModelProfile, llama: ModelProfile, seed_hw: HardwareProfile
) -> None:
    # B8: arg_groups/overrides.py:1885-1907 lists KimiK25ForConditionalGeneration, not LlamaForCausalLM;
    # only on SM90/SM10X, so the seed's SM120 node does not fail for it.
    on = node(h200, kimi, TP8)
    assert on.flashinfer_fusion and on.notes == [
        "Auto-enabling FlashInfer AllReduce Fusion on SM90/SM10X for KimiK25ForConditionalGeneration"
    ]
    assert not node(h200, llama, TP8).flashinfer_fusion
    assert not node(h200, kimi, [*TP8, "--moe-a2a-backend", "deepep"]).flashinfer_fusion
    assert not node(seed_hw, kimi, TP8).flashinfer_fusion and node(seed_hw, kimi, TP8).startup_failure is None


def test_no_decode_graphs_no_graph_reserve(h200: HardwareProfile, llama: ModelProfile) -> None:
    # B2 (part): 0.5.17's `reserve_for_graph_mb` counts max_bs * 2 MB only for a decode graph
    # (server_args.py:4882-4890); on the H200 real SGLang gave 0.893 with graphs and 0.904 without.
    with_graphs = node(h200, llama, TP8).plan.mem_fraction_static
    without = node(h200, llama, [*TP8, "--cuda-graph-backend-decode", "disabled"]).plan.mem_fraction_static
    assert without - with_graphs == pytest.approx(512 * 2 / 141000, abs=0.001)
    assert node(h200, llama, [*TP8, "--disable-cuda-graph"]).plan.mem_fraction_static == without
