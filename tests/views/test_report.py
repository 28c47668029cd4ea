"""`autotune report` and `autotune ablate` on real studies, and the study summary MLflow shows.

The ablation study is made for the purpose on the simulated node: a small search space where NCCL's
LL protocol and P2P level raise output tok/s well above SGLang's defaults, a triton attention backend that
changes little, and `--mem-fraction-static 0.55` that runs out of memory. The configs are enqueued
(as a user seeding a study would), run by `autotune run`, then ablated by `autotune ablate`.
"""

from __future__ import annotations

import base64
import re
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.study.records import ABLATION_OF_ATTR, ABLATION_PARAM_ATTR, QUEUED_ATTR
from autotune.tracking.tracker import failure_note, metric_unit, run_name
from tests.builders import StudyFiles, e2e_study, random_sim_study
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

SPACE = {
    "parameters": {
        "NCCL_PROTO": {"kind": "nccl", "type": "categorical", "choices": [None, "LL"]},
        "NCCL_P2P_LEVEL": {"kind": "nccl", "type": "categorical", "choices": [None, "SYS"]},
        "--attention-backend": {"kind": "sglang", "type": "categorical", "choices": [None, "triton"]},
        "--mem-fraction-static": {"kind": "sglang", "type": "categorical", "choices": [None, 0.55]},
        "--cuda-graph-max-bs-decode": {"kind": "sglang", "type": "categorical", "choices": [None, 256]},
    }
}
BEST = {
    "NCCL_PROTO": "LL",
    "NCCL_P2P_LEVEL": "SYS",
    "--attention-backend": "triton",
    "--mem-fraction-static": None,
    "--cuda-graph-max-bs-decode": None,
}
OOM = {**BEST, "--mem-fraction-static": 0.55}


def ablation_study() -> dict[str, Any]:
    objective = {
        "name": "many-short",
        "metric": "output_throughput",
        "workload": {"num_prompts": 8, "input_len": 500, "output_len": 128, "concurrency": 8},
    }
    # Serving slow enough that the server's own time dominates HTTP overhead.
    return random_sim_study("ablated", SPACE, objective, 3, seed=1, time_scale=0.05)


@pytest.fixture(scope="module")
def ablated_study(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The study run (baseline, the good config, an OOM config), ablated, and reported on."""
    from autotune.config import load_study
    from autotune.study.storage import open_study

    folder = tmp_path_factory.mktemp("ablation")
    path = StudyFiles(folder)(ablation_study())
    study = load_study(path)
    study.ensure_workdir()
    optuna_study = open_study(study)  # trial 0: the baseline
    optuna_study.enqueue_trial(BEST)
    # Queued as `autotune enqueue` does: run as asked, though the baseline's memory report says it fails.
    optuna_study.enqueue_trial(OOM, user_attrs={QUEUED_ATTR: {"set": OOM, "from_trial": None}})
    # Without Ray (its pool has tests of its own): what is tested here is the ablation and the report.
    run = run_cli("run", str(path), "--no-ray", cwd=folder)
    assert run.returncode == 0, run.stderr[-3000:]
    ablate = run_cli("ablate", str(path), "--no-ray", cwd=folder)
    assert ablate.returncode == 0, ablate.stdout + ablate.stderr[-3000:]
    report = run_cli("report", str(path), "--out", str(folder / "report"), cwd=folder)
    assert report.returncode == 0, report.stderr[-3000:]
    return path, ablate.stdout


def _storage(path: Path, name: str) -> str:
    return f"sqlite:///{path.parent / '.autotune' / name / 'optuna.db'}"


def test_ablate_reverts_each_changed_setting_of_the_best_config_once(ablated_study) -> None:
    path, stdout = ablated_study
    trials = optuna.load_study(study_name="ablated", storage=_storage(path, "ablated")).get_trials()
    assert trials[1].params == BEST and trials[1].state == optuna.trial.TrialState.COMPLETE
    assert trials[2].state == optuna.trial.TrialState.PRUNED  # the OOM config
    assert trials[2].user_attrs["failure_kind"] == "kv_pool_too_small"
    assert trials[1].value > trials[0].value, "the enqueued config beats SGLang's defaults on the simulator"
    ablations = {t.user_attrs[ABLATION_PARAM_ATTR]: t for t in trials if ABLATION_OF_ATTR in t.user_attrs}
    assert set(ablations) == {"NCCL_PROTO", "NCCL_P2P_LEVEL", "--attention-backend"}
    for name, trial in ablations.items():
        assert trial.user_attrs[ABLATION_OF_ATTR] == 1
        assert trial.params == {**BEST, name: None}
        assert trial.state == optuna.trial.TrialState.COMPLETE
    assert "trial 1:" in stdout and "NCCL_PROTO" in stdout


def test_ablation_runs_are_marked_in_mlflow(ablated_study) -> None:
    from mlflow.tracking import MlflowClient

    path, _ = ablated_study
    client = MlflowClient(tracking_uri=f"sqlite:///{path.parent / '.autotune/ablated/mlflow.db'}")
    experiment = client.get_experiment_by_name("ablated")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`autotune.ablation_of` = '1'")
    assert {r.data.tags["autotune.ablation_param"] for r in runs} == {
        "NCCL_PROTO",
        "NCCL_P2P_LEVEL",
        "--attention-backend",
    }
    for run in runs:
        assert f"without {run.data.tags['autotune.ablation_param']}" in run.info.run_name


def test_report_is_one_self_contained_page_with_every_section(ablated_study) -> None:
    path, _ = ablated_study
    html = (path.parent / "report" / "report.html").read_text()
    for section in ("summary", "best-config", "plots", "failures", "ablation", "trials"):
        assert f'<section id="{section}">' in html, section
    assert not re.search(r"""(src|href)=["'](https?:|//|file:)""", html), "no outside references"
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) >= 4
    assert all(base64.b64decode(data).startswith(b"\x89PNG") for data in images)
    for plot in ("optimization_history", "param_importances", "objective_vs_params", "memory_region"):
        assert f'id="plot-{plot}"' in html
    assert "pareto_front" not in html, "one objective: no Pareto front"


