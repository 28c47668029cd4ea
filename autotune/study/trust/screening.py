"""Knob screening: a knob shown to have no effect beyond the run-to-run noise is held at SGLang's default and
takes no more of the budget (`trust.screen`).

The evidence is launched configs that differ in that knob alone, each pair within the noise band; the
methods (`alone`, `moves`) differ in where the pairs come from. The rule in full: docs/design.md,
"Knob screening".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.config.search_space import (
    BoolParameter,
    CategoricalParameter,
    FloatParameter,
    IntParameter,
    SpeculativeRules,
    same_value,
)
from autotune.dialect import FlagTable, all_committed_tables
from autotune.study.records import StudyRecord, TrialRecord, marks, record_screened
from autotune.study.rules import is_feasible
from autotune.study.storage import counts
from autotune.study.trust.noise import noise_estimate

__all__ = [
    "Held",
    "extremes",
    "flag_defaults",
    "held_knobs",
    "knob_defaults",
    "plan_alone",
    "record",
    "screen",
    "screened_lines",
    "why_all_held",
]

_UNKNOWN = object()


@dataclass(frozen=True)
class Held:
    """A knob screened out: the value it is held at, and why, in a sentence."""

    knob: str
    value: Any
    why: str


# A parser's default (0.3) and a range's step in floats (0.1 * 3 = 0.30000000000000004) are one value.
SAME_NUMBER_TOLERANCE = 1e-9


def _same(a: object, b: object) -> bool:
    return same_value(a, b, tolerance=SAME_NUMBER_TOLERANCE)


def flag_defaults(tables: Sequence[FlagTable]) -> dict[str, Any]:
    """Each flag's default in the server's parser: from the nodes' own tables first, then the committed
    tables, newest first (a table read from --help has none)."""
    defaults: dict[str, Any] = {}
    for table in [*tables, *reversed(all_committed_tables())]:
        for flag in table:
            for option in flag.options:
                if flag.default is not None and not isinstance(flag.default, list | dict):
                    defaults.setdefault(option, flag.default)
    return defaults


def knob_defaults(study: Study, known: Mapping[str, Any], held: Iterable[str] = ()) -> dict[str, Any]:
    """The knobs screening may hold, each with SGLang's default as the search space writes it: unset (None),
    off (False), or for a range with no "unset" the step nearest to `known[knob]`: the value the server chose
    for itself in the baseline, or its parser's default (`flag_defaults`); a knob with neither waits."""
    parameters = study.search_space.parameters
    gates = {gate for p in parameters.values() for gate in (p.when or {})}
    defaults: dict[str, Any] = {}
    for name, parameter in parameters.items():
        if parameter.when or name in gates or name in held or SpeculativeRules.is_speculative_flag(name):
            continue
        value = _default(parameter, known.get(name))
        if value is not _UNKNOWN:
            defaults[name] = value
    return defaults


def _default(parameter: Any, chosen: Any) -> Any:
    if isinstance(parameter, CategoricalParameter) and any(c is None for c in parameter.choices):
        return None
    if isinstance(parameter, BoolParameter):
        return False
    if not isinstance(chosen, int | float) or isinstance(chosen, bool):
        return _UNKNOWN
    if isinstance(parameter, FloatParameter | IntParameter):
        step = parameter.step or 0
        value = min(max(float(chosen), parameter.low), parameter.high)
        if step:
            value = parameter.low + round((value - parameter.low) / step) * step
        return round(value) if isinstance(parameter, IntParameter) else round(value, 10)
    if isinstance(parameter, CategoricalParameter):
        numbers = [c for c in parameter.choices if isinstance(c, int | float) and not isinstance(c, bool)]
        return min(numbers, key=lambda c: abs(c - chosen)) if numbers else _UNKNOWN
    return _UNKNOWN


