"""What a node measures on one launch: a ladder of concurrency levels, a short measurement first.

The driver turns the objective into a `MeasurementPlan` (plain data, so it travels to a Ray actor); the node
runs it with `run_plan`, one benchmark per level, on the server it launched once. The result is one
`BenchmarkResult` whose top-level figures combine the levels (their mean, or the target level's), with the
levels and the short measurement kept inside it. When the short measurement is worse than the plan's
`cutoff` (the Optuna pruner's, computed by the driver when it handed out the trial), the full measurement
never runs: that is where a pruned config saves node time.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, Protocol

from autotune.measure.client import BenchmarkResult, MissLimit
from autotune.measure.load_search import LoadSearchPlan, search_load
from autotune.measure.metrics import maximizes
from autotune.measure.workloads import Workload

__all__ = [
    "BenchServingOptions",
    "MeasurementPlan",
    "PlannedObjective",
    "combine",
    "plan_for",
    "run_plan",
    "run_plan_sync",
]

Combine = Literal["mean", "target"]
# Each run of a plan gets prompts of its own: a prefix cache must not serve a later level from an earlier one.
_SEED_STRIDE = 1_000_003
# Summed over the levels rather than averaged: counts and the total time measured.
_SUMMED = ("duration_s", "completed", "failed", "total_input_tokens", "total_output_tokens")
_NOT_AVERAGED = (
    "workload",
    "levels",
    "short",
    "stopped_early",
    "client",
    "first_error",
    "time_scale",
    "load_stopped_by",
    "load_warning",
    "load_below",
    "load_bracket",
    "load_missed",
    "slo_over",
    "decided_after",
)


@dataclass(frozen=True)
class BenchServingOptions:
    """How the node runs `sglang.bench_serving`; None fields default from the launch (see bench_serving)."""

    tokenizer: str | None = None
    command: tuple[str, ...] | None = None
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True)
class MeasurementPlan:
    """The benchmarks one trial runs on its launch, in order, and how they combine into its result.

    `levels` are the full measurement (one workload per concurrency level), `target` the concurrency whose
    figures head the result (and that `combine: target` optimizes). `short_levels`, when given, run first;
    if their combined `metric` is worse than `cutoff`, the trial stops there.
    """

    levels: tuple[Workload, ...]
    target: int
    combine: Combine = "target"
    short_levels: tuple[Workload, ...] = ()
    metric: str = "output_throughput"
    maximize: bool = True
    cutoff: float | None = None
    client: Literal["builtin", "bench_serving"] = "builtin"
    bench_serving: BenchServingOptions | None = None
    load_search: LoadSearchPlan | None = None  # instead of the levels: the highest load that meets the SLO

    def __post_init__(self) -> None:
        if not self.levels:
            raise ValueError("`levels` must not be empty, but got ().")
        if self.target not in [w.concurrency for w in self.levels]:
            raise ValueError(
                f"`target` must be the concurrency of one of the levels, but got ({self.target=}, "
                f"levels {[w.concurrency for w in self.levels]})."
            )

    @classmethod
    def single(cls, workload: Workload) -> MeasurementPlan:
        """One benchmark of `workload`: what a trial measured before plans existed."""
        return cls(levels=(workload,), target=workload.concurrency)

    def miss_limit(self, workload: Workload) -> MissLimit | None:
        """Where a run of `workload` stops sending: a load search's step once its outcome is decided."""
        return self.load_search.miss_limit(workload) if self.load_search is not None else None

    def worse_than_cutoff(self, value: float) -> bool:
        """Whether a short measurement's value stops the trial."""
        if self.cutoff is None or math.isnan(value):
            return False
        return value < self.cutoff if self.maximize else value > self.cutoff


class _Ladder(Protocol):
    @property
    def concurrency(self) -> Sequence[int]: ...
    @property
    def combine(self) -> Combine: ...
    @property
    def prompts_per_concurrency(self) -> int | None: ...


class _ShortFirst(Protocol):
    @property
    def fraction(self) -> float: ...


class _BenchServing(Protocol):
    @property
    def tokenizer(self) -> str | None: ...
    @property
    def command(self) -> Sequence[str] | None: ...
    @property
    def extra_args(self) -> Sequence[str]: ...


class _LoadSearch(Protocol):
    def model_dump(self) -> dict[str, Any]: ...


class PlannedObjective(Protocol):
    """What `plan_for` reads of an objective: autotune.config.objective.Objective, whose layer (config)
    sits above measure, so it is named here by its shape."""

    @property
    def name(self) -> str: ...
    @property
    def metric(self) -> str: ...
    @property
    def goal(self) -> str: ...
    @property
    def workload(self) -> Workload | None: ...
    @property
    def client(self) -> Literal["builtin", "bench_serving"]: ...
    @property
    def ladder(self) -> _Ladder | None: ...
    @property
    def short_first(self) -> _ShortFirst | None: ...
    @property
    def bench_serving(self) -> _BenchServing | None: ...
    @property
    def load_search(self) -> _LoadSearch | None: ...


