"""The study loop's rules, run fast: nodes answered by the simulated node's model, real Optuna and MLflow."""

from __future__ import annotations

import io
import os
import signal
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli.console import ConsoleReporter
from autotune.config import load_study
from autotune.errors import AutotuneError
from autotune.sim.predict import predict
from autotune.sim.profiles import StandardWorkload, load_hardware_profile, load_model_profile
from autotune.study import unlaunched
from autotune.study.callbacks import (
    IncompatibilityLearned,
    StudyCallback,
    StudyEnded,
    StudyStarted,
    SummaryUpdated,
    TrialFinished,
    TrialStarted,
)
from autotune.study.loop import StudyDriver, ctrl_c_remembered, finished_count
from autotune.study.samplers import NEAR_STEPS, nearest
from autotune.study.storage import open_study
from autotune.study.summary import study_summary
from autotune.views.tracked import study_tracker
from tests.builders import StudyFiles, model_pool

SEED_HARDWARE = (
    "8x NVIDIA RTX PRO 6000 Blackwell Server Edition (89 GiB, driver 580.159.04-sim), SGLang 0.5.17"
)


@pytest.fixture(scope="module")
def study_of_30_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return StudyFiles(tmp_path_factory.mktemp("driver"))(n_trials=30, failures={"oom_penalty": -1.0})


@pytest.fixture(scope="module")
def study_of_30(study_of_30_path: Path) -> optuna.Study:
    return StudyDriver(load_study(study_of_30_path), pool=model_pool(nodes=2)).run()


@pytest.fixture(scope="module")
def memory_study(tmp_path_factory: pytest.TempPathFactory) -> optuna.Study:
    """Three trials on the seed node: one runs out of memory under the quickstart's long prompts (the
    static pool leaves too little for activations), one has a static pool the weights overflow (68 GB a
    GPU in 0.70 of 89 GiB), which the pre-flight check refuses without a launch."""
    study = load_study(
        StudyFiles(tmp_path_factory.mktemp("memory"))(n_trials=3, failures={"oom_penalty": -1.0})
    )
    optuna_study = open_study(study)
    optuna_study.enqueue_trial({"--mem-fraction-static": 0.95, "--chunked-prefill-size": 16384})
    optuna_study.enqueue_trial({"--mem-fraction-static": 0.70})
    return StudyDriver(study, pool=model_pool(), tracking=study_tracker).run()  # tracked: skips get no run


def test_budget_counts_trials_run_on_nodes(study_of_30: optuna.Study) -> None:
    assert finished_count(study_of_30) == 30
    assert all(t.state.is_finished() for t in study_of_30.trials)


def test_trial_zero_is_the_baseline_with_no_tuned_setting(
    study_of_30: optuna.Study, study_of_30_path: Path
) -> None:
    first = study_of_30.trials[0]
    assert first.user_attrs["baseline"] is True and first.params == {}
    assert first.state is TrialState.COMPLETE
    hw, model = load_hardware_profile("rtx-pro-6000-pcie-x8"), load_model_profile("kimi-k2.5-int4")
    w = load_study(study_of_30_path).objective.workload
    workload = StandardWorkload(
        num_prompts=w.num_prompts, input_len=w.input_len, output_len=w.output_len, concurrency=w.concurrency
    )
    expected = predict(hw, model, ["--tp-size", "8"], {}, workload).output_throughput
    assert first.value == pytest.approx(expected)  # the model's answer for SGLang's defaults


def test_oom_is_pruned_with_the_penalty_and_an_infeasible_constraint(memory_study: optuna.Study) -> None:
    oom = [
        t
        for t in memory_study.trials
        if t.user_attrs.get("failure_kind") in ("kv_pool_too_small", "cuda_graph_oom", "oom_under_load")
    ]
    assert oom, "0.95 of the memory in the static pool runs out under 28k-token prompts"
    for trial in oom:
        assert trial.state is TrialState.PRUNED
        assert trial.value == -1.0
        assert trial.constraints["memory"] > 0


