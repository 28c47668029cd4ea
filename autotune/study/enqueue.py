"""Configs a user queues into a study by hand (`autotune enqueue`): the next trials run them, then the
sampler continues, learning from them as from any trial (an out-of-memory start is pruned and penalized).

A knob a config leaves out takes the baseline's value, a trial's, or for a range SGLang's own choice in the
baseline; every config is checked before any is queued. How each knob's value is found: docs/design.md,
"Queued configs".
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import yaml
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import FrozenTrial, TrialState

from autotune.config import SearchSpace, Study, load_yaml
from autotune.config.search_space import BoolParameter, same_value
from autotune.errors import ConfigError, ForbiddenLaunchError, did_you_mean
from autotune.study import optuna_internals
from autotune.study.records import StudyRecord, marks
from autotune.study.samplers import default_of, nearest
from autotune.study.storage import budget_used
from autotune.trial.launch import TrialConfig, to_arg

optuna.logging.set_verbosity(optuna.logging.WARNING)  # as the study loop: no "A new study created" line
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)

FROM_TRIAL_KEY = "from_trial"  # a configs file entry's key naming the trial its other knobs come from
BASELINE_CHOICE = "SGLang's own choice in the baseline"


@dataclass(frozen=True)
class Request:
    """One config as the user wrote it: the knobs set, the trial the others come from (None: the baseline),
    and where it was written (`path`, `field`), for errors."""

    settings: dict[str, object]
    from_trial: int | None
    path: Path
    field: str
    from_field: str  # where `from_trial` was written


@dataclass(frozen=True)
class Queued:
    """A checked config: every knob Optuna is told (`params`), and the launch settings they make."""

    request: Request
    params: dict[str, object]
    config: TrialConfig
    server_chosen: dict[str, object] = field(default_factory=dict)  # knobs at the baseline server's value

    @property
    def user_attr(self) -> dict[str, Any]:
        """The record on the trial: what the user set, and the trial the rest came from."""
        return {"set": dict(self.request.settings), "from_trial": self.request.from_trial}


def describe(record: Mapping[str, Any]) -> str:
    """`autotune status`'s note for a trial queued by hand."""
    settings = " ".join(f"{name}={to_arg(value)}" for name, value in (record.get("set") or {}).items())
    of = record.get("from_trial")
    rest = f"the rest from trial {of}" if of is not None else "the rest at the baseline's values"
    return f"queued by hand: {settings or 'nothing set'}; {rest}"


# -- what the user wrote --------------------------------------------------------------------------------
def knob_name(name: str, space: SearchSpace, path: Path, field: str) -> str:
    """The search space's name for `name`; a flag may be written without its leading dashes."""
    if name in space:
        return name
    if not name.startswith("-") and f"--{name}" in space:
        return f"--{name}"
    hint = did_you_mean(name, [*space, *(n.removeprefix("--") for n in space)]).strip()
    raise ConfigError(
        path,
        field,
        name,
        f"not a knob of the study's search space ({space.path.name})",
        f"{hint} Its knobs: {', '.join(space)}.".strip(),
    )


def parse_setting(text: str, space: SearchSpace, path: Path) -> tuple[str, object]:
    """NAME=VALUE from the command line, VALUE read as YAML reads a search space's values (null, true,
    0.9, Ring); a switch (a bool knob) alone means true."""
    raw_name, equals, raw = text.partition("=")
    name = knob_name(raw_name.strip(), space, path, f"--set {raw_name.strip()}")
    where = f"--set {name}"
    if not equals:
        if isinstance(space.parameters[name], BoolParameter):
            return name, True
        raise ConfigError(
            path, where, text, "no value", f"Write {name}=VALUE ({space.parameters[name].describe()})."
        )
    try:
        value = yaml.safe_load(raw) if raw.strip() else _EMPTY
    except yaml.YAMLError:
        value = _EMPTY
    if value is _EMPTY or not (value is None or isinstance(value, str | int | float | bool)):
        raise ConfigError(
            path,
            where,
            raw,
            "not one value",
            f"Write one value as in the search space ({space.parameters[name].describe()}), null for unset.",
        )
    return name, value


_EMPTY: Any = object()


def request_from_cli(
    settings: Sequence[str], from_trial: int | None, space: SearchSpace, study_path: Path
) -> Request:
    parsed: dict[str, object] = {}
    for text in settings:
        name, value = parse_setting(text, space, study_path)
        if name in parsed and not same_value(parsed[name], value):
            raise ConfigError(
                study_path, f"--set {name}", value, f"set twice (first to {parsed[name]!r})", "Set it once."
            )
        parsed[name] = value
    return Request(parsed, from_trial, study_path, "--set", "--from-trial")


