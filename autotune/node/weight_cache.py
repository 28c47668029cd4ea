"""SGLang's weight cache daemon on a node (the study file's `startup.weight_cache`): one daemon holds the
model's weights in GPU memory across trials, and each launch it can serve maps them over CUDA IPC
(`--weight-cache-mode client`) instead of loading them: 0.05-0.07 s against 2.03 s from the page cache for
an 8B on one H200 (benchmarks/RESULTS-sglang-h200.md), and minutes for a large model from disk.

A client's KV pool is not the same flags' pool: SGLang sizes it as (free memory before the load) x f less
the weights the load took, and a client's free memory already lacks the daemon's weights while its load
takes nothing. So a client is launched at the matched fraction f' = (T x f - W) / T_c (T and W: a
disk-loaded launch's free memory before its load and its weights, T_c: a client's free memory before its
load), which gave the disk-loaded pool to 0.01% on the H200. The daemon serves one model and one parallel
layout (tp, pp, dp, ep), no speculative decoding, and only unquantized and block-wise FP8 weights
(0.5.17's weight_cache/protocol.py, IPC_QUANT_ALLOWLIST): a launch it cannot serve loads from disk with the
daemon stopped first (its memory would shrink that launch's pool), and the sentence says why.

`WeightCacheState` is the rule (which launch the daemon serves, at which fraction), shared by the node and
the simulated node's model; `WeightCacheKeeper` runs the daemon through the node's command runner.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from autotune.node.runner import CommandRunner, LaunchError, NodeUnreachableError, ServerProcess
from autotune.trial.launch import DP_FLAGS, MODEL_PATH_FLAG, TP_FLAGS, ServerLaunch
from autotune.trial.memory_fraction import MEM_FRACTION, launch_fraction
from autotune.trial.startup import LOADER_FLAG, WEIGHT_CACHE_CLIENT, WEIGHT_CACHE_FLAG

__all__ = [
    "DAEMON_LOG",
    "DaemonLayout",
    "LaunchPlan",
    "WeightCacheKeeper",
    "WeightCacheState",
    "daemon_layout",
    "matched_fraction",
    "read_load",
]

DAEMON_LOG = "weight-cache-daemon.log"  # beside the trial's server.log, and its MLflow artifact
# The daemon module beside each server module autotune knows (the simulated node's stands in for SGLang's).
DAEMON_MODULES = {
    "sglang.launch_server": "sglang.srt.weight_cache.daemon",
    "autotune.sim.sglang_server": "autotune.sim.weight_cache_daemon",
}
# The parallel layout the daemon is started for (its fingerprint holds them), each with its aliases.
LAYOUT_FLAGS = {
    "--tp-size": TP_FLAGS,
    "--pp-size": ("--pp-size", "--pipeline-parallel-size"),
    "--dp-size": DP_FLAGS,
    "--ep-size": ("--ep-size", "--expert-parallel-size", "--ep"),
}
# What the daemon loads the weights as: passed to it as the launch gives them (0.5.17's daemon CLI).
PASSED_FLAGS = ("--quantization", "--dtype", "--load-format", "--revision", LOADER_FLAG)
TRUST_REMOTE_CODE = "--trust-remote-code"
SPECULATIVE = "--speculative-algorithm"
# 0.5.17 and 0.5.23: weight_cache/protocol.py IPC_QUANT_ALLOWLIST ('' unquantized; fp8 block-wise only).
IPC_QUANTIZATIONS = (None, "fp8")
# What the daemon launcher logs once every rank's daemon listens (weight_cache/daemon.py, 0.5.17 and 0.5.23);
# 0.5.17's launcher configures no logging of its own, so its INFO line may not show: each rank's daemon
# logs that it listens (it does configure logging) and all of them listening is ready too.
DAEMON_READY = re.compile(r"All \d+ weight cache daemons on node \d+ are ready")
DAEMON_LISTENING = re.compile(r"\[WeightCacheDaemon gpu=(\d+)\] Listening on ")
DAEMON_LOADED = re.compile(r"Model loaded from disk in ([0-9.]+)s")
# The daemon's refusal of the model's quantization (protocol.py check_ipc_quant_support), its first line.
QUANT_REFUSED = re.compile(
    r"\[weight_cache:(?:daemon|client)\] quantization method '([^']*)' is not verified for CUDA IPC"
)
# A client whose fingerprint (model, layout, quantization, dtype, revision, GPU, torch) the daemon's does not
# match loads from disk beside it (0.5.17 ipc_loader.py:113-117).
CLIENT_FELL_BACK = "[IpcModelLoader] Weight cache not available or config mismatch, falling back to disk load"
# A server's own report of its load (model_runner.py), every rank: the free memory before it, what it took.
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=([0-9.]+) GB")
_LOAD_END = re.compile(r"Load weight end\. [^\n]*?\bmem usage=(-?[0-9.]+) GB")
_MIB_PER_GB = 1024.0  # SGLang's GB are GiB; nvidia-smi says MiB
DAEMON_STOP_GRACE_S = 15.0
READY_POLL_S = 0.2
# Flags that do not change which fraction SGLang picks for a launch that leaves it unset.
_NOT_FRACTION_FLAGS = frozenset({"--host", "--port", MEM_FRACTION, WEIGHT_CACHE_FLAG, LOADER_FLAG})


def matched_fraction(
    fraction: float, before_load_gb: float, weights_gb: float, client_before_gb: float
) -> float:
    """The --mem-fraction-static at which a weight cache client gets the KV pool a disk-loaded server gets
    at `fraction`: that server's pool is T x f - W (T its free memory before the load, W the weights it
    loaded), a client's T_c x f' (its load takes nothing); so f' = (T x f - W) / T_c. ValueError where
    there is none (readings that cannot be right, or weights that leave no pool)."""
    if not 0 < fraction < 1 or min(before_load_gb, client_before_gb) <= 0:
        raise ValueError(
            f"`0 < f < 1` and positive free memory must hold, but got ({fraction=}, {before_load_gb=}, "
            f"{client_before_gb=})."
        )
    matched = (before_load_gb * fraction - weights_gb) / client_before_gb
    if not 0 < matched < 1:
        raise ValueError(
            f"the matched fraction (T x f - W) / T_c = ({before_load_gb} x {fraction} - {weights_gb}) / "
            f"{client_before_gb} = {matched:.4f} is outside (0, 1)"
        )
    return round(matched, 5)


def read_load(log: str) -> tuple[float | None, float | None]:
    """A server log's free memory before its weight load (the least over its ranks: SGLang sizes every
    rank's pool by the least) and the weights one GPU took (the most), in GB; None where it does not say."""
    before = [float(v) for v in _LOAD_BEGIN.findall(log)]
    taken = [float(v) for v in _LOAD_END.findall(log)]
    return (min(before) if before else None, max(taken) if taken else None)