def test_report_shows_the_best_config_its_launch_and_the_failures_advice(ablated_study) -> None:
    path, _ = ablated_study
    html = (path.parent / "report" / "report.html").read_text()
    from autotune.study.trust.answer import study_answer

    optuna_study = optuna.load_study(study_name="ablated", storage=_storage(path, "ablated"))
    answer = study_answer(optuna_study)  # trial 1, or one of its ablations when run-to-run noise favours it
    assert answer is not None
    winner = optuna_study.trials[answer.trial]
    best = html.split('<section id="best-config">')[1].split("</section>")[0]
    assert f"Trial {winner.number}:" in best and "#!/usr/bin/env bash" in best
    for name, value in winner.params.items():
        if value is not None:
            assert f"<td><code>{name}</code></td><td><code>{value}</code></td>" in best
    assert "export NCCL_P2P_LEVEL=SYS" in best or winner.params["NCCL_P2P_LEVEL"] is None
    failures = html.split('<section id="failures">')[1].split("</section>")[0]
    assert "kv_pool_too_small" in failures and "raise --mem-fraction-static" in failures


def test_report_splits_the_gain_by_setting(ablated_study) -> None:
    path, _ = ablated_study
    html = (path.parent / "report" / "report.html").read_text()
    ablation = html.split('<section id="ablation">')[1].split("</section>")[0]
    rows = re.findall(r"<tr><td><code>([^<]+)</code></td>", ablation)
    assert set(rows) == {"NCCL_PROTO", "NCCL_P2P_LEVEL", "--attention-backend"}
    assert "share of the gain" in ablation and "tok/s" in ablation


def test_report_before_any_ablation_says_how_to_run_one(finished_study, tmp_path: Path) -> None:
    path, proc = finished_study
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = run_cli("report", str(path), "--out", str(tmp_path / "out"), cwd=path.parent)
    assert report.returncode == 0, report.stderr
    html = (tmp_path / "out" / "report.html").read_text()
    assert "autotune ablate STUDY.yaml" in html
    assert "Trial " in html.split('<section id="best-config">')[1]


def test_parent_run_description_is_the_study_summary(finished_study) -> None:
    from mlflow.tracking import MlflowClient

    path, _ = finished_study
    client = MlflowClient(tracking_uri=f"sqlite:///{path.parent / '.autotune/e2e/mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.`autotune.role` = 'study'")[0]
    note = parent.data.tags["mlflow.note.content"]
    # It leads with the study's answer, the sentence `best` and the report print, confirmed in rounds.
    assert note.split("\n")[2] == f"**{parent.data.tags['autotune.answer']}**"
    assert parent.data.tags["autotune.verdict"] in ("confirmed", "no gain") and " CI " in note
    assert "baseline (SGLang defaults)" in note and "- use: " in note and "#!/usr/bin/env bash" in note
    script = Path(client.download_artifacts(parent.info.run_id, "best/launch.sh")).read_text()
    assert script in note


