"""A node that answers from the model instead of running a server: for measuring the tuner itself.

`ModelNodeExecutor` takes the same `TrialRequest` a real node takes (the launch's argv and env, the
objective's workload), asks `predict` what SGLang would do, and returns the `TrialResult` a real node
would: a benchmark result, or the failure classified by the same pattern table from what the real node
reads (the server's whole traceback, or the benchmark's first error). No process, no sleep: thousands of
trials a minute. Its `startup_s` and `benchmark_s` are the model's seconds, so a caller can count the node
time a study would have spent.
"""

from __future__ import annotations

import os
from dataclasses import replace
from functools import partial

from autotune.measure.client import BenchmarkResult, MissLimit, RequestOutcome, Workload, summarize
from autotune.measure.nccl import BenchSettings
from autotune.measure.plan import MeasurementPlan, run_plan_sync
from autotune.measure.workloads import arrival_offsets
from autotune.node.check import GPU, NodeReport, slowest_link
from autotune.node.page_cache import WeightFile, WeightListing, keep_plan
from autotune.node.presharded import (
    DUMP_FILE_BYTES,
    DumpRoom,
    dump_folders,
    dump_note,
    presharded_launch,
    wants_presharded,
)
from autotune.node.startup_phases import DUMP_PHASE, PAGE_CACHE_PHASE
from autotune.node.startup_prep import HostMemory, fit_loader
from autotune.sim.engine import RequestTimes, input_too_long, run_arrivals
from autotune.sim.model import MemoryPlan, NodePerformanceModel
from autotune.sim.model.noise import SimNoise
from autotune.sim.model.startup import KEEP_READ_GBPS, dump_part, presharded_dump, weights_fit_page_cache
from autotune.sim.model_weight_cache import ModelLaunch, ModelWeightCache
from autotune.sim.nccl_job import JOB_SECONDS, allreduce_payload
from autotune.sim.nvidia_smi import DRIVER_VERSION, topology
from autotune.sim.predict import Prediction, predict
from autotune.sim.profiles import HardwareProfile, ModelProfile, StandardWorkload
from autotune.sim.versions import sglang_version
from autotune.trial.failures import Failure, FailureKind, classify
from autotune.trial.launch import ServerLaunch
from autotune.trial.startup import LOAD_FORMAT_FLAG, PRESHARDED, PRESHARDED_PATH_KEY, loader_config
from autotune.trial.wire import TrialRequest, TrialResult

_SERVER_FLAGS_START = "--model-path"
# The node's dump folder for presharded weights (a real node's is in its work folder).
PRESHARDED_ROOT = "/node/presharded"
# MemAvailable on an idle node, as a share of its host memory: the kernel, the GPU driver and the node's
# daemons hold the rest (an assumption; no profile measures it).
IDLE_AVAILABLE_SHARE = 0.95


def _server_flags(launch: ServerLaunch) -> list[str]:
    """The launch's server flags, from `--model-path` on (the command before it is not the model's)."""
    argv = list(launch.argv)
    return argv[argv.index(_SERVER_FLAGS_START) :] if _SERVER_FLAGS_START in argv else argv


def startup_seconds(node: NodePerformanceModel) -> float:
    """Model seconds from launch until the server is ready, or until it dies of its start-up failure:
    the simulated server's timeline (init, weight load, KV pool, graph capture)."""
    failure = node.startup_failure
    phase = failure.phase if failure is not None else None
    init, load, capture, prefill = (
        node.init_seconds,
        node.load_seconds,
        node.capture_seconds,
        node.prefill_capture_seconds,
    )
    if phase == "init":
        return init / 2
    if phase == "load":  # dies as the load begins
        return init
    if phase in ("kv", "runner"):
        return init + load
    if phase == "prefill_capture":  # dies halfway through the prefill graphs, which come first
        return init + load + prefill / 2
    if phase == "capture":  # dies capturing the first decode batch size, after the prefill graphs
        return init + load + prefill + capture / max(len(node.plan.captured_batch_sizes), 1)
    return init + load + prefill + capture  # ready, or dying on the warm-up request after start-up


