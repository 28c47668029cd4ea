"""One trial at a time on a node, across every driver on this host.

Two drivers that run trials on the same node (two `autotune run` of one study, or two studies naming the
same GPUs) would start two servers on one GPU: each runs out of memory or loses half its throughput, and
the study learns from trials the config did not cause. Seen on a real H200: a second driver's trials ran
at 900-2750 tok/s where the first's had run at 4300, and its starts died of `Process 4306 has 129.77 GiB
memory in use`. So an executor holds the node's lock file (flock) from launch to teardown, and a trial of
another driver waits for it. The lock lives on the host where the executor runs: it covers local nodes
and SSH nodes driven from one host, not drivers on different hosts sharing a remote node.
"""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from autotune.errors import AutotuneError

__all__ = ["NodeBusy", "lock_path", "node_held"]

_POLL_S = 0.5


class NodeBusy(AutotuneError):
    """Waiting for the node was given up (the trial was stopped meanwhile)."""


def lock_path(node: str) -> Path:
    """The node's lock file: per user, in the system's temporary folder."""
    return Path(tempfile.gettempdir()) / f"autotune-{os.getuid()}" / f"node-{quote(node, safe='')}.lock"


@contextmanager
def node_held(
    node: str,
    holder: str,
    *,
    on_wait: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
) -> Iterator[None]:
    """Hold `node` for the body; if another process holds it, call `on_wait` with what it wrote (its
    `holder` text) once, then wait until it lets go. Raises NodeBusy if `stop` is set while waiting."""
    path = lock_path(node)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+") as file:
        waited = False
        while True:
            try:
                fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not waited and on_wait is not None:
                    file.seek(0)
                    on_wait(file.read().strip() or "another process")
                waited = True
                if stop is not None and stop.wait(_POLL_S):
                    raise NodeBusy(node) from None
                if stop is None:
                    time.sleep(_POLL_S)
        try:
            file.seek(0)
            file.truncate()
            file.write(holder)
            file.flush()
            yield
        finally:
            file.truncate(0)
            fcntl.flock(file, fcntl.LOCK_UN)
