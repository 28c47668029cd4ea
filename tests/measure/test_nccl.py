"""The NCCL all-reduce objective up to the GPU: its files, the job launch, the job trial mode, the
benchmark's command line and result, the statistics and the interleaved comparison.

The job trial mode runs real short Python commands that print a result line (they stand in for the
benchmark only to test the plumbing); the benchmark itself needs two CUDA GPUs and is skipped without.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from autotune.config import load_objective, load_study, parse_objective
from autotune.config.allreduce import ALLREDUCE_METRICS
from autotune.errors import AutotuneError, ConfigError, ForbiddenLaunchError
from autotune.measure.nccl import (
    PHASES,
    BenchSettings,
    CaptureFailed,
    Message,
    RankFailed,
    RankReport,
    _collect,
    format_size,
    parse_messages,
    parse_size,
    summarize,
)
from autotune.measure.result_line import RESULT_PREFIX, ResultLineError, parse_result, result_line
from autotune.measure.stats import mean_ci, paired_gain, t_quantile
from autotune.node.executor import TrialExecutor
from autotune.node.job import wait_for_job
from autotune.node.runner import LocalCommandRunner
from autotune.study.compare import Comparison, Run, compare, order_of_round
from autotune.trial.failures import FailureKind
from autotune.trial.launch import AUTO_PORT, ServerLaunch, TrialConfig
from autotune.trial.wire import TrialRequest
from tests.builders import REPO, SHIPPED_SPACE, StudyFiles, study_data

EXAMPLE = REPO / "examples" / "nccl-h200x2.yaml"
OBJECTIVE = REPO / "objectives" / "nccl-allreduce.yaml"
SPACE = REPO / "search_spaces" / "nccl-allreduce.yaml"

# A stand-in job for the plumbing: prints the result line a benchmark would, from its NCCL env.
STAND_IN = """
import os, sys
sys.path.insert(0, {repo!r})
from autotune.measure.result_line import result_line
us = {{"LL": 6.0, "LL128": 12.0, "Simple": 16.0}}.get(os.environ.get("NCCL_PROTO"), 18.0)
print("warming up", flush=True)
print(result_line({{"metrics": {{"allreduce_us": us, "nccl_memory_mib": 900.0, "gpu_used_mib": 1400.0,
    "allreduce_us.42K": us}}, "timing": "cuda_graph", "argv": sys.argv[1:]}}), flush=True)
