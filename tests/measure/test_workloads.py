"""Workloads users serve: prompts files, length distributions, arrivals, goodput, and the highest load
within an SLO, each measured against the simulated SGLang server as a real process."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from autotune.config.objective import parse_objective
from autotune.errors import ConfigError
from autotune.measure.client import (
    BenchmarkError,
    BenchmarkResult,
    RequestOutcome,
    Slo,
    Workload,
    benchmark,
    run_benchmark,
    summarize,
)
from autotune.measure.load_search import LoadSearchPlan
from autotune.measure.plan import MeasurementPlan, run_plan, run_seed
from autotune.measure.workloads import TOKEN_IDS, arrival_offsets, load_prompts, requests_for
from autotune.node.bench_serving import command, parse_output
from autotune.node.executor import TrialExecutor
from autotune.node.runner import LocalCommandRunner
from autotune.sim.predictability import predictability
from autotune.tracking.tracker import measurement_metrics
from tests.builders import REPO, StudyFiles
from tests.node.test_executor import request as node_request
from tests.sim.test_server import SimServer, ready_sim_server
from tests.test_objectives import BENCH_SERVING_LINE

SHIPPED = REPO / "prompts" / "autotune-prompts.jsonl"
# Serving 50x faster than real time: latencies of tens of ms stay above the client's own overhead.
FAST = {"SGLANG_SIM_TIME_SCALE": "0.02", "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001"}
EAGLE3 = ("--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path", "lmsys/Kimi-K2.5-EAGLE3")


def objective(**changes: object) -> dict[str, object]:
    base: dict[str, object] = {
        "name": "t",
        "metric": "request_goodput",
        "workload": {
            "num_prompts": 8,
            "input_len": 100,
            "output_len": 16,
            "concurrency": 4,
            "slo": {"ttft_ms": 1000},
        },
    }
    return {**base, **changes}


# -- prompts files and lengths --------------------------------------------------------------------------
def test_jsonl_and_sharegpt_files_are_read(tmp_path: Path) -> None:
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "hello there", "output_len": 7}\n\n{"input_ids": [5, 6, 7]}\n')
    assert [(p.text, p.input_ids, p.output_len) for p in load_prompts(str(jsonl))] == [
        ("hello there", None, 7),
        (None, (5, 6, 7), None),
    ]
    sharegpt = tmp_path / "s.json"
    conversations = [
        {
            "conversations": [
                {"from": "human", "value": "Why is the sea salty?"},
                {"from": "gpt", "value": "a b c"},
            ]
        },
        {"conversations": [{"from": "human", "value": "one turn only"}]},  # skipped, as bench_serving does
    ]
    sharegpt.write_text(json.dumps(conversations))
    assert [(p.text, p.output_len) for p in load_prompts(str(sharegpt))] == [("Why is the sea salty?", 3)]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            '{"text": "a"}\n{"txt": "b"}\n',
            "p.jsonl: line 2: needs exactly one of text and input_ids (got ['txt'])",
        ),
        ('{"text": "a", "output_len": 0}\n', "p.jsonl: line 1: output_len: not a positive int (got 0)"),
        ("not json\n", "p.jsonl: line 1: not JSON"),
        ("", "p.jsonl: holds no prompts"),
    ],
)
def test_a_bad_prompts_file_names_file_line_value_and_fix(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "p.jsonl").write_text(content)
    (tmp_path / "o.yaml").write_text("")
    data = objective(workload={**objective()["workload"], "prompts": "p.jsonl"})  # type: ignore[dict-item]
    with pytest.raises(ConfigError) as caught:
        parse_objective(data, tmp_path / "o.yaml")
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'o.yaml'}: workload.prompts: ") and message in text


def test_the_shipped_prompts_are_small_varied_and_licensed() -> None:
    prompts = load_prompts(str(SHIPPED))
    assert len(prompts) >= 150 and SHIPPED.stat().st_size < 200_000
    assert len({p.text for p in prompts}) == len(prompts)
    lengths = sorted(len((p.text or "").split()) for p in prompts)
    assert lengths[0] < 20 and lengths[-1] > 80
    assert "CC0" in (SHIPPED.parent / "README.md").read_text()


def test_random_ids_stay_what_they_were_and_lengths_follow_their_distribution() -> None:
    fixed = Workload(num_prompts=3, input_len=50, output_len=9, concurrency=1)
    # Today's prompts, seeded as before: the same random ids for the same seed.
    before = random.Random("autotune:bench:4:2").choices(TOKEN_IDS, k=50)
    assert requests_for(fixed, "bench", 4, 3)[2].input_ids == before
    uniform = replace(fixed, lengths="uniform", range_ratio=0.5, input_len=400, output_len=100)
    drawn = requests_for(uniform, "bench", 0, 200)
    assert {len(r.input_ids or []) for r in drawn} <= set(range(200, 401))
    assert min(r.output_len for r in drawn) < 60 and max(r.output_len for r in drawn) > 90
    from_file = replace(fixed, prompts=str(SHIPPED), lengths="file")
    sent = requests_for(from_file, "bench", 0, 50)
    assert all(r.text and r.input_ids is None for r in sent)
    assert len({r.output_len for r in sent}) > 3  # the file's answer lengths, not output_len


def test_poisson_and_gamma_gaps_have_the_rate_and_the_spread() -> None:
    def gaps(burstiness: float) -> list[float]:
        at = arrival_offsets(4000, 5.0, burstiness, time_scale=0.1)
        return [b - a for a, b in itertools.pairwise(at)]

    poisson, bursty = gaps(1.0), gaps(0.25)
    # Mean gap 1/rate server seconds (0.2), times 0.1 real seconds per server second.
    assert statistics.mean(poisson) == pytest.approx(0.02, rel=0.05)
    assert statistics.mean(bursty) == pytest.approx(0.02, rel=0.1)
    # A gamma of shape k has a coefficient of variation of 1/sqrt(k): 1 for Poisson, 2 for k = 0.25.
    assert statistics.stdev(poisson) / statistics.mean(poisson) == pytest.approx(1.0, rel=0.08)
    assert statistics.stdev(bursty) / statistics.mean(bursty) == pytest.approx(2.0, rel=0.1)
    assert arrival_offsets(3, None, 1.0) == [0.0, 0.0, 0.0]
    # The same traffic for every trial; twice the rate, the same schedule twice as fast.
    assert arrival_offsets(5, 10.0, 1.0) == pytest.approx([t / 2 for t in arrival_offsets(5, 5.0, 1.0)])


# -- goodput --------------------------------------------------------------------------------------------
def test_goodput_counts_requests_that_meet_every_limit_as_sglang_does() -> None:
    def outcome(ttft: float, latency: float, tokens: int, success: bool = True) -> RequestOutcome:
        return RequestOutcome(success=success, output_tokens=tokens, ttft_s=ttft, latency_s=latency)

    # SGLang 0.5.23 sglang/benchmark/goodput.py: tpot = (latency - ttft) / (output_len - 1), limits in ms;
    # attainment divides by every request sent, failures included.
    outcomes = [
        outcome(0.1, 1.1, 11),  # ttft 100 ms, tpot 100 ms: good
        outcome(0.1, 2.1, 11),  # tpot 200 ms: misses
        outcome(0.6, 0.6, 1),  # ttft 600 ms: misses; one token, tpot 0
        outcome(0.2, 0.2, 1),  # good
        outcome(0.1, 0.1, 0, success=False),
    ]
    workload = Workload(5, 10, 11, 5, slo=Slo(ttft_ms=500, tpot_ms=150))
    result = summarize(outcomes, duration_s=2.0, workload=workload)
    assert result.request_goodput == pytest.approx(2 / 2.0)
    assert result.slo_attainment == pytest.approx(2 / 5)
    assert result.slo_over == {"ttft_ms": 1, "tpot_ms": 1}  # each limit's misses, of the requests served
    assert summarize(outcomes, 2.0, replace(workload, slo=None)).request_goodput is None
    again = BenchmarkResult.from_json(result.to_json())
    assert again == result and again.workload.slo == Slo(ttft_ms=500, tpot_ms=150)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"metric": "max_load"}, "max_load is what a load search measures"),
        ({"load_search": {"start": 1, "max": 8}, "metric": "request_goodput"}, "one needs the other"),
        (
            {"workload": {"num_prompts": 8, "input_len": 9, "output_len": 9, "concurrency": 4}},
            "workload.slo: request_goodput counts the requests that met an SLO, and none is set",
        ),
        (
            {"metric": "max_load", "load_search": {"start": 9, "max": 8}},
            "load_search.start: start is above max",
        ),
        (
            {"client": "bench_serving", "workload": {**objective()["workload"], "burstiness": 0.5}},  # type: ignore[dict-item]
            "workload.burstiness: sglang.bench_serving cannot send this workload",
        ),
        (
            {"workload": {**objective()["workload"], "lengths": "file"}},  # type: ignore[dict-item]
            "workload.lengths: lengths from the file need a prompts file",
        ),
        ({"workload": {**objective()["workload"], "slo": {}}}, "workload.slo: an SLO needs a limit"),  # type: ignore[dict-item]
    ],
)
def test_objective_rules_name_field_and_fix(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=r"^o\.yaml: ") as caught:
        parse_objective(objective(**changes), "o.yaml")
    assert message in str(caught.value)


# -- real processes: the simulated server ---------------------------------------------------------------
@pytest.fixture
def sim() -> Iterator[SimServer]:
    yield from ready_sim_server("--skip-server-warmup", env=FAST)


@pytest.mark.integration
def test_goodput_at_a_poisson_rate_on_the_simulated_server(sim: SimServer) -> None:
    workload = Workload(
        num_prompts=16,
        input_len=100,
        output_len=48,
        concurrency=16,
        prompts=str(SHIPPED),
        request_rate=2.0,
        slo=Slo(ttft_ms=3000, tpot_ms=30),
    )
    started = asyncio.run(asyncio.wait_for(_timed(sim.url(""), workload), 60))
    result, wall = started
    # 16 Poisson arrivals at 2 req/s: the last is due 5.6 server s after the first (0.11 real s at 50x,
    # gaps of a few ms); the server admits each when it is due (its header), not the lot as one burst.
    last_due = arrival_offsets(16, 2.0, 1.0)[-1]
    assert wall > 0.05 and result.completed == 16 and result.duration_s > last_due
    assert result.request_goodput is not None and result.slo_attainment is not None
    assert 0 < result.request_goodput <= result.request_throughput
    assert result.request_goodput == pytest.approx(result.slo_attainment * 16 / result.duration_s)
    loose = benchmark(sim.url(""), replace(workload, slo=Slo(e2el_ms=1e9)), 60)
    assert loose.slo_attainment == 1.0
    tight = benchmark(sim.url(""), replace(workload, slo=Slo(ttft_ms=0.001)), 60)
    assert tight.request_goodput == 0.0 and tight.slo_attainment == 0.0


async def _timed(url: str, workload: Workload) -> tuple[BenchmarkResult, float]:
    loop = asyncio.get_running_loop()
    start = loop.time()
    result = await run_benchmark(url, workload, timeout_s=60)
    return result, loop.time() - start


@pytest.mark.integration
def test_the_load_search_brackets_the_highest_rate_within_the_slo(sim: SimServer) -> None:
    base = Workload(num_prompts=12, input_len=200, output_len=48, concurrency=64, slo=Slo(tpot_ms=30))
    search = LoadSearchPlan("request_rate", start=0.5, max=64, steps=7, attainment=0.9, tolerance=0.2)
    plan = replace(MeasurementPlan.single(base), load_search=search)

    async def measure(workload: Workload, index: int) -> BenchmarkResult:
        return await run_benchmark(sim.url(""), workload, timeout_s=60, seed=run_seed(0, index))

    result = asyncio.run(run_plan(plan, measure))
    rates = [step.workload.request_rate for step in result.levels]
    passed = [r for r, step in zip(rates, result.levels, strict=True) if search.passed(step)]
    missed = [r for r, step in zip(rates, result.levels, strict=True) if not search.passed(step)]
    # From the start, doubled while passing or halved while missing, then bisected.
    assert rates[0] == 0.5 and rates[1] in (0.25, 1.0) and passed and missed, rates
    assert result.workload.request_rate == max(passed)  # the highest passing step's figures
    assert min(missed) > max(passed)  # the answer's bracket: the next rate up missed
    # max_load: where the attainment crossed 90% between them, interpolated
    assert max(passed) <= result.max_load < min(missed)  # type: ignore[operator]
    assert result.load_stopped_by is not None
    metrics = measurement_metrics(result)
    assert metrics["max_load"] == result.max_load
    assert [metrics[f"step{i}.request_rate"] for i in range(len(rates))] == rates
    assert all(f"step{i}.slo_attainment" in metrics for i in range(len(rates)))


@pytest.mark.integration
def test_a_config_that_never_meets_the_slo_scores_zero_down_to_min(sim: SimServer) -> None:
    base = Workload(num_prompts=4, input_len=200, output_len=16, concurrency=8, slo=Slo(ttft_ms=0.001))
    search = LoadSearchPlan("request_rate", start=1.0, max=8, steps=8, min=0.25)
    plan = replace(MeasurementPlan.single(base), load_search=search)

    async def measure(workload: Workload, index: int) -> BenchmarkResult:
        return await run_benchmark(sim.url(""), workload, timeout_s=60, seed=index)

    result = asyncio.run(run_plan(plan, measure))
    assert [step.workload.request_rate for step in result.levels] == [1.0, 0.5, 0.25]
    assert result.max_load == 0.0
    assert (result.load_stopped_by or "").startswith("the SLO missed down to the lowest load tried (0.25)")


@pytest.mark.integration
def test_a_server_dying_under_load_keeps_the_highest_load_that_passed(tmp_path: Path) -> None:
    executor = TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=1.0)
    # 16-token answers, a loose SLO: concurrency 1 and 2 pass (1 warm-up + 4 + 4 requests = 144 tokens);
    # the server dies 150 tokens in, during the step at concurrency 4.
    base = Workload(num_prompts=4, input_len=500, output_len=16, concurrency=1, slo=Slo(e2el_ms=1e9))
    search = LoadSearchPlan("concurrency", start=1, max=64, steps=6)
    trial = node_request("--skip-server-warmup", env={"SGLANG_SIM_FAULT": "crash_benchmark:150"})
    trial = replace(trial, workload=base, plan=replace(MeasurementPlan.single(base), load_search=search))
    result = executor.run(trial)
    assert result.failure is None and result.benchmark is not None
    assert result.benchmark.max_load == 2.0 and result.benchmark.workload.concurrency == 2
    assert (result.benchmark.load_stopped_by or "").startswith("the server died: ")
    assert "CUDA error: an illegal memory access" in result.benchmark.load_stopped_by  # type: ignore[operator]


@pytest.mark.integration
def test_text_prompts_accept_more_draft_tokens_than_random_ids() -> None:
    def accept_length(prompts: str | None) -> float:
        server = SimServer(*EAGLE3, "--skip-server-warmup", env=FAST)
        try:
            server.wait_ready()
            workload = Workload(16, 200, 64, 8, prompts=prompts)
            result = benchmark(server.url(""), workload, 60)
        finally:
            server.close()
        assert result.accept_length is not None
        return result.accept_length

    random_ids, text = accept_length(None), accept_length(str(SHIPPED))
    # Token ids keep the profile's figure (no words to read); text is mostly common words and phrases.
    assert predictability("the cat sat on the mat; a cat sat".split()) == pytest.approx(5 / 9)
    assert 2.0 < random_ids < 2.6 and text > random_ids + 0.3


# -- sglang.bench_serving as the client -----------------------------------------------------------------
def test_bench_serving_sends_the_workload_in_real_time_and_reads_its_goodput(tmp_path: Path) -> None:
    sharegpt = tmp_path / "s.json"
    workload = Workload(
        8, 100, 64, 4, prompts=str(sharegpt), request_rate=2.0, slo=Slo(ttft_ms=3000, tpot_ms=30)
    )
    # Served 50x faster: 2 req/s of server time is 100 real req/s, 3000 server ms are 60 real ms.
    argv = " ".join(
        command(["py"], "http://h:1", workload, tokenizer="/t", output_file="/o", seed=1, time_scale=0.02)
    )
    for part in (
        f"--dataset-name sharegpt --dataset-path {sharegpt} --sharegpt-output-len 64",
        "--request-rate 100",
        "--goodput ttft:60 tpot:0.6",
    ):
        assert part in argv
    uniform = replace(
        workload, prompts=None, lengths="uniform", range_ratio=0.25, request_rate=None, slo=None
    )
    argv = " ".join(command(["py"], "http://h:1", uniform, tokenizer="/t", output_file="/o", seed=1))
    assert "--dataset-name random-ids" in argv and "--random-range-ratio 0.25" in argv
    assert "--request-rate" not in argv and "--goodput" not in argv
    # SGLang 0.5.23's result keys (sglang/benchmark/goodput.py GoodputMetrics), per real second.
    line = {**BENCH_SERVING_LINE, "request_goodput": 0.05, "slo_attainment": 0.75}
    result = parse_output(json.dumps(line), workload, time_scale=0.02)
    assert result.request_goodput == pytest.approx(0.001) and result.slo_attainment == 0.75
    with pytest.raises(BenchmarkError, match=r"an SLO needs SGLang 0\.5\.23 or later"):
        parse_output(json.dumps(BENCH_SERVING_LINE), workload)


# -- the shipped examples, through the CLI ---------------------------------------------------------------
@pytest.mark.parametrize("example", ["goodput", "max-load-slo"])
@pytest.mark.integration
def test_the_shipped_examples_validate(tmp_path: Path, example: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "validate", str(REPO / "examples" / f"{example}.yaml")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"study quickstart-{example}: OK")


@pytest.mark.integration
def test_a_max_load_study_runs_and_logs_each_step_to_mlflow(tmp_path: Path, study_file: StudyFiles) -> None:
    study = yaml.safe_load((REPO / "examples" / "max-load-slo.yaml").read_text())
    study["search_space"] = str(REPO / "search_spaces" / "sglang-nccl-eagle3.yaml")
    objective = yaml.safe_load((REPO / "objectives" / "max-load-slo.yaml").read_text())
    objective["workload"]["prompts"] = str(SHIPPED)
    objective["load_search"]["steps"] = 2  # too few for its tolerance: the trial carries a warning
    (tmp_path / "objective.yaml").write_text(yaml.safe_dump(objective))
    study["objective"] = str(tmp_path / "objective.yaml")
    study["budget"] = {"n_trials": 1}  # the baseline: one launch, one search
    study["nccl_stage"] = False  # the objective is what is under test, not the NCCL stage's 26 jobs
    study_file(study)
    done = subprocess.run(  # --no-ray: nor the Ray pool's start (its own tests start it)
        [sys.executable, "-m", "autotune", "run", "study.yaml", "--no-ray"],
        cwd=tmp_path,
        env=dict(os.environ, RAY_AUTH_MODE="disabled"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"^answer: .*\n\s+max_load \d+\.\d+ ", done.stdout, re.MULTILINE), done.stdout
    db = tmp_path / ".autotune" / "quickstart-max-load-slo" / "mlflow.db"
    with sqlite3.connect(db) as connection:
        keys = {key for (key,) in connection.execute("select distinct key from metrics")}
        query = "select value from tags where key = 'autotune.load_warning'"
        (warning,) = connection.execute(query).fetchone()
    assert {"max_load", "step0.request_rate", "step0.slo_attainment", "step1.request_rate"} <= keys
    assert warning.startswith("the load search ran out of steps (2) before its tolerance (0.1): max_load ")
    status = subprocess.run(
        [sys.executable, "-m", "autotune", "status", "study.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "400"},  # status wraps at the terminal's width: one line here
    )
    assert f"warning: {warning}" in status.stdout, status.stdout
