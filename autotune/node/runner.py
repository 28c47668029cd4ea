"""Where commands run: start a long-running server in its own process group, stop the whole group.

`CommandRunner` is the interface the launch logic is written against once; `LocalCommandRunner` runs on
this machine (the simulated node, or a GPU box the driver sits on), `autotune.node.ssh.SSHCommandRunner` on a
node reached over SSH. Nothing here outside the `Local*` classes assumes a local process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.errors import AutotuneError, ProblemError
from autotune.trial.launch import ServerLaunch, is_env_name
from autotune.trial.redaction import Secrets

__all__ = [
    "CommandResult",
    "CommandRunner",
    "LaunchError",
    "LocalCommandRunner",
    "LocalServerProcess",
    "NodeUnreachableError",
    "ServerProcess",
    "free_port",
    "port_is_free",
    "wait_port_free",
]

# After SIGKILL the kernel tears the group down in milliseconds; this only bounds a stuck D-state wait.
_KILL_WAIT_S = 5.0
_POLL_S = 0.05
_LOG_DRAIN_S = 1.0


class LaunchError(AutotuneError):
    """A command could not be started at all (not found, not executable, bad arguments)."""

    def __init__(self, argv: Sequence[str], reason: str) -> None:
        self.argv = list(argv)
        self.reason = reason
        super().__init__(f"could not launch {self.argv!r}: {reason}")


class NodeUnreachableError(ProblemError):
    """The node stopped answering (or refused us): its connection was lost, refused or timed out.

    `fix` says what to check; `transient` is False when trying again cannot help (a refused host key
    or login). A trial that meets it says nothing about its settings.
    """

    def __init__(self, node: str, reason: str, fix: str = "", *, transient: bool = True) -> None:
        self.node = node
        self.reason = reason
        self.transient = transient
        super().__init__(
            f"node {node} unreachable: {reason}", fix or "Check the network and that sshd runs on the node."
        )


@dataclass(frozen=True)
class CommandResult:
    """A short command's exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def bytes_from(path: Path, offset: int) -> tuple[int, bytes]:
    """A file's size and its bytes from `offset` on; (0, b"") before it exists."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            if size <= offset:
                return size, b""
            f.seek(offset)
            return size, f.read()
    except FileNotFoundError:
        return 0, b""


class ServerProcess(ABC):
    """A started server: its process group, its state, its log; `stop()` ends the whole group."""

    def __init__(self, pid: int, log_path: Path, log_offset: int) -> None:
        self._pid = pid
        self._log_path = log_path
        self._log_offset = log_offset

    @property
    def pid(self) -> int:
        """Process id of the launched command (the group leader)."""
        return self._pid

    @property
    def pgid(self) -> int:
        """Process group id; every process the server spawns shares it. Every runner starts the command in
        a session of its own, which makes it the group's leader: the pgid is its pid."""
        return self._pid

    @property
    def log_path(self) -> Path:
        """The file both stdout and stderr are appended to."""
        return self._log_path

    @property
    def log_offset(self) -> int:
        """Bytes that were already in `log_path` before this process started."""
        return self._log_offset

    @abstractmethod
    def poll(self) -> int | None:
        """Return the launched command's exit status, or None while it runs (negative: killed by signal)."""

    @abstractmethod
    def stop(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM the group, SIGKILL it after `grace_s`, reap; idempotent. Returns the exit status."""

    def fetch_log(self) -> None:
        """Make `log_path` on this machine hold all the server has written so far.

        A local process writes there itself; a remote one copies the new bytes over from the node
        (raising `NodeUnreachableError` when it cannot).
        """
        return None

    def read_log_bytes(self, offset: int) -> tuple[int, bytes]:
        """Fetch the log, then return its size and its bytes from `offset` on ((0, b"") before it exists)."""
        self.fetch_log()
        return bytes_from(self.log_path, offset)

    def log_size(self) -> int:
        """Fetch the log, then return its size in bytes (0 before it exists)."""
        self.fetch_log()
        try:
            return self.log_path.stat().st_size
        except FileNotFoundError:
            return 0

    def read_log(self) -> str:
        """Return what this process wrote to its log so far (earlier content of the file excluded)."""
        return self.read_log_bytes(self.log_offset)[1].decode("utf-8", errors="replace")


class CommandRunner(ABC):
    """Starts long-running commands on one machine; the launch logic never knows which machine."""

    def start(
        self, argv: Sequence[str], env: Mapping[str, str], log_path: Path, *, secrets: Secrets | None = None
    ) -> ServerProcess:
        """Start `argv` in its own session with os.environ + `env`, both streams appended to `log_path`
        with `secrets` and those of `argv` and `env` redacted.

        Raises `LaunchError` when the command cannot be started.
        """
        argv = list(argv)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise LaunchError(argv, f"`argv` must be a non-empty sequence of str, but got {argv!r}.")
        bad = {k: v for k, v in env.items() if not (isinstance(k, str) and isinstance(v, str))}
        if bad:
            raise LaunchError(argv, f"environment keys and values must be str, but got {bad!r}.")
        bad_names = [k for k in env if not is_env_name(k)]  # on every runner, local or over SSH
        if bad_names:
            raise LaunchError(argv, f"environment variable names a shell cannot export: {bad_names!r}")
        secrets = Secrets.of_launch(argv, env) | (secrets or Secrets())
        return self._start(argv, dict(env), Path(log_path), secrets)

    @abstractmethod
    def _start(self, argv: list[str], env: dict[str, str], log_path: Path, secrets: Secrets) -> ServerProcess:
        """Start the validated command; subclasses implement this."""

    def run(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, timeout_s: float = 60.0
    ) -> CommandResult:
        """Run a short command to its end (with os.environ + `env` where it runs) and return its output.

        A command that is not found exits 127, as in a shell. Raises `NodeUnreachableError` when the
        machine does not answer, `TimeoutError` after `timeout_s`.
        """
        argv = list(argv)
        if not argv or not all(isinstance(a, str) for a in argv):
            raise ValueError(f"`argv` must be a non-empty sequence of str, but got {argv!r}.")
        return self._run(argv, dict(env or {}), timeout_s)

    @abstractmethod
    def _run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> CommandResult:
        """Run the validated short command; subclasses implement this."""

    def wait_port_free(self, host: str, port: int, timeout_s: float) -> bool:
        """Wait until a server could listen on (host, port) where commands run; False after `timeout_s`."""
        return wait_port_free(host, port, timeout_s)

    def free_port(self, host: str) -> int:
        """A port free on the node now, for a launch whose port is `auto`."""
        probe = f"import socket; s = socket.socket(); s.bind(({host!r}, 0)); print(s.getsockname()[1])"
        result = self.run(["python3", "-c", probe], {}, timeout_s=30)
        if result.returncode != 0 or not result.stdout.strip().isdigit():
            raise LaunchError(["python3", "-c", probe], f"no free port on the node: {result.stderr.strip()}")
        return int(result.stdout.strip())

    def url_for(self, launch: ServerLaunch) -> str:
        """The URL at which this machine reaches the server `launch` starts."""
        return launch.base_url

    def node_path(self, local: Path) -> str:
        """Where the node keeps what this machine's `local` path stands for (the same path, here)."""
        return str(local)

    @property
    def stopped_left_behind(self) -> list[int]:
        """Process groups of servers that a dead runner on the same records (a killed actor or driver) left
        running, which this one stopped."""
        return []


class LocalServerProcess(ServerProcess):
    """A process group started on this machine by `LocalCommandRunner`."""

    on_stopped: Callable[[], None] | None = None  # set by the runner that records its servers
    log_writer: threading.Thread | None = None  # copies a redacted log; done once the server's output ends

    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path, log_offset: int) -> None:
        super().__init__(popen.pid, log_path, log_offset)  # start_new_session: the group's leader
        self._popen = popen
        self._stopped = False

    def poll(self) -> int | None:
        code = self._popen.poll()
        if code is not None and self.log_writer is not None:
            # Once: an exited server's last lines reach the log (children holding the pipe bound the wait).
            writer, self.log_writer = self.log_writer, None
            writer.join(timeout=_LOG_DRAIN_S)
        return code

    def stop(self, grace_s: float = 10.0) -> int | None:
        if self._stopped:
            return self._popen.poll()
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + max(grace_s, 0.0)
        while self._group_alive() and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if self._group_alive():
            self._signal_group(signal.SIGKILL)
            deadline = time.monotonic() + _KILL_WAIT_S
            while self._group_alive() and time.monotonic() < deadline:
                time.sleep(_POLL_S)
        try:
            # The leader is dead or SIGKILLed by now; reap it so it leaves no zombie.
            self._popen.wait(timeout=_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        # Once the group is gone its id may be reused: never signal it again.
        self._stopped = True
        if self.on_stopped is not None:
            self.on_stopped()
        return self.poll()

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.pgid, sig)
        except ProcessLookupError:
            pass  # the whole group already exited

    def _group_alive(self) -> bool:
        """True while any non-zombie process remains in the group (reaps the leader as a side effect)."""
        self._popen.poll()
        members = _group_members(self.pgid)
        if members is not None:
            return bool(members)
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


