"""A node that answers from the model instead of running a server: for measuring the tuner itself.

`ModelExecutor` takes the same `TrialRequest` a real node takes (the launch's argv and env, the
objective's workload), asks `predict` what SGLang would do, and returns the `TrialResult` a real node
would: a benchmark result, or the failure classified by the same pattern table from what the real node
reads (the server's whole traceback, or the benchmark's first error). No process, no sleep: thousands of
trials a minute. Its `startup_s` and `benchmark_s` are the model's seconds, so a caller can count the node
time a study would have spent.
"""

from __future__ import annotations

from autotune.benchmark import BenchmarkResult
from autotune.failures import Failure, FailureKind, classify
from autotune.node import TrialRequest, TrialResult
from autotune.sim.engine import input_too_long
from autotune.sim.model import NodeModel
from autotune.sim.predict import predict
from autotune.sim.profiles import HardwareProfile, ModelProfile, StandardWorkload

_SERVER_FLAGS_START = "--model-path"


def startup_seconds(node: NodeModel) -> float:
    """Model seconds from launch until the server is ready, or until it dies of its start-up failure:
    the simulated server's timeline (init, weight load, KV pool, graph capture)."""
    failure = node.startup_failure
    phase = failure.phase if failure is not None else None
    init, load, capture = node.init_seconds, node.load_seconds, node.capture_seconds
    if phase == "init":
        return init / 2
    if phase == "load":  # dies as the load begins
        return init
    if phase == "kv":
        return init + load
    if phase == "capture":  # dies capturing the first batch size
        return init + load + capture / max(len(node.plan.captured_batch_sizes), 1)
    return init + load + capture


class ModelExecutor:
    """Runs trials by asking the simulated node's model; noise as the simulated server would add it."""

    def __init__(self, node: str, hardware: HardwareProfile, model: ModelProfile, noise: float = 0.0) -> None:
        self.node = node
        self.hardware = hardware
        self.model = model
        self.noise = noise
        self.phase = "idle"

    def abort(self) -> None:
        """Nothing runs long enough to abort."""

    def run(self, request: TrialRequest) -> TrialResult:
        argv = list(request.launch.argv)
        flags = argv[argv.index(_SERVER_FLAGS_START) :] if _SERVER_FLAGS_START in argv else argv
        w = request.workload
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
        )
        startup_s = startup_seconds(answer.node)
        failure = answer.node.startup_failure
        if failure is not None:
            log = "\n".join(failure.lines)  # the real node classifies the whole traceback in its log
            return self._failed(request, classify(log, "starting"), log, startup_s, None)
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
