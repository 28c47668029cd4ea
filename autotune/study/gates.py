"""The checks before a launch: each looks at one proposal and returns why it must not be launched, as a
typed verdict, or None. The driver runs `GATES` in order and acts on the first verdict; a new check is a
function here and a line in `GATES`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.dialect import Dialect
from autotune.errors import ForbiddenLaunchError
from autotune.node.check import NodeReport
from autotune.study.before_launch import Refusal, kv_pool_before_launch
from autotune.study.preflight import beyond_memory_edge, predicted_oom
from autotune.study.records import StudyRecord, TrialRecord
from autotune.study.rules import earlier_launch, launch_identity
from autotune.study.run_state import RunState
from autotune.study.storage import counts
from autotune.trial.launch import ServerLaunch, TrialConfig


@dataclass(frozen=True)
class KnownIncompatible:
    """The node's hardware failed on one of these settings before (autotune.study.incompatible)."""

    why: str
    oom: ClassVar[bool] = False


@dataclass(frozen=True)
class PastMemoryEdge:
    """Further past the memory edge than a launch that ran out of memory (preflight.beyond_memory_edge)."""

    why: str
    oom: ClassVar[bool] = True


@dataclass(frozen=True)
class PredictedOom:
    """The pre-flight memory estimate says the launch cannot fit (preflight.predicted_oom)."""

    why: str
    oom: ClassVar[bool] = True


@dataclass(frozen=True)
class Forbidden:
    """The study file's `never_launch` refuses the launch; `why` is redacted of secrets."""

    why: str


@dataclass(frozen=True)
class SameLaunch:
    """An earlier trial launched the same server; its result stands for this proposal."""

    earlier: FrozenTrial


# Recorded by outcome.skipped, never launched (a Refusal: a flag the GPU cannot run, a KV pool too small).
Skipped = Refusal | KnownIncompatible | PastMemoryEdge | PredictedOom
Verdict = Skipped | Forbidden | SameLaunch


@dataclass
class Proposal:
    """A trial Optuna proposed, on the node it would run on, with what the checks read of the run."""

    run: RunState
    trial: optuna.Trial
    config: TrialConfig
    hardware: str | None
    facts: NodeReport | None
    dialect: Dialect | None

    @cached_property
    def launch(self) -> ServerLaunch:
        """The server launch; raises ForbiddenLaunchError where the study file forbids it."""
        return self.run.study.server_launch(self.config, dialect=self.dialect)

    def built(self) -> ServerLaunch | None:
        """The launch, when a check built it (the checks before the launch is built do not)."""
        return self.__dict__.get("launch")

    @cached_property
    def identity(self) -> dict[str, Any]:
        """What makes two launches the same (rules.launch_identity), recorded on the trial."""
        return launch_identity(self.launch, self.run.study.secrets)

    @cached_property
    def trials(self) -> list[FrozenTrial]:
        """The study's trials, read once for every check."""
        return self.run.optuna_study.get_trials(deepcopy=False)


Gate = Callable[[Proposal], Verdict | None]


def gpu_cannot_run(proposal: Proposal) -> KnownIncompatible | None:
    """A value the node's GPU cannot run, known from the run's start on (study.before_launch)."""
    return _known(proposal, before_launch=True)


def known_incompatible(proposal: Proposal) -> KnownIncompatible | None:
    """A value that failed on the node's hardware before."""
    return _known(proposal, before_launch=False)


def _known(proposal: Proposal, *, before_launch: bool) -> KnownIncompatible | None:
    known = proposal.run.known
    blocked = known.blocking(proposal.trial.params, proposal.hardware, before_launch=before_launch)
    return None if blocked is None else KnownIncompatible(known.why(blocked))


def past_memory_edge(proposal: Proposal) -> PastMemoryEdge | None:
    # A config queued by hand runs as asked, even past the edge (a user may want to see it again).
    options = proposal.run.options
    if not (options.preflight and options.memory_edge) or TrialRecord.of(proposal.trial).queued is not None:
        return None
    pruned = [t for t in proposal.trials if t.state is TrialState.PRUNED]
    edge = beyond_memory_edge(proposal.trial.params, proposal.hardware, pruned)
    return None if edge is None else PastMemoryEdge(edge)


def forbidden_launch(proposal: Proposal) -> Forbidden | None:
    try:
        _ = proposal.launch  # the study file may forbid it
    except ForbiddenLaunchError as exc:
        return Forbidden(proposal.run.study.secrets.redact(str(exc)))
    return None


def same_launch(proposal: Proposal) -> SameLaunch | None:
    """The earlier trial that launched the same server (rules.same_launch), when this proposal must not
    launch it again: not a measurement asked for on purpose (`TrialRecord.deliberate`)."""
    study, trial = proposal.run.study, proposal.trial
    identity = proposal.identity
    if not study.file.trust.skip_same_launch or TrialRecord.of(trial).deliberate:
        return None
    counted = [t for t in proposal.trials if counts(t)]
    # A flag left unset is the server's own choice in the baseline, else its parser's default.
    unset = {**proposal.run.flag_defaults, **StudyRecord.of(proposal.run.optuna_study).server_choices}
    earlier = earlier_launch(identity, counted, unset)
    return None if earlier is None else SameLaunch(earlier)


def predicted_oom_on_node(proposal: Proposal) -> PredictedOom | None:
    """Why this launch would certainly run out of memory on the node, from the node check's facts."""
    if not proposal.run.options.preflight:
        return None
    facts = proposal.facts
    declared = proposal.run.study.file.server.model_weight_gb
    weights = (
        declared
        if declared is not None
        else (facts.weight_bytes / 1e9 if facts is not None and facts.weight_bytes else None)
    )
    reason = predicted_oom(proposal.launch.flags, facts.gpu_memory_gb if facts is not None else None, weights)
    return None if reason is None else PredictedOom(reason)


def kv_pool_too_small(proposal: Proposal) -> Refusal | None:
    """A KV pool the baseline's memory report says is too small for the longest prompt
    (autotune.study.before_launch)."""
    run = proposal.run
    if not run.options.preflight:
        return None
    return kv_pool_before_launch(run.study, run.optuna_study, proposal.trial, proposal.trials)


# In order: the cheap checks on the settings first, then those that need the launch built.
GATES: tuple[Gate, ...] = (
    gpu_cannot_run,
    kv_pool_too_small,
    known_incompatible,
    past_memory_edge,
    forbidden_launch,
    same_launch,
    predicted_oom_on_node,
)


def first_verdict(proposal: Proposal) -> Verdict | None:
    """The first gate's verdict against launching `proposal`; None: launch it."""
    for gate in GATES:
        if (verdict := gate(proposal)) is not None:
            return verdict
    return None