def test_report_and_ablate_need_a_study_that_ran(tmp_path: Path, study_file: StudyFiles) -> None:
    path = study_file(e2e_study())
    for command in (("report", str(path), "--out", str(tmp_path / "r")), ("ablate", str(path))):
        proc = run_cli(*command, cwd=tmp_path)
        assert proc.returncode == 1 and "autotune run" in proc.stderr, proc.stderr


def test_run_names_read_at_a_glance() -> None:
    assert run_name(5, "COMPLETE", 212.44, False) == "#005 · 212.4 tok/s · COMPLETE"
    assert run_name(0, "COMPLETE", 80.0, True) == "#000 baseline · 80.0 tok/s · COMPLETE"
    assert (
        run_name(3, "PRUNED", 0.0, False, detail="kv_pool_too_small") == "#003 · PRUNED · kv_pool_too_small"
    )
    assert run_name(7, "RUNNING", None, False, detail="benchmarking") == "#007 · RUNNING · benchmarking"
    assert (
        run_name(2, "COMPLETE", 41.5, False, unit=metric_unit("p99_ttft_ms")) == "#002 · 41.5 ms · COMPLETE"
    )
    note = failure_note("FAIL", "nccl_error", "Check NCCL_*.", "NCCL WARN bad")
    assert note.startswith("**FAIL: nccl_error**") and "```\nNCCL WARN bad\n```" in note


# -- what MLflow shows while a study runs ------------------------------------------------------------------
@pytest.fixture
def tracker(tmp_path: Path):
    from autotune.tracking.tracker import StudyTracker
    from autotune.views.tracked import ParentRunPage

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    return StudyTracker(uri, "live", tmp_path / "artifacts", page=ParentRunPage())


def test_a_running_trial_shows_its_phase_in_its_name_then_its_outcome(tracker) -> None:
    from autotune.trial.launch import ServerLaunch, TrialConfig

    launch = ServerLaunch(("python", "-m", "sglang.launch_server"), {"NCCL_PROTO": "LL"}, "127.0.0.1", 30000)
    config = TrialConfig(env={"NCCL_PROTO": "LL"}, params={"NCCL_PROTO": "LL"})
    run_id = tracker.start_trial(4, config, {"NCCL_PROTO": "nccl"}, launch, False, "node-a")
    assert tracker.client.get_run(run_id).info.run_name == "#004 · RUNNING · launching"
    tracker.set_phase(run_id, "capturing", 12.5)
    run = tracker.client.get_run(run_id)
    assert run.info.run_name == "#004 · RUNNING · capturing"
    assert run.data.tags["autotune.phase"] == "capturing" and run.data.metrics["phase.capturing_s"] == 12.5
    tracker.finish_trial(
        run_id,
        number=4,
        state="PRUNED",
        value=0.0,
        baseline=False,
        metrics={"trial_s": 30.0},
        tags={
            "autotune.failure_kind": "cuda_graph_oom",
            "autotune.advice": "lower --cuda-graph-max-bs-decode",
            "autotune.failure": "CUDA out of memory",
        },
        artifacts={"server.log": "log"},
    )
    run = tracker.client.get_run(run_id)
    assert run.info.run_name == "#004 · PRUNED · cuda_graph_oom"
    assert run.data.tags["mlflow.note.content"].startswith("**PRUNED: cuda_graph_oom**")
    assert run.data.params["nccl.NCCL_PROTO"] == "LL"

    orphan = tracker.start_trial(5, config, {"NCCL_PROTO": "nccl"}, launch, False, "node-a")
    tracker.close_interrupted(orphan)  # its driver died: the next driver closes the run
    run = tracker.client.get_run(orphan)
    assert run.info.run_name == "#005 · FAIL · interrupted" and run.info.status == "KILLED"


