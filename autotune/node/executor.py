"""Running one trial on one GPU node: launch the server, wait for it, benchmark it, tear it down.

`TrialExecutor` is the lifecycle, written once against a `CommandRunner`; `NodeActor` is the Ray actor
that owns a node (`gpu_node` resource) and runs one trial there at a time. Neither knows about Optuna:
they take a `TrialRequest` and return a `TrialResult`. `runner_for` picks how the actor reaches its node:
a local process where the actor runs on the node itself, SSH where the node's address is ssh://.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Coroutine, Sequence
from concurrent.futures import CancelledError, Future
from dataclasses import replace
from pathlib import Path
from typing import Any

from autotune.config import NodeSpec, ServerSpec
from autotune.config.hosts import parse_ssh_address, reachable_here
from autotune.config.study import WORKDIR_NAME
from autotune.measure import remote as remote_benchmark
from autotune.measure.client import (
    API_KEY_ENV,
    BenchmarkError,
    BenchmarkResult,
    MissLimit,
    Workload,
    auth_headers,
    run_benchmark,
)
from autotune.measure.plan import MeasurementPlan, run_plan, run_seed
from autotune.node.bench_serving import BenchServingRun
from autotune.node.check import (
    NodeCheckError,
    NodeProblem,
    NodeReport,
    check_node,
    model_folder_problems,
    port_problems,
)
from autotune.node.job import wait_for_job
from autotune.node.lock import NodeBusy, node_held
from autotune.node.logwatch import StartupStatus, follow_log, wait_until_ready
from autotune.node.node_time import node_seconds
from autotune.node.page_cache import keep_weights
from autotune.node.presharded import PRESHARDED_FOLDER, dump_note, off_note, presharded_failure
from autotune.node.runner import (
    CommandRunner,
    LaunchError,
    LocalCommandRunner,
    NodeUnreachableError,
    ServerProcess,
)
from autotune.node.startup_phases import DUMP_PHASE, PAGE_CACHE_PHASE
from autotune.node.startup_prep import COMPILE_CACHE_FOLDER, prepare_launch
from autotune.node.weight_cache import DAEMON_LOG, Prepared, WeightCacheKeeper
from autotune.trial.failures import Failure, FailureKind, classify
from autotune.trial.launch import AUTO_PORT, ServerLaunch
from autotune.trial.startup import LOAD_FORMAT_FLAG, PRESHARDED
from autotune.trial.wire import TRIAL_PHASES, TrialRequest, TrialResult

# SGLang needs 10 to 15 s to stop cleanly before the process group is killed.
STOP_GRACE_S = 15.0
FAILED_GRACE_S = 0.5  # a server that logged a fatal line has nothing left to shut down cleanly
PORT_FREE_TIMEOUT_S = 30.0
WATCH_POLL_S = 0.2
DEATH_SETTLE_S = 3.0  # how long a benchmark's failed requests wait for their server's exit to show
LOG_TAIL_BYTES = 4 << 20  # what travels back to the driver for MLflow


def _holder(request: TrialRequest) -> str:
    """What a waiting driver is told about the trial that holds the node."""
    return f"trial {request.number} of pid {os.getpid()} on {socket.gethostname()}"


class TrialExecutor:
    """Runs trials through a command runner, phase by phase; the server never outlives its trial.

    The benchmark runs here against `runner.url_for(launch)`, or with `benchmark_on_node` on the node
    itself through the runner (`python -m autotune.measure.remote`), for nodes whose port this machine
    cannot reach. A node that stops answering fails the trial as NODE_UNREACHABLE.
    """

    def __init__(
        self,
        node: str,
        runner: CommandRunner,
        workdir: Path,
        port_wait_s: float = PORT_FREE_TIMEOUT_S,
        *,
        benchmark_on_node: bool = False,
        nvidia_smi: Sequence[str] = ("nvidia-smi",),
    ) -> None:
        self.node = node
        self.runner = runner
        self.workdir = workdir
        self.port_wait_s = port_wait_s
        self.benchmark_on_node = benchmark_on_node
        self.phase = "idle"
        self._phase_lock = threading.Lock()
        self._process: ServerProcess | None = None
        self._aborted = threading.Event()
        self._startup_notes: list[str] = []  # what prepare_launch changed in the running trial's launch
        self.weight_cache = WeightCacheKeeper(runner, nvidia_smi)  # its daemon outlives trials, not the node
        self._prepared: Prepared | None = None  # the running trial's launch as the weight cache left it
        self._presharded: ServerLaunch | None = None  # the running trial's launch where it loads presharded
        self.presharded_failed: str | None = None  # why presharded weights are off on this node, if they are
        self._kept_s: float | None = None  # the page cache step's seconds before the trial's launch

    def _enter(self, phase: str) -> None:
        if phase not in TRIAL_PHASES:
            raise ValueError(f"`phase in TRIAL_PHASES` must hold, but got ({phase=}).")
        with self._phase_lock:
            self.phase = phase

    def run(self, request: TrialRequest) -> TrialResult:
        """Launch, wait until ready, benchmark, and always tear down."""
        log_path = self.workdir / request.log_folder / f"trial-{request.number:04d}" / "server.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._aborted.clear()
        self._startup_notes = []
        self._prepared = None
        self._presharded = None
        self._kept_s = None
        try:
            with node_held(self.node, _holder(request), on_wait=self._wait_for_node, stop=self._aborted):
                result = self._run_held(request, log_path)
                if self._presharded is not None:
                    result = self._presharded_outcome(request, log_path, result, self._presharded)
                return result
        except NodeBusy:
            kind = FailureKind.INTERRUPTED
            failure = Failure(kind, "stopped while waiting for the node", "", kind.advice)
            return self._result(request, None, failure, log_path)

    def _presharded_outcome(
        self, request: TrialRequest, log_path: Path, result: TrialResult, launched: ServerLaunch
    ) -> TrialResult:
        """`result` of a launch with presharded weights, with a note where it wrote a dump; where its
        start-up died in SGLang's presharded loader, the trial run again without them (its node time and
        notes counting both runs), and they stay off on this node."""
        failure = result.failure
        error = presharded_failure(result.log) if failure is not None and not failure.kind.is_oom else None
        if error is None or self._aborted.is_set():
            if DUMP_PHASE not in result.startup_phases:
                return result
            return replace(result, startup_notes=(*result.startup_notes, dump_note(launched)))
        self.presharded_failed = error
        log_path.rename(log_path.with_name("server-presharded.log"))
        notes = (*result.startup_notes, off_note(error))
        again = self._run_held(request, log_path)
        return replace(
            again,
            startup_notes=(*notes, *again.startup_notes),
            node_s=(result.node_seconds or 0.0) + (again.node_seconds or 0.0),
        )

    def _wait_for_node(self, holder: str) -> None:
        self._enter("waiting")
        print(f"autotune: node {self.node} is busy with {holder}: this trial waits for it", file=sys.stderr)

    def _run_held(self, request: TrialRequest, log_path: Path) -> TrialResult:
        try:
            self._enter("launching")
            if request.launch.port == AUTO_PORT and not request.job:  # picked here, on the node, free now
                port = self.runner.free_port(request.launch.host)
                request = replace(request, launch=request.launch.with_port(port))
            self._process = self._launch(request, log_path)
            if request.job:
                result = self._run_job(request, self._process, log_path)
            else:
                result = self._run_launched(request, self._process, log_path)
        except LaunchError as exc:
            failure = Failure(FailureKind.LAUNCH_ERROR, exc.reason, "launch", FailureKind.LAUNCH_ERROR.advice)
            result = self._result(request, None, failure, log_path)
        except NodeUnreachableError as exc:
            failure = Failure.of(FailureKind.NODE_UNREACHABLE, exc.reason, str(exc))
            result = self._result(request, None, failure, log_path)
        finally:
            self._enter("stopping")
            if self._process is not None:
                self._teardown(self._process, request.launch)
                self._process = None
            self._enter("idle")
        # Read after teardown: the log is whole now (a remote one fetched), shutdown lines included.
        result = replace(result, log=_tail(log_path))
        if self._prepared is not None:
            self.weight_cache.learn(self._prepared.launch, self._prepared, result.log, result.server_choices)
        if self._aborted.is_set():
            kind = FailureKind.INTERRUPTED
            return replace(
                result, benchmark=None, failure=Failure(kind, "stopped by the driver", "", kind.advice)
            )
        return result

    def abort(self) -> None:
        """Stop the running trial's server now (from another thread); `run` returns INTERRUPTED."""
        self._aborted.set()
        process = self._process
        if process is not None:
            process.stop(grace_s=STOP_GRACE_S)

    def close(self) -> None:
        """The node's study has ended (or its actor goes): stop what outlives a trial, the weight cache
        daemon."""
        self.weight_cache.stop()

    def _teardown(self, process: ServerProcess, launch: ServerLaunch) -> None:
        """Stop the server's group, fetch the rest of its log, wait for its port; the node may be gone."""
        process.stop(grace_s=STOP_GRACE_S)  # a remote runner remembers a server it cannot reach
        try:
            process.fetch_log()
            self.runner.wait_port_free(launch.host, launch.port, self.port_wait_s)
        except NodeUnreachableError:
            pass  # the trial already failed as unreachable, or the next one will

    def _launch(self, request: TrialRequest, log_path: Path) -> ServerProcess:
        cache = self.workdir / COMPILE_CACHE_FOLDER if request.compile_cache and not request.job else None
        presharded = request.presharded_weights and self.presharded_failed is None and not request.job
        dumps = self.workdir / PRESHARDED_FOLDER if presharded else None
        launch, self._startup_notes = prepare_launch(self.runner, request.launch, cache, dumps)
        ours = dumps is not None and launch.flag(LOAD_FORMAT_FLAG) == PRESHARDED  # not a study's own flag
        self._presharded = launch if ours else None
        keep = request.weights_in_page_cache and not request.job
        self._kept_s = keep_weights(self.runner, launch, request.startup_timeout_s) if keep else None
        if not request.job:
            self._prepared = self.weight_cache.prepare(
                launch, log_path.parent, request.weight_cache, request.startup_timeout_s, self._aborted.is_set
            )
            launch = self._prepared.launch
            self._startup_notes += self._prepared.notes
            if self._aborted.is_set():  # stopped while the daemon started: no server to start and stop
                raise LaunchError(list(launch.argv), "stopped before the server was started")
        if not self.runner.wait_port_free(launch.host, launch.port, self.port_wait_s):
            raise LaunchError(list(launch.argv), f"port {launch.host}:{launch.port} is already in use")
        return self.runner.start(launch.argv, launch.env, log_path, secrets=launch.secrets)

    def _run_launched(self, request: TrialRequest, process: ServerProcess, log_path: Path) -> TrialResult:
        started = time.monotonic()
        self._enter("starting")
        url = self.runner.url_for(request.launch)
        outcome = wait_until_ready(
            process,
            log_path,
            None if self.benchmark_on_node else lambda: _health_ok(url, request.launch.api_key),
            request.startup_timeout_s,
            on_phase=self._enter,
        )
        startup_s = time.monotonic() - started
        phases = {**outcome.startup_phases, **({"ready_s": round(startup_s, 2)} if outcome.ready else {})}
        if outcome.status is StartupStatus.FAILED:
            # It may linger after its fatal line, as the seed's server did (docs/concepts.md, "The seed").
            process.stop(grace_s=FAILED_GRACE_S)
        if not outcome.ready:
            return self._result(
                request,
                None,
                outcome.failure,
                log_path,
                startup_s=startup_s,
                phase_times=outcome.phase_times,
                returncode=outcome.returncode,
                server_choices=outcome.server_choices,
                server_memory=outcome.server_memory,
                startup_phases=phases,
            )
        self._enter("benchmarking")
        bench_started = time.monotonic()
        result, failure = self._benchmark_watched(request, process, log_path)
        return self._result(
            request,
            result,
            failure,
            log_path,
            startup_s=startup_s,
            benchmark_s=time.monotonic() - bench_started,
            phase_times=outcome.phase_times,
            returncode=process.poll(),
            server_choices=outcome.server_choices,
            server_memory=outcome.server_memory,
            startup_phases=phases,
        )

    def _run_job(self, request: TrialRequest, process: ServerProcess, log_path: Path) -> TrialResult:
        """Wait for a job to exit within the benchmark timeout; its result line is the measurement."""
        self._enter("measuring")
        outcome = wait_for_job(process, request.benchmark_timeout_s, stopped=self._aborted.is_set)
        result = self._result(
            request,
            None,
            outcome.failure,
            log_path,
            benchmark_s=outcome.elapsed_s,
            phase_times={"measuring": outcome.elapsed_s},
            returncode=outcome.returncode,
        )
        return replace(result, metrics=outcome.metrics, details=outcome.payload)

    def _benchmark_watched(
        self, request: TrialRequest, process: ServerProcess, log_path: Path
    ) -> tuple[BenchmarkResult | None, Failure | None]:
        """Benchmark in a thread while this one watches the server: a death or fatal line ends it early.

        When the node stops answering, the benchmark is cancelled (its requests must not outlive the
        trial) and NodeUnreachableError propagates.
        """
        follower = follow_log(process, from_end=True)
        with _BenchmarkThread(self._measurement_job(request)) as job:
            future = job.future
            settled_by: float | None = None
            try:
                while not future.done() or _may_be_dying(future, settled_by):
                    if future.done() and settled_by is None:
                        settled_by = time.monotonic() + DEATH_SETTLE_S
                    new_lines = follower.poll_new_lines()
                    died = process.poll() is not None
                    failure = classify("\n".join(new_lines), "benchmarking") if new_lines else None
                    if died or failure:
                        process.stop(grace_s=FAILED_GRACE_S)  # the client's requests fail fast from here on
                        searched = None if future.exception() else future.result()
                        if searched is not None and searched.max_load:
                            return self._searched_until_death(searched, log_path, process), None
                        return None, self._died(log_path, process)
                    time.sleep(WATCH_POLL_S)
            except NodeUnreachableError:
                job.cancel()
                raise
            try:
                result = future.result()
                if result.max_load is not None and process.poll() is not None:
                    if result.max_load:  # as above: a load passed before the death, else the death is all
                        return self._searched_until_death(result, log_path, process), None
                    return None, self._died(log_path, process)
                return result, None
            except BenchmarkError as exc:
                if process.poll() is not None:
                    return None, self._died(log_path, process)
                # e.g. a prompt the KV pool cannot hold: the same fix as an OOM
                known = classify(exc.first_error or "", "benchmarking")
                if known is not None:
                    return None, known
                kind = FailureKind.BENCHMARK_ERROR
                return None, Failure(kind, exc.first_error or str(exc), str(exc), kind.advice)

    def _measurement_job(self, request: TrialRequest) -> Coroutine[Any, Any, BenchmarkResult]:
        """The request's measurement plan on the launched server, one benchmark per run of the plan (each
        with prompts of its own), by the built-in client or by sglang.bench_serving on the node."""
        plan = request.plan or MeasurementPlan.single(request.serving_workload)
        launch = request.launch

        async def builtin(workload: Workload, index: int) -> BenchmarkResult:
            one = replace(request, workload=workload, seed=run_seed(request.seed, index), plan=None)
            return await self._benchmark_job(one, plan.miss_limit(workload))

        async def bench_serving(workload: Workload, index: int) -> BenchmarkResult:
            client = BenchServingRun(
                self.runner,
                _node_local_url(launch),
                launch,
                plan.bench_serving,
                request.benchmark_timeout_s,
            )
            return await asyncio.to_thread(client.measure, workload, run_seed(request.seed, index))

        return run_plan(plan, bench_serving if plan.client == "bench_serving" else builtin)

    def _benchmark_job(
        self, request: TrialRequest, stop: MissLimit | None = None
    ) -> Coroutine[Any, Any, BenchmarkResult]:
        launch = request.launch
        if not self.benchmark_on_node:
            url = self.runner.url_for(launch)
            return run_benchmark(
                url,
                request.serving_workload,
                timeout_s=request.benchmark_timeout_s,
                seed=request.seed,
                api_key=launch.api_key,
                stop=stop,
            )
        argv = remote_benchmark.command(
            launch.python,
            _node_local_url(launch),
            request.serving_workload,
            request.benchmark_timeout_s,
            request.seed,
            stop,
        )

        key = launch.api_key
        key_env = {API_KEY_ENV: key} if key else {}

        def on_node() -> BenchmarkResult:
            try:
                done = self.runner.run(argv, {**launch.env, **key_env}, request.benchmark_timeout_s + 60)
            except TimeoutError as exc:
                raise BenchmarkError(f"did not finish on the node ({exc})") from None
            return remote_benchmark.result_from_output(done.returncode, done.stdout, done.stderr)

        return asyncio.to_thread(on_node)

    def _searched_until_death(
        self, result: BenchmarkResult, log_path: Path, process: ServerProcess
    ) -> BenchmarkResult:
        """A load search keeps the highest load that passed before the server died, with the death noted."""
        return replace(result, load_stopped_by=f"the server died: {self._died(log_path, process).line}")

    def _died(self, log_path: Path, process: ServerProcess) -> Failure:
        found = classify(process.read_log(), "benchmarking")
        if found is not None and found.kind is not FailureKind.UNKNOWN_CRASH:
            return found
        kind = FailureKind.SERVER_DIED  # with the crash's own line when the log has one
        line = found.line if found is not None else f"exit status {process.poll()}"
        return Failure(kind, line, "server died during the benchmark", kind.advice)

    def _result(
        self,
        request: TrialRequest,
        result: BenchmarkResult | None,
        failure: Failure | None,
        log_path: Path,
        **extra: object,
    ) -> TrialResult:
        phases: dict[str, float] = extra.get("startup_phases") or {}  # type: ignore[assignment]
        node_s = self._with_daemon_s(self._node_s(result, log_path, extra), extra)
        if (kept_s := self._kept_s) is not None:  # the step before the launch is node time too
            phases = {PAGE_CACHE_PHASE: kept_s, **phases}
            node_s = (node_s or 0.0) + kept_s
        return TrialResult(
            number=request.number,
            node=self.node,
            benchmark=result,
            failure=failure,
            startup_s=extra.get("startup_s"),  # type: ignore[arg-type]
            benchmark_s=extra.get("benchmark_s"),  # type: ignore[arg-type]
            phase_times=extra.get("phase_times") or {},  # type: ignore[arg-type]
            server_choices=extra.get("server_choices") or {},  # type: ignore[arg-type]
            server_memory=extra.get("server_memory") or {},  # type: ignore[arg-type]
            startup_phases=phases,
            startup_notes=tuple(self._startup_notes),
            log=_tail(log_path),
            node_s=node_s,
            other_logs=self._daemon_logs(),
            returncode=extra.get("returncode"),  # type: ignore[arg-type]
            server_pgid=self._process.pgid if self._process is not None else None,
            port=request.launch.port or None,
        )

    def _daemon_logs(self) -> dict[str, str]:
        """The weight cache daemon's log where it started for this trial, by its artifact name."""
        prepared = self._prepared
        return {DAEMON_LOG: prepared.daemon_log} if prepared is not None and prepared.daemon_log else {}

    def _with_daemon_s(self, node_s: float | None, extra: dict[str, object]) -> float | None:
        """The launch's node seconds with those of the weight cache daemon started for it (node time too)."""
        daemon_s = self._prepared.daemon_s if self._prepared is not None else 0.0
        if not daemon_s:
            return node_s
        if node_s is None:
            startup, bench = extra.get("startup_s"), extra.get("benchmark_s")
            node_s = sum(v for v in (startup, bench) if isinstance(v, float))
        return node_s + daemon_s

    @staticmethod
    def _node_s(result: BenchmarkResult | None, log_path: Path, extra: dict[str, object]) -> float | None:
        """The launch's seconds in the node's own clock (autotune.node.node_time), not the stopwatch's."""
        startup, bench = extra.get("startup_s"), extra.get("benchmark_s")
        if not isinstance(startup, float) and not isinstance(bench, float):
            return None
        log = log_path.read_text(errors="replace") if startup is not None and log_path.exists() else ""
        return node_seconds(
            startup if isinstance(startup, float) else None,
            bench if isinstance(bench, float) else None,
            log,
            result.time_scale if result is not None else None,
            result.duration_s if result is not None else None,
        )


