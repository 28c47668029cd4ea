"""One contract for every command runner the launch logic is written against: `LocalCommandRunner` (this
machine) and `SSHCommandRunner` (a node over SSH, here a real OpenSSH server on loopback, tests/sshd.py,
so a test can look at the node's processes itself). Short commands return their status and output; a
started server runs in its own process group, which stop() ends whole; its log holds both streams and no
secret; ports are told free or taken where the commands run.

A runner joins by adding itself to RUNNERS.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from autotune.node.runner import CommandRunner, LaunchError, LocalCommandRunner, ServerProcess
from autotune.trial.redaction import REDACTED
from tests.processes import TREE, alive, line_of, python, wait_for

pytestmark = pytest.mark.integration  # every runner starts processes
RUNNERS: dict[str, Callable[[pytest.FixtureRequest, Path], CommandRunner]] = {
    "local": lambda request, folder: LocalCommandRunner(folder),
    "ssh": lambda request, folder: request.getfixturevalue("sshd").runner(local_root=folder),
}


@pytest.fixture(params=list(RUNNERS))
def runner(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[CommandRunner]:
    made = RUNNERS[request.param](request, tmp_path)
    yield made
    close = getattr(made, "close", None)
    if close is not None:
        close()


@pytest.fixture
def started(runner: CommandRunner, started: list[ServerProcess]) -> list[ServerProcess]:
    """tests/conftest.py's, set up after the runner: its servers stop before an SSH runner closes."""
    return started


# -- short commands ------------------------------------------------------------------------------------
def test_a_short_command_returns_its_status_and_both_streams(runner: CommandRunner) -> None:
    done = runner.run(python("import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"))
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_a_command_that_is_not_there_exits_127_as_in_a_shell(runner: CommandRunner) -> None:
    assert runner.run(["/opt/nowhere/sglang", "--version"]).returncode == 127


def test_a_command_past_its_timeout_raises_timeout_error(runner: CommandRunner) -> None:
    with pytest.raises(TimeoutError):
        runner.run(python("import time; time.sleep(30)"), timeout_s=1)


def test_an_empty_command_is_refused(runner: CommandRunner) -> None:
    with pytest.raises(ValueError, match="non-empty"):
        runner.run([])


TRICKY = {
    "SPACES": "two  words ",
    "QUOTES": 'it\'s "quoted"',
    "DOLLAR": "$HOME ${PATH} $(id) `id`",
    "BACKSLASH": "a\\b\\\\c",
    "NEWLINE": "line1\nline2",
    "EMPTY": "",
}
ARGS = ["arg with 'quotes' and $x", "--flag=a b", "*"]
ECHO = "import json, os, sys; names = json.loads(sys.argv[1]); "
ECHO += "print(json.dumps([{k: os.environ.get(k) for k in names}, sys.argv[2:]]))"


def test_env_values_and_arguments_arrive_intact(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path
) -> None:
    argv = [sys.executable, "-c", ECHO, json.dumps(list(TRICKY)), *ARGS]
    assert json.loads(runner.run(argv, TRICKY).stdout) == [TRICKY, ARGS]
    started.append(runner.start(argv, TRICKY, tmp_path / "trial-0001" / "server.log"))
    wait_for(lambda: started[0].poll() is not None)
    assert json.loads(started[0].read_log().splitlines()[0]) == [TRICKY, ARGS]


# -- servers -------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("term", "status"), [("obey", -15), ("ignore", -9)])
def test_a_server_runs_in_its_own_group_and_stop_ends_all_of_it(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path, term: str, status: int
) -> None:
    server = runner.start([*python(TREE), term], {}, tmp_path / "trial-0001" / "server.log")
    started.append(server)
    _, server_pid, server_group = line_of(server, "server ").split()
    _, helper_pid, helper_group = line_of(server, "helper ").split()
    assert int(server_group) == int(helper_group) == server.pgid != os.getpgid(0)
    assert server.poll() is None
    assert server.stop(grace_s=0.5) == status  # SIGTERM, or SIGKILL after the grace
    assert not alive(int(server_pid)) and not alive(int(helper_pid))
    assert server.stop() == status and server.poll() == status  # idempotent


def test_stop_ends_a_group_whose_leader_already_exited(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path
) -> None:
    code = """
    import subprocess, sys
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    print("helper", helper.pid, flush=True)
    sys.exit(3)
    """
    server = runner.start(python(code), {}, tmp_path / "trial-0001" / "server.log")
    started.append(server)
    helper = int(line_of(server, "helper ").split()[1])
    wait_for(lambda: server.poll() is not None)
    assert server.poll() == 3 and alive(helper)
    assert server.stop(grace_s=1) == 3
    assert not alive(helper)


def test_the_log_holds_both_streams_of_this_launch_only(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path
) -> None:
    log = tmp_path / "trial-0001" / "server.log"
    first = runner.start(python("print('first launch', flush=True)"), {}, log)
    started.append(first)
    wait_for(lambda: first.poll() is not None and "first launch" in first.read_log())
    code = "import sys; print('to stdout', flush=True); print('to stderr', file=sys.stderr, flush=True)"
    second = runner.start(python(code), {}, log)
    started.append(second)
    wait_for(lambda: second.poll() is not None)
    second.fetch_log()
    assert second.log_path == log and second.log_offset > 0
    assert sorted(second.read_log().splitlines()) == ["to stderr", "to stdout"]  # not the first launch's
    assert log.read_text().startswith("first launch\n")


def test_no_secret_reaches_the_log(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path
) -> None:
    key, token = "sk-contract-secret-0042", "hf_contract_token_9911"
    code = (
        "import os, sys; print(f\"server_args=ServerArgs(api_key='{sys.argv[2]}')\", os.environ['HF_TOKEN'])"
    )
    server = runner.start(
        [*python(code), "--api-key", key], {"HF_TOKEN": token}, tmp_path / "trial-0001" / "server.log"
    )
    started.append(server)
    wait_for(lambda: server.poll() is not None)
    server.fetch_log()
    text = (tmp_path / "trial-0001" / "server.log").read_text()
    assert f"api_key='{REDACTED}') {REDACTED}" in text, text  # the line arrived, the values did not
    assert key not in text and token not in text


def test_what_cannot_be_started_is_a_launch_error(runner: CommandRunner, tmp_path: Path) -> None:
    log = tmp_path / "trial-0001" / "server.log"
    with pytest.raises(LaunchError, match="not found"):
        runner.start(["/opt/nowhere/sglang"], {}, log)
    with pytest.raises(LaunchError):
        runner.start([sys.executable], {"NCCL-ALGO": "Ring"}, log)  # no shell can export that name
    with pytest.raises(LaunchError):
        runner.start([], {}, log)


# -- ports ---------------------------------------------------------------------------------------------
LISTEN = """
import socket, sys
s = socket.socket()
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
print("listening", flush=True)
s.accept()
"""


def test_ports_are_told_free_or_taken_where_commands_run(
    runner: CommandRunner, started: list[ServerProcess], tmp_path: Path
) -> None:
    port = runner.free_port("127.0.0.1")
    with socket.socket() as probe:  # free a moment ago: bindable now (loopback: the node is this machine)
        probe.bind(("127.0.0.1", port))
    assert runner.wait_port_free("127.0.0.1", port, 1)
    server = runner.start([*python(LISTEN), str(port)], {}, tmp_path / "trial-0001" / "server.log")
    started.append(server)
    line_of(server, "listening")
    assert not runner.wait_port_free("127.0.0.1", port, 0.5)
    server.stop(grace_s=1)
    assert runner.wait_port_free("127.0.0.1", port, 10)