def test_an_ablation_trials_run_says_what_it_reverts_from_start_to_close(tracker) -> None:
    from autotune.trial.launch import ServerLaunch, TrialConfig

    launch = ServerLaunch(("python", "-m", "sglang.launch_server"), {}, "127.0.0.1", 30000)
    config = TrialConfig(env={}, params={"NCCL_PROTO": None})
    kinds = {"NCCL_PROTO": "nccl"}
    run_id = tracker.start_trial(6, config, kinds, launch, False, "node-a", ablation=(1, "NCCL_PROTO"))
    run = tracker.client.get_run(run_id)
    assert run.info.run_name == "#006 · RUNNING · launching · without NCCL_PROTO (ablation of #001)"
    assert (
        run.data.tags["autotune.ablation_of"] == "1"
        and run.data.tags["autotune.ablation_param"] == "NCCL_PROTO"
    )
    tracker.set_phase(run_id, "benchmarking")
    assert tracker.client.get_run(run_id).info.run_name.endswith(
        "benchmarking · without NCCL_PROTO (ablation of #001)"
    )
    tracker.finish_trial(
        run_id, number=6, state="COMPLETE", value=70.0, baseline=False, metrics={}, tags={}, artifacts={}
    )
    finished = tracker.client.get_run(run_id).info.run_name
    assert finished == "#006 · 70.0 tok/s · COMPLETE · without NCCL_PROTO (ablation of #001)"

    orphan = tracker.start_trial(7, config, kinds, launch, False, "node-a", ablation=(1, "NCCL_PROTO"))
    tracker.close_interrupted(orphan)  # closed by the next driver, which reads the label from the run's tags
    closed = tracker.client.get_run(orphan).info.run_name
    assert closed == "#007 · FAIL · interrupted · without NCCL_PROTO (ablation of #001)"


def test_plots_are_redrawn_at_most_every_interval_and_once_more_at_close(
    tracker, study_file: StudyFiles
) -> None:
    from optuna.trial import TrialState, create_trial

    from autotune.config import load_study

    study = load_study(study_file(e2e_study()))
    optuna_study = optuna.create_study(direction="maximize", study_name="live")
    optuna_study.add_trial(create_trial(state=TrialState.COMPLETE, value=80.0, user_attrs={"baseline": True}))
    tracker.refresh_study_view(optuna_study, study)
    parent = tracker.parent_run_id
    assert "80.00 tok/s" in tracker.client.get_run(parent).data.tags["mlflow.note.content"]
    assert not tracker.client.list_artifacts(parent, "plots"), "within the interval: no redraw"
    tracker.close()
    names = {Path(a.path).name for a in tracker.client.list_artifacts(parent, "plots")}
    assert "optimization_history.png" in names
    assert {a.path for a in tracker.client.list_artifacts(parent, "best")} == {"best/launch.sh"}


def test_plots_take_a_small_share_of_a_study_whose_trials_are_fast(
    tracker, study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    from optuna.trial import create_trial

    from autotune.config import load_study
    from autotune.tracking import tracker as tracking

    study = load_study(study_file(e2e_study()))
    optuna_study = optuna.create_study(direction="maximize", study_name="fast")
    optuna_study.add_trial(create_trial(value=80.0, user_attrs={"baseline": True}))
    monkeypatch.setattr(tracking, "PLOT_INTERVAL_S", 0.0)  # trials seconds apart, as on the simulated node
    drawn: list[float] = []  # a draw that takes 50 ms: the next waits a second
    monkeypatch.setattr(tracker.page, "plots", lambda *args: drawn.append(time.sleep(0.05) or 1.0) or [])
    tracker.refresh_study_view(optuna_study, study)
    assert len(drawn) == 1
    # at once: the last draw's time is not 5% of the time since
    tracker.refresh_study_view(optuna_study, study)
    assert len(drawn) == 1
    tracker._plotted_at -= tracker._plot_s / tracking.PLOT_TIME_SHARE
    tracker.refresh_study_view(optuna_study, study)
    assert len(drawn) == 2


# -- the ablation plan, on Optuna's own in-memory studies ---------------------------------------------------
def _plan_study() -> optuna.Study:
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    from optuna.trial import TrialState, create_trial

    distributions = {
        "NCCL_PROTO": CategoricalDistribution([None, "LL"]),
        "--disable-custom-all-reduce": CategoricalDistribution([False, True]),
        "--mem-fraction-static": FloatDistribution(0.7, 0.95, step=0.01),
        "--attention-backend": CategoricalDistribution([None, "triton"]),
    }
    optuna_study = optuna.create_study(direction="maximize", study_name="plan")
    optuna_study.add_trial(create_trial(value=100.0, user_attrs={"baseline": True}))
    params = {
        "NCCL_PROTO": "LL",
        "--disable-custom-all-reduce": True,
        "--mem-fraction-static": 0.88,
        "--attention-backend": None,
    }
    optuna_study.add_trial(create_trial(value=150.0, params=params, distributions=distributions))
    optuna_study.add_trial(create_trial(state=TrialState.FAIL, params=params, distributions=distributions))
    return optuna_study


def test_ablation_plan_reverts_what_the_search_space_can_unset() -> None:
    from autotune.study.ablation import enqueue_ablation, plan_ablation

    optuna_study = _plan_study()
    plan = plan_ablation(optuna_study)
    assert plan.of == 1
    assert plan.reverts == {"NCCL_PROTO": None, "--disable-custom-all-reduce": False}
    assert set(plan.not_ablated) == {"--mem-fraction-static"}, "a range has no 'leave it to SGLang' value"
    assert enqueue_ablation(optuna_study, plan) == ["NCCL_PROTO", "--disable-custom-all-reduce"]
    waiting = optuna_study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs[ABLATION_PARAM_ATTR] for t in waiting] == [
        "NCCL_PROTO",
        "--disable-custom-all-reduce",
    ]
    assert waiting[0].system_attrs["fixed_params"]["NCCL_PROTO"] is None
    assert plan_ablation(optuna_study).done == ("NCCL_PROTO", "--disable-custom-all-reduce"), (
        "queued counts as done"
    )
    assert enqueue_ablation(optuna_study, plan_ablation(optuna_study)) == []