def plan_for(
    objective: PlannedObjective,
    *,
    short: bool = True,
    cutoff: float | None = None,
    load_cutoff: float | None = None,
    load_cutoff_is: str | None = None,
    load_floor: float | None = None,
) -> MeasurementPlan:
    """The plan that measures `objective`; `short=False` leaves its short measurement out (a re-measurement),
    `cutoff` is the short value below which (above, when minimizing) the trial stops; `load_cutoff` the load
    at or below which a load search that found no passing load stops (`load_cutoff_is` says what it is: the
    study's best max_load by default); `load_floor` the slowest rate a node-hour budget pays a step at."""
    w = objective.workload
    if w is None:  # a job objective (autotune.node.job): its launch measures itself
        raise ValueError(f"`workload` must be set for a plan, but objective {objective.name!r} has none.")
    ladder = objective.ladder
    levels: list[Workload] = []
    for concurrency in ladder.concurrency if ladder is not None else [w.concurrency]:
        prompts = w.num_prompts
        if ladder is not None and ladder.prompts_per_concurrency is not None:
            prompts = ladder.prompts_per_concurrency * concurrency
        levels.append(replace(w, num_prompts=prompts, concurrency=concurrency))
    short_levels: tuple[Workload, ...] = ()
    if short and objective.short_first is not None:
        fraction = objective.short_first.fraction
        short_levels = tuple(
            replace(level, num_prompts=max(level.concurrency, math.ceil(level.num_prompts * fraction)))
            for level in levels
        )
    options = None
    if objective.client == "bench_serving":
        spec = objective.bench_serving
        options = BenchServingOptions(
            tokenizer=spec.tokenizer if spec else None,
            command=tuple(spec.command) if spec and spec.command else None,
            extra_args=tuple(spec.extra_args) if spec else (),
        )
    return MeasurementPlan(
        levels=tuple(levels),
        target=w.concurrency,
        combine=ladder.combine if ladder is not None else "target",
        short_levels=short_levels,
        metric=objective.metric,
        maximize=maximizes(objective.goal),
        cutoff=cutoff if short_levels else None,
        client=objective.client,
        bench_serving=options,
        load_search=_load_search(objective, load_cutoff, load_cutoff_is, load_floor),
    )


def _load_search(
    objective: PlannedObjective, cutoff: float | None, cutoff_is: str | None, floor: float | None
) -> LoadSearchPlan | None:
    search = objective.load_search
    if search is None:
        return None
    plan = LoadSearchPlan(**search.model_dump(), cutoff=cutoff, budget_floor=floor)
    return plan if cutoff_is is None else replace(plan, cutoff_is=cutoff_is)


def combine(results: Sequence[BenchmarkResult], how: Combine, target: int) -> BenchmarkResult:
    """One result for a ladder: the target level's figures (`target`), or every figure averaged over the
    levels (`mean`; counts, tokens and duration summed), with the levels kept in `levels`."""
    if not results:
        raise ValueError("`results` must not be empty, but got [].")
    if len(results) == 1:
        return results[0]
    head = next((r for r in results if r.workload.concurrency == target), results[-1])
    if how == "target":
        return replace(head, levels=tuple(results))
    averaged: dict[str, object] = {}
    for f in fields(BenchmarkResult):
        if f.name in _NOT_AVERAGED:
            continue
        values = [getattr(r, f.name) for r in results]
        if f.name in _SUMMED:
            averaged[f.name] = sum(values)
        elif all(v is None for v in values):
            averaged[f.name] = None
        else:
            present = [float(v) for v in values if v is not None]
            averaged[f.name] = sum(present) / len(present)
    return replace(head, **averaged, levels=tuple(results))  # type: ignore[arg-type]


def _runs(plan: MeasurementPlan) -> list[tuple[str, Workload]]:
    """Every benchmark of the plan in order; only the launch's first run warms the server up."""
    runs = [("short", w) for w in plan.short_levels] + [("full", w) for w in plan.levels]
    return [(part, w if i == 0 else w.on_warm_server()) for i, (part, w) in enumerate(runs)]


async def run_plan(
    plan: MeasurementPlan, measure: Callable[[Workload, int], Awaitable[BenchmarkResult]]
) -> BenchmarkResult:
    """Run `plan` with `measure(workload, run_index)` (one benchmark on the launched server; the index
    picks its prompts) and combine the results. A `BenchmarkError` of any run ends the trial; a load search
    runs its own steps (autotune.measure.load_search)."""
    if plan.load_search is not None:
        return await search_load(plan.load_search, plan.levels[0], measure)
    short: list[BenchmarkResult] = []
    full: list[BenchmarkResult] = []
    for index, (part, workload) in enumerate(_runs(plan)):
        if part == "full" and short and not full:
            head = combine(short, plan.combine, plan.target)
            if plan.worse_than_cutoff(float(getattr(head, plan.metric))):
                return replace(head, stopped_early=True)
        (short if part == "short" else full).append(await measure(workload, index))
    result = combine(full, plan.combine, plan.target)
    return replace(result, short=combine(short, plan.combine, plan.target)) if short else result


def run_plan_sync(
    plan: MeasurementPlan, measure: Callable[[Workload, int], BenchmarkResult]
) -> BenchmarkResult:
    """`run_plan` for a synchronous `measure` (a model of a node)."""
    import asyncio

    async def measured(workload: Workload, index: int) -> BenchmarkResult:
        return measure(workload, index)

    return asyncio.run(run_plan(plan, measured))


def run_seed(seed: int, index: int) -> int:
    """The prompt seed of a plan's `index`-th run in a trial seeded `seed` (the first run keeps `seed`)."""
    return seed + _SEED_STRIDE * index