def _may_be_dying(future: Future[BenchmarkResult], settled_by: float | None) -> bool:
    """A benchmark that ended with failed requests may have ended because its server is going down, and
    the server's exit can lag its clients' errors: watch on until `settled_by`."""
    error = future.exception()
    failed = error.failed if isinstance(error, BenchmarkError) else 0 if error else future.result().failed
    if not failed:
        return False
    return settled_by is None or time.monotonic() < settled_by


class _BenchmarkThread:
    """A benchmark coroutine on an event loop of its own thread, so that another thread can cancel it."""

    def __init__(self, job: Coroutine[Any, Any, BenchmarkResult]) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="benchmark", daemon=True)
        self._thread.start()
        self.future: Future[BenchmarkResult] = asyncio.run_coroutine_threadsafe(job, self._loop)

    def cancel(self) -> None:
        self.future.cancel()

    def __enter__(self) -> _BenchmarkThread:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.future.exception()  # wait for the end (a cancelled job ends at its next await)
        except CancelledError:
            pass
        # Let cancelled tasks finish their clean-up (closing the HTTP session) before the loop closes.
        pending = asyncio.run_coroutine_threadsafe(_settle(), self._loop)
        try:
            pending.result(timeout=10)
        except Exception:  # clean-up errors of a cancelled benchmark change nothing about the trial
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()


