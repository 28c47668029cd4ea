"""`compare` as a view over rounds stored in the study: its runs are study trials (as confirmation's are),
run by the study loop, resumed when cut short, feeding the noise estimate; on a node answered by the
simulated node's model, real Optuna storage."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from autotune.cli import main
from autotune.config import Study, load_study
from autotune.study.compare import compare, queue_rounds
from autotune.study.loop import StudyDriver
from autotune.study.records import COMPARE_ATTR, NODE_ATTR, REMEASURE_OF_ATTR
from autotune.study.storage import budget_used
from autotune.study.trust.noise import noise_estimate
from tests.builders import TRUST_OFF, StudyFiles, model_pool, one_value_space

CHUNKED = "--chunked-prefill-size"


def _rerun(study: Study) -> object:
    return lambda total: StudyDriver(study, pool=model_pool(noise=0.005), queued_only=True).run(total)


@pytest.fixture
def searched(study_file: StudyFiles) -> tuple[Study, optuna.Study]:
    # The baseline and one config of a knob with an effect (a 512-token chunk costs the seed's node a third).
    path = study_file(n_trials=2, search_space=one_value_space(CHUNKED, 512), trust=TRUST_OFF)
    study = load_study(path)
    return study, StudyDriver(study, pool=model_pool(noise=0.005)).run()


def test_compare_s_rounds_are_study_trials_in_abba_order_and_feed_the_noise(
    searched: tuple[Study, optuna.Study], capsys: pytest.CaptureFixture[str]
) -> None:
    study, optuna_study = searched
    assert noise_estimate(optuna_study) is None  # one measurement of each config
    comparison = compare(study, optuna_study, 2, trial=1, run=_rerun(study))  # type: ignore[arg-type]
    assert [(r.round, r.config) for r in comparison.runs] == [
        (0, "default"), (0, "best"), (1, "best"), (1, "default")
    ]  # fmt: skip
    assert all(r.failure is None and r.metrics["output_throughput"] > 0 for r in comparison.runs)
    assert "mean_ttft_ms" in comparison.summary()  # every figure of the benchmark, read from the trials
    gain = comparison.gain()
    assert gain is not None and gain.verdict == "loss"
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    rounds = [t for t in optuna_study.get_trials() if COMPARE_ATTR in t.user_attrs]
    assert len(rounds) == 4 and all(NODE_ATTR in t.user_attrs for t in rounds)
    assert sorted(t.user_attrs[REMEASURE_OF_ATTR] for t in rounds) == [0, 0, 1, 1]
    # Measured again, both configs give the study its run-to-run noise (2 degrees of freedom each).
    noise = noise_estimate(optuna_study)
    assert noise is not None and noise.dof >= 2
    assert main(["status", str(study.path)]) == 0
    assert "compare round 2: trial 1's config again" in capsys.readouterr().out  # counted from 1


def test_a_compare_cut_short_continues_where_it_stopped(searched: tuple[Study, optuna.Study]) -> None:
    study, optuna_study = searched
    record = queue_rounds(study, optuna_study, 2, trial=1)
    # Two of its four runs, then the command stopped (a Ctrl-C, a lost lease).
    optuna_study = StudyDriver(study, pool=model_pool(), queued_only=True).run(budget_used(optuna_study) + 2)
    assert len(optuna_study.get_trials(states=(TrialState.WAITING,))) == 2
    comparison = compare(study, optuna_study, 2, trial=1, run=_rerun(study))  # type: ignore[arg-type]
    assert len(comparison.runs) == 4 and comparison.gain() is not None
    optuna_study = optuna.load_study(study_name=study.name, storage=study.storage)
    assert optuna_study.user_attrs[COMPARE_ATTR] == [record]  # the same comparison, not a second one
    assert sum(COMPARE_ATTR in t.user_attrs for t in optuna_study.get_trials()) == 4
