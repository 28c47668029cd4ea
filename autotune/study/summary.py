"""The read-only questions about a study that the loop, the CLI and the views ask: its Pareto front, and
its summary (trials by state and failure kind, and its answer: autotune.study.trust.answer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.study.records import TrialRecord
from autotune.study.rules import is_feasible, non_dominated
from autotune.study.trust.answer import StudyAnswer, remeasured_record, study_answer

__all__ = ["StudySummary", "pareto_front", "study_summary"]


def pareto_front(optuna_study: optuna.Study) -> list[FrozenTrial]:
    """A multi-objective study's answer: the feasible COMPLETE trials that no other one dominates (at least
    as good in every objective and better in one), by number; [] for a single-objective study."""
    if len(optuna_study.directions) < 2:
        return []
    complete = [
        t
        for t in optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if t.values is not None and is_feasible(t)
    ]
    return sorted(non_dominated(complete, optuna_study.directions), key=lambda t: t.number)


@dataclass(frozen=True)
class StudySummary:
    """Trials counted by state and failure kind, and the study's answer: `answer` for one objective (None
    before a feasible trial completed), `pareto` (each front trial's number and values) for several. The
    best and baseline figures are the answer's, so a page showing both shows one answer."""

    states: dict[str, int]
    failure_kinds: dict[str, int]
    answer: StudyAnswer | None
    pareto: list[dict[str, Any]] | None

    @property
    def best_value(self) -> float | None:
        return self.answer.value if self.answer is not None else None

    @property
    def best_trial(self) -> int | None:
        return self.answer.trial if self.answer is not None else None

    @property
    def baseline_value(self) -> float | None:
        return self.answer.baseline_value if self.answer is not None else None

    @property
    def gain_pct(self) -> float | None:
        return self.answer.gain_pct if self.answer is not None else None

    @property
    def remeasured(self) -> dict[str, Any] | None:
        """The re-measured ranking behind the answer (`status --json`), None without one."""
        if self.answer is None or self.answer.remeasured is None:
            return None
        return remeasured_record(self.answer.remeasured)


def study_summary(optuna_study: optuna.Study) -> StudySummary:
    """Trials counted by state and failure kind, and the study's answer (or Pareto front)."""
    states: dict[str, int] = {}
    kinds: dict[str, int] = {}
    for trial in optuna_study.get_trials(deepcopy=False):
        states[trial.state.name] = states.get(trial.state.name, 0) + 1
        kind = TrialRecord.of(trial).failure_kind_text
        if kind:
            kinds[kind] = kinds.get(kind, 0) + 1
    if len(optuna_study.directions) > 1:
        front = [{"number": t.number, "values": list(t.values or [])} for t in pareto_front(optuna_study)]
        return StudySummary(states, kinds, None, front)
    return StudySummary(states, kinds, study_answer(optuna_study), None)
