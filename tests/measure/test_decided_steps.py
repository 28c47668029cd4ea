"""A load-search step stops sending once its outcome is decided (issue 37: max_load's node hours): more of its
requests missed the SLO than its attainment allows of its num_prompts, or one failed. The rule is the plan's
(`LoadSearchPlan.miss_limit`), the client and the model node stop there, and `stop_when_decided: false`
sends every prompt as before."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.cli.answers import _status_notes, _trial_record
from autotune.config import load_study
from autotune.config.objective import parse_objective
from autotune.errors import ConfigError
from autotune.measure import remote
from autotune.measure.client import BenchmarkResult, MissLimit, RequestOutcome, Slo, Workload
from autotune.measure.load_search import LoadSearchPlan
from autotune.measure.plan import MeasurementPlan, plan_for, run_plan_sync
from autotune.node.executor import TrialExecutor
from autotune.node.runner import LocalCommandRunner
from autotune.sim.model_node import ModelNodeExecutor
from autotune.sim.profiles import load_hardware_profile, load_model_profile
from autotune.study.loop import StudyDriver
from autotune.study.records import TrialRecord
from autotune.tracking.tracker import measurement_metrics
from autotune.trial.launch import ServerLaunch
from autotune.trial.wire import TrialRequest, TrialResult
from tests.builders import StudyFiles, model_pool
from tests.measure.test_load_search import step
from tests.node.test_executor import request as node_request
from tests.study.test_max_load_hours import SPACE, max_load_objective

PLAN = LoadSearchPlan("request_rate", start=2, max=64, steps=5, attainment=0.9)


def test_a_step_is_decided_exactly_where_running_it_through_could_no_longer_pass() -> None:
    for attainment in (0.5, 0.8, 0.9, 0.95, 0.99, 1.0):
        plan = replace(PLAN, attainment=attainment)
        for n in range(1, 161):
            limit = plan.miss_limit(Workload(n, 10, 10, 4))
            assert limit is not None and limit.failed == 0
            # `allowed` misses still pass with every other request good; one more cannot pass.
            assert plan.passed(step(Workload(n, 10, 10, 4), (n - limit.missed) / n))
            assert not plan.passed(step(Workload(n, 10, 10, 4), (n - limit.missed - 1) / n))
    assert PLAN.miss_limit(Workload(80, 10, 10, 4)) == MissLimit(missed=8)  # 80 * (1 - 0.9) < 8 in floats


def test_the_tally_decides_at_the_first_miss_past_the_limit_or_the_first_failure() -> None:
    good, slow = RequestOutcome(True, 10, 10, 0.1, [], 0.5), RequestOutcome(True, 10, 10, 5.0, [], 6.0)
    tally = MissLimit(missed=2).tally(Slo(ttft_ms=1000))
    assert [tally.ended(o) for o in (good, slow, good, slow)] == [False] * 4
    assert tally.ended(slow)
    assert MissLimit(missed=2).tally(Slo(ttft_ms=1000)).ended(RequestOutcome(error="HTTP 500"))


def test_a_decided_step_says_how_many_prompts_it_sent_and_brings_its_share_over_them() -> None:
    base = Workload(num_prompts=80, input_len=10, output_len=10, concurrency=64)

    def measure(workload: Workload, _index: int) -> BenchmarkResult:
        load = PLAN.load_of(workload)
        return step(workload, 1.0) if load <= 16 else replace(step(workload, 0.7), decided_after=30)

    result = run_plan_sync(replace(MeasurementPlan.single(base), load_search=PLAN), measure)
    assert result.load_stopped_by == "the steps ran out (5): highest pass 16, lowest miss 32"
    assert result.max_load == pytest.approx(16 + 16 * 0.1 / 0.3)  # the share over the 30 sent
    one_step = LoadSearchPlan("request_rate", start=32, max=32, min=32)
    missed = run_plan_sync(replace(MeasurementPlan.single(base), load_search=one_step), measure)
    assert missed.load_stopped_by == (
        "the SLO missed down to the lowest load tried (32): "
        "the SLO missed at 32 (70% good; decided after 30 of 80 prompts)"
    )


def test_the_switch_is_in_the_objectives_load_search_on_by_default_and_strict() -> None:
    objective = {
        "name": "m",
        "metric": "max_load",
        "workload": {
            "num_prompts": 8,
            "input_len": 20,
            "output_len": 8,
            "concurrency": 8,
            "slo": {"ttft_ms": 9},
        },
        "load_search": {"start": 1, "max": 4},
    }
    plan = plan_for(parse_objective(objective)).load_search
    assert plan is not None and plan.stop_when_decided
    off = plan_for(
        parse_objective({**objective, "load_search": {"start": 1, "max": 4, "stop_when_decided": False}})
    )
    assert off.load_search is not None and off.miss_limit(off.levels[0]) is None
    with pytest.raises(ConfigError, match="stop_when_decided"):
        parse_objective({**objective, "load_search": {"start": 1, "max": 4, "stop_when_decided": "yes"}})


# The model node: 80 requests of 2000 tokens in, 500 out, on 8x H200 serving Llama 70B (the peers profile's
# size of step); 1 req/s is served, 32 queues past the SLO.
SLO_WORKLOAD = Workload(
    num_prompts=80, input_len=2000, output_len=500, concurrency=64, warmup_requests=0, request_rate=1.0,
    slo=Slo(ttft_ms=1500, tpot_ms=30),
)  # fmt: skip


def model_search(rate: float, slo: Slo, stop_when_decided: bool) -> TrialResult:
    """One load-search step at `rate` (start = max = min) on the model node."""
    node = ModelNodeExecutor(
        "model", load_hardware_profile("h200-nvlink-x8"), load_model_profile("llama-70b-bf16")
    )
    server = ServerLaunch(("--model-path", "/models/Llama-70B", "--tp-size", "8"), {}, "127.0.0.1", 30000)
    workload = replace(SLO_WORKLOAD, request_rate=rate, slo=slo)
    one_step = LoadSearchPlan("request_rate", rate, rate, min=rate, stop_when_decided=stop_when_decided)
    plan = replace(MeasurementPlan.single(workload), load_search=one_step)
    return node.run(TrialRequest(0, server, workload, 60, 60, plan=plan))


def test_the_model_node_charges_a_decided_step_only_for_what_it_sent() -> None:
    nobody = Slo(ttft_ms=1)  # no request meets it: decided at the 9th answer (8 of 80 may miss)
    on, off = model_search(1.0, nobody, True), model_search(1.0, nobody, False)
    assert on.benchmark is not None and off.benchmark is not None
    assert on.benchmark_s is not None and off.benchmark_s is not None
    sent = on.benchmark.levels[0].decided_after
    assert sent is not None and 9 <= sent < 30  # the 9th answer, and those in flight then
    assert on.benchmark.levels[0].completed == sent and on.benchmark.levels[0].failed == 0
    assert off.benchmark.levels[0].decided_after is None and off.benchmark.levels[0].completed == 80
    assert off.benchmark_s > 80 and on.benchmark_s < off.benchmark_s / 3  # the arrivals' 80 s, against ~20
    assert on.benchmark.max_load == off.benchmark.max_load == 0.0
    assert "decided after" in (on.benchmark.load_stopped_by or "")
    # A step's verdict is the same as running it through, whatever the load.
    for rate in (1.0, 8.0, 16.0, 32.0):
        on, off = (model_search(rate, SLO_WORKLOAD.slo, switch) for switch in (True, False))  # type: ignore[arg-type]
        assert on.benchmark is not None and off.benchmark is not None
        verdict = PLAN.passed  # attainment 0.9, as the steps'
        assert verdict(on.benchmark.levels[0]) == verdict(off.benchmark.levels[0])
        assert (on.benchmark_s or 0) <= (off.benchmark_s or 0)


@pytest.mark.integration
def test_a_launched_servers_steps_stop_sending_once_decided_and_let_those_in_flight_finish(
    tmp_path: Path,
) -> None:
    executor = TrialExecutor("local", LocalCommandRunner(), tmp_path, port_wait_s=1.0)
    # 20 requests a step, 2 may miss; a TTFT nobody meets: every step is decided at its 3rd answer.
    base = Workload(num_prompts=20, input_len=200, output_len=16, concurrency=8, slo=Slo(ttft_ms=0.001))
    searched = LoadSearchPlan("request_rate", start=4.0, max=4.0, steps=3, min=1.0)
    trial = node_request("--skip-server-warmup")
    trial = replace(trial, workload=base, plan=replace(MeasurementPlan.single(base), load_search=searched))
    result = executor.run(trial)
    assert result.failure is None and result.benchmark is not None
    steps = result.benchmark.levels
    assert [s.workload.request_rate for s in steps] == [4.0, 2.0, 1.0]  # each step still ran, on one launch
    for one in steps:
        assert one.decided_after is not None and 3 <= one.decided_after < 20, one.decided_after
        assert one.completed == one.decided_after and one.failed == 0  # those in flight finished
        assert one.slo_attainment == 0.0
    assert result.benchmark.max_load == 0.0
    sent = measurement_metrics(result.benchmark)  # MLflow's step figures
    assert [sent[f"step{i}.prompts_sent"] for i in range(3)] == [s.decided_after for s in steps]
    # Each broke the TTFT limit nobody meets: the step's count of it, in MLflow too.
    assert [s.slo_over for s in steps] == [{"ttft_ms": s.completed} for s in steps]
    assert [sent[f"step{i}.over.ttft_ms"] for i in range(3)] == [s.completed for s in steps]


def test_a_client_run_on_the_node_gets_the_limit_on_its_command_line() -> None:
    limit = MissLimit(missed=8)
    argv = remote.command("python3", "http://127.0.0.1:30000", SLO_WORKLOAD, 60, 0, limit)
    assert MissLimit(**json.loads(argv[argv.index("--miss-limit") + 1])) == limit
    assert "--miss-limit" not in remote.command("python3", "http://127.0.0.1:30000", SLO_WORKLOAD, 60, 0)


def test_status_says_which_steps_of_a_trials_load_search_were_decided_early(study_file: StudyFiles) -> None:
    objective = max_load_objective(stop_below_best=True)
    study = load_study(study_file(n_trials=2, search_space=SPACE, objective=objective))
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    one_at_a_time = optuna_study.trials[1]  # misses at 0.5 req/s, at or below the baseline's max_load
    note = "1 of 1 load steps decided early: "
    assert any(n.startswith(note) for n in _status_notes(_trial_record(one_at_a_time)))
    off = {**objective, "load_search": {**objective["load_search"], "stop_when_decided": False}}
    study = load_study(study_file(n_trials=2, search_space=SPACE, objective=off, file="off/study.yaml"))
    optuna_study = StudyDriver(study, pool=model_pool()).run()
    assert TrialRecord.of(optuna_study.trials[1]).load_decided is None
