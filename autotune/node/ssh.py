"""GPU nodes reached over SSH: a Fabric command runner (the address is parsed in `autotune.config.hosts`).

`SSHCommandRunner` starts the server in its own session on the node and copies its log's new bytes back
over SFTP; a lost connection is a `NodeUnreachableError`, and every started server is recorded so that a
new runner stops what a dead one left running. Details: docs/design.md, "SSH nodes".
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import shlex
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path, PurePosixPath
from typing import Any

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut, ThreadException
from paramiko.config import SSHConfig

from autotune.config.hosts import AddressError, SSHAddress, is_any_address, is_loopback, parse_ssh_address
from autotune.node.runner import (
    LEFT_BEHIND_GRACE_S,
    SERVER_ID_VAR,
    SERVERS_FILE,
    CommandResult,
    CommandRunner,
    LaunchError,
    NodeUnreachableError,
    ServerProcess,
)
from autotune.trial.launch import ServerLaunch
from autotune.trial.redaction import Secrets

__all__ = [
    "SERVER_ID_VAR",
    "AddressError",
    "SSHAddress",
    "SSHCommandRunner",
    "SSHServerProcess",
    "parse_ssh_address",
]

RECONNECT_S = 10.0  # how long stopping a server tries to reach the node again before leaving it behind
KEEPALIVE_S = 10  # a keepalive notices a dead peer where no packet would otherwise be sent
MAX_PATIENCE_S = 60.0  # the longest a connection waits for a node that did not answer last time
COMMAND_TIMEOUT_S = 30.0  # poll, start, port checks: a node that needs longer is not answering
_FETCH_CHUNK = 4 << 20
# What a broken or closed connection raises somewhere in paramiko, Fabric or invoke.
_CONNECTION_ERRORS = (OSError, EOFError, paramiko.SSHException, ThreadException)


# -- scripts run on the node (POSIX sh, awk, setsid) --------------------------------------------------
# Live (non-zombie) pids of process group $1, from /proc; a bare `kill -0` where there is no /proc.
_MEMBERS = r"""
members() {
  if [ -r /proc/self/stat ]; then
    cat /proc/[0-9]*/stat 2>/dev/null | awk -v g="$1" '{ s = $0; sub(/^.*\) /, "", s); split(s, f, " ");
      if (f[3] == g && f[1] != "Z" && f[1] != "X") print $1 }'
  elif kill -0 -"$1" 2>/dev/null; then
    echo "$1"
  fi
}
"""

# Prints the log's size before the start, then the pid (= pgid, = sid) of the new session's leader: a
# shell that runs the server as its child and records its exit status, so `poll` can report it.
_START = r"""
set -e
dir=$1; log=$2; status=$3; shift 3
for tool in setsid awk; do
  command -v "$tool" >/dev/null 2>&1 || { echo "$tool not found on the node" >&2; exit 126; }
done
mkdir -p "$dir"
: >> "$log"
rm -f "$status"
wc -c < "$log" | tr -d ' '
command -v "$1" >/dev/null 2>&1 || { echo "command not found on the node: $1" >&2; exit 127; }
@EXPORTS@
setsid sh -c 'echo $$ >&3; exec 3>&-; trap : TERM INT HUP; "$@"; echo $? > "$0"' "$status" "$@" \
  3>&1 </dev/null >>"$log" 2>&1 &
"""

# SIGTERM the group, SIGKILL it after the grace; only when one of its processes carries our id.
_STOP = (
    _MEMBERS
    + r"""
g=$1; id=$2; grace=$3
ours=""
for p in $(members "$g"); do
  if [ ! -r /proc/self/stat ] || tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "$id"; then
    ours=1; break
  fi
