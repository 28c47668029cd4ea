"""A study started from an earlier one (`autotune run NEW.yaml --from OLD.yaml`): the earlier answer and its
runner-up first, its failures known before a launch on the same GPUs, its noise until the new study has its
own; bad input refused before anything is written. Real Optuna SQLite stores; the nodes are the seed node's
model in this process, and for the command the simulated SGLang server on two versions."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.study.enqueue import stored_study
from autotune.study.loop import StudyDriver
from autotune.study.storage import budget_used, open_study
from autotune.study.trust.answer import study_answer
from autotune.study.trust.noise import noise_estimate
from autotune.study.warm_start import gpu_kind, read_earlier, start_from
from tests.builders import FLAT, TRUST_OFF, StudyFiles, launched, model_pool
from tests.conftest import run_cli

SPACE = {
    "parameters": {
        "--mem-fraction-static": {"kind": "sglang", "type": "categorical", "choices": [0.8, 0.85, 0.88]},
        "--cuda-graph-max-bs-decode": {"kind": "sglang", "type": "categorical", "choices": [None, 128, 512]},
        "--ep-size": {"kind": "sglang", "type": "categorical", "choices": [None, 8]},
    }
}


@pytest.fixture(scope="module")
def old_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An earlier study on the seed node: two configs measured, one twice (the noise), one that fails
    there (--ep-size 8, learned as incompatible with the node's hardware)."""
    path = StudyFiles(tmp_path_factory.mktemp("old"))(
        study="old", n_trials=6, search_space=SPACE, trust=TRUST_OFF
    )
    study = load_study(path)
    optuna_study = open_study(study)
    for params in (
        {"--mem-fraction-static": 0.88, "--cuda-graph-max-bs-decode": 128, "--ep-size": None},
        {"--mem-fraction-static": 0.88, "--cuda-graph-max-bs-decode": 128, "--ep-size": None},
        {"--mem-fraction-static": 0.85, "--cuda-graph-max-bs-decode": None, "--ep-size": None},
        {"--mem-fraction-static": 0.85, "--cuda-graph-max-bs-decode": None, "--ep-size": 8},
    ):
        optuna_study.enqueue_trial(params)
    StudyDriver(study, pool=model_pool(noise=0.01)).run()
    return path


def _new(folder: Path, **keys: object) -> Path:
    return StudyFiles(folder)(
        **{"study": "new", "n_trials": 4, "search_space": SPACE, "trust": TRUST_OFF, **keys}
    )


def test_the_new_study_launches_the_earlier_answer_and_runner_up_first(
    old_path: Path, tmp_path: Path
) -> None:
    old = optuna.load_study(study_name="old", storage=load_study(old_path).storage)
    answer = study_answer(old)
    assert answer is not None and old.user_attrs["incompatible"][0][:2] == ["--ep-size", 8]
    new = load_study(_new(tmp_path))
    numbers = start_from(new, read_earlier(old_path, new))
    assert numbers == [1, 2]  # after the baseline
    optuna_study = StudyDriver(new, pool=model_pool(noise=0.01)).run()
    trials = optuna_study.trials
    assert trials[0].user_attrs["baseline"]
    leader = old.trials[answer.leader]
    assert trials[1].params == leader.params and trials[1].user_attrs["warm_start"]["role"] == "answer"
    assert trials[2].user_attrs["warm_start"]["role"] == "runner-up" and trials[2].params != leader.params
    assert all(t.state is TrialState.COMPLETE for t in trials[:3])
    # What the earlier study's node could not run on these GPUs is known before any launch here.
    assert optuna_study.user_attrs["incompatible"][0][:2] == ["--ep-size", 8]
    assert not [t for t in launched(optuna_study) if t.params.get("--ep-size") == 8]


