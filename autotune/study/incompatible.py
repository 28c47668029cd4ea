"""Settings that failed deterministically on a node's hardware, remembered so they are never retried there.

A deterministic failure (UNSUPPORTED: a feature this GPU lacks; INVALID_ARGUMENTS: a flag SGLang
rejects) names the flags it implicates (`Failure.culprits`, the flags SGLang's message names). The
trial's values of those flags are recorded with the study against the node's hardware fingerprint (in
Optuna storage, so a resumed study remembers them); a later trial that proposes one of them on that
hardware is not launched, and a parameter left with one safe value is fixed for the sampler when every
node is of that hardware.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import optuna

from autotune.config import SearchSpace
from autotune.study.records import StudyRecord, record_incompatible
from autotune.study.samplers import IncumbentMoves
from autotune.trial.failures import Failure
from autotune.trial.launch import is_set

Incompatibility = tuple[str, object, str | None]  # parameter, value, hardware fingerprint


class KnownIncompatibilities:
    """The (parameter, value) pairs each kind of node's hardware cannot run."""

    def __init__(self, optuna_study: optuna.Study, space: SearchSpace) -> None:
        self._study = optuna_study
        self._space = space
        self.pairs: list[Incompatibility] = StudyRecord.of(optuna_study).incompatible
        # Why a pair fails, where it is known before any launch (study.before_launch: SGLang's own words);
        # held for this run only: the run that starts again works it out again.
        self.reasons: dict[Incompatibility, str] = {}

    def learn(
        self, params: Mapping[str, object], failure: Failure, hardware: str | None
    ) -> list[Incompatibility]:
        """Record the trial's values of the flags the failure names; returns what was new."""
        culprits = [(flag, params[flag]) for flag in failure.culprits if flag in params]
        return self.add(culprits, hardware)

    def add(
        self,
        values: Iterable[tuple[str, object]],
        hardware: str | None,
        reasons: Mapping[tuple[str, object], str] | None = None,
    ) -> list[Incompatibility]:
        """Record (parameter, value) pairs that fail on `hardware` (a failure's, or known before any
        launch: study.before_launch, with each one's reason in `reasons`); returns what was new."""
        for (name, value), why in (reasons or {}).items():
            self.reasons[(name, value, hardware)] = why
        new = [
            (name, value, hardware)
            for name, value in dict.fromkeys(values)
            if is_set(value) and (name, value, hardware) not in self.pairs
        ]
        if new:
            self.pairs.extend(new)
            record_incompatible(self._study, self.pairs)
        return new

    def blocking(
        self, params: Mapping[str, object], hardware: str | None, *, before_launch: bool = False
    ) -> Incompatibility | None:
        """The first value among `params` known to fail on `hardware` (`before_launch`: only those known
        before any launch), or None when the trial may launch."""
        for pair in self.pairs:
            name, value, where = pair
            if before_launch and pair not in self.reasons:
                continue
            if where == hardware and name in params and params[name] == value:
                return pair
        return None

    def why(self, pair: Incompatibility) -> str:
        """What a proposal with `pair` is told: the reason known before any launch, else the pair."""
        name, value, hardware = pair
        where = f" ({hardware})" if hardware else ""
        return self.reasons.get(pair, f"known incompatible with this node{where}: {name}={value}")

    def fixed_params(self, hardware: str | None) -> dict[str, object]:
        """Parameters left with exactly one value that has not failed on `hardware`."""
        bad = {(name, value) for name, value, where in self.pairs if where == hardware}
        fixed = {}
        for name in {name for name, _ in bad}:
            values = self._space.possible_values(name)
            if values is None:
                continue
            safe = [v for v in values if (name, v) not in bad]
            if len(safe) == 1:
                fixed[name] = safe[0]
        return fixed

    def sampler(
        self,
        base: optuna.samplers.BaseSampler,
        hardware: set[str | None],
        ignored: Mapping[str, object] | None = None,
    ) -> optuna.samplers.BaseSampler:
        """`base`, with the parameters that have one safe value left fixed to it when all nodes share one
        hardware (with several kinds, proposals for the wrong kind are refused at launch instead), and those
        the nodes' GPUs ignore every other value of (`ignored`: study.before_launch.ignored_on_gpu)."""
        fixed = self.fixed_params(next(iter(hardware))) if len(hardware) == 1 else {}
        fixed = {**(ignored or {}), **fixed}
        if isinstance(base, IncumbentMoves):
            base.held = dict(fixed)  # its moves leave these alone, or the fixing would undo them
        return optuna.samplers.PartialFixedSampler(fixed, base) if fixed else base
