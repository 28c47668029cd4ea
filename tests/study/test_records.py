"""What autotune stores on Optuna trials and studies, written by study.records' writers and read back typed,
through a real SQLite storage; and a study written with the stored key strings (an earlier autotune's) read.
"""

from __future__ import annotations

import ast
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.study import optuna_internals
from autotune.study.records import (
    CompareMark,
    ConfirmMark,
    StudyRecord,
    TrialRecord,
    marks,
    record_compares,
    record_confirm,
    record_driver,
    record_failure,
    record_incompatible,
    record_launch,
    record_measurement,
    record_metrics,
    record_mlflow_run,
    record_nccl_stage,
    record_node,
    record_node_budget,
    record_node_s,
    record_proposed,
    record_pruned_by,
    record_remeasure,
    record_same_as,
    record_screened,
    record_server,
    record_server_choices,
    record_short,
    record_short_cutoff,
    record_skipped,
    record_stopped,
    record_study_config,
    retry_marks,
)
from autotune.study.rules import counts
from autotune.study.storage import enqueue_retry
from autotune.trial.failures import FailureKind
from tests.builders import stored_trial, study_of_trials

ROOT = Path(__file__).resolve().parents[2]


def _sqlite_study(tmp_path: Path) -> optuna.Study:
    return optuna.create_study(storage=f"sqlite:///{tmp_path / 'study.db'}", study_name="records")


def _reloaded(optuna_study: optuna.Study, tmp_path: Path) -> optuna.Study:
    """The study as another process opens it: nothing cached in this one."""
    return optuna.load_study(study_name=optuna_study.study_name, storage=f"sqlite:///{tmp_path / 'study.db'}")


def test_a_launched_measured_trial_reads_back_as_written(tmp_path: Path) -> None:
    optuna_study = _sqlite_study(tmp_path)
    trial = optuna_study.ask()
    record_driver(trial, "host:42")
    record_node(trial, "node-a", {"--speculative-num-draft-tokens": 4})
    record_launch(trial, {"flags": {"--tp-size": "8"}, "rest": "ab12"})
    record_short_cutoff(trial, 50.0)
    record_server(
        trial,
        pgid=4242,
        memory={"kv_gb": 30.5},
        startup_phases={"weights_s": 600.0, "ready_s": 660.0},
        startup_notes=("loader threads 8",),
        server_choices={"--cuda-graph-max-bs": 512},
    )
    record_measurement(
        trial,
        over_limits={"ttft_p99_ms": {"limit": 100.0, "measured": 120.0, "text": "TTFT over"}},
        accept_length=2.5,
        load_stopped_by="ttft_p99_ms",
        load_warning=None,
        prefix_cache={"hit_rate": 0.5, "designed": 0.6},
    )
    record_short(trial, 88.0)
    record_metrics(trial, {"output_throughput": 89.5})
    record_mlflow_run(trial, "run-1")
    record_node_s(trial, 700.0)
    optuna_study.tell(trial, 89.5)

    record = TrialRecord.of(_reloaded(optuna_study, tmp_path).trials[0])
    assert (record.driver, record.node, record.hardware) == ("host:42", "node-a", None)
    assert record.launched and not record.baseline and not record.skipped and not record.deliberate
    assert record.derived == {"--speculative-num-draft-tokens": 4}
    assert record.launch == {"flags": {"--tp-size": "8"}, "rest": "ab12"}
    assert (record.short_cutoff, record.short_value, record.node_s) == (50.0, 88.0, 700.0)
    assert (record.server_pgid, record.server_memory) == (4242, {"kv_gb": 30.5})
    assert record.startup_phases == {"weights_s": 600.0, "ready_s": 660.0}
    assert record.startup_notes == ["loader threads 8"]
    assert record.server_choices == {"--cuda-graph-max-bs": 512}
    assert record.over_limits["ttft_p99_ms"]["measured"] == 120.0
    assert (record.accept_length, record.load_stopped_by, record.load_warning) == (2.5, "ttft_p99_ms", None)
    assert record.prefix_cache == {"hit_rate": 0.5, "designed": 0.6}
    assert record.metrics == {"output_throughput": 89.5}
    assert record.mlflow_run_id == "run-1"
    assert record.failure_kind is None and record.failure is None and record.culprits == []