@dataclass(frozen=True)
class DaemonLayout:
    """What one daemon serves: its command, the model, the parallel layout, how the weights are loaded."""

    command: tuple[str, ...]
    model_path: str
    layout: tuple[tuple[str, int], ...]
    passed: tuple[tuple[str, str], ...]
    trust_remote_code: bool

    @property
    def argv(self) -> list[str]:
        """The daemon's command line: every rank of the layout on this node (its multi-rank mode)."""
        argv = [*self.command, MODEL_PATH_FLAG, self.model_path]
        for flag, size in self.layout:
            argv += [flag, str(size)]
        for flag, value in self.passed:
            argv += [flag, value]
        return argv + ([TRUST_REMOTE_CODE] if self.trust_remote_code else [])

    @property
    def ranks(self) -> int:
        sizes = dict(self.layout)
        return sizes["--tp-size"] * sizes["--pp-size"]

    def describe(self) -> str:
        return ", ".join(f"{flag.strip('-').split('-')[0]} {size}" for flag, size in self.layout)


def daemon_layout(launch: ServerLaunch) -> DaemonLayout | str:
    """The daemon that could serve `launch`, or the sentence why none can."""
    if launch.flag(SPECULATIVE) is not None:
        return (
            "SGLang's weight cache does not serve speculative decoding (its daemon does not hold the draft "
            "model's weights)"
        )
    quantization = launch.flag("--quantization")
    if quantization not in IPC_QUANTIZATIONS:
        return (
            f"SGLang's weight cache does not serve --quantization {quantization} (only unquantized and "
            "block-wise FP8 weights are shared over CUDA IPC)"
        )
    command = launch.command
    module = command[2] if len(command) >= 3 and command[1] == "-m" else None
    if module not in DAEMON_MODULES or launch.model_path is None:
        return f"autotune does not know the weight cache daemon of the server command {' '.join(command)!r}"
    try:
        layout = tuple((flag, int(launch.flag(*names) or 1)) for flag, names in LAYOUT_FLAGS.items())
    except ValueError:
        return "the launch's parallel sizes are not integers"
    passed = tuple((flag, value) for flag in PASSED_FLAGS if (value := launch.flag(flag)) is not None)
    trust = any(flag == TRUST_REMOTE_CODE for flag, _ in launch.flags)
    daemon_command = (command[0], "-m", DAEMON_MODULES[module])
    return DaemonLayout(daemon_command, launch.model_path, layout, passed, trust)


