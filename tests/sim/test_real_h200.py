"""The simulated H200 held to real SGLang 0.5.17: the real studies' stores after their third session
(`benchmarks/sglang-h200/run3`), their logged step costs, memory and objective beside the model's, and the
mechanisms the real logs showed.

`benchmarks/sglang-h200/sim_vs_real.py` prints the same comparison; RESULTS-sglang-h200.md has its tables.
"""

from __future__ import annotations

import sys

import pytest
from optuna.trial import FixedTrial, TrialState

from autotune.config import load_study
from autotune.sim.model import NodePerformanceModel
from autotune.sim.predict import predict, settings_for
from autotune.sim.profiles import HardwareProfile, ModelProfile, load_hardware_profile, load_model_profile
from autotune.sim.server.options import resolved_server_args
from autotune.sim.server_args import build_parser
from autotune.study.enqueue import plan_all, requests_from_file
from autotune.study.preflight import beyond_memory_edge
from autotune.study.records import HARDWARE_ATTR
from tests.builders import REPO

sys.path.insert(0, str(REPO / "benchmarks" / "sglang-h200"))

from sim_vs_real import GIB_PER_GB, TrialRow, agreement, compare, step_costs, unpacked

STORES = REPO / "benchmarks" / "sglang-h200" / "run3" / "study.tar.gz"  # both studies
STUDY = REPO / "examples" / "sglang-h200.yaml"
HELD = ["--load-format", "dummy", "--attention-backend", "triton"]  # the study's fixed flags
# Lines 119-130 of run 2's trial-0000/server.log (real SGLang 0.5.17): the end of a wave's prefill, its
# decode, and the next wave's first prefill.
REAL_LINES = """\
[2026-12-01 15:10:09] Prefill batch, #new-seq: 8, #new-token: 8192, #cached-token: 0, token usage: 0.06, #running-req: 42, #queue-req: 6, #pending-token: 14336, cuda graph: True, input throughput (token/s): 42075.51
[2026-12-01 15:10:09] Prefill batch, #new-seq: 8, #new-token: 8192, #cached-token: 0, token usage: 0.07, #running-req: 50, #queue-req: 0, #pending-token: 6144, cuda graph: True, input throughput (token/s): 42712.69
[2026-12-01 15:10:09] Prefill batch, #new-seq: 6, #new-token: 6144, #cached-token: 0, token usage: 0.07, #running-req: 58, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 42226.82
[2026-12-01 15:10:10] Decode batch, #running-req: 64, #token: 65995, token usage: 0.07, cuda graph: True, gen throughput (token/s): 133.78, #queue-req: 0
[2026-12-01 15:10:10] Decode batch, #running-req: 64, #token: 68555, token usage: 0.07, cuda graph: True, gen throughput (token/s): 7611.82, #queue-req: 0
[2026-12-01 15:10:10] Decode batch, #running-req: 64, #token: 71115, token usage: 0.08, cuda graph: True, gen throughput (token/s): 7529.23, #queue-req: 0
[2026-12-01 15:10:11] Decode batch, #running-req: 64, #token: 73675, token usage: 0.08, cuda graph: True, gen throughput (token/s): 7390.22, #queue-req: 0
[2026-12-01 15:10:11] Decode batch, #running-req: 64, #token: 76235, token usage: 0.08, cuda graph: True, gen throughput (token/s): 7306.31, #queue-req: 0
[2026-12-01 15:10:11] Decode batch, #running-req: 64, #token: 78795, token usage: 0.09, cuda graph: True, gen throughput (token/s): 7207.01, #queue-req: 0
[2026-12-01 15:10:12] Decode batch, #running-req: 64, #token: 80074, token usage: 0.09, cuda graph: True, gen throughput (token/s): 7079.42, #queue-req: 0
[2026-12-01 15:10:12] Prefill batch, #new-seq: 1, #new-token: 1024, #cached-token: 0, token usage: 0.09, #running-req: 63, #queue-req: 0, #pending-token: 0, cuda graph: True, input throughput (token/s): 469.60
"""  # noqa: E501
# What real 0.5.17 captured with --cuda-graph-max-bs-prefill 4096 (run 1, trial 16's server_args line).
REAL_PREFILL_GRAPHS_4096 = [
    *range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
    *range(1280, 4097, 256),
]  # fmt: skip