def test_a_failure_a_skip_and_the_same_launch_read_back(tmp_path: Path) -> None:
    optuna_study = _sqlite_study(tmp_path)
    failed = optuna_study.ask()
    record_failure(
        failed,
        FailureKind.KV_POOL_TOO_SMALL,
        "RuntimeError: Not enough memory",
        description="the KV pool did not fit",
        advice="raise --mem-fraction-static",
        culprits=("--mem-fraction-static",),
    )
    record_pruned_by(failed, "out of memory")
    optuna_study.tell(failed, state=TrialState.PRUNED)
    skipped = optuna_study.ask()
    record_skipped(skipped)
    record_failure(skipped, FailureKind.KNOWN_INCOMPATIBLE, "known incompatible: --x=1")
    optuna_study.tell(skipped, state=TrialState.FAIL)
    same = optuna_study.ask()
    record_same_as(same, optuna_study.trials[0])
    optuna_study.tell(same, state=TrialState.PRUNED)

    first, second, third = (TrialRecord.of(t) for t in _reloaded(optuna_study, tmp_path).trials)
    assert first.failure_kind is FailureKind.KV_POOL_TOO_SMALL
    assert first.failure_kind_text == "kv_pool_too_small"
    assert (first.failure, first.failure_description) == (
        "RuntimeError: Not enough memory",
        "the KV pool did not fit",
    )
    assert (first.advice, first.culprits, first.pruned_by) == (
        "raise --mem-fraction-static",
        ["--mem-fraction-static"],
        "out of memory",
    )
    assert second.skipped and second.failure_kind is FailureKind.KNOWN_INCOMPATIBLE and not second.launched
    # The same launch carries the earlier one's failure, and says which it was.
    assert (third.same_as, third.skipped, third.failure_kind) == (0, True, FailureKind.KV_POOL_TOO_SMALL)
    assert third.failure == "RuntimeError: Not enough memory" and third.advice is None


def test_queued_trials_carry_their_marks_and_a_retry_keeps_what_it_measures(tmp_path: Path) -> None:
    optuna_study = _sqlite_study(tmp_path)
    optuna_study.enqueue_trial({}, user_attrs=marks(baseline=True))
    optuna_study.enqueue_trial(
        {}, user_attrs=marks(remeasure_of=0, baseline=True, confirm=ConfirmMark(round=2, position=1))
    )
    mark = CompareMark(id=0, round=1, position=0, config="best")
    optuna_study.enqueue_trial({}, user_attrs=marks(compare=mark))
    optuna_study.enqueue_trial({}, user_attrs=marks(queued={"set": {"--x": 1}, "from_trial": None}))
    optuna_study.enqueue_trial({}, user_attrs=marks(ablation_of=3, ablation_param="--x"))
    optuna_study.enqueue_trial({}, user_attrs=marks(screen={"--x": 2}))
    asked = [optuna_study.ask() for _ in range(6)]
    base, confirm, compare, queued, ablation, screen = (TrialRecord.of(t) for t in asked)
    assert base.baseline and base.deliberate and base.remeasure_of is None and base.confirm is None
    assert (confirm.remeasure_of, confirm.baseline, confirm.confirm) == (0, True, {"round": 2, "position": 1})
    assert (
        compare.compare == {"id": 0, "round": 1, "position": 0, "config": "best"} and not compare.deliberate
    )
    assert queued.queued == {"set": {"--x": 1}, "from_trial": None} and queued.deliberate
    assert (ablation.ablation_of, ablation.ablation_param, ablation.deliberate) == (3, "--x", True)
    assert screen.screen == {"--x": 2} and not screen.deliberate

    # A retry of the confirmation round is still that config's measurement, in that round.
    assert retry_marks(confirm, 1) == {
        "retry_of": 1,
        "baseline": True,
        "remeasure_of": 0,
        "confirm": {"round": 2, "position": 1},
    }
    assert enqueue_retry(optuna_study, asked[1].number, {}, confirm)
    retry = TrialRecord.of(optuna_study.ask())
    assert not enqueue_retry(optuna_study, 9, {}, retry)  # a retry is not retried once more (a node lost)
    assert enqueue_retry(optuna_study, 9, {}, retry, once=False)  # but always after a Ctrl-C
    assert (retry.retry_of, retry.remeasure_of, retry.confirm, retry.baseline) == (
        1,
        0,
        confirm.confirm,
        True,
    )


