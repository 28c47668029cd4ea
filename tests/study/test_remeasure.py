"""Repeated measurement: the top configs measured again, the answer a mean with its interval, and
`autotune best` saying when a gain is within noise. Noise comes from the simulated node (SGLANG_SIM_NOISE)
and its model (ModelNodeExecutor's noise)."""

from __future__ import annotations

import json
import math
import shlex
import sys
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.node.executor import TrialExecutor
from autotune.node.pool import LocalNodePool
from autotune.node.runner import LocalCommandRunner
from autotune.study.loop import StudyDriver
from autotune.study.records import REMEASURE_OF_ATTR
from autotune.study.remeasure import enqueue_remeasurement, gain_over, remeasure, remeasured_answer
from autotune.study.rules import ConfigMeasurements, best_trial, mean_interval, measurement_groups
from autotune.study.storage import open_study
from autotune.study.summary import study_summary
from tests.builders import REPO, SIM_TIMEOUTS, StudyFiles, simulated_server, study_data
from tests.test_objectives import SEED_WORKLOAD, ClockedModelNode, _QuietPool, cli

REMEASURE = {"top": 2, "repeats": 3, "confidence": 0.95}


def group(values: list[float], baseline: bool = False) -> ConfigMeasurements:
    return ConfigMeasurements(0, baseline, {}, tuple(range(len(values))), tuple(values), ())


def test_the_interval_of_a_mean_is_students() -> None:
    low, high = mean_interval([1.0, 2.0, 3.0], 0.95) or (0, 0)
    assert (low, high) == pytest.approx((2 - 2.4841, 2 + 2.4841), abs=1e-4)  # t(0.975, 2) * 1 / sqrt(3)
    assert mean_interval([5.0], 0.95) is None


def test_a_gain_whose_interval_reaches_zero_is_within_noise() -> None:
    base = group([100.0, 104.0, 96.0], baseline=True)
    close = gain_over(group([103.0, 99.0, 107.0]), base, maximize=True)
    assert close is not None and close.pct == pytest.approx(3.0) and close.within_noise
    assert close.low_pct is not None and close.low_pct < 0 < (close.high_pct or 0)
    far = gain_over(group([120.0, 121.0, 119.0]), base, maximize=True)
    assert far is not None and not far.within_noise and (far.low_pct or 0) > 0
    lower_is_better = gain_over(group([80.0, 81.0, 79.0]), base, maximize=False)
    assert lower_is_better is not None and lower_is_better.pct == pytest.approx(20.0)
    once = gain_over(group([120.0]), base, maximize=True)
    assert once is not None and once.low_pct is None and not once.within_noise
    # One Gain type for paired and unpaired gains: the same verdict as `compare` gives.
    assert (close.verdict, far.verdict, once.verdict) == ("no gain", "gain", "no gain")
    assert not far.paired and "Welch" in far.describe()


# -- on model nodes -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def remeasured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, optuna.Study, dict[str, Any]]:
    obj = {"name": "t", "metric": "output_throughput", "workload": SEED_WORKLOAD, "remeasure": REMEASURE}
    path = StudyFiles(tmp_path_factory.mktemp("remeasure"))(objective=obj, n_trials=12)
    study = load_study(path)
    node = ClockedModelNode(noise=0.05)

    def driver() -> StudyDriver:
        return StudyDriver(study, pool=lambda _: LocalNodePool({"n0": node}), tracking=False)

    optuna_study = driver().run()
    before = study_summary(optuna_study)
    optuna_study = remeasure(study, optuna_study, lambda total: driver().run(total))
    return path, optuna_study, before


def test_the_top_configs_and_the_baseline_are_measured_again(
    remeasured: tuple[Path, optuna.Study, dict[str, Any]],
) -> None:
    _, study, before = remeasured
    again = [t for t in study.trials if REMEASURE_OF_ATTR in t.user_attrs]
    assert all(t.state is TrialState.COMPLETE for t in again)
    of = sorted({t.user_attrs[REMEASURE_OF_ATTR] for t in again})
    assert 0 in of and len(of) == 1 + REMEASURE["top"]
    groups = {g.of: g for g in measurement_groups(study)}
    for number in of:
        assert groups[number].n == REMEASURE["repeats"]
        values = groups[number].values
        assert len(set(values)) == len(values), "with noise on, every measurement differs"
    # The re-measured configs are those with the best single values before re-measurement.
    first_again = min(t.number for t in again)
    single = {
        g.of: max(v for n, v in zip(g.trials, g.values, strict=True) if n < first_again)
        for g in groups.values()
        if not g.baseline and g.n
    }
    top = sorted(single, key=single.__getitem__, reverse=True)[: REMEASURE["top"]]
    assert set(top) == set(of) - {0}
    assert before.remeasured is None


