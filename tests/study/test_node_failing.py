"""A node where nothing starts: the verdict on a real Optuna study's trials, and the whole run through the
CLI on the simulated node with its faults (hang_load: start-up never ends; crash_benchmark: the server
dies while measured)."""

from __future__ import annotations

import functools
import re
import sqlite3
import subprocess
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml
from optuna.trial import TrialState

from autotune.study.node_failing import FAILED_LAUNCHES_TO_STOP, node_failing
from autotune.study.records import BASELINE_ATTR, FAILURE_KIND_ATTR, NODE_ATTR
from tests.builders import StudyFiles, e2e_study
from tests.conftest import run_cli as cli
from tests.processes import ended_side_by_side, left_behind, own_node_locks, study_servers


def launches(*outcomes: tuple[str, str | None], running: tuple[str, ...] = ()) -> optuna.Study:
    """A study whose launches ended as `outcomes` (node, failure kind or None for COMPLETE), the first the
    baseline, then `running` trials still running on those nodes."""
    optuna_study = optuna.create_study(direction="maximize")
    for index, (node, kind) in enumerate(outcomes):
        trial = optuna_study.ask()
        trial.set_user_attr(NODE_ATTR, node)
        if index == 0:
            trial.set_user_attr(BASELINE_ATTR, True)
        if kind is None:
            optuna_study.tell(trial, 100.0)
        else:
            trial.set_user_attr(FAILURE_KIND_ATTR, kind)
            optuna_study.tell(trial, state=TrialState.FAIL)
    for node in running:
        optuna_study.ask().set_user_attr(NODE_ATTR, node)
    return optuna_study


def test_the_baseline_and_two_launches_failing_at_start_up_stop_the_study() -> None:
    verdict = node_failing(launches(("n0", "startup_timeout"), ("n0", "startup_timeout")))
    assert verdict is None, "two chances are not enough to call a node dead"
    verdict = node_failing(
        launches(("n0", "startup_timeout"), ("n0", "server_died"), ("n0", "startup_timeout"))
    )
    assert verdict is not None and verdict.launches == FAILED_LAUNCHES_TO_STOP
    assert verdict.text.startswith(
        "stopped: no server could run on node n0: the baseline (SGLang's defaults) and 2 more launches "
        "failed before measuring anything (startup_timeout x2, server_died x1) and none served; the server "
    )
    assert verdict.text.endswith("then resume the study (its baseline runs first)")


@pytest.mark.parametrize(
    "outcomes",
    [
        # the baseline served: later failures are the settings' or a node's hiccup, never a dead node
        (("n0", None), ("n0", "startup_timeout"), ("n0", "startup_timeout"), ("n0", "startup_timeout")),
        # a launch served before it failed
        (
            ("n0", "startup_timeout"),
            ("n0", "oom_under_load"),
            ("n0", "startup_timeout"),
            ("n0", "server_died"),
        ),
        # the baseline failed for its settings, not the node's
        (
            ("n0", "kv_pool_too_small"),
            ("n0", "startup_timeout"),
            ("n0", "startup_timeout"),
            ("n0", "node_lost"),
        ),
    ],
    ids=["baseline-served", "one-served", "baseline-out-of-memory"],
)
def test_a_node_that_served_or_failed_for_settings_is_not_called_dead(outcomes: Any) -> None:
    assert node_failing(launches(*outcomes)) is None


def test_a_launch_refused_for_its_settings_says_nothing_about_the_node() -> None:
    # The simulated node's unsupported flags fail before weight loading: they neither prove nor disprove it
    optuna_study = launches(
        ("n0", "startup_timeout"), ("n0", "unsupported"), ("n0", "startup_timeout"), ("n0", "startup_timeout")
    )
    verdict = node_failing(optuna_study)
    assert verdict is not None and verdict.kinds[0][1] == 3


def test_another_node_still_running_its_first_trial_may_serve() -> None:
    failed = (("n0", "startup_timeout"), ("n0", "startup_timeout"), ("n0", "node_lost"))
    assert node_failing(launches(*failed, running=("n1",))) is None
    verdict = node_failing(launches(*failed, running=("n0",)))
    assert verdict is not None and verdict.nodes == ("n0",)


def test_a_resume_launches_once_more_before_it_stops() -> None:
    optuna_study = launches(("n0", "startup_timeout"), ("n0", "startup_timeout"), ("n0", "startup_timeout"))
    assert node_failing(optuna_study, since=3) is None, "the node may have been fixed: one launch to see"
    assert node_failing(optuna_study, since=2) is not None