def requests_from_file(path: Path, space: SearchSpace) -> list[Request]:
    """A configs file: `configs:`, a list of mappings of knob names to values, each optionally with
    `from_trial: N`."""
    data = load_yaml(path)
    configs = data.get("configs")
    extra = sorted(set(data) - {"configs"})
    if extra or not isinstance(configs, list) or not configs:
        raise ConfigError(
            path,
            extra[0] if extra else "configs",
            data.get(extra[0]) if extra else configs,
            "the file must hold `configs:`, a non-empty list of configs, and nothing else",
            "Write `configs: [{--mem-fraction-static: 0.9}, {NCCL_ALGO: Ring, from_trial: 8}]`.",
        )
    requests = []
    for index, entry in enumerate(configs):
        where = f"configs[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(
                path, where, entry, "a config must be a mapping", "Write `{--mem-fraction-static: 0.9}`."
            )
        of = entry.get(FROM_TRIAL_KEY)
        if of is not None and (not isinstance(of, int) or isinstance(of, bool)):
            raise ConfigError(path, f"{where}.{FROM_TRIAL_KEY}", of, "not a trial number", "Write e.g. 8.")
        settings: dict[str, object] = {}
        for raw, value in entry.items():
            if raw == FROM_TRIAL_KEY:
                continue
            name = knob_name(str(raw), space, path, f"{where}.{raw}")
            if name in settings:
                raise ConfigError(path, f"{where}.{raw}", value, f"{name} is set twice", "Set it once.")
            if not (value is None or isinstance(value, str | int | float | bool)):
                raise ConfigError(
                    path, f"{where}.{name}", value, "not one value", "Write one value, null for unset."
                )
            settings[name] = value
        requests.append(Request(settings, of, path, where, f"{where}.{FROM_TRIAL_KEY}"))
    return requests


# -- the config each request makes ------------------------------------------------------------------------
class _Proposer:
    """Answers `SearchSpace.suggest` as Optuna would for this config: the value set, else the base trial's,
    else the baseline's. Checks each value set against what the knob can take here."""

    def __init__(self, request: Request, base: Mapping[str, object], server: Mapping[str, float]) -> None:
        self.request = request
        self.base = base
        self.server = server
        self.params: dict[str, Any] = {}
        self.server_chosen: dict[str, object] = {}
        self.missing: list[str] = []

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int:
        return int(self._value(name, IntDistribution(low, high, step=step, log=log)))

    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float:
        return float(self._value(name, FloatDistribution(low, high, step=step, log=log)))

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any:
        return self._value(name, CategoricalDistribution(choices))

    def _value(self, name: str, distribution: BaseDistribution) -> Any:
        request = self.request
        value: Any
        if name in request.settings:
            value = request.settings[name]
            self._check(
                name, value, distribution, "", f"Set one of those, or widen {name} in the search space."
            )
        elif name in self.base:
            value = self.base[name]
            self._check(
                name, value, distribution, f"trial {request.from_trial}'s value is ", f"Set {name} too."
            )
        elif (default := default_of(distribution)) is None or default is False:
            value = default
        elif name in self.server:
            value = self.server_chosen[name] = nearest(distribution, self.server[name])
        else:
            self.missing.append(name)
            # A stand-in, so the knobs after it are asked too: every missing one is named at once.
            value = _first(distribution)
        if isinstance(distribution, FloatDistribution):
            value = float(value)
        self.params[name] = value
        return value

    def _check(self, name: str, value: object, distribution: BaseDistribution, whose: str, fix: str) -> None:
        """A value set, or taken from a trial (`whose` says so), must be one this knob takes here."""
        if not _takes(distribution, value):
            raise ConfigError(
                self.request.path,
                f"{self.request.field} {name}",
                value,
                f"{whose}outside the values this knob takes in this config ({_values(distribution)})",
                fix,
            )


def _first(distribution: BaseDistribution) -> Any:
    if isinstance(distribution, CategoricalDistribution):
        return distribution.choices[0]
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    return distribution.low


def _takes(distribution: BaseDistribution, value: object) -> bool:
    """Whether Optuna can be told `value` for this distribution: a choice (true is not 1), or a number in
    the range and on its step."""
    if isinstance(distribution, CategoricalDistribution):
        return any(same_value(value, choice) for choice in distribution.choices)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(distribution, IntDistribution) and not isinstance(value, int):
        return False
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    if not distribution.low <= value <= distribution.high:
        return False
    step = distribution.step
    if step is None:
        return True
    steps = (value - distribution.low) / step
    return abs(steps - round(steps)) < 1e-8


def _values(distribution: BaseDistribution) -> str:
    if isinstance(distribution, CategoricalDistribution):
        return "one of " + ", ".join("null" if c is None else str(c) for c in distribution.choices)
    assert isinstance(distribution, FloatDistribution | IntDistribution)
    step = f" in steps of {distribution.step:g}" if distribution.step not in (None, 1) else ""
    kind = "integers" if isinstance(distribution, IntDistribution) else "numbers"
    return f"{kind} {distribution.low:g}..{distribution.high:g}{step}"


