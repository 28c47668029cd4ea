"""One trial at a time on a node across drivers: the second waits instead of sharing the GPU."""

from __future__ import annotations

import fcntl
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from autotune.node.executor import TrialExecutor
from autotune.node.lock import NodeBusy, lock_path, node_held
from autotune.node.runner import LocalCommandRunner
from tests.conftest import HOST_TMP
from tests.node.test_executor import request


@pytest.fixture
def node() -> Iterator[str]:
    """A node name no other test or process uses; its lock file is removed afterwards."""
    name = f"test-{uuid.uuid4().hex[:8]}"
    yield name
    lock_path(name).unlink(missing_ok=True)


def test_a_second_holder_waits_and_is_told_who_holds_the_node(node: str) -> None:
    told: list[str] = []
    order: list[str] = []
    with node_held(node, "trial 3 of pid 1 on host-a"):
        second = threading.Thread(target=lambda: node_held_then(node, told.append, order.append, "second"))
        second.start()
        time.sleep(1.2)
        assert not order, "the second holder got the node while the first held it"
        order.append("first done")
    second.join(timeout=5)
    assert order == ["first done", "second"]
    assert told == ["trial 3 of pid 1 on host-a"]  # once, with what the holder wrote
    assert lock_path(node).read_text() == ""  # released: no stale holder text


def test_a_node_held_by_another_test_run_on_this_host_does_not_hold_this_sessions_trials(node: str) -> None:
    # Another test run or benchmark of this user on this host holds the node in the host's temporary
    # folder: this session's simulated trials keep to their own folder's locks, and do not wait.
    elsewhere = HOST_TMP / f"autotune-{os.getuid()}" / f"node-{node}.lock"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    try:
        with elsewhere.open("a") as held:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            stop = threading.Event()
            stop.set()  # NodeBusy at once, rather than a wait
            with node_held(node, "this session's trial", stop=stop):
                assert lock_path(node).read_text() == "this session's trial"
    finally:
        elsewhere.unlink(missing_ok=True)


def node_held_then(node: str, on_wait: object, done: object, label: str) -> None:
    with node_held(node, label, on_wait=on_wait):  # type: ignore[arg-type]
        done(label)  # type: ignore[operator]


def test_waiting_ends_when_the_trial_is_stopped(node: str) -> None:
    stop = threading.Event()
    with node_held(node, "first"):
        threading.Timer(0.6, stop.set).start()
        started = time.monotonic()
        with pytest.raises(NodeBusy), node_held(node, "second", stop=stop):
            pass
        assert time.monotonic() - started < 3


@pytest.mark.integration
def test_two_executors_on_one_node_never_run_servers_at_once(tmp_path: Path, node: str) -> None:
    """Two drivers' executors of the same node, each with a real simulated server: the second server is
    launched only after the first trial's teardown."""
    first = TrialExecutor(node, LocalCommandRunner(), tmp_path / "a", port_wait_s=1.0)
    second = TrialExecutor(node, LocalCommandRunner(), tmp_path / "b", port_wait_s=1.0)
    ended: dict[str, float] = {}
    results = {}

    def run(name: str, executor: TrialExecutor, number: int) -> None:
        results[name] = executor.run(request(number=number))
        ended[name] = time.monotonic()

    a = threading.Thread(target=run, args=("a", first, 1))
    a.start()
    while first.phase in ("idle",):  # the first trial holds the node before the second asks
        time.sleep(0.05)
    b = threading.Thread(target=run, args=("b", second, 2))
    b.start()
    second_log = tmp_path / "b" / "trial-0002" / "server.log"
    launched_b = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline and (a.is_alive() or b.is_alive()):
        if launched_b is None and second_log.exists():
            launched_b = time.monotonic()
        if a.is_alive():
            assert second.phase in ("idle", "waiting"), f"second trial is {second.phase!r} beside the first"
        time.sleep(0.05)
    a.join()
    b.join()
    assert results["a"].ok and results["b"].ok, (results["a"].failure, results["b"].failure)
    assert launched_b is not None and launched_b >= ended["a"] - 0.2
