"""One trial on one node, for real: the simulated server launched, watched, benchmarked and torn down."""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from autotune.measure.client import Workload
from autotune.node.executor import TrialExecutor
from autotune.node.runner import LocalCommandRunner, _group_members, free_port, port_is_free
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest, TrialResult
from tests.builders import SIM_SEED_ARGV, StudyFiles, e2e_study

SERVER = SIM_SEED_ARGV
SMALL = Workload(num_prompts=4, input_len=1000, output_len=32, concurrency=2)


def request(
    *flags: str,
    env: dict[str, str] | None = None,
    startup_s: float = 30,
    number: int = 1,
    port: int | None = None,
    argv: tuple[str, ...] = SERVER,
) -> TrialRequest:
    port = port or free_port()
    launch = ServerLaunch(
        command=(*argv, *flags, "--host", "127.0.0.1", "--port", str(port)),
        env={"SGLANG_SIM_TIME_SCALE": "0.001", **(env or {})},
        host="127.0.0.1",
        port=port,
    )
    return TrialRequest(number, launch, SMALL, startup_timeout_s=startup_s, benchmark_timeout_s=30)


@pytest.fixture
def executor(tmp_path: Path) -> TrialExecutor:
    return TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=1.0)


def assert_server_gone(result: TrialResult, port: int) -> None:
    assert result.server_pgid is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(result.server_pgid, 0)
    assert port_is_free("127.0.0.1", port)


@pytest.mark.integration
def test_a_good_launch_is_benchmarked_and_torn_down(executor: TrialExecutor) -> None:
    req = request()
    result = executor.run(req)
    assert result.ok, result.failure
    assert result.benchmark is not None and result.benchmark.completed == SMALL.num_prompts
    assert result.benchmark.output_throughput > 0
    assert result.benchmark.time_scale == pytest.approx(0.001)
    assert {"load_weight_begin", "load_weight_end", "ready"} <= set(result.phase_times)
    assert "The server is fired up and ready to roll!" in result.log
    # The client asks /server_info first: 0.5.17+ log the old /get_server_info as deprecated on every call.
    assert "Endpoint '/get_server_info' is deprecated" not in result.log
    # What SGLang chose for the memory flags left unset, from its server_args line.
    assert set(result.server_choices) == {
        "--mem-fraction-static",
        "--cuda-graph-max-bs-decode",
        "--chunked-prefill-size",
        "--cuda-graph-max-bs-prefill",  # 0.5.15+ log the prefill graph's resolved size too
    }
    assert 0.5 < result.server_choices["--mem-fraction-static"] < 0.95
    assert executor.phase == "idle"
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_not_enough_memory_fails_in_seconds_with_its_kind(executor: TrialExecutor) -> None:
    req = request("--mem-fraction-static", "0.55", "--cuda-graph-max-bs-decode", "128")
    started = time.monotonic()
    result = executor.run(req)
    assert result.failure is not None and result.failure.kind is FailureKind.KV_POOL_TOO_SMALL
    # SGLang 0.5.15+ (mem_cache/kv_cache_configurator.py), as the simulated 0.5.17 prints it.
    assert "Loaded weights leave no GPU memory for the KV cache" in result.failure.line
    assert result.startup_s is not None and result.startup_s < 10
    assert time.monotonic() - started < 20
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_unsupported_feature_names_its_flag(executor: TrialExecutor) -> None:
    result = executor.run(request("--enable-flashinfer-allreduce-fusion"))
    assert result.failure is not None and result.failure.kind is FailureKind.UNSUPPORTED
    assert result.failure.culprits == (
        "--enable-flashinfer-allreduce-fusion",
        "--flashinfer-allreduce-fusion-backend",
    )


