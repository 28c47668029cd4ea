"""Rules about a study's trials that every layer shares: which trial is feasible, which way is better.

This module sits below the sampler, the driver, re-measurement and the CLI (it imports Optuna's types
only for type checking), so each of them imports the rule from here instead of spelling it out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from optuna.study import StudyDirection
    from optuna.trial import FrozenTrial


def within_limits(constraints: Mapping[str, float]) -> bool:
    """Every constraint value is <= 0 (Optuna's convention: > 0 says by how much a limit was broken).

    No constraints at all (a study without limits, or a trial told before any was set) is within limits,
    as in Optuna's own rule (`optuna.study._constrained_optimization._get_feasible_trials`)."""
    return all(v <= 0 for v in constraints.values())


def is_feasible(trial: FrozenTrial) -> bool:
    """The trial met every constraint set on it (`within_limits`); its state is not looked at."""
    return within_limits(trial.constraints)


def maximizes(direction: StudyDirection | str) -> bool:
    """Higher is better: Optuna's `StudyDirection.MAXIMIZE`, or "maximize" as a study file writes it."""
    # By name, so the node side (which reads a study file's goal) need not load Optuna for this rule.
    return (direction if isinstance(direction, str) else direction.name).lower() == "maximize"


def direction_sign(direction: StudyDirection | str) -> float:
    """+1.0 to maximize, -1.0 to minimize: `sign * value` grows as the value gets better."""
    return 1.0 if maximizes(direction) else -1.0


def best_measured(trials: Iterable[FrozenTrial], direction: StudyDirection | str) -> FrozenTrial | None:
    """The best of single-objective trials by their one measured value: the feasible COMPLETE ones only,
    the lowest-numbered among equals; None when none is. Once configs were re-measured the study's answer
    is the config with the best mean instead (`autotune.study.loop.best_trial`, which falls back to this)."""
    sign = direction_sign(direction)
    candidates = [t for t in trials if t.state.name == "COMPLETE" and t.value is not None and is_feasible(t)]
    return max(
        sorted(candidates, key=lambda t: t.number), key=lambda t: sign * cast(float, t.value), default=None
    )
