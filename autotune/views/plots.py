"""A study's plots, drawn with matplotlib (Agg, no pyplot state) from its Optuna trials.

`draw_plots` returns the figures a person looks at first: the optimization history against the baseline,
which parameters mattered, the objective against those parameters, the memory region where the server
starts (out-of-memory trials marked), and the Pareto front when the study has several objectives. The
tracker logs them as parent-run artifacts while the study runs; the report and the notebook show them.
"""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from matplotlib.figure import Figure
from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from autotune.measure.metrics import maximizes
from autotune.study.records import TrialRecord
from autotune.study.rules import baseline_trial, non_dominated
from autotune.trial.memory_fraction import MEM_FRACTION

CUDA_GRAPH_MAX_BS = "--cuda-graph-max-bs-decode"
OLD_CUDA_GRAPH_MAX_BS = "--cuda-graph-max-bs"  # SGLang's name before 0.5.15: a study that tuned it
MIN_IMPORTANCE_TRIALS = 4  # completed trials with sampled parameters; fewer say nothing about importance
TOP_PARAMS = 3
DPI = 110

# One look per outcome, in every plot.
COMPLETE_STYLE: dict[str, Any] = {"color": "#1f77b4", "marker": "o"}
BASELINE_STYLE: dict[str, Any] = {"color": "#555555", "linestyle": "--", "linewidth": 1.2}
OOM_STYLE: dict[str, Any] = {"color": "#d62728", "marker": "x", "s": 46, "linewidths": 1.6}
FAILED_STYLE: dict[str, Any] = {"color": "#7f7f7f", "marker": "v", "s": 30}


@dataclass(frozen=True)
class PlotData:
    """What every plot reads: the trials that ran on a node, and how to label the objective."""

    trials: tuple[FrozenTrial, ...]
    directions: tuple[StudyDirection, ...]
    metric: str
    unit: str
    baseline: float | None
    title: str
    objective_names: tuple[str, ...] = ()

    @property
    def maximize(self) -> bool:
        return maximizes(self.directions[0])

    @property
    def label(self) -> str:
        return f"{self.metric} ({self.unit})" if self.unit else self.metric

    def complete(self) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state == TrialState.COMPLETE and t.values is not None]

    def failed(self) -> list[FrozenTrial]:
        return [t for t in self.trials if t.state in (TrialState.PRUNED, TrialState.FAIL)]


def plot_data(optuna_study: optuna.Study, metric: str, unit: str, title: str | None = None) -> PlotData:
    """Read a study's trials once for all plots; proposals that never ran (skipped) are left out, and so are
    the measurements of a config again (confirmation rounds, re-measurements, the baseline's repeats): no
    search trial, so neither a point of the history nor a rise of its best so far."""
    trials = tuple(
        t
        for t in optuna_study.get_trials(deepcopy=False)
        if t.state.is_finished() and not TrialRecord.of(t).skipped and TrialRecord.of(t).remeasure_of is None
    )
    base = baseline_trial(optuna_study) if len(optuna_study.directions) == 1 else None
    return PlotData(
        trials=trials,
        directions=tuple(optuna_study.directions),
        metric=metric,
        unit=unit,
        baseline=base.value if base is not None else None,
        title=title or optuna_study.study_name,
        objective_names=tuple(optuna_study.metric_names or ()),
    )


def is_oom(trial: FrozenTrial) -> bool:
    """True when the trial ran out of GPU memory (by its recorded failure kind)."""
    kind = TrialRecord.of(trial).failure_kind
    return kind is not None and kind.is_oom


def draw_plots(data: PlotData) -> dict[str, Figure]:
    """Every plot that applies to the study, by file name (`optimization_history.png`, ...)."""
    importances = param_importances(data)
    figures: dict[str, Figure | None] = {
        "optimization_history.png": optimization_history(data),
        "param_importances.png": importance_figure(data, importances),
        "objective_vs_params.png": objective_vs_params(data, top_params(data, importances)),
        "memory_region.png": memory_region(data),
        "pareto_front.png": pareto_front(data),
    }
    return {name: figure for name, figure in figures.items() if figure is not None}


def save_plots(data: PlotData, folder: Path) -> list[Path]:
    """Draw every plot into `folder` as PNG files; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, figure in draw_plots(data).items():
        path = folder / name
        figure.savefig(path, dpi=DPI)
        paths.append(path)
    return paths


def png_bytes(figure: Figure) -> bytes:
    """The figure as PNG bytes (for embedding)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


