"""Addresses: what a listening address means (this machine only, or every address), and a node's
`ssh://user@host:port`, parsed here so that reading a study file needs no SSH library."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from autotune.errors import ProblemError

LOOPBACK = "127.0.0.1"  # how this machine reaches a server that listens on every address
ANY_ADDRESSES = ("0.0.0.0", "::", "")  # a server bound to one of these listens on every address
SSH_SCHEME = "ssh"


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def is_any_address(host: str) -> bool:
    """True when a server bound to `host` listens on every address of its machine."""
    return host in ANY_ADDRESSES


def reachable_here(host: str) -> str:
    """The host to connect to on the server's own machine: loopback for a server on every address."""
    return LOOPBACK if is_any_address(host) else host


class AddressError(ProblemError, ValueError):
    """An ssh:// address that cannot be used: `problem` and `fix` fit a one-line config error."""


@dataclass(frozen=True)
class SSHAddress:
    """Where a node's sshd listens, and whom to log in as."""

    user: str
    host: str
    port: int = 22

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{self.user}@{host}:{self.port}"

    @property
    def known_hosts_name(self) -> str:
        """How OpenSSH (and paramiko) name this host in a known_hosts file."""
        return self.host if self.port == 22 else f"[{self.host}]:{self.port}"

    @property
    def is_loopback(self) -> bool:
        return is_loopback(self.host)


def parse_ssh_address(address: str) -> SSHAddress:
    """Parse `ssh://user@host[:port]` (port 22 by default); raises `AddressError`."""
    fix = "Write ssh://user@host:port, e.g. ssh://root@gpu-node-1:22."
    parts = urlsplit(address)
    if parts.scheme != SSH_SCHEME:
        raise AddressError("not an ssh:// address", fix)
    if parts.password is not None:
        raise AddressError("a password in the address", "Remove it; log in with key_file instead.")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise AddressError("an ssh:// address has no path, query or fragment", fix)
    if not parts.hostname:
        raise AddressError("the address names no host", fix)
    if not parts.username:
        raise AddressError("the address names no user to log in as", fix)
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port is not None and not 1 <= port <= 65535:
        raise AddressError("the port must be a number from 1 to 65535", fix)
    return SSHAddress(parts.username, parts.hostname, port or 22)