def test_the_answer_is_the_best_mean_with_its_interval(
    remeasured: tuple[Path, optuna.Study, dict[str, Any]],
) -> None:
    _, study, _ = remeasured
    answer = remeasured_answer(study)
    assert answer is not None and answer.baseline is not None
    means = {g.of: g.mean for g in answer.ranking}
    assert answer.best.mean == max(means.values())
    low, high = answer.best.interval or (0.0, 0.0)
    assert low < answer.best.mean < high
    summary = study_summary(study)
    assert summary.best_value == pytest.approx(answer.best.mean)
    assert summary.baseline_value == pytest.approx(answer.baseline.mean)
    best = best_trial(study)
    assert best is not None and best.number == answer.best.of
    assert summary.remeasured["gain_pct"] == pytest.approx(
        (answer.best.mean - answer.baseline.mean) / answer.baseline.mean * 100
    )


def test_remeasuring_again_queues_nothing(remeasured: tuple[Path, optuna.Study, dict[str, Any]]) -> None:
    path, study, _ = remeasured
    settings = load_study(path).objective.remeasure
    assert settings is not None
    enqueue_remeasurement(study, settings)
    assert not study.get_trials(deepcopy=False, states=(TrialState.WAITING,))


def test_best_reports_the_gain_with_its_interval(
    remeasured: tuple[Path, optuna.Study, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, study, _ = remeasured
    out = cli(capsys, "best", str(path))
    answer = study_summary(study).remeasured
    best = answer["best"]
    assert f"best output_throughput: {best['mean']:.2f} (mean of 3, 95% CI {best['ci_low']:.2f} to " in out
    assert (
        f"gain over the baseline: {answer['gain_pct']:+.1f}% (95% CI {answer['gain_ci_low_pct']:+.1f}%" in out
    )
    assert ("within noise" in out) == answer["within_noise"]


def test_best_json_gives_the_config_its_mean_gain_interval_and_launch(
    remeasured: tuple[Path, optuna.Study, dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, study, _ = remeasured
    record = json.loads(cli(capsys, "best", str(path), "--json"))
    answer = study_summary(study).remeasured
    best = answer["best"]
    assert (record["trial"], record["value"], record["confidence"]) == (best["trial"], best["mean"], 0.95)
    assert record["interval"] == [best["ci_low"], best["ci_high"]] and best["ci_low"] < best["ci_high"]
    assert record["gain_pct"] == answer["gain_pct"]
    assert record["gain_interval_pct"] == [answer["gain_ci_low_pct"], answer["gain_ci_high_pct"]]
    # The same launch the plain command prints as a script, as argv and env.
    script = cli(capsys, "best", str(path))
    exec_line = next(line for line in script.splitlines() if line.startswith("exec "))
    assert record["launch"]["argv"] == shlex.split(exec_line)[1:]
    exports = dict(
        line[len("export ") :].split("=", 1)
        for line in script.splitlines()
        if line.startswith("export ") and "=" in line
    )
    assert {k: shlex.split(v)[0] for k, v in exports.items()} == record["launch"]["env"]
    assert record["params"] and all(
        str(v) in " ".join(record["launch"]["argv"]) + str(record["launch"]["env"])
        for v in record["params"].values()
        if not isinstance(v, bool)
    )


def test_best_says_when_a_gain_is_within_noise(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    obj = {"name": "t", "metric": "output_throughput", "workload": SEED_WORKLOAD, "remeasure": REMEASURE}
    path = study_file(objective=obj, n_trials=3)
    study = load_study(path)
    optuna_study = open_study(study)
    optuna_study.enqueue_trial({"--max-running-requests": 8})

    def measured(values: list[float], of: int | None, baseline: bool) -> None:
        for value in values:
            trial = optuna_study.ask()
            study.search_space.suggest(trial)  # as the driver does: the enqueued values, the rest sampled
            if baseline:
                trial.set_user_attr("baseline", True)
            if of is not None:
                trial.set_user_attr(REMEASURE_OF_ATTR, of)
            optuna_study.tell(trial, value)

    measured([100.0], None, baseline=True)  # trial 0, the enqueued baseline
    measured([104.0], None, baseline=False)  # trial 1, --max-running-requests 8
    config = optuna_study.trials[1].params
    for value in (97.0, 106.0):
        optuna_study.enqueue_trial(config)
        measured([value], 1, baseline=False)
    for value in (103.0, 98.0):
        optuna_study.enqueue_trial({})
        measured([value], 0, baseline=True)
    out = cli(capsys, "best", str(path))
    assert "best output_throughput: 102.33 (mean of 3, 95% CI" in out
    assert "gain over the baseline: +2.0% (95% CI " in out
    assert "within noise, the interval reaches 0%" in out
    assert "--max-running-requests" in out


# -- on the simulated node --------------------------------------------------------------------------------

# Each launch seeds the simulated server's noise with its own process id: a fresh draw per launch, as on GPUs.
FRESH_NOISE = [
    "sh",
    "-c",
    'SGLANG_SIM_SEED=$$ exec "$0" "$@"',
    sys.executable,
    "-m",
    "autotune.sim.sglang_server",
]


def simulated_study(
    name: str, command: list[str], workload: dict[str, int], repeats: int, env: dict[str, str]
) -> dict[str, Any]:
    """A two-trial study of `--max-running-requests` on the simulated node, re-measuring the best."""
    space = {
        "parameters": {
            "--max-running-requests": {"kind": "sglang", "type": "categorical", "choices": [None, 2]}
        }
    }
    obj = {
        "name": name,
        "metric": "output_throughput",
        "workload": workload,
        "remeasure": {"top": 1, "repeats": repeats},
    }
    return study_data(
        study=name,
        search_space=space,
        objective=obj,
        server=simulated_server(command=command, env={"SGLANG_SIM_STARTUP_TIME_SCALE": "0.001", **env}),
        n_trials=2,
        sampler=None,
        timeouts=SIM_TIMEOUTS,
    )


@pytest.mark.integration
def test_on_the_noisy_simulated_node_repeats_differ_and_best_gives_the_interval(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    workload = {"num_prompts": 8, "input_len": 1000, "output_len": 256, "concurrency": 4}
    # About a second of wall time per benchmark: a 0.1 s stall of a busy machine moves it by 10%, not 5x
    # as it did at 0.02 s (once, 8.8 against 75 tok/s in a full test run).
    env = {"SGLANG_SIM_TIME_SCALE": "0.2", "SGLANG_SIM_NOISE": "0.05"}
    path = study_file(simulated_study("noisy", FRESH_NOISE, workload, 3, env))
    study = load_study(path)
    open_study(study).enqueue_trial({"--max-running-requests": 2})

    def run(total: int | None = None) -> optuna.Study:
        node = TrialExecutor("local", LocalCommandRunner(), study.workdir / "nodes", port_wait_s=5)
        return StudyDriver(study, pool=lambda _: _QuietPool({"local": node}), tracking=False).run(total)

    optuna_study = remeasure(study, run(), run)
    groups = {g.of: g for g in measurement_groups(optuna_study)}
    assert sorted(groups) == [0, 1] and groups[0].n == groups[1].n == 3
    for g in groups.values():
        spread = (max(g.values) - min(g.values)) / g.mean
        assert 0.005 < spread < 0.5, g.values  # run-to-run noise of a few percent, launch to launch
    answer = remeasured_answer(optuna_study)
    assert answer is not None and answer.baseline is not None and answer.gain is not None
    assert answer.best.of == max(groups, key=lambda k: groups[k].mean)
    out = cli(capsys, "best", str(path))
    assert f"(mean of 3, 95% CI {answer.best.interval[0]:.2f} to {answer.best.interval[1]:.2f}" in out  # type: ignore[index]
    low, high = answer.gain.low_pct, answer.gain.high_pct
    assert low is not None and high is not None and math.isfinite(low) and high - low > 0
    assert ("within noise" in out) == (low <= 0 <= high)


@pytest.mark.integration
def test_run_options_hold_for_remeasurement(tmp_path: Path, study_file: StudyFiles) -> None:
    """`--no-ray --no-tracking` hold for every phase: the re-measurement that follows the study's trials
    starts no Ray runtime (RAY_ADDRESS is no address: any ray.init() fails) and writes no MLflow store."""
    import os
    import subprocess

    workload = {"num_prompts": 4, "input_len": 500, "output_len": 32, "concurrency": 2}
    command = [sys.executable, "-m", "autotune.sim.sglang_server"]
    path = study_file(simulated_study("options", command, workload, 2, {"SGLANG_SIM_TIME_SCALE": "0.01"}))
    proc = subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(path), "--no-ray", "--no-tracking"],
        capture_output=True,
        text=True,
        env={**os.environ, "RAY_ADDRESS": "ray-must-not-start"},  # ray.init() fails at once on it
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    study = load_study(path)
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    remeasured = [t for t in optuna_study.trials if t.user_attrs.get(REMEASURE_OF_ATTR) is not None]
    assert remeasured, "no re-measurement ran"
    assert not (study.workdir / "mlflow.db").exists() and not list(tmp_path.rglob("mlruns"))


@pytest.mark.parametrize("command", ["run", "resume", "remeasure", "ablate"])
def test_every_command_that_runs_trials_takes_the_driver_options(command: str) -> None:
    from autotune.cli import _parser
    from autotune.cli.run import _driver
    from autotune.node.pool import in_process_pool
    from autotune.views.tracked import study_tracker

    study = load_study(REPO / "examples" / "quickstart.yaml")
    args = _parser().parse_args([command, "study.yaml", "--no-ray", "--no-tracking"])
    driver = _driver(study, args)
    assert driver.make_pool is in_process_pool and driver.tracking is None
    default = _driver(study, _parser().parse_args([command, "study.yaml"]))
    assert default.make_pool is not in_process_pool and default.tracking is study_tracker
