"""The search space: which NCCL env vars and SGLang flags a study tunes, their ranges and conditions.

A parameter's key is what it sets: an env var (`kind: nccl`) or a `--flag` (`kind: sglang` or `speculative`),
and Optuna records it under that same name. `SearchSpace.suggest` turns a `Proposer` (an Optuna trial)
into a `TrialConfig`, applying each parameter's `when` condition and SGLang's own rules (`SpeculativeRules`).
This module names no sampler: Optuna stays on the study's side, and node actors read study files without it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Protocol

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
from autotune.errors import did_you_mean
from autotune.trial.launch import TrialConfig, to_arg, to_env_value

NCCL_NAME = re.compile(r"^NCCL_[A-Z0-9_]+$")
FLAG_NAME = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_-]*$")

# Flags autotune sets itself from the study file; a search space may not tune them.
MANAGED_FLAGS = {
    "--model-path": "server.model_path",
    "--host": "server.host",
    "--port": "server.port",
    "--speculative-draft-model-path": "server.draft_model_path",
}

Kind = Literal["nccl", "sglang", "speculative"]


class Proposer(Protocol):
    """What proposes each parameter's value: an Optuna trial (a live `Trial`, a `FixedTrial`, or a stored
    `FrozenTrial` to rebuild a past trial), or anything with the same methods. `params`: the values it holds
    already (a stored trial's; a live trial's so far)."""

    @property
    def params(self) -> dict[str, Any]: ...

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


def same_value(a: object, b: object, *, tolerance: float = 0.0) -> bool:
    """Whether two knob values are one: equality that keeps YAML's types apart (`true` is not `1`, and
    `null` only equals `null`); numbers closer than `tolerance` are one value (0: only equal ones)."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if tolerance and isinstance(a, int | float) and isinstance(b, int | float):
        return abs(float(a) - float(b)) < tolerance
    return a == b