def startup_phases(node: NodePerformanceModel) -> dict[str, float]:
    """The start-up phases the simulated server logs for this launch (node.startup_phases' names), up to
    the phase its start-up failure dies in; ready_s only when it gets there."""
    failure = node.startup_failure
    phase = failure.phase if failure is not None else None
    if phase == "init":
        return {}
    phases = {"init_s": node.init_seconds}
    if phase != "load":
        phases["weight_load_s"] = node.load_seconds
        if dump := dump_part(node):
            phases[DUMP_PHASE] = dump
    if phase not in ("load", "kv", "runner"):
        phases["kv_pool_s"] = 0.0
    if phase is None or phase == "warmup":
        phases["cuda_graph_s"] = node.prefill_capture_seconds + node.capture_seconds
    if phase is None:
        phases["ready_s"] = startup_seconds(node)
    return {name: round(seconds, 2) for name, seconds in phases.items()}


def node_report(node: str, hardware: HardwareProfile, model: ModelProfile) -> NodeReport:
    """What the node check would find on a simulated node: its GPUs (as autotune.sim.nvidia_smi lists
    them) and the model's weights."""
    mib = hardware.gpu_memory_gb * 1000 / 1.048576
    gpus = tuple(GPU(i, hardware.gpu_name, mib, mib - 500, DRIVER_VERSION) for i in range(hardware.num_gpus))
    links = slowest_link(topology(hardware)) if hardware.num_gpus > 1 else None
    return NodeReport(
        node, (), gpus, None, int(model.weight_gb * 1e9), sglang_version(os.environ).name, gpu_links=links
    )


