"""A budget in node hours (issue 37, item 1): the study file's `budget.node_hours` and `--hours`, each
launch's node seconds in the study, status and MLflow, the search ended with the confirmation's cost kept
back, and the answer when the hours ran out. Run fast on the seed's node answered by the simulated node's
model (its launches cost what the model says a real one would: about 0.2 node h each), real Optuna storage
and a real MLflow store."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from typing import Any

import optuna
import pytest
from mlflow.tracking import MlflowClient
from optuna.trial import FrozenTrial

from autotune.cli import main
from autotune.cli.console import ConsoleReporter
from autotune.config import load_study
from autotune.errors import ConfigError
from autotune.node.node_time import logged_startup_s, node_seconds
from autotune.study.loop import StudyDriver
from autotune.study.records import NODE_S_ATTR
from autotune.study.request import measurement_plan
from autotune.study.trust.answer import study_answer
from autotune.study.trust.node_budget import (
    NodeHours,
    dearest_launch_s,
    launch_s,
    node_hours,
    round_s,
    search_ended_text,
    spent_s,
    step_floor,
)
from autotune.views.tracked import study_tracker
from tests.builders import (
    FLAT,
    StudyFiles,
    launched,
    max_load_objective,
    model_pool,
    stored_trial,
    study_of_trials,
)

# Confirmation kept short: 2 rounds of the leader and the defaults (2 launches a round).
CONFIRM = {"repeat_baseline_after": 0, "confirm": {"top": 1, "min_rounds": 2, "max_rounds": 2}}
CONFIRM_OFF = {"repeat_baseline_after": 0, "confirm": False}


# -- the study file and the flag ---------------------------------------------------------------------------
@pytest.mark.parametrize("hours", [0, -1.5, float("inf")])
def test_a_budget_of_no_hours_names_the_file_the_field_the_value_and_the_fix(
    study_file: StudyFiles, hours: Any
) -> None:
    path = study_file(budget={"node_hours": hours})
    with pytest.raises(ConfigError) as error:
        load_study(path)
    message = str(error.value)
    assert path.name in message and "budget.node_hours" in message
    assert "positive number of hours" in message and "Set node_hours to" in message


def test_node_hours_alone_bound_the_search_and_both_may_be_given(study_file: StudyFiles) -> None:
    alone = load_study(study_file(budget={"node_hours": 2})).file.budget
    assert alone.node_hours == 2 and alone.n_trials is None  # not "2 hours or the default 20 trials"
    both = load_study(study_file(budget={"node_hours": 2, "n_trials": 7})).file.budget
    assert both.node_hours == 2 and both.n_trials == 7


@pytest.mark.parametrize("hours", ["0", "-2", "nan"])
def test_hours_on_the_command_line_are_refused_before_anything_starts(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str], hours: str
) -> None:
    path = study_file(n_trials=2)
    assert main(["run", str(path), "--hours", hours, "--no-ray", "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert "--hours" in err and "positive number of hours" in err and "Pass e.g. --hours 2" in err
    study = load_study(path)
    assert not study.workdir.exists() or not (study.workdir / "optuna.db").exists()  # nothing launched


def test_a_budget_smaller_than_one_measured_launch_is_refused_before_a_launch(study_file: StudyFiles) -> None:
    path = study_file(n_trials=2)
    first = StudyDriver(load_study(path), pool=model_pool()).run()
    launch = launch_s(first)
    assert launch is not None and launch > 0
    spent = spent_s(first)
    small = load_study(study_file(budget={"node_hours": (spent + launch / 2) / 3600, "n_trials": 4}))
    with pytest.raises(ConfigError) as error:
        StudyDriver(small, pool=model_pool()).run()
    message = str(error.value)
    assert "budget.node_hours" in message and "cannot pay for one launch" in message
    assert "autotune resume --hours" in message
    stored = optuna.load_study(study_name=small.name, storage=small.storage)
    assert len(stored.trials) == 2  # no launch was made, and the refused budget not kept
    assert (stored.user_attrs.get("node_budget") or {}).get("hours") is None


def test_hours_too_few_on_the_command_line_are_refused_naming_the_option(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_file(n_trials=2)
    first = StudyDriver(load_study(path), pool=model_pool()).run()
    launch = launch_s(first)
    assert launch is not None
    hours = (spent_s(first) + launch / 2) / 3600
    assert main(["resume", str(path), "--hours", f"{hours:.6f}", "--no-ray", "--no-tracking"]) == 2
    err = capsys.readouterr().err
    assert "--hours" in err and "cannot pay for one launch" in err and "budget.node_hours" not in err


# -- the confirmation's reserve ---------------------------------------------------------------------------
def test_the_reserve_prices_a_launch_at_the_dearest_but_a_nodes_first_which_read_weights_from_disk() -> None:
    # The seed's node with its weights in the page cache: the first launch 0.19 h, later ones 0.06-0.08 h.
    first = stored_trial(value=80.0, node="n", node_s=680.0, baseline=True)
    later = [stored_trial(value=90.0, node="n", node_s=s) for s in (210.0, 290.0, 250.0)]
    assert dearest_launch_s(study_of_trials(first, *later)) == 290.0
    assert dearest_launch_s(study_of_trials(first)) == 680.0  # nothing else measured yet
    # Each node's first launch: a second node's too.
    other = stored_trial(value=85.0, node="m", node_s=700.0)
    assert dearest_launch_s(study_of_trials(first, other, *later)) == 290.0


def test_a_launch_that_wrote_a_presharded_dump_is_priced_as_it_would_run_again() -> None:
    # The seed's node with presharded weights: the baseline loads the checkpoint (240 s) and dumps (306 s),
    # a search launch of a new EP size dumps its own layout; a launch that reads a dump loads in 135 s.
    def dumping(node_s: float, **attrs: object) -> FrozenTrial:
        phases = {"weight_load_s": 546.0, "weight_dump_s": 306.0}
        return stored_trial(value=80.0, node="n", node_s=node_s, startup_phases=phases, **attrs)

    first, new_layout = dumping(680.0, baseline=True), dumping(690.0)
    # Before a launch reads a dump back: its own load less the dump (it still read the whole checkpoint).
    assert dearest_launch_s(study_of_trials(first, new_layout)) == 690.0 - 306.0
    assert dearest_launch_s(study_of_trials(first)) == 680.0 - 306.0
    # After one did: a dump's launch would load in what it took (135 s), so 690 - 546 + 135.
    reread = stored_trial(value=90.0, node="n", node_s=250.0, startup_phases={"weight_load_s": 135.0})
    assert dearest_launch_s(study_of_trials(first, new_layout, reread)) == 690.0 - 546.0 + 135.0
    dear = stored_trial(value=90.0, node="n", node_s=300.0, startup_phases={"weight_load_s": 135.0})
    assert dearest_launch_s(study_of_trials(first, new_layout, reread, dear)) == 300.0  # a dearer config


def test_a_round_prices_each_config_at_its_dearest_launch_but_a_nodes_first(study_file: StudyFiles) -> None:
    # The defaults' first launch read the weights from disk (680 s); their rounds' launches cost 240 s. A
    # round priced at 680 + 260 refused one the hours left paid for (the MoE coder profile under 2x
    # auto_benchmark's hours: 0.11 node h left, a round priced 0.13, costing 0.075).
    trials = [
        stored_trial(value=80.0, node="n", node_s=680.0, baseline=True),
        stored_trial(value=90.0, node="n", node_s=250.0),
        stored_trial(value=80.5, node="n", node_s=240.0, remeasure_of=0, confirm={"round": 0, "position": 0}),
        stored_trial(value=90.5, node="n", node_s=260.0, remeasure_of=1, confirm={"round": 0, "position": 1}),
    ]
    settings = {"baseline": 0, "configs": [1], "queued": 1, "min_rounds": 2, "max_rounds": 3}
    study = load_study(study_file())
    assert round_s(study, study_of_trials(*trials, confirm=settings)) == 240.0 + 260.0
    # A config measured only in a node's first launch is priced at it: nothing cheaper is known.
    assert round_s(study, study_of_trials(*trials[:2], confirm=settings)) == 680.0 + 250.0


def test_the_reserve_keeps_rounds_of_the_defaults_and_the_leader_and_a_spare_launch_at_the_dearest(
    study_file: StudyFiles,
) -> None:
    # The seed's node: the defaults' first launch read the weights from disk (680 s), the search's
    # launches cost 250 and 290 s. Two rounds of the defaults and the leader, and one launch toward a third
    # round, at 290 s (rounds of the runner-up too left a third of the seed's 2x auto_benchmark budget
    # unspent; no spare launch, 5 of 16 of the coder profile's budgeted studies ran out after 2 of 3 rounds).
    study = load_study(study_file(budget={"node_hours": 2.0}, trust={"confirm": {"top": 2, "min_rounds": 2}}))
    trials = [
        stored_trial(value=80.0, node="n", node_s=680.0, baseline=True),
        stored_trial({"--stream-interval": 1}, value=90.0, node="n", node_s=250.0),
        stored_trial({"--stream-interval": 2}, value=95.0, node="n", node_s=290.0),
    ]
    hours = node_hours(study, study_of_trials(*trials))
    assert hours.reserve_s == hours.search_reserve_s == (2 * 2 + 1) * 290.0
    assert node_hours(study, study_of_trials(*trials[:1])).reserve_s == 5 * 680.0  # nothing else yet


def test_a_max_load_reserve_prices_the_rounds_of_the_defaults_and_the_leader_as_each_measured(
    study_file: StudyFiles,
) -> None:
    # 4x L40S under 2x auto_benchmark's node hours (2.91): a search launch whose config passes only the
    # slow rates took 3813 s, the next, at 0.65 req/s, 525 s. Rounds priced at 3813 s a launch kept 5.3
    # node h back with 1.37 left: the search stopped, and trial 1 (0.099 req/s) ended unconfirmed.
    objective = max_load_objective()
    trust = {"confirm": {"top": 2, "min_rounds": 2}}
    study = load_study(study_file(budget={"node_hours": 2.91}, trust=trust, objective=objective))
    trials = [
        stored_trial(value=0.0, node="n", node_s=963.0, baseline=True),
        stored_trial({"--stream-interval": 1}, value=0.099, node="n", node_s=3813.0),
    ]
    stage = {"node_s": 780.0}
    hours = node_hours(study, study_of_trials(*trials, nccl_stage=stage))
    # Trial 1's rounds (and a spare launch of it) cost more than the 4920 s left: nothing to keep whole,
    # and a leader that serves more is cheaper to confirm. The next launch, at the dearest, fits; with
    # less left than it, none does.
    assert hours.search_reserve_s == 2 * (963.0 + 3813.0) + 3813.0 and hours.left_s == 4920.0
    assert hours.reserve_unpaid and hours.search_may_launch()
    assert not replace(hours, spent_s=hours.spent_s + 1200.0).search_may_launch()
    trials.append(stored_trial({"--stream-interval": 2}, value=0.65, node="n", node_s=525.0))
    hours = node_hours(study, study_of_trials(*trials, nccl_stage=stage))
    # The defaults' launch in its rounds stops at half of 0.65 req/s (confirm.defaults_cutoff): priced at
    # the leader's, not at their own search down to the slowest rates (963 s). Above, half of 0.099 lay
    # under the slowest rate tried (1/16): their rounds would search down to it, at 963 s.
    assert hours.search_reserve_s == 2 * (525.0 + 525.0) + 525.0 and not hours.reserve_unpaid
    # The next search launch measures at 0.65 req/s before any slower rate (measure.load_search): priced as
    # the launches that measured at least that (525 s), not as trial 1's walk down the slow rates (3813 s).
    assert hours.next_price_s == 525.0 and hours.search_may_launch()
    assert not replace(hours, spent_s=hours.spent_s + 1300.0).search_may_launch()
    # SGLang's defaults again (the noise's repeat) run their own search down to the slow rates: 963 s, and
    # they keep the reserve even where it is unpaid (they cannot be a leader cheaper to confirm).
    assert hours.defaults_s == 963.0 and not replace(hours, spent_s=hours.spent_s + 900.0).search_may_launch(
        defaults=True
    )
    assert replace(hours, spent_s=hours.spent_s + 900.0).search_may_launch()
    # Output tok/s: every launch at the dearest, as before (a new leader may be a dearer config).
    throughput = load_study(study_file(budget={"node_hours": 2.91}, trust=trust))
    hours = node_hours(throughput, study_of_trials(*trials, nccl_stage=stage))
    assert hours.search_reserve_s == 5 * 3813.0 and not hours.reserve_unpaid and not hours.search_may_launch()


def test_a_search_s_first_launch_priced_at_a_launch_from_disk_keeps_one_round_back(
    study_file: StudyFiles,
) -> None:
    # The coder's node under half the hours an unbudgeted study spends (0.59 node h): the defaults' launch
    # read the weights from disk (296 s; a launch after it costs about 110 s). Every round at 296 s left no
    # search launch, and the study ended with SGLang's defaults and 0.49 node h unspent.
    trust = {"confirm": {"top": 2, "min_rounds": 2}}
    study = load_study(study_file(budget={"node_hours": 0.59}, trust=trust))
    baseline = stored_trial(value=600.0, node="n", node_s=296.0, baseline=True)
    hours = node_hours(study, study_of_trials(baseline))
    assert hours.reserve_s == 5 * 296.0  # the confirmation keeps every round
    assert hours.search_reserve_s == 3 * 296.0 and hours.search_may_launch()  # the search launches once
    searched = stored_trial({"--stream-interval": 1}, value=700.0, node="n", node_s=110.0)
    hours = node_hours(study, study_of_trials(baseline, searched))
    assert hours.search_reserve_s == hours.reserve_s == 5 * 110.0  # priced by a launch after it: every round


def test_the_next_search_launch_is_priced_as_it_would_run_not_at_the_median_of_first_launches(
    study_file: StudyFiles,
) -> None:
    # The defaults' first launch read the weights from disk and wrote the presharded dump (595 s, 306 of
    # them the dump); the median of the launches so far (595 s) would have ended the search a launch early.
    trust = {"confirm": {"top": 2, "min_rounds": 2}}
    study = load_study(study_file(budget={"node_hours": 0.85}, trust=trust))
    dumped = {"weight_load_s": 457.0, "weight_dump_s": 306.0}
    trials = [
        stored_trial(value=80.0, node="n", node_s=595.0, baseline=True, startup_phases=dumped),
        stored_trial({"--stream-interval": 1}, value=90.0, node="n", node_s=206.0,
                     startup_phases={"weight_load_s": 67.0}),
        stored_trial({"--stream-interval": 2}, value=95.0, node="n", node_s=621.0, startup_phases=dumped),
    ]  # fmt: skip
    hours = node_hours(study, study_of_trials(*trials))
    assert hours.launch_s == 595.0
    assert hours.next_launch_s == 621.0 - 457.0 + 67.0  # its dump read back as a launch without one loads
    assert hours.left_s == 0.85 * 3600 - (595.0 + 206.0 + 621.0)
    assert hours.search_may_launch()  # 1638 s left: a launch at 231 s and the reserve's 5 x 231 s
    at_median = NodeHours(0.85, hours.spent_s, hours.launch_s, hours.reserve_s, hours.search_reserve_s)
    assert not at_median.search_may_launch()


def test_after_its_rounds_ran_a_further_search_launch_still_keeps_every_round_back(
    study_file: StudyFiles,
) -> None:
    # A resume given more hours after the confirmation decided: its rounds are paid for, but a search
    # launch may make a new leader, whose rounds are all to run. It spent the hours to the last launch
    # and ran out after 0 of 2 rounds.
    study = load_study(study_file(budget={"node_hours": 1.0}, trust=CONFIRM))
    round_marks = [{"round": r, "position": p} for r in (0, 1) for p in (0, 1)]
    trials = [
        stored_trial(value=80.0, node="n", node_s=600.0, baseline=True),
        stored_trial({"--stream-interval": 1}, value=95.0, node="n", node_s=600.0),
        *(
            stored_trial(value=v, node="n", node_s=600.0, remeasure_of=of, baseline=of == 0, confirm=mark)
            for (of, v), mark in zip(((0, 80.2), (1, 95.1), (1, 95.3), (0, 80.1)), round_marks, strict=True)
        ),
    ]
    settings = {"baseline": 0, "configs": [1], "queued": 2, "since": 1, "min_rounds": 2, "max_rounds": 2}
    hours = node_hours(study, study_of_trials(*trials, confirm=settings))
    assert hours.reserve_s == 0.0  # nothing more to keep for this confirmation
    assert hours.search_reserve_s == 2 * (600.0 + 600.0) + 600.0  # and the spare launch
    assert hours.left_s == 3600.0 - 6 * 600.0 == 0.0 and not hours.search_may_launch()
    more = NodeHours(2.0, hours.spent_s, hours.launch_s, hours.reserve_s, hours.search_reserve_s)
    assert more.search_may_launch()  # 1.0 h left: a launch (600 s), two rounds (2400 s) and the spare
    assert not NodeHours(1.8, hours.spent_s, hours.launch_s, 0.0, hours.search_reserve_s).search_may_launch()


def test_a_budget_that_leaves_no_search_launch_says_so_and_what_a_resume_needs(
    study_file: StudyFiles,
) -> None:
    # 4x L40S, max_load under 2x auto_benchmark's hours: the defaults meet the SLO at no rate, their load
    # search walks down to its floor (0.43 node h), and a reserve of 2.58 outprices the 2.48 left.
    # It said "its share of the node-hour budget is spent" of a search that never launched.
    study = load_study(study_file(budget={"node_hours": 2.91}))
    baseline = stored_trial(value=0.0, node="n", node_s=0.43 * 3600, baseline=True)
    hours = NodeHours(2.91, 0.43 * 3600, 0.43 * 3600, 2.58 * 3600, 2.58 * 3600)
    text = search_ended_text(study, study_of_trials(baseline), hours)
    assert text.startswith("search ended before its first launch: the 2.48 node h left"), text
    assert "(0.43 node h, the median measured) beside the 2.58 kept for confirmation" in text
    offered = float(text.split("--hours ")[1].split("`")[0])
    launches = (offered * 3600 - hours.spent_s - hours.reserve_s) / 0.43 / 3600
    promised = int(text.rsplit("gives the search ", 1)[1].removesuffix(" launches"))
    assert promised == 10 and promised <= launches < promised + 0.05  # 10: this file's stopping rule is off
    searched = stored_trial(value=0.5, node="n", node_s=0.1 * 3600)
    text = search_ended_text(study, study_of_trials(baseline, searched), hours)
    assert text.startswith("search ended: its share of the node-hour budget is spent (0.43 spent of"), text


# -- the search ends with the confirmation's reserve kept --------------------------------------------------
def test_the_search_ends_when_its_hours_are_spent_keeping_what_confirmation_costs(
    study_file: StudyFiles,
) -> None:
    budget_h = 3.0
    study = load_study(study_file(budget={"node_hours": budget_h}, trust=CONFIRM))
    console = io.StringIO()
    driver = StudyDriver(study, [ConsoleReporter(console)], pool=model_pool(noise=0.01))
    optuna_study = driver.run()
    assert driver.stopped is not None and "share of the node-hour budget is spent" in driver.stopped
    trials = sorted(launched(optuna_study), key=lambda t: t.number)
    search = [t for t in trials if "confirm" not in t.user_attrs]
    rounds = [t for t in trials if "confirm" in t.user_attrs]
    search_s = sum(t.user_attrs[NODE_S_ATTR] for t in search)
    median = launch_s(optuna.load_study(study_name=study.name, storage=study.storage))
    assert median is not None
    # Where it stopped: one more search launch would have eaten into the 2 rounds x 2 launches kept back.
    assert search_s / 3600 <= budget_h
    assert len(rounds) == 4  # both rounds ran: the reserve paid for them
    # within the budget (a round's launches vary a little)
    assert spent_s(optuna_study) / 3600 <= budget_h + 0.05
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict in ("confirmed", "no gain") and answer.reason is None
    # The console: the hours spent and left after every trial, with an ETA at this run's pace.
    lines = [
        line.strip() for line in console.getvalue().splitlines() if line.strip().startswith("node hours")
    ]
    assert len(lines) == len(trials)
    assert all(f"spent of {budget_h:.2f}" in line and "left" in line for line in lines)
    assert "kept for confirmation" in lines[0] and "ETA ~" in lines[-1]


def test_without_a_node_hour_budget_the_search_runs_its_trials(study_file: StudyFiles) -> None:
    study = load_study(study_file(n_trials=5, trust=CONFIRM_OFF))
    driver = StudyDriver(study, pool=model_pool())
    optuna_study = driver.run()
    assert len(launched(optuna_study)) == 5 and driver.stopped is None
    assert node_hours(study, optuna_study).budget_h is None


# -- the budget ran out -------------------------------------------------------------------------------------
def test_when_the_hours_run_out_before_the_rounds_the_answer_says_so_and_what_a_resume_buys(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    # A search of 4 launches, then confirmation asked for with a budget that does not pay for one round.
    alike = {"presharded_weights": False}  # every launch after the first costs the same: no dump to write
    path = study_file(n_trials=4, trust=CONFIRM_OFF, startup=alike)
    searched = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    spent_h, launch_h = spent_s(searched) / 3600, (launch_s(searched) or 0.0) / 3600
    budget = {"n_trials": 4, "node_hours": spent_h + 1.5 * launch_h}
    path = study_file(budget=budget, trust=CONFIRM, startup=alike)
    study = load_study(path)
    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    assert len(launched(optuna_study)) == 4  # no round: a round is 2 launches
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict == "unconfirmed" and answer.reason == "budget ran out"
    said = "unconfirmed: the budget ran out after 0 of 2 rounds; `autotune resume --hours"
    assert answer.text.startswith(said)
    assert "under way" not in answer.text
    assert main(["best", str(path)]) == 0
    assert "the budget ran out after 0 of 2 rounds" in capsys.readouterr().out
    # What it says a resume buys is what a resume with those hours does: both rounds, an answer.
    hours = float(answer.text.split("--hours ")[1].split("`")[0])
    again = load_study(study_file(budget={"n_trials": 4, "node_hours": hours}, trust=CONFIRM, startup=alike))
    optuna_study = StudyDriver(again, pool=model_pool(noise=0.01)).run()
    answer = study_answer(optuna_study)
    assert answer is not None and answer.verdict in ("confirmed", "no gain") and answer.rounds == 2
    assert answer.reason is None and spent_s(optuna_study) / 3600 <= hours


def test_rounds_cut_short_by_the_hours_before_they_decided_are_no_answer_of_no_gain(
    study_file: StudyFiles,
) -> None:
    """Two rounds paid for, the third not: after two rounds of a flat space the gain's interval still
    spans tens of percent on both sides of zero, which decides nothing. The answer says the budget ran out
    (`autotune run examples/quickstart.yaml --hours 0.9` said "no config beat SGLang's defaults" from an
    interval of -264% to +268%)."""
    confirm = {"repeat_baseline_after": 0, "confirm": {"top": 1, "min_rounds": 2, "max_rounds": 3}}
    alike = {"presharded_weights": False}  # every launch after the first costs the same: no dump to write
    path = study_file(n_trials=4, trust=CONFIRM_OFF, search_space=FLAT, startup=alike)
    searched = StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()
    spent_h, launch_h = spent_s(searched) / 3600, (launch_s(searched) or 0.0) / 3600
    budget = {"n_trials": 4, "node_hours": spent_h + 5.5 * launch_h}  # 2 rounds of 2 launches, not a third
    study = load_study(study_file(budget=budget, trust=confirm, search_space=FLAT, startup=alike))
    optuna_study = StudyDriver(study, pool=model_pool(noise=0.01)).run()
    assert len(launched(optuna_study)) == 8
    answer = study_answer(optuna_study)
    assert answer is not None and answer.gain_interval_pct is not None
    low, high = answer.gain_interval_pct
    assert low < 0 < high and high - low > 2.0  # undecided: not the target's 1% either side
    assert answer.verdict == "unconfirmed" and answer.reason == "budget ran out"
    said = "unconfirmed: the budget ran out after 2 of 3 rounds; `autotune resume --hours"
    assert answer.text.startswith(said)
    # Its value is still the rounds' mean, and the console says so.
    from autotune.cli.answers import answer_lines

    lines = answer_lines(answer, study)
    assert lines[0].endswith("(SGLang's defaults, the mean of its confirmation rounds)")
    assert lines[2].endswith("(the mean of its confirmation rounds)")


def test_a_leader_ahead_in_every_round_by_more_than_the_noise_is_the_answer_when_the_hours_ran_out() -> None:
    """The MoE coder profile under 2x auto_benchmark's hours (peers, seed 9): two rounds, the second split by
    a machine change, so the rounds' own interval spans -33% to +136%; the leader was ahead by 50% and 53%.
    The answer is the leader, unconfirmed, not "use SGLang's defaults"; ahead by less than two runs of one
    config differ, the defaults stay."""

    def cut_short(leader_values: tuple[float, float]) -> optuna.Study:
        marks = [{"round": r, "position": p} for r in (0, 1) for p in (0, 1)]
        rounds = ((0, 0.507), (1, leader_values[0]), (1, leader_values[1]), (0, 0.528))
        trials = [
            stored_trial(value=0.513, node="n", node_s=294.0, baseline=True),
            stored_trial(value=0.514, node="n", node_s=97.0, baseline=True, remeasure_of=0),
            stored_trial({"--stream-interval": 1}, value=0.786, node="n", node_s=88.0),
            *(
                stored_trial(
                    {"--stream-interval": 1} if of else None,
                    value=v,
                    node="n",
                    node_s=90.0,
                    remeasure_of=2 if of else 0,
                    baseline=not of,
                    confirm=mark,
                )
                for (of, v), mark in zip(rounds, marks, strict=True)
            ),
        ]
        settings = {
            "baseline": 0, "configs": [2], "queued": 2, "since": 2, "min_rounds": 2, "max_rounds": 6,
            "confidence": 0.95, "target_pct": 1.0, "pool_noise": True,
        }  # fmt: skip
        budget = {"hours": 0.2, "spent_h": 0.2, "ran_out": {"rounds": 2, "of": 3, "round_h": 0.05}}
        return study_of_trials(*trials, confirm=settings, node_budget=budget)

    answer = study_answer(cut_short((0.773, 0.786)))
    assert answer is not None and answer.verdict == "unconfirmed" and answer.reason == "budget ran out"
    assert answer.trial == answer.leader == 2 and answer.value == pytest.approx((0.773 + 0.786) / 2)
    assert answer.text.startswith("unconfirmed: the budget ran out after 2 of 3 rounds; `autotune resume")
    assert "the best so far: trial 2's config, ahead of SGLang's defaults by +48.9% to +52.5% in each" in (
        answer.text
    ), answer.text
    assert "but not confirmed (" in answer.text and "use SGLang's defaults" not in answer.text
    # Ahead by 0.2% and 0.4%, within what two runs of one config differ: the defaults stay the answer.
    close = study_answer(cut_short((0.508, 0.530)))
    assert close is not None and close.verdict == "unconfirmed" and close.trial == 0
    assert "use SGLang's defaults" in close.text


# -- node seconds in the study, status and MLflow -----------------------------------------------------------
def test_every_launch_records_its_node_seconds_in_status_and_mlflow(
    study_file: StudyFiles, capsys: pytest.CaptureFixture[str]
) -> None:
    path = study_file(budget={"n_trials": 3, "node_hours": 5}, trust=CONFIRM_OFF)
    study = load_study(path)
    optuna_study = StudyDriver(study, pool=model_pool(), tracking=study_tracker).run()
    seconds = {t.number: t.user_attrs[NODE_S_ATTR] for t in launched(optuna_study)}
    assert len(seconds) == 3 and max(seconds.values()) > 150  # the model's seconds, not the test's clock

    assert main(["status", str(path), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {t["number"]: t["node_s"] for t in status["trials"]} == seconds
    assert status["node_hours"]["spent"] == pytest.approx(sum(seconds.values()) / 3600)
    assert status["node_hours"]["budget"] == 5
    assert main(["status", str(path)]) == 0
    assert f"node hours: {sum(seconds.values()) / 3600:.2f} spent of 5.00" in capsys.readouterr().out

    client = MlflowClient(tracking_uri=study.tracking_uri)
    experiment = client.get_experiment_by_name(study.name)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    trials = {int(r.data.tags["autotune.trial"]): r for r in runs if "autotune.trial" in r.data.tags}
    assert {n: trials[n].data.metrics["node_s"] for n in seconds} == pytest.approx(seconds)
    parent = next(r for r in runs if "autotune.trial" not in r.data.tags)
    assert parent.data.metrics["node_hours"] == pytest.approx(sum(seconds.values()) / 3600)

    # The report: the hours in the answer's rows, and each trial's in its table.
    from autotune.views.report import _trials_html, study_findings

    findings = study_findings(study, optuna_study)
    assert dict(findings.answer_rows())["node hours"].startswith(f"{sum(seconds.values()) / 3600:.2f} spent")
    table = _trials_html(findings)
    assert "<th>node h</th>" in table
    assert all(f"<td class='num'>{s / 3600:.2f}</td>" in table for s in seconds.values())


# -- the node's own clock ---------------------------------------------------------------------------------
SIM_LOG = """\
[2026-12-05 00:40:01 TP0] Init torch distributed ends. elapsed=15.00 s, mem usage=0.51 GB
[2026-12-05 00:40:01 TP1] Init torch distributed ends. elapsed=15.00 s, mem usage=0.51 GB
Loading safetensors checkpoint shards: 100% Completed | 64/64 [10:01<00:00,  9.39s/it]
[2026-12-05 00:40:02 TP0] Load weight end. elapsed=601.00 s, type=KimiK25ForConditionalGeneration
[2026-12-05 00:40:02 TP1] Load weight end. elapsed=600.50 s, type=KimiK25ForConditionalGeneration
[2026-12-05 00:40:02 TP0] Capture cuda graph end. Time elapsed: 21.00 s. mem usage=1.20 GB
[2026-12-05 00:40:03] The server is fired up and ready to roll!
"""


def test_a_scaled_node_is_counted_in_its_own_clock_and_a_real_one_by_the_stopwatch() -> None:
    assert logged_startup_s(SIM_LOG) == pytest.approx(15 + 601 + 21)  # each phase once, not once a rank
    # A simulated node at a thousandth of real time: 0.7 s on the stopwatch, 637 s in its log; its benchmark
    # took 2.5 s on the stopwatch, of which 100 s served at a fiftieth of real time (2 s) and 0.5 s the
    # client's own: 100.5 s of the node's.
    assert node_seconds(0.7, 2.5, SIM_LOG, 0.02, 100.0) == pytest.approx(637 + 100.5)
    # A real node: the phases lie within the stopwatch's start-up, and the time scale is 1.
    assert node_seconds(700.0, 90.0, SIM_LOG, 1.0, 85.0) == pytest.approx(790)
    assert node_seconds(None, None, "", None) is None


# -- the stopping rule in node hours (issue 37 item 2) ------------------------------------------------------
def test_a_flat_search_stops_when_its_last_stretch_of_node_hours_gained_no_more_than_the_noise(
    study_file: StudyFiles,
) -> None:
    trust = {
        "repeat_baseline_after": 2,
        "confirm": False,
        "screen": False,  # the stopping rule alone (screening would hold both knobs)
        # Seed-node launches of about 0.2 node h: a stretch of 5 launches (the fewest) after 1 node h.
        "stop_early": {"min_trials": 100, "patience": 100, "min_node_hours": 1.0, "patience_node_hours": 1.0},
    }
    defaults = load_study(study_file(n_trials=30, trust=None)).file.trust.stop_early
    assert (defaults.min_node_hours, defaults.patience_node_hours) == (2.5, 2.0)  # beside (20, 15)
    off = load_study(study_file(n_trials=30, trust={"stop_early": {"patience_node_hours": None}}))
    assert off.file.trust.stop_early.patience_node_hours is None
    # One loader thread, as the seed's SGLang loaded, every launch from disk: about 0.2 node h a launch.
    startup = {"weight_loading_threads": 1, "presharded_weights": False, "weights_in_page_cache": False}
    study = load_study(study_file(n_trials=30, search_space=FLAT, trust=trust, startup=startup))
    driver = StudyDriver(study, pool=model_pool(noise=0.01))
    optuna_study = driver.run()
    assert driver.stopped is not None and "node hours of search" in driver.stopped
    assert "within the run-to-run noise band" in driver.stopped
    trials = launched(optuna_study)
    # The trial counts (100, 100) would never have stopped it: the hours did, soon after their minimum.
    assert len(trials) < 15 and spent_s(optuna_study) / 3600 >= 1.0


def test_a_load_search_step_gets_at_most_a_tenth_of_the_node_hours_left(study_file: StudyFiles) -> None:
    objective = max_load_objective()  # 8 prompts a step
    study = load_study(study_file(budget={"node_hours": 0.5}, objective=objective))
    optuna_study = study_of_trials(stored_trial(value=0.0, node="n", node_s=1000.0, baseline=True))
    floor = step_floor(study, optuna_study)
    assert floor == pytest.approx(8 / (0.1 * (1800.0 - 1000.0)))  # a step of 8 prompts in 80 s
    optuna_study.enqueue_trial({}, user_attrs={})
    plan = measurement_plan(study, optuna_study, optuna_study.ask(), baseline=False).load_search
    assert (
        plan is not None and plan.budget_floor == pytest.approx(floor) and plan.floor == pytest.approx(floor)
    )
    unbudgeted = load_study(study_file(objective=objective))
    assert step_floor(unbudgeted, optuna_study) is None
    throughput = load_study(study_file(budget={"node_hours": 0.5}))
    assert step_floor(throughput, optuna_study) is None