def plan(
    study: Study, request: Request, trials: Sequence[FrozenTrial], server: Mapping[str, float]
) -> Queued:
    """Check `request` and build its config; ConfigError names what is wrong and how to fix it."""
    space = study.search_space
    base: Mapping[str, object] = {}
    if request.from_trial is not None:
        source = next((t for t in trials if t.number == request.from_trial), None)
        if source is None:
            raise ConfigError(
                request.path,
                request.from_field,
                request.from_trial,
                f"study {study.name!r} has no such trial",
                f"Pick one of trials 0..{len(trials) - 1}." if trials else "Run the study first.",
            )
        base = {**optuna_internals.fixed_params(source), **source.params}  # a queued one's values too
    proposer = _Proposer(request, base, server)
    config = space.suggest(proposer)
    for name in request.settings:
        if name not in proposer.params:
            raise _not_asked(study, request, name, config)
    if proposer.missing:
        raise _missing(request, proposer.missing, baseline_ran=bool(server))
    try:
        study.server_launch(config)
    except ForbiddenLaunchError as exc:
        raise ConfigError(
            request.path, request.field, dict(request.settings), str(exc), "Queue another value."
        ) from None
    return Queued(request, dict(proposer.params), config, proposer.server_chosen)


def _missing(request: Request, names: list[str], *, baseline_ran: bool) -> ConfigError:
    """The error for knobs with no baseline value to take: ranges, and choices without null."""
    listed = ", ".join(names)
    why = "" if baseline_ran else ", and the baseline has not run yet to show SGLang's own choice"
    later = "" if baseline_ran else ", or queue once the baseline ran (`autotune run --n-trials 1`)"
    return ConfigError(
        request.path,
        request.field,
        dict(request.settings),
        f"no value for {listed}: the search space has no 'leave it to SGLang' value for it{why}",
        "Set "
        + " ".join(f"{n}=VALUE" for n in names)
        + f", or take it from a trial (--from-trial N){later}.",
    )


def _not_asked(study: Study, request: Request, name: str, config: TrialConfig) -> ConfigError:
    """The error for a knob this config does not have: its `when` fails, or SGLang's rules set or drop it."""
    values = {**config.params, **config.derived}
    parameter = study.search_space.parameters[name]
    failing = {
        other: wanted
        for other, wanted in (parameter.when or {}).items()
        if not any(same_value(values.get(other), w) for w in wanted)
    }
    if failing:
        other, wanted = next(iter(failing.items()))
        shown = "null" if values.get(other) is None else values.get(other)
        listed = ", ".join("null" if w is None else str(w) for w in wanted)
        return ConfigError(
            request.path,
            f"{request.field} {name}",
            request.settings[name],
            f"this config has no {name}: its condition `when: {{{other}: {listed}}}` does not hold "
            f"({other} is {shown})",
            f"Set {other} too ({listed}), or leave {name} out.",
        )
    derived = f" (SGLang sets it to {config.derived[name]} here)" if name in config.derived else ""
    return ConfigError(
        request.path,
        f"{request.field} {name}",
        request.settings[name],
        f"SGLang's rules leave {name} out of this config{derived}",
        "Leave it out (draft tokens need a topk above 1; speculative knobs need steps and an algorithm).",
    )


# -- the study --------------------------------------------------------------------------------------------
def stored_study(study: Study) -> optuna.Study | None:
    """The study as stored, or None when it does not exist yet (nothing is created)."""
    if study.storage.startswith("sqlite:///") and not Path(study.storage[len("sqlite:///") :]).exists():
        return None
    try:
        return optuna.load_study(study_name=study.name, storage=study.storage)
    except KeyError:
        return None


def plan_all(study: Study, requests: Sequence[Request], optuna_study: optuna.Study | None) -> list[Queued]:
    """Every request checked against the study as it is now (none queued yet)."""
    trials = optuna_study.get_trials(deepcopy=False) if optuna_study is not None else []
    server = StudyRecord.of(optuna_study).server_choices if optuna_study is not None else {}
    return [plan(study, request, trials, server) for request in requests]


def waiting_line(optuna_study: optuna.Study, budget: int | None, study_file: Path | str) -> str | None:
    """What to type to run the trials still waiting (None when none is): they count in the budget, so
    once it has no room for them all, the total that does (`--n-trials` is the study's whole budget)."""
    waiting = len(optuna_study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
    if not waiting:
        return None
    used = budget_used(optuna_study)
    if budget is None or used + waiting <= budget:
        return f"{waiting} trial(s) waiting: `autotune run {study_file}` runs them before the sampler's"
    return (
        f"{waiting} trial(s) waiting, but the budget of {budget} trials has {used} used, room for "
        f"{max(budget - used, 0)}: `autotune resume {study_file} --n-trials {used + waiting}` runs them all"
    )


def enqueue(optuna_study: optuna.Study, queued: Sequence[Queued]) -> list[int]:
    """Queue the checked configs, in order; returns the numbers of their trials."""
    numbers = []
    for entry in queued:
        optuna_study.enqueue_trial(dict(entry.params), user_attrs=marks(queued=entry.user_attr))
        numbers.append(optuna_study.get_trials(deepcopy=False)[-1].number)
    return numbers
