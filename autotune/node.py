"""Running one trial on one GPU node: launch the server, wait for it, benchmark it, tear it down.

`TrialExecutor` is the lifecycle, written once against a `CommandRunner`; `NodeActor` is the Ray actor
that owns a node (`gpu_node` resource) and runs one trial there at a time. Neither knows about Optuna:
they take a `TrialRequest` and return a `TrialResult`.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from autotune.benchmark import BenchmarkError, BenchmarkResult, Workload, benchmark
from autotune.config import NodeSpec
from autotune.failures import Failure, FailureKind, classify
from autotune.launch import ServerLaunch
from autotune.logwatch import LogFollower, wait_until_ready
from autotune.runner import CommandRunner, LaunchError, LocalCommandRunner, ServerProcess, wait_port_free

# SGLang needs 10 to 15 s to stop cleanly before the process group is killed.
STOP_GRACE_S = 15.0
PORT_FREE_TIMEOUT_S = 30.0
WATCH_POLL_S = 0.2
LOG_TAIL_BYTES = 4 << 20  # what travels back to the driver for MLflow


@dataclass(frozen=True)
class TrialRequest:
    """Everything a node needs to run one trial; built by the driver, run by the node."""

    number: int
    launch: ServerLaunch
    workload: Workload
    startup_timeout_s: float
    benchmark_timeout_s: float
    seed: int = 0


@dataclass(frozen=True)
class TrialResult:
    """What happened to one trial on the node: a benchmark result or a classified failure."""

    number: int
    node: str
    benchmark: BenchmarkResult | None
    failure: Failure | None
    startup_s: float | None
    benchmark_s: float | None
    phase_times: dict[str, float] = field(default_factory=dict)
    log: str = ""
    returncode: int | None = None
    server_pgid: int | None = None  # the process group the trial's server ran in (gone when this returns)

    @property
    def ok(self) -> bool:
        return self.failure is None and self.benchmark is not None

    def summary(self) -> dict[str, object]:
        """A JSON-ready record of the result (the log left out)."""
        data = asdict(self)
        data.pop("log")
        return data


class TrialExecutor:
    """Runs trials through a command runner, phase by phase; the server never outlives its trial."""

    def __init__(
        self, node: str, runner: CommandRunner, workdir: Path, port_wait_s: float = PORT_FREE_TIMEOUT_S
    ) -> None:
        self.node = node
        self.runner = runner
        self.workdir = workdir
        self.port_wait_s = port_wait_s
        self.phase = "idle"
        self._phase_lock = threading.Lock()
        self._process: ServerProcess | None = None
        self._aborted = threading.Event()

    def _enter(self, phase: str) -> None:
        with self._phase_lock:
            self.phase = phase

    def run(self, request: TrialRequest) -> TrialResult:
        """Launch, wait until ready, benchmark, and always tear down."""
        log_path = self.workdir / f"trial-{request.number:04d}" / "server.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._aborted.clear()
        try:
            self._enter("launching")
            self._process = self._launch(request, log_path)
            result = self._run_launched(request, self._process, log_path)
        except LaunchError as exc:
            failure = Failure(FailureKind.LAUNCH_ERROR, exc.reason, "launch", FailureKind.LAUNCH_ERROR.advice)
            result = self._result(request, None, failure, log_path)
        finally:
            self._enter("stopping")
            if self._process is not None:
                self._process.stop(grace_s=STOP_GRACE_S)
                wait_port_free(request.launch.host, request.launch.port, self.port_wait_s)
                self._process = None
            self._enter("idle")
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

    def _launch(self, request: TrialRequest, log_path: Path) -> ServerProcess:
        launch = request.launch
        if not wait_port_free(launch.host, launch.port, self.port_wait_s):
            raise LaunchError(list(launch.argv), f"port {launch.host}:{launch.port} is already in use")
        return self.runner.start(launch.argv, launch.env, log_path)

    def _run_launched(self, request: TrialRequest, process: ServerProcess, log_path: Path) -> TrialResult:
        started = time.monotonic()
        self._enter("starting")
        outcome = wait_until_ready(
            process,
            log_path,
            lambda: _health_ok(request.launch.base_url),
            request.startup_timeout_s,
            on_phase=self._enter,
        )
        startup_s = time.monotonic() - started
        if not outcome.ready:
            return self._result(
                request,
                None,
                outcome.failure,
                log_path,
                startup_s=startup_s,
                phase_times=outcome.phase_times,
                returncode=outcome.returncode,
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
        )

    def _benchmark_watched(
        self, request: TrialRequest, process: ServerProcess, log_path: Path
    ) -> tuple[BenchmarkResult | None, Failure | None]:
        """Benchmark in a thread while this one watches the server: a death or fatal line ends it early."""
        follower = LogFollower(log_path, offset=log_path.stat().st_size if log_path.exists() else 0)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="benchmark") as pool:
            future: Future[BenchmarkResult] = pool.submit(
                benchmark,
                request.launch.base_url,
                request.workload,
                request.benchmark_timeout_s,
                request.seed,
            )
            while not future.done():
                new_lines = follower.poll_new_lines()
                died = process.poll() is not None
                failure = classify("\n".join(new_lines), "benchmarking") if new_lines else None
                if died or failure:
                    process.stop(grace_s=STOP_GRACE_S)  # the client's requests fail fast from here on
                    future.exception()
                    return None, self._died(log_path, process)
                time.sleep(WATCH_POLL_S)
            try:
                return future.result(), None
            except BenchmarkError as exc:
                if process.poll() is not None:
                    return None, self._died(log_path, process)
                # e.g. a prompt the KV pool cannot hold: the same fix as an OOM
                known = classify(exc.first_error or "", "benchmarking")
                if known is not None:
                    return None, known
                kind = FailureKind.BENCHMARK_ERROR
                return None, Failure(kind, exc.first_error or str(exc), str(exc), kind.advice)

    def _died(self, log_path: Path, process: ServerProcess) -> Failure:
        found = classify(process.read_log(), "benchmarking")
        if found is not None and found.kind is not FailureKind.UNKNOWN_CRASH:
            return found
        kind = FailureKind.SERVER_DIED
        return Failure(kind, f"exit status {process.poll()}", "server died during the benchmark", kind.advice)

    def _result(
        self,
        request: TrialRequest,
        result: BenchmarkResult | None,
        failure: Failure | None,
        log_path: Path,
        **extra: object,
    ) -> TrialResult:
        return TrialResult(
            number=request.number,
            node=self.node,
            benchmark=result,
            failure=failure,
            startup_s=extra.get("startup_s"),  # type: ignore[arg-type]
            benchmark_s=extra.get("benchmark_s"),  # type: ignore[arg-type]
            phase_times=extra.get("phase_times") or {},  # type: ignore[arg-type]
            log=_tail(log_path),
            returncode=extra.get("returncode"),  # type: ignore[arg-type]
            server_pgid=self._process.pgid if self._process is not None else None,
        )


def _health_ok(base_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as response:
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


def runner_for(node: NodeSpec) -> CommandRunner:
    """The command runner that reaches `node` from where this actor runs."""
    return LocalCommandRunner()


class NodeActor:
    """A Ray actor that owns one GPU node (its `gpu_node` resource) and runs one trial there at a time.

    Created through `NodeActor.options(...).remote()` by `node_actor_class()`; `phase()` answers while a
    trial runs (the actor allows two concurrent calls for that).
    """

    def __init__(self, node: NodeSpec, workdir: str) -> None:
        self._executor = TrialExecutor(node.name, runner_for(node), Path(workdir))

    def run_trial(self, request: TrialRequest) -> TrialResult:
        return self._executor.run(request)

    def phase(self) -> str:
        return self._executor.phase

    def abort(self) -> None:
        self._executor.abort()

    def describe(self) -> str:
        return json.dumps({"node": self._executor.node, "phase": self._executor.phase})