def _is_scalar(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


class _Parameter(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Kind
    # Suggested only when every named earlier parameter took one of the listed values.
    when: dict[str, list[Any]] | None = None

    @field_validator("when", mode="before")
    @classmethod
    def _values_as_lists(cls, when: Any) -> Any:
        if isinstance(when, dict):
            return {key: value if isinstance(value, list) else [value] for key, value in when.items()}
        return when

    @field_validator("when")
    @classmethod
    def _scalar_values(cls, when: dict[str, list[Any]] | None) -> dict[str, list[Any]] | None:
        for key, values in (when or {}).items():
            if not values:
                raise rule_error(
                    "a condition needs at least one value", loc=(key,), value=values, fix="List the values."
                )
            for value in values:
                if not _is_scalar(value):
                    raise rule_error(
                        "a condition value must be a string, number, bool or null",
                        loc=(key,),
                        value=value,
                        fix="Write a value such as EAGLE3 or a list of them.",
                    )
        return when

    def can_take(self, value: object) -> bool:
        """True when a trial can sample exactly `value` for this parameter."""
        raise NotImplementedError

    def can_produce_env(self, text: str) -> bool:
        """True when this parameter, as an env var, can be set to the string `text`."""
        raise NotImplementedError

    def can_pass_flag(self) -> bool:
        """True when this parameter, as a flag, can appear on the command line."""
        return True

    def describe(self) -> str:
        """Its values, for messages."""
        raise NotImplementedError

    def suggest(self, name: str, trial: Proposer) -> object:
        raise NotImplementedError


class _RangeChecks:
    """Optuna's rules for a numeric range, with Optuna's wording."""

    @staticmethod
    def check(low: float, high: float, step: float | None, log: bool) -> None:
        if low > high:
            raise rule_error(
                f"`low <= high` must hold, but got (low={low}, high={high})",
                loc=("low",),
                value=low,
                fix="Swap them or widen the range.",
            )
        if log and low <= 0:
            raise rule_error(
                f"`low > 0` must hold for `log=True`, but got (low={low}, high={high})",
                loc=("low",),
                value=low,
                fix="Use a positive low, or drop `log`.",
            )
        if log and step is not None:
            raise rule_error(
                "`step` and `log` cannot be used together",
                loc=("step",),
                value=step,
                fix="Drop `step` or set `log: false`.",
            )
        if step is not None:
            count = (high - low) / step
            if abs(count - round(count)) > 1e-9 * max(1.0, abs(count)):
                raise rule_error(
                    "`high - low` must be a multiple of `step`, "
                    f"but got (low={low}, high={high}, step={step})",
                    loc=("step",),
                    value=step,
                    fix=f"Use a high of {low + math.floor(count) * step:g} or another step.",
                )


class IntParameter(_Parameter):
    """An integer range, as `trial.suggest_int`."""

    type: Literal["int"]
    low: StrictInt
    high: StrictInt
    step: Annotated[StrictInt, Field(ge=1)] | None = None
    log: StrictBool = False

    @model_validator(mode="after")
    def _range(self) -> IntParameter:
        _RangeChecks.check(self.low, self.high, self.step, self.log)
        return self

    def can_take(self, value: object) -> bool:
        if not isinstance(value, int) or isinstance(value, bool):
            return False
        return self.low <= value <= self.high and (value - self.low) % (self.step or 1) == 0

    def can_produce_env(self, text: str) -> bool:
        try:
            return self.can_take(int(text))
        except ValueError:
            return False

    def describe(self) -> str:
        return f"integers {self.low}..{self.high}"

    def suggest(self, name: str, trial: Proposer) -> object:
        return trial.suggest_int(name, self.low, self.high, step=self.step or 1, log=self.log)

    def suggest_at_most(self, name: str, trial: Proposer, high: int) -> object:
        """Suggest within low..min(high, `high`); a stored trial, which holds the value already, is rebuilt
        as it ran, in the full range (it may have run before the rule narrowed it)."""
        step = self.step or 1
        top = self.low + (min(self.high, high) - self.low) // step * step
        if name in trial.params or top < self.low:
            return self.suggest(name, trial)
        return trial.suggest_int(name, self.low, top, step=step, log=self.log)


class FloatParameter(_Parameter):
    """A real range, as `trial.suggest_float`."""

    type: Literal["float"]
    low: float
    high: float
    step: Annotated[float, Field(gt=0)] | None = None
    log: StrictBool = False

    @model_validator(mode="after")
    def _range(self) -> FloatParameter:
        _RangeChecks.check(self.low, self.high, self.step, self.log)
        return self

    def can_take(self, value: object) -> bool:
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and self.low <= value <= self.high
        )

    def can_produce_env(self, text: str) -> bool:
        try:
            return self.can_take(float(text))
        except ValueError:
            return False

    def describe(self) -> str:
        return f"numbers {self.low}..{self.high}"

    def suggest(self, name: str, trial: Proposer) -> object:
        value = trial.suggest_float(name, self.low, self.high, step=self.step, log=self.log)
        if self.step is None:
            return value
        # Optuna computes low + k * step in binary floating point: 0.7999999999999999 for 0.8.
        decimals = len(f"{self.step:.12f}".rstrip("0").split(".")[1])
        return round(value, decimals)


class CategoricalParameter(_Parameter):
    """A list of choices, as `trial.suggest_categorical`; `null` means "leave it unset"."""

    type: Literal["categorical"]
    choices: list[Any]

    @field_validator("choices")
    @classmethod
    def _valid_choices(cls, choices: list[Any]) -> list[Any]:
        if not choices:
            raise rule_error(
                "`choices` must not be empty", value=choices, fix="List at least one value, e.g. [null, 8]."
            )
        for index, choice in enumerate(choices):
            if not _is_scalar(choice):
                raise rule_error(
                    "a choice must be a string, number, bool or null",
                    loc=(index,),
                    value=choice,
                    fix="Write plain values, e.g. [null, Ring, Tree].",
                )
            if any(same_value(choice, earlier) for earlier in choices[:index]):
                raise rule_error(
                    "`choices` must be unique", loc=(index,), value=choice, fix="Remove the repeated value."
                )
        return choices

    def can_take(self, value: object) -> bool:
        return any(same_value(value, choice) for choice in self.choices)

    def can_produce_env(self, text: str) -> bool:
        return any(choice is not None and to_env_value(choice) == text for choice in self.choices)

    def can_pass_flag(self) -> bool:
        return any(choice is not None and choice is not False for choice in self.choices)

    def describe(self) -> str:
        return "one of " + ", ".join("null" if c is None else str(c) for c in self.choices)

    def suggest(self, name: str, trial: Proposer) -> object:
        return trial.suggest_categorical(name, tuple(self.choices))


class BoolParameter(_Parameter):
    """On or off: a switch flag, or an env var set to 1 or 0."""

    type: Literal["bool"]

    def can_take(self, value: object) -> bool:
        return isinstance(value, bool)

    def can_produce_env(self, text: str) -> bool:
        return text in ("0", "1")

    def describe(self) -> str:
        return "true or false"

    def suggest(self, name: str, trial: Proposer) -> object:
        return trial.suggest_categorical(name, (False, True))


Parameter = Annotated[
    IntParameter | FloatParameter | CategoricalParameter | BoolParameter, Field(discriminator="type")
]


@dataclass(frozen=True)
class Derived:
    """A value SGLang's rules set instead of letting the sampler choose it."""

    value: object


SKIP = "skip"


@dataclass(frozen=True)
class AtMost:
    """Suggest the parameter no higher than `high`: SGLang fails above it."""

    high: int


class SpeculativeRules:
    """SGLang's speculative-decoding rules, in one place, per algorithm as SGLang 0.5.17-0.5.23 dispatch
    them (srt/speculative/spec_info.py `handle_server_args`): EAGLE, EAGLE3, STANDALONE (and NEXTN, which
    `_resolve_speculative_algorithm_alias` makes EAGLE) follow `_handle_eagle_family` (0.5.17
    arg_groups/speculative_hook.py:525-681, [23] 1072-1282), a tree of steps, topk and draft tokens;
    NGRAM follows `_handle_ngram` (0.5.17 :684-753, [23] 1285-1370), which has no tree to declare:

        server_args.speculative_eagle_topk = server_args.speculative_ngram_max_bfs_breadth
        if server_args.speculative_num_draft_tokens is None:
            server_args.speculative_num_draft_tokens = 12  # "... set to 12 by default for ngram ..."
        if server_args.speculative_num_steps is None:
            server_args.speculative_num_steps = (num_draft_tokens // speculative_eagle_topk)

    so under NGRAM the draft tokens are tuned alone, steps and topk are SGLang's to set."""

    PREFIX: ClassVar[str] = "--speculative-"
    ALGORITHM: ClassVar[str] = "--speculative-algorithm"
    STEPS: ClassVar[str] = "--speculative-num-steps"
    TOPK: ClassVar[str] = "--speculative-eagle-topk"
    DRAFT_TOKENS: ClassVar[str] = "--speculative-num-draft-tokens"
    DRAFT_MODEL_PATH: ClassVar[str] = "--speculative-draft-model-path"
    ALGORITHMS: ClassVar[tuple[str, ...]] = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
    NEEDS_DRAFT_MODEL: ClassVar[frozenset[str]] = frozenset({"EAGLE", "EAGLE3", "STANDALONE"})
    NGRAM: ClassVar[str] = "NGRAM"  # no draft model, no tree: draft tokens alone (`_handle_ngram`)
    NGRAM_DEFAULT_DRAFT_TOKENS: ClassVar[int] = 12  # `_handle_ngram`'s when the flag is unset

    @classmethod
    def is_speculative_flag(cls, name: str) -> bool:
        return name.startswith(cls.PREFIX)

    @classmethod
    def needs_draft_model(cls, algorithm: object) -> bool:
        """True when this `--speculative-algorithm` value loads a separate draft model."""
        return algorithm is not None and str(algorithm) in cls.NEEDS_DRAFT_MODEL

    @classmethod
    def has_tree(cls, algorithm: object) -> bool:
        """True when this algorithm drafts an EAGLE tree (steps, topk, draft tokens): all but NGRAM."""
        return algorithm is not None and str(algorithm) != cls.NGRAM

    @staticmethod
    def max_draft_tokens(steps: int, topk: int) -> int:
        """The most draft tokens an EAGLE tree of `steps` levels and `topk` branches holds: SGLang picks
        `draft - 1` of its `topk + (steps - 1) * topk**2` candidates with torch.topk
        (srt/speculative/eagle_utils.py:106-110, 0.5.17), which fails in draft CUDA-graph capture above."""
        return topk + (steps - 1) * topk**2 + 1

    @classmethod
    def decide(
        cls, name: str, values: Mapping[str, object], declared: Collection[str]
    ) -> Derived | AtMost | str | None:
        """Before suggesting `name`: None to suggest it, SKIP to leave it unset, a Derived value, or AtMost
        a bound for the suggestion.

        `values` holds what earlier parameters took (sampled or derived); `declared` all parameter names.
        """
        if cls.is_speculative_flag(name) and name != cls.ALGORITHM:
            if cls.ALGORITHM in declared and values.get(cls.ALGORITHM) is None:
                return SKIP  # speculative knobs mean nothing without an algorithm
        if values.get(cls.ALGORITHM) == cls.NGRAM:
            # `_handle_ngram`: topk is --speculative-ngram-max-bfs-breadth, steps draft // topk.
            return SKIP if name in (cls.STEPS, cls.TOPK) else None
        if name in (cls.TOPK, cls.DRAFT_TOKENS) and values.get(cls.STEPS) is None:
            return SKIP  # SGLang: with num-steps unset, topk and draft tokens must be unset too
        if name == cls.DRAFT_TOKENS and values.get(cls.TOPK) is not None:
            steps, topk = int(to_arg(values[cls.STEPS])), int(to_arg(values[cls.TOPK]))
            if topk == 1:
                return Derived(steps + 1)  # SGLang forces steps + 1 when topk is 1
            return AtMost(cls.max_draft_tokens(steps, topk))
        return None

    @classmethod
    def check(cls, parameters: Mapping[str, _Parameter]) -> None:
        """Raise a rule error when the declared parameters cannot follow SGLang's rules."""
        names = list(parameters)
        algorithm = parameters.get(cls.ALGORITHM)
        if algorithm is not None:
            if not isinstance(algorithm, CategoricalParameter):
                raise rule_error(
                    "--speculative-algorithm must be categorical",
                    loc=("parameters", cls.ALGORITHM, "type"),
                    value=getattr(algorithm, "type", None),
                    fix="Use `type: categorical, choices: [null, EAGLE3]`.",
                )
            for index, choice in enumerate(algorithm.choices):
                if choice is not None and choice not in cls.ALGORITHMS:
                    raise rule_error(
                        "unknown speculative algorithm",
                        loc=("parameters", cls.ALGORITHM, "choices", index),
                        value=choice,
                        fix=f"{did_you_mean(str(choice), cls.ALGORITHMS).strip()} "
                        f"SGLang knows: {', '.join(cls.ALGORITHMS)}.".strip(),
                    )
        for name, parameter in parameters.items():
            if not cls.is_speculative_flag(name) or name == cls.ALGORITHM:
                continue
            if algorithm is not None and not cls._needs_algorithm(name, parameters):
                raise rule_error(
                    f"{name} must be conditioned on {cls.ALGORITHM} (it means nothing without speculation)",
                    loc=("parameters", name),
                    value=parameter.when,
                    fix=f"Add `when: {{{cls.ALGORITHM}: EAGLE3}}`.",
                )
            before = names[: names.index(name)]
            if name == cls.DRAFT_TOKENS and cls.STEPS not in before and cls._reaches_ngram(name, parameters):
                continue  # NGRAM takes draft tokens alone; an EAGLE tree then leaves them to SGLang
            if name in (cls.TOPK, cls.DRAFT_TOKENS) and cls.STEPS not in before:
                raise rule_error(
                    f"{name} needs {cls.STEPS} declared before it (SGLang ignores it while steps are unset)",
                    loc=("parameters", name),
                    value=name,
                    fix=f"Declare {cls.STEPS} above {name}.",
                )
            if name == cls.TOPK and cls.STEPS in names and not _never_null(parameter):
                raise rule_error(
                    f"{name} must not be null while {cls.STEPS} is tuned (SGLang 0.5.17-0.5.23 fail with "
                    "TypeError: '>' not supported between instances of 'NoneType' and 'int')",
                    loc=("parameters", name, "choices"),
                    value=getattr(parameter, "choices", None),
                    fix="Remove null from its choices (1 is the smallest tree).",
                )
            if name == cls.DRAFT_TOKENS and not isinstance(parameter, IntParameter):
                raise rule_error(
                    f"{name} must be `type: int`: autotune keeps it within the EAGLE draft tree "
                    f"(draft - 1 <= topk + (steps - 1) * topk^2) by narrowing its range",
                    loc=("parameters", name, "type"),
                    value=getattr(parameter, "type", None),
                    fix="Write it as `type: int, low: 2, high: 16`.",
                )
            if name == cls.DRAFT_TOKENS and cls.TOPK in names[names.index(name) :]:
                raise rule_error(
                    f"{cls.TOPK} must be declared before {name} (topk 1 fixes draft tokens to steps + 1)",
                    loc=("parameters", name),
                    value=name,
                    fix=f"Declare {cls.TOPK} above {name}.",
                )
        cls.check_steps_have_topk(parameters)

    @classmethod
    def check_steps_have_topk(cls, parameters: Mapping[str, _Parameter]) -> None:
        """SGLang fails when num-steps is set and topk is not: where both are tuned, topk is suggested
        wherever steps are (topk may also be fixed in the study's server.flags, not seen here)."""
        if cls.STEPS not in parameters or cls.TOPK not in parameters:
            return
        steps_when, topk_when = parameters[cls.STEPS].when or {}, parameters[cls.TOPK].when or {}
        for other, values in topk_when.items():  # wherever steps are suggested, topk must be too
            if other == cls.STEPS:
                continue
            if other not in steps_when or any(
                not any(same_value(v, w) for w in values) for v in steps_when[other]
            ):
                raise rule_error(
                    f"{cls.TOPK} can be left unset while {cls.STEPS} is set (SGLang then fails with a "
                    "TypeError): its condition must hold wherever the steps' does",
                    loc=("parameters", cls.TOPK, "when", other),
                    value=values,
                    fix=f"Give {cls.TOPK} the same `when` as {cls.STEPS}.",
                )

    @classmethod
    def _reaches_ngram(cls, name: str, parameters: Mapping[str, _Parameter]) -> bool:
        """True when `name` is suggested under NGRAM (a choice of the algorithm, which its `when` allows)."""
        algorithm = parameters.get(cls.ALGORITHM)
        if not isinstance(algorithm, CategoricalParameter) or cls.NGRAM not in algorithm.choices:
            return False
        allowed = (parameters[name].when or {}).get(cls.ALGORITHM)
        return allowed is None or any(same_value(value, cls.NGRAM) for value in allowed)

    @classmethod
    def _needs_algorithm(cls, name: str, parameters: Mapping[str, _Parameter]) -> bool:
        """True when `name` is only suggested once the algorithm is set (directly or through conditions)."""
        when = parameters[name].when or {}
        if cls.ALGORITHM in when and all(value is not None for value in when[cls.ALGORITHM]):
            return True
        return any(other in parameters and cls._needs_algorithm(other, parameters) for other in when)


class SearchSpaceFile(BaseModel):
    """The schema of a search space YAML file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    parameters: dict[str, Parameter]

    @model_validator(mode="after")
    def _rules(self) -> SearchSpaceFile:
        if not self.parameters:
            raise rule_error(
                "a search space needs at least one parameter",
                loc=("parameters",),
                value={},
                fix="Add e.g. `NCCL_ALGO: {kind: nccl, type: categorical, choices: [null, Ring, Tree]}`.",
            )
        earlier: list[str] = []
        for name, parameter in self.parameters.items():
            _check_name(name, parameter)
            _check_condition(name, parameter, earlier, self.parameters)
            earlier.append(name)
        SpeculativeRules.check(self.parameters)
        return self


def _check_name(name: str, parameter: _Parameter) -> None:
    loc = ("parameters", name)
    if parameter.kind == "nccl":
        if not NCCL_NAME.match(name):
            raise rule_error(
                "a `kind: nccl` parameter must be an env var named like NCCL_ALGO (^NCCL_[A-Z0-9_]+$)",
                loc=loc,
                value=name,
                fix="Rename it, or use `kind: sglang` for a server flag.",
            )
        return
    if not FLAG_NAME.match(name):
        raise rule_error(
            f"a `kind: {parameter.kind}` parameter must be a server flag starting with '--'",
            loc=loc,
            value=name,
            fix=f"Write it as '--{name.lstrip('-').lower().replace('_', '-')}', or use `kind: nccl`.",
        )
    if name in MANAGED_FLAGS:
        raise rule_error(
            f"{name} is set from the study file, not tuned",
            loc=loc,
            value=name,
            fix=f"Remove it here and set `{MANAGED_FLAGS[name]}` in the study file.",
        )
    speculative = SpeculativeRules.is_speculative_flag(name)
    if speculative != (parameter.kind == "speculative"):
        wanted = "speculative" if speculative else "sglang"
        raise rule_error(
            f"{name} must have `kind: {wanted}`",
            loc=(*loc, "kind"),
            value=parameter.kind,
            fix=f"Write `kind: {wanted}`.",
        )


def _check_condition(
    name: str, parameter: _Parameter, earlier: list[str], parameters: Mapping[str, _Parameter]
) -> None:
    for other, values in (parameter.when or {}).items():
        loc = ("parameters", name, "when", other)
        if other not in parameters:
            raise rule_error(
                "the condition names an unknown parameter",
                loc=loc,
                value=other,
                fix=(
                    did_you_mean(other, earlier).strip() + " Conditions name a parameter declared above."
                ).strip(),
            )
        if other not in earlier:
            raise rule_error(
                "the condition names a parameter declared later (or itself)",
                loc=loc,
                value=other,
                fix=f"Declare {other} above {name}.",
            )
        target = parameters[other]
        for value in values:
            if not target.can_take(value):
                words = [str(c) for c in getattr(target, "choices", []) if c is not None]
                hint = did_you_mean(str(value), words).strip()
                raise rule_error(
                    f"{other} never takes this value (it takes {target.describe()})",
                    loc=loc,
                    value=value,
                    fix=f"{hint} Use a value {other} can take.".strip(),
                )


class SearchSpace:
    """A loaded search space: turns proposals (Optuna trials) into `TrialConfig`s."""

    def __init__(self, spec: SearchSpaceFile, path: Path | str = "<search space>") -> None:
        self.spec = spec
        self.path = Path(path)

    @property
    def parameters(self) -> Mapping[str, _Parameter]:
        """The parameters in declaration order (the order they are suggested and passed)."""
        return self.spec.parameters

    def __iter__(self) -> Iterator[str]:
        return iter(self.spec.parameters)

    def __contains__(self, name: object) -> bool:
        return name in self.spec.parameters

    def suggest(self, trial: Proposer) -> TrialConfig:
        """Ask `trial` for each active parameter and build the TrialConfig.

        Works with a live `Trial`, a `FixedTrial`, or a stored `FrozenTrial` (to rebuild a past trial).
        """
        sampled: dict[str, object] = {}
        derived: dict[str, object] = {}
        declared = self.spec.parameters.keys()
        for name, parameter in self.spec.parameters.items():
            values = {**sampled, **derived}
            if not _condition_holds(parameter, values):
                continue
            decision = SpeculativeRules.decide(name, values, declared)
            if decision == SKIP:
                continue
            if isinstance(decision, Derived):
                derived[name] = decision.value
            elif isinstance(decision, AtMost) and isinstance(parameter, IntParameter):
                sampled[name] = parameter.suggest_at_most(name, trial, decision.high)
            else:
                sampled[name] = parameter.suggest(name, trial)
        return self._config(sampled, derived)

    def baseline(self) -> TrialConfig:
        """No tuned settings at all: the server runs with SGLang's (and NCCL's) own defaults."""
        return TrialConfig()

    def _config(self, sampled: dict[str, object], derived: dict[str, object]) -> TrialConfig:
        env: dict[str, str] = {}
        flags: dict[str, str | None] = {}
        for name, parameter in self.spec.parameters.items():
            if name not in sampled and name not in derived:
                continue
            value = sampled[name] if name in sampled else derived[name]
            if parameter.kind == "nccl":
                if value is not None:
                    env[name] = to_env_value(value)
            elif value is None or value is False:
                continue
            else:
                flags[name] = None if value is True else to_arg(value)
        return TrialConfig(env=env, flags=flags, params=sampled, derived=derived)

    def possible_values(self, name: str) -> list[object] | None:
        """The values a categorical or bool parameter can take; None for a range or unknown name."""
        parameter = self.spec.parameters.get(name)
        if isinstance(parameter, CategoricalParameter):
            return list(parameter.choices)
        if isinstance(parameter, BoolParameter):
            return [False, True]
        return None


def _never_null(parameter: _Parameter) -> bool:
    return not isinstance(parameter, CategoricalParameter) or None not in parameter.choices


def _condition_holds(parameter: _Parameter, values: Mapping[str, object]) -> bool:
    return all(
        other in values and any(same_value(values[other], wanted) for wanted in wanted_values)
        for other, wanted_values in (parameter.when or {}).items()
    )


def parse_search_space(data: Mapping[str, Any], path: Path | str = "<search space>") -> SearchSpace:
    """Validate a search space already read from YAML; errors are ConfigErrors naming `path`."""
    try:
        spec = SearchSpaceFile.model_validate(data)
    except ValidationError as exc:
        raise config_error_from_validation(path, exc, SearchSpaceFile) from None
    return SearchSpace(spec, path)


def load_search_space(path: Path | str) -> SearchSpace:
    """Read and validate a search space YAML file."""
    return parse_search_space(load_yaml(path), path)
