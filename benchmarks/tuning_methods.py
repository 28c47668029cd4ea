"""How people tune today, written as Optuna samplers so that they run through the same study loop, on the
same nodes and under the same outcome rules as autotune's own sampler:

- `TwoFlagGrid`: every point of a grid over two flags, all other knobs at their defaults (vLLM's
  benchmarks/auto_tune does this over max-num-seqs x max-num-batched-tokens).
- `OneGroupAtATime`: tune NCCL, then SGLang's flags, then speculation, each with its share of the budget:
  random values for the group being tuned, the best trial's values for the groups tuned before it,
  defaults for the groups after it.

A trial's position is the number of budget-counted trials before it, less the baseline (trial 0), so a
proposal that is refused as known-incompatible does not use up a grid point or a stage's share.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial

from autotune.study.rules import best_trial
from autotune.study.samplers import default_of
from autotune.study.storage import finished_count


class _PositionSampler(BaseSampler):
    """A sampler that decides each parameter by the trial's position in the study; no relative sampling."""

    def __init__(self, defaults: Mapping[str, Any]) -> None:
        self.defaults = dict(defaults)
        self._positions: dict[int, int] = {}

    def position(self, study: Study, trial: FrozenTrial) -> int:
        if trial.number not in self._positions:
            self._positions = {trial.number: max(0, finished_count(study) - 1)}  # the baseline ran first
        return self._positions[trial.number]

    def default(self, name: str, distribution: BaseDistribution) -> Any:
        """The value that leaves SGLang's or NCCL's own behaviour: unset or off, else `defaults[name]`."""
        if name in self.defaults:
            return self.defaults[name]
        value = default_of(distribution)
        if value is not None and value is not False:
            raise ValueError(f"{name} has no default value; pass one in `defaults` (got {value!r}).")
        return value

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {}


def grid_points(
    first: tuple[str, Sequence[Any]], second: tuple[str, Sequence[Any]], n_points: int
) -> list[dict[str, Any]]:
    """A grid of at most `n_points` over two flags, near-square (the second flag has fewer values), each
    flag's values spread evenly from its lowest to its highest."""
    (name_a, values_a), (name_b, values_b) = first, second
    count_b = min(len(values_b), max(1, round(n_points**0.5)))
    count_a = min(len(values_a), max(1, n_points // count_b))
    return [{name_a: a, name_b: b} for a in _spread(values_a, count_a) for b in _spread(values_b, count_b)]


def _spread(values: Sequence[Any], count: int) -> list[Any]:
    return [values[i] for i in np.unique(np.round(np.linspace(0, len(values) - 1, count)).astype(int))]


class TwoFlagGrid(_PositionSampler):
    """Trial k takes grid point k; every parameter outside the grid keeps its default."""

    def __init__(self, points: Sequence[Mapping[str, Any]], defaults: Mapping[str, Any]) -> None:
        super().__init__(defaults)
        if not points:
            raise ValueError("a grid needs at least one point, but got none.")
        self.points = [dict(point) for point in points]

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        point = self.points[min(self.position(study, trial), len(self.points) - 1)]
        if param_name in point:
            return point[param_name]
        return self.default(param_name, param_distribution)


def stage_sizes(n_trials: int, n_stages: int) -> list[int]:
    """`n_trials` split into `n_stages` near-equal shares, later stages taking the remainder."""
    base, extra = divmod(n_trials, n_stages)
    return [base + (1 if i >= n_stages - extra else 0) for i in range(n_stages)]


class OneGroupAtATime(_PositionSampler):
    """Stage i tunes the parameters of kind `order[i]` for `sizes[i]` trials, at random."""

    def __init__(
        self,
        kinds: Mapping[str, str],
        order: Sequence[str],
        sizes: Sequence[int],
        defaults: Mapping[str, Any],
        seed: int | None = None,
    ) -> None:
        super().__init__(defaults)
        if len(order) != len(sizes):
            raise ValueError(f"one share per group must be given, but got ({order=}, {sizes=}).")
        self.kinds = dict(kinds)
        self.order = list(order)
        self.ends = list(np.cumsum(sizes))
        self._random = RandomSampler(seed=seed)

    def stage(self, study: Study, trial: FrozenTrial) -> int:
        position = self.position(study, trial)
        return next((i for i, end in enumerate(self.ends) if position < end), len(self.ends) - 1)

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        stage = self.stage(study, trial)
        group = self.order.index(self.kinds[param_name])
        if group == stage:
            return self._random.sample_independent(study, trial, param_name, param_distribution)
        if group < stage:
            best = best_trial(study)
            if best is not None and param_name in best.params:
                return best.params[param_name]
        return self.default(param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()
