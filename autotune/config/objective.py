"""The objective: which benchmark metric(s) a study optimizes, how each trial measures them, and the limits.

A trial measures with autotune's built-in client or SGLang's own `bench_serving` on the node (`client`),
at one concurrency or a `ladder` of them on the same launch, optionally a short measurement first
(`short_first`, so that clearly bad configs stop early), and the study's best configs can be measured
again (`remeasure`) so that its answer is a mean with a confidence interval, not one lucky run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.config._yaml import config_error_from_validation, load_yaml, rule_error
from autotune.config.allreduce import AllReduce, ObjectiveKind, check_kind
from autotune.errors import ConfigError, did_you_mean
from autotune.measure.metrics import CATALOGUE, OBJECTIVE_METRICS, Direction
from autotune.measure.workloads import Workload, load_prompts

# The metrics an objective can use, each with the direction that means "better" (the one catalogue).
METRICS = OBJECTIVE_METRICS

PositiveInt = Annotated[StrictInt, Field(gt=0)]


def _check_metric(metric: str, loc: tuple[str | int, ...] = ()) -> str:
    if metric not in METRICS:
        hint = did_you_mean(metric, METRICS).strip()
        raise rule_error(
            "unknown metric", loc=loc, value=metric, fix=f"{hint} Metrics: {', '.join(METRICS)}.".strip()
        )
    return metric


class LoadSearch(BaseModel):
    """The highest load at which the SLO holds, searched on one launch: `vary` the request rate (requests/s)
    or the concurrency from `start`, doubling while a step passes (halving while it fails) and then bisecting
    between the highest pass and the lowest failure, at most `steps` benchmarks, none above `max`. A step
    passes when at least `attainment` of its requests met workload.slo. The trial's `max_load` is the load at
    which the attainment crosses `attainment`, interpolated between the highest pass and the lowest miss (0
    when none down to `min` passed); a server that dies under load keeps the highest load that passed before.
    A search that runs out of `steps` before `tolerance` carries a warning (status, MLflow)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    vary: Literal["request_rate", "concurrency"] = "request_rate"
    start: Annotated[float, Field(gt=0)]
    max: Annotated[float, Field(gt=0)]
    steps: Annotated[StrictInt, Field(ge=2, le=50)] = 8
    attainment: Annotated[float, Field(gt=0, le=1)] = 0.9
    # Bisection stops when the bracket is narrower than this share of the load that passed.
    tolerance: Annotated[float, Field(gt=0, lt=1)] = 0.1
    # The lowest load tried while halving (default start / 8): a rate step's time grows as 1 / rate.
    min: Annotated[float, Field(gt=0)] | None = None
    # A search launch stops halving once a load at or below the study's best max_load missed with none
    # passed (it cannot beat the best; told PRUNED): the slow rates below cost most of such a launch. The
    # defaults' launch in a confirmation round stops so at half its configs' lowest (confirm.defaults_cutoff).
    stop_below_best: bool = True
    # A step stops sending once more of its requests missed the SLO (or one failed) than `attainment` allows
    # of its num_prompts: it has missed whatever the rest would measure, and their node time is saved.
    stop_when_decided: StrictBool = True

    @model_validator(mode="after")
    def _range(self) -> LoadSearch:
        if self.start > self.max:
            raise rule_error(
                "start is above max",
                loc=("start",),
                value=self.start,
                fix=f"Set start <= max ({self.max:g}).",
            )
        if self.min is not None and self.min > self.start:
            raise rule_error(
                "min is above start", loc=("min",), value=self.min, fix=f"Set min <= start ({self.start:g})."
            )
        return self