@pytest.fixture(scope="module")
def h200() -> HardwareProfile:
    return load_hardware_profile("h200-x1")


@pytest.fixture(scope="module")
def llama8b() -> ModelProfile:
    return load_model_profile("llama-8b-dummy")


@pytest.fixture(scope="module")
def rows(h200: HardwareProfile, llama8b: ModelProfile) -> list[TrialRow]:
    return compare(STORES, load_study(STUDY), h200, llama8b)


def node(hw: HardwareProfile, model: ModelProfile, *argv: str) -> NodePerformanceModel:
    return NodePerformanceModel(hw, model, settings_for([*HELD, *argv], {}))


def test_only_intervals_where_one_batch_ran_alone_are_step_costs() -> None:
    costs = step_costs(REAL_LINES)
    # The first prefill line follows nothing known; the wave's first decode line and the next wave's
    # prefill include the other kind's time; the last decode line lost requests mid-interval.
    assert [tokens for tokens, _ in costs.prefill] == [8192, 6144]
    assert costs.prefill[0][1] == pytest.approx(8192 / 42712.69)
    assert len(costs.decode) == 5
    first = costs.decode[0]
    assert (first.batch, first.context_tokens, first.in_graph) == (64, 68555 - 64 * 20, True)
    assert first.step_s == pytest.approx(64 / 7611.82)


# An eager decode step waits on the host's CPU, not the GPU: trial 7 re-ran trial 1's config on the next
# session's lease of the machine and its eager steps took 32.9 ms where trial 1's took 21.7 (run 1's, 29).
# The profile holds one host; which host a lease gets is not in any config.
OTHER_HOST_EAGER = {7}
# Trial 29 ran on the fourth session's second machine, whose prefill ran at 44.1k tok/s where every other
# lease's ran at 42.1-43.0k for the same chunks (its decode steps matched the others'); the profile holds one.
OTHER_GPU_PREFILL = {29}


def test_the_model_steps_as_real_sglang_did(rows: list[TrialRow]) -> None:
    checked = 0
    for row in rows:
        if (prefill := row.prefill_rates()) is not None and row.number not in OTHER_GPU_PREFILL:
            assert prefill[1] == pytest.approx(prefill[0], rel=0.03), (row.number, "prefill", prefill)
        for in_graph, tolerance in ((True, 0.03), (False, 0.05)):
            decode = row.decode_steps(in_graph)
            if decode is not None and (in_graph or row.number not in OTHER_HOST_EAGER):
                assert decode[1] == pytest.approx(decode[0], rel=tolerance), (row.number, in_graph, decode)
                checked += 1
    assert checked == 26  # 25 trials decoded in graphs (two at batch 32), one eagerly


def test_the_model_allocates_what_real_sglang_did(rows: list[TrialRow]) -> None:
    # Every trial that got as far as its KV pool: not trial 21, cut off by the end of a session as it
    # started; trial 30, cut off during its graph capture, has its KV pool and not what the graphs left.
    started = [row for row in rows if row.number != 21]
    assert len(started) == 30
    for row in started:
        assert row.costs is not None and row.costs.kv_tokens is not None
        plan = row.node.plan
        assert plan.kv_tokens == pytest.approx(row.costs.kv_tokens, rel=0.03), row.number
        if row.number == 30:
            continue
        assert row.costs.available_gib is not None
        assert plan.avail_after_graph_gb * GIB_PER_GB == pytest.approx(row.costs.available_gib, abs=1.5)