def started_note(layout: DaemonLayout, seconds: float) -> str:
    """The trial's note when the daemon started for it."""
    return (
        f"the weight cache daemon started for this trial ({layout.describe()}): {seconds:.0f} s of node "
        "time, counted in this trial's node hours"
    )


def client_launch(launch: ServerLaunch, fraction: float) -> ServerLaunch:
    """`launch` as a weight cache client at `fraction` (the matched one): the socket each rank finds by
    SGLang's own per-rank path."""
    value = f"{fraction:.5f}".rstrip("0")
    return launch.with_node_flags({MEM_FRACTION: value, WEIGHT_CACHE_FLAG: WEIGHT_CACHE_CLIENT})


def fraction_key(launch: ServerLaunch) -> tuple[tuple[str, str | None], ...]:
    """What SGLang's own choice of fraction depends on: the launch's flags but its address and loading."""
    return tuple((f, v) for f, v in launch.flags if f not in _NOT_FRACTION_FLAGS)


EnvKey = frozenset[tuple[str, str]]  # a launch's environment, as the readings are kept by it


def _env_key(env: Mapping[str, str]) -> EnvKey:
    return frozenset(env.items())


@dataclass
class LayoutReadings:
    """One layout's memory as its launches logged it, in GB: a disk-loaded launch's free memory before
    the load and its weights; a client's free memory before its load; the daemon's own per GPU."""

    before_load_gb: float | None = None
    weights_gb: float | None = None
    client_before_gb: float | None = None  # the latest client's
    # each environment's (its NCCL settings size the init's buffers, which come before the load)
    client_before_by_env: dict[EnvKey, float] = field(default_factory=dict)
    before_load_by_env: dict[EnvKey, float] = field(default_factory=dict)
    daemon_gb: float | None = None

    def free_gb(self, env: Mapping[str, str] | None = None) -> tuple[float, float] | None:
        """(T, T_c) for a client in `env`: the free memory before its load T_c that the latest client in
        that environment logged (else a disk-loaded launch's there, else the latest client's), and T = T_c +
        what the daemon holds (nvidia-smi), as that same launch would have had loading from disk: a launch's
        own init (NCCL buffers: the NCCL stage changes them after the baseline) is in both. Before any
        client: the disk-loaded launch's T, and T_c = T less the daemon's memory (else its weights: the
        daemon's CUDA context, about 0.6 GB on the H200, then unknown). None where neither is known."""
        held = self.daemon_gb if self.daemon_gb is not None else self.weights_gb
        client, before = self.client_before_gb, self.before_load_gb
        if env is not None:
            key = _env_key(env)
            if key in self.before_load_by_env and key not in self.client_before_by_env:
                client = None  # a disk-loaded launch in this very environment says more than another's client
            client = self.client_before_by_env.get(key, client)
            before = self.before_load_by_env.get(key, before)
        if client is not None:
            if self.daemon_gb is not None:
                return client + self.daemon_gb, client
            if before is not None:
                return before, client
        if before is None or held is None:
            return None
        return before, before - held