def test_the_earlier_noise_stands_in_until_the_new_study_measured_its_own(
    old_path: Path, tmp_path: Path
) -> None:
    old = optuna.load_study(study_name="old", storage=load_study(old_path).storage)
    earlier = noise_estimate(old)
    assert earlier is not None and earlier.dof >= 1
    new = load_study(_new(tmp_path))
    start_from(new, read_earlier(old_path, new))
    optuna_study = open_study(new)
    standing = noise_estimate(optuna_study)
    assert standing is not None and standing.relative_sd == earlier.relative_sd and standing.earlier == "old"
    assert "the earlier study 'old'" in standing.describe()
    assert standing.record()["earlier_study"] == "old"
    # Once a config of its own is measured twice, the study's own noise is used.
    optuna_study.enqueue_trial(
        {"--mem-fraction-static": 0.8, "--cuda-graph-max-bs-decode": None, "--ep-size": None}
    )
    optuna_study.enqueue_trial(
        {"--mem-fraction-static": 0.8, "--cuda-graph-max-bs-decode": None, "--ep-size": None}
    )
    optuna_study = StudyDriver(new, pool=model_pool(noise=0.01)).run(n_trials=5)
    own = noise_estimate(optuna_study)
    assert own is not None and own.earlier is None and own.configs


def test_a_missing_earlier_file_or_store_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    new_path = _new(tmp_path / "new")
    new = load_study(new_path)
    with pytest.raises(ConfigError) as missing:
        read_earlier(tmp_path / "nope.yaml", new)
    assert missing.value.field == "--from" and missing.value.path == tmp_path / "nope.yaml"
    assert "no such study file" in str(missing.value)
    never_ran = StudyFiles(tmp_path / "never")(study="never", search_space=SPACE)
    with pytest.raises(ConfigError) as absent:
        read_earlier(never_ran, new)
    assert absent.value.field == "storage" and "no study 'never' is stored there" in str(absent.value)
    assert "Run the earlier study first" in absent.value.fix
    assert stored_study(new) is None


def test_a_knob_the_new_search_space_lacks_names_the_file_the_knob_and_the_fix(
    old_path: Path, tmp_path: Path
) -> None:
    smaller = {
        "parameters": {k: v for k, v in SPACE["parameters"].items() if k != "--cuda-graph-max-bs-decode"}
    }
    new = load_study(_new(tmp_path, search_space=smaller))
    with pytest.raises(ConfigError) as error:
        read_earlier(old_path, new)
    assert error.value.path == new.search_space.path
    earlier = open_study(load_study(old_path))
    answer = study_answer(earlier)
    assert answer is not None
    value = earlier.trials[answer.trial].params["--cuda-graph-max-bs-decode"]  # the answer's, the one lost
    assert error.value.field == "parameters.--cuda-graph-max-bs-decode" and error.value.value == value
    assert "the earlier study's answer (trial" in error.value.problem
    assert "Add --cuda-graph-max-bs-decode to space.yaml" in error.value.fix
    # A value the new space does not take: the enqueue rule's error, with the way out.
    narrower = {"parameters": {**SPACE["parameters"], "--mem-fraction-static": {
        "kind": "sglang", "type": "categorical", "choices": [0.8, 0.85]}}}  # fmt: skip
    new = load_study(_new(tmp_path / "narrow", search_space=narrower))
    with pytest.raises(ConfigError) as outside:
        read_earlier(old_path, new)
    assert outside.value.value == 0.88 and "outside the values this knob takes" in outside.value.problem
    assert outside.value.fix.endswith("Or start without --from.")
    assert stored_study(new) is None


def test_a_study_with_trials_of_its_own_is_not_started_again(old_path: Path, tmp_path: Path) -> None:
    new = load_study(_new(tmp_path))
    StudyDriver(new, pool=model_pool()).run(n_trials=1)
    with pytest.raises(ConfigError, match=r"already has 1 trials: --from starts a new one"):
        start_from(new, read_earlier(old_path, new))


def test_the_gpus_of_a_fingerprint_leave_out_the_driver_and_sglang() -> None:
    fingerprint = "8x NVIDIA H200 (140 GiB, driver 580.159.04), SGLang 0.5.17, flags 381d4305"
    assert gpu_kind(fingerprint) == "8x NVIDIA H200 (140 GiB"
    assert gpu_kind("8x NVIDIA H200 (140 GiB), SGLang 0.5.23") == "8x NVIDIA H200 (140 GiB"
    assert gpu_kind(None) is None and gpu_kind("something else") is None