def test_a_trial_this_process_holds_no_trial_of_is_written_through_the_storage(tmp_path: Path) -> None:
    optuna_study = _sqlite_study(tmp_path)
    optuna_study.ask()  # left RUNNING, as a dead driver leaves it
    frozen = _reloaded(optuna_study, tmp_path).trials[0]
    stored = optuna_internals.StoredTrial(optuna_study, frozen)
    record_failure(stored, FailureKind.INTERRUPTED)
    record_proposed(stored, "a move from trial 0")
    record = TrialRecord.of(_reloaded(optuna_study, tmp_path).trials[0])
    assert (record.failure_kind, record.proposed) == (FailureKind.INTERRUPTED, "a move from trial 0")


def test_the_study_record_reads_back_as_written(tmp_path: Path) -> None:
    optuna_study = _sqlite_study(tmp_path)
    assert StudyRecord.of(optuna_study) == StudyRecord({})
    empty = StudyRecord.of(optuna_study)
    assert (empty.stopped, empty.confirm, empty.nccl_stage, empty.confirming) == (None, None, None, False)
    assert (empty.compares, empty.incompatible, empty.budget, empty.screened) == ([], [], {}, {})
    record_study_config(optuna_study, {"search_space": "parameters: {}"})
    record_server_choices(optuna_study, {"--cuda-graph-max-bs": 512})
    record_remeasure(optuna_study, {"top": 3, "confidence": 0.9})
    record_confirm(optuna_study, {"baseline": 0, "configs": [4], "queued": 1, "since": 7})
    record_compares(optuna_study, [{"id": 0, "trial": 4, "rounds": 3}])
    record_screened(optuna_study, {"--x": {"value": None, "why": "no effect"}})
    record_nccl_stage(optuna_study, {"held": {"NCCL_ALGO": "Ring"}, "node_s": 30.0})
    record_stopped(optuna_study, "stopped early: no gain", 12)
    record_incompatible(optuna_study, [("--x", 1, "h200")])
    record_node_budget(optuna_study, {"hours": 2.0})

    record = StudyRecord.of(_reloaded(optuna_study, tmp_path))
    assert record.config == {"search_space": "parameters: {}"}
    assert record.server_choices == {"--cuda-graph-max-bs": 512}
    assert record.remeasure == {"top": 3, "confidence": 0.9}
    assert record.confirming and record.confirm == {"baseline": 0, "configs": [4], "queued": 1, "since": 7}
    assert record.compares == [{"id": 0, "trial": 4, "rounds": 3}]
    assert record.screened == {"--x": {"value": None, "why": "no effect"}}
    assert record.nccl_stage == {"held": {"NCCL_ALGO": "Ring"}, "node_s": 30.0}
    assert record.stopped == {"why": "stopped early: no gain", "after_trial": 12}
    assert record.incompatible == [("--x", 1, "h200")]
    assert record.budget == {"hours": 2.0}


