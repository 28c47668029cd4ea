"""Where trials run: a pool of nodes, one trial per node at a time.

The study loop hands a `TrialRequest` to a free node and collects `TrialResult`s; it does not know whether
the node is a Ray actor on a cluster (`RayNodePool`, the product) or an object in this process
(`LocalNodePool`: benchmarks of the tuner, or `autotune run --no-ray`, where `in_process_pool` gives each
node a `TrialExecutor` as its actor would). A node that dies mid-trial yields a NODE_LOST
result, never an exception.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol

from autotune.config import NodeSpec, Study
from autotune.errors import AutotuneError
from autotune.node.check import NodeCheckError, NodeReport, check_nodes
from autotune.node.executor import (
    NodeActor,
    TrialExecutor,
    check_executor_node,
    quick_node_check,
    runner_for,
)
from autotune.trial.failures import Failure, FailureKind
from autotune.trial.wire import TrialRequest, TrialResult

GPU_NODE_RESOURCE = "gpu_node"
DISCOVERY_S = 5.0  # how often a discovering pool looks for nodes that joined the cluster
# A new actor starts in seconds, then stops what its dead predecessor left (SGLang's clean stop: 15 s).
ACTOR_TAKEOVER_S = 60.0
CLOSE_TIMEOUT_S = 60.0  # an actor's weight cache daemon stops within its grace (15 s) and a group kill


class Executor(Protocol):
    """Runs trials on one node (TrialExecutor, or a model of one)."""

    phase: str

    def run(self, request: TrialRequest) -> TrialResult: ...

    def abort(self) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Submitted:
    """A trial handed to a node."""

    node: str
    request: TrialRequest


def lost(node: str, request: TrialRequest, why: str) -> TrialResult:
    """The result of a trial whose node went away under it."""
    kind = FailureKind.NODE_LOST
    return TrialResult(request.number, node, None, Failure(kind, why, "node lost", kind.advice), None, None)


class NodePool(ABC):
    """Nodes that run one trial each at a time."""

    @abstractmethod
    def idle_nodes(self) -> list[str]:
        """Nodes ready for a trial now (nodes that joined since the last call included)."""

    @abstractmethod
    def submit(self, node: str, request: TrialRequest) -> Submitted:
        """Start `request` on `node`, which must be idle."""

    @abstractmethod
    def wait(self, timeout_s: float) -> list[tuple[Submitted, TrialResult]]:
        """The trials that finished within `timeout_s` (possibly none)."""

    @abstractmethod
    def phase(self, submitted: Submitted) -> str | None:
        """The phase of a running trial (launching, loading, ..., benchmarking), None if unknown."""

    @abstractmethod
    def abort_all(self) -> None:
        """Ask every running trial to stop its server now; their results still arrive through wait()."""

    @abstractmethod
    def close(self) -> None:
        """Release the nodes."""

    def facts(self, node: str) -> NodeReport | None:
        """What the node check found on `node` (GPUs, weights), when it ran."""
        return None


class LocalNodePool(NodePool):
    """Executors in this process, each trial in a thread: no Ray (benchmarks of the tuner; `--no-ray`)."""

    def __init__(
        self, executors: Mapping[str, Executor], facts: Mapping[str, NodeReport] | None = None
    ) -> None:
        self._executors = dict(executors)
        self._facts = dict(facts or {})
        self._threads = ThreadPoolExecutor(max_workers=max(1, len(executors)), thread_name_prefix="node")
        self._running: dict[Future[TrialResult], Submitted] = {}

    def facts(self, node: str) -> NodeReport | None:
        return self._facts.get(node)

    def idle_nodes(self) -> list[str]:
        busy = {s.node for s in self._running.values()}
        return [name for name in self._executors if name not in busy]

    def submit(self, node: str, request: TrialRequest) -> Submitted:
        submitted = Submitted(node, request)
        self._running[self._threads.submit(self._executors[node].run, request)] = submitted
        return submitted

    def wait(self, timeout_s: float) -> list[tuple[Submitted, TrialResult]]:
        done, _ = wait(list(self._running), timeout=timeout_s, return_when="FIRST_COMPLETED")
        return [(self._running.pop(future), future.result()) for future in done]

    def phase(self, submitted: Submitted) -> str | None:
        return self._executors[submitted.node].phase

    def abort_all(self) -> None:
        for submitted in self._running.values():
            self._executors[submitted.node].abort()

    def close(self) -> None:
        self._threads.shutdown(wait=True)
        for executor in self._executors.values():
            executor.close()  # what outlives a trial (the weight cache daemon) ends with the study


def say_left_behind(reports: Iterable[NodeReport]) -> None:
    """One line per node whose check first stopped servers a dead driver or actor had left running."""
    for report in reports:
        if report.stopped_left_behind:
            groups = ", ".join(str(g) for g in report.stopped_left_behind)
            n = len(report.stopped_left_behind)
            print(
                f"autotune: node {report.node}: stopped {n} server{'s' * (n > 1)} that a dead driver or node "
                f"actor left running (process group{'s' * (n > 1)} {groups})",
                file=sys.stderr,
            )


def in_process_pool(study: Study) -> LocalNodePool:
    """The study's nodes as trial executors in this process, without Ray (`autotune run --no-ray`): each
    reaches its node as a Ray actor would (`runner_for`: a local process or SSH), with the same logs."""
    if study.file.ray.discover_nodes:
        raise AutotuneError("ray.discover_nodes finds nodes through Ray: list the nodes, or run with Ray")
    executors: dict[str, TrialExecutor] = {}
    for spec in study.file.nodes:
        workdir = study.workdir / "nodes" / spec.name
        runner = runner_for(spec, workdir)
        executors[spec.name] = TrialExecutor(
            spec.name,
            runner,
            workdir,
            benchmark_on_node=spec.benchmark_from == "node",
            nvidia_smi=spec.nvidia_smi,
        )
    # The same check as the Ray pool's before any trial: problems with their fixes, and what each node is
    # (its hardware fingerprint and the SGLang version and flags its launches are spelled for).
    server = study.file.server
    reports = [check_executor_node(spec, executors[spec.name], server) for spec in study.file.nodes]
    failed = [r for r in reports if not r.ok]
    if failed:
        raise NodeCheckError(failed)
    say_left_behind(reports)
    return LocalNodePool(executors, {r.node: r for r in reports})


def nodes_checked_here(study: Study) -> list[NodeSpec]:
    """The study's nodes that this machine can check before Ray starts: every ssh:// node, and a local
    node unless the study joins a Ray cluster (whose actor may run it on another machine)."""
    cluster = study.file.ray.address or os.environ.get("RAY_ADDRESS")
    return [node for node in study.file.nodes if node.address != "local" or not cluster]


def connect_ray(study: Study) -> None:
    """Join the study's Ray cluster, or start a local runtime whose nodes are the study's `gpu_node`s."""
    import ray

    if ray.is_initialized():
        return
    address = study.file.ray.address or os.environ.get("RAY_ADDRESS")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # a local runtime for one user needs no token
    # ray.init takes SIGTERM (its core worker then dumps and aborts on it): a handler the caller set stays.
    kept = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(
                address="local",  # a runtime of our own, never another session's cluster on this machine
                num_cpus=max(2, os.cpu_count() or 2),
                resources={GPU_NODE_RESOURCE: len(study.file.nodes)},
                include_dashboard=False,
                log_to_driver=False,
            )
    finally:
        if callable(kept):
            signal.signal(signal.SIGTERM, kept)


ACTOR_NAMESPACE = "autotune"


def actor_name(study: str, node: str, generation: int = 1) -> str:
    """The name of the actor that owns `node` for `study`, in the `autotune` Ray namespace; an actor that
    takes over from a dead one has a name of its own (`#2`, ...): Ray frees a dead actor's name only some
    time after its process died."""
    return f"{study}:{node}" if generation == 1 else f"{study}:{node}#{generation}"


class RayNodePool(NodePool):
    """One `NodeActor` per node, each holding its node's `gpu_node` resource.

    The nodes are the study file's, or, with `ray.discover_nodes`, every node of the cluster that
    advertises `gpu_node` (checked again every few seconds, so a node that joins later is used).
    """

    def __init__(self, study: Study) -> None:
        import ray

        if not study.file.ray.discover_nodes:  # the port and the model folders before Ray's minute
            quick_node_check(nodes_checked_here(study), study.file.server)
        connect_ray(study)
        self._study = study
        self._actor_class = ray.remote(NodeActor)
        self._discovering = study.file.ray.discover_nodes
        self._specs: dict[str, NodeSpec] = {}
        self._placement: dict[str, str] = {}  # node name -> Ray node id, when discovered
        self._actors: dict[str, Any] = {}
        self._generations: dict[str, int] = {}  # node name -> how many actors it has had
        self._running: dict[Any, Submitted] = {}
        self._last_discovery = 0.0
        if self._discovering:
            self._discover()
        else:
            for spec in study.file.nodes:
                self._specs[spec.name] = spec
                self._actors[spec.name] = self._new_actor(spec)
        # Before any trial: every problem, with its fix; and what each node is, for the study's records.
        self._reports = {r.node: r for r in check_nodes(study.file.server, self._actors)}
        say_left_behind(self._reports.values())
        self._keep_required_hardware()

    def _keep_required_hardware(self) -> None:
        import ray

        wanted = self._study.file.ray.require_hardware
        if not wanted:
            return
        for name in list(self._actors):
            hardware = self._reports[name].hardware if name in self._reports else None
            if hardware is None or wanted not in hardware:
                ray.kill(self._actors.pop(name), no_restart=True)
        if not self._actors:
            found = sorted({str(r.hardware) for r in self._reports.values()})
            raise AutotuneError(
                f"no node matches ray.require_hardware {wanted!r} (found: {', '.join(found)}): "
                "change require_hardware, or add nodes of that kind to the cluster"
            )

    def facts(self, node: str) -> NodeReport | None:
        return self._reports.get(node)

    def _new_actor(self, spec: NodeSpec) -> Any:
        options: dict[str, Any] = {
            "num_cpus": 0,
            "resources": {GPU_NODE_RESOURCE: 1},
            "max_concurrency": 2,
            # Findable by operators (and tests).
            "name": actor_name(self._study.name, spec.name, self._generations.get(spec.name, 1)),
            "namespace": ACTOR_NAMESPACE,
        }
        if spec.name in self._placement:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self._placement[spec.name], soft=False
            )
        workdir = str(self._study.workdir / "nodes" / spec.name)
        return self._actor_class.options(**options).remote(spec, workdir)

    def _discover(self) -> None:
        import ray

        self._last_discovery = time.monotonic()
        template = self._study.file.nodes[0]
        for node in ray.nodes():
            if not node.get("Alive") or node.get("Resources", {}).get(GPU_NODE_RESOURCE, 0) < 1:
                continue
            name = f"{node.get('NodeManagerHostname', 'node')}-{node['NodeID'][:8]}"
            if name in self._actors:
                continue
            self._placement[name] = node["NodeID"]
            self._specs[name] = template.model_copy(update={"name": name})
            self._actors[name] = self._new_actor(self._specs[name])

    def _node_alive(self, name: str) -> bool:
        import ray

        node_id = self._placement.get(name)
        return node_id is None or any(n["NodeID"] == node_id and n.get("Alive") for n in ray.nodes())

    def idle_nodes(self) -> list[str]:
        if self._discovering and time.monotonic() - self._last_discovery > DISCOVERY_S:
            self._discover()
        busy = {s.node for s in self._running.values()}
        return [name for name in self._actors if name not in busy]

    def submit(self, node: str, request: TrialRequest) -> Submitted:
        submitted = Submitted(node, request)
        self._running[self._actors[node].run_trial.remote(request)] = submitted
        return submitted

    def wait(self, timeout_s: float) -> list[tuple[Submitted, TrialResult]]:
        import ray

        if not self._running:
            time.sleep(timeout_s)
            return []
        ready, _ = ray.wait(list(self._running), num_returns=len(self._running), timeout=timeout_s)
        finished = []
        for ref in ready:
            submitted = self._running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                taken_over = self._take_over(submitted.node)
                why = f"the node's actor died; {taken_over}: {' '.join(str(exc).split())}"
                result = lost(submitted.node, submitted.request, why[:500])
            finished.append((submitted, result))
        return finished

    def _take_over(self, node: str) -> str:
        """After `node`'s actor died: a new actor for it, which first stops the server the dead one left
        running (its process group outlives the actor's process), or none when the node left the cluster.
        Says what happened, for the lost trial's record."""
        import ray

        if not self._node_alive(node):
            del self._actors[node]
            return "its node left the Ray cluster"
        self._generations[node] = self._generations.get(node, 1) + 1
        actor = self._actors[node] = self._new_actor(self._specs[node])
        try:
            stopped = ray.get(actor.stopped_left_behind.remote(), timeout=ACTOR_TAKEOVER_S)
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            # It stops them before its first trial all the same (an actor's calls wait for its start).
            return f"a new actor for the node did not start within {ACTOR_TAKEOVER_S:g} s"
        if not stopped:
            return "a new actor took the node; no server of the dead one was left running"
        groups = ", ".join(str(g) for g in stopped)
        return f"its server (process group {groups}) was stopped by the node's new actor"

    def phase(self, submitted: Submitted) -> str | None:
        import ray

        ref = self._actors[submitted.node].phase.remote()
        try:
            return str(ray.get(ref, timeout=5))
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            return None

    def abort_all(self) -> None:
        for submitted in self._running.values():
            self._actors[submitted.node].abort.remote()

    def close(self) -> None:
        import ray

        # Each actor first stops what outlives a trial (the weight cache daemon): a kill runs no clean-up.
        closing = [actor.close.remote() for actor in self._actors.values()]
        try:
            ray.wait(closing, num_returns=len(closing), timeout=CLOSE_TIMEOUT_S)
        except Exception:  # a dead actor's node is swept by the next runner on its records
            pass
        for actor in self._actors.values():
            ray.kill(actor, no_restart=True)
        self._actors.clear()
