"""A node that answers from the model instead of running a server: for measuring the tuner itself.

`ModelExecutor` takes the same `TrialRequest` a real node takes (the launch's argv and env, the
objective's workload), asks `predict` what SGLang would do, and returns the `TrialResult` a real node
would: a benchmark result, or the failure classified from SGLang's own message by the same pattern
table. No process, no sleep: thousands of trials a minute.
"""

from __future__ import annotations

from autotune.benchmark import BenchmarkResult
from autotune.failures import Failure, FailureKind, classify
from autotune.node import TrialRequest, TrialResult
from autotune.sim.predict import predict
from autotune.sim.profiles import HardwareProfile, ModelProfile, StandardWorkload

_SERVER_FLAGS_START = "--model-path"


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
        if answer.failure_line is not None:
            return self._failed(request, classify(answer.failure_line, "starting"), answer.failure_line)
        result = answer.result
        assert result is not None  # predict returns a result whenever start-up succeeds
        if result.oom_lines:
            return self._failed(
                request, classify("\n".join(result.oom_lines), "benchmarking"), result.oom_lines[-1]
            )
        if result.completed == 0:
            kind = FailureKind.BENCHMARK_ERROR
            return self._failed(request, Failure.of(kind, "every request was aborted", "no request fit"), "")
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
        return TrialResult(request.number, self.node, benchmark, None, 0.0, duration)

    def _failed(self, request: TrialRequest, failure: Failure | None, line: str) -> TrialResult:
        if failure is None:
            failure = Failure.of(FailureKind.UNKNOWN_CRASH, line, "no pattern matched the model's message")
        return TrialResult(request.number, self.node, None, failure, 0.0, None, log=line)
