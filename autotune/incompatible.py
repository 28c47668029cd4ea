"""Settings that failed deterministically on the study's hardware, remembered so they are never retried.

An UNSUPPORTED failure names the flags it implicates (`Failure.culprits`). The trial's values of those
flags are recorded with the study (in Optuna storage, so a resumed study remembers them); a later trial
that proposes one of them is not launched, and a parameter left with one safe value is fixed for the
sampler so it stops proposing the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

import optuna

from autotune.config import SearchSpace
from autotune.failures import Failure

STUDY_ATTR = "incompatible"


class KnownIncompatibilities:
    """The (parameter, value) pairs this study's hardware cannot run."""

    def __init__(self, ostudy: optuna.Study, space: SearchSpace) -> None:
        self._study = ostudy
        self._space = space
        self.pairs: list[tuple[str, object]] = [
            (name, value) for name, value in ostudy.user_attrs.get(STUDY_ATTR, [])
        ]

    def learn(self, params: Mapping[str, object], failure: Failure) -> list[tuple[str, object]]:
        """Record the trial's values of the flags the failure names; returns what was new."""
        new = [
            (flag, params[flag])
            for flag in failure.culprits
            if flag in params and params[flag] not in (None, False) and (flag, params[flag]) not in self.pairs
        ]
        if new:
            self.pairs.extend(new)
            self._study.set_user_attr(STUDY_ATTR, [list(pair) for pair in self.pairs])
        return new

    def blocking(self, params: Mapping[str, object]) -> tuple[str, object] | None:
        """The first known-incompatible value among `params`, or None when the trial may launch."""
        for name, value in self.pairs:
            if name in params and params[name] == value:
                return name, value
        return None

    def fixed_params(self) -> dict[str, object]:
        """Parameters left with exactly one value that has not failed: fixed for the sampler."""
        fixed = {}
        for name in {name for name, _ in self.pairs}:
            values = self._space.possible_values(name)
            if values is None:
                continue
            safe = [v for v in values if (name, v) not in self.pairs]
            if len(safe) == 1:
                fixed[name] = safe[0]
        return fixed

    def sampler(self, base: optuna.samplers.BaseSampler) -> optuna.samplers.BaseSampler:
        """`base`, with the parameters that have one safe value left fixed to it."""
        fixed = self.fixed_params()
        return optuna.samplers.PartialFixedSampler(fixed, base) if fixed else base
