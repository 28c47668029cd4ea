"""Workloads that share prefixes: the requests really share leading token ids, each kind's rules reject bad
input naming the file, the field, the value and the fix, and a measurement records the server's cache hits."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest

from autotune.config.objective import load_objective
from autotune.errors import ConfigError
from autotune.measure.client import RequestOutcome, designed_hit_rate, summarize
from autotune.measure.sharing import load_trace
from autotune.measure.workloads import Workload, requests_for
from autotune.study.records import prefix_cache_text
from tests.builders import REPO

GSP = {"num_groups": 3, "prompts_per_group": 4, "system_prompt_len": 64, "question_len": 16, "output_len": 8}
SESSIONS = {"num_sessions": 2, "turns": 3, "first_prompt_len": 100, "user_len": 10, "output_len": 20}
TRACE = REPO / "traces" / "agentic-sessions.jsonl"


def test_shared_prefix_groups_share_their_system_prompt_and_nothing_else() -> None:
    workload = Workload(shared_prefix=GSP, concurrency=4)  # type: ignore[arg-type]
    assert (workload.num_prompts, workload.input_len, workload.output_len) == (12, 80, 8)
    requests = requests_for(workload, "bench", 0, workload.num_prompts)
    by_group: dict[int | None, list[list[int]]] = {}
    for request in requests:
        assert request.input_ids is not None and len(request.input_ids) == 80
        by_group.setdefault(request.session, []).append(request.input_ids)
    assert len(by_group) == 3 and all(len(members) == 4 for members in by_group.values())
    systems = {tuple(ids[:64]) for members in by_group.values() for ids in members}
    assert len(systems) == 3  # one system prompt a group, the same leading ids for each of its prompts
    assert [r.session for r in requests] != sorted(r.session or 0 for r in requests)  # shuffled, as gsp is
    # Each group's first prompt sent shares nothing; the other three share the system prompt.
    assert designed_hit_rate(requests) == pytest.approx(3 * 3 * 64 / (12 * 80))


def test_a_sessions_turn_resends_the_previous_prompt_answer_and_a_new_message() -> None:
    workload = Workload(sessions=SESSIONS)  # type: ignore[arg-type]
    assert workload.concurrency == 2 and workload.num_prompts == 6
    requests = requests_for(workload, "bench", 0, workload.num_prompts)
    for session in (0, 1):
        turns = [r for r in requests if r.session == session]
        assert [r.turn for r in turns] == [0, 1, 2]
        for previous, turn in itertools.pairwise(turns):
            assert turn.input_ids is not None and previous.input_ids is not None
            assert turn.input_ids[: len(previous.input_ids)] == previous.input_ids
            assert len(turn.input_ids) == len(previous.input_ids) + 20 + 10
            assert turn.shared_tokens == len(previous.input_ids)
    assert requests[0].input_ids != requests[3].input_ids  # sessions share nothing with each other


def test_a_trace_replays_its_blocks_and_times(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 1000, "input_length": 40, "output_length": 5, "hash_ids": [7, 8, 9], '
        '"session_id": "a"}\n'
        '{"timestamp": 3000, "input_length": 50, "output_length": 6, "hash_ids": [7, 8, 4, 5], '
        '"session_id": "a"}\n'
        '{"timestamp": 2000, "input_length": 20, "output_length": 7, "hash_ids": [1]}\n'
    )
    workload = Workload(trace={"path": str(trace), "block_size": 16, "speedup": 2.0}, concurrency=4)  # type: ignore[arg-type]
    assert (workload.num_prompts, workload.input_len, workload.output_len) == (3, 50, 6)
    first, other, later = requests_for(workload, "bench", 0, 3)
    assert [r.arrival_s for r in (first, other, later)] == [0.0, 0.5, 1.0]  # ms from the first, halved
    assert first.input_ids is not None and later.input_ids is not None and other.input_ids is not None
    assert later.input_ids[:32] == first.input_ids[:32]  # blocks 7 and 8
    assert later.input_ids[32:48] != first.input_ids[32:48]
    assert len(other.input_ids) == 20 and other.input_ids[:16] != first.input_ids[:16]
    assert (later.shared_tokens, later.turn, first.turn) == (32, 1, 0)


def test_the_shipped_trace_is_what_its_script_makes() -> None:
    spec = importlib.util.spec_from_file_location(
        "make_agentic_trace", REPO / "traces" / "make_agentic_trace.py"
    )
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert "".join(json.dumps(row) + "\n" for row in script.make()) == TRACE.read_text()
    rows = load_trace(str(TRACE))
    assert len({r.session_id for r in rows}) == 12 and all(r.hash_ids[:4] == (0, 1, 2, 3) for r in rows)


def test_summarize_records_the_servers_cache_hits_and_turns_ttft() -> None:
    workload = Workload(sessions=SESSIONS)  # type: ignore[arg-type]
    outcomes = [
        RequestOutcome(True, 100, 20, 0.4, [0.01], 0.6, turn=0, cached_tokens=0),
        RequestOutcome(True, 130, 20, 0.1, [0.01], 0.3, turn=1, cached_tokens=96),
        RequestOutcome(True, 160, 20, 0.2, [0.01], 0.4, turn=2, cached_tokens=128),
    ]
    result = summarize(outcomes, 2.0, workload, designed_hit_rate=0.5)
    assert result.cache_hit_rate == pytest.approx((96 + 128) / (100 + 130 + 160))
    assert result.designed_hit_rate == 0.5
    assert result.mean_ttft_first_turn_ms == pytest.approx(400)
    assert result.mean_ttft_later_turns_ms == pytest.approx(150)
    # Independent prompts have neither figure, whatever the server says.
    plain = summarize(outcomes, 2.0, Workload(num_prompts=3, input_len=100, output_len=20, concurrency=1))
    assert plain.cache_hit_rate is None and plain.mean_ttft_later_turns_ms is None
    text = prefix_cache_text(
        {"hit_rate": 0.574, "designed": 0.66, "ttft_first_turn_ms": 400.0, "ttft_later_turns_ms": 150.0}
    )
    assert text == (
        "prefix cache: 57% of prompt tokens served from the server's cache (the workload shares 66%); "
        "TTFT first turns 400 ms, later turns 150 ms"
    )


def _objective(tmp_path: Path, workload: str) -> Path:
    path = tmp_path / "objective.yaml"
    path.write_text(f"name: t\nmetric: output_throughput\nworkload:\n{workload}")
    return path


BAD = [
    pytest.param(
        "  concurrency: 4\n  shared_prefix: {num_groups: 0, prompts_per_group: 2, system_prompt_len: 9, "
        "question_len: 1, output_len: 1}\n",
        "workload.shared_prefix.num_groups",
        "must be > 0 (got 0)",
        id="zero-groups",
    ),
    pytest.param(
        "  sessions: {num_sessions: 2, turns: 2, first_prompt_len: 9, user_len: 1, output_len: 1}\n"
        "  trace: {path: t.jsonl}\n",
        "workload.trace",
        "a workload sends one kind of shared prefixes",
        id="two-kinds",
    ),
    pytest.param(
        "  sessions: {num_sessions: 2, turns: 2, first_prompt_len: 9, user_len: 1, output_len: 1}\n"
        "  request_rate: 2\n",
        "workload.request_rate",
        "sessions pace themselves by think_time_s (got 2). Remove workload.request_rate.",
        id="sessions-with-rate",
    ),
    pytest.param(
        "  concurrency: 4\n  input_len: 100\n  shared_prefix: {num_groups: 1, prompts_per_group: 2, "
        "system_prompt_len: 9, question_len: 1, output_len: 1}\n",
        "workload.input_len",
        "shared_prefix sets input_len (10) (got 100). Leave workload.input_len out",
        id="conflicting-length",
    ),
    pytest.param(
        "  concurrency: 4\n  trace: {path: missing.jsonl}\n",
        "workload.trace.path",
        "cannot read the trace",
        id="missing-trace",
    ),
    pytest.param(
        "  concurrency: 4\n  trace: {path: bad.jsonl}\n",
        "workload.trace.path",
        "line 2: output_length: not a positive int (got 0)",
        id="bad-trace-row",
    ),
]


@pytest.mark.parametrize(("workload", "field", "message"), BAD)
def test_bad_sharing_workloads_name_the_field_the_value_and_the_fix(
    tmp_path: Path, workload: str, field: str, message: str
) -> None:
    (tmp_path / "bad.jsonl").write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": []}\n'
        '{"timestamp": 5, "input_length": 10, "output_length": 0, "hash_ids": []}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_objective(_objective(tmp_path, workload))
    text = str(caught.value)
    assert text.startswith(f"{tmp_path / 'objective.yaml'}: {field}: "), text
    assert message in text


def test_a_relative_trace_is_read_beside_the_objective(tmp_path: Path) -> None:
    (tmp_path / "t.jsonl").write_text(TRACE.read_text())
    objective = load_objective(_objective(tmp_path, "  concurrency: 8\n  trace: {path: t.jsonl}\n"))
    assert objective.workload is not None and objective.workload.trace is not None
    assert objective.workload.trace.path == str(tmp_path / "t.jsonl")
    assert objective.workload.num_prompts == len(TRACE.read_text().splitlines())


def test_turn_metrics_need_sessions(tmp_path: Path) -> None:
    path = tmp_path / "objective.yaml"
    path.write_text(
        "name: t\nmetric: output_throughput\nlimits: {mean_ttft_later_turns_ms: 500}\n"
        "workload: {num_prompts: 4, input_len: 10, output_len: 4, concurrency: 2}\n"
    )
    with pytest.raises(ConfigError, match="splits sessions' turns, and this workload has no sessions"):
        load_objective(path)


def test_the_hit_rate_reaches_status_mlflow_and_the_report() -> None:
    from optuna.distributions import CategoricalDistribution
    from optuna.trial import TrialState, create_trial

    from autotune.cli.answers import _status_notes, _trial_record
    from autotune.tracking.tracker import measurement_metrics
    from autotune.views.report import StudyFindings, _best_html, _trials_html

    outcomes = [
        RequestOutcome(True, 100, 20, 0.4, [0.01], 0.6, turn=0, cached_tokens=0),
        RequestOutcome(True, 130, 20, 0.1, [0.01], 0.3, turn=1, cached_tokens=96),
    ]
    measured = summarize(outcomes, 2.0, Workload(sessions=SESSIONS), designed_hit_rate=0.5)  # type: ignore[arg-type]
    logged = measurement_metrics(measured)
    assert logged["cache_hit_rate"] == pytest.approx(96 / 230) and logged["designed_hit_rate"] == 0.5
    assert logged["mean_ttft_later_turns_ms"] == pytest.approx(100)

    record = {"hit_rate": 0.42, "designed": 0.5, "ttft_first_turn_ms": 400.0, "ttft_later_turns_ms": 100.0}
    trial = create_trial(
        state=TrialState.COMPLETE,
        value=80.0,
        params={"--schedule-policy": "lpm"},
        distributions={"--schedule-policy": CategoricalDistribution([None, "lpm"])},
        user_attrs={"prefix_cache": record},
    )
    assert prefix_cache_text(record) in _status_notes(_trial_record(trial))
    findings = StudyFindings(
        "s", "output_throughput", "tok/s", "maximize", {}, None, None, None, (), None, (trial,)
    )
    page = _trials_html(findings)
    assert "<th>prefix cache hit (of designed)</th>" in page and "42% of 50%" in page
    assert "prefix cache" not in _best_html(findings)  # no best config yet: nothing to say


def test_a_ladder_or_load_search_does_not_vary_a_sharing_workload(tmp_path: Path) -> None:
    path = tmp_path / "objective.yaml"
    path.write_text(
        "name: t\nmetric: output_throughput\nladder: {concurrency: [1, 2]}\nworkload:\n"
        "  sessions: {num_sessions: 2, turns: 2, first_prompt_len: 9, user_len: 1, output_len: 1}\n"
    )
    with pytest.raises(ConfigError, match=r"ladder: workload\.sessions sets its own requests and pace"):
        load_objective(path)


def test_bench_serving_does_not_send_a_sharing_workload(tmp_path: Path) -> None:
    path = tmp_path / "objective.yaml"
    path.write_text(
        "name: t\nmetric: output_throughput\nclient: bench_serving\nworkload:\n"
        "  sessions: {num_sessions: 2, turns: 2, first_prompt_len: 9, user_len: 1, output_len: 1}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_objective(path)
    assert caught.value.field == "workload.sessions" and "Use `client: builtin`" in str(caught.value)
