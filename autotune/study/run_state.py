"""What one run of a study holds, from its opening to its end: the Optuna study, its observers, the trials
running, what was learned and why the search stopped. The driver (autotune.study.loop) keeps none of it;
the NCCL stage and the study it serves are two runs of one driver.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import optuna

from autotune.config import Study
from autotune.dialect import Dialect
from autotune.node.pool import Submitted
from autotune.study import samplers
from autotune.study.callbacks import CallbackList, Progress
from autotune.study.incompatible import KnownIncompatibilities
from autotune.study.summary import StudySummary, study_summary
from autotune.study.trust.noise import move_from

POLL_S = 0.5  # how long the driver waits for its nodes' results at a time


@dataclass(frozen=True)
class RunOptions:
    """How a run treats what Optuna proposes. All but the defaults are for measuring the tuner itself
    (benchmarks/), `compare`'s rounds (`queued_only`) and the NCCL stage (`preflight=False`)."""

    preflight: bool = True  # predicted OOMs are recorded, never launched
    memory_edge: bool = True  # proposals past the memory edge the study met are recorded, never launched
    remember_incompatible: bool = True  # settings that failed on a hardware are not proposed again on it
    # The trials queued in the study and nothing else: no proposal, baseline repeat, screening, stopping
    # rule or confirmation.
    queued_only: bool = False
    hours_from: str = "budget.node_hours"  # where the node-hour budget was given, for its error


@dataclass
class RunningTrial:
    """A trial handed to a node, and the phase it was last seen in."""

    trial: optuna.Trial
    submitted: Submitted
    baseline: bool
    started: float
    phase: str = "launching"
    phase_started: float = field(default_factory=time.monotonic)


@dataclass
class RunState:
    """One run of one study: set when the driver opens the study, changed by every step of the run."""

    study: Study
    optuna_study: optuna.Study
    storage: optuna.storages.BaseStorage
    observers: CallbackList
    known: KnownIncompatibilities
    sampler: optuna.samplers.BaseSampler | None  # the one given, replacing the study file's
    options: RunOptions
    accept_changes: bool
    trials_before: int  # trials the study had before this run queued its baseline
    budget: int | None  # the search's trials, all drivers' counted
    deadline: float | None
    stopped: str | None  # why the search ended; a resume given no budget stays stopped
    total: int  # the budget shown: the search's, then each confirmation round's
    done: int
    base_sampler: optuna.samplers.BaseSampler
    running: dict[int, RunningTrial] = field(default_factory=dict)
    searching: bool = False  # between the search's first and last trial (not the confirmation)
    baseline_only: bool = False  # before the NCCL stage: the baseline alone runs
    skips: int = 0  # proposals in a row that cannot run
    same_in_a_row: int = 0  # proposals in a row of launches made before
    standing: tuple[float | None, float | None] = (None, None)  # the best value and the baseline's
    stage_held: dict[str, Any] = field(default_factory=dict)  # the NCCL stage's values
    flag_defaults: dict[str, Any] = field(default_factory=dict)  # a flag left unset: its parser's default
    hardware: set[str | None] = field(default_factory=set)
    nvlink: bool = False  # every node's GPUs linked by NVLink, pair by pair (their node checks)
    ignored: dict[str, Any] = field(default_factory=dict)  # values the GPUs ignore: held (before_launch)
    hardware_by_node: dict[str, str | None] = field(default_factory=dict)
    dialects: dict[tuple[str | None, str], Dialect] = field(default_factory=dict)  # one notice each

    def progress(self, launching: int | None = None) -> Progress:
        """What a display shows now; `launching`: a trial about to be handed to its node."""
        best, baseline = self.standing
        phases = {number: entry.phase for number, entry in self.running.items()}
        if launching is not None:
            phases[launching] = "launching"
        return Progress(self.total, self.done, phases, best, baseline)

    def refresh_standing(self) -> StudySummary:
        """The study's summary now, its best value and the baseline's kept for the progress shown."""
        summary = study_summary(self.optuna_study)
        self.standing = (summary.best_value, summary.baseline_value)
        return summary

    def holding(self, held: dict[str, Any], trials_so_far: int | None = None) -> optuna.samplers.BaseSampler:
        """The study's sampler, holding the NCCL stage's values (and the knobs screening held): the study
        file's, built with them (tpe keeps them out of its moves), or the sampler given, with them fixed."""
        if self.sampler is None:
            so_far = self.trials_before if trials_so_far is None else trials_so_far
            spec = self.study.file.sampler
            return samplers.build(spec, staged=held, trials_so_far=so_far)
        return optuna.samplers.PartialFixedSampler(held, self.sampler)

    def current_sampler(self) -> optuna.samplers.BaseSampler:
        """The study's sampler now: its base, with what the study learned fixed (`KnownIncompatibilities`),
        its moves starting from a config tied with the best within noise when `trust.noise_ties` says so and
        told the KV tokens the workload holds at once (a best whose pool held fewer raises its fraction)."""
        if isinstance(self.base_sampler, samplers.IncumbentMoves):
            self.base_sampler.in_flight = self.study.in_flight
            if isinstance(self.base_sampler.base, samplers.DefaultsStartSampler):
                self.base_sampler.base.tree_algorithms = self.study.tree_algorithms
            if self.study.file.trust.noise_ties:
                self.base_sampler.reference = move_from
        return self.known.sampler(self.base_sampler, self.hardware, self.ignored)