def test_an_unsupported_flag_is_never_launched_after_it_failed(study_of_30: optuna.Study) -> None:
    first_failure: dict[tuple[str, object], object] = {}
    for trial in study_of_30.trials:
        if trial.user_attrs.get("failure_kind") == "unsupported":
            for name in trial.user_attrs["culprits"]:
                if trial.params.get(name) not in (None, False):
                    pair = (name, trial.params[name])
                    first_failure[pair] = min(
                        first_failure.get(pair, trial.datetime_complete), trial.datetime_complete
                    )
    assert first_failure, "the seed node's unsupported features show up in 30 trials"
    learned = {(name, value): where for name, value, where in study_of_30.user_attrs["incompatible"]}
    assert set(first_failure) <= set(learned)
    assert set(learned.values()) == {SEED_HARDWARE}  # recorded against the node's hardware fingerprint
    for trial in study_of_30.trials:
        if trial.user_attrs.get("skipped"):
            continue  # proposed, refused without a launch
        for (name, value), failed_at in first_failure.items():
            if trial.params.get(name) == value:
                assert trial.datetime_start <= failed_at, (
                    f"trial {trial.number} launched {name}={value} again"
                )


def test_the_baselines_own_memory_fraction_is_where_the_start_samples_it(study_of_30: optuna.Study) -> None:
    baseline = study_of_30.trials[0]
    chosen = study_of_30.user_attrs["server_choices"]
    assert chosen == baseline.user_attrs["server_choices"] and 0.7 < chosen["--mem-fraction-static"] < 0.95
    start = [t.params["--mem-fraction-static"] for t in study_of_30.trials[1:10]]
    on_step = nearest(
        study_of_30.trials[1].distributions["--mem-fraction-static"], chosen["--mem-fraction-static"]
    )
    # Two nodes: the trial that starts beside the baseline cannot know its choice yet.
    assert sum(abs(v - on_step) <= NEAR_STEPS * 0.01 + 1e-9 for v in start) >= 5, (chosen, start)


def test_a_speculative_trial_keeps_the_servers_accept_length(study_of_30: optuna.Study) -> None:
    # The default sampler steers the speculative tree by it (autotune.study.samplers.adaptive_steps).
    done = [t for t in study_of_30.trials if t.state is TrialState.COMPLETE]
    speculative = [t for t in done if t.params.get("--speculative-algorithm") == "EAGLE3"]
    assert speculative and all(t.user_attrs["accept_length"] > 1.0 for t in speculative)
    assert all("accept_length" not in t.user_attrs for t in done if t not in speculative)


def test_complete_trials_are_feasible_and_the_best_beats_the_baseline(study_of_30: optuna.Study) -> None:
    summary = study_summary(study_of_30)
    assert summary.best_value > summary.baseline_value
    for trial in study_of_30.trials:
        if trial.state is TrialState.COMPLETE:
            assert trial.constraints["memory"] == 0


def test_a_second_run_continues_to_a_larger_budget(study_file: StudyFiles) -> None:
    path = study_file(n_trials=5)
    study = load_study(path)
    StudyDriver(study, pool=model_pool()).run()
    optuna_study = StudyDriver(study, pool=model_pool()).run(n_trials=8)
    assert finished_count(optuna_study) == 8
    assert sum(1 for t in optuna_study.trials if t.user_attrs.get("baseline")) == 1


def test_predicted_ooms_are_pruned_without_a_launch_and_every_trial_knows_its_hardware(
    study_of_30: optuna.Study, memory_study: optuna.Study
) -> None:
    predicted = [t for t in memory_study.trials if t.user_attrs.get("failure_kind") == "predicted_oom"]
    assert predicted, "a static pool of 0.70 is refused before a launch"
    for trial in predicted:
        assert trial.state is TrialState.PRUNED and trial.value == -1.0
        assert trial.user_attrs["skipped"] is True and "mlflow_run_id" not in trial.user_attrs
        assert trial.params["--mem-fraction-static"] * 96.0 < 547 / 8
    launched = [t for t in study_of_30.trials if not t.user_attrs.get("skipped")]
    hardware = {t.user_attrs.get("hardware") for t in launched}
    assert hardware == {SEED_HARDWARE}


def one_value_space(name: str, value: object) -> dict[str, object]:
    """A search space whose one parameter always takes `value`: every trial after the baseline proposes it."""
    return {"parameters": {name: {"kind": "sglang", "type": "categorical", "choices": [value]}}}