def test_the_simulated_objective_is_the_real_one(rows: list[TrialRow]) -> None:
    completed = [r for r in rows if r.real]
    assert len(completed) == 27
    for row in completed:
        if row.number not in OTHER_HOST_EAGER:
            assert row.real is not None and row.sim == pytest.approx(row.real, rel=0.03), row.number
    summary = agreement(rows)
    assert summary is not None and summary[2] < 0.02
    # The configs whose real values stand out of the noise (eager decode twice, 32 requests at a time
    # twice) are the four lowest in both.
    lowest_real = sorted(completed, key=lambda r: r.real or 0.0)[:4]
    lowest_sim = sorted(completed, key=lambda r: r.sim)[:4]
    assert {r.number for r in lowest_real} == {r.number for r in lowest_sim} == {1, 7, 18, 27}


def test_an_eager_decode_step_waits_on_the_host_whatever_the_batch(
    h200: HardwareProfile, llama8b: ModelProfile
) -> None:
    n = node(h200, llama8b, "--cuda-graph-max-bs-decode", "16")
    host_s = llama8b.num_layers * llama8b.kernels_per_layer * h200.eager_op_us * 1e-6
    overhead_s = llama8b.step_overhead_ms * 1e-3

    def sampling_s(batch: int) -> float:  # after the forward, per request
        return batch * llama8b.sampling_us_per_request * 1e-6

    small, large = n.decode_step_s(24, 24 * 1200), n.decode_step_s(128, 128 * 1200)
    assert small == pytest.approx(host_s + overhead_s + sampling_s(24))
    assert large == pytest.approx(host_s + overhead_s + sampling_s(128))
    assert n.decode_step_s(16, 16 * 1200) < small / 3  # the same batch size replayed from a graph
    # Where the GPU's own work is longer than the host's dispatch, the host hides behind it.
    huge_context = 256 * 8000
    in_graph = node(h200, llama8b).decode_step_s(256, huge_context)
    assert in_graph > small and n.decode_step_s(256, huge_context) == pytest.approx(in_graph)


def test_without_a_measured_host_an_eager_step_pays_a_launch_per_kernel() -> None:
    # The seed's profile has no eager_op_us: its calibration charges each eager kernel's launch.
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    assert hw.eager_op_us == 0
    n = NodePerformanceModel(hw, model, settings_for(["--tp-size", "8"], {}))
    launches_s = model.num_layers * model.kernels_per_layer * hw.kernel_launch_us * 1e-6
    eager, in_graph = n.forward_s(2, 56000, in_graph=False), n.forward_s(2, 56000, in_graph=True)
    eager_ar_s = 122 * (2 * hw.kernel_launch_us + hw.proxy_wait_us) * 1e-6  # launches, NCCL's proxy over shm
    assert eager - in_graph == pytest.approx(launches_s + eager_ar_s)


def test_a_prefill_batch_within_the_prefill_graphs_is_replayed() -> None:
    hw, model = load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    launches_s = model.num_layers * model.kernels_per_layer * hw.kernel_launch_us * 1e-6
    with_graphs = NodePerformanceModel(hw, model, settings_for(["--tp-size", "8"], {}))
    without = NodePerformanceModel(
        hw, model, settings_for(["--tp-size", "8", "--cuda-graph-backend-prefill", "disabled"], {})
    )
    assert max(with_graphs.plan.prefill_graph_sizes) == 8192
    eager_ar_s = 160 * 2 * hw.kernel_launch_us * 1e-6  # an eager all-reduce's two launches, 160 of them
    gap = without.prefill_step_s(4096, 4096) - with_graphs.prefill_step_s(4096, 4096)
    assert gap == pytest.approx(launches_s + eager_ar_s)
    smaller = NodePerformanceModel(
        hw, model, settings_for(["--tp-size", "8", "--cuda-graph-max-bs-prefill", "2048"], {})
    )
    assert smaller.prefill_step_s(4096, 4096) == pytest.approx(without.prefill_step_s(4096, 4096))