done
[ -n "$ours" ] || { echo gone; exit 0; }
kill -TERM -"$g" 2>/dev/null || true
limit=$(awk -v s="$grace" 'BEGIN { printf "%d", s * 10 }'); n=0
while [ -n "$(members "$g")" ] && [ "$n" -lt "$limit" ]; do sleep 0.1; n=$((n + 1)); done
if [ -z "$(members "$g")" ]; then echo terminated; exit 0; fi
kill -KILL -"$g" 2>/dev/null || true
n=0
while [ -n "$(members "$g")" ] && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
echo killed
"""
)

_RESOLVE_DIR = r"""
d=$1
case $d in "~") d=$HOME ;; "~/"*) d=$HOME/${d#"~/"} ;; esac
mkdir -p "$d" && cd "$d" && pwd -P
"""


def _sh(script: str, args: Sequence[str] = ()) -> str:
    """One command line that runs `script` with `args` under sh, whatever the login shell is."""
    return " ".join(["sh", "-c", shlex.quote(script), "sh", *(shlex.quote(str(a)) for a in args)])


def _exit_status(text: str) -> int:
    """A shell's `$?` as Popen reports it: 128 + n (killed by signal n) becomes -n."""
    code = int(text)
    return -(code - 128) if 128 < code < 128 + 65 else code


def _proc_state(stat: bytes) -> str:
    """The state letter of a /proc/PID/stat line (after the command name, which may hold spaces)."""
    fields = stat[stat.rfind(b")") + 2 :].split()
    return fields[0].decode() if fields else "X"


def _listens(table: str, port: int) -> bool:
    """True when a /proc/net/tcp{,6} table has a socket in LISTEN (0A) on `port`."""
    suffix = f":{port:04X}"
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == "0A" and fields[1].endswith(suffix):
            return True
    return False


def _fingerprint(key: paramiko.PKey) -> str:
    digest = base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")
    return f"{key.get_name()} SHA256:{digest}"


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        self.hostname = hostname
        self.fingerprint = _fingerprint(key)
        super().__init__(f"{hostname} is not in known_hosts (it offers {self.fingerprint})")


class _RefuseUnknownHostKey(paramiko.MissingHostKeyPolicy):
    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class _AcceptNewHostKey(paramiko.MissingHostKeyPolicy):
    """OpenSSH's `StrictHostKeyChecking=accept-new`: remember an unknown key; a changed one still fails."""

    def __init__(self, known_hosts: Path | None) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        client.get_host_keys().add(hostname, key.get_name(), key)
        if self.known_hosts is not None:
            self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with self.known_hosts.open("a") as f:
                f.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")


class SSHCommandRunner(CommandRunner):
    """Runs commands on one node over SSH (Fabric), with host-key checking always on.

    `remote_dir` holds the node's copies of the logs (relative paths start at the login's home);
    a local log path under `local_root` maps to the same relative path under it. `reconnect_s` bounds
    how long stopping a server after a lost connection keeps trying to reach the node.
    """

    required_tools = ("setsid", "awk")

    def __init__(
        self,
        address: SSHAddress,
        *,
        name: str | None = None,
        key_file: str | Path | None = None,
        known_hosts: str | Path | None = "~/.ssh/known_hosts",
        accept_unknown_host_key: bool = False,
        remote_dir: str = ".autotune",
        local_root: Path | None = None,
        connect_timeout_s: float = 10.0,
        reconnect_s: float = RECONNECT_S,
    ) -> None:
        self.address = address
        self.name = name or str(address)
        self.key_file = Path(key_file).expanduser() if key_file else None
        self.known_hosts = Path(known_hosts).expanduser() if known_hosts else None
        self.accept_unknown_host_key = accept_unknown_host_key
        self.remote_dir = remote_dir
        self.local_root = local_root
        self.connect_timeout_s = connect_timeout_s
        self.reconnect_s = reconnect_s
        self._lock = threading.RLock()  # the connection, its SFTP client and the left-behind list
        self._conn: Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._remote_root: PurePosixPath | None = None
        # Every server started and not yet known to be stopped, kept in a file so that a new runner
        # (a restarted actor or driver) stops what an earlier one left running; `_managed` are the ones
        # a live SSHServerProcess of this runner still owns.
        self._servers: list[dict[str, Any]] = self._load_servers()
        self._managed: set[str] = set()
        self._stopped: list[int] = []  # servers left behind that a connection stopped
        self._failed_connects = 0

    # -- connection ----------------------------------------------------------------------------------
    def connect(self, retry_for_s: float = 0.0) -> None:
        """Connect unless connected (trying again for `retry_for_s` while the node does not answer),
        then stop any server left behind by a lost connection. Raises `NodeUnreachableError`.

        After a failed connection, the next ones wait longer for the node (5 s, doubling up to a
        minute): unreachable trials do not count against the budget, so a dead node must not fail
        hundreds of them a minute.
        """
        patience = min(MAX_PATIENCE_S, 5.0 * 2 ** (self._failed_connects - 1)) if self._failed_connects else 0
        deadline = time.monotonic() + max(retry_for_s, patience)
        while True:
            try:
                self._connect_once()
                break
            except NodeUnreachableError as exc:
                if exc.transient and time.monotonic() < deadline:
                    time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
                    continue
                self._failed_connects += 1
                if not exc.transient:
                    time.sleep(patience)  # a refused key or login is refused again at once
                raise
        self._failed_connects = 0
        self._stop_left_behind()

    def close(self) -> None:
        """Close the connection (servers keep running; stop them first)."""
        with self._lock:
            self._drop()

    def _connect_once(self) -> None:
        with self._lock:
            if self._conn is not None and self._conn.is_connected:
                return
            self._drop()
            conn = self._new_connection()
            try:
                try:
                    conn.open()
                except BaseException:
                    conn.client.close()  # a refused host key leaves paramiko's transport thread running
                    raise
            except _UnknownHostKey as exc:
                raise NodeUnreachableError(
                    self.name,
                    f"host key of {exc.hostname} ({exc.fingerprint}) is not in {self.known_hosts}",
                    f"Add it after checking the fingerprint on the node (ssh-keyscan -p {self.address.port} "
                    f"{self.address.host} >> {self.known_hosts}), or set accept_unknown_host_key: true.",
                    transient=False,
                ) from None
            except paramiko.BadHostKeyException as exc:
                raise NodeUnreachableError(
                    self.name,
                    f"host key of {self.address.known_hosts_name} does not match {self.known_hosts} "
                    f"(it offers {_fingerprint(exc.key)})",
                    "If the node was reinstalled, remove the old key (ssh-keygen -R "
                    f"'{self.address.known_hosts_name}' -f {self.known_hosts}) and add the new one; "
                    "otherwise do not connect: someone may be in between.",
                    transient=False,
                ) from None
            except paramiko.AuthenticationException as exc:
                raise NodeUnreachableError(
                    self.name,
                    f"authentication as {self.address.user} failed ({exc})",
                    f"Check key_file ({self.key_file or 'ssh defaults'}) and that its public key is in "
                    f"~{self.address.user}/.ssh/authorized_keys on the node.",
                    transient=False,
                ) from None
            except (*_CONNECTION_ERRORS, TimeoutError) as exc:
                raise NodeUnreachableError(self.name, f"cannot connect to {self.address} ({exc})") from None
            transport = conn.transport
            if transport is not None:
                transport.set_keepalive(KEEPALIVE_S)
            self._conn = conn
            try:
                root = self._exec(_sh(_RESOLVE_DIR, [self.remote_dir]), COMMAND_TIMEOUT_S).stdout.strip()
            except TimeoutError as exc:
                self._drop()
                raise NodeUnreachableError(self.name, str(exc)) from None
            if not root.startswith("/"):
                self._drop()
                raise NodeUnreachableError(
                    self.name,
                    f"cannot create the log folder {self.remote_dir!r} on the node",
                    "Set remote_dir to a folder the login can write.",
                    transient=False,
                )
            self._remote_root = PurePosixPath(root)

    def _new_connection(self) -> Connection:
        connect_kwargs: dict[str, Any] = {}
        if self.key_file is not None:
            connect_kwargs = {
                "key_filename": [str(self.key_file)],
                "look_for_keys": False,
                "allow_agent": False,
            }
        conn = Connection(
            self.address.host,
            user=self.address.user,
            port=self.address.port,
            # An explicit, empty ssh_config: ~/.ssh/config must not redirect the study's node.
            config=Config(ssh_config=SSHConfig()),
            connect_timeout=max(1, math.ceil(self.connect_timeout_s)),
            connect_kwargs=connect_kwargs,
        )
        client = conn.client
        # Fabric accepts every host key by default; replace that with the study's known_hosts.
        if self.known_hosts is not None and self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        policy: paramiko.MissingHostKeyPolicy = (
            _AcceptNewHostKey(self.known_hosts) if self.accept_unknown_host_key else _RefuseUnknownHostKey()
        )
        client.set_missing_host_key_policy(policy)
        return conn

    def _drop(self) -> None:
        """Forget the connection (closing what is left of it); the next `connect` opens a new one."""
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            try:
                conn.close()
            except Exception:  # closing a broken connection may raise anything; it is gone either way
                pass

    def _live_connection(self) -> Connection:
        """The open connection; never reconnects (a trial that lost its node fails as unreachable)."""
        with self._lock:
            conn = self._conn
            if conn is None or not conn.is_connected:
                self._drop()
                raise NodeUnreachableError(self.name, "the SSH connection was lost")
            return conn

    def _exec(self, command: str, timeout_s: float) -> CommandResult:
        """Run one command line on the node over the open connection. Raises `NodeUnreachableError`
        when the connection breaks, `TimeoutError` after `timeout_s` (the command may still run)."""
        conn = self._live_connection()
        started = time.monotonic()
        try:
            result = conn.run(command, hide=True, warn=True, in_stream=False, timeout=timeout_s)
        except CommandTimedOut:
            raise TimeoutError(f"no answer from {self.name} within {timeout_s:g} s") from None
        except _CONNECTION_ERRORS as exc:
            with self._lock:
                self._drop()
            raise NodeUnreachableError(self.name, f"the SSH connection was lost ({exc})") from None
        # invoke's timer closes the channel and only then counts as fired: a channel closed by it can come
        # back as a result without an exit status, the connection still up.
        no_status = result.exited is None or result.exited < 0
        if no_status and conn.is_connected and time.monotonic() - started >= timeout_s:
            raise TimeoutError(f"no answer from {self.name} within {timeout_s:g} s")
        # sshd always reports an exit status; none (-1) means the channel died with the connection.
        if no_status or not conn.is_connected:
            with self._lock:
                self._drop()
            raise NodeUnreachableError(self.name, "the SSH connection was lost during a command")
        return CommandResult(result.exited, result.stdout, result.stderr)

    def _script(self, script: str, args: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> str:
        """Run one of our scripts; its stdout. A node too slow to answer counts as unreachable."""
        try:
            result = self._exec(_sh(script, args), timeout_s)
        except TimeoutError as exc:
            with self._lock:
                self._drop()
            raise NodeUnreachableError(self.name, str(exc)) from None
        if result.returncode != 0:
            raise NodeUnreachableError(
                self.name,
                f"a control command failed with status {result.returncode}: {result.stderr.strip()[-300:]}",
                "Check that the node has a POSIX sh, awk and setsid (util-linux), and a /proc file system.",
            )
        return result.stdout

    # -- CommandRunner -------------------------------------------------------------------------------
    def _start(
        self, argv: list[str], env: dict[str, str], log_path: Path, secrets: Secrets
    ) -> SSHServerProcess:
        if any("\0" in value for value in env.values()) or any("\0" in arg for arg in argv):
            raise LaunchError(argv, "a NUL byte cannot travel in a command line or an env value")
        self.connect()
        remote_log = self.remote_path(log_path)
        status = remote_log.with_name(remote_log.name + ".status")
        server_id = uuid.uuid4().hex
        # Quoted here: Fabric's inline env would send `export K=v a l` unquoted.
        exports = "\n".join(
            f"export {name}={shlex.quote(value)}" for name, value in {**env, SERVER_ID_VAR: server_id}.items()
        )
        script = _START.replace("@EXPORTS@", exports)
        try:
            result = self._exec(
                _sh(script, [str(remote_log.parent), str(remote_log), str(status), *argv]), 60
            )
        except TimeoutError as exc:
            raise NodeUnreachableError(self.name, str(exc)) from None
        if result.returncode != 0:
            raise LaunchError(
                argv, result.stderr.strip() or f"the node refused it (status {result.returncode})"
            )
        lines = result.stdout.split()
        if len(lines) != 2 or not all(line.isdigit() for line in lines):
            raise LaunchError(
                argv, f"the node did not report the server's pid (it printed {result.stdout!r})"
            )
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as local:
            local_offset = local.tell()
        self._record(int(lines[1]), server_id)
        return SSHServerProcess(
            self,
            pid=int(lines[1]),
            server_id=server_id,
            log_path=log_path,
            log_offset=local_offset,
            remote_log=remote_log,
            remote_offset=int(lines[0]),
            status_path=status,
            secrets=secrets,
        )

    def _run(self, argv: list[str], env: dict[str, str], timeout_s: float) -> CommandResult:
        self.connect()
        words = [shlex.quote(a) for a in argv]
        if env:
            words = ["env", *(shlex.quote(f"{name}={value}") for name, value in env.items()), *words]
        return self._exec(" ".join(words), timeout_s)

    def wait_port_free(self, host: str, port: int, timeout_s: float) -> bool:
        """Wait until nothing listens on TCP `port` on the node (any address, IPv4 or IPv6)."""
        self.connect()
        deadline = time.monotonic() + timeout_s
        while True:
            tables = [self.read_file(PurePosixPath(f"/proc/net/{name}")) for name in ("tcp", "tcp6")]
            if not any(_listens(table.decode(errors="replace"), port) for table in tables if table):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)

    def url_for(self, launch: ServerLaunch) -> str:
        """The server's URL from this machine: the node's address where it listens on all or loopback."""
        if is_any_address(launch.host) or is_loopback(launch.host):
            return replace(launch, host=self.address.host).base_url
        return launch.base_url

    # -- paths and logs ------------------------------------------------------------------------------
    @property
    def remote_root(self) -> PurePosixPath:
        """The absolute folder on the node that holds the logs (known once connected)."""
        if self._remote_root is None:
            self.connect()
        assert self._remote_root is not None  # connect() sets it or raises
        return self._remote_root

    def node_path(self, local: Path) -> str:
        return str(self.remote_path(local))

    def remote_path(self, local: Path) -> PurePosixPath:
        """Where the node keeps the file that `local` mirrors."""
        relative: Path | None = None
        if self.local_root is not None:
            try:
                relative = Path(local).resolve().relative_to(Path(self.local_root).resolve())
            except ValueError:
                relative = None
        if relative is None:
            relative = Path(Path(local).parent.name, Path(local).name)
        return self.remote_root.joinpath(*relative.parts)

    def read_file(self, path: PurePosixPath) -> bytes | None:
        """The node's file `path` read to its end (also /proc files), or None when it does not exist."""
        with self._lock:
            try:
                with self._sftp_client().open(str(path), "rb") as f:
                    return bytes(f.read())
            except FileNotFoundError:
                return None
            except (*_CONNECTION_ERRORS, TimeoutError) as exc:
                self._drop()
                raise NodeUnreachableError(self.name, f"reading {path} failed ({exc})") from None

    def _read_remote(self, path: PurePosixPath, offset: int, limit: int) -> bytes:
        """Up to `limit` bytes of the node's file `path` from `offset` (b"" when there are none)."""
        with self._lock:
            try:
                with self._sftp_client().open(str(path), "rb") as f:
                    size = f.stat().st_size or 0
                    if size <= offset:
                        return b""
                    f.seek(offset)
                    return bytes(f.read(min(size - offset, limit)))
            except FileNotFoundError:
                return b""
            except (*_CONNECTION_ERRORS, TimeoutError) as exc:
                self._drop()
                raise NodeUnreachableError(self.name, f"reading {path} failed ({exc})") from None

    def _sftp_client(self) -> paramiko.SFTPClient:
        """The open connection's SFTP session (one per connection; callers hold `_lock`)."""
        conn = self._live_connection()
        if self._sftp is None:
            sftp = conn.client.open_sftp()
            channel = sftp.get_channel()
            if channel is not None:
                channel.settimeout(COMMAND_TIMEOUT_S)
            self._sftp = sftp
        return self._sftp

    # -- stopping, and servers left behind -----------------------------------------------------------
    def _stop_group(self, pgid: int, server_id: str, grace_s: float) -> str:
        marker = f"{SERVER_ID_VAR}={server_id}"
        answer = self._script(_STOP, [str(pgid), marker, f"{grace_s:g}"], grace_s + COMMAND_TIMEOUT_S)
        self._forget(server_id)
        return answer.strip()

    def stop_group(self, pgid: int, server_id: str, grace_s: float) -> bool:
        """Stop our process group `pgid` on the node, reconnecting for `reconnect_s` if needed.

        False when the node did not answer: the group is then left behind and stopped as soon as a
        connection to the node is made again (by this runner, or by a new one on the same `local_root`).
        """
        try:
            self._stop_group(pgid, server_id, grace_s)
            return True
        except NodeUnreachableError:
            pass
        with self._lock:
            self._managed.discard(server_id)  # from now on, connecting stops it
        try:
            self.connect(retry_for_s=self.reconnect_s)
            return True
        except NodeUnreachableError:
            return False

    @property
    def stopped_left_behind(self) -> list[int]:
        with self._lock:
            return list(self._stopped)

    @property
    def left_behind(self) -> list[int]:
        """Process groups on the node that this runner started (or found recorded) and could not stop."""
        with self._lock:
            return [int(e["pgid"]) for e in self._servers if e["server_id"] not in self._managed]

    def _record(self, pgid: int, server_id: str) -> None:
        with self._lock:
            self._managed.add(server_id)
            self._servers.append({"pgid": pgid, "server_id": server_id})
            self._save_servers()

    def _forget(self, server_id: str) -> None:
        with self._lock:
            self._managed.discard(server_id)
            self._servers = [e for e in self._servers if e["server_id"] != server_id]
            self._save_servers()

    def _stop_left_behind(self) -> None:
        with self._lock:
            pending = [e for e in self._servers if e["server_id"] not in self._managed]
        for entry in pending:
            if self._stop_group(int(entry["pgid"]), str(entry["server_id"]), LEFT_BEHIND_GRACE_S) != "gone":
                self._stopped.append(int(entry["pgid"]))

    def _servers_path(self) -> Path | None:
        return self.local_root / SERVERS_FILE if self.local_root is not None else None

    def _load_servers(self) -> list[dict[str, Any]]:
        path = self._servers_path()
        if path is None or not path.is_file():
            return []
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return []
        if not isinstance(data, list):
            return []
        return [e for e in data if isinstance(e, dict) and {"pgid", "server_id"} <= set(e)]

    def _save_servers(self) -> None:
        path = self._servers_path()
        if path is None:
            return
        if not self._servers:
            path.unlink(missing_ok=True)
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self._servers, indent=2))


