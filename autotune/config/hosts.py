"""What a listening address means: this machine only (loopback), or every address (any)."""

from __future__ import annotations

import ipaddress

LOOPBACK = "127.0.0.1"  # how this machine reaches a server that listens on every address
ANY_ADDRESSES = ("0.0.0.0", "::", "")  # a server bound to one of these listens on every address


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