@dataclass(frozen=True)
class LaunchPlan:
    """What the node does for one launch: stop the daemon, start it, and the launch to start (a client at
    the matched fraction, or the plain one); `note` says why, for the trial's notes."""

    launch: ServerLaunch
    layout: DaemonLayout | None  # the daemon this launch needs running (None: none may run)
    fraction: float | None  # the launch's own fraction when it is served (the client's is then matched)
    note: str | None = None


@dataclass
class WeightCacheState:
    """What the node knows of its weight cache across trials: readings per layout, the fraction SGLang
    chose for launches that leave it unset, the layouts whose daemon refused the model, the running one."""

    readings: dict[DaemonLayout, LayoutReadings] = field(default_factory=dict)
    chosen: dict[tuple[tuple[str, str | None], ...], float] = field(default_factory=dict)
    refused: dict[DaemonLayout, str] = field(default_factory=dict)
    running: DaemonLayout | None = None

    def refuse(self, layout: DaemonLayout, quantization: str) -> str:
        """The daemon refused the model's quantization: never started for `layout` again; the sentence."""
        why = (
            f"the weight cache daemon refused this model: its quantization {quantization!r} is not one "
            "SGLang shares over CUDA IPC (only unquantized and block-wise FP8 weights)"
        )
        self.refused[layout] = why
        return why

    def plan(self, launch: ServerLaunch) -> LaunchPlan:
        """Whether the daemon serves `launch` (then the layout to run and the launch's fraction) or not
        (the plain launch, no daemon running, and the sentence why)."""
        layout = daemon_layout(launch)
        if isinstance(layout, str):
            return LaunchPlan(launch, None, None, f"weights loaded from disk: {layout}")
        if layout in self.refused:
            return LaunchPlan(launch, None, None, f"weights loaded from disk: {self.refused[layout]}")
        readings = self.readings.get(layout, LayoutReadings())
        if readings.before_load_gb is None or readings.weights_gb is None:
            why = (
                f"the first launch of this layout ({layout.describe()}) loads them, and its log gives "
                "the free memory and weights that size the weight cache's clients"
            )
            return LaunchPlan(launch, None, None, f"weights loaded from disk: {why}")
        own = launch_fraction(launch.flags)
        fraction = float(own) if own is not None else self.chosen.get(fraction_key(launch))
        if fraction is None:
            why = (
                "the launch leaves --mem-fraction-static to SGLang, and no launch of these flags has said "
                "yet which fraction it picks (a client must be launched at the matched one)"
            )
            return LaunchPlan(launch, None, None, f"weights loaded from disk: {why}")
        return LaunchPlan(launch, layout, fraction)

    def client(self, plan: LaunchPlan) -> tuple[ServerLaunch, str] | str:
        """A served `plan`'s client launch at the matched fraction with its note, or why there is none."""
        assert plan.layout is not None and plan.fraction is not None  # a served plan
        readings = self.readings[plan.layout]
        free = readings.free_gb(plan.launch.env)
        assert readings.weights_gb is not None  # plan() checked
        if free is None:
            return "weights loaded from disk: the memory the weight cache daemon holds is unknown"
        before, client_free = free
        try:
            matched = matched_fraction(plan.fraction, before, readings.weights_gb, client_free)
        except ValueError as exc:
            return f"weights loaded from disk: no matched --mem-fraction-static for a client: {exc}"
        note = (
            f"weights from the weight cache daemon, at --mem-fraction-static {matched} for the KV pool of "
            f"{plan.fraction:g} loaded from disk ((T x f - W) / T_c = ({before:.2f} x "
            f"{plan.fraction:g} - {readings.weights_gb:.2f}) / {client_free:.2f})"
        )
        return client_launch(plan.launch, matched), note

    def learn(
        self, started: ServerLaunch, planned: LaunchPlan, log: str, choices: Mapping[str, float]
    ) -> None:
        """What a finished launch's log says: a disk-loaded one's free memory and weights (for its
        layout), a client's free memory, and the fraction SGLang chose where the launch left it unset."""
        before, weights = read_load(log)
        layout = daemon_layout(planned.launch)
        client = started.flag(WEIGHT_CACHE_FLAG) == WEIGHT_CACHE_CLIENT
        if isinstance(layout, DaemonLayout) and before is not None:
            readings = self.readings.setdefault(layout, LayoutReadings())
            if client and CLIENT_FELL_BACK in log:
                self.refused[layout] = (
                    "a client of the weight cache daemon loaded from disk instead (SGLang: 'Weight cache not "
                    "available or config mismatch'), so the daemon is not used again for this layout"
                )
            elif client:
                if weights is not None and weights < 0.5:  # mapped, not fallen back to disk
                    readings.client_before_gb = before
                    readings.client_before_by_env[_env_key(started.env)] = before
            elif weights is not None and self.running is None:  # a whole GPU: nothing else held memory
                readings.before_load_gb, readings.weights_gb = before, weights
                readings.before_load_by_env[_env_key(started.env)] = before
        chose = choices.get(MEM_FRACTION)
        if chose is not None and not client and launch_fraction(planned.launch.flags) is None:
            self.chosen[fraction_key(planned.launch)] = float(chose)