def test_cuda_graph_max_bs_prefill_sets_the_largest_prefill_graph(
    h200: HardwareProfile, llama8b: ModelProfile
) -> None:
    argv = [*HELD, "--model-path", "/tmp/model-8b", "--cuda-graph-max-bs-prefill", "4096"]
    n = NodePerformanceModel(h200, llama8b, settings_for(argv, {}))
    assert n.plan.prefill_graph_sizes == REAL_PREFILL_GRAPHS_4096
    args = resolved_server_args(build_parser().parse_args(argv), n, seed=0)
    assert args["cuda_graph_config"].prefill.max_bs == 4096
    # Breakable prefill graphs hold their largest graph's activations: half the tokens, less memory.
    default = node(h200, llama8b)
    assert n.plan.prefill_graph_gb < default.plan.prefill_graph_gb
    assert default.plan.prefill_graph_gb * GIB_PER_GB == pytest.approx(1.38, abs=0.1)  # real: 1.38 GiB


def test_each_request_of_a_decode_step_adds_its_sampling(
    h200: HardwareProfile, llama8b: ModelProfile
) -> None:
    # Real 0.5.17 in CUDA graphs: 6.09 ms at batch 32 (trial 18), 8.41 ms at batch 64 (trial 0), each at its
    # own context; the KV each reads explains 1.7 of the 2.3 ms between them, the rest is per request.
    n = node(h200, llama8b)
    assert n.decode_step_s(32, 34_562) == pytest.approx(32 / 5253.05, rel=0.03)
    assert n.decode_step_s(64, 68_555 - 64 * 20) == pytest.approx(64 / 7611.82, rel=0.03)
    without = llama8b.model_copy(update={"sampling_us_per_request": 0.0})
    with_sampling = n.decode_step_s(32, 34_562)
    assert node(h200, without).decode_step_s(32, 34_562) == pytest.approx(with_sampling - 32 * 20e-6)


def test_the_memory_edge_configs_are_valid_for_the_real_study_and_fail_as_they_did(
    h200: HardwareProfile, llama8b: ModelProfile, rows: list[TrialRow]
) -> None:
    # device_run.sh queued them into the real study: a config the study would refuse wastes device time.
    study = load_study(STUDY)
    edge = REPO / "benchmarks" / "sglang-h200" / "memory-edge.yaml"
    queued = plan_all(study, requests_from_file(edge, study.search_space), None)
    fractions = [entry.params["--mem-fraction-static"] for entry in queued]
    assert fractions == [0.99, 0.98]
    assert all(entry.params["--cuda-graph-max-bs-decode"] is None for entry in queued)  # SGLang's graphs
    # Real 0.5.17 (trials 22 and 23): under 4 GiB free after the KV pool it dropped its prefill graphs at
    # both, so neither failed at start-up; 0.99 left 0.89 GiB and ran out of memory on the first 8192-token
    # prefill, 0.98 left 2.26 GiB and served. The model without the gate had a start-up failure at 0.99.
    by_number = {row.number: row for row in rows}
    assert by_number[22].state == "PRUNED" and by_number[23].real
    at_099 = predict(h200, llama8b, [*HELD, "--mem-fraction-static", "0.99"])
    assert at_099.failure_phase is None and at_099.plan.prefill_graph_dropped_at_gb is not None
    assert at_099.result is not None and at_099.result.oom_lines
    at_098 = predict(h200, llama8b, [*HELD, "--mem-fraction-static", "0.98"])
    assert at_098.plan.prefill_graph_dropped_at_gb is not None
    assert at_098.result is not None and not at_098.result.oom_lines and at_098.output_throughput > 0


STARTUP_OOM_STUDY = REPO / "examples" / "sglang-h200-startup-oom.yaml"


