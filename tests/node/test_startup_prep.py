"""What the node adds to a launch for a cheaper start-up: its compile cache folder, and multithreaded
weight loading fitted to the host's free memory (read from the real /proc/meminfo and model folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.node.runner import LocalCommandRunner
from autotune.node.startup_prep import HostMemory, host_memory, loader_for_memory, prepare_launch
from autotune.trial.launch import ServerLaunch, TrialConfig, build_server_launch
from autotune.trial.startup import COMPILE_CACHE_ENV, DISABLE_MMAP_FLAG, LOADER_FLAG

THREADED = {"enable_multithread_load": True, "num_threads": 8}
GB = 10**9


def _launch(
    model: Path, loader: dict[str, object] | None, env: dict[str, str] | None = None, *, mapped: bool = True
) -> ServerLaunch:
    flags: dict[str, str | None] = {"--tp-size": "8", **({} if mapped else {DISABLE_MMAP_FLAG: None})}
    if loader is not None:
        flags[LOADER_FLAG] = json.dumps(loader)
    return build_server_launch(
        command=("python", "-m", "sglang.launch_server"),
        model_path=str(model),
        config=TrialConfig(),
        host="127.0.0.1",
        port=30000,
        base_flags=flags,
        base_env=env,
    )


def test_kimi_shards_fit_a_large_host_and_are_turned_down_on_a_small_one() -> None:
    shard = round(547 * GB / 64)  # the seed's 64 shards
    assert loader_for_memory(THREADED, 8, HostMemory(2000 * GB, shard)) == (THREADED, None)
    fewer, note = loader_for_memory(THREADED, 8, HostMemory(500 * GB, shard))
    assert fewer == {"enable_multithread_load": True, "num_threads": 4}  # 8 x 6 x 8.5 GB = 410 < 450
    assert note is not None and note.startswith("weight loading uses 4 threads instead of 8: 8 rank(s)")
    off, why = loader_for_memory(THREADED, 8, HostMemory(200 * GB, shard))
    assert off == {"enable_multithread_load": False}
    assert why == (
        "multithreaded weight loading left off: 8 rank(s) x (8 threads + 2) shards of 8.5 GB need 684 GB of "
        "host memory and 200 GB is free"
    )


@pytest.mark.integration
def test_a_shard_larger_than_the_node_leaves_threading_off_where_the_loader_reads_it_into_memory(
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    with (model / "model-00002-of-00002.safetensors").open("wb") as f:
        f.truncate(1 << 42)  # a sparse 4 TB file: 8 ranks x 3 of them outgrow any host
    runner = LocalCommandRunner()
    memory = host_memory(runner, str(model))
    assert memory is not None and memory.largest_shard_bytes == 1 << 42
    assert memory.checkpoint_bytes == 1000 + (1 << 42)
    # MemAvailable in bytes, past 2 GB where the machine has it (mawk's %d stops at 2**31 - 1)
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    available = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemAvailable:"))
    assert memory.available_bytes == pytest.approx(available, rel=0.2)
    launch, notes = prepare_launch(runner, _launch(model, THREADED, mapped=False), None)
    assert json.loads(launch.flag(LOADER_FLAG) or "") == {"enable_multithread_load": False}
    assert len(notes) == 1 and notes[0].startswith("multithreaded weight loading left off: 8 rank(s)")
    # SGLang's default maps the shards: their pages are the page cache's, the loader is left as it is
    launch, notes = prepare_launch(runner, _launch(model, THREADED), None)
    assert json.loads(launch.flag(LOADER_FLAG) or "") == THREADED and notes == []


@pytest.mark.integration
def test_small_shards_keep_the_loader_and_the_cache_folder_is_set_where_unset(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"x" * 1000)
    cache = tmp_path / "node" / "compile-cache"
    launch, notes = prepare_launch(
        LocalCommandRunner(), _launch(model, THREADED, {"TRITON_CACHE_DIR": "/mine"}), cache
    )
    assert notes == [] and json.loads(launch.flag(LOADER_FLAG) or "") == THREADED
    assert launch.env["TRITON_CACHE_DIR"] == "/mine"  # the user's own stands
    assert launch.env["SGLANG_CACHE_DIR"] == f"{cache}/sglang"
    assert launch.env["SGLANG_DG_CACHE_DIR"] == f"{cache}/deep_gemm"
    assert set(COMPILE_CACHE_ENV) <= set(launch.env)
    unchanged, _ = prepare_launch(LocalCommandRunner(), _launch(model, None), None)
    assert unchanged == _launch(model, None)  # no loader flag, no cache folder: nothing added


@pytest.mark.integration
def test_the_node_keeps_one_compile_cache_folder_and_the_second_launch_captures_warm(tmp_path: Path) -> None:
    """Two trials on one node, each a real simulated server: the node points SGLANG_CACHE_DIR (and the
    others) into its work folder, the first launch compiles there, the second finds it and captures its
    graphs in WARM_COMPILE_SHARE of the time (the log's own `elapsed=`)."""
    import sys

    from autotune.measure.client import Workload
    from autotune.node.executor import TrialExecutor
    from autotune.node.runner import free_port
    from autotune.sim.model.startup import WARM_COMPILE_SHARE
    from autotune.trial.wire import TrialRequest

    executor = TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=5)
    workload = Workload(num_prompts=2, input_len=100, output_len=8, concurrency=2)

    def run(number: int) -> dict[str, float]:
        port = free_port()
        argv = (sys.executable, "-m", "autotune.sim.sglang_server", "--model-path", "/models/Kimi-K2.5")
        argv += ("--tp-size", "8", "--host", "127.0.0.1", "--port", str(port))
        env = {"SGLANG_SIM_TIME_SCALE": "0.001"}
        result = executor.run(
            TrialRequest(number, ServerLaunch(argv, env, "127.0.0.1", port), workload, 60, 60)
        )
        assert result.ok, result.failure
        return result.startup_phases

    first, second = run(1), run(2)
    assert (tmp_path / "compile-cache" / "sglang").is_dir()
    assert second["cuda_graph_s"] == pytest.approx(first["cuda_graph_s"] * WARM_COMPILE_SHARE, abs=0.02)
