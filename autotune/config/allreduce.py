"""The NCCL all-reduce objective (`kind: nccl_allreduce`): which messages a trial all-reduces, and how.

Such an objective's trials run `autotune.measure.nccl` as a job (see `autotune.node.job`) with the
trial's NCCL environment, instead of launching a server and benchmarking it; `allreduce` says what
the job measures.
`check_kind` holds the rules that keep serving and all-reduce objectives apart.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator, model_validator

from autotune.config._yaml import rule_error
from autotune.measure.metrics import ALLREDUCE_METRICS
from autotune.measure.nccl import DTYPE_BYTES, BenchSettings, Message, parse_size

if TYPE_CHECKING:
    from autotune.config.objective import Objective

__all__ = ["ALLREDUCE_METRICS", "OBJECTIVE_KINDS", "AllReduce", "check_kind"]

ObjectiveKind = Literal["serving", "nccl_allreduce"]
OBJECTIVE_KINDS: tuple[str, ...] = ("serving", "nccl_allreduce")

PositiveInt = Annotated[StrictInt, Field(gt=0)]


class AllReduce(BaseModel):
    """What each trial measures: all-reduces of `messages` (size -> weight: how many per model step;
    0 measures and reports a size without optimizing it), timed by replaying a CUDA graph of
    `graph_iters` all-reduces `replays` times, `repeats` times for a 95% interval."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    messages: Annotated[dict[str | int, Annotated[float, Field(ge=0)]], Field(min_length=1)]
    gpus: PositiveInt = 2
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    graph_iters: PositiveInt = 100
    replays: PositiveInt = 20
    repeats: Annotated[StrictInt, Field(ge=2)] = 10
    warmup: PositiveInt = 20
    capture_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    timing: Literal["graph", "eager"] = "graph"

    @field_validator("messages")
    @classmethod
    def _sizes(cls, messages: dict[str | int, float]) -> dict[str | int, float]:
        seen: dict[int, str | int] = {}
        for key in messages:
            try:
                size = parse_size(str(key))
            except ValueError:
                raise rule_error(
                    "not a message size", loc=(key,), value=key, fix="Write bytes, e.g. 43008, 42K or 1M."
                ) from None
            if size in seen:
                raise rule_error(
                    f"the same size as {seen[size]!r}", loc=(key,), value=key, fix="List each size once."
                )
            seen[size] = key
        if not any(weight > 0 for weight in messages.values()):
            raise rule_error(
                "every weight is 0, so nothing would be optimized",
                value=messages,
                fix="Give the message size the model sends most a weight, e.g. {42K: 122}.",
            )
        return messages

    @model_validator(mode="after")
    def _whole_elements(self) -> AllReduce:
        element = DTYPE_BYTES[self.dtype]
        for key in self.messages:
            if parse_size(str(key)) % element:
                raise rule_error(
                    f"not a whole number of {self.dtype} elements ({element} bytes each)",
                    loc=("messages", key),
                    value=key,
                    fix=f"Use a multiple of {element} bytes.",
                )
        return self

    def settings(self) -> BenchSettings:
        """The benchmark's settings (its command line is `settings().to_argv()`)."""
        return BenchSettings(
            messages=tuple(Message(parse_size(str(k)), float(w)) for k, w in self.messages.items()),
            gpus=self.gpus,
            dtype=self.dtype,
            graph_iters=self.graph_iters,
            replays=self.replays,
            repeats=self.repeats,
            warmup=self.warmup,
            capture_timeout_s=self.capture_timeout_s,
            timing=self.timing,
        )


# Sections of an objective that belong to serving objectives only.
_SERVING_ONLY = ("workload", "ladder", "short_first", "remeasure", "bench_serving")


def check_kind(objective: Objective) -> None:
    """Raise a rule error when the objective mixes the sections or metrics of the two kinds."""
    metrics = [objective.metric, *objective.also_optimize, *objective.limits]
    if objective.kind == "nccl_allreduce":
        if objective.allreduce is None:
            raise rule_error(
                "an nccl_allreduce objective needs an `allreduce` section",
                loc=("allreduce",),
                fix="Add e.g. `allreduce: {messages: {42K: 122}}`.",
            )
        present = [s for s in _SERVING_ONLY if getattr(objective, s) is not None]
        if present or objective.client != "builtin":
            section = present[0] if present else "client"
            raise rule_error(
                f"{section} only applies to serving objectives; an nccl_allreduce trial runs no server",
                loc=(section,),
                fix=f"Remove {section}." + (" Compare configs with `autotune compare`." if present else ""),
            )
        for metric in metrics:
            if metric not in ALLREDUCE_METRICS:
                raise rule_error(
                    "not a metric of the all-reduce benchmark",
                    loc=("metric",),
                    value=metric,
                    fix=f"Use one of: {', '.join(ALLREDUCE_METRICS)}.",
                )
        return
    if objective.allreduce is not None:
        raise rule_error(
            "allreduce only applies to `kind: nccl_allreduce`",
            loc=("allreduce",),
            fix="Set `kind: nccl_allreduce` (and remove the workload), or remove the allreduce section.",
        )
    if objective.workload is None:
        raise rule_error(
            "a serving objective needs a workload",
            loc=("workload",),
            fix="Add e.g. `workload: {num_prompts: 16, input_len: 2000, output_len: 256, concurrency: 4}`, "
            "or set `kind: nccl_allreduce` with an allreduce section.",
        )
    for metric in metrics:
        if metric in ALLREDUCE_METRICS:
            raise rule_error(
                f"{metric} is measured by the all-reduce benchmark, not by a serving benchmark",
                loc=("metric",),
                value=metric,
                fix="Set `kind: nccl_allreduce` with an allreduce section, or pick a serving metric.",
            )