@pytest.mark.integration
def test_a_hang_during_loading_times_out_and_is_killed(executor: TrialExecutor) -> None:
    req = request(env={"SGLANG_SIM_FAULT": "hang_load"}, startup_s=3)
    result = executor.run(req)
    assert result.failure is not None and result.failure.kind is FailureKind.STARTUP_TIMEOUT
    assert 3 <= (result.startup_s or 0) < 8
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_a_server_dying_mid_benchmark_is_caught(executor: TrialExecutor) -> None:
    req = request(env={"SGLANG_SIM_FAULT": "crash_benchmark:20"})
    result = executor.run(req)
    assert result.benchmark is None
    assert result.failure is not None
    assert result.failure.kind in (FailureKind.SERVER_DIED, FailureKind.UNKNOWN_CRASH)
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_a_fatal_line_ends_the_trial_in_seconds_while_the_server_lingers(executor: TrialExecutor) -> None:
    # The seed's server logged "Not enough memory" and stayed up: the trial must not wait for its exit.
    req = request("--mem-fraction-static", "0.55", env={"SGLANG_SIM_FAULT": "linger"}, startup_s=60)
    started = time.monotonic()
    result = executor.run(req)
    assert result.failure is not None and result.failure.kind is FailureKind.KV_POOL_TOO_SMALL
    # Well within the start-up timeout (60 s) and the stop's usual grace (15 s): killed, not waited for.
    assert time.monotonic() - started < 10
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_a_server_whose_exit_shows_after_its_requests_failed_died_all_the_same(
    executor: TrialExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Under load the benchmark's last failed requests can come back before the watcher sees the exit:
    # the trial was a COMPLETE at 8.8 tok/s in CI. A watcher polling every 2 s makes that window certain.
    monkeypatch.setattr("autotune.node.executor.WATCH_POLL_S", 2.0)
    result = executor.run(request(env={"SGLANG_SIM_FAULT": "crash_benchmark:100"}))  # 2 of 4 finish
    assert result.benchmark is None, f"measured a dying server: {result.benchmark}"
    assert result.failure is not None and result.failure.kind is FailureKind.SERVER_DIED, result.failure


@pytest.mark.integration
def test_a_crash_under_load_ends_the_trial_while_the_server_lingers(executor: TrialExecutor) -> None:
    req = request(env={"SGLANG_SIM_FAULT": "crash_benchmark:20,linger"})
    started = time.monotonic()
    result = executor.run(req)
    assert result.benchmark is None and result.failure is not None
    assert result.failure.kind is FailureKind.SERVER_DIED
    assert result.failure.line.endswith("CUDA error: an illegal memory access was encountered")
    assert time.monotonic() - started < 12  # the benchmark timeout is 30 s, the stop's usual grace 15 s
    assert_server_gone(result, req.launch.port)


@pytest.mark.integration
def test_a_missing_command_is_a_launch_error(executor: TrialExecutor) -> None:
    result = executor.run(request(argv=("/nonexistent/sglang-launcher",)))
    assert result.failure is not None and result.failure.kind is FailureKind.LAUNCH_ERROR
    assert "/nonexistent/sglang-launcher" in result.failure.line or "not found" in result.failure.line.lower()


def test_a_taken_port_is_a_launch_error(executor: TrialExecutor) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = executor.run(request(port=port))
    assert result.failure is not None and result.failure.kind is FailureKind.LAUNCH_ERROR
    assert str(port) in result.failure.line


@pytest.mark.integration
def test_abort_stops_the_server_and_reports_interrupted(executor: TrialExecutor) -> None:
    req = request(env={"SGLANG_SIM_STARTUP_TIME_SCALE": "0.01"})  # a 6 s load: time to abort it
    box: list[TrialResult] = []
    worker = threading.Thread(target=lambda: box.append(executor.run(req)))
    worker.start()
    deadline = time.monotonic() + 10
    while executor.phase not in ("loading", "starting") and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)
    executor.abort()
    worker.join(timeout=30)
    assert box, "run() returned after abort()"
    assert box[0].failure is not None and box[0].failure.kind is FailureKind.INTERRUPTED
    assert_server_gone(box[0], req.launch.port)


