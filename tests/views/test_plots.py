"""The study's plots: every one draws a PNG from real Optuna trials, and the tracker logs them as the
parent run's artifacts while the study runs."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution, FloatDistribution
from optuna.trial import TrialState, create_trial

from autotune.trial.memory_fraction import MEM_FRACTION
from autotune.views.plots import (
    CUDA_GRAPH_MAX_BS,
    OLD_CUDA_GRAPH_MAX_BS,
    draw_plots,
    is_oom,
    param_importances,
    plot_data,
    png_bytes,
    save_plots,
    top_params,
)

PNG = b"\x89PNG\r\n\x1a\n"
DISTRIBUTIONS = {
    MEM_FRACTION: FloatDistribution(0.5, 0.95, step=0.01),
    CUDA_GRAPH_MAX_BS: CategoricalDistribution([None, 32, 128, 512]),
    "NCCL_PROTO": CategoricalDistribution([None, "LL", "LL128"]),
}


def _trial(number: int, mem: float, bs: int | None, proto: str | None, value: float | None, kind: str = ""):
    params = {MEM_FRACTION: mem, CUDA_GRAPH_MAX_BS: bs, "NCCL_PROTO": proto}
    attrs = {"failure_kind": kind} if kind else {}
    if kind in ("kv_pool_too_small", "cuda_graph_oom"):
        state, values = TrialState.PRUNED, [0.0]
    elif kind:
        state, values = TrialState.FAIL, None
    else:
        state, values = TrialState.COMPLETE, [value]
    return create_trial(
        state=state, values=values, params=params, distributions=DISTRIBUTIONS, user_attrs=attrs
    )


@pytest.fixture
def study() -> optuna.Study:
    """A throughput study as the driver leaves it: a baseline without parameters, completed trials, OOM
    trials pruned at the penalty, a failed one, and a skipped proposal that never ran."""
    optuna_study = optuna.create_study(direction="maximize", study_name="plots")
    optuna_study.add_trial(
        create_trial(state=TrialState.COMPLETE, value=100.0, user_attrs={"baseline": True})
    )
    for i, (mem, bs, proto, value, kind) in enumerate(
        [
            (0.80, 128, None, 120.0, ""),
            (0.90, 512, "LL", 140.0, ""),
            (0.55, 32, None, None, "kv_pool_too_small"),
            (0.93, 512, "LL128", None, "cuda_graph_oom"),
            (0.85, None, "LL", 135.0, ""),
            (0.75, 32, "LL128", 90.0, ""),
            (0.88, 128, "LL", 138.0, ""),
            (0.70, None, None, None, "nccl_error"),
        ]
    ):
        optuna_study.add_trial(_trial(i + 1, mem, bs, proto, value, kind))
    optuna_study.add_trial(
        create_trial(
            state=TrialState.FAIL,
            params={MEM_FRACTION: 0.8, CUDA_GRAPH_MAX_BS: None, "NCCL_PROTO": None},
            distributions=DISTRIBUTIONS,
            user_attrs={"skipped": True, "failure_kind": "known_incompatible"},
        )
    )
    return optuna_study


def test_every_single_objective_plot_is_drawn_as_png(study: optuna.Study, tmp_path: Path) -> None:
    data = plot_data(study, "output_throughput", "tok/s")
    assert data.baseline == 100.0
    assert all(not t.user_attrs.get("skipped") for t in data.trials), "skipped proposals never ran"
    paths = save_plots(data, tmp_path / "plots")
    assert {p.name for p in paths} == {
        "optimization_history.png",
        "param_importances.png",
        "objective_vs_params.png",
        "memory_region.png",
    }, "no Pareto front for one objective"
    for path in paths:
        assert path.read_bytes().startswith(PNG) and path.stat().st_size > 5000


def test_importances_rank_the_parameters_over_completed_sampled_trials(study: optuna.Study) -> None:
    data = plot_data(study, "output_throughput", "tok/s")
    importances = param_importances(data)
    assert importances is not None and set(importances) == set(DISTRIBUTIONS)
    assert top_params(data, importances) == list(importances)[:3]


def test_too_few_trials_draw_a_note_instead_of_importances() -> None:
    optuna_study = optuna.create_study(direction="maximize", study_name="young")
    optuna_study.add_trial(
        create_trial(state=TrialState.COMPLETE, value=100.0, user_attrs={"baseline": True})
    )
    optuna_study.add_trial(_trial(1, 0.8, 128, None, 110.0))
    data = plot_data(optuna_study, "output_throughput", "tok/s")
    assert param_importances(data) is None
    figures = draw_plots(data)
    assert "param_importances.png" in figures  # a figure that says why there are no bars yet
    text = " ".join(t.get_text() for ax in figures["param_importances.png"].axes for t in ax.texts)
    assert "Not enough completed trials" in text


def test_memory_region_marks_oom_trials_and_needs_both_parameters(study: optuna.Study) -> None:
    data = plot_data(study, "output_throughput", "tok/s")
    figure = draw_plots(data)["memory_region.png"]
    labels = figure.axes[0].get_legend_handles_labels()[1]
    assert {"started and served", "out of GPU memory", "failed otherwise"} <= set(labels)
    assert sum(is_oom(t) for t in data.trials) == 2

    other = optuna.create_study(direction="maximize")
    distribution = {"NCCL_PROTO": CategoricalDistribution([None, "LL"])}
    for value, proto in ((1.0, None), (2.0, "LL")):
        other.add_trial(create_trial(value=value, params={"NCCL_PROTO": proto}, distributions=distribution))
    assert "memory_region.png" not in draw_plots(plot_data(other, "output_throughput", "tok/s"))


def test_memory_region_of_a_study_that_tuned_the_knob_under_its_old_name() -> None:
    # SGLang's spelling before 0.5.15: a study made then still gets its plot.
    old = optuna.create_study(direction="maximize")
    distributions = {
        MEM_FRACTION: DISTRIBUTIONS[MEM_FRACTION],
        OLD_CUDA_GRAPH_MAX_BS: DISTRIBUTIONS[CUDA_GRAPH_MAX_BS],
    }
    for value, bs in ((1.0, 32), (2.0, 128)):
        params = {MEM_FRACTION: 0.8, OLD_CUDA_GRAPH_MAX_BS: bs}
        old.add_trial(create_trial(value=value, params=params, distributions=distributions))
    figure = draw_plots(plot_data(old, "output_throughput", "tok/s"))["memory_region.png"]
    assert figure.axes[0].get_ylabel() == OLD_CUDA_GRAPH_MAX_BS


def test_multi_objective_study_gets_a_pareto_front(tmp_path: Path) -> None:
    optuna_study = optuna.create_study(directions=["maximize", "minimize"], study_name="pareto")
    with pytest.warns(optuna.exceptions.ExperimentalWarning):
        optuna_study.set_metric_names(["output_throughput", "p99_ttft_ms"])
    points = [(100, 50), (120, 60), (90, 40), (110, 70), (130, 90), (80, 45)]
    for throughput, ttft in points:
        optuna_study.add_trial(
            create_trial(
                values=[throughput, ttft],
                params={MEM_FRACTION: 0.8, CUDA_GRAPH_MAX_BS: 128, "NCCL_PROTO": None},
                distributions=DISTRIBUTIONS,
            )
        )
    figures = draw_plots(plot_data(optuna_study, "output_throughput", "tok/s"))
    assert "pareto_front.png" in figures and "optimization_history.png" not in figures
    front = figures["pareto_front.png"].axes[0].lines[0]
    assert sorted(zip(front.get_xdata(), front.get_ydata(), strict=True)) == [
        (90, 40),
        (100, 50),
        (120, 60),
        (130, 90),
    ]
    assert figures["pareto_front.png"].axes[0].get_xlabel().startswith("output_throughput")
    assert png_bytes(figures["pareto_front.png"]).startswith(PNG)


@pytest.mark.integration
def test_the_study_parent_run_carries_the_plots(finished_study) -> None:
    from mlflow.tracking import MlflowClient

    path, proc = finished_study
    assert proc.returncode == 0, proc.stderr[-2000:]
    workdir = path.parent / ".autotune" / "e2e"
    client = MlflowClient(tracking_uri=f"sqlite:///{workdir / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("e2e")
    parent = client.search_runs([experiment.experiment_id], filter_string="tags.`autotune.role` = 'study'")[0]
    names = {Path(a.path).name for a in client.list_artifacts(parent.info.run_id, "plots")}
    assert {"optimization_history.png", "param_importances.png", "memory_region.png"} <= names
    local = Path(client.download_artifacts(parent.info.run_id, "plots/optimization_history.png"))
    assert local.read_bytes().startswith(PNG)


def switch_study(seed: int, n: int = 40) -> optuna.Study:
    """A study where switching EAGLE-3 on carries the whole effect (+10.3 tok/s, as the quickstart's +11%),
    its conditional child a little more, and two knobs none: the memory fraction (a continuous range) and
    the prefill chunk (a categorical)."""
    import random

    rng = random.Random(seed)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed))
    for _ in range(n):
        trial = study.ask()
        on = trial.suggest_categorical("--speculative-algorithm", [None, "EAGLE3"]) == "EAGLE3"
        trial.suggest_float(MEM_FRACTION, 0.7, 0.9)
        trial.suggest_categorical("--chunked-prefill-size", [None, 4096, 8192])
        value = 92.7 + rng.gauss(0, 0.5)
        if on:
            value += 10.3 + 0.3 * trial.suggest_int("--speculative-num-steps", 1, 6)
        study.tell(trial, value)
    return study


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_switch_that_carries_the_effect_is_the_most_important_and_its_child_is_scored(seed: int) -> None:
    # Optuna's default (PED-ANOVA) gave the switch 0.13 to 0.42 here and ranked the memory fraction, which
    # does nothing, first on two of these seeds; the conditional child was left out.
    data = plot_data(switch_study(seed), "output_throughput", "tok/s")
    importances = param_importances(data)
    assert importances is not None
    assert max(importances, key=importances.__getitem__) == "--speculative-algorithm"
    assert importances["--speculative-algorithm"] > 0.8
    assert "--speculative-num-steps" in importances


def test_a_range_that_follows_other_knobs_is_taken_whole() -> None:
    # --speculative-num-draft-tokens' upper end follows the steps: its trials' distributions differ.
    trials = [
        create_trial(
            params={"a": a, "d": d},
            distributions={"a": FloatDistribution(0, 1), "d": optuna.distributions.IntDistribution(2, high)},
            value=a + d,
        )
        for a, d, high in [(0.1, 2, 3), (0.5, 7, 16), (0.9, 12, 15), (0.3, 3, 16), (0.7, 9, 16)]
    ]
    study = optuna.create_study(direction="maximize")
    study.add_trials(trials)
    importances = param_importances(plot_data(study, "output_throughput", "tok/s"))
    assert importances is not None and set(importances) == {"a", "d"}