def _trials(db: Path) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name="e2e", storage=f"sqlite:///{db}").get_trials()


FAULTS = [("hang_load", "startup_timeout"), ("crash_benchmark", "server_died")]


@pytest.fixture(scope="module")
def broken_nodes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Future[None]]:
    """The runs of the test below, one per fault, side by side (each mostly waits on its servers and
    timeouts, on a node lock of its own); each parameter meets its own run's failure."""
    return ended_side_by_side(
        {
            fault: functools.partial(_nothing_starts, tmp_path_factory.mktemp(fault), fault, kind)
            for fault, kind in FAULTS
        }
    )


@pytest.mark.integration
@pytest.mark.parametrize(("fault", "kind"), FAULTS)
def test_a_node_where_nothing_starts_stops_after_three_launches_and_exits_3(
    broken_nodes: dict[str, Future[None]], fault: str, kind: str
) -> None:
    """It ran the whole budget, exited 0 and suggested `best --export`, which then failed."""
    broken_nodes[fault].result()


def _nothing_starts(tmp_path: Path, fault: str, kind: str) -> None:
    # hang_load: each launch waits out startup_s; crash_benchmark: a start-up gets the time it needs
    startup_s = 3 if fault == "hang_load" else 60
    data = e2e_study(n_trials=12, trust=False, timeouts={"startup_s": startup_s, "benchmark_s": 20})
    data["server"]["env"]["SGLANG_SIM_FAULT"] = fault
    path = StudyFiles(tmp_path)(data)
    locks = own_node_locks()

    def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
        return cli(*args, cwd=tmp_path, env=locks, timeout_s=300)

    done = run_cli("run", str(path), "--no-ray")

    assert done.returncode == 3, done.stderr
    assert "Traceback" not in done.stderr
    # Under load a crash can come before the benchmark (another node-level kind): the kinds are counted.
    stop = re.search(
        r"stopped: no server could run on node local: the baseline \(SGLang's defaults\) and \d+ more "
        r"launches failed before measuring anything \(([^)]*)\) and none served",
        done.stderr,
    )
    assert stop is not None and f"{kind} x" in stop.group(1), done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"autotune: no answer: the baseline (SGLang's defaults, trial 0) failed ({kind}), so no gain can be "
        f"measured; see why with `autotune status {path}`, fix the node or the study's server section, then "
        f"`autotune resume {path}` runs it first"
    )
    assert "--export" not in done.stdout
    db = tmp_path / ".autotune" / "e2e" / "optuna.db"
    trials = _trials(db)
    assert [t.state for t in trials] == [TrialState.FAIL] * len(trials), "none left RUNNING"
    assert [t.user_attrs["failure_kind"] for t in trials].count(kind) == 3
    pgids, ports = study_servers(db.parent, "e2e")  # `port: auto`: the ports the node picked, as recorded
    assert len(pgids) >= 3 and len(ports) >= 3, (pgids, ports)
    assert left_behind(pgids, ports) == [], "no server left behind"
    with sqlite3.connect(tmp_path / ".autotune" / "e2e" / "mlflow.db") as con:
        assert con.execute("SELECT status FROM runs WHERE status = 'RUNNING'").fetchall() == []

    if fault != "hang_load":
        return
    # Resumed on a node still broken: one launch (the baseline again), then the same stop.
    done = run_cli("resume", str(path), "--no-ray")
    assert done.returncode == 3, done.stderr
    assert f"and 3 more launches failed before measuring anything ({kind} x4)" in done.stderr
    again = _trials(db)[len(trials) :]
    assert [(t.user_attrs.get("baseline"), t.state) for t in again] == [(True, TrialState.FAIL)]
    # The node fixed: the baseline runs first and the study goes on to an answer.
    del data["server"]["env"]["SGLANG_SIM_FAULT"]
    fixed_file = {"server": data["server"], "timeouts": {"startup_s": 60, "benchmark_s": 20}}
    path.write_text(yaml.safe_dump(yaml.safe_load(path.read_text()) | fixed_file))
    budget = str(len(_trials(db)) + 2)  # the baseline and one more
    done = run_cli("resume", str(path), "--no-ray", "--n-trials", budget)
    assert done.returncode == 0, done.stderr
    fixed = _trials(db)[len(trials) + 1 :]
    assert fixed[0].user_attrs.get("baseline") and fixed[0].state is TrialState.COMPLETE, "the baseline first"
    assert "--export best.sh" in done.stdout
