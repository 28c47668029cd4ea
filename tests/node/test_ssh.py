"""Remote nodes over SSH, against a real OpenSSH server on loopback (tests/sshd.py).

The "node" is this machine reached through sshd, so a test can check the remote server's pid itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.measure.client import Workload
from autotune.node.check import GPU, check_node, gpu_problems, parse_gpus
from autotune.node.executor import TrialExecutor
from autotune.node.runner import LaunchError, NodeUnreachableError, free_port, port_is_free
from autotune.node.ssh import AddressError, SSHAddress, parse_ssh_address
from autotune.trial.failures import FailureKind
from autotune.trial.launch import ServerLaunch
from autotune.trial.redaction import Secrets
from autotune.trial.wire import TrialRequest, TrialResult
from tests.builders import SIM_SERVER, StudyFiles, e2e_study
from tests.conftest import run_cli
from tests.processes import alive, left_behind, python, study_servers, wait_for
from tests.sshd import SSHServer, sshd_unavailable

SIM = tuple(SIM_SERVER)
needs_sshd = pytest.mark.skipif(sshd_unavailable() is not None, reason=str(sshd_unavailable()))


def _group(pgid: int) -> list[int]:
    """Live pids in process group `pgid`."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == pgid and fields[0] not in ("Z", "X"):
                out.append(int(entry.name))
    return out


# -- addresses and study files (no sshd) ------------------------------------------------------------
def test_ssh_addresses_parse_with_port_22_by_default() -> None:
    assert parse_ssh_address("ssh://root@gpu-1") == SSHAddress("root", "gpu-1", 22)
    assert parse_ssh_address("ssh://me@10.0.0.5:2222") == SSHAddress("me", "10.0.0.5", 2222)
    assert parse_ssh_address("ssh://me@[fe80::1]:22").host == "fe80::1"
    assert SSHAddress("me", "h", 2222).known_hosts_name == "[h]:2222"


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("ssh://gpu-1:22", "no user"),
        ("ssh://me@gpu-1:99999", "port"),
        ("ssh://me@gpu-1:x", "port"),
        ("ssh://me:secret@gpu-1", "password"),
        ("ssh://me@gpu-1/var", "no path"),
        ("ssh://me@:22", "no host"),
    ],
)
def test_bad_ssh_addresses_say_what_is_wrong(address: str, problem: str) -> None:
    with pytest.raises(AddressError, match=problem) as info:
        parse_ssh_address(address)
    assert info.value.fix


def _study_on_node(node: dict[str, Any], **server: Any) -> dict[str, Any]:
    data = e2e_study(5, nodes=[node])
    data["server"].update(server)
    data["server"]["env"]["SGLANG_SIM_STARTUP_TIME_SCALE"] = "0.0002"  # start-up is not what is tested
    return data


def test_ssh_settings_on_a_local_node_are_refused(study_file: StudyFiles) -> None:
    path = study_file(_study_on_node({"name": "a", "address": "local", "key_file": "id"}))
    with pytest.raises(ConfigError) as info:
        load_study(path)
    assert info.value.field == "nodes[0].key_file" and "ssh://" in info.value.fix
    assert "\n" not in str(info.value)


def test_missing_known_hosts_is_a_config_error_naming_ssh_keyscan(study_file: StudyFiles) -> None:
    node = {"name": "g", "address": "ssh://me@gpu-1:2222", "known_hosts": "nowhere/known_hosts"}
    with pytest.raises(ConfigError) as info:
        load_study(study_file(_study_on_node(node)))
    assert info.value.field == "nodes[0].known_hosts"
    assert "ssh-keyscan -p 2222 gpu-1" in info.value.fix and "accept_unknown_host_key" in info.value.fix


def test_a_loopback_server_on_a_remote_node_needs_benchmark_from_node(
    tmp_path: Path, study_file: StudyFiles
) -> None:
    (tmp_path / "kh").write_text("")
    node = {"name": "g", "address": "ssh://me@gpu-1", "known_hosts": "kh"}
    with pytest.raises(ConfigError) as info:
        load_study(study_file(_study_on_node(node, host="127.0.0.1")))
    assert info.value.field == "server.host" and "benchmark_from: node" in info.value.fix
    study = load_study(study_file(_study_on_node({**node, "benchmark_from": "node"}, host="127.0.0.1")))
    assert study.file.nodes[0].known_hosts == str(tmp_path / "kh")  # relative to the study's folder