@pytest.fixture(scope="module")
def startup_oom_rows(h200: HardwareProfile, llama8b: ModelProfile) -> list[TrialRow]:
    return compare(STORES, load_study(STARTUP_OOM_STUDY), h200, llama8b)


def test_the_startup_oom_config_failed_at_startup_as_the_model_predicts(
    h200: HardwareProfile, llama8b: ModelProfile, startup_oom_rows: list[TrialRow]
) -> None:
    # benchmarks/sglang-h200/startup-oom.yaml, queued into its own study: 0.99 with the breakable prefill
    # backend set by hand, which skips 0.5.17's 4 GiB gate.
    study = load_study(STARTUP_OOM_STUDY)
    configs = REPO / "benchmarks" / "sglang-h200" / "startup-oom.yaml"
    (entry,) = plan_all(study, requests_from_file(configs, study.search_space), None)
    assert entry.params["--cuda-graph-backend-prefill"] == "breakable"
    launch = study.server_launch(study.search_space.suggest(FixedTrial(dict(entry.params), 1)))
    p = predict(h200, llama8b, launch.argv[len(study.file.server.command) :], launch.env)
    assert p.failure_phase == "prefill_capture" and "CUDA out of memory" in (p.failure_line or "")
    # Real (trial 1): the KV pool as the model plans it, then the first prefill shape (8192 tokens) met
    # the 1.10 GiB left and the start failed: pruned. The run's driver named it cuda_graph_oom; its log
    # is tests/data/sglang-0.5.17-h200/prefill-capture-oom-breakable.log, now prefill_graph_oom.
    by_number = {row.number: row for row in startup_oom_rows}
    oom = by_number[1]
    assert oom.state == "PRUNED" and oom.costs is not None and oom.costs.available_gib is None
    assert oom.node.plan.kv_tokens == pytest.approx(oom.costs.kv_tokens, rel=0.03)
    # Real: "Memory pool end. avail mem=1.24 GB", then 1.10 at the capture (the eager runner's buffers,
    # which the model does not hold).
    assert oom.node.plan.avail_after_kv_gb * GIB_PER_GB == pytest.approx(1.24, abs=0.2)
    # Every other trial served, and the model's value is the real one within 3%.
    served = [row for row in startup_oom_rows if row.real]
    assert [row.number for row in served] == [2, 3, 4, 5, 6]
    for row in served:
        assert row.real is not None and row.sim == pytest.approx(row.real, rel=0.03), row.number


def test_the_real_startup_oom_marks_its_region_whatever_the_scheduler_flags() -> None:
    # The real study's trials as Optuna stored them: past trial 1's fraction with the breakable backend
    # nothing can start, whatever the conservativeness (it acts only once the server serves).
    with unpacked(STORES, "sglang-h200-startup-oom") as (_, trials):
        (met,) = [t for t in trials if t.state == TrialState.PRUNED]
        hardware = met.user_attrs[HARDWARE_ATTR]
        edge = {"--mem-fraction-static": 0.99, "--cuda-graph-backend-prefill": "breakable"}
        for conservativeness in (0.3, 1.0, 1.5):
            reason = beyond_memory_edge(
                {**edge, "--schedule-conservativeness": conservativeness}, hardware, trials
            )
            assert reason is not None and f"trial {met.number} ran out of memory" in reason
        # A lower fraction, or the backend SGLang gates itself, is left to the launch.
        assert beyond_memory_edge({**edge, "--mem-fraction-static": 0.98}, hardware, trials) is None
        assert beyond_memory_edge({**edge, "--cuda-graph-backend-prefill": None}, hardware, trials) is None
        # The trials that followed it on the real machine stayed out of that region.
        after = [t for t in trials if t.number > met.number and t.state == TrialState.COMPLETE]
        assert len(after) == 5
        assert all(beyond_memory_edge(t.params, hardware, [met]) is None for t in after)