def extremes(parameter: Any, default: Any, also: Any = None) -> list[Any]:
    """Where `alone` moves a knob: the lowest and highest value of a range or of numeric choices, the first
    and last choice other than the default (nor `also`, the value SGLang takes when it is unset), on for a
    switch."""
    if isinstance(parameter, BoolParameter):
        return [True]
    if isinstance(parameter, FloatParameter | IntParameter):
        values = [parameter.low, parameter.high]
    else:
        others = [
            c for c in parameter.choices if not _same(c, default) and not _same(c, also) and c is not None
        ]
        numeric = all(isinstance(c, int | float) and not isinstance(c, bool) for c in others)
        values = sorted(others) if numeric else others
        values = values[:1] + values[-1:] if len(values) > 1 else values
    return [v for v in dict.fromkeys(values) if not _same(v, default)]


def _known(optuna_study: optuna.Study, flags: Mapping[str, Any]) -> dict[str, Any]:
    return {**flags, **StudyRecord.of(optuna_study).server_choices}


def plan_alone(
    study: Study, optuna_study: optuna.Study, held: Iterable[str] = (), flags: Mapping[str, Any] | None = None
) -> int:
    """Queue the `alone` method's launches once the baseline completed: each knob alone at each of its
    extremes, every other knob at its default (once per study); returns how many were queued. `held`: the
    knobs a stage holds; `flags`: the server's flag defaults (`flag_defaults`)."""
    settings = study.file.trust.screen
    if not settings.enabled or settings.method != "alone" or len(optuna_study.directions) != 1:
        return 0
    trials = optuna_study.get_trials(deepcopy=False)
    if any(TrialRecord.of(t).screen is not None for t in trials):
        return 0
    if not any(TrialRecord.of(t).baseline and t.state == TrialState.COMPLETE for t in trials):
        return 0
    known = _known(optuna_study, flags or {})
    defaults = knob_defaults(study, known, held)
    queued = 0
    for knob, default in defaults.items():
        for value in extremes(study.search_space.parameters[knob], default, known.get(knob)):
            optuna_study.enqueue_trial({**defaults, knob: value}, user_attrs=marks(screen={knob: value}))
            queued += 1
    return queued


@dataclass
class _Measured:
    config: dict[str, Any]  # the knobs away from their defaults
    values: list[float]
    failed: bool


def _measured(
    trials: Sequence[FrozenTrial], defaults: Mapping[str, Any], known: Mapping[str, Any]
) -> list[_Measured]:
    """Every config launched (or known not to start), with its values; knobs at their default (unset, off,
    or the value SGLang takes when unset, `known`) left out."""
    groups: dict[tuple[tuple[str, str], ...], _Measured] = {}
    for trial in sorted(trials, key=lambda t: t.number):
        record = TrialRecord.of(trial)
        if not trial.state.is_finished() or record.same_as is not None:
            continue
        if not counts(trial) and not record.skipped:
            continue  # interrupted, node lost: says nothing about its settings
        config = {
            n: v
            for n, v in trial.params.items()
            if not (n in defaults and _same(v, defaults[n]))
            and not _same(v, known.get(n, _UNKNOWN))
            and not (v is None or v is False)
        }
        key = tuple(sorted((n, repr(v)) for n, v in config.items()))
        group = groups.setdefault(key, _Measured(config, [], False))
        if trial.state == TrialState.COMPLETE and trial.value is not None and is_feasible(trial):
            group.values.append(float(trial.value))
        else:
            group.failed = True
    return list(groups.values())


def _effects(measured: list[_Measured], knobs: Iterable[str]) -> dict[str, list[tuple[Any, float | None]]]:
    """Per knob, the pairs of configs that differ in it alone: the value it moved to and the relative
    change of the mean (None when one of the two failed)."""
    wanted = set(knobs)
    effects: dict[str, list[tuple[Any, float | None]]] = {k: [] for k in wanted}
    for i, a in enumerate(measured):
        for b in measured[i + 1 :]:
            names = set(a.config) | set(b.config)
            changed = [n for n in names if not _same(a.config.get(n), b.config.get(n))]
            if len(changed) != 1 or changed[0] not in wanted:
                continue
            knob = changed[0]
            # From the config at the default, or the lower value, to the other.
            low, high = (a, b) if knob not in a.config else (b, a) if knob not in b.config else (a, b)
            if low.failed or high.failed or not low.values or not high.values:
                effects[knob].append((high.config.get(knob), None))
                continue
            before, after = sum(low.values) / len(low.values), sum(high.values) / len(high.values)
            effects[knob].append((high.config.get(knob), after / before - 1 if before else None))
    return effects


