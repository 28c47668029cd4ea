"""The pre-flight memory check predicts only what certainly fails: checked against the model."""

from __future__ import annotations

import random

import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.sim.predict import predict
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.preflight import beyond_memory_edge, predicted_oom
from autotune.trial.launch import ServerLaunch

MFS = "--mem-fraction-static"


def test_the_seeds_055_is_predicted_and_a_roomy_pool_is_not() -> None:
    reason = predicted_oom([("--tp-size", "8"), (MFS, "0.55")], 96.0, 547.0)
    assert reason is not None and "68.4 GB per GPU" in reason and "52.8 GB" in reason
    assert predicted_oom([("--tp-size", "8"), (MFS, "0.85")], 96.0, 547.0) is None
    assert predicted_oom([("--tp", "8"), (MFS, "0.60")], 96.0, 547.0) is not None
    assert "Not enough memory" not in reason  # SGLang's wording before 0.5.15; not what it says now


def _tp(flags: list[tuple[str, str | None]]) -> int:
    return ServerLaunch(("sglang",), {}, "127.0.0.1", 30000, flags=tuple(flags)).tensor_parallel_size


@pytest.mark.parametrize("tp", ["--tp-size", "--tensor-parallel-size", "--tp"])
def test_every_spelling_of_the_tp_size_is_read(tp: str) -> None:
    # 0.5.17 server_args.py: --tp-size and its alias --tensor-parallel-size; --tp by argparse's prefix.
    assert _tp([(tp, "8"), (MFS, "0.85")]) == 8
    assert predicted_oom([(tp, "8"), (MFS, "0.85")], 96.0, 547.0) is None  # 68 GB of 82 GB


def test_the_last_tp_flag_wins_as_in_argparse() -> None:
    assert _tp([("--tp-size", "4"), ("--tensor-parallel-size", "8")]) == 8
    assert _tp([("--tensor-parallel-size", "8"), ("--tp", "2")]) == 2
    assert _tp([]) == 1


def test_nothing_is_predicted_without_the_facts_or_an_explicit_fraction() -> None:
    assert predicted_oom([("--tp-size", "8")], 96.0, 547.0) is None  # SGLang's own fraction fits the weights
    assert predicted_oom([(MFS, "0.1")], None, 547.0) is None
    assert predicted_oom([(MFS, "0.1")], 96.0, None) is None
    assert predicted_oom([(MFS, "lots")], 96.0, 547.0) is None


def test_it_never_rejects_a_launch_that_would_start() -> None:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    rng = random.Random(0)
    rejected = started_though_rejected = 0
    for _ in range(300):
        flags = [
            ("--tp-size", rng.choice(["4", "8"])),
            (MFS, f"{rng.uniform(0.5, 0.95):.2f}"),
            ("--cuda-graph-max-bs-decode", rng.choice(["32", "128", "512"])),
        ]
        argv = [word for pair in flags for word in pair]
        if predicted_oom(flags, hw.gpu_memory_gb, model.weight_gb) is None:
            continue
        rejected += 1
        answer = predict(hw, model, argv)
        if answer.failure_phase not in ("kv", "load"):  # SGLang's memory check, or weights over the GPU
            started_though_rejected += 1
    assert rejected > 50
    assert started_though_rejected == 0


def _oom_trial(number: int, fraction: float, kind: str = "oom_under_load", **attrs: object) -> FrozenTrial:
    """A trial as the study records one that ran out of memory on 'h200'."""
    params = {"--mem-fraction-static": fraction, "--cuda-graph-max-bs-decode": 256}
    distributions = {
        "--mem-fraction-static": FloatDistribution(0.6, 0.99, step=0.01),
        "--cuda-graph-max-bs-decode": CategoricalDistribution([None, 64, 256]),
    }
    trial = create_trial(
        state=TrialState.PRUNED,
        params=params,
        distributions=distributions,
        user_attrs={"failure_kind": kind, "hardware": "h200", **attrs},
    )
    trial.number = number
    return trial


def test_a_config_past_the_memory_edge_a_study_met_is_predicted_to_run_out_again() -> None:
    met = [_oom_trial(22, 0.97)]
    same = {"--mem-fraction-static": 0.97, "--cuda-graph-max-bs-decode": 256}
    reason = beyond_memory_edge(same, "h200", met)
    assert reason is not None and "trial 22 ran out of memory (oom_under_load)" in reason and "0.97" in reason
    assert beyond_memory_edge({**same, "--mem-fraction-static": 0.99}, "h200", met) is not None
    # Anything that might fit is left to the launch: less of the pool, other settings, other hardware.
    assert beyond_memory_edge({**same, "--mem-fraction-static": 0.96}, "h200", met) is None
    assert beyond_memory_edge({**same, "--cuda-graph-max-bs-decode": 64}, "h200", met) is None
    assert beyond_memory_edge(same, "l40s", met) is None
    assert beyond_memory_edge({**same, "--mem-fraction-static": None}, "h200", met) is None
    # Only a launch that met the edge marks it: not a prediction, nor the pool too small for the weights.
    assert beyond_memory_edge(same, "h200", [_oom_trial(3, 0.9, skipped=True)]) is None
    assert beyond_memory_edge(same, "h200", [_oom_trial(3, 0.9, kind="kv_pool_too_small")]) is None
    assert beyond_memory_edge(same, "h200", [_oom_trial(3, 0.9, kind="cuda_graph_oom")]) is not None


def test_a_startup_oom_holds_whatever_the_flags_that_act_only_when_serving() -> None:
    # A start-up failure happens before the scheduler takes a request: its policy, admission and streaming
    # cannot move it. Under load they might, so an OOM under load keeps them.
    def trial(kind: str) -> FrozenTrial:
        t = _oom_trial(1, 0.99, kind=kind)
        return create_trial(
            state=t.state,
            params={**t.params, "--schedule-conservativeness": 1.0},
            distributions={**t.distributions, "--schedule-conservativeness": FloatDistribution(0.3, 1.5)},
            user_attrs=t.user_attrs,
        )

    scheduled = {
        "--mem-fraction-static": 0.99,
        "--cuda-graph-max-bs-decode": 256,
        "--schedule-conservativeness": 1.3,
    }
    for kind in ("prefill_graph_oom", "cuda_graph_oom"):
        reason = beyond_memory_edge(scheduled, "h200", [trial(kind)])
        assert reason is not None and "the same start-up settings" in reason
        assert (
            beyond_memory_edge({**scheduled, "--cuda-graph-max-bs-decode": 64}, "h200", [trial(kind)]) is None
        )
    assert beyond_memory_edge(scheduled, "h200", [trial("oom_under_load")]) is None
