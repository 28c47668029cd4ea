"""A whole study through the CLI: real Ray runtime, real simulated servers, real Optuna and MLflow stores."""

from __future__ import annotations

import subprocess
from pathlib import Path

import optuna
import pytest

from tests.conftest import N_TRIALS, run_cli
from tests.processes import left_behind, study_servers

pytestmark = pytest.mark.integration


def test_study_runs_every_trial_and_records_it_in_optuna(finished_study) -> None:
    path, proc = finished_study
    assert proc.returncode == 0, proc.stderr[-3000:]
    storage = f"sqlite:///{path.parent / '.autotune' / 'e2e' / 'optuna.db'}"
    trials = optuna.load_study(study_name="e2e", storage=storage).get_trials()
    counted = [t for t in trials if not t.user_attrs.get("skipped")]
    # The search's budget, then the confirmation: the best config and the defaults in two rounds, one of
    # them the search's own launches paired in time (trust.confirm.pair_search_launches), one launched.
    confirming = [t for t in counted if "confirm" in t.user_attrs]
    assert len(counted) - len(confirming) == N_TRIALS and len(confirming) == 2
    assert any(t.user_attrs.get("baseline") and t.user_attrs.get("remeasure_of") == 0 for t in counted[1:])
    assert all(t.state.is_finished() for t in trials)
    assert trials[0].number == 0 and trials[0].user_attrs.get("baseline") is True
    assert trials[0].params == {}
    assert trials[0].state == optuna.trial.TrialState.COMPLETE and trials[0].value > 0
    assert any(t.params for t in counted[1:]), "trials after the baseline carry sampled parameters"
    # The node check read the (simulated) node's GPUs: every launched trial records what it ran on.
    assert {t.user_attrs.get("hardware").rsplit(", flags ", 1)[0] for t in counted} == {
        "8x NVIDIA RTX PRO 6000 Blackwell Server Edition (89 GiB, driver 580.159.04-sim), SGLang 0.5.17"
    }
    assert "baseline output_throughput" in proc.stdout


def test_every_trial_has_an_mlflow_child_run_with_params_metrics_and_artifacts(finished_study) -> None:
    from mlflow.tracking import MlflowClient

    path, _ = finished_study
    workdir = path.parent / ".autotune" / "e2e"
    storage = f"sqlite:///{workdir / 'optuna.db'}"
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    assert experiment is not None
    runs = {r.info.run_id: r for r in client.search_runs([experiment.experiment_id], max_results=1000)}
    parents = [r for r in runs.values() if r.data.tags.get("autotune.role") == "study"]
    assert len(parents) == 1
    parent = parents[0]
    assert parent.data.metrics["baseline_value"] > 0
    # The noise estimate and the answer, confirmed in rounds (tracking.tracker.answer_for_tracking).
    assert parent.data.metrics["noise_relative_sd_pct"] >= 0
    assert "run-to-run noise" in parent.data.tags["autotune.noise"]
    assert parent.data.tags["autotune.confirmed"] == "true" and "confirmed_gain_pct" in parent.data.metrics
    for trial in optuna.load_study(study_name="e2e", storage=storage).get_trials():
        if trial.user_attrs.get("skipped"):
            continue
        run = runs[trial.user_attrs["mlflow_run_id"]]
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["autotune.trial"] == str(trial.number)
        assert run.data.tags["autotune.state"] == trial.state.name
        assert run.info.status in ("FINISHED", "FAILED")
        artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
        assert {"server.log", "launch.sh", "result.json"} <= artifacts
        for name, value in trial.params.items():
            kind = "nccl" if name.startswith("NCCL_") else None
            if kind:
                assert run.data.params[f"nccl.{name}"] == ("default" if value is None else str(value))
        if trial.state == optuna.trial.TrialState.COMPLETE:
            assert run.data.metrics["output_throughput"] == pytest.approx(trial.value)
            assert "benchmark.json" in artifacts
            log = Path(client.download_artifacts(run.info.run_id, "server.log")).read_text()
            assert "The server is fired up and ready to roll!" in log
        else:
            assert run.data.tags["autotune.failure_kind"] == trial.user_attrs["failure_kind"]


def test_secrets_never_reach_mlflow_or_launch_scripts(finished_study) -> None:
    from mlflow.tracking import MlflowClient

    path, _ = finished_study
    workdir = path.parent / ".autotune" / "e2e"
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    for run in client.search_runs([experiment.experiment_id], max_results=1000):
        assert "hf_secret_value_123" not in repr(run.data.params) + repr(run.data.tags)
        if run.data.tags.get("autotune.role") == "trial":
            script = Path(client.download_artifacts(run.info.run_id, "launch.sh")).read_text()
            assert "hf_secret_value_123" not in script
            assert "HF_TOKEN" in script