def test_ablation_results_follow_retries_and_split_the_gain() -> None:
    from autotune.study.ablation import ablation_results, enqueue_ablation, plan_ablation

    optuna_study = _plan_study()
    enqueue_ablation(optuna_study, plan_ablation(optuna_study))
    proto = (
        optuna_study.ask()
    )  # without NCCL_PROTO: interrupted, then retried by the driver with the same params
    proto.suggest_categorical("NCCL_PROTO", [None, "LL"])
    proto.set_user_attr("failure_kind", "interrupted")
    optuna_study.tell(proto, state=optuna.trial.TrialState.FAIL)
    car = optuna_study.ask()
    car.suggest_categorical("--disable-custom-all-reduce", [False, True])
    optuna_study.tell(car, 140.0)
    optuna_study.enqueue_trial({"NCCL_PROTO": None}, user_attrs={"retry_of": proto.number})
    retry = optuna_study.ask()
    retry.suggest_categorical("NCCL_PROTO", [None, "LL"])
    optuna_study.tell(retry, 110.0)

    result = ablation_results(optuna_study)
    assert result is not None and result.of == 1 and result.baseline_value == 100.0
    rows = {row.param: row for row in result.rows}
    assert rows["NCCL_PROTO"].trial == retry.number and rows["NCCL_PROTO"].loss == pytest.approx(40.0)
    assert rows["NCCL_PROTO"].share_of_gain == pytest.approx(0.8)
    assert rows["--disable-custom-all-reduce"].loss_pct == pytest.approx(10 / 150 * 100)
    assert [row.param for row in result.rows] == ["NCCL_PROTO", "--disable-custom-all-reduce"]
    assert "--mem-fraction-static" in result.not_ablated


def test_nothing_to_ablate_when_the_baseline_is_best() -> None:
    from optuna.trial import create_trial

    from autotune.errors import AutotuneError
    from autotune.study.ablation import plan_ablation

    optuna_study = optuna.create_study(direction="maximize", study_name="flat")
    optuna_study.add_trial(create_trial(value=100.0, user_attrs={"baseline": True}))
    with pytest.raises(AutotuneError, match="is the baseline"):
        plan_ablation(optuna_study)


def test_start_up_phases_reach_the_report_and_each_trials_mlflow_run(ablated_study) -> None:
    """Read by the node from the simulated server's log lines (SGLang's own: `Load weight end. elapsed=`,
    `Capture target decode CUDA graph end. elapsed=`), recorded on the trial and its run."""
    from mlflow.tracking import MlflowClient

    path, _ = ablated_study
    html = (path.parent / "report" / "report.html").read_text()
    summary = html.split('<section id="summary">')[1].split("</section>")[0]
    assert re.search(r"<th>start-up \(median of \d+ launches\)</th><td>init \d+ s, weights \d+ s, ", summary)
    client = MlflowClient(tracking_uri=f"sqlite:///{path.parent / '.autotune/ablated/mlflow.db'}")
    experiment = client.get_experiment_by_name("ablated")
    baseline = client.search_runs(
        [experiment.experiment_id], filter_string="tags.`autotune.baseline` = 'true'"
    )
    metrics = baseline[0].data.metrics
    assert {"startup.weight_load_s", "startup.cuda_graph_s", "startup.ready_s"} <= set(metrics)
    assert metrics["startup.weight_load_s"] > 0  # the log's elapsed=, in the simulated server's model seconds
    assert 0 < metrics["startup.ready_s"] == pytest.approx(metrics["startup_s"], abs=0.01)
