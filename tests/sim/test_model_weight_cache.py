"""The weight cache on the model node (no process): the node's rule with a daemon's costs modelled, which
benchmarks/weight_cache_hours.py counts node hours with."""

from __future__ import annotations

import pytest

from autotune.measure.client import Workload
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest, TrialResult

WORKLOAD = Workload(num_prompts=8, input_len=512, output_len=32, concurrency=4)


def _run(
    node: ModelNodeExecutor, number: int, *flags: tuple[str, str | None], cache: bool = True
) -> TrialResult:
    base = (("--model-path", "/models/m"), ("--tp-size", "8"), *flags, ("--port", "30000"))
    launch = ServerLaunch(("python", "-m", "sglang.launch_server"), {}, "127.0.0.1", 30000, flags=base)
    result = node.run(TrialRequest(number, launch, WORKLOAD, 600, 600, weight_cache=cache))
    assert result.ok, result.failure
    return result


def test_clients_load_in_ipc_time_with_the_disk_pool_and_the_daemon_is_counted() -> None:
    hw, model = load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    plain, cached = ModelNodeExecutor("p", hw, model), ModelNodeExecutor("c", hw, model)
    f85, f80 = ("--mem-fraction-static", "0.85"), ("--mem-fraction-static", "0.8")
    spec = ("--speculative-algorithm", "EAGLE3")
    runs = [(f85,), (f85,), (f80,), (f80, spec), (f85,)]
    disk = [_run(plain, i, *flags, cache=False) for i, flags in enumerate(runs)]
    served = [_run(cached, i, *flags) for i, flags in enumerate(runs)]
    assert [r.startup_phases["weight_load_s"] for r in served] == [
        disk[0].startup_phases["weight_load_s"],
        0.07,
        0.07,
        disk[3].startup_phases["weight_load_s"],
        0.07,
    ]
    for one, other in zip(served, disk, strict=True):  # the same pool as from disk (f' applied)
        assert one.server_memory["kv_cache_tokens"] == pytest.approx(
            other.server_memory["kv_cache_tokens"], rel=2e-3
        )
    started = [i for i, r in enumerate(served) if any("daemon started" in n for n in r.startup_notes)]
    assert started == [1, 4]  # again after the speculative launch stopped it
    for i in started:  # the daemon's init and whole load (no page cache on this profile) are that trial's
        assert (served[i].node_seconds or 0) > (disk[i].node_seconds or 0)
    assert (served[2].node_seconds or 0) < (disk[2].node_seconds or 0) - 0.9 * disk[2].startup_phases[
        "weight_load_s"
    ]
    assert any("speculative decoding" in n for n in served[3].startup_notes)


def test_a_quantized_model_is_refused_once_and_loads_from_disk() -> None:
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    node = ModelNodeExecutor("k", hw, model)
    first, second, third = (_run(node, i, ("--mem-fraction-static", "0.85")) for i in range(3))
    assert "refused this model: its quantization 'compressed-tensors'" in " ".join(second.startup_notes)
    assert second.startup_phases["weight_load_s"] == first.startup_phases["weight_load_s"]
    assert "refused this model" in " ".join(third.startup_notes)
    assert not any("daemon started" in n for n in third.startup_notes)