async def _settle() -> None:
    """Wait for every other task of the running loop to finish."""
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    await asyncio.gather(*others, return_exceptions=True)


def _node_local_url(launch: ServerLaunch) -> str:
    """The server's URL from the node itself (a server listening on every address, via loopback)."""
    return replace(launch, host=reachable_here(launch.host)).base_url


def _health_ok(base_url: str, api_key: str | None = None) -> bool:
    # SGLang lets /health through without the key; sending it anyway keeps one rule for every request.
    request = urllib.request.Request(f"{base_url}/health", headers=auth_headers(api_key))
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - LOG_TAIL_BYTES))
            return handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def runner_for(node: NodeSpec, workdir: Path | None = None) -> CommandRunner:
    """The command runner that reaches `node` from where this actor runs; `workdir` holds its local logs.

    `address: local`: the actor runs on the GPU node itself (a Ray worker there) and starts processes.
    `address: ssh://...`: the actor runs on the driver's host and reaches the node over SSH; the node's
    logs go under its `remote_dir`, in the same layout as the driver's `.autotune/<study>/nodes/<node>`.
    """
    if node.address == "local":
        return LocalCommandRunner(Path(workdir) if workdir is not None else None)
    # Fabric only for a node reached over SSH: an actor on the GPU node itself never loads it.
    from autotune.node.ssh import SSHCommandRunner

    remote_dir = node.remote_dir
    if workdir is not None:
        parts = Path(workdir).parts
        tail = parts[len(parts) - parts[::-1].index(WORKDIR_NAME) :] if WORKDIR_NAME in parts else parts[-1:]
        remote_dir = "/".join([remote_dir.rstrip("/"), *tail])
    return SSHCommandRunner(
        parse_ssh_address(node.address),
        name=node.name,
        key_file=node.key_file,
        known_hosts=node.known_hosts,
        accept_unknown_host_key=node.accept_unknown_host_key,
        remote_dir=remote_dir,
        local_root=Path(workdir) if workdir is not None else None,
        connect_timeout_s=node.connect_timeout_s,
    )


