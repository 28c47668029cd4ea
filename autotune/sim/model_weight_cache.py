"""The weight cache on the model node (autotune.sim.model_node): the node's own rule
(autotune.node.weight_cache.WeightCacheState: which launch the daemon serves, at which fraction) with what a
simulated daemon costs instead of a process: its load (from disk, or from the page cache an earlier launch
filled) and init as node time, the GPU memory it holds, and a client's 0.07 s load."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autotune.node.weight_cache import LaunchPlan, WeightCacheState, started_note
from autotune.sim.model import NodePerformanceModel
from autotune.sim.model.startup import disk_load_seconds, load_threads
from autotune.sim.profiles import HardwareProfile, ModelProfile
from autotune.sim.weight_cache_daemon import IPC_QUANTIZATIONS, daemon_held_gb
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import LOADER_FLAG


@dataclass(frozen=True)
class ModelLaunch:
    """A launch as the model node's weight cache leaves it: what to predict, the daemon's memory on each
    GPU, whether the launch maps the weights, the node seconds a daemon start took, the notes."""

    launch: ServerLaunch
    plan: LaunchPlan | None
    held_gb: float = 0.0
    mapped: bool = False
    daemon_s: float = 0.0
    notes: tuple[str, ...] = ()


class ModelWeightCache:
    """One model node's weight cache daemon, as the node's keeper runs it (autotune.node.weight_cache)."""

    def __init__(self, hardware: HardwareProfile, model: ModelProfile) -> None:
        self.hardware, self.model = hardware, model
        self.state = WeightCacheState()
        self.held_gb = 0.0

    def prepare(self, launch: ServerLaunch, in_page_cache: bool, init_s: Callable[[], float]) -> ModelLaunch:
        """`launch` as a client of the daemon (started now when it must be: its load from the page cache
        when `in_page_cache`, and the init `init_s()` gives) or the plain launch with no daemon running."""
        plan = self.state.plan(launch)
        if plan.layout is None or plan.layout != self.state.running:
            self.state.running, self.held_gb = None, 0.0
        if plan.layout is None:
            return ModelLaunch(launch, plan, notes=(plan.note,) if plan.note else ())
        notes: list[str] = []
        daemon_s = 0.0
        if self.state.running is None:
            quantization = launch.flag("--quantization") or self.model.quantization
            daemon_s = init_s()  # the refusal comes before the load (protocol.py check_ipc_quant_support)
            if quantization not in IPC_QUANTIZATIONS:
                why = self.state.refuse(plan.layout, str(quantization))
                return ModelLaunch(
                    launch, plan, daemon_s=daemon_s, notes=(f"weights loaded from disk: {why}",)
                )
            threads = load_threads(launch.flag(LOADER_FLAG))
            daemon_s += disk_load_seconds(self.hardware, self.model, threads, in_page_cache)
            self.held_gb = daemon_held_gb(self.hardware, self.model, plan.layout.ranks)
            self.state.running = plan.layout
            self.state.readings[plan.layout].daemon_gb = self.held_gb
            notes.append(started_note(plan.layout, daemon_s))
        client = self.state.client(plan)
        if isinstance(client, str):
            self.state.running, self.held_gb = None, 0.0
            return ModelLaunch(launch, plan, daemon_s=daemon_s, notes=(*notes, client))
        served, note = client
        return ModelLaunch(served, plan, self.held_gb, True, daemon_s, (*notes, note))

    def learn(self, prepared: ModelLaunch, node: NodePerformanceModel, chosen: float) -> None:
        """What the launch's log would say (its load lines, SGLang's fraction), read as the node reads it."""
        failure = node.startup_failure
        if prepared.plan is None or (failure is not None and failure.phase in ("init", "load")):
            return
        plan = node.plan
        log = (
            f"Load weight begin. avail mem={plan.total_gb - plan.init_used_gb:.2f} GB\n"
            f"Load weight end. elapsed=0 s, avail mem={plan.avail_after_weights_gb:.2f} GB, "
            f"mem usage={plan.weights_gb:.2f} GB."
        )
        self.state.learn(prepared.launch, prepared.plan, log, {"--mem-fraction-static": chosen})