def test_a_study_stored_with_the_literal_key_strings_reads(tmp_path: Path) -> None:
    """The stored strings are the format on disk: a study an earlier autotune wrote (these literals, not the
    module's names) still reads, its pairs learned before hardware was recorded included."""
    trials = [
        stored_trial(
            {},
            90.0,
            baseline=True,
            node="node-a",
            node_s=650.5,
            metrics={"output_throughput": 90.0},
            startup_phases={"ready_s": 660.0},
            mlflow_run_id="run-0",
        ),
        stored_trial(
            {},
            None,
            failure_kind="kv_pool_too_small",
            failure="Not enough memory",
            advice="raise it",
            culprits=["--mem-fraction-static"],
            hardware="h200",
            node="node-a",
        ),
        stored_trial(
            {}, 88.0, remeasure_of=0, baseline=True, confirm={"round": 0, "position": 1}, retry_of=1
        ),
        stored_trial({}, 87.0, compare={"id": 0, "round": 1, "position": 0, "config": "default"}, same_as=0),
        stored_trial(
            {}, None, skipped=True, failure_kind="predicted_oom", queued={"set": {}, "from_trial": 0}
        ),
        stored_trial(
            {}, None, failure_kind="a kind this autotune never had", ablation_of=0, ablation_param="--x"
        ),
        stored_trial({}, 86.0, remeasure_of=0, confirm={"round": 1}),  # before rounds recorded their order
    ]
    optuna_study = study_of_trials(
        *trials,
        storage=f"sqlite:///{tmp_path / 'old.db'}",
        config={"search_space": "x"},
        server_choices={"--chunked-prefill-size": 8192},
        confirm={"baseline": 0, "configs": [2], "queued": 2, "since": 1, "min_rounds": 2},
        compare=[{"id": 0, "trial": 2, "rounds": 2}],
        screened={"--x": {"value": False, "why": "held"}},
        nccl_stage={"held": {}, "node_s": 12.0},
        stopped={"why": "stopped early", "after_trial": 3},
        incompatible=[["--x", 1], ["--y", 2, "h200"]],
        node_budget={"hours": 1.5, "spent_h": 1.0},
        remeasure={"confidence": 0.9},
    )
    base, oom, confirm, compare, skipped, unknown, unordered = (
        TrialRecord.of(t) for t in optuna_study.trials
    )
    assert base.baseline and base.launched and base.node == "node-a" and base.node_s == 650.5
    assert base.metrics == {"output_throughput": 90.0} and base.startup_phases == {"ready_s": 660.0}
    assert base.mlflow_run_id == "run-0"
    assert oom.failure_kind is FailureKind.KV_POOL_TOO_SMALL and oom.failure == "Not enough memory"
    assert (oom.advice, oom.culprits, oom.hardware) == ("raise it", ["--mem-fraction-static"], "h200")
    assert (confirm.remeasure_of, confirm.confirm, confirm.retry_of) == (0, {"round": 0, "position": 1}, 1)
    assert (
        compare.compare == {"id": 0, "round": 1, "position": 0, "config": "default"} and compare.same_as == 0
    )
    assert (
        skipped.skipped and skipped.failure_kind is FailureKind.PREDICTED_OOM and skipped.queued is not None
    )
    assert not counts(optuna_study.trials[4]) and counts(optuna_study.trials[1])
    # A kind an earlier autotune wrote and this one does not know: shown as stored, never a crash.
    assert unknown.failure_kind is None and unknown.failure_kind_text == "a kind this autotune never had"
    assert (unknown.ablation_of, unknown.ablation_param) == (0, "--x") and counts(optuna_study.trials[5])
    assert confirm.deliberate and not compare.deliberate
    assert unordered.confirm == {"round": 1} and unordered.remeasure_of == 0

    study = StudyRecord.of(optuna_study)
    assert study.config == {"search_space": "x"} and study.server_choices == {"--chunked-prefill-size": 8192}
    assert study.confirm is not None and study.confirm["min_rounds"] == 2
    assert study.compares == [{"id": 0, "trial": 2, "rounds": 2}]
    assert study.screened == {"--x": {"value": False, "why": "held"}}
    assert study.nccl_stage == {"held": {}, "node_s": 12.0}
    assert study.stopped == {"why": "stopped early", "after_trial": 3}
    assert study.incompatible == [("--x", 1, None), ("--y", 2, "h200")]
    assert study.budget == {"hours": 1.5, "spent_h": 1.0} and study.remeasure == {"confidence": 0.9}


# Modules that may touch Optuna's attribute mappings: the records themselves, and the hooks that write them.
_OWNERS = {"autotune/study/records.py", "autotune/study/optuna_internals.py"}
_ATTRIBUTE_ACCESS = {"user_attrs", "system_attrs", "set_user_attr", "set_system_attr"}


def test_no_module_but_the_records_reads_or_writes_an_attribute_by_its_key() -> None:
    found = []
    for path in sorted((ROOT / "autotune").rglob("*.py")):
        name = path.relative_to(ROOT).as_posix()
        if name in _OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), name)):
            if isinstance(node, ast.Attribute) and node.attr in _ATTRIBUTE_ACCESS:
                found.append(f"{name}:{node.lineno}: .{node.attr}")
    assert not found, (
        "read a trial's or a study's attributes through autotune.study.records (TrialRecord.of, "
        "StudyRecord.of, the record_* writers, marks), not by key:\n" + "\n".join(found)
    )
