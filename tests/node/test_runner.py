"""LocalCommandRunner with real processes: groups die whole, SIGKILL after grace, env and log intact."""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest

from autotune.node.runner import (
    LaunchError,
    LocalCommandRunner,
    free_port,
    port_is_free,
    wait_port_free,
)
from tests.processes import TREE, alive, line_of, python


@pytest.mark.parametrize("mode", ["obey", "ignore"])
@pytest.mark.integration
def test_stop_kills_whole_group(tmp_path: Path, mode: str) -> None:
    log = tmp_path / "server.log"
    proc = LocalCommandRunner().start([*python(TREE), mode], {}, log)
    assert proc.pgid == proc.pid == os.getpgid(proc.pid)
    assert os.getpgid(proc.pid) != os.getpgid(0)  # its own group, not ours
    helper = int(line_of(proc, "helper ").split()[1])
    line_of(proc, "server ")
    assert proc.poll() is None

    t0 = time.monotonic()
    rc = proc.stop(grace_s=0.5)
    took = time.monotonic() - t0

    assert not alive(proc.pid)
    assert not alive(helper)
    if mode == "obey":
        assert rc == -15
        assert took < 0.5
    else:
        assert rc == -9  # SIGTERM ignored: killed after the grace
        assert 0.5 <= took < 3.0
    assert proc.stop() == rc  # idempotent, signals nothing again
    assert proc.poll() == rc


@pytest.mark.integration
def test_env_values_arrive_intact_and_environ_is_inherited(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_TEST_INHERITED", "from parent")
    env = {
        "NCCL_ALGO": "Ring,Tree",
        "AUTOTUNE_TRICKY": "a b  'single' \"double\" $HOME ${X} `id` ; | & \\ * ?\ttab\nnewline ünï",
        "AUTOTUNE_EMPTY": "",
    }
    code = """
    import json, os
    keys = ["NCCL_ALGO", "AUTOTUNE_TRICKY", "AUTOTUNE_EMPTY", "AUTOTUNE_TEST_INHERITED"]
    print("ENV " + json.dumps({k: os.environ.get(k) for k in keys}), flush=True)
    """
    proc = LocalCommandRunner().start(python(code), env, tmp_path / "log")
    got = json.loads(line_of(proc, "ENV ")[4:])
    proc.stop()
    assert got == {**env, "AUTOTUNE_TEST_INHERITED": "from parent"}


@pytest.mark.integration
def test_log_gets_both_streams_appended(tmp_path: Path) -> None:
    log = tmp_path / "sub" / "server.log"
    log.parent.mkdir()
    log.write_text("header written by the caller\n")
    code = """
    import sys
    print("to stdout", flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    """
    proc = LocalCommandRunner().start(python(code), {}, log)
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() == 0
    assert log.read_text() == "header written by the caller\nto stdout\nto stderr\n"
    assert proc.log_offset == len("header written by the caller\n")
    assert proc.read_log() == "to stdout\nto stderr\n"  # this process's part only
    assert proc.stop() == 0


@pytest.mark.integration
def test_missing_command_raises_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError) as info:
        LocalCommandRunner().start(["autotune-no-such-command-xyz", "--flag"], {}, tmp_path / "log")
    assert info.value.argv == ["autotune-no-such-command-xyz", "--flag"]
    assert "not found" in info.value.reason


@pytest.mark.integration
def test_not_executable_raises_launch_error(tmp_path: Path) -> None:
    script = tmp_path / "script.sh"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(0o644)
    with pytest.raises(LaunchError) as info:
        LocalCommandRunner().start([str(script)], {}, tmp_path / "log")
    assert "not executable" in info.value.reason


@pytest.mark.parametrize(
    ("argv", "env"),
    [([], {}), (["echo", 3], {}), (["echo"], {"A": 1}), (["echo"], {"A=B": "x"})],
)
def test_bad_arguments_raise_launch_error(tmp_path: Path, argv: list[object], env: dict[str, object]) -> None:
    with pytest.raises(LaunchError):
        LocalCommandRunner().start(argv, env, tmp_path / "log")  # type: ignore[arg-type]


def test_port_helpers() -> None:
    port = free_port("127.0.0.1")
    assert port_is_free("127.0.0.1", port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        assert not port_is_free("127.0.0.1", port)
        t0 = time.monotonic()
        assert not wait_port_free("127.0.0.1", port, timeout_s=0.3)
        assert time.monotonic() - t0 >= 0.3
    assert wait_port_free("127.0.0.1", port, timeout_s=1.0)