def screen(
    study: Study, optuna_study: optuna.Study, held: Iterable[str] = (), flags: Mapping[str, Any] | None = None
) -> list[Held]:
    """The knobs newly shown to have no effect beyond noise (see the module's docstring); the caller holds
    them (`record`)."""
    settings = study.file.trust.screen
    if not settings.enabled or len(optuna_study.directions) != 1:
        return []
    noise = noise_estimate(optuna_study)
    if noise is None or noise.dof < settings.min_noise_dof:
        return []
    already = held_knobs(optuna_study)
    known = _known(optuna_study, flags or {})
    defaults = knob_defaults(study, known, held)
    candidates = [k for k in defaults if k not in already]
    if not candidates:
        return []
    trials = optuna_study.get_trials(deepcopy=False)
    if settings.method == "alone" and any(
        TrialRecord.of(t).screen is not None and not t.state.is_finished() for t in trials
    ):
        return []  # every knob's extremes first
    # The t quantile of the estimate's degrees of freedom: "no effect shown" at 95% with the spread itself
    # uncertain (with the normal one, a few early repeats that happen to agree call every knob an effect).
    band = noise.band()
    metric = study.objective.metric
    found = []
    for knob, pairs in _effects(_measured(trials, defaults, known), candidates).items():
        moved_to = {repr(v) for v, _ in pairs}
        # A switch has one other value: one pair with the defaults measures all it can do.
        values = len(extremes(study.search_space.parameters[knob], defaults[knob], known.get(knob)))
        if len(pairs) < min(settings.min_pairs, values) or len(moved_to) < min(2, values):
            continue
        if any(change is None or abs(change) > band for _, change in pairs):
            continue
        widest = max((change for _, change in pairs), key=lambda c: abs(c or 0.0)) or 0.0
        moves = ", ".join(sorted(moved_to))
        found.append(
            Held(
                knob,
                defaults[knob],
                f"{knob} held at its default: moving it alone ({_times(len(pairs))}, to {moves}) changed "
                f"{metric} by at most {widest:+.2%}, inside the run-to-run noise band of {band:.2%}",
            )
        )
    return sorted(found, key=lambda h: list(defaults).index(h.knob))


def _times(count: int) -> str:
    return "once" if count == 1 else f"{count} times"


def record(optuna_study: optuna.Study, found: Sequence[Held]) -> None:
    """Remember the screened-out knobs in the study, so that a resumed study holds them too."""
    kept = dict(StudyRecord.of(optuna_study).screened)
    for held in found:
        kept[held.knob] = {"value": held.value, "why": held.why}
    record_screened(optuna_study, kept)


def held_knobs(optuna_study: optuna.Study) -> dict[str, Any]:
    """The knobs the study's screening holds, with their values."""
    return {k: v["value"] for k, v in StudyRecord.of(optuna_study).screened.items()}


def screened_lines(optuna_study: optuna.Study) -> list[str]:
    """Why each screened-out knob is held, for the console, status and MLflow."""
    return [v["why"] for v in StudyRecord.of(optuna_study).screened.values()]


def why_all_held(study: Study, optuna_study: optuna.Study, held: Iterable[str] = ()) -> str | None:
    """Why the search stops when screening held every knob it may hold and the search space has no other:
    nothing is left to search; None otherwise."""
    screened = held_knobs(optuna_study)
    others = set(study.search_space.parameters) - set(held)
    if not screened or others - set(screened):
        return None
    return (
        f"stopped early: every knob ({', '.join(screened)}) moved alone changed nothing beyond the "
        "run-to-run noise and is held at its default; nothing is left to search"
    )
