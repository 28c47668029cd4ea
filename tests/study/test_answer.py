"""The study's one answer (autotune.study.trust.answer.StudyAnswer): each verdict read from real stores and
from studies run on nodes answered by the simulated node's model, and `best`, `status` and `report` rendering
that one answer alike; confirmation rounds are no search trials in the plots."""

from __future__ import annotations

import html
import json
import statistics
from pathlib import Path

import optuna
import pytest

from autotune.cli import main
from autotune.config import load_study
from autotune.study.loop import StudyDriver
from autotune.study.records import BASELINE_ATTR, CONFIRM_ATTR, REMEASURE_OF_ATTR
from autotune.study.summary import study_summary
from autotune.study.trust.answer import StudyAnswer, study_answer
from autotune.views.plots import optimization_history, plot_data
from tests.builders import StudyFiles, model_pool
from tests.study.test_confirm import run4

# What `best --json` and benchmarks read before the answer was one typed record: still in its record.
OLD_KEYS = {"confirmed", "trial", "leader", "beats_defaults", "value", "gain_pct", "gain_interval_pct"}
OLD_KEYS |= {"rounds", "noise", "text"}


@pytest.fixture(scope="module")
def confirmed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, optuna.Study]:
    trust = {"repeat_baseline_after": 3, "confirm": {"top": 2, "max_rounds": 4}, "stop_early": False}
    path = StudyFiles(tmp_path_factory.mktemp("answer"))(n_trials=10, trust=trust)
    return path, StudyDriver(load_study(path), pool=model_pool(noise=0.01)).run()


def _answer(optuna_study: optuna.Study) -> StudyAnswer:
    answer = study_answer(optuna_study)
    assert answer is not None
    assert OLD_KEYS <= set(answer.record()) and json.loads(json.dumps(answer.record())) == answer.record()
    return answer


def test_confirmed_rests_on_the_rounds_of_the_leader_and_the_defaults(
    confirmed: tuple[Path, optuna.Study],
) -> None:
    _, optuna_study = confirmed
    answer = _answer(optuna_study)
    assert answer.verdict == "confirmed" and answer.trial == answer.leader != answer.baseline == 0
    trials = {t.number: t for t in optuna_study.get_trials(deepcopy=False)}
    rests = [trials[n] for n in answer.trials]
    # The rounds' launches, and the search's launches paired in time that count as a round (issue 37).
    searched = {n: of for pairs in optuna_study.user_attrs[CONFIRM_ATTR]["search_rounds"] for of, n in pairs}
    assert all(CONFIRM_ATTR in t.user_attrs or t.number in searched for t in rests)

    def config(t: optuna.trial.FrozenTrial) -> int:
        return int(t.user_attrs[REMEASURE_OF_ATTR]) if CONFIRM_ATTR in t.user_attrs else searched[t.number]

    of = {n: [t.value for t in rests if config(t) == n] for n in (answer.trial, 0)}
    assert len(of[0]) == len(of[answer.trial]) == answer.rounds >= 2
    assert answer.value == pytest.approx(statistics.fmean(of[answer.trial]))  # type: ignore[arg-type]
    assert answer.baseline_value == pytest.approx(statistics.fmean(of[0]))  # type: ignore[arg-type]
    # The summary's best and baseline are the answer's: one figure for each on any page.
    summary = study_summary(optuna_study)
    assert (summary.best_value, summary.best_trial, summary.baseline_value, summary.gain_pct) == (
        answer.value,
        answer.trial,
        answer.baseline_value,
        answer.gain_pct,
    )


def test_no_gain_under_way_and_unconfirmed_on_the_real_h200_stores(tmp_path: Path) -> None:
    done = _answer(run4(tmp_path / "done", "study.tar.gz"))
    assert done.verdict == "no gain" and done.trial == done.baseline == 0 != done.leader
    assert done.value == done.baseline_value and done.rounds == 5 and done.confidence is not None
    cut = _answer(run4(tmp_path / "cut", "study-cut-short.tar.gz"))
    assert cut.verdict == "under way" and not cut.confirmed and cut.beats_defaults is None
    assert cut.gain_interval_pct is None and cut.trials == (0,)  # the defaults' best single measurement
    stores = Path(__file__).parents[2] / "benchmarks" / "sglang-h200" / "run3" / "study.tar.gz"
    import tarfile

    with tarfile.open(stores) as tar:
        tar.extractall(tmp_path / "run3", filter="data")
    storage = f"sqlite:///{tmp_path / 'run3' / '.autotune' / 'sglang-h200' / 'optuna.db'}"
    optuna_study = optuna.load_study(study_name="sglang-h200", storage=storage)
    single = _answer(optuna_study)
    base = next(t for t in optuna_study.get_trials(deepcopy=False) if t.user_attrs.get(BASELINE_ATTR))
    assert single.verdict == "unconfirmed" and single.trials == (base.number, 29)
    assert single.baseline_value == base.value and single.value == optuna_study.trials[29].value
    assert single.nccl is None and single.rounds == 0


def test_best_status_and_report_render_the_same_answer(
    confirmed: tuple[Path, optuna.Study],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path, optuna_study = confirmed
    answer = _answer(optuna_study)
    assert answer.gain_pct is not None and answer.gain_interval_pct is not None and answer.value is not None
    monkeypatch.setenv("COLUMNS", "1000")  # status wraps at the terminal's width
    assert main(["best", str(path), "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert (record["trial"], record["value"], record["gain_pct"]) == (
        answer.trial,
        answer.value,
        answer.gain_pct,
    )
    assert record["gain_interval_pct"] == list(answer.gain_interval_pct) and record["verdict"] == "confirmed"
    assert record["trials"] == list(answer.trials) and record["text"] == answer.text
    shown = f"output_throughput {answer.value:.1f} tok/s with trial {answer.trial}'s config"
    for command in ("best", "status"):
        assert main([command, str(path)]) == 0
        out = capsys.readouterr().out
        assert f"answer: {answer.text}" in out and shown in out, command
        assert f"baseline output_throughput: {answer.baseline_value:.1f} tok/s" in out
        assert "best output_throughput" not in out, "no second figure beside the answer"
    assert main(["report", str(path), "--out", str(tmp_path / "report")]) == 0
    page = (tmp_path / "report" / "report.html").read_text()
    summary = page.split('<section id="summary">')[1].split("</section>")[0]
    low, high = answer.gain_interval_pct
    assert html.escape(answer.text) in summary
    assert f"{answer.gain_pct:+.1f}% ({answer.confidence:.1%} CI {low:+.1f}% to {high:+.1f}%)" in summary
    assert f"{answer.value:.2f} tok/s (the mean of its confirmation rounds)" in summary
    assert summary.index("answer") < summary.index("baseline (SGLang defaults)")  # it leads
    best = page.split('<section id="best-config">')[1].split("</section>")[0]
    assert f"Trial {answer.trial}: {answer.value:.2f} tok/s" in best


def test_confirmation_rounds_are_no_search_trials_of_the_history_plot(
    confirmed: tuple[Path, optuna.Study],
) -> None:
    _, optuna_study = confirmed
    data = plot_data(optuna_study, "output_throughput", "tok/s")
    assert data.trials and not any(REMEASURE_OF_ATTR in t.user_attrs for t in data.trials)
    searched = max(t.value for t in data.complete() if t.value is not None)
    figure = optimization_history(data)
    assert figure is not None
    line = next(line for line in figure.axes[0].lines if line.get_label() == "best so far")
    assert max(line.get_ydata()) == searched  # type: ignore[arg-type]