def _log_dir(runner: CommandRunner, workdir: Path) -> str:
    """Where `runner` keeps the node's logs, as a path on the node."""
    remote_path = getattr(runner, "remote_path", None)
    return str(remote_path(workdir / "x").parent) if remote_path is not None else str(workdir)


def check_executor_node(node: NodeSpec, executor: TrialExecutor, server: ServerSpec) -> NodeReport:
    """The pre-flight check of the node an executor runs trials on, for `server` (`autotune.node.check`):
    the same whether the executor lives in a Ray actor or in the driver's process (--no-ray)."""
    runner = executor.runner
    try:
        log_dir = _log_dir(runner, executor.workdir)
    except NodeUnreachableError:
        log_dir = str(executor.workdir)  # check_node reports why the node cannot be reached
    report = check_node(
        node.name,
        runner,
        command=server.command,
        env=server.env,
        host=server.host,
        port=None if server.port == "auto" else server.port,  # an auto port is found at launch
        log_dir=log_dir,
        benchmark_on_node=executor.benchmark_on_node,
        nvidia_smi=node.nvidia_smi,
        model_path=server.model_path,
        model_folders=server.model_folders,
    )
    return replace(report, stopped_left_behind=tuple(runner.stopped_left_behind))


def quick_node_check(nodes: Sequence[NodeSpec], server: ServerSpec, *, port: bool = True) -> None:
    """What fails a study at once, checked in seconds before anything slow (Ray's start, SGLang's import):
    the server's fixed port taken on a node (`port`), and model folders SGLang cannot load there
    (`ServerSpec.model_folders`). Raises NodeCheckError naming each, with its fix."""
    reports = []
    for node in nodes:
        runner = runner_for(node)
        problems: list[NodeProblem] = []
        try:
            if port and server.port != "auto":
                problems += port_problems(runner, server.host, server.port)
            problems += model_folder_problems(runner, server.model_folders)
        except NodeUnreachableError as exc:
            problems.append(NodeProblem(f"cannot reach the node: {exc.reason}", exc.fix))
        if problems:
            reports.append(NodeReport(node.name, tuple(problems)))
    if reports:
        raise NodeCheckError(reports)


