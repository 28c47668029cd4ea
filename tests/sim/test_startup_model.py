"""The simulated node's start-up from its published figures: cold disk against the page cache, the
multithreaded loader, and warm compile caches; a second launch on the same node finds what the first left."""

from __future__ import annotations

import pytest

from autotune.measure.client import Workload
from autotune.node.page_cache import SERVER_HOST_BYTES
from autotune.sim.model import LaunchSettings, NodePerformanceModel
from autotune.sim.model.startup import (
    PAGE_CACHE_SPEEDUP,
    PR_18124_SINGLE_S,
    PR_18124_THREADED_S,
    WARM_COMPILE_SHARE,
    load_threads,
    weights_fit_page_cache,
)
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import HardwareProfile, load_hardware_profile, load_model_profile
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import DISABLE_MMAP_FLAG
from autotune.trial.wire import TrialRequest, TrialResult

SEED_HW, SEED_MODEL = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
SHORT = Workload(num_prompts=8, input_len=200, output_len=32, concurrency=8)


def test_the_published_figures() -> None:
    assert PR_18124_SINGLE_S == 1486 and PR_18124_THREADED_S == 371  # 24m46s -> 6m11s
    assert PAGE_CACHE_SPEEDUP == pytest.approx(531 / 31)
    assert WARM_COMPILE_SHARE == pytest.approx((88 - 31) / (695 - 531))


def test_loader_threads_as_sglang_reads_its_extra_config() -> None:
    assert load_threads(None) == load_threads("{}") == 8  # multithreaded by default since SGLang PR 20289
    assert load_threads('{"enable_multithread_load": false}') == 1
    assert load_threads('{"enable_multithread_load": true, "num_threads": 32}') == 32


def test_seed_weights_cold_single_threaded_threaded_and_from_the_page_cache() -> None:
    def load(threads: int, cached: bool = False) -> float:
        node = NodePerformanceModel(SEED_HW, SEED_MODEL, LaunchSettings(tp_size=8, load_threads=threads))
        node.weights_cached = cached
        return node.load_seconds

    assert load(1) == pytest.approx(547 / 0.91)  # the seed's ten minutes
    assert load(8) == pytest.approx(load(1) / 4.0)  # PR 18124's ratio, assumed for the seed's disk
    assert load(4) == pytest.approx(load(1) / 2.5)
    assert load(64) == load(8)  # the disk is the limit past SGLang's 8 threads
    assert load(8, cached=True) == pytest.approx(load(1) * 31 / 531)


def _launch(model: str = "/models/kimi") -> ServerLaunch:
    argv = (
        "python",
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--tp-size",
        "8",
        "--port",
        "30000",
    )
    return ServerLaunch(argv, {}, "127.0.0.1", 30000)


def _phases(node: ModelNodeExecutor, number: int, compile_cache: bool = True) -> dict[str, float]:
    result = node.run(TrialRequest(number, _launch(), SHORT, 60, 60, compile_cache=compile_cache))
    assert result.ok, result.failure
    return result.startup_phases


def test_a_second_launch_reads_the_weights_from_the_page_cache_only_where_host_memory_holds_them() -> None:
    assert not weights_fit_page_cache(SEED_HW, SEED_MODEL)  # the seed profile's assumed 512 GB
    small = ModelNodeExecutor("n", SEED_HW, SEED_MODEL)
    assert (
        _phases(small, 1)["weight_load_s"] == _phases(small, 2)["weight_load_s"] == pytest.approx(150.3, 0.01)
    )
    large_hw = SEED_HW.model_copy(update={"host_memory_gb": 1024.0})
    large = ModelNodeExecutor("n", large_hw, SEED_MODEL)
    first, second = _phases(large, 1), _phases(large, 2)
    assert first["weight_load_s"] == pytest.approx(150.3, 0.01)
    assert second["weight_load_s"] == pytest.approx(35.1, 0.01)
    assert second["ready_s"] < first["ready_s"] - 100


def test_a_kept_compile_cache_makes_every_launch_after_the_first_capture_faster() -> None:
    node = ModelNodeExecutor("n", SEED_HW, SEED_MODEL)
    first, second = _phases(node, 1), _phases(node, 2)
    assert second["cuda_graph_s"] == pytest.approx(first["cuda_graph_s"] * WARM_COMPILE_SHARE, 0.01)
    without = ModelNodeExecutor("n", SEED_HW, SEED_MODEL)
    assert _phases(without, 1, compile_cache=False) == _phases(without, 2, compile_cache=False)