def _group_members(pgid: int) -> list[int] | None:
    """Live (non-zombie) pids in process group `pgid` from /proc, or None where /proc is unavailable.

    Orphaned grandchildren can linger as zombies when PID 1 does not reap (containers), and
    `killpg(pgid, 0)` counts zombies as members, so /proc is the precise answer on Linux.
    """
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        return None
    members: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # Format: pid (comm) state ppid pgrp ...; comm may contain spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


SERVER_ID_VAR = "AUTOTUNE_SERVER_ID"  # in every server's environment: proves a process group is ours
SERVERS_FILE = "servers.json"
LEFT_BEHIND_GRACE_S = 15.0  # SGLang's clean stop, as for any other server


class LocalCommandRunner(CommandRunner):
    """Runs commands as child processes of this Python process.

    With a `state_dir`, every server is recorded in `servers.json` there until it is stopped, and a new
    runner on the same folder (a restarted actor, a resumed study) first stops what a dead one left
    behind: only process groups that still carry the recorded `AUTOTUNE_SERVER_ID`.
    """

    def __init__(self, state_dir: Path | None = None) -> None:
        self._records = ServerRecords(state_dir / SERVERS_FILE if state_dir is not None else None)
        self._stopped_left_behind = self._records.stop_all(_stop_local_group)

    @property
    def stopped_left_behind(self) -> list[int]:
        return list(self._stopped_left_behind)

    def _start(
        self, argv: list[str], env: dict[str, str], log_path: Path, secrets: Secrets
    ) -> LocalServerProcess:
        server_id = uuid.uuid4().hex
        env = {**env, SERVER_ID_VAR: server_id}
        process = self._popen(argv, env, log_path, secrets)
        self._records.add(process.pgid, server_id)
        process.on_stopped = lambda: self._records.remove(server_id)
        return process

    def free_port(self, host: str) -> int:
        return free_port(host)

    def _popen(
        self, argv: list[str], env: dict[str, str], log_path: Path, secrets: Secrets
    ) -> LocalServerProcess:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # SGLang prints its api_key at start-up: with a secret in the launch, the log is written through
        # a redacting pipe instead of by the server itself.
        with open(log_path, "ab") as log:
            offset = log.tell()
            try:
                popen = subprocess.Popen(
                    argv,
                    env={**os.environ, **env},
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE if secrets else log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            except FileNotFoundError as e:
                raise LaunchError(argv, f"command not found: {e.filename or argv[0]!r}") from e
            except PermissionError as e:
                raise LaunchError(argv, f"not executable: {e.filename or argv[0]!r}") from e
            except OSError as e:
                raise LaunchError(
                    argv, f"{e.strerror or e} ({errno.errorcode.get(e.errno or 0, '?')})"
                ) from e
        # The child holds its own copy of the log descriptor; ours is closed by the with-block.
        process = LocalServerProcess(popen, log_path, offset)
        if popen.stdout is not None:
            process.log_writer = threading.Thread(
                target=_copy_redacted, args=(popen.stdout, log_path, secrets), name="server-log", daemon=True
            )
            process.log_writer.start()
        return process

    def _run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> CommandResult:
        try:
            done = subprocess.run(
                argv,
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=timeout_s,
                check=False,
            )
        except FileNotFoundError as e:
            return CommandResult(127, "", f"command not found: {e.filename or argv[0]}")
        except PermissionError as e:
            return CommandResult(126, "", f"not executable: {e.filename or argv[0]}")
        except subprocess.TimeoutExpired as e:
            raise TimeoutError(f"{argv[0]} did not finish within {timeout_s:g} s") from e
        return CommandResult(
            done.returncode,
            done.stdout.decode("utf-8", errors="replace"),
            done.stderr.decode("utf-8", errors="replace"),
        )


def _copy_redacted(stream: Any, log_path: Path, secrets: Secrets) -> None:
    """Append each line of `stream` to `log_path` with `secrets` redacted, until the server closes it."""
    with stream, open(log_path, "ab") as log:
        for line in iter(stream.readline, b""):
            log.write(secrets.redact_bytes(line))
            log.flush()  # the log watcher reads the file as the server runs


class ServerRecords:
    """The servers a runner started and has not stopped yet, kept in a JSON file across processes."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()

    def _load(self) -> list[dict[str, Any]]:
        if self.path is None or not self.path.is_file():
            return []
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        return [e for e in data if isinstance(e, dict) and {"pgid", "server_id"} <= set(e)]

    def _save(self, entries: list[dict[str, Any]]) -> None:
        if self.path is None:
            return
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(entries, indent=2))

    def add(self, pgid: int, server_id: str) -> None:
        owner = {"owner_pid": os.getpid(), "owner_started": _started(os.getpid())}
        with self._lock:
            self._save([*self._load(), {"pgid": pgid, "server_id": server_id, **owner}])

    def remove(self, server_id: str) -> None:
        with self._lock:
            self._save([e for e in self._load() if e["server_id"] != server_id])

    def stop_all(self, stop: Callable[[int, str], bool]) -> list[int]:
        """Stop every recorded server with `stop(pgid, server_id)`; returns the groups it stopped."""
        stopped = []
        for entry in self._load():
            if _owner_alive(entry):
                continue  # another live driver's or actor's server on this node (two drivers share a study)
            if stop(int(entry["pgid"]), str(entry["server_id"])):
                stopped.append(int(entry["pgid"]))
            self.remove(str(entry["server_id"]))
        return stopped


def _started(pid: int) -> int | None:
    """When process `pid` started, in clock ticks since boot (/proc's starttime): tells a live owner from
    a later process that took its pid. None when it is gone, or dead and not yet reaped (a zombie: a
    killed actor stays one until Ray's raylet reaps it, seconds later on a loaded machine)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _owner_alive(entry: dict[str, Any]) -> bool:
    """Whether the process that started a recorded server still runs, and is not this one (a runner that
    replaces another in this process stops what the old one left). Records without an owner: not alive."""
    owner = entry.get("owner_pid")
    if not isinstance(owner, int) or owner == os.getpid():
        return False
    started = _started(owner)
    return started is not None and started == entry.get("owner_started")


def _carries(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _stop_local_group(pgid: int, server_id: str) -> bool:
    """Stop a recorded process group on this machine if a member still carries its server id."""
    members = _group_members(pgid) or []
    marker = f"{SERVER_ID_VAR}={server_id}".encode()
    if not any(_carries(pid, marker) for pid in members):
        return False  # gone, or the pgid now belongs to someone else
    for sig, wait_s in ((signal.SIGTERM, LEFT_BEHIND_GRACE_S), (signal.SIGKILL, _KILL_WAIT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait_s
        while _group_members(pgid) and time.monotonic() < deadline:
            time.sleep(_POLL_S)
        if not _group_members(pgid):
            break
    return True


def _sockaddr(host: str, port: int) -> tuple[socket.AddressFamily, Any]:
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return family, addr


def port_is_free(host: str, port: int) -> bool:
    """True when a server could listen on (host, port) now, tested by binding it.

    SO_REUSEADDR is set as uvicorn does, so connections in TIME_WAIT do not count as taken.
    """
    family, addr = _sockaddr(host, port)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """Return a port on `host` that was free a moment ago (the OS picks it; another process may race)."""
    family, addr = _sockaddr(host, 0)
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind(addr)
        return int(s.getsockname()[1])


def wait_port_free(host: str, port: int, timeout_s: float) -> bool:
    """Wait until (host, port) can be bound; True when it is free, False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        if port_is_free(host, port):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