# -- GPU inventory rules (no sshd) -----------------------------------------------------------------
NVIDIA_SMI = """0, NVIDIA H200, 143771, 143156
1, NVIDIA H200, 143771, 143156
2, NVIDIA H200, 143771, 20480
3, NVIDIA H200, 143771, [N/A]
"""


def test_nvidia_smi_inventory_and_sglangs_unbalanced_memory_rule() -> None:
    gpus = parse_gpus(NVIDIA_SMI)
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0] == GPU(0, "NVIDIA H200", 143771.0, 143156.0)
    assert gpu_problems(gpus[:2]) == []
    problems = gpu_problems(gpus)
    assert any("unbalanced" in p.what and "GPU 2" in p.what for p in problems)
    assert any("GPU 2: 120.4 GiB in use" in p.what for p in problems)
    assert all(p.fix for p in problems)
    assert gpu_problems(gpus, visible="0,1") == []  # the busy GPU is not the server's
    assert "no usable GPU" in gpu_problems([])[0].what


# -- a real sshd -----------------------------------------------------------------------------------


@needs_sshd
@pytest.mark.integration
def test_the_remote_log_is_copied_beside_the_trial(sshd: SSHServer, tmp_path: Path) -> None:
    # Env values and arguments arriving intact over SSH: tests/contracts/test_runners.py.
    runner = sshd.runner(local_root=tmp_path)
    log = tmp_path / "trial-0001" / "server.log"
    process = runner.start(python("print('on the node', flush=True)"), {}, log)
    wait_for(lambda: process.poll() is not None)
    assert process.poll() == 0 and process.read_log() == "on the node\n"
    assert log.read_text() == process.read_log()
    assert process.remote_log == runner.remote_root / "trial-0001" / "server.log"  # type: ignore[attr-defined]


@needs_sshd
@pytest.mark.integration
def test_the_local_copy_of_a_remote_log_has_no_secret(sshd: SSHServer, tmp_path: Path) -> None:
    """SGLang prints its server_args, api_key included: the copy the driver keeps is redacted by value."""
    key = "sk-remote-secret-4242"
    code = f"print(\"server_args=ServerArgs(api_key='{key}', port=30000)\", flush=True); print('ready')"
    code += "; import sys; sys.stdout.write('a last line without its newline')"
    runner = sshd.runner(local_root=tmp_path)
    log_path = tmp_path / "trial-0001" / "server.log"
    process = runner.start(
        [sys.executable, "-c", code, "--api-key", key],
        {},
        log_path,
        secrets=Secrets.of(argv=["--api-key", key]),
    )
    wait_for(lambda: process.poll() is not None)
    process.fetch_log()
    copy = log_path.read_text()
    assert "api_key='***'" in copy and "ready" in copy  # the lines arrived, the value did not
    assert copy.endswith("a last line without its newline")  # the server has ended: nothing more comes
    assert key not in copy and key not in process.read_log()


@needs_sshd
@pytest.mark.integration
def test_what_cannot_be_launched_on_the_node_is_a_launch_error(sshd: SSHServer, tmp_path: Path) -> None:
    runner = sshd.runner(local_root=tmp_path)
    with pytest.raises(LaunchError, match="command not found on the node: /opt/nowhere/sglang"):
        runner.start(["/opt/nowhere/sglang"], {}, tmp_path / "trial-0001" / "server.log")
    with pytest.raises(LaunchError, match="cannot export"):
        runner.start([sys.executable], {"NCCL-ALGO": "ring"}, tmp_path / "trial-0001" / "server.log")


@needs_sshd
@pytest.mark.integration
def test_an_unknown_host_key_is_refused_unless_accepted(sshd: SSHServer, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(NodeUnreachableError) as info:
        sshd.runner(known_hosts=empty).connect(retry_for_s=5)
    assert not info.value.transient  # refused at once, not retried
    assert "not in" in info.value.reason and "SHA256:" in info.value.reason
    assert "ssh-keyscan" in info.value.fix and "accept_unknown_host_key: true" in info.value.fix

    accepting = sshd.runner(known_hosts=empty, accept_unknown_host_key=True)
    accepting.connect()
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in empty.read_text()
    sshd.runner(known_hosts=empty).connect()  # now pinned

    other = tmp_path / "other_known_hosts"
    other_key = (tmp_path / "k").with_suffix(".pub")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "k")], check=True)
    other.write_text(f"[127.0.0.1]:{sshd.port} {' '.join(other_key.read_text().split()[:2])}\n")
    with pytest.raises(NodeUnreachableError, match="does not match"):
        sshd.runner(known_hosts=other, accept_unknown_host_key=True).connect()  # a changed key never passes


