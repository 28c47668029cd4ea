"""What the study loop tells its observers (MLflow tracking, the console), one typed event per hook.

As Ray Tune's `Callback` and Syne Tune's `TunerCallback`: the loop calls each registered `StudyCallback`'s
hooks in its own thread, in the order they were registered; every hook of the base class does nothing, so
an observer overrides those it needs. An observer that raises stops the study.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import optuna
    from optuna.trial import FrozenTrial

    from autotune.config import Study
    from autotune.study.incompatible import Incompatibility
    from autotune.study.outcome import Outcome
    from autotune.study.summary import StudySummary
    from autotune.trial.launch import ServerLaunch, TrialConfig
    from autotune.trial.wire import TrialResult


@dataclass(frozen=True)
class Progress:
    """What a display shows: trial k of n, each running trial's phase, the best so far and the baseline."""

    total: int
    done: int
    running: Mapping[int, str]  # trial number -> its phase
    best: float | None
    baseline: float | None


@dataclass(frozen=True)
class StudyStarted:
    """The driver opened the study and is about to start trials; `recovered` were left by a dead driver."""

    study: Study
    recovered: tuple[int, ...]


@dataclass(frozen=True)
class TrialsRecovered:
    """Trials a dead driver left RUNNING, now FAIL (interrupted) and queued again: at the start or later."""

    trials: tuple[FrozenTrial, ...]


@dataclass(frozen=True)
class TrialStarted:
    """A trial was handed to a node. `trial` is Optuna's live trial: an observer may record attributes."""

    study: Study
    trial: optuna.Trial
    node: str
    baseline: bool
    config: TrialConfig
    launch: ServerLaunch
    ablation: tuple[int, str] | None  # (the ablated trial, the parameter reverted) for an ablation trial
    progress: Progress


@dataclass(frozen=True)
class PhaseChanged:
    """A running trial entered `phase`; `previous` took `previous_s` seconds."""

    number: int
    phase: str
    previous: str
    previous_s: float
    progress: Progress


@dataclass(frozen=True)
class TrialFinished:
    """A trial was told to Optuna: run on a node (`result`), or refused before launch (`result` None)."""

    study: Study
    number: int
    baseline: bool
    outcome: Outcome
    result: TrialResult | None
    launch: ServerLaunch | None
    elapsed_s: float  # since it was handed to its node
    progress: Progress


@dataclass(frozen=True)
class TrialInterrupted:
    """A Ctrl-C stopped a running trial: recorded FAIL (interrupted) and queued again."""

    number: int
    baseline: bool
    log: str  # the server's log up to the stop, when the node answered in time


@dataclass(frozen=True)
class IncompatibilityLearned:
    """A failure named settings this hardware cannot run: they are not proposed on it again."""

    new: tuple[Incompatibility, ...]
    known: tuple[Incompatibility, ...]  # every one known so far, `new` included


@dataclass(frozen=True)
class KnobHeld:
    """The node's server version lacks a knob: it stays at that version's default (one notice per knob)."""

    text: str


@dataclass(frozen=True)
class SummaryUpdated:
    """The study's standing after a trial ran: its summary, and the Optuna study it was read from."""

    study: Study
    optuna_study: optuna.Study
    summary: StudySummary


@dataclass(frozen=True)
class StudyInterrupting:
    """The first Ctrl-C (or SIGTERM, SIGHUP: `signal`): the running trials are being stopped."""

    trials: tuple[int, ...]
    signal: str = "SIGINT"


@dataclass(frozen=True)
class StudyEnded:
    """The loop ended: its budget spent (`summary` the final one), or interrupted (`summary` None)."""

    study: Study
    optuna_study: optuna.Study
    summary: StudySummary | None

    @property
    def interrupted(self) -> bool:
        return self.summary is None


class StudyCallback:
    """An observer of the study loop; each hook does nothing unless overridden."""

    def study_started(self, event: StudyStarted) -> None:
        """The study is open, before the first trial of this driver."""

    def trials_recovered(self, event: TrialsRecovered) -> None:
        """A dead driver's trials were recorded interrupted and queued again."""

    def trial_started(self, event: TrialStarted) -> None:
        """A trial was handed to a node."""

    def trial_phase_changed(self, event: PhaseChanged) -> None:
        """A running trial entered a new phase (launching, capturing, benchmarking, ...)."""

    def trial_finished(self, event: TrialFinished) -> None:
        """A trial was told to Optuna: its state, value and why it failed."""

    def trial_interrupted(self, event: TrialInterrupted) -> None:
        """A Ctrl-C stopped a running trial."""

    def incompatibility_learned(self, event: IncompatibilityLearned) -> None:
        """Settings this hardware cannot run were learned from a failure."""

    def knob_held(self, event: KnobHeld) -> None:
        """A knob stays at its default: the node's server version lacks it."""

    def summary_updated(self, event: SummaryUpdated) -> None:
        """The study's summary after a trial ran on a node."""

    def study_interrupting(self, event: StudyInterrupting) -> None:
        """A Ctrl-C: the running trials are being stopped."""

    def study_ended(self, event: StudyEnded) -> None:
        """The loop ended, its budget spent or interrupted (an error ends it without this)."""


class CallbackList(StudyCallback):
    """Several observers as one: each hook calls theirs in order."""

    def __init__(self, callbacks: Sequence[StudyCallback]) -> None:
        self.callbacks = tuple(callbacks)

    def study_started(self, event: StudyStarted) -> None:
        for callback in self.callbacks:
            callback.study_started(event)

    def trials_recovered(self, event: TrialsRecovered) -> None:
        for callback in self.callbacks:
            callback.trials_recovered(event)

    def trial_started(self, event: TrialStarted) -> None:
        for callback in self.callbacks:
            callback.trial_started(event)

    def trial_phase_changed(self, event: PhaseChanged) -> None:
        for callback in self.callbacks:
            callback.trial_phase_changed(event)

    def trial_finished(self, event: TrialFinished) -> None:
        for callback in self.callbacks:
            callback.trial_finished(event)

    def trial_interrupted(self, event: TrialInterrupted) -> None:
        for callback in self.callbacks:
            callback.trial_interrupted(event)

    def incompatibility_learned(self, event: IncompatibilityLearned) -> None:
        for callback in self.callbacks:
            callback.incompatibility_learned(event)

    def knob_held(self, event: KnobHeld) -> None:
        for callback in self.callbacks:
            callback.knob_held(event)

    def summary_updated(self, event: SummaryUpdated) -> None:
        for callback in self.callbacks:
            callback.summary_updated(event)

    def study_interrupting(self, event: StudyInterrupting) -> None:
        for callback in self.callbacks:
            callback.study_interrupting(event)

    def study_ended(self, event: StudyEnded) -> None:
        for callback in self.callbacks:
            callback.study_ended(event)