@pytest.mark.integration
def test_a_server_left_by_a_dead_runner_is_stopped_by_the_next_one(tmp_path: Path) -> None:
    port = free_port()
    first = LocalCommandRunner(tmp_path)
    process = first.start(
        request(port=port).launch.argv, {"SGLANG_SIM_TIME_SCALE": "0.001"}, tmp_path / "a.log"
    )
    deadline = time.monotonic() + 20
    while port_is_free("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.1)  # the server is up: a dead actor would leave exactly this behind
    assert (tmp_path / "servers.json").is_file()

    second = LocalCommandRunner(tmp_path)  # e.g. the actor that replaces a killed one

    assert second.stopped_left_behind == [process.pgid]
    assert not _group_members(process.pgid)  # only our unreaped zombie leader may remain
    assert not (tmp_path / "servers.json").exists()
    process.stop(grace_s=1)


@pytest.mark.integration
def test_a_server_whose_driver_still_runs_is_left_to_it(tmp_path: Path) -> None:
    """Two drivers on one study share the node's folder: the second's runner stopped the first's baseline
    (it failed as unknown_crash). A server is left behind only when the process that started it is gone."""
    import json
    import subprocess

    from autotune.node.runner import _started

    port = free_port()
    process = LocalCommandRunner(tmp_path).start(
        request(port=port).launch.argv, {"SGLANG_SIM_TIME_SCALE": "0.001"}, tmp_path / "a.log"
    )
    owner = subprocess.Popen(["sleep", "60"])  # stands for the other driver (or actor) that started it
    try:
        records = json.loads((tmp_path / "servers.json").read_text())
        records[0].update(owner_pid=owner.pid, owner_started=_started(owner.pid))
        (tmp_path / "servers.json").write_text(json.dumps(records))
        assert LocalCommandRunner(tmp_path).stopped_left_behind == []  # its driver runs: not left behind
        assert _group_members(process.pgid) and (tmp_path / "servers.json").is_file()
        owner.kill()  # not reaped yet: a killed Ray actor stays a zombie until its raylet reaps it
        stat = Path(f"/proc/{owner.pid}/stat")
        deadline = time.monotonic() + 10
        while stat.read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert LocalCommandRunner(tmp_path).stopped_left_behind == [process.pgid]  # its driver died
        owner.wait()
    finally:
        owner.kill()
        process.stop(grace_s=1)


@pytest.mark.integration
def test_an_unrelated_process_group_is_never_stopped(tmp_path: Path) -> None:
    import json
    import subprocess

    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (tmp_path / "servers.json").write_text(
            json.dumps([{"pgid": stranger.pid, "server_id": "not-its-id"}])
        )
        runner = LocalCommandRunner(tmp_path)
        assert runner.stopped_left_behind == []
        assert stranger.poll() is None
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.integration
def test_the_in_process_pool_checks_its_nodes_as_the_ray_pool_does(study_file: StudyFiles) -> None:
    """--no-ray: the node check runs before any trial, so launches are spelled for the node's SGLang and
    trials carry its fingerprint; a node with a problem stops the study with the fix."""
    from autotune.config import load_study
    from autotune.node.check import NodeCheckError
    from autotune.node.pool import in_process_pool

    data = e2e_study()
    facts = in_process_pool(load_study(study_file(data))).facts("local")
    assert facts is not None and facts.server_version == "0.5.17" and facts.server_flags is not None
    assert facts.hardware is not None and facts.hardware.startswith("8x NVIDIA RTX PRO 6000")
    data["server"]["command"] = [sys.executable, "-m", "autotune.sim.no_such_server"]
    path = study_file(data)
    with pytest.raises(NodeCheckError, match="no_such_server"):
        in_process_pool(load_study(path))


@pytest.mark.integration
@pytest.mark.parametrize(
    "flags", [(), ("--mem-fraction-static", "0.55", "--cuda-graph-max-bs-decode", "128")]
)
def test_a_scaled_simulated_node_is_counted_in_the_node_hours_a_real_one_would_spend(
    executor: TrialExecutor, flags: tuple[str, ...]
) -> None:
    from autotune.sim.model_node import ModelNodeExecutor
    from autotune.sim.profiles import load_hardware_profile, load_model_profile

    # The seed's node (the simulated server's default profiles) at a thousandth of real time: a launch of
    # about a second on the stopwatch, minutes of weight loading in the node's own clock (SGLang's 8 loader
    # threads: 150 s of the seed's 601).
    req = request(*flags)
    result = executor.run(req)
    model = ModelNodeExecutor(
        "local", load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    ).run(req)
    assert (result.startup_s or 0) < 30 and result.node_seconds is not None
    assert model.node_seconds is not None and model.node_seconds > 150
    assert result.node_seconds == pytest.approx(model.node_seconds, rel=0.1)