@needs_sshd
@pytest.mark.integration
def test_node_check_reports_a_missing_server_command_with_its_fix(sshd: SSHServer, tmp_path: Path) -> None:
    runner = sshd.runner(local_root=tmp_path)
    common: dict[str, Any] = {"env": {}, "host": "127.0.0.1", "port": free_port(), "log_dir": str(tmp_path)}
    missing = check_node("n", runner, command=[sys.executable, "-m", "sglang_not_installed.launch"], **common)
    [problem] = missing.problems
    assert "'sglang_not_installed.launch' cannot be imported" in problem.what
    assert "pip install sglang_not_installed" in problem.fix

    command = ["/opt/nowhere/python", "-m", "sglang.launch_server"]
    no_python = check_node("n", runner, command=command, **common)
    [problem] = no_python.problems
    assert "'/opt/nowhere/python' is not found" in problem.what and "server.command" in problem.fix

    unreachable = sshd.runner(known_hosts=tmp_path / "none", local_root=tmp_path)
    [problem] = check_node("n", unreachable, command=SIM, **common).problems
    assert "cannot reach the node" in problem.what and "accept_unknown_host_key" in problem.fix
    # A good node passes: the study test below runs this same check through the node actor.


def _slow_benchmark_request(number: int) -> TrialRequest:
    """A trial whose benchmark lasts seconds (decode at 2% of real time), after a fast start."""
    port = free_port()
    flags = ("--model-path", "/models/Kimi-K2.5", "--tp-size", "8", "--host", "127.0.0.1")
    launch = ServerLaunch(
        command=(*SIM, *flags, "--port", str(port)),
        env={"SGLANG_SIM_TIME_SCALE": "0.02", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.0002"},
        host="127.0.0.1",
        port=port,
    )
    workload = Workload(num_prompts=32, input_len=1000, output_len=256, concurrency=4)
    return TrialRequest(number, launch, workload, startup_timeout_s=30, benchmark_timeout_s=60)


def _run_and_cut(executor: TrialExecutor, request: TrialRequest, cut: Any) -> TrialResult:
    box: list[TrialResult] = []
    worker = threading.Thread(target=lambda: box.append(executor.run(request)))
    worker.start()
    wait_for(lambda: executor.phase == "benchmarking", timeout_s=30)
    time.sleep(0.3)
    cut()
    worker.join(timeout=60)
    assert box, "run() returned"
    return box[0]


@needs_sshd
@pytest.mark.integration
def test_a_connection_cut_mid_benchmark_is_node_unreachable_and_the_server_is_stopped(
    sshd: SSHServer, tmp_path: Path
) -> None:
    runner = sshd.runner(local_root=tmp_path)
    executor = TrialExecutor("n", runner, tmp_path, port_wait_s=5.0)
    request = _slow_benchmark_request(7)
    started = time.monotonic()
    result = _run_and_cut(executor, request, sshd.cut_sessions)
    assert result.failure is not None and result.failure.kind is FailureKind.NODE_UNREACHABLE
    assert result.failure.kind.retried_once and result.benchmark is None
    assert time.monotonic() - started < 30  # the benchmark was cancelled, not waited for
    assert result.server_pgid is not None
    assert not alive(result.server_pgid) and _group(result.server_pgid) == []  # stopped on reconnect
    assert runner.left_behind == []
    assert port_is_free("127.0.0.1", request.launch.port)
    assert "The server is fired up and ready to roll!" in result.log  # followed until the cut


@needs_sshd
@pytest.mark.integration
def test_a_server_left_behind_by_a_dead_node_is_stopped_when_the_node_returns(tmp_path: Path) -> None:
    sshd = SSHServer(tmp_path / "sshd").start()
    try:
        workdir = tmp_path / "node"
        runner = sshd.runner(local_root=workdir, reconnect_s=1.0)
        executor = TrialExecutor("n", runner, workdir, port_wait_s=1.0)
        result = _run_and_cut(executor, _slow_benchmark_request(8), sshd.stop)
        assert result.failure is not None and result.failure.kind is FailureKind.NODE_UNREACHABLE
        pgid = result.server_pgid
        assert pgid is not None and alive(pgid)  # sshd is gone: nobody could stop it
        assert runner.left_behind == [pgid]
        assert json.loads((workdir / "servers.json").read_text())[0]["pgid"] == pgid

        sshd.start()
        # A new runner on the same node folder (a restarted actor) stops it on its first connection.
        fresh = sshd.runner(local_root=workdir)
        assert fresh.left_behind == [pgid]
        fresh.connect()
        wait_for(lambda: not _group(pgid), timeout_s=20)
        assert fresh.left_behind == [] and not (workdir / "servers.json").exists()
        assert fresh.stopped_left_behind == [pgid]  # what a resume says it stopped
    finally:
        sshd.stop()


# -- a whole study through ssh:// ------------------------------------------------------------------
@needs_sshd
@pytest.mark.integration
def test_a_study_runs_on_an_ssh_node_and_is_recorded(
    sshd: SSHServer, tmp_path: Path, study_file: StudyFiles
) -> None:
    from mlflow.tracking import MlflowClient

    node_home = tmp_path / "node-home"
    path = study_file(
        _study_on_node(
            {
                "name": "ssh-sim",
                "address": sshd.address,
                "key_file": str(sshd.user_key),
                "known_hosts": str(sshd.known_hosts),
                "remote_dir": str(node_home),
                "benchmark_from": "node",  # the driver-side benchmark is what the other tests use
            },
        )
    )
    proc = run_cli("run", str(path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    workdir = tmp_path / ".autotune" / "e2e"
    trials = optuna.load_study(study_name="e2e", storage=f"sqlite:///{workdir / 'optuna.db'}").get_trials()
    counted = [t for t in trials if not t.user_attrs.get("skipped")]
    assert len(counted) == 5 and all(t.state.is_finished() for t in trials)
    assert counted[0].user_attrs.get("baseline") and counted[0].state == optuna.trial.TrialState.COMPLETE
    assert all(t.user_attrs["node"] == "ssh-sim" for t in counted)
    assert not any(t.user_attrs.get("failure_kind") == "node_unreachable" for t in counted)

    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    assert experiment is not None
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id], max_results=100)}
    for trial in counted:
        run = runs[trial.user_attrs["mlflow_run_id"]]
        assert run.data.tags["autotune.node"] == "ssh-sim"
        assert run.data.tags["autotune.state"] == trial.state.name
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert run.data.metrics["output_throughput"] == pytest.approx(trial.value)
            log = Path(client.download_artifacts(run.info.run_id, "server.log")).read_text()
            assert "The server is fired up and ready to roll!" in log
        # The node kept its own copy of every trial's log, laid out as on the driver.
        remote_log = node_home / "e2e" / "nodes" / "ssh-sim" / f"trial-{trial.number:04d}" / "server.log"
        assert remote_log.read_text().startswith(
            (workdir / "nodes" / "ssh-sim" / f"trial-{trial.number:04d}" / "server.log").read_text()[:200]
        )

    # `port: auto`: the ports the node picked and the servers' process groups, as the trials recorded them.
    pgids, ports = study_servers(workdir, "e2e")
    assert pgids and ports, "the launched trials recorded where their servers ran"
    assert left_behind(pgids, ports) == []
    assert not (workdir / "nodes" / "ssh-sim" / "servers.json").exists()  # every server was stopped


@pytest.mark.integration
def test_node_check_reads_the_sglang_version_into_the_hardware_fingerprint(tmp_path: Path) -> None:
    # A deterministic "unsupported" failure is remembered against this fingerprint: a new SGLang may
    # support the feature, so the version is part of it.
    from autotune.node.runner import LocalCommandRunner
    from autotune.sim.nvidia_smi import __file__ as nvidia_smi_sim

    report = check_node(
        "n",
        LocalCommandRunner(),
        command=SIM,
        env={"SGLANG_SIM_HARDWARE": "h200-nvlink-x8"},
        host="127.0.0.1",
        port=free_port(),
        log_dir=str(tmp_path),
        nvidia_smi=(sys.executable, nvidia_smi_sim),
    )
    assert report.ok, report.problems
    assert report.server_version == "0.5.17"
    assert report.hardware is not None and report.server_flags is not None
    assert report.hardware.endswith(f"), SGLang {report.server_version}, flags {report.server_flags.digest}")