class NodeActor:
    """A Ray actor that owns one GPU node (its `gpu_node` resource) and runs one trial there at a time.

    Created through `NodeActor.options(...).remote()` by `node_actor_class()`; `phase()` answers while a
    trial runs (the actor allows two concurrent calls for that).
    """

    def __init__(self, node: NodeSpec, workdir: str) -> None:
        self._node = node
        self._workdir = Path(workdir)
        self._executor = TrialExecutor(
            node.name,
            runner_for(node, self._workdir),
            self._workdir,
            benchmark_on_node=node.benchmark_from == "node",
            nvidia_smi=node.nvidia_smi,
        )

    def check(self, server: ServerSpec) -> NodeReport:
        """The pre-flight check of this node for `server` (see `autotune.node.check`)."""
        return check_executor_node(self._node, self._executor, server)

    def run_trial(self, request: TrialRequest) -> TrialResult:
        return self._executor.run(request)

    def phase(self) -> str:
        return self._executor.phase

    def stopped_left_behind(self) -> list[int]:
        """The servers a dead actor or driver left running on this node, which this actor stopped on start."""
        return self._executor.runner.stopped_left_behind

    def abort(self) -> None:
        self._executor.abort()

    def close(self) -> None:
        """Stop what outlives a trial on the node (the weight cache daemon) before the actor goes."""
        self._executor.close()

    def describe(self) -> str:
        return json.dumps({"node": self._executor.node, "phase": self._executor.phase})