# -- the plots ------------------------------------------------------------------------------------------
def optimization_history(data: PlotData) -> Figure | None:
    """Each trial's value, the best so far, the baseline as a line, failures marked along the bottom."""
    if len(data.directions) != 1:
        return None
    figure = Figure(figsize=(8, 4.2), layout="constrained")
    ax = figure.subplots()
    complete = data.complete()
    if complete:
        ax.scatter(
            [t.number for t in complete],
            [_value(t) for t in complete],
            label="complete",
            zorder=3,
            **COMPLETE_STYLE,
        )
        best: list[float] = []
        for trial in sorted(complete, key=lambda t: t.number):
            value = _value(trial)
            best.append(value if not best else (max if data.maximize else min)(best[-1], value))
        ax.step(
            [t.number for t in sorted(complete, key=lambda t: t.number)],
            best,
            where="post",
            color=COMPLETE_STYLE["color"],
            alpha=0.6,
            label="best so far",
        )
    if data.baseline is not None:
        ax.axhline(data.baseline, label=f"baseline (SGLang defaults) {data.baseline:.1f}", **BASELINE_STYLE)
    _failure_rug(ax, data.failed(), x=lambda t: float(t.number))
    ax.set_xlabel("trial")
    ax.set_ylabel(data.label)
    ax.set_title(f"{data.title}: optimization history")
    _finish(ax, complete or data.failed(), data.baseline)
    return figure


def param_importances(data: PlotData) -> dict[str, float] | None:
    """Each parameter's share of the variance of the objective over completed trials with sampled
    parameters (fANOVA, seeded), or None when there are too few of them (the baseline samples nothing, so it
    is left out).

    fANOVA, not Optuna's default PED-ANOVA: PED-ANOVA compares the top tenth of the trials (a handful in a
    study of tens) with the rest, and a continuous knob's few top values make a sharp density that outscores
    a switch, whose two values can diverge only so far: switching EAGLE-3 on for +11% scored about 0. A
    conditional knob (speculative steps, only with speculation on) counts too: where it is inactive it is
    filled with the middle of the values it took when active (`filled_in`), so it stands for its own values
    and not for the switch that turns it on."""
    trials = [t for t in data.complete() if t.params]
    if len(data.directions) != 1 or len(trials) < MIN_IMPORTANCE_TRIALS:
        return None
    filled = filled_in(trials)
    if filled is None:
        return None
    # A parameter that kept one value in every trial explains nothing; evaluators still give it a share.
    varied = sorted(name for name in filled[0].params if len({repr(t.params[name]) for t in filled}) > 1)
    if not varied:
        return None
    scratch = optuna.create_study(directions=list(data.directions))
    scratch.add_trials(filled)
    evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)  # the same study, the same plot
    try:
        found = optuna.importance.get_param_importances(scratch, evaluator=evaluator, params=varied)
        return {name: float(share) for name, share in found.items()}
    except (RuntimeError, ValueError, ZeroDivisionError):  # no spread in values
        return None


def filled_in(trials: Sequence[FrozenTrial]) -> list[FrozenTrial] | None:
    """The trials with every parameter any of them has: where a conditional one is inactive, the middle of
    its active values (the median's nearest value; a categorical's most common). A range that follows other
    knobs (--speculative-num-draft-tokens' upper end follows the steps) is taken whole; a parameter whose
    trials disagree on its kind is left out. None when no trial is left."""
    distributions: dict[str, BaseDistribution | None] = {}
    values: dict[str, list[Any]] = {}
    for trial in trials:
        for name, value in trial.params.items():
            seen = distributions.get(name, trial.distributions[name])
            distributions[name] = seen and _union(seen, trial.distributions[name])
            values.setdefault(name, []).append(value)
    kept = {name: d for name, d in distributions.items() if d is not None}
    if not kept:
        return None
    fill = {name: _middle(values[name], distribution) for name, distribution in kept.items()}
    return [
        optuna.trial.create_trial(
            params={**fill, **{k: v for k, v in trial.params.items() if k in kept}},
            distributions=kept,
            values=trial.values,
        )
        for trial in trials
    ]


def _union(a: BaseDistribution, b: BaseDistribution) -> BaseDistribution | None:
    """One distribution that holds the values of both, or None when they are of different kinds."""
    if a == b:
        return a
    if isinstance(a, CategoricalDistribution) and isinstance(b, CategoricalDistribution):
        return CategoricalDistribution([*a.choices, *(c for c in b.choices if c not in a.choices)])
    same_kind = type(a) is type(b) and getattr(a, "step", None) == getattr(b, "step", None)
    if same_kind and isinstance(a, IntDistribution | FloatDistribution):
        assert isinstance(b, IntDistribution | FloatDistribution)
        return type(a)(min(a.low, b.low), max(a.high, b.high), log=a.log, step=a.step)  # type: ignore[arg-type]
    return None


def _middle(values: list[Any], distribution: BaseDistribution) -> Any:
    if isinstance(distribution, CategoricalDistribution):
        counts = Counter(repr(v) for v in values)
        return next(v for v in values if counts[repr(v)] == max(counts.values()))
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


