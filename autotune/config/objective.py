"""The objective: which benchmark metric a study optimizes, the workload that measures it, and its limits."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from autotune.config._yaml import config_error_from_validation, load_yaml, rule_error
from autotune.errors import did_you_mean

Direction = Literal["maximize", "minimize"]

# The BenchmarkResult fields an objective can use, each with the direction that means "better".
METRICS: Mapping[str, Direction] = MappingProxyType(
    {
        "output_throughput": "maximize",
        "request_throughput": "maximize",
        "mean_ttft_ms": "minimize",
        "p50_ttft_ms": "minimize",
        "p99_ttft_ms": "minimize",
        "mean_itl_ms": "minimize",
        "p50_itl_ms": "minimize",
        "p99_itl_ms": "minimize",
        "p50_e2e_latency_ms": "minimize",
        "p99_e2e_latency_ms": "minimize",
    }
)

PositiveInt = Annotated[StrictInt, Field(gt=0)]


def _check_metric(metric: str, loc: tuple[str, ...] = ()) -> str:
    if metric not in METRICS:
        hint = did_you_mean(metric, METRICS).strip()
        raise rule_error(
            "unknown metric", loc=loc, value=metric, fix=f"{hint} Metrics: {', '.join(METRICS)}.".strip()
        )
    return metric


class Workload(BaseModel):
    """The benchmark each trial runs: random prompts of fixed lengths at a fixed concurrency."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_prompts: PositiveInt
    input_len: PositiveInt
    output_len: PositiveInt
    concurrency: PositiveInt
    warmup_requests: PositiveInt = 1


class Objective(BaseModel):
    """What a trial measures and optimizes; `limits` are the worst acceptable values of other metrics."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    metric: str
    direction: Direction | None = None  # defaults to the metric's natural direction
    workload: Workload
    # metric -> limit: a ceiling for a latency (minimize) metric, a floor for a throughput (maximize) one.
    limits: dict[str, Annotated[float, Field(gt=0)]] = Field(default_factory=dict)

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        return _check_metric(metric)

    @field_validator("limits")
    @classmethod
    def _known_limits(cls, limits: dict[str, float]) -> dict[str, float]:
        for metric in limits:
            _check_metric(metric, loc=(metric,))
        return limits

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
        """The study's direction (always set after validation)."""
        return self.direction or METRICS[self.metric]

    def value(self, result: Any) -> float:
        """The objective value of a benchmark result (a mapping or an object with the metric fields)."""
        return _read(result, self.metric)

    def constraints(self, result: Any) -> dict[str, float]:
        """Optuna constraint values, one per limit: <= 0 means the result is within the limit."""
        out: dict[str, float] = {}
        for metric, limit in self.limits.items():
            measured = _read(result, metric)
            out[metric] = measured - limit if METRICS[metric] == "minimize" else limit - measured
        return out


def _read(result: Any, metric: str) -> float:
    value = result[metric] if isinstance(result, Mapping) else getattr(result, metric)
    return float(value)


def parse_objective(data: Mapping[str, Any], path: Path | str = "<objective>") -> Objective:
    """Validate an objective already read from YAML; errors are ConfigErrors naming `path`."""
    try:
        return Objective.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(path, exc, Objective) from None


def load_objective(path: Path | str) -> Objective:
    """Read and validate an objective YAML file."""
    return parse_objective(load_yaml(path), path)