class SSHServerProcess(ServerProcess):
    """A server's process group on a node, started by `SSHCommandRunner`.

    `log_path` is the trial's local log: `fetch_log()` appends what the node's log (`remote_log`)
    gained since the last fetch. `pid` is the group leader, a shell that waits for the server.
    """

    def __init__(
        self,
        runner: SSHCommandRunner,
        *,
        pid: int,
        server_id: str,
        log_path: Path,
        log_offset: int,
        remote_log: PurePosixPath,
        remote_offset: int,
        status_path: PurePosixPath,
        secrets: Secrets | None = None,
    ) -> None:
        self.runner = runner
        self.secrets = secrets or Secrets()  # redacted from the local copy of the log
        self.server_id = server_id
        self.remote_log = remote_log
        self.status_path = status_path
        super().__init__(pid, log_path, log_offset)  # setsid: the group's leader
        self._remote_pos = remote_offset
        self._returncode: int | None = None
        self._stopped = False
        self._left_behind = False
        self._stop_lock = threading.Lock()
        self._fetch_lock = threading.Lock()

    def poll(self) -> int | None:
        if self._returncode is not None or self._left_behind:
            return self._returncode
        # Two reads over SFTP: an exec would cost a whole SSH session each poll.
        status = self._status()
        if status is None:
            stat = self.runner.read_file(PurePosixPath(f"/proc/{self.pid}/stat"))
            if stat is not None and _proc_state(stat) not in ("Z", "X"):
                return None
            # The leader is gone; it may have recorded the status just before it went.
            status = self._status()
            # Without a status the leader was killed before it could record one (SIGKILL).
            self._returncode = -9 if status is None else status
        else:
            self._returncode = status
        return self._returncode

    def _status(self) -> int | None:
        text = (self.runner.read_file(self.status_path) or b"").decode(errors="replace").strip()
        return _exit_status(text) if text.lstrip("-").isdigit() else None

    def stop(self, grace_s: float = 10.0) -> int | None:
        with self._stop_lock:
            if not self._stopped:
                self._left_behind = not self.runner.stop_group(self.pgid, self.server_id, grace_s)
                self._stopped = True
        try:
            return self.poll()
        except NodeUnreachableError:
            return None

    def fetch_log(self) -> None:
        with self._fetch_lock:
            while True:
                data = self.runner._read_remote(self.remote_log, self._remote_pos, _FETCH_CHUNK)
                if not data:
                    return
                full = len(data) == _FETCH_CHUNK
                ended = self._stopped or self._returncode is not None  # nothing more will be written
                if self.secrets and b"\n" in data and (full or not ended):
                    data = data[: data.rfind(b"\n") + 1]  # whole lines only, so no secret is cut in two
                with open(self._log_path, "ab") as local:
                    local.write(self.secrets.redact_bytes(data))
                self._remote_pos += len(data)
                if not full:
                    return