def test_no_server_outlives_the_study(finished_study) -> None:
    # `port: auto`: each launch's port, as the node picked it, and its server's process group, as recorded.
    path, _ = finished_study
    pgids, ports = study_servers(path.parent / ".autotune" / "e2e", "e2e")
    assert pgids and ports, "the launched trials recorded where their servers ran"
    assert left_behind(pgids, ports) == []


def test_status_and_best_read_the_finished_study(finished_study) -> None:
    path, _ = finished_study
    status = run_cli("status", str(path), "--json", cwd=path.parent)
    assert status.returncode == 0, status.stderr
    import json

    data = json.loads(status.stdout)
    assert data["study"] == "e2e" and len(data["trials"]) >= N_TRIALS
    assert {"number", "state", "value", "params", "failure_kind", "mlflow_run_id"} <= set(data["trials"][0])
    assert data["noise"]["dof"] >= 1 and data["answer"]["confirmed"] is True
    best = run_cli("best", str(path), "--export", str(path.parent / "best.sh"), cwd=path.parent)
    assert best.returncode == 0, best.stderr
    script = (path.parent / "best.sh").read_text()
    assert script.startswith("#!/usr/bin/env bash") and "autotune.sim.sglang_server" in script


def test_the_best_config_of_a_serving_study_is_compared_with_the_default(finished_study) -> None:
    # The simulated server through the trial path, as on the real H200: both configs launched again in
    # interleaved rounds, the throughput's gain in its own direction (higher is better) with an interval.
    import json

    path, _ = finished_study
    # A completed trial that changed flags: the study's best may be the baseline itself on a slow run.
    storage = f"sqlite:///{path.parent / '.autotune' / 'e2e' / 'optuna.db'}"
    chosen = next(
        t.number
        for t in optuna.load_study(study_name="e2e", storage=storage).trials
        if t.state == optuna.trial.TrialState.COMPLETE
        and not t.user_attrs.get("baseline")
        and any(value is not None for value in t.params.values())
    )
    out = path.parent / "compare-2.json"
    compare = ["compare", str(path), "--rounds", "2", "--trial", str(chosen), "--no-ray", "--out", str(out)]
    done = run_cli(*compare, cwd=path.parent)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["best_trial"] == chosen
    runs = result["runs"]
    order = [(r["round"], r["config"]) for r in runs]
    assert order == [(0, "default"), (0, "best"), (1, "best"), (1, "default")]  # ABBA
    assert all(r["failure"] is None and r["metrics"]["output_throughput"] > 0 for r in runs), runs
    assert result["best_flags"] or result["best_env"]
    assert f"best: trial {chosen}: " in done.stdout
    by_round = {(r["round"], r["config"]): r["metrics"]["output_throughput"] for r in runs}
    gains = [100 * (by_round[i, "best"] / by_round[i, "default"] - 1) for i in (0, 1)]  # higher is better
    assert result["summary"]["output_throughput"]["gain_pct"] == pytest.approx(sum(gains) / 2)
    assert "mean_ttft_ms" in result["summary"] and "output_throughput" in done.stdout


def test_the_console_announces_the_study_and_ends_with_the_answer_once_and_the_next_commands(
    finished_study: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    path, proc = finished_study
    err, out = proc.stderr, proc.stdout
    # The search announced before its first row, with its metric, unit and direction; rows with units.
    heading = f"== study e2e: {N_TRIALS} trials of the server"
    assert heading in err and "output_throughput in tok/s, higher is better" in err
    rows = [line for line in err.splitlines() if line.startswith("[")]
    assert err.index(heading) < err.index(rows[0]) and rows[0].startswith(f"[  1/{N_TRIALS}] baseline ")
    assert all(f"/{N_TRIALS}] " in row and " tok/s" in row for row in rows), "the counter is the budget"
    # The confirmation announced, its rows labelled with the config each measures, off the counter.
    assert err.index(rows[-1]) < err.index("== confirmation of e2e:")
    assert "(confirm r1 · SGLang's defaults)" in err and "(confirm r1 · trial " in err
    # The answer once, with its interval (confirmed), then the next commands on this study file.
    answers = [line for line in out.splitlines() if line.startswith("answer: ")]
    assert len(answers) == 1 and " CI " in answers[0] and "best output_throughput" not in out
    assert out.index(answers[0]) < out.index("next:")
    for command in ("status", "report", "ui", "best"):
        assert f"autotune {command} {path}" in out.split("next:")[1]
    assert f"autotune best {path} --export best.sh" in out
