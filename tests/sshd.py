"""A real OpenSSH server for tests: unprivileged, on a free 127.0.0.1 port, with generated keys.

`SSHServer.start()` runs `/usr/sbin/sshd -D -f /dev/null` as the current user (who is the only user it
can log in), with a fresh ed25519 host key and user key; `known_hosts` pins the host key. The server can
be stopped and started again on the same port and key, or have its sessions cut while it keeps listening.
"""

from __future__ import annotations

import getpass
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.node.runner import free_port
from autotune.node.ssh import SSHAddress, SSHCommandRunner

SSHD = Path("/usr/sbin/sshd")
PRIVSEP_DIR = Path("/run/sshd")


def sshd_unavailable() -> str | None:
    """Why a real sshd cannot run here, or None when it can."""
    if not SSHD.exists():
        return f"{SSHD} is missing: install Debian's openssh-server (.ci/run does)"
    if not PRIVSEP_DIR.is_dir():
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, parents=True)
        except OSError as exc:
            return f"sshd needs {PRIVSEP_DIR} ({exc}): create it as root"
    for tool in ("ssh-keygen", "setsid"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode != 0:
            return f"{tool} is missing"
    return None


def _keygen(path: Path) -> str:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "autotune-test", "-f", str(path)], check=True
    )
    return path.with_suffix(".pub").read_text().strip()


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid`, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X"):
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    out: list[int] = []
    todo = [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class SSHServer:
    """An sshd on 127.0.0.1:`port` that lets `user` in with `user_key`; `known_hosts` pins its key."""

    root: Path
    port: int = 0
    user: str = field(default_factory=getpass.getuser)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = self.port or free_port()
        self.host_key = self.root / "host_ed25519"
        self.user_key = self.root / "user_ed25519"
        self.authorized_keys = self.root / "authorized_keys"
        self.known_hosts = self.root / "known_hosts"
        host_pub = _keygen(self.host_key)
        self.authorized_keys.write_text(_keygen(self.user_key) + "\n")
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {' '.join(host_pub.split()[:2])}\n")

    @property
    def address(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 10.0) -> SSHServer:
        argv = [
            str(SSHD),
            "-D",
            "-e",
            "-f",
            "/dev/null",
            "-p",
            str(self.port),
            "-o",
            "ListenAddress=127.0.0.1",
            "-o",
            f"HostKey={self.host_key}",
            "-o",
            f"AuthorizedKeysFile={self.authorized_keys}",
            "-o",
            f"PidFile={self.root / 'sshd.pid'}",
            "-o",
            "StrictModes=no",
            "-o",
            "UsePAM=no",
            "-o",
            "Subsystem=sftp internal-sftp",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "KbdInteractiveAuthentication=no",
            "-o",
            "PermitRootLogin=prohibit-password",
            "-o",
            "MaxStartups=100",
            "-o",
            "LogLevel=ERROR",
        ]
        with open(self.root / "sshd.log", "ab") as log:  # sshd keeps its own copy of the descriptor
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return self
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on port {self.port} within {timeout_s} s")

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes and whatever they run (not the listener)."""
        return _children(self.process.pid) if self.process is not None else []

    def cut_sessions(self) -> list[int]:
        """SIGKILL every session (its connection drops at once); the listener keeps accepting."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def stop(self) -> None:
        """Kill the sessions and the listener: the node stops answering."""
        if self.process is None:
            return
        self.cut_sessions()
        self.process.kill()
        self.process.wait(timeout=10)
        self.process = None

    def runner(self, **kwargs: Any) -> SSHCommandRunner:
        """An SSH runner that logs in here with the generated key and checks the pinned host key."""
        options: dict[str, Any] = {
            "name": "sshd-test",
            "key_file": self.user_key,
            "known_hosts": self.known_hosts,
            "remote_dir": str(self.root / "remote"),
            "connect_timeout_s": 5.0,
            "reconnect_s": 2.0,
        }
        options.update(kwargs)
        return SSHCommandRunner(SSHAddress(self.user, "127.0.0.1", self.port), **options)