def importance_figure(data: PlotData, importances: Mapping[str, float] | None) -> Figure | None:
    """Horizontal bars, most important on top; a note instead while too few trials have completed. None
    for a multi-objective study."""
    if len(data.directions) != 1:
        return None
    figure = Figure(figsize=(8, 4.2), layout="constrained")
    ax = figure.subplots()
    ax.set_title(f"{data.title}: parameter importances")
    if not importances:
        have = len([t for t in data.complete() if t.params])
        ax.text(
            0.5,
            0.5,
            f"Not enough completed trials with sampled parameters yet ({have} of {MIN_IMPORTANCE_TRIALS}).",
            ha="center",
            va="center",
            transform=ax.transAxes,
            wrap=True,
        )
        ax.set_axis_off()
        return figure
    items = sorted(importances.items(), key=lambda kv: kv[1])[-12:]
    ax.barh([name for name, _ in items], [share for _, share in items], color=COMPLETE_STYLE["color"])
    ax.set_xlabel(f"importance for {data.metric} (share of its variance, fANOVA)")
    ax.grid(axis="x", alpha=0.3)
    return figure


def top_params(data: PlotData, importances: Mapping[str, float] | None, k: int = TOP_PARAMS) -> list[str]:
    """The `k` most important parameters; before importances exist, those whose values varied most."""
    if importances:
        return list(importances)[:k]
    seen: dict[str, set[str]] = {}
    for trial in data.complete():
        for name, value in trial.params.items():
            seen.setdefault(name, set()).add(repr(value))
    varied = sorted((name for name in seen if len(seen[name]) > 1), key=lambda n: -len(seen[n]))
    return varied[:k]


def objective_vs_params(data: PlotData, params: Sequence[str]) -> Figure | None:
    """The objective against each of `params`: completed trials as points, failures along the bottom."""
    if len(data.directions) != 1 or not params:
        return None
    figure = Figure(figsize=(4.2 * len(params), 3.8), layout="constrained")
    axes = figure.subplots(1, len(params), squeeze=False)[0]
    for ax, name in zip(axes, params, strict=True):
        axis = _ParamAxis.of(name, data.trials)
        complete = [t for t in data.complete() if name in t.params]
        ax.scatter(
            [axis.position(t.params[name]) for t in complete],
            [_value(t) for t in complete],
            zorder=3,
            label="complete",
            **COMPLETE_STYLE,
        )
        if data.baseline is not None:
            ax.axhline(data.baseline, label="baseline", **BASELINE_STYLE)
        _failure_rug(
            ax,
            [t for t in data.failed() if name in t.params],
            x=lambda t, n=name, a=axis: a.position(t.params[n]),
        )
        axis.label(ax)
        ax.set_xlabel(name)
        ax.set_ylabel(data.label)
        _finish(ax, complete, data.baseline)
    figure.suptitle(f"{data.title}: {data.metric} against the most important parameters")
    return figure


def memory_region(data: PlotData) -> Figure | None:
    """Where the server starts: mem-fraction-static against the decode CUDA graph batch, OOM trials marked.

    None when the search space tunes neither; trials that leave mem-fraction-static to SGLang are not shown
    (SGLang picks it from the GPU and the other flags)."""
    names = {name for t in data.trials for name in t.params}
    graph = next((n for n in (CUDA_GRAPH_MAX_BS, OLD_CUDA_GRAPH_MAX_BS) if n in names), None)
    if MEM_FRACTION not in names or graph is None:
        return None
    figure = Figure(figsize=(8, 4.6), layout="constrained")
    ax = figure.subplots()
    y_axis = _ParamAxis.of(graph, data.trials)
    placed = [t for t in data.trials if t.params.get(MEM_FRACTION) is not None and graph in t.params]

    def xy(trials: list[FrozenTrial]) -> tuple[list[float], list[float]]:
        return (
            [float(t.params[MEM_FRACTION]) for t in trials],
            [y_axis.position(t.params[graph]) for t in trials],
        )

    complete = [t for t in placed if t.state == TrialState.COMPLETE]
    oom = [t for t in placed if is_oom(t)]
    other = [t for t in placed if t not in complete and t not in oom]
    if complete:
        x, y = xy(complete)
        points = ax.scatter(
            x,
            y,
            c=[_value(t) for t in complete],
            cmap="viridis",
            marker="o",
            s=60,
            zorder=3,
            edgecolors="black",
            linewidths=0.4,
            label="started and served",
        )
        figure.colorbar(points, ax=ax, label=data.label)
    if oom:
        x, y = xy(oom)
        ax.scatter(x, y, zorder=4, label="out of GPU memory", **OOM_STYLE)
    if other:
        x, y = xy(other)
        ax.scatter(x, y, zorder=4, label="failed otherwise", **FAILED_STYLE)
    y_axis.label(ax, axis="y")
    ax.set_xlabel(MEM_FRACTION)
    ax.set_ylabel(graph)
    ax.set_title(f"{data.title}: memory, where the server starts")
    ax.grid(alpha=0.3)
    if placed:
        ax.legend(loc="best", fontsize="small")
    else:
        ax.text(
            0.5, 0.5, "No trial set both parameters yet.", ha="center", va="center", transform=ax.transAxes
        )
    return figure


