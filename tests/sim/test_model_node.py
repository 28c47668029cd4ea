"""The model-backed node fails as the real node does: same failure kinds and culprits, from the same lines.

Benchmarks of the tuner run thousands of trials on `ModelNodeExecutor`; the outcome rules (OOM pruned,
unsupported remembered) are only the product's if its failures are classified as a real node classifies
the simulated server's log.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from autotune.measure.client import Workload
from autotune.node.executor import TrialExecutor
from autotune.node.runner import LocalCommandRunner, free_port
from autotune.sim.model import LaunchSettings, NodePerformanceModel
from autotune.sim.model_node import ModelNodeExecutor, startup_seconds
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest

SEED_HW, SEED_MODEL = "rtx-pro-6000-pcie-x8", "kimi-k2.5-int4"
LONG = Workload(num_prompts=2, input_len=28000, output_len=8, concurrency=2)  # the seed's prompt length
BASE = ("--model-path", "/models/Kimi-K2.5", "--tp-size", "8")
EAGLE = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "/models/Kimi-K2.5-EAGLE3")
CASES = {
    "flashinfer fusion on SM120": (("--enable-flashinfer-allreduce-fusion",), FailureKind.UNSUPPORTED),
    "expert parallel on SM120": (("--ep-size", "8"), FailureKind.UNSUPPORTED),
    "weights leave no KV pool": (("--mem-fraction-static", "0.70"), FailureKind.KV_POOL_TOO_SMALL),
    # With EAGLE the graphs stop at 48 running requests (B4), so only a plain launch overflows at capture.
    "graphs do not fit": (
        ("--mem-fraction-static", "0.95", "--cuda-graph-max-bs-decode", "1024"),
        FailureKind.CUDA_GRAPH_OOM,
    ),
    "prompt longer than the KV pool": (("--mem-fraction-static", "0.78"), FailureKind.KV_POOL_TOO_SMALL),
}


def launch(flags: tuple[str, ...], port: int = 30000, program: tuple[str, ...] = ()) -> ServerLaunch:
    argv = (*program, *BASE, *flags, "--host", "127.0.0.1", "--port", str(port))
    return ServerLaunch(command=argv, env={"SGLANG_SIM_TIME_SCALE": "0.001"}, host="127.0.0.1", port=port)


def model_node() -> ModelNodeExecutor:
    return ModelNodeExecutor("model", load_hardware_profile(SEED_HW), load_model_profile(SEED_MODEL))


@pytest.mark.parametrize("case", list(CASES))
def test_the_model_node_classifies_each_failure_by_its_kind(case: str) -> None:
    flags, kind = CASES[case]
    result = model_node().run(TrialRequest(1, launch(flags), LONG, 60, 60))
    assert result.failure is not None and result.failure.kind is kind, result.failure
    if kind is FailureKind.UNSUPPORTED:
        assert flags[0] in result.failure.culprits


@pytest.mark.integration
@pytest.mark.parametrize("case", list(CASES))
def test_the_real_node_agrees_on_the_simulated_server(case: str, tmp_path: Path) -> None:
    flags, _ = CASES[case]
    server = launch(flags, free_port(), (sys.executable, "-m", "autotune.sim.sglang_server"))
    real = TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=5).run(
        TrialRequest(1, server, LONG, 60, 60)
    )
    modelled = model_node().run(TrialRequest(1, launch(flags), LONG, 60, 60))
    assert real.failure is not None and modelled.failure is not None
    assert (modelled.failure.kind, modelled.failure.culprits) == (real.failure.kind, real.failure.culprits)


def test_node_time_is_the_model_start_up_until_ready_or_failed_plus_the_benchmark() -> None:
    hardware, model = load_hardware_profile(SEED_HW), load_model_profile(SEED_MODEL)
    node = model_node()
    ok = node.run(TrialRequest(1, launch(()), LONG, 60, 60))
    baseline = NodePerformanceModel(hardware, model, LaunchSettings(tp_size=8))
    assert ok.ok and ok.startup_s == pytest.approx(
        baseline.init_seconds
        + baseline.load_seconds
        + baseline.prefill_capture_seconds  # the prefill graphs are captured first (B12)
        + baseline.capture_seconds
    )
    assert ok.benchmark is not None and ok.benchmark_s == pytest.approx(ok.benchmark.duration_s)

    no_kv = node.run(TrialRequest(2, launch(("--mem-fraction-static", "0.70")), LONG, 60, 60))
    assert no_kv.startup_s == pytest.approx(baseline.init_seconds + baseline.load_seconds)  # after the load
    assert no_kv.benchmark_s is None
    unsupported = node.run(TrialRequest(3, launch(("--ep-size", "8")), LONG, 60, 60))
    assert unsupported.startup_s == pytest.approx(baseline.init_seconds)  # dies as the load begins
    # Ten minutes of weights before anything else with the seed's single-threaded loader; SGLang 0.5.17's
    # default 8 threads read them 4x faster on this node (its profile's figure, from SGLang PR 18124).
    assert (
        startup_seconds(NodePerformanceModel(hardware, model, LaunchSettings(tp_size=8, load_threads=1)))
        > 600
    )
    assert baseline.load_seconds == pytest.approx(601.1 / 4, rel=0.01)


def test_a_request_rate_is_played_as_arrivals_and_its_slo_attainment_falls_past_the_nodes_capacity() -> None:
    """Before, the model node sent every request at once whatever the rate: no max_load search could run."""
    from autotune.measure.workloads import Slo

    h200, llama = load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    node = ModelNodeExecutor("model", h200, llama)
    server = ServerLaunch(("--model-path", "/models/Llama-70B", "--tp-size", "8"), {}, "127.0.0.1", 30000)

    def at(rate: float | None) -> tuple[float, float, float, float]:
        workload = Workload(
            num_prompts=80, input_len=2000, output_len=500, concurrency=64, warmup_requests=0,
            request_rate=rate, slo=Slo(ttft_ms=1500, tpot_ms=30),
        )  # fmt: skip
        result = node.run(TrialRequest(0, server, workload, 60, 60))
        b = result.benchmark
        assert b is not None and result.benchmark_s is not None
        return b.output_throughput, b.mean_ttft_ms, b.slo_attainment or 0.0, result.benchmark_s

    slow, fast, flood = at(1.0), at(32.0), at(None)
    # One request a second: each is served alone, about as fast as it arrives, and every one meets the SLO.
    assert slow[2] == 1.0 and slow[1] < 200
    assert 75 < slow[3] < 100  # the arrivals' 80 s or so, and the last answer
    assert slow[0] * slow[3] == pytest.approx(80 * 500, rel=0.01)  # every token, over that time
    # Past the node's capacity requests queue: the first token waits, and the attainment falls.
    assert fast[2] < 0.9 and fast[1] > 3 * slow[1]
    assert fast[0] == pytest.approx(flood[0], rel=0.02)  # saturated: the same tok/s as all at once