def test_the_node_fits_the_loaders_threads_to_the_host_memory_of_the_profile() -> None:
    """As the node does on a real one (startup_prep.fit_loader): told not to map its shards, SGLang's loader
    reads 8 ranks x (8 threads + 2) shards of 8.5 GB into memory, 684 GB, more than an idle 512 GB node has
    free, so autotune's loader flag gets 4 threads there; mapping them (its default) it keeps its 8."""
    command = ("python", "-m", "sglang.launch_server")
    loader = '{"enable_multithread_load": true, "num_threads": 8}'
    flags = (("--model-path", "/models/kimi"), ("--tp-size", "8"), ("--model-loader-extra-config", loader))
    mapped = ServerLaunch(command, {}, "127.0.0.1", 30000, flags=flags)
    read = ServerLaunch(command, {}, "127.0.0.1", 30000, flags=(*flags, (DISABLE_MMAP_FLAG, None)))

    def weight_load_s(hw: HardwareProfile, launch: ServerLaunch) -> float:
        result = ModelNodeExecutor("n", hw, SEED_MODEL).run(TrialRequest(1, launch, SHORT, 60, 60))
        assert result.ok, result.failure
        return result.startup_phases["weight_load_s"]

    assert weight_load_s(SEED_HW, read) == pytest.approx(547 / 0.91 / 2.5, 0.01)  # 4 threads
    assert weight_load_s(SEED_HW, mapped) == pytest.approx(150.3, 0.01)  # 8 threads
    large_hw = SEED_HW.model_copy(update={"host_memory_gb": 1024.0})
    assert weight_load_s(large_hw, read) == pytest.approx(150.3, 0.01)


def test_the_page_cache_step_keeps_what_fits_beside_the_loaders_and_its_seconds_are_node_time() -> None:
    """The seed's node with presharded weights (autotune.node.page_cache's rule on the model's files): 0.8
    of the idle node's 491 GB less the 8 ranks' own processes' memory is kept, 0.68 of the 547 GB, in dump
    files sized within a tenth of MemAvailable; the step reads it from disk before the first launch that
    reads the dump, from memory before every later one."""
    command = ("python", "-m", "sglang.launch_server")
    loader = '{"enable_multithread_load": true, "num_threads": 8}'
    flags = (("--model-path", "/models/kimi"), ("--tp-size", "8"), ("--model-loader-extra-config", loader))
    launch = ServerLaunch(command, {}, "127.0.0.1", 30000, flags=flags)

    def launches(keep: bool) -> list[TrialResult]:
        node = ModelNodeExecutor("n", SEED_HW, SEED_MODEL)
        requests = [
            TrialRequest(n, launch, SHORT, 60, 60, presharded_weights=True, weights_in_page_cache=keep)
            for n in (1, 2, 3)
        ]
        return [node.run(request) for request in requests]

    without, kept = launches(False), launches(True)
    assert all(r.ok for r in (*without, *kept))
    assert all("page_cache_s" not in r.startup_phases for r in without)
    dump_read = without[2].startup_phases["weight_load_s"]  # each rank its share, from disk
    kept_share = (0.8 * 491.52 - 8 * SERVER_HOST_BYTES / 1e9) / 547
    from_memory = 547 / 0.91 / PAGE_CACHE_SPEEDUP
    expected = kept_share * from_memory + (1 - kept_share) * dump_read
    assert kept[2].startup_phases["weight_load_s"] == pytest.approx(expected, rel=0.02)
    assert kept[1].startup_phases["page_cache_s"] > 5 * kept[2].startup_phases["page_cache_s"]  # disk, memory
    for step in kept[1:]:  # node time: the launch's and the step's
        phases = step.startup_phases
        assert step.node_seconds == pytest.approx(
            phases["ready_s"] + phases["page_cache_s"] + (step.benchmark_s or 0.0), abs=0.1
        )
    assert (kept[2].node_seconds or 0.0) < (without[2].node_seconds or 0.0) - 40  # each launch from there on