@dataclass(frozen=True)
class Prepared:
    """A launch as the weight cache leaves it: what to start, the sentences for the trial's notes, the
    node seconds a daemon start took for it (0: none), and that start's log."""

    launch: ServerLaunch
    plan: LaunchPlan | None
    notes: tuple[str, ...] = ()
    daemon_s: float = 0.0
    daemon_log: str = ""


class WeightCacheKeeper:
    """Owns one node's weight cache daemon: started for the first launch it can serve, kept across
    trials, stopped (its process group) before a launch it cannot serve and at `close`."""

    def __init__(self, runner: CommandRunner, nvidia_smi: Sequence[str] = ("nvidia-smi",)) -> None:
        self.runner = runner
        self.nvidia_smi = tuple(nvidia_smi)
        self.state = WeightCacheState()
        self._daemon: ServerProcess | None = None

    @property
    def daemon_pgid(self) -> int | None:
        """The running daemon's process group, None when none runs."""
        return self._daemon.pgid if self._daemon is not None else None

    def prepare(
        self,
        launch: ServerLaunch,
        folder: Path,
        wanted: bool,
        timeout_s: float,
        stopped: Callable[[], bool] = lambda: False,
    ) -> Prepared:
        """The launch to start for a trial whose log folder is `folder`: a client of the daemon (started
        now when it must be, its log in `folder`) where it serves the launch, else the plain launch with no
        daemon running. `wanted` False (the study's weight_cache off): the plain launch, no daemon.
        `stopped()` True (the trial was stopped): the daemon's start is not waited for."""
        if self._daemon is not None and self._daemon.poll() is not None:
            self._daemon, self.state.running = None, None  # it died: a served launch starts another
        if not wanted:
            self.stop()
            return Prepared(launch, None)
        plan = self.state.plan(launch)
        if plan.layout is None or plan.layout != self.state.running:
            self.stop()
        if plan.layout is None:
            return Prepared(launch, plan, (plan.note,) if plan.note else ())
        daemon_s, daemon_log, notes = 0.0, "", []
        if self.state.running is None:
            started = self._start(plan.layout, launch.env, folder / DAEMON_LOG, timeout_s, stopped)
            daemon_s, daemon_log, why = started
            if why is not None:
                return Prepared(launch, replace(plan, layout=None), (why,), daemon_s, daemon_log)
            notes.append(started_note(plan.layout, daemon_s))
        client = self.state.client(plan)
        if isinstance(client, str):
            self.stop()
            return Prepared(launch, replace(plan, layout=None), (*notes, client), daemon_s, daemon_log)
        served, note = client
        return Prepared(served, plan, (*notes, note), daemon_s, daemon_log)

    def learn(
        self, started: ServerLaunch, prepared: Prepared, log: str, choices: Mapping[str, float]
    ) -> None:
        """What the trial's server log says for later launches (`WeightCacheState.learn`)."""
        if prepared.plan is not None:
            self.state.learn(started, prepared.plan, log, choices)

    def _start(
        self,
        layout: DaemonLayout,
        env: Mapping[str, str],
        log_path: Path,
        timeout_s: float,
        stopped: Callable[[], bool],
    ) -> tuple[float, str, str | None]:
        """Start the daemon and wait until every rank listens: its node seconds, its log, and the sentence
        why it is not serving (None: it is)."""
        # The daemon refuses expandable_segments: memory it hands out cannot be exported over CUDA IPC.
        env = {k: v for k, v in env.items() if not (k.endswith("ALLOC_CONF") and "expandable_segments" in v)}
        used_before = self._gpu_used_mib(env)
        began = time.monotonic()
        try:
            process = self.runner.start(layout.argv, env, log_path)
        except LaunchError as exc:
            return 0.0, "", f"weights loaded from disk: the weight cache daemon did not start: {exc.reason}"
        self._daemon = process
        log, ready = "", False
        while time.monotonic() - began < timeout_s:
            log = process.read_log()
            if DAEMON_READY.search(log) or len(set(DAEMON_LISTENING.findall(log))) >= layout.ranks:
                ready = True
                break
            if process.poll() is not None or stopped():
                break
            time.sleep(READY_POLL_S)
        log = process.read_log()
        loaded = DAEMON_LOADED.search(log)
        seconds = max(time.monotonic() - began, float(loaded.group(1)) if loaded else 0.0)
        if not ready:
            self.stop()
            refused = QUANT_REFUSED.search(log)
            if refused is not None:
                why = self.state.refuse(layout, refused.group(1))
                return seconds, log, f"weights loaded from disk: {why}"
            lines = [line for line in log.splitlines() if line.strip()]
            last = lines[-1].strip() if lines else "no output"
            state = (
                "start was stopped with the trial"
                if stopped()
                else "exited"
                if process.poll() is not None
                else f"was not ready in {timeout_s:.0f} s"
            )
            return seconds, log, f"weights loaded from disk: the weight cache daemon {state}: {last[:300]}"
        self.state.running = layout
        used_after = self._gpu_used_mib(env)
        if used_before and used_after:
            held = max(after - before for before, after in zip(used_before, used_after, strict=False))
            self.state.readings.setdefault(layout, LayoutReadings()).daemon_gb = held / _MIB_PER_GB
        return seconds, log, None

    def _gpu_used_mib(self, env: Mapping[str, str]) -> list[float]:
        """Each GPU's used memory as the node's nvidia-smi says it ([] where it does not answer)."""
        query = [*self.nvidia_smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"]
        try:
            done = self.runner.run(query, dict(env), timeout_s=30)
        except (NodeUnreachableError, TimeoutError):
            return []
        used = []
        for line in done.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            try:
                used.append(float(parts[1]))
            except (IndexError, ValueError):
                return []
        return used if done.returncode == 0 else []

    def stop(self) -> None:
        """Stop the daemon's process group, if one runs."""
        daemon, self._daemon, self.state.running = self._daemon, None, None
        if daemon is not None:
            daemon.stop(grace_s=DAEMON_STOP_GRACE_S)