"""


# ---- the benchmark's command line and result (no GPU) ------------------------------------------------
def test_sizes_parse_in_binary_units_and_print_back() -> None:
    assert parse_size("42K") == 43008 == parse_size("42KiB") == parse_size("43008")
    assert parse_size("1M") == 1 << 20
    assert format_size(43008) == "42K" and format_size(1 << 20) == "1M" and format_size(1000) == "1000"
    for bad in ("", "42X", "-1", "0", "4.2K"):
        with pytest.raises(ValueError, match="message size"):
            parse_size(bad)


def test_messages_carry_weights_and_refuse_repeats_and_all_zero() -> None:
    assert parse_messages("42K:122,14K:0,1M") == (
        Message(43008, 122.0),
        Message(14336, 0.0),
        Message(1 << 20, 1.0),
    )
    with pytest.raises(ValueError, match="once"):
        parse_messages("42K,43008")
    with pytest.raises(ValueError, match="weight above 0"):
        parse_messages("42K:0")


def test_settings_round_trip_through_the_command_line() -> None:
    settings = BenchSettings(
        messages=parse_messages("42K:122,14K:0"), graph_iters=122, repeats=5, timing="eager"
    )
    assert BenchSettings.from_argv(settings.to_argv()) == settings


def test_a_bad_command_line_exits_2_with_the_rule(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        BenchSettings.from_argv(["--messages", "43007", "--dtype", "bfloat16"])
    assert info.value.code == 2
    assert "multiple of 2 bytes" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        BenchSettings.from_argv(["--messages", "42K", "--repeats", "1"])


def _reports(samples: dict[int, list[list[float]]]) -> list[RankReport]:
    """Two ranks' reports; samples[size][rank] is that rank's list of per-repeat figures."""
    return [
        RankReport(
            rank,
            {size: per_rank[rank] for size, per_rank in samples.items()},
            {"nccl": (500 + 100 * rank) * 2.0**20, "nccl_init": 400 * 2.0**20, "gpu_used": 1400 * 2.0**20},
            {"torch": "2.11.0", "nccl": "2.28.9"} if rank == 0 else {},
        )
        for rank in range(2)
    ]


def test_the_result_takes_the_slowest_rank_and_the_weighted_mean() -> None:
    settings = BenchSettings(messages=parse_messages("42K:3,14K:1,1M:0"), repeats=3)
    reports = _reports(
        {
            43008: [[10.0, 11.0, 12.0], [11.0, 10.0, 12.0]],
            14336: [[4.0, 4.0, 4.0], [5.0, 5.0, 5.0]],
            1 << 20: [[30.0, 30.0, 30.0], [30.0, 31.0, 32.0]],
        }
    )
    payload = summarize(settings, reports, "graph", None, {"NCCL_PROTO": "LL"})
    metrics = payload["metrics"]
    sizes = {size["label"]: size for size in payload["sizes"]}
    assert sizes["42K"]["samples_us"] == [11.0, 11.0, 12.0]  # each repeat's slower rank
    assert metrics["allreduce_us.42K"] == pytest.approx(34 / 3)
    assert metrics["allreduce_us"] == pytest.approx((3 * 34 / 3 + 1 * 5.0) / 4)  # 1M has weight 0
    assert metrics["allreduce_us_ci95.14K"] == 0.0 and metrics["allreduce_us_ci95"] > 0
    assert metrics["nccl_memory_mib"] == 600.0 and metrics["gpu_used_mib"] == 1400.0
    assert metrics["cuda_graph"] == 1.0 and payload["timing"] == "cuda_graph" and payload["note"] is None
    assert payload["versions"]["nccl"] == "2.28.9" and payload["env"] == {"NCCL_PROTO": "LL"}
    assert parse_result("noise\n" + result_line(payload) + "\n")["metrics"] == metrics
    assert set(ALLREDUCE_METRICS) <= set(metrics)  # what an objective may name, the job reports


def test_an_eager_fallback_is_said_in_the_result() -> None:
    settings = BenchSettings(messages=parse_messages("42K"), repeats=2)
    note = "CUDA-graph capture did not finish within 30 s; timed eagerly instead"
    payload = summarize(settings, _reports({43008: [[30.0, 31.0], [30.0, 31.0]]}), "eager", note)
    assert payload["timing"] == "eager" and payload["note"] == note
    assert payload["metrics"]["cuda_graph"] == 0.0


# ---- the capture timeout, with real processes standing in for the ranks ---------------------------------
def _rank_stuck_in_capture(rank: int, messages: Any, progress: Any) -> None:
    progress[rank] = PHASES.index("capture")
    time.sleep(60)


def _rank_failing_in(rank: int, messages: Any, progress: Any, phase: str) -> None:
    progress[rank] = PHASES.index("capture" if phase.startswith("capture") else phase)
    if rank == 0:
        messages.put(("error", rank, (phase, "RuntimeError: boom")))
        messages.close()
        messages.join_thread()
        os._exit(1)
    time.sleep(60)


def _rank_dying_silently(rank: int, messages: Any, progress: Any) -> None:
    os._exit(7)


def _ranks(target: Any, *extra: Any) -> tuple[list[Any], Any, Any]:
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    messages, progress = context.Queue(), context.Array("i", 2, lock=False)
    processes = [context.Process(target=target, args=(rank, messages, progress, *extra)) for rank in range(2)]
    for process in processes:
        process.start()
    return processes, messages, progress


@pytest.mark.integration
def test_a_capture_that_hangs_is_stopped_at_its_timeout() -> None:
    processes, messages, progress = _ranks(_rank_stuck_in_capture)
    settings = BenchSettings(messages=parse_messages("42K"), capture_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(CaptureFailed, match=r"did not finish within 1 s \(ranks done: none of 2\)"):
        _collect(settings, "graph", processes, messages, progress)
    assert time.monotonic() - started < 20
    assert not any(process.is_alive() for process in processes)


@pytest.mark.parametrize(("phase", "error"), [("capture 42K", CaptureFailed), ("warming up", RankFailed)])
@pytest.mark.integration
def test_a_rank_error_in_capture_falls_back_and_elsewhere_fails(phase: str, error: type[Exception]) -> None:
    processes, messages, progress = _ranks(_rank_failing_in, phase)
    with pytest.raises(error, match="boom"):
        _collect(BenchSettings(messages=parse_messages("42K")), "graph", processes, messages, progress)
    assert not any(process.is_alive() for process in processes)


@pytest.mark.integration
def test_a_rank_that_dies_without_a_word_fails_the_run() -> None:
    processes, messages, progress = _ranks(_rank_dying_silently)
    with pytest.raises(RankFailed, match="exited with status 7"):
        _collect(BenchSettings(messages=parse_messages("42K")), "eager", processes, messages, progress)


# ---- the result line ------------------------------------------------------------------------------------
def test_the_last_result_line_counts_and_a_malformed_one_is_an_error() -> None:
    first, last = result_line({"metrics": {"a": 1}}), result_line({"metrics": {"a": 2}})
    assert parse_result(f"x\n{first}\ny\n{last}\nz")["metrics"] == {"a": 2}
    assert parse_result("no result here") is None
    for bad in ("{", "[]", '{"metrics": 3}', '{"metrics": {"a": "fast"}}', '{"metrics": {"a": true}}'):
        with pytest.raises(ResultLineError):
            parse_result(RESULT_PREFIX + bad)
    with pytest.raises(ValueError):
        result_line({"metrics": {"a": math.nan}})


# ---- statistics -------------------------------------------------------------------------------------------
def test_mean_ci_uses_student_t() -> None:
    ci = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert ci.mean == 2.5 and ci.n == 4
    assert ci.half_width == pytest.approx(3.182 * math.sqrt(5 / 3) / 2, rel=1e-3)
    assert math.isnan(mean_ci([5.0]).half_width)
    assert t_quantile(0.95, 9) == pytest.approx(2.262, abs=1e-3)


@pytest.mark.parametrize("confidence", [0.5, 0.9, 0.95, 0.975, 0.99])
@pytest.mark.parametrize("df", [0.5, 1, 2, 3, 4.7, 9, 30, 1e4])
def test_t_quantile_is_scipys_student_t(confidence: float, df: float) -> None:
    from scipy.stats import t as student_t

    assert t_quantile(confidence, df) == pytest.approx(student_t.ppf((1 + confidence) / 2, df), rel=1e-12)


@pytest.mark.integration
def test_a_job_reports_its_interval_without_importing_scipy_stats() -> None:
    # Every NCCL-stage trial is a fresh process: scipy.stats alone took 1.7 of its 2.9 s on this machine.
    code = (
        "import sys; from autotune.measure.stats import mean_ci; mean_ci([1.0, 2.0, 4.0]); "
        "print('scipy.stats' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


def test_a_gain_inside_the_noise_is_no_gain() -> None:
    reference = [18.0, 16.0, 20.0, 17.0, 19.0, 18.0]
    assert paired_gain(reference, [5.5, 5.4, 5.5, 5.4, 5.5, 5.4], minimize=True).verdict == "gain"
    noisy = paired_gain(reference, [17.0, 18.5, 19.0, 16.0, 20.0, 17.5], minimize=True)
    assert noisy.verdict == "no gain" and "inside the noise" in noisy.describe()
    assert paired_gain(reference, [r * 1.2 for r in reference], minimize=True).verdict == "loss"
    assert paired_gain([100.0, 101.0], [110.0, 112.0], minimize=False).verdict == "gain"


def test_rounds_alternate_which_config_goes_first() -> None:
    firsts = [order_of_round(i)[0] for i in range(8)]
    assert firsts == ["default", "best", "best", "default"] * 2
    assert all(set(order_of_round(i)) == {"default", "best"} for i in range(8))


def test_a_comparison_pairs_rounds_where_both_ran() -> None:
    comparison = Comparison("s", "allreduce_us", 7, {"NCCL_PROTO": "LL"})
    for index, (default, best) in enumerate([(18.0, 5.5), (17.0, 5.4), (19.0, None), (18.5, 5.5)]):
        comparison.runs.append(Run(index, "default", 0, {"allreduce_us": default, "nccl_memory_mib": 900.0}))
        metrics = {} if best is None else {"allreduce_us": best, "nccl_memory_mib": 1000.0}
        comparison.runs.append(Run(index, "best", 1, metrics, None if best else "nccl_error: x"))
    assert [d.round for d, _ in comparison.pairs()] == [0, 1, 3]
    summary = comparison.summary()
    assert summary["allreduce_us"]["verdict"] == "gain"
    assert summary["nccl_memory_mib"]["verdict"] == "loss"  # the best config takes more memory
    assert json.loads(comparison.to_json())["pairs"] == 3
    assert "allreduce_us" in comparison.table()


def test_a_serving_comparison_takes_each_metric_in_its_own_direction() -> None:
    flags: dict[str, str | None] = {"--cuda-graph-max-bs-prefill": "4096"}
    comparison = Comparison("s", "output_throughput", 19, {}, best_flags=flags)
    for index, (default, best) in enumerate([(4290.0, 4330.0), (4300.0, 4335.0), (4295.0, 4340.0)]):
        # The best config serves more tokens per second and makes the first token wait longer.
        ttft = 950.0 + index
        before = {"output_throughput": default, "mean_ttft_ms": 900.0}
        comparison.runs.append(Run(index, "default", 0, before))
        comparison.runs.append(Run(index, "best", 1, {"output_throughput": best, "mean_ttft_ms": ttft}))
    summary = comparison.summary()
    assert summary["output_throughput"]["verdict"] == "gain" and summary["output_throughput"]["gain_pct"] > 0
    assert summary["mean_ttft_ms"]["verdict"] == "loss"
    assert comparison.metrics() == ["output_throughput", "mean_ttft_ms"]
    assert json.loads(comparison.to_json())["best_flags"] == {"--cuda-graph-max-bs-prefill": "4096"}


# ---- the objective and study files -----------------------------------------------------------------------
def test_the_shipped_files_load_and_launch_the_benchmark_with_nvls_off() -> None:
    objective = load_objective(OBJECTIVE)
    assert objective.is_job and objective.goal == "minimize" and objective.workload is None
    assert objective.allreduce is not None
    assert objective.allreduce.settings().messages[0] == Message(43008, 122.0)
    study = load_study(EXAMPLE)
    assert {p.kind for p in study.search_space.parameters.values()} == {"nccl"}
    launch = study.server_launch(TrialConfig(env={"NCCL_PROTO": "LL"}))
    assert launch.argv[:3] == ("python3", "-m", "autotune.measure.nccl")
    assert BenchSettings.from_argv(launch.argv[3:]) == objective.allreduce.settings()
    assert launch.env["NCCL_NVLS_ENABLE"] == "0" and launch.env["NCCL_PROTO"] == "LL"
    assert launch.port == AUTO_PORT and "--model-path" not in launch.argv


def _objective(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "ar",
        "kind": "nccl_allreduce",
        "metric": "allreduce_us",
        "allreduce": {"messages": {"42K": 122}},
    }
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


SERVING_WORKLOAD = {"num_prompts": 4, "input_len": 100, "output_len": 10, "concurrency": 2}


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"allreduce": None}, "allreduce", "needs an `allreduce` section"),
        ({"workload": SERVING_WORKLOAD}, "workload", "only applies to serving"),
        ({"metric": "output_throughput"}, "metric", "not a metric of the all-reduce"),
        ({"limits": {"p99_itl_ms": 5}}, "metric", "not a metric of the all-reduce"),
        ({"allreduce": {"messages": {"42X": 1}}}, "allreduce.messages.42X", "not a message size"),
        ({"allreduce": {"messages": {"42K": 1, 43008: 2}}}, "allreduce.messages[43008]", "same size"),
        ({"allreduce": {"messages": {"42K": 0}}}, "allreduce.messages", "every weight is 0"),
        ({"allreduce": {"messages": {"43007": 1}}}, "allreduce.messages.43007", "bfloat16 elements"),
        ({"allreduce": {"messages": {"42K": 1}, "repeats": 1}}, "allreduce.repeats", ""),
        (
            {"kind": "serving", "workload": SERVING_WORKLOAD},
            "allreduce",
            "only applies to `kind: nccl_allreduce`",
        ),
    ],
)
def test_an_allreduce_objective_refuses_what_does_not_belong(
    changes: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        parse_objective(_objective(**changes), "o.yaml")
    assert info.value.field == field, str(info.value)
    assert words in str(info.value)


def test_a_serving_objective_needs_a_workload_and_serving_metrics() -> None:
    serving = {"name": "s", "metric": "output_throughput", "workload": SERVING_WORKLOAD}
    assert not parse_objective(serving).is_job
    with pytest.raises(ConfigError, match="needs a workload"):
        parse_objective({k: v for k, v in serving.items() if k != "workload"})
    with pytest.raises(ConfigError, match="measured by the all-reduce benchmark"):
        parse_objective({**serving, "metric": "allreduce_us"})


def _job_study(*, server: dict[str, Any], space: Path = SPACE, objective: Path = OBJECTIVE) -> dict[str, Any]:
    return study_data(search_space=space, objective=objective, server=server, sampler=None)


@pytest.mark.parametrize(
    ("server", "field"),
    [
        ({"model_path": "/models/x"}, "server.model_path"),
        ({"flags": {"--tp-size": 2}}, "server.flags.--tp-size"),
        ({"env": {"NCCL_NVLS_ENABLE": "1"}}, "server.env.NCCL_NVLS_ENABLE"),
    ],
)
def test_a_job_study_refuses_a_model_server_flags_and_nvls(
    study_file: StudyFiles, server: dict[str, Any], field: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_study(study_file(_job_study(server=server)))
    assert info.value.field == field, str(info.value)


def test_a_job_study_refuses_server_parameters(study_file: StudyFiles) -> None:
    with pytest.raises(ConfigError, match="runs no server"):
        load_study(study_file(_job_study(server={}, space=SHIPPED_SPACE)))


def test_a_serving_study_still_needs_its_model(study_file: StudyFiles) -> None:
    with pytest.raises(ConfigError) as info:
        load_study(study_file(_job_study(server={}, objective=REPO / "objectives" / "throughput.yaml",
                                         space=SHIPPED_SPACE)))  # fmt: skip
    assert info.value.field == "server.model_path"


def test_a_trial_env_with_nvls_on_is_never_launched(study_file: StudyFiles) -> None:
    study = load_study(study_file(_job_study(server={})))
    with pytest.raises(ForbiddenLaunchError, match="NCCL_NVLS_ENABLE=2"):
        study.server_launch(TrialConfig(env={"NCCL_NVLS_ENABLE": "2"}))


# ---- the job trial mode, with real processes ----------------------------------------------------------
def _job(tmp_path: Path, code: str, env: dict[str, str] | None = None, timeout_s: float = 30) -> TrialRequest:
    script = tmp_path / "job.py"
    script.write_text(code)
    launch = ServerLaunch(
        (sys.executable, str(script), "--messages", "42K"), env or {}, "127.0.0.1", AUTO_PORT
    )
    return TrialRequest(1, launch, None, startup_timeout_s=5, benchmark_timeout_s=timeout_s, job=True)


@pytest.fixture
def executor(tmp_path: Path) -> TrialExecutor:
    return TrialExecutor("n0", LocalCommandRunner(tmp_path / "state"), tmp_path / "node")


@pytest.mark.integration
def test_a_job_trial_reports_its_metrics_and_result(tmp_path: Path, executor: TrialExecutor) -> None:
    result = executor.run(_job(tmp_path, STAND_IN.format(repo=str(REPO)), {"NCCL_PROTO": "LL"}))
    assert result.ok and result.failure is None and result.benchmark is None
    assert result.metrics["allreduce_us"] == 6.0  # the trial's env reached the job
    assert result.details["argv"] == ["--messages", "42K"] and result.details["timing"] == "cuda_graph"
    assert result.returncode == 0 and "measuring" in result.phase_times and result.benchmark_s is not None
    assert "warming up" in result.log
    assert json.loads(json.dumps(result.summary(), default=str))["metrics"]["allreduce_us"] == 6.0


@pytest.mark.parametrize(
    ("code", "kind", "words"),
    [
        (
            "import sys\nprint('torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1, "
            "invalid usage')\nsys.exit(1)",
            FailureKind.NCCL_ERROR,
            "NCCL error",
        ),
        (
            "import sys\nprint('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB')\n"
            "sys.exit(1)",
            FailureKind.OOM_UNDER_LOAD,
            "out of memory",
        ),
        ("raise SystemExit(3)", FailureKind.UNKNOWN_CRASH, "exit status 3"),
        ("print('done, but no result')", FailureKind.BENCHMARK_ERROR, "without a result line"),
        (f"print({RESULT_PREFIX!r} + '{{oops')", FailureKind.BENCHMARK_ERROR, "not JSON"),
    ],
)
@pytest.mark.integration
def test_a_failed_job_is_classified_like_a_server(
    tmp_path: Path, executor: TrialExecutor, code: str, kind: FailureKind, words: str
) -> None:
    result = executor.run(_job(tmp_path, code))
    assert not result.ok and result.failure is not None
    assert result.failure.kind is kind, result.failure
    assert words in result.failure.line


@pytest.mark.integration
def test_a_hanging_job_is_stopped_at_the_benchmark_timeout(tmp_path: Path, executor: TrialExecutor) -> None:
    started = time.monotonic()
    code = "import subprocess, sys, time\n"  # a rank left behind must go with the job
    code += "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    code += "print('capture 42K', flush=True)\ntime.sleep(60)\n"
    result = executor.run(_job(tmp_path, code, timeout_s=1.5))
    assert time.monotonic() - started < 30
    assert result.failure is not None and result.failure.kind is FailureKind.BENCHMARK_ERROR
    assert "did not finish within 1.5 s" in result.failure.line
    assert result.server_pgid is not None and not _group_alive(result.server_pgid)  # the child too


def _group_alive(pgid: int) -> bool:
    from autotune.node.runner import _group_members

    return bool(_group_members(pgid))


@pytest.mark.integration
def test_wait_for_job_returns_when_told_to_stop(tmp_path: Path) -> None:
    runner = LocalCommandRunner()
    process = runner.start([sys.executable, "-c", "import time; time.sleep(30)"], {}, tmp_path / "log")
    try:
        outcome = wait_for_job(process, 60, stopped=lambda: True)
        assert outcome.returncode is None and outcome.elapsed_s < 5
    finally:
        process.stop(grace_s=1)


# ---- a study and a comparison through the CLI, without Ray ---------------------------------------------
@pytest.fixture
def stand_in_study(tmp_path: Path, study_file: StudyFiles) -> Path:
    (tmp_path / "bench.py").write_text(STAND_IN.format(repo=str(REPO)))
    study = yaml.safe_load(EXAMPLE.read_text())
    study.update(
        search_space=str(SPACE),
        objective=str(OBJECTIVE),
        # `auto`, not SGLang's 30000, which another run or a quickstart on this host may be serving on (nor a
        # port free when the file is written: another process may take it before the node check).
        server={
            "command": [sys.executable, str(tmp_path / "bench.py")],
            "env": {"NCCL_NVLS_ENABLE": "0"},
            "port": "auto",
        },
        budget={"n_trials": 5},
        timeouts={"benchmark_s": 30},
        trust=False,  # five trials of the stand-in, no repeats or confirmation rounds: compare is the test
    )
    return study_file(study)


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], cwd=cwd, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.integration
def test_a_study_runs_without_ray_and_its_best_is_compared(stand_in_study: Path) -> None:
    done = _cli("run", str(stand_in_study), "--no-ray", "--no-tracking", cwd=stand_in_study.parent)
    assert done.returncode == 0, done.stderr
    study = load_study(stand_in_study)
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    trials = optuna_study.get_trials()
    assert len(trials) == 5 and all(t.state.name == "COMPLETE" for t in trials)
    assert trials[0].user_attrs["metrics"]["nccl_memory_mib"] == 900.0
    assert (study.workdir / "nodes" / "local" / "trial-0000" / "server.log").is_file()

    comparison = compare(study, optuna_study, 2, trial=0)  # the default against itself: an A/A test
    assert len(comparison.runs) == 4 and all(run.failure is None for run in comparison.runs)
    assert comparison.gain() is not None and comparison.gain().verdict == "no gain"  # type: ignore[union-attr]

    done = _cli("compare", str(stand_in_study), "--rounds", "2", cwd=stand_in_study.parent)
    assert done.returncode == 0, done.stderr
    assert "best vs default" in done.stdout and (study.workdir / "compare.json").is_file()


@pytest.mark.integration
def test_compare_refuses_one_round(stand_in_study: Path, tmp_path: Path) -> None:
    done = _cli("compare", str(stand_in_study), "--rounds", "1", cwd=tmp_path)
    assert done.returncode == 2 and "two rounds" in done.stderr
    with pytest.raises(AutotuneError, match="rounds >= 2"):
        compare(load_study(stand_in_study), optuna.create_study(), 1)


# ---- on two GPUs ------------------------------------------------------------------------------------------
def _cuda_gpus() -> int:
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return -1
    return int(torch.cuda.device_count())


@pytest.mark.skipif(
    _cuda_gpus() < 2, reason="needs torch with NCCL and two CUDA GPUs (benchmarks/RESULTS-gpu.md)"
)
def test_the_benchmark_measures_on_two_gpus() -> None:
    argv = ["--messages", "42K:1,14K:0", "--repeats", "3", "--replays", "3", "--capture-timeout", "30"]
    env = {**os.environ, "NCCL_NVLS_ENABLE": "0", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "autotune.measure.nccl", *argv],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    payload = parse_result(done.stdout)
    assert payload is not None and payload["metrics"]["allreduce_us"] > 0
    assert payload["metrics"]["nccl_memory_mib"] > 0 and payload["versions"]["nccl"]