class BenchServing(BaseModel):
    """SGLang's own client on the node: `python -m sglang.bench_serving` with the `random-ids` dataset and
    a local tokenizer, so nothing is downloaded. `tokenizer` is a folder on the node (default: the
    server's model path); `command` defaults to the server command's Python with `-m sglang.bench_serving`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tokenizer: Annotated[str, Field(min_length=1)] | None = None
    command: Annotated[list[str], Field(min_length=1)] | None = None
    extra_args: list[str] = Field(default_factory=list)


class Ladder(BaseModel):
    """Concurrency levels measured one after another on the same launch, combined into one value:
    `mean` (the mean over the levels) or `target` (the value at `workload.concurrency`). Each level sends
    `workload.num_prompts` requests, or `prompts_per_concurrency` times its concurrency when set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    concurrency: Annotated[list[PositiveInt], Field(min_length=2)]
    combine: Literal["mean", "target"] = "mean"
    prompts_per_concurrency: PositiveInt | None = None

    @field_validator("concurrency")
    @classmethod
    def _increasing(cls, levels: list[int]) -> list[int]:
        for index in range(1, len(levels)):
            if levels[index] <= levels[index - 1]:
                raise rule_error(
                    "concurrency levels must increase",
                    loc=(index,),
                    value=levels[index],
                    fix=f"List each level once, lowest first, e.g. {sorted(set(levels))}.",
                )
        return levels


class ShortFirst(BaseModel):
    """A short measurement before the full one, on the same launch: a trial whose short result is not in
    the best `keep_top_pct` percent of the complete trials' short results (Optuna's PercentilePruner, once
    `min_trials` trials completed) stops there, PRUNED. The short run sends `fraction` of each level's
    prompts (at least the level's concurrency)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fraction: Annotated[float, Field(gt=0, lt=1)] = 0.25
    keep_top_pct: Annotated[float, Field(gt=0, lt=100)] = 50.0
    min_trials: PositiveInt = 5


class Remeasure(BaseModel):
    """After the budget, the `top` configs (and the baseline) are measured until each has `repeats`
    measurements on fresh launches; the study's answer is the best mean, with its `confidence` interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    top: PositiveInt = 3
    repeats: Annotated[StrictInt, Field(ge=2)] = 3
    confidence: Annotated[float, Field(gt=0.5, lt=1)] = 0.95


@dataclass(frozen=True)
class LimitCheck:
    """One limit against a measurement: the worst measured value (at `concurrency`) and how far past."""

    metric: str
    limit: float
    measured: float
    concurrency: int
    excess: float  # in the metric's unit; <= 0 within the limit

    @property
    def violated(self) -> bool:
        return self.excess > 0

    def describe(self) -> str:
        """`p99_itl_ms 61.2 > limit 50 (+11.2, +22.4%) at concurrency 16`."""
        ceiling = METRICS[self.metric] == "minimize"
        sign = ">" if ceiling else "<"
        pct = self.excess / self.limit * 100 if self.limit else 0.0
        return (
            f"{self.metric} {self.measured:.4g} {sign} limit {self.limit:g} "
            f"({'+' if ceiling else '-'}{self.excess:.4g}, {pct:+.1f}%) at concurrency {self.concurrency}"
        )


@dataclass(frozen=True)
class InFlight:
    """The requests a workload keeps in flight on one server replica, and the KV tokens each holds."""

    requests: int
    tokens_each: int

    def tokens(self, running: int | None = None) -> int:
        """The KV tokens they hold at once, on a server that runs at most `running` at a time (None: all)."""
        return min(self.requests, running or self.requests) * self.tokens_each