@pytest.mark.integration
def test_run_from_an_earlier_study_after_an_sglang_upgrade(tmp_path: Path) -> None:
    from tests.builders import SIM_TIMEOUTS, simulated_server, small_objective

    def data(name: str, version: str) -> dict[str, object]:
        server = simulated_server(
            env={
                "SGLANG_SIM_VERSION": version,
                "SGLANG_SIM_TIME_SCALE": "0.01",
                "SGLANG_SIM_STARTUP_TIME_SCALE": "0.001",
            }
        )
        return {
            "study": name,
            "search_space": SPACE,
            "objective": small_objective(num_prompts=4, concurrency=2),
            "server": server,
            "budget": {"n_trials": 4},
            "sampler": {"name": "tpe", "seed": 1},
            "trust": TRUST_OFF,
            "timeouts": SIM_TIMEOUTS,
        }

    old = StudyFiles(tmp_path / "old")(data("old", "0.5.17"))
    assert run_cli("run", str(old), "--no-tracking", "--no-ray", cwd=tmp_path).returncode == 0
    new = StudyFiles(tmp_path / "new")(data("new", "0.5.23"))
    bad = run_cli(
        "run", str(new), "--no-tracking", "--no-ray", "--from", str(tmp_path / "old.yaml"), cwd=tmp_path
    )
    assert bad.returncode == 2 and f"{tmp_path / 'old.yaml'}: --from: no such study file" in bad.stderr
    assert not (tmp_path / "new" / ".autotune").exists() or stored_study(load_study(new)) is None
    done = run_cli("run", str(new), "--no-tracking", "--no-ray", "--from", str(old), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "trial 1 launches the earlier study 'old''s answer" in done.stderr
    optuna_study = optuna.load_study(study_name="new", storage=load_study(new).storage)
    earlier = optuna.load_study(study_name="old", storage=load_study(old).storage)
    answer = study_answer(earlier)
    # The earlier answer's config, or its runner-up where the answer is SGLang's defaults (the new study's
    # own baseline, trial 0, runs those).
    assert answer is not None
    ran_before = [t.params for t in earlier.trials if t.number != 0 and t.params]
    assert optuna_study.trials[1].params and optuna_study.trials[1].params in ran_before
    assert optuna_study.trials[1].state is TrialState.COMPLETE


def test_a_study_started_from_an_earlier_one_stops_without_the_minimum_search(tmp_path: Path) -> None:
    # The minimum gives a sampler room to explore after its start; the earlier study spent it already.
    intervals = [None, 1, 2, 3, 4, 5, 6, 8, 12, 16]  # no effect on throughput: 30 configs with the policy
    stream = {"kind": "sglang", "type": "categorical", "choices": intervals}
    flat = {"parameters": {**FLAT["parameters"], "--stream-interval": stream}}
    trust = {
        "repeat_baseline_after": 2,
        "confirm": False,
        "stop_early": {"min_trials": 12, "patience": 3, "patience_node_hours": None},
        "screen": False,
    }
    old_path = StudyFiles(tmp_path / "old")(study="flat-old", n_trials=8, search_space=flat, trust=trust)
    StudyDriver(load_study(old_path), pool=model_pool(noise=0.01)).run()
    cold = load_study(
        StudyFiles(tmp_path / "cold")(study="flat", n_trials=30, search_space=flat, trust=trust)
    )
    warm = load_study(
        StudyFiles(tmp_path / "warm")(study="flat", n_trials=30, search_space=flat, trust=trust)
    )
    start_from(warm, read_earlier(old_path, warm))
    cold_driver, warm_driver = (
        StudyDriver(cold, pool=model_pool(noise=0.01)),
        StudyDriver(warm, pool=model_pool(noise=0.01)),
    )
    cold_used, warm_used = budget_used(cold_driver.run()), budget_used(warm_driver.run())
    assert cold_driver.stopped is not None and warm_driver.stopped is not None
    assert "within the run-to-run noise band" in cold_driver.stopped + warm_driver.stopped
    assert cold_used >= 12 > warm_used, (cold_used, warm_used)