def test_without_preflight_a_predicted_oom_is_launched_and_fails_on_the_node(study_file: StudyFiles) -> None:
    # What the failures benchmark compares against: 0.6 x 96 GB cannot hold 547 GB / 8 of weights.
    space = one_value_space("--mem-fraction-static", 0.6)
    study = load_study(study_file(n_trials=3, search_space=space))
    optuna_study = StudyDriver(study, pool=model_pool(), preflight=False).run()
    tried = [t for t in optuna_study.trials if not t.user_attrs.get("baseline")]
    assert len(tried) == 2
    for trial in tried:
        assert "skipped" not in trial.user_attrs and trial.user_attrs["node"] == "n0"
        assert trial.state is TrialState.PRUNED and trial.user_attrs["failure_kind"] == "kv_pool_too_small"


def test_without_the_memory_an_unsupported_flag_is_launched_every_time(study_file: StudyFiles) -> None:
    space = one_value_space("--enable-flashinfer-allreduce-fusion", True)
    study = load_study(study_file(n_trials=4, search_space=space))
    optuna_study = StudyDriver(study, pool=model_pool(), remember_incompatible=False).run()
    tried = [t for t in optuna_study.trials if not t.user_attrs.get("baseline")]
    assert [t.user_attrs["failure_kind"] for t in tried] == ["unsupported"] * 3
    assert all("node" in t.user_attrs for t in tried) and "incompatible" not in optuna_study.user_attrs