class Objective(BaseModel):
    """What a trial measures and optimizes; `limits` are the worst acceptable values of other metrics.

    `metric` is optimized alone, or with `also_optimize` (each metric in its natural direction) as a
    multi-objective study whose answer is a Pareto front.
    """

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    metric: str
    direction: Direction | None = None  # defaults to the metric's natural direction
    also_optimize: list[str] = Field(default_factory=list)
    # serving: a server is launched and benchmarked with `workload`; nccl_allreduce: `allreduce` runs.
    kind: ObjectiveKind = "serving"
    workload: Workload | None = None  # required for serving (check_kind)
    allreduce: AllReduce | None = None
    # metric -> limit: a ceiling for a latency (minimize) metric, a floor for a throughput (maximize) one.
    limits: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)
    client: Literal["builtin", "bench_serving"] = "builtin"
    bench_serving: BenchServing | None = None
    ladder: Ladder | None = None
    short_first: ShortFirst | None = None
    remeasure: Remeasure | None = None
    load_search: LoadSearch | None = None

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        return _check_metric(metric)

    @field_validator("also_optimize")
    @classmethod
    def _known_metrics(cls, metrics: list[str]) -> list[str]:
        for index, metric in enumerate(metrics):
            _check_metric(metric, loc=(index,))
            if metric in metrics[:index]:
                raise rule_error("listed twice", loc=(index,), value=metric, fix="List each metric once.")
        return metrics

    @field_validator("limits")
    @classmethod
    def _known_limits(cls, limits: dict[str, float]) -> dict[str, float]:
        for metric in limits:
            _check_metric(metric, loc=(metric,))
        return limits

    @model_validator(mode="after")
    def _kind_rules(self) -> Objective:
        check_kind(self)  # before the rules below, which read a serving objective's workload
        return self

    @model_validator(mode="after")
    def _measurement_rules(self) -> Objective:
        if self.metric in self.also_optimize:
            raise rule_error(
                "the metric is already the first objective",
                loc=("also_optimize",),
                value=self.metric,
                fix=f"Remove {self.metric} from also_optimize.",
            )
        if self.bench_serving is not None and self.client != "bench_serving":
            raise rule_error(
                "bench_serving settings only apply to `client: bench_serving`",
                loc=("bench_serving",),
                value=self.client,
                fix="Set `client: bench_serving`, or remove the bench_serving section.",
            )
        if self.also_optimize and self.short_first is not None:
            raise rule_error(
                "a short measurement is told to Optuna as an intermediate value, which multi-objective "
                "studies cannot report",
                loc=("short_first",),
                value=self.also_optimize,
                fix="Remove short_first, or optimize one metric.",
            )
        if self.also_optimize and self.remeasure is not None:
            raise rule_error(
                "re-measurement ranks configs by the mean of one metric; a multi-objective study's answer "
                "is its Pareto front",
                loc=("remeasure",),
                value=self.also_optimize,
                fix="Remove remeasure, or optimize one metric.",
            )
        self._workload_rules()
        ladder, workload = self.ladder, self.workload
        if ladder is not None and workload is not None:
            if workload.concurrency not in ladder.concurrency:
                raise rule_error(
                    "workload.concurrency must be one of the ladder's levels: its figures head the trial "
                    "and `combine: target` optimizes them",
                    loc=("ladder", "concurrency"),
                    value=ladder.concurrency,
                    fix=f"Add {workload.concurrency} to ladder.concurrency, or set workload.concurrency "
                    "to one of its levels.",
                )
            if ladder.prompts_per_concurrency is None and workload.num_prompts < ladder.concurrency[-1]:
                raise rule_error(
                    f"workload.num_prompts ({workload.num_prompts}) is below the ladder's top level, which "
                    "would never have that many requests in flight",
                    loc=("ladder", "concurrency"),
                    value=ladder.concurrency[-1],
                    fix="Set ladder.prompts_per_concurrency (e.g. 4), or raise workload.num_prompts.",
                )
        return self

    def _workload_rules(self) -> None:
        """The SLO, goodput and load-search rules: one place for what each needs."""
        workload, search = self.workload, self.load_search
        slo_metrics = [m for m in self.metrics if CATALOGUE[m].needs_slo]
        if workload is not None and workload.slo is None and (slo_metrics or search is not None):
            raise rule_error(
                f"{(slo_metrics or ['load_search'])[0]} counts the requests that met an SLO, and none is set",
                loc=("workload", "slo"),
                value=None,
                fix="Add workload.slo, e.g. {ttft_ms: 2000, tpot_ms: 50}.",
            )
        if workload is not None and workload.sharing is not None:
            for section in ("ladder", "load_search"):
                if getattr(self, section) is not None:
                    raise rule_error(
                        f"workload.{workload.sharing} sets its own requests and pace; {section} varies them",
                        loc=(section,),
                        value=workload.sharing,
                        fix=f"Remove {section}, or send independent prompts.",
                    )
        turn_metrics = [m for m in [*self.metrics, *self.limits] if CATALOGUE[m].needs_turns]
        if workload is not None and turn_metrics and workload.sessions is None and workload.trace is None:
            raise rule_error(
                f"{turn_metrics[0]} splits sessions' turns, and this workload has no sessions",
                loc=("workload",),
                value=workload.sharing or "independent prompts",
                fix="Add workload.sessions (or a workload.trace with session_id), or use mean_ttft_ms.",
            )
        if (search is not None) != ("max_load" in self.metrics):
            raise rule_error(
                "max_load is what a load search measures: one needs the other",
                loc=("load_search",) if search is None else ("metric",),
                value=self.metric,
                fix="Write `metric: max_load` with a load_search section, or neither.",
            )
        if search is not None:
            for section in ("ladder", "short_first", "also_optimize"):
                if getattr(self, section):
                    raise rule_error(
                        f"a load search measures its own loads; {section} does not combine with it",
                        loc=(section,),
                        value=getattr(self, section),
                        fix=f"Remove {section}.",
                    )
        if self.client == "bench_serving" and workload is not None:
            unsupported = {
                "prompts": workload.prompts is not None and workload.prompts_format == "jsonl",
                "lengths": workload.lengths == "file",
                "burstiness": workload.burstiness != 1.0,  # 0.5.17's get_request draws exponential gaps only
                **{
                    kind: getattr(workload, kind) is not None
                    for kind in ("shared_prefix", "sessions", "trace")
                },
            }
            for field_name, bad in unsupported.items():
                if bad:
                    raise rule_error(
                        "sglang.bench_serving cannot send this workload (autotune runs it on ShareGPT "
                        "files or random ids, Poisson arrivals, one request at a time)",
                        loc=("workload", field_name),
                        value=getattr(workload, field_name),
                        fix="Use `client: builtin`, or a ShareGPT *.json prompts file and burstiness 1.0, "
                        "with no shared_prefix, sessions or trace.",
                    )

    @model_validator(mode="after")
    def _natural_direction(self) -> Objective:
        natural = METRICS[self.metric]
        if self.direction is None:
            self.direction = natural
        elif self.direction != natural:
            better = "higher" if natural == "maximize" else "lower"
            raise rule_error(
                f"{self.metric} is better when {better}, so a study would {self.direction} the wrong way",
                loc=("direction",),
                value=self.direction,
                fix=f"Write `direction: {natural}` or leave it out.",
            )
        return self

    @property
    def goal(self) -> Direction:
        """The study's direction (always set after validation); the first one's in a multi-objective study."""
        return self.direction or METRICS[self.metric]

    @property
    def metrics(self) -> list[str]:
        """The optimized metrics, in the order Optuna's values hold them."""
        return [self.metric, *self.also_optimize]

    @property
    def directions(self) -> list[Direction]:
        """The study's directions, one per optimized metric."""
        return [self.goal, *(METRICS[m] for m in self.also_optimize)]

    @property
    def is_multi_objective(self) -> bool:
        return bool(self.also_optimize)

    def in_flight(self, replicas: int = 1) -> InFlight | None:
        """The requests the workload keeps in flight on each of `replicas` server replicas that run them all
        (their share of `concurrency`, at most `num_prompts`), each holding `input_len` + `output_len` KV
        tokens. None where the load or the lengths vary (a prompts file, lengths other than fixed, shared
        prefixes, a request rate, a ladder, a load search) or a job is measured."""
        w = self.workload
        if (
            w is None
            or self.is_job
            or self.ladder is not None
            or self.load_search is not None
            or w.prompts is not None
            or w.sharing is not None
            or w.lengths != "fixed"
            or w.request_rate is not None
        ):
            return None
        return InFlight(-(-min(w.concurrency, w.num_prompts) // replicas), w.input_len + w.output_len)

    @property
    def is_job(self) -> bool:
        """True when a trial runs a job that measures itself (autotune.node.job) instead of a server."""
        return self.kind != "serving"

    def value(self, result: Any) -> float:
        """The objective value of a benchmark result (a mapping or an object with the metric fields)."""
        return _read(result, self.metric)

    def values(self, result: Any) -> list[float]:
        """The value of every optimized metric, in `metrics` order."""
        return [_read(result, metric) for metric in self.metrics]

    def limit_checks(self, result: Any) -> list[LimitCheck]:
        """Each limit against the result. A ladder combined by `mean` must keep every limit at every level
        (its worst level counts); a single level, or `combine: target`, at the level it optimizes."""
        levels = getattr(result, "levels", ()) or ()
        if not (self.ladder is not None and self.ladder.combine == "mean" and levels):
            levels = (result,)
        checks = []
        for metric, limit in self.limits.items():
            ceiling = METRICS[metric] == "minimize"
            worst = None
            for level in levels:
                measured = _read(level, metric)
                excess = measured - limit if ceiling else limit - measured
                if worst is None or excess > worst.excess:
                    worst = LimitCheck(metric, limit, measured, _concurrency(level), excess)
            assert worst is not None  # there is at least one level
            checks.append(worst)
        return checks

    def constraints(self, result: Any) -> dict[str, float]:
        """Optuna constraint values, one per limit: <= 0 means the result is within the limit."""
        return {check.metric: check.excess for check in self.limit_checks(result)}


def _read(result: Any, metric: str) -> float:
    value = result[metric] if isinstance(result, Mapping) else getattr(result, metric)
    return float(value)


def _concurrency(result: Any) -> int:
    workload = result.get("workload") if isinstance(result, Mapping) else getattr(result, "workload", None)
    if isinstance(workload, Mapping):
        return int(workload.get("concurrency", 0))
    return int(getattr(workload, "concurrency", 0))


def parse_objective(data: Mapping[str, Any], path: Path | str = "<objective>") -> Objective:
    """Validate an objective already read from YAML; errors are ConfigErrors naming `path`. A relative
    workload.prompts is resolved against `path`'s folder, and the file read now, so a bad one stops the
    study before any launch."""
    data = _trace_resolved(data, path)
    try:
        objective = Objective.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(path, exc, Objective) from None
    except ConfigError as exc:  # the trace file's own error (autotune.measure.sharing.load_trace)
        problem = f"{exc.field}: {exc.problem} (got {exc.value!r})" if exc.field else exc.problem
        raise ConfigError(path, "workload.trace.path", str(exc.path), problem, exc.fix) from None
    workload = objective.workload
    if workload is not None and workload.prompts is not None:
        prompts = Path(workload.prompts).expanduser()
        if not prompts.is_absolute() and str(path) != "<objective>":
            prompts = Path(path).parent / prompts
        objective.workload = replace(workload, prompts=str(prompts.resolve()))
        try:
            load_prompts(objective.workload.prompts, workload.prompts_format)
        except ConfigError as exc:
            where = f"{exc.path}: {exc.field}" if exc.field else str(exc.path)
            raise ConfigError(
                path,
                "workload.prompts",
                workload.prompts,
                f"{where}: {exc.problem} (got {exc.value!r})",
                exc.fix,
            ) from None
    return objective


def _trace_resolved(data: Mapping[str, Any], path: Path | str) -> Mapping[str, Any]:
    """`data` with a relative workload.trace.path made absolute against the objective file's folder, as a
    prompts file is: the workload reads the trace when validated, to know how many requests it holds."""
    workload = data.get("workload") if isinstance(data, Mapping) else None
    trace = workload.get("trace") if isinstance(workload, Mapping) else None
    where = trace.get("path") if isinstance(trace, Mapping) else None
    if not isinstance(where, str) or not where or not isinstance(workload, Mapping):
        return data
    assert isinstance(trace, Mapping)
    resolved = Path(where).expanduser()
    if not resolved.is_absolute() and str(path) != "<objective>":
        resolved = Path(path).parent / resolved
    return {**data, "workload": {**workload, "trace": {**trace, "path": str(resolved.resolve())}}}


def load_objective(path: Path | str) -> Objective:
    """Read and validate an objective YAML file."""
    return parse_objective(load_yaml(path), path)