def pareto_front(data: PlotData) -> Figure | None:
    """The first two objectives of a multi-objective study, its Pareto-optimal trials joined; None for one."""
    if len(data.directions) < 2:
        return None
    complete = [t for t in data.complete() if len(t.values) >= 2]
    front = non_dominated(complete, data.directions[:2])
    figure = Figure(figsize=(6.5, 4.6), layout="constrained")
    ax = figure.subplots()
    ax.scatter(
        [t.values[0] for t in complete], [t.values[1] for t in complete], color="#aaaaaa", label="trials"
    )
    ordered = sorted(front, key=lambda t: t.values[0])
    ax.plot(
        [t.values[0] for t in ordered],
        [t.values[1] for t in ordered],
        marker="o",
        zorder=3,
        color=OOM_STYLE["color"],
        label="Pareto front",
    )
    names = list(data.objective_names) if len(data.objective_names) >= 2 else ["objective 0", "objective 1"]
    ax.set_xlabel(f"{names[0]} ({data.directions[0].name.lower()})")
    ax.set_ylabel(f"{names[1]} ({data.directions[1].name.lower()})")
    ax.set_title(f"{data.title}: Pareto front")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    return figure


# -- helpers --------------------------------------------------------------------------------------------
def _value(trial: FrozenTrial) -> float:
    """A completed trial's (first) objective value; complete() guarantees there is one."""
    return float(trial.values[0]) if trial.values else math.nan


@dataclass(frozen=True)
class _ParamAxis:
    """Where a parameter's values go on an axis: numbers as they are, choices in the search space's order."""

    name: str
    choices: tuple[Any, ...] | None

    @classmethod
    def of(cls, name: str, trials: Sequence[FrozenTrial]) -> _ParamAxis:
        distribution: BaseDistribution | None = next(
            (t.distributions[name] for t in trials if name in t.distributions), None
        )
        if isinstance(distribution, CategoricalDistribution):
            return cls(name, tuple(distribution.choices))
        return cls(name, None)

    def position(self, value: Any) -> float:
        if self.choices is None:
            return float(value)
        for index, choice in enumerate(self.choices):
            if choice is value or (choice == value and type(choice) is type(value)):
                return float(index)
        return float("nan")

    def label(self, ax: Any, axis: str = "x") -> None:
        if self.choices is None:
            return
        ticks = list(range(len(self.choices)))
        labels = ["default" if c is None else str(c) for c in self.choices]
        if axis == "x":
            ax.set_xticks(ticks, labels, rotation=30 if len(labels) > 4 else 0)
            ax.set_xlim(-0.5, len(labels) - 0.5)
        else:
            ax.set_yticks(ticks, labels)
            ax.set_ylim(-0.5, len(labels) - 0.5)


def _failure_rug(ax: Any, trials: Sequence[FrozenTrial], x: Any) -> None:
    """Failed trials as marks along the bottom edge: their penalty values would only squash the scale."""
    oom = [x(t) for t in trials if is_oom(t)]
    other = [x(t) for t in trials if not is_oom(t)]
    transform = ax.get_xaxis_transform()  # x in data units, y in axes units
    if oom:
        ax.scatter(
            oom, [0.03] * len(oom), transform=transform, clip_on=False, label="out of memory", **OOM_STYLE
        )
    # Marks drawn in axes units do not widen the x range by themselves.
    xs = [v for v in oom + other if math.isfinite(v)]
    if xs:
        low, high = ax.get_xlim()
        pad = (max(xs) - min(xs)) * 0.05 or 0.5
        ax.set_xlim(min(low, min(xs) - pad), max(high, max(xs) + pad))
    if other:
        ax.scatter(
            other, [0.03] * len(other), transform=transform, clip_on=False, label="failed", **FAILED_STYLE
        )


def _finish(ax: Any, shown: Sequence[FrozenTrial], baseline: float | None) -> None:
    """Grid, legend, and a value range that fits the completed trials and the baseline (not penalties)."""
    ax.grid(alpha=0.3)
    if shown:
        ax.legend(loc="best", fontsize="small")
    values = [_value(t) for t in shown if t.state == TrialState.COMPLETE]
    if baseline is not None:
        values.append(baseline)
    if values and all(math.isfinite(v) for v in values):
        low, high = min(values), max(values)
        pad = (high - low) * 0.15 or abs(high) * 0.1 or 1.0
        ax.set_ylim(low - pad, high + pad)
