"""`autotune enqueue`: configs a user queues run next, with the values given and the rest at the baseline's
(or a trial's), then the sampler continues; bad configs queue nothing. The command runs through the CLI's
`main`, the trials on nodes the simulated node's model answers, with real Optuna SQLite storage."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import load_study
from autotune.study.callbacks import StudyCallback, TrialStarted
from autotune.study.enqueue import waiting_line
from autotune.study.loop import StudyDriver
from autotune.study.records import DRIVER_ATTR, PROPOSED_ATTR, QUEUED_ATTR, SERVER_CHOICES_ATTR
from autotune.study.samplers import nearest
from autotune.study.storage import finished_count, open_study
from tests.builders import StudyFiles, e2e_study, model_pool
from tests.conftest import run_cli

MEM = "--mem-fraction-static"
# The shipped search space's knobs of a config without speculation, each at the baseline's value.
BASELINE_VALUES = {
    "NCCL_ALGO": None,
    "NCCL_PROTO": None,
    "NCCL_MIN_NCHANNELS": None,
    "NCCL_MAX_NCHANNELS": None,
    "NCCL_BUFFSIZE": None,
    "NCCL_P2P_LEVEL": None,
    "--cuda-graph-max-bs-decode": None,
    "--chunked-prefill-size": None,
    "--max-running-requests": None,
    "--disable-custom-all-reduce": False,
    "--attention-backend": None,
    "--enable-flashinfer-allreduce-fusion": False,
    "--enable-torch-symm-mem": False,
    "--ep-size": None,
    "--speculative-algorithm": None,
}


class Launches(StudyCallback):
    """The launch of every trial handed to a node, in order."""

    def __init__(self) -> None:
        self.started: list[TrialStarted] = []

    def trial_started(self, event: TrialStarted) -> None:
        self.started.append(event)


def run(path: Path, n_trials: int | None = None, launches: Launches | None = None) -> optuna.Study:
    callbacks = [launches] if launches is not None else []
    return StudyDriver(load_study(path), callbacks, pool=model_pool(), tracking=False).run(n_trials)


def enqueue(path: Path, *args: str) -> int:
    return main(["enqueue", str(path), *args])


@pytest.fixture
def after_baseline(study_file: StudyFiles) -> Path:
    """A study of 4 trials whose baseline ran (so SGLang's own memory fraction is known)."""
    path = study_file(n_trials=4)
    run(path, n_trials=1)
    return path


def test_queued_configs_run_next_with_the_values_given_and_the_rest_at_the_baselines(
    after_baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = after_baseline
    assert enqueue(path, f"--set={MEM}=0.85", "--set", "NCCL_ALGO=Ring") == 0
    assert enqueue(path, "--set", "mem-fraction-static=0.8", "--set", "enable-torch-symm-mem") == 0
    out = capsys.readouterr().out
    assert (
        "queued trial 1: --mem-fraction-static=0.85 NCCL_ALGO=Ring; the rest at the baseline's values" in out
    )
    assert "queued trial 2: --mem-fraction-static=0.8 --enable-torch-symm-mem=true;" in out

    launches = Launches()
    optuna_study = run(path, launches=launches)

    first, second = launches.started[0], launches.started[1]  # before any trial the sampler proposes
    assert optuna_study.trials[first.trial.number].params == {
        **BASELINE_VALUES,
        "NCCL_ALGO": "Ring",
        MEM: 0.85,
    }
    assert first.launch.env.get("NCCL_ALGO") == "Ring"
    assert not [k for k in first.launch.env if k.startswith("NCCL_") and k != "NCCL_ALGO"]
    argv = list(first.launch.argv)
    assert argv[argv.index(MEM) + 1] == "0.85"
    # Not tuned: where it goes, and the start-up's own loader flag (study file `startup:`).
    untuned = ("--model-path", "--host", "--port", "--model-loader-extra-config")
    tuned = [a for a in argv if a.startswith("--") and a not in untuned]
    assert tuned == ["--tp-size", MEM], argv  # the study's own flag and the one set: nothing else
    assert optuna_study.trials[second.trial.number].params == {
        **BASELINE_VALUES,
        MEM: 0.8,
        "--enable-torch-symm-mem": True,
    }
    assert "--enable-torch-symm-mem" in second.launch.argv
    for event in (first, second):
        trial = optuna_study.trials[event.trial.number]
        assert trial.state.is_finished()
        assert trial.user_attrs[QUEUED_ATTR]["from_trial"] is None
        assert PROPOSED_ATTR not in trial.system_attrs  # the sampler's plan is not what ran
    assert finished_count(optuna_study) == 4  # they count in the budget: baseline, two queued, one sampled


def test_a_range_left_unset_takes_the_value_sglang_chose_in_the_baseline(
    after_baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chosen = open_study(load_study(after_baseline)).user_attrs[SERVER_CHOICES_ATTR][MEM]
    assert enqueue(after_baseline, "--set", "NCCL_PROTO=LL128") == 0
    expected = nearest(optuna.distributions.FloatDistribution(0.7, 0.95, step=0.01), chosen)
    assert f"{MEM} = {expected}  (SGLang's own choice in the baseline)" in capsys.readouterr().out
    queued = open_study(load_study(after_baseline)).trials[-1]
    assert queued.state is TrialState.WAITING
    assert queued.system_attrs["fixed_params"] == {**BASELINE_VALUES, "NCCL_PROTO": "LL128", MEM: expected}


def test_from_trial_takes_the_rest_from_that_trial(study_file: StudyFiles) -> None:
    path = study_file(n_trials=4)
    optuna_study = run(path)
    source = next(t for t in optuna_study.trials if t.params and t.params.get("NCCL_PROTO") != "LL")

    assert enqueue(path, "--from-trial", str(source.number), "--set", "NCCL_PROTO=LL") == 0

    queued = open_study(load_study(path)).trials[-1]
    assert queued.system_attrs["fixed_params"] == {**source.params, "NCCL_PROTO": "LL"}
    assert queued.user_attrs[QUEUED_ATTR] == {"set": {"NCCL_PROTO": "LL"}, "from_trial": source.number}
    optuna_study = run(path, n_trials=5)
    assert optuna_study.trials[queued.number].params == {**source.params, "NCCL_PROTO": "LL"}


def test_a_configs_file_queues_each_config_in_order(after_baseline: Path) -> None:
    configs = after_baseline.parent / "configs.yaml"
    configs.write_text(
        "configs:\n"
        "  - {--mem-fraction-static: 0.9}\n"
        "  - {NCCL_ALGO: Tree, from_trial: 0, mem-fraction-static: 0.75}\n"
    )
    assert enqueue(after_baseline, "--file", str(configs)) == 0
    waiting = open_study(load_study(after_baseline)).get_trials(states=(TrialState.WAITING,))
    assert [t.system_attrs["fixed_params"][MEM] for t in waiting] == [0.9, 0.75]
    assert waiting[1].system_attrs["fixed_params"]["NCCL_ALGO"] == "Tree"
    assert waiting[1].user_attrs[QUEUED_ATTR]["from_trial"] == 0


def sets(*settings: str) -> list[str]:
    return [f"--set={setting}" for setting in settings]


EAGLE = sets("speculative-algorithm=EAGLE3", "mem-fraction-static=0.8")
BAD = [
    pytest.param(
        ["--set", "mem-fraction-statik=0.9"],
        "study.yaml: --set mem-fraction-statik: not a knob of the study's search space "
        "(sglang-nccl-eagle3.yaml) (got 'mem-fraction-statik'). Did you mean 'mem-fraction-static'?",
        id="unknown-knob",
    ),
    pytest.param(
        [f"--set={MEM}=0.99"],
        "study.yaml: --set --mem-fraction-static: outside the values this knob takes in this config "
        "(numbers 0.7..0.95 in steps of 0.01) (got 0.99). Set one of those, or widen --mem-fraction-static",
        id="beyond-the-range",
    ),
    pytest.param(
        [f"--set={MEM}=0.855"],
        "outside the values this knob takes in this config (numbers 0.7..0.95 in steps of 0.01) (got 0.855)",
        id="off-the-step",
    ),
    pytest.param(
        ["--set", "NCCL_ALGO=Rng", f"--set={MEM}=0.8"],
        "study.yaml: --set NCCL_ALGO: outside the values this knob takes in this config "
        "(one of null, Ring, Tree) (got 'Rng')",
        id="not-a-choice",
    ),
    pytest.param(
        ["--set", "disable-custom-all-reduce=1", f"--set={MEM}=0.8"],
        "(one of False, True) (got 1)",
        id="a-number-for-a-switch",
    ),
    pytest.param(
        ["--set", "speculative-num-steps=3", f"--set={MEM}=0.8"],
        "study.yaml: --set --speculative-num-steps: this config has no --speculative-num-steps: its "
        "condition `when: {--speculative-algorithm: EAGLE3}` does not hold (--speculative-algorithm is "
        "null) (got 3). Set --speculative-algorithm too (EAGLE3)",
        id="when-does-not-hold",
    ),
    pytest.param(
        EAGLE + sets("speculative-num-steps=3", "speculative-eagle-topk=1", "speculative-num-draft-tokens=5"),
        "SGLang's rules leave --speculative-num-draft-tokens out of this config (SGLang sets it to 4 here)",
        id="derived-by-sglang",
    ),
    pytest.param(
        EAGLE
        + sets("speculative-num-steps=1", "speculative-eagle-topk=2", "speculative-num-draft-tokens=16"),
        "--set --speculative-num-draft-tokens: outside the values this knob takes in this config "
        "(integers 2..3) (got 16)",
        id="beyond-the-draft-tree",
    ),
    pytest.param(
        EAGLE,
        "no value for --speculative-num-steps, --speculative-eagle-topk: the search space has no 'leave "
        "it to SGLang' value for it (got {'--speculative-algorithm': 'EAGLE3', '--mem-fraction-static': "
        "0.8}). Set --speculative-num-steps=VALUE --speculative-eagle-topk=VALUE, or take it from a trial",
        id="no-baseline-value",
    ),
    pytest.param(
        ["--from-trial", "99"],
        "study.yaml: --from-trial: study 't' has no such trial (got 99). Pick one of trials 0..0.",
        id="no-such-trial",
    ),
    pytest.param([], "study.yaml: --set: no config to queue (got None)", id="nothing"),
    pytest.param(
        ["--set", "NCCL_ALGO"],
        "--set NCCL_ALGO: no value (got 'NCCL_ALGO'). Write NCCL_ALGO=VALUE",
        id="no-value",
    ),
]


@pytest.mark.parametrize(("args", "message"), BAD)
def test_a_bad_config_says_what_and_queues_nothing(
    after_baseline: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    before = len(open_study(load_study(after_baseline)).trials)
    capsys.readouterr()
    assert enqueue(after_baseline, *args) == 2
    err = capsys.readouterr().err
    assert err.startswith("autotune: error: ") and err.count("\n") == 1, err
    assert message in err
    assert len(open_study(load_study(after_baseline)).trials) == before


def test_one_bad_config_of_a_file_queues_none_of_them(
    after_baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = after_baseline.parent / "configs.yaml"
    configs.write_text("configs:\n  - {--mem-fraction-static: 0.9}\n  - {--mem-fraction-static: 0.96}\n")
    assert enqueue(after_baseline, "--file", str(configs)) == 2
    assert "configs.yaml: configs[1] --mem-fraction-static: outside the values" in capsys.readouterr().err
    assert not open_study(load_study(after_baseline)).get_trials(states=(TrialState.WAITING,))


def test_a_new_study_is_created_with_its_baseline_first_and_a_bad_config_creates_nothing(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_file(n_trials=2)
    database = path.parent / ".autotune" / "t" / "optuna.db"
    assert enqueue(path, "--set", "NCCL_ALGO=Ring") == 2  # no baseline yet: SGLang's memory fraction unknown
    assert "the baseline has not run yet to show SGLang's own choice" in capsys.readouterr().err
    assert not database.exists()

    assert enqueue(path, "--set", "NCCL_ALGO=Ring", f"--set={MEM}=0.85") == 0
    assert "created study 't'" in capsys.readouterr().out
    optuna_study = run(path)
    assert optuna_study.trials[0].user_attrs.get("baseline") is True and optuna_study.trials[0].params == {}
    assert optuna_study.trials[1].params == {**BASELINE_VALUES, "NCCL_ALGO": "Ring", MEM: 0.85}


def test_status_marks_a_trial_queued_by_hand(
    after_baseline: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # a row on one line, its note on the next
    assert enqueue(after_baseline, "--from-trial", "0", f"--set={MEM}=0.85") == 0
    run(after_baseline, n_trials=2)
    capsys.readouterr()
    assert main(["status", str(after_baseline)]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(lines) if line.split()[:1] == ["1"])
    assert lines[row + 1].strip() == "queued by hand: --mem-fraction-static=0.85; the rest from trial 0"
    assert not [line for line in lines if "queued by hand" in line and line is not lines[row + 1]]


def test_a_queued_trial_a_dead_driver_left_running_runs_again_once_and_the_rest_still_run(
    after_baseline: Path,
) -> None:
    path = after_baseline
    assert enqueue(path, f"--set={MEM}=0.85") == 0
    assert enqueue(path, f"--set={MEM}=0.9") == 0
    optuna_study = open_study(load_study(path))
    orphan = optuna_study.ask()  # the first queued config, taken by a driver that then died
    orphan.set_user_attr(DRIVER_ATTR, f"{socket.gethostname()}:1:0")

    optuna_study = run(path)

    interrupted = optuna_study.trials[orphan.number]
    assert interrupted.state is TrialState.FAIL and interrupted.user_attrs["failure_kind"] == "interrupted"
    ran = [
        t
        for t in optuna_study.trials
        if QUEUED_ATTR in t.user_attrs and t.user_attrs.get("failure_kind") != "interrupted"
    ]
    assert sorted(t.params[MEM] for t in ran) == [0.85, 0.9]  # each queued config ran once, none lost
    assert all(t.state.is_finished() for t in ran)
    retry = next(t for t in ran if t.user_attrs.get("retry_of") == orphan.number)
    assert retry.user_attrs[QUEUED_ATTR] == {"set": {MEM: 0.85}, "from_trial": None}
    assert finished_count(optuna_study) == 4  # the interrupted run does not count; the queued configs do


def test_a_config_queued_past_the_start_asks_the_sampler_for_nothing(study_file: StudyFiles) -> None:
    path = study_file(n_trials=13)
    run(path, n_trials=11)  # past the start: the sampler now plans moves from the best trial
    assert enqueue(path, "--from-trial", "0", f"--set={MEM}=0.85") == 0
    assert enqueue(path, "--from-trial", "0", f"--set={MEM}=0.86") == 0
    optuna_study = run(path)
    queued = [t for t in optuna_study.trials if QUEUED_ATTR in t.user_attrs]
    assert [t.params[MEM] for t in queued] == [0.85, 0.86]
    # Every knob is queued: the sampler, which plans a move for most trials now, plans none for these.
    assert [t.system_attrs.get(PROPOSED_ATTR) for t in queued] == [None, None]


@pytest.mark.integration
def test_through_the_command_line_the_simulated_server_is_launched_with_the_queued_config(
    study_file: StudyFiles,
) -> None:
    path = study_file(e2e_study(n_trials=2))
    queued = run_cli("enqueue", str(path), f"--set={MEM}=0.85", "--set", "NCCL_ALGO=Ring", cwd=path.parent)
    assert queued.returncode == 0, queued.stderr
    assert "queued trial 1: --mem-fraction-static=0.85 NCCL_ALGO=Ring" in queued.stdout

    ran = run_cli("run", str(path), "--no-ray", "--no-tracking", cwd=path.parent)
    assert ran.returncode == 0, ran.stderr[-3000:]

    server_log = (
        path.parent / ".autotune" / "e2e" / "nodes" / "local" / "trial-0001" / "server.log"
    ).read_text()
    assert "mem_fraction_static=0.85" in server_log  # what the server itself says it runs with
    status = run_cli("status", str(path), "--json", cwd=path.parent)
    trials = json.loads(status.stdout)["trials"]
    assert trials[1]["params"] == {**BASELINE_VALUES, "NCCL_ALGO": "Ring", MEM: 0.85}
    assert trials[1]["queued"] == {"set": {MEM: 0.85, "NCCL_ALGO": "Ring"}, "from_trial": None}
    assert trials[1]["state"] == "COMPLETE"


def test_from_a_trial_still_waiting_takes_its_queued_values(after_baseline: Path) -> None:
    assert enqueue(after_baseline, f"--set={MEM}=0.85", "--set", "NCCL_ALGO=Tree") == 0
    assert enqueue(after_baseline, "--from-trial", "1", "--set", "NCCL_PROTO=LL") == 0
    waiting = open_study(load_study(after_baseline)).get_trials(states=(TrialState.WAITING,))
    assert waiting[1].system_attrs["fixed_params"] == {
        **BASELINE_VALUES,
        MEM: 0.85,
        "NCCL_ALGO": "Tree",
        "NCCL_PROTO": "LL",
    }


def test_past_the_budget_enqueue_says_exactly_what_runs_the_queued_config(
    after_baseline: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run(after_baseline)  # the budget of 4 spent
    capsys.readouterr()
    assert enqueue(after_baseline, f"--set={MEM}=0.85") == 0
    told = capsys.readouterr().out.splitlines()[-1]
    assert told == (
        "1 trial(s) waiting, but the budget of 4 trials has 4 used, room for 0: "
        f"`autotune resume {after_baseline} --n-trials 5` runs them all"
    )
    optuna_study = run(after_baseline)  # what `autotune run` did: nothing, so it says the same
    assert waiting_line(optuna_study, 4, after_baseline) == told
    optuna_study = run(after_baseline, n_trials=5)  # what the line says to type
    queued = [t for t in optuna_study.trials if QUEUED_ATTR in t.user_attrs]
    assert [(t.params[MEM], t.state.name) for t in queued] == [(0.85, "COMPLETE")]
    assert waiting_line(optuna_study, 5, after_baseline) is None