def model_weight_files(model: ModelProfile, launch: ServerLaunch, dumped: bool) -> list[WeightFile]:
    """The files a launch of `model` reads its weights from: the checkpoint's shards, every rank reading
    each; or, where the layout's dump is finished, each rank's own share in files of the dump's size."""
    weight_bytes = int(model.weight_gb * 1e9)
    if not dumped:
        shard = weight_bytes // model.num_shards
        total = model.num_shards
        return [WeightFile(f"model-{i + 1:05d}-of-{total:05d}.safetensors", shard) for i in range(total)]
    tp = max(launch.tensor_parallel_size, 1)
    file_bytes = int(str(loader_config(launch).get("max_file_bytes", DUMP_FILE_BYTES)))
    per_rank = weight_bytes // tp
    count = -(-per_rank // file_bytes)
    names = [(r, r * count + i) for r in range(tp) for i in range(count)]  # as SGLang names them (loader.py)
    return [WeightFile(f"model-{n:05d}-rank-{r:03d}.safetensor", per_rank // count, (r,)) for r, n in names]


def host_memory(hardware: HardwareProfile, model: ModelProfile) -> HostMemory | None:
    """What the node's probe would read on an idle node of `hardware` holding `model`'s shards; None where
    the profile does not say how much host memory the node has."""
    if hardware.host_memory_gb is None:
        return None
    shard_gb = model.weight_gb / model.num_shards
    available = int(hardware.host_memory_gb * IDLE_AVAILABLE_SHARE * 1e9)
    return HostMemory(available, int(shard_gb * 1e9), int(model.weight_gb * 1e9))


def server_memory(node: NodePerformanceModel) -> dict[str, float]:
    """The memory report the simulated server logs (logwatch.server_memory's keys), as far as its start-up
    gets: the weights once loaded, the KV pool once allocated."""
    failure, plan = node.startup_failure, node.plan
    phase = failure.phase if failure is not None else None
    memory: dict[str, float] = {}
    if phase not in ("init", "load"):
        memory["weights_gb"] = round(plan.weights_gb, 2)
    if phase not in ("init", "load", "kv", "runner"):
        memory["kv_cache_tokens"] = float(plan.kv_tokens)
        memory["kv_cache_gb"] = round(plan.kv_gb, 2)
    return memory


def server_choices(plan: MemoryPlan) -> dict[str, float]:
    """What SGLang logs in `server_args=` for the flags autotune reads back (logwatch.CHOSEN_BY_SERVER):
    0.5.17 logs the graphs' batch limits inside `cuda_graph_config=`, per phase."""
    return {
        "--mem-fraction-static": plan.mem_fraction_static,
        "--cuda-graph-max-bs-decode": float(plan.cuda_graph_max_bs),
        "--cuda-graph-max-bs-prefill": float(plan.prefill_graph_max_tokens),
        "--chunked-prefill-size": float(plan.chunked_prefill_size),
    }


class ModelNodeExecutor:
    """Runs trials by asking the simulated node's model; noise as the simulated server would add it."""

    def __init__(
        self, node: str, hardware: HardwareProfile, model: ModelProfile, noise: SimNoise | float = 0.0
    ) -> None:
        self.node = node
        self.hardware = hardware
        self.model = model
        self.noise = noise
        self.phase = "idle"
        self._kept = NodeKeeps()
        self._weight_cache = ModelWeightCache(hardware, model)
        self._cached: ModelLaunch | None = None  # the running launch as the weight cache left it
        self._node: NodePerformanceModel | None = None  # the running launch's model

    def abort(self) -> None:
        """Nothing runs long enough to abort."""

    def close(self) -> None:
        """No process outlives a trial here."""

    def run(self, request: TrialRequest) -> TrialResult:
        if request.job:
            return self._run_job(request)
        cached = ModelLaunch(request.launch, None)
        if request.weight_cache:  # the node's own rule (node.weight_cache), a daemon's costs modelled
            in_page_cache = self.model.name in self._kept.page_cache
            init_s = partial(self._init_s, request)  # asked only where a daemon starts
            cached = self._weight_cache.prepare(request.launch, in_page_cache, init_s)
            request = replace(request, launch=cached.launch)
            if cached.daemon_s and weights_fit_page_cache(self.hardware, self.model):
                self._kept.page_cache.add(self.model.name)  # the daemon read them
        else:
            self._weight_cache.state.running = None
        memory = host_memory(self.hardware, self.model)
        step_s = 0.0
        if memory is not None:  # the node's own rules (startup_prep), as it fits a real node's launch
            request, note = self._fit(request, memory)
            cached = replace(cached, notes=(*cached.notes, *note))
            step_s = self._page_cache(request, memory) if request.weights_in_page_cache else 0.0
        self._cached, self._node = cached, None
        if request.plan is not None:
            result = self._run_plan(request, request.plan)
        else:
            result = self._run_one(request)
        result = replace(result, startup_notes=(*cached.notes, *result.startup_notes))
        if step_s:  # the node's step before the launch: node time, as a real node counts it
            phases = {PAGE_CACHE_PHASE: round(step_s, 2), **result.startup_phases}
            result = replace(result, startup_phases=phases, node_s=(result.node_seconds or 0.0) + step_s)
        if cached.daemon_s:  # node time, counted with the trial it started for
            result = replace(result, node_s=(result.node_seconds or 0.0) + cached.daemon_s)
        if request.weight_cache and self._node is not None:
            self._weight_cache.learn(cached, self._node, self._node.plan.mem_fraction_static)
        return result

    def _run_one(self, request: TrialRequest, stop: MissLimit | None = None) -> TrialResult:
        """One launch and one benchmark of its workload, which stops sending where `stop` says."""
        cached = self._cached or ModelLaunch(request.launch, None)
        flags = _server_flags(request.launch)
        w = request.serving_workload
        workload = StandardWorkload(
            num_prompts=w.num_prompts,
            input_len=w.input_len,
            output_len=w.output_len,
            concurrency=w.concurrency,
        )
        answer = predict(
            self.hardware,
            self.model,
            flags,
            request.launch.env,
            workload,
            seed=request.seed,
            noise=self.noise,
            version=sglang_version(os.environ),
            play=w.request_rate is None,  # a rate is played as arrivals by _open_loop instead
            gpu_held_gb=cached.held_gb,
            weights_mapped=cached.mapped,
        )
        self._kept.apply(answer.node, request.compile_cache)
        result = replace(
            self._outcome(request, answer, stop),
            server_choices=server_choices(answer.plan),
            server_memory=server_memory(answer.node),
            startup_phases=startup_phases(answer.node),
        )
        if DUMP_PHASE in result.startup_phases:  # the node's note, as a real node adds it
            result = replace(result, startup_notes=(*result.startup_notes, dump_note(request.launch)))
        self._node = self._node or answer.node  # the launch's (later runs of a plan reuse it)
        self._kept.after(answer.node, request.compile_cache)
        return result

    def _fit(self, request: TrialRequest, memory: HostMemory) -> tuple[TrialRequest, list[str]]:
        """`request` with its weight loading fitted to the host's memory and, where the study asks and it
        helps, presharded weights in the node's dump folder: a real node's rules (node.startup_prep)."""
        launch = fit_loader(request.launch, memory)[0]
        if not (request.presharded_weights and wants_presharded(launch, memory)):
            return replace(request, launch=launch), []
        folders = dump_folders(launch, PRESHARDED_ROOT)
        free = (self.hardware.disk_free_gb or 0.0) * 1e9 - len(self._kept.dumps) * memory.checkpoint_bytes
        room = DumpRoom(int(free), self._kept.dumped(folders[0]))
        launch, why_not = presharded_launch(launch, folders, memory, room)
        return replace(request, launch=launch), [why_not] if why_not is not None else []

    def _page_cache(self, request: TrialRequest, memory: HostMemory) -> float:
        """The node's page cache step before `request`'s launch (node.page_cache's rule on the files the
        profile's checkpoint, or the layout's finished dump, would have): its seconds, from memory where the
        last launch kept the same files, else from disk; the share of the weights it keeps for the launch to
        read from memory goes to NodeKeeps."""
        launch = request.launch
        folder = str(loader_config(launch).get(PRESHARDED_PATH_KEY) or "")
        dumped = launch.flag(LOAD_FORMAT_FLAG) == PRESHARDED and folder != ""
        ready = dumped and self._kept.dumped(folder)
        files = model_weight_files(self.model, launch, ready)
        plan = keep_plan(launch, WeightListing(memory.available_bytes, files, [], reads_dump=ready))
        key = folder if ready else self.model.name
        if plan is None:
            self._kept.weights_kept, self._kept.kept_files = 0.0, None
            return 0.0
        kept_gb = sum(f.bytes for f in plan[0]) / 1e9
        if self._kept.kept_files == key:
            seconds = kept_gb / KEEP_READ_GBPS
        else:
            seconds = kept_gb / (self.model.load_gbps * self.hardware.multithread_load_speedup)
        self._kept.weights_kept, self._kept.kept_files = kept_gb * 1e9 / plan[2], key
        return seconds

    def _init_s(self, request: TrialRequest) -> float:
        """The init a process of this launch spends before it loads (the daemon's too)."""
        flags = _server_flags(request.launch)
        return predict(self.hardware, self.model, flags, request.launch.env, play=False).node.init_seconds

    def _run_job(self, request: TrialRequest) -> TrialResult:
        """An NCCL all-reduce job (`autotune.measure.nccl`'s command line and env): the payload the simulated
        job prints (autotune.sim.nccl_job), after `JOB_SECONDS` of node time."""
        argv = list(request.launch.argv)
        settings = BenchSettings.from_argv(argv[argv.index("--messages") :])
        try:
            payload = allreduce_payload(self.hardware, self.model, settings, request.launch.env)
        except RuntimeError as exc:
            log = f"autotune.measure.nccl: {exc}"
            failure = classify(log, "benchmarking") or Failure.of(
                FailureKind.UNKNOWN_CRASH, log, "job failed"
            )
            return TrialResult(
                request.number, self.node, None, failure, 0.0, JOB_SECONDS, log=log, returncode=1
            )
        return TrialResult(
            request.number,
            self.node,
            None,
            None,
            0.0,
            JOB_SECONDS,
            returncode=0,
            metrics=dict(payload["metrics"]),
            details=payload,
        )

    def _outcome(self, request: TrialRequest, answer: Prediction, stop: MissLimit | None) -> TrialResult:
        w = request.serving_workload
        startup_s = startup_seconds(answer.node)
        failure = answer.node.startup_failure
        if failure is not None:
            log = failure.log  # the real node classifies the whole log, not the traceback's last line
            return self._failed(request, classify(log, "starting"), log, startup_s, None)
        if w.request_rate is not None:
            return self._open_loop(request, answer, startup_s, stop)
        result = answer.result
        assert result is not None  # predict returns a result whenever start-up succeeds
        if result.oom_lines:
            log = "\n".join(result.oom_lines)
            return self._failed(request, classify(log, "benchmarking"), log, startup_s, result.duration_s)
        if result.completed == 0:
            # The real benchmark fails with the first request's abort message, and the node classifies it.
            error = input_too_long(w.input_len, answer.plan)
            failure_found = classify(error, "benchmarking") or Failure.of(
                FailureKind.BENCHMARK_ERROR, error, "every request was aborted"
            )
            return self._failed(request, failure_found, error, startup_s, result.duration_s)
        duration = result.duration_s
        ttft_ms = result.mean_ttft_s * 1000
        itl_ms = (duration - result.mean_ttft_s) / max(w.output_len, 1) * 1000
        benchmark = BenchmarkResult(
            workload=w,
            duration_s=duration,
            completed=result.completed,
            failed=result.aborted,
            total_input_tokens=result.completed * w.input_len,
            total_output_tokens=round(result.output_throughput * duration),
            request_throughput=result.completed / duration,
            input_throughput=result.completed * w.input_len / duration,
            output_throughput=result.output_throughput,
            mean_ttft_ms=ttft_ms,
            p50_ttft_ms=ttft_ms,
            p99_ttft_ms=ttft_ms,
            mean_itl_ms=itl_ms,
            p50_itl_ms=itl_ms,
            p99_itl_ms=itl_ms,
            mean_e2e_latency_ms=duration / max(result.completed, 1) * w.concurrency * 1000,
            p50_e2e_latency_ms=duration / max(result.completed, 1) * w.concurrency * 1000,
            p99_e2e_latency_ms=duration / max(result.completed, 1) * w.concurrency * 1000,
            accept_length=result.accept_length,
            time_scale=1.0,
        )
        return TrialResult(request.number, self.node, benchmark, None, startup_s, duration)

    def _open_loop(
        self, request: TrialRequest, answer: Prediction, startup_s: float, stop: MissLimit | None
    ) -> TrialResult:
        """A workload with a request rate: its requests arrive as the client sends them
        (`arrival_offsets`), and the client's own `summarize` turns what each saw into the result, so its
        goodput and SLO attainment follow the one rule the real client's do; with `stop`, no more are sent
        once the client's own tally says the outcome is decided, and only what was sent is timed."""
        w = request.serving_workload
        offsets = arrival_offsets(w.num_prompts, w.request_rate, w.burstiness)
        lengths = (w.input_len, w.output_len, w.concurrency)

        def seen(t: RequestTimes, end: float) -> RequestOutcome:
            return RequestOutcome(
                success=t.finished is not None,
                prompt_tokens=w.input_len,
                output_tokens=t.tokens,
                ttft_s=None if t.first_token is None else t.first_token - t.sent,
                itl_s=t.gaps,
                latency_s=(end if t.finished is None else t.finished) - t.sent,
                error=None if t.finished is not None else input_too_long(w.input_len, answer.plan),
            )

        tally = stop.tally(w.slo) if stop is not None else None
        played = run_arrivals(
            answer.node,
            offsets,
            *lengths,
            seed=request.seed,
            noise=self.noise,
            decided=None if tally is None else lambda t: tally.ended(seen(t, t.last)),
        )
        if played.oom_lines:
            log = "\n".join(played.oom_lines)
            return self._failed(request, classify(log, "benchmarking"), log, startup_s, played.duration_s)
        outcomes = [seen(t, played.duration_s) for t in played.requests]
        benchmark = summarize(outcomes, played.duration_s, w, accept_length=answer.node.accept_length)
        if played.stopped_sending:
            benchmark = replace(benchmark, decided_after=len(outcomes))
        if benchmark.completed == 0:
            error = input_too_long(w.input_len, answer.plan)
            failure = classify(error, "benchmarking") or Failure.of(
                FailureKind.BENCHMARK_ERROR, error, "every request was aborted"
            )
            return self._failed(request, failure, error, startup_s, played.duration_s)
        return TrialResult(request.number, self.node, benchmark, None, startup_s, played.duration_s)

    def _run_plan(self, request: TrialRequest, plan: MeasurementPlan) -> TrialResult:
        """A measurement plan on one model launch: start-up counted once, the benchmarks' seconds added up,
        the first failure ending the trial as on a real node. Every run shares the launch's noise seed."""
        runs: list[TrialResult] = []

        def measure(workload: Workload, _index: int) -> BenchmarkResult:
            one = self._run_one(replace(request, workload=workload, plan=None), plan.miss_limit(workload))
            runs.append(one)
            if one.benchmark is None:
                raise _RunFailed
            return one.benchmark

        try:
            benchmark: BenchmarkResult | None = run_plan_sync(plan, measure)
        except _RunFailed:
            benchmark = None
        benchmark_s = sum(r.benchmark_s or 0.0 for r in runs) if runs[-1].benchmark_s is not None else None
        first = runs[0]  # the launch's start-up; later runs of the plan reuse the running server
        return replace(
            runs[-1],
            benchmark=benchmark,
            startup_s=first.startup_s,
            benchmark_s=benchmark_s,
            startup_phases=first.startup_phases,
        )

    def _failed(
        self,
        request: TrialRequest,
        failure: Failure | None,
        log: str,
        startup_s: float,
        benchmark_s: float | None,
    ) -> TrialResult:
        if failure is None:
            failure = Failure.of(FailureKind.UNKNOWN_CRASH, log, "no pattern matched the model's message")
        return TrialResult(request.number, self.node, None, failure, startup_s, benchmark_s, log=log)


class NodeKeeps:
    """What a simulated node keeps from one launch to the next: the weights in its page cache (when its
    host memory holds them), its JIT/compile caches (when the study keeps a cache folder) and the
    presharded dumps its launches wrote."""

    def __init__(self) -> None:
        self.page_cache: set[str] = set()  # the models whose weights the page cache holds
        self.weights_kept = 0.0  # the share of the next launch's weights the page cache step kept
        self.kept_files: str | None = None  # whose files it kept: a model's checkpoint, or a dump folder
        self.compiled = False
        self.dumps: set[str] = set()  # the presharded dumps on the node's disk, by folder

    def dumped(self, folder: str) -> bool:
        """Whether a launch finished a presharded dump under `folder` (a launch's presharded_path)."""
        return any(d.startswith(folder + "/") for d in self.dumps)

    def apply(self, node: NodePerformanceModel, compile_cache: bool) -> None:
        """Start `node`'s launch with what earlier launches left."""
        node.weights_cached = node.model.name in self.page_cache
        node.weights_kept = self.weights_kept
        node.compile_cache_warm = compile_cache and self.compiled
        node.weights_presharded = presharded_dump(node) in self.dumps

    def after(self, node: NodePerformanceModel, compile_cache: bool) -> None:
        """Keep what `node`'s launch read and compiled, as far as its start-up got."""
        phase = node.startup_failure.phase if node.startup_failure is not None else None
        if phase not in ("init", "load") and weights_fit_page_cache(node.hw, node.model):
            self.page_cache.add(node.model.name)
        if compile_cache and phase in (None, "warmup"):
            self.compiled = True
        dump = presharded_dump(node)
        if dump is not None and phase not in ("init", "load"):
            self.dumps.add(dump)


class _RunFailed(Exception):
    """A run of a plan failed; its TrialResult carries the failure."""