def test_a_sampler_that_only_proposes_predicted_ooms_stops_the_study_with_the_fix(
    study_file: StudyFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each proposal is refused at no cost; without a limit the study would never end. The rule, not the
    # product's 200 (each skip a stored trial: 10 s of SQLite), is what this checks.
    monkeypatch.setattr(unlaunched, "MAX_CONSECUTIVE_SKIPS", 12)
    space = one_value_space("--mem-fraction-static", 0.6)
    study = load_study(study_file(n_trials=3, search_space=space))
    stops = r"12 trials in a row that cannot run .*predicted OOM.*remove the failing"
    with pytest.raises(AutotuneError, match=stops):
        StudyDriver(study, pool=model_pool()).run()
    assert len(open_study(study).trials) == 1 + 12 + 1  # the baseline, then skips to one past the limit


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_a_ctrl_c_that_something_swallows_is_still_remembered(sig: signal.Signals) -> None:
    # Some call below the study loop once swallowed a Ctrl-C; the loop must still see it, and which
    # signal it was (SIGTERM from `timeout` or systemd, SIGHUP from a closed terminal stop it the same way).
    before = signal.getsignal(sig)
    with ctrl_c_remembered() as ctrl_c:
        try:
            os.kill(os.getpid(), sig)
            time.sleep(1)  # the handler runs here, between bytecodes
        except KeyboardInterrupt:
            pass  # swallowed, as that call did
        assert ctrl_c.is_set() and ctrl_c.signum is sig
    assert signal.getsignal(sig) is before


class Recorder(StudyCallback):
    """An observer that keeps what the loop told it, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def study_started(self, event: StudyStarted) -> None:
        self.events.append(("study_started", event.recovered))

    def trial_started(self, event: TrialStarted) -> None:
        self.events.append(("trial_started", event.trial.number, dict(event.progress.running)))

    def trial_finished(self, event: TrialFinished) -> None:
        outcome = event.outcome
        kind = outcome.failure_kind.value if outcome.failure_kind else None
        self.events.append(("trial_finished", event.number, outcome.state.name, kind, event.progress.done))

    def incompatibility_learned(self, event: IncompatibilityLearned) -> None:
        self.events.append(("incompatibility_learned", event.new))

    def summary_updated(self, event: SummaryUpdated) -> None:
        self.events.append(("summary_updated", event.summary.best_trial))

    def study_ended(self, event: StudyEnded) -> None:
        self.events.append(("study_ended", event.interrupted, event.summary and event.summary.best_value))


def test_the_loop_tells_each_observer_every_trial_in_order_and_the_console_prints_them(
    study_file: StudyFiles,
) -> None:
    study = load_study(study_file(n_trials=4, nccl_stage=False))  # the console's trial lines alone
    # Fails on the simulated SM120 node's GPUs (not known before a launch); the static pool fits the weights.
    open_study(study).enqueue_trial({"--ep-size": 8, "--mem-fraction-static": 0.85})
    recorder, stream = Recorder(), io.StringIO()
    observers = [recorder, ConsoleReporter(stream)]
    optuna_study = StudyDriver(study, observers, pool=model_pool(), tracking=False).run()

    events = recorder.events
    assert events[0] == ("study_started", ())
    finished = [e for e in events if e[0] == "trial_finished"]
    assert [(e[1], e[2], e[3]) for e in finished[:2]] == [(0, "COMPLETE", None), (1, "FAIL", "unsupported")]
    assert [e[4] for e in finished] == [1, 2, 3, 4], "each finished trial counted as it is told"
    for number in (e[1] for e in finished):
        started = events.index(next(e for e in events if e[:2] == ("trial_started", number)))
        assert events[started][2] == {number: "launching"}, "one node: the trial is the only one running"
        done = events.index(next(e for e in finished if e[1] == number))
        learned = events[done + 1][0] == "incompatibility_learned"
        assert started < done and events[done + 1 + learned][0] == "summary_updated"
    learned_at = events.index(("incompatibility_learned", (("--ep-size", 8, SEED_HARDWARE),)))
    assert learned_at == events.index(finished[1]) + 1, "learned right after the failed trial is shown"
    best = study_summary(optuna_study)
    assert events[-1] == ("study_ended", False, best.best_value)

    # Not a terminal: the study's heading, then one line per finished trial, no progress bar.
    known, ignored, heading, *lines = stream.getvalue().splitlines()
    assert known == (  # known before any launch (study.before_launch): the sampler never proposes it
        "not proposed on this node's GPU (NVIDIA RTX PRO 6000 Blackwell Server Edition), which SGLang cannot "
        "run them on: --enable-flashinfer-allreduce-fusion=True"
    )
    assert ignored == (  # a value SGLang runs without there: held too
        "not proposed on this node's GPU (NVIDIA RTX PRO 6000 Blackwell Server Edition), which SGLang runs "
        "without them: --enable-torch-symm-mem=True"
    )
    assert heading.startswith("== study t: 4 trials of the server")
    baseline = optuna_study.trials[0].value
    assert lines[0].startswith(f"[  1/4] baseline  COMPLETE {baseline:>8.1f} tok/s")
    assert lines[0].endswith(f"best {baseline:.1f} tok/s · baseline {baseline:.1f} tok/s")
    assert lines[1].startswith("[  2/4] trial 1   FAIL                  - (unsupported)")
    assert (
        lines[2]
        == "known incompatible on this hardware, not tried again: --enable-flashinfer-allreduce-fusion=True, "
        "--ep-size=8"
    )
    assert len(lines) == 5 and lines[-1].startswith("[  4/4] trial ")
    assert not (study.workdir / "mlflow.db").exists(), "no tracker registered: no MLflow store"


def test_a_config_past_the_memory_edge_the_study_met_is_not_launched(study_file: StudyFiles) -> None:
    # The seed's server runs out of memory under load from 0.93 (the model node); proposals in order:
    fraction_knob = {"kind": "sglang", "type": "float", "low": 0.85, "high": 0.95, "step": 0.01}
    space = {"parameters": {"--mem-fraction-static": fraction_knob}}
    study = load_study(study_file(n_trials=4, search_space=space))
    optuna_study = open_study(study)
    for fraction in (0.93, 0.95, 0.90):
        optuna_study.enqueue_trial({"--mem-fraction-static": fraction})
    optuna_study.enqueue_trial({"--mem-fraction-static": 0.95}, user_attrs={"queued": {"set": {}}})  # by hand
    optuna_study = StudyDriver(study, pool=model_pool(), tracking=False).run()
    met, past, below, asked = optuna_study.trials[1:5]
    assert met.state is TrialState.PRUNED and met.user_attrs["failure_kind"] == "oom_under_load"
    assert "node" in met.user_attrs
    # Never launched, costing neither node time nor budget; pruned with the penalty, so samplers learn.
    assert past.state is TrialState.PRUNED and past.user_attrs["failure_kind"] == "predicted_oom"
    assert past.user_attrs["skipped"] and "node" not in past.user_attrs
    assert f"trial {met.number} ran out of memory (oom_under_load)" in past.user_attrs["failure"]
    assert below.state is TrialState.COMPLETE
    # A config queued by hand runs as asked.
    assert asked.user_attrs["failure_kind"] == "oom_under_load" and "node" in asked.user_attrs
    without = load_study(study_file(file="again.yaml", study="again", n_trials=3, search_space=space))
    again = open_study(without)
    for fraction in (0.93, 0.95):
        again.enqueue_trial({"--mem-fraction-static": fraction})
    again = StudyDriver(without, pool=model_pool(), preflight=False, tracking=False).run()
    assert again.trials[2].user_attrs["failure_kind"] == "oom_under_load"  # launched, and failed
