"""Samplers: Optuna's, plus a start near SGLang's defaults for the sampler autotune uses by default.

Random configurations of a joint NCCL / SGLang / speculative space are mostly worse than the defaults
(forced protocols, odd channel counts, unsupported flags), so TPE's random start teaches it little.
`DefaultsStartSampler` keeps each parameter at its default ("unset", or off) with some probability
during the start and samples the rest at random: the first trials explore the baseline's neighbourhood,
where the gains of one or two changes show, and TPE models from there. A parameter that cannot be left
unset (a --mem-fraction-static range) stays within two steps of the value the server chose for itself
in the baseline, as the driver records it in the study's `server_choices` attribute: a random memory
fraction is the most common way to start a server that runs out of memory.

After the start, `FeasibleTPESampler` also learns where the feasible region ends: the best configs sit
next to the memory limit, and plain TPE, which only sees out-of-memory trials as bad values, keeps
proposing their neighbours that do not start.

`WithoutBaseline` hides the baseline trial (it sets no parameter) from a sampler that searches the
parameters every trial shares, such as Optuna's GPSampler (`gp`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.samplers import BaseSampler
from optuna.study import Study
from optuna.trial import FrozenTrial, TrialState

_NO_DEFAULT = object()
NEAR_STEPS = 2  # a start trial keeps a range knob within this many steps of the server's own value
SERVER_CHOICES_ATTR = "server_choices"  # a study attribute: what the server chose in the baseline


def default_of(distribution: BaseDistribution) -> Any:
    """A parameter's "leave it as SGLang/NCCL has it" value: None among the choices, else False."""
    if isinstance(distribution, CategoricalDistribution):
        for candidate in (None, False):
            if any(choice is candidate for choice in distribution.choices):
                return candidate
    return _NO_DEFAULT


def nearest(distribution: BaseDistribution, value: float) -> Any:
    """The value of a numeric distribution nearest to `value` (on its step), or _NO_DEFAULT."""
    if isinstance(distribution, FloatDistribution | IntDistribution):
        low, high, step = distribution.low, distribution.high, distribution.step
        clipped = min(max(value, low), high)
        if step is not None:
            clipped = low + round((clipped - low) / step) * step
        return int(clipped) if isinstance(distribution, IntDistribution) else round(clipped, 10)
    if isinstance(distribution, CategoricalDistribution):
        numbers = [c for c in distribution.choices if isinstance(c, int | float) and not isinstance(c, bool)]
        return min(numbers, key=lambda c: abs(c - value)) if numbers else _NO_DEFAULT
    return _NO_DEFAULT


class _Wrapper(BaseSampler):
    """A sampler around `base` that hands it the trial's start and end as they come."""

    base: BaseSampler

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self.base.after_trial(study, trial, state, values)

    def reseed_rng(self) -> None:
        self.base.reseed_rng()


class DefaultsStartSampler(_Wrapper):
    """`base` after `n_startup_trials`; before, each parameter keeps its default with `keep_default`."""

    def __init__(
        self,
        base: BaseSampler,
        *,
        n_startup_trials: int = 10,
        keep_default: float = 0.8,
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= keep_default <= 1.0:
            raise ValueError(f"`0 <= keep_default <= 1` must hold, but got ({keep_default=}).")
        self.base = base
        self.n_startup_trials = n_startup_trials
        self.keep_default = keep_default
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._decided: dict[int, bool] = {}
        self._server_choices: dict[str, float] = {}

    def _starting(self, study: Study, trial: FrozenTrial) -> bool:
        # Asked once per parameter: decided once per trial (reading every trial from storage is slow).
        if trial.number not in self._decided:
            states = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            finished = study.get_trials(deepcopy=False, states=states)
            self._decided = {trial.number: len(finished) < self.n_startup_trials}
            if self._decided[trial.number]:
                self._server_choices = dict(study.user_attrs.get(SERVER_CHOICES_ATTR) or {})
        return self._decided[trial.number]

    def _default(self, name: str, distribution: BaseDistribution) -> Any:
        """The value that leaves the server's own behaviour, or near it; _NO_DEFAULT when unknown."""
        default = default_of(distribution)
        chosen = self._server_choices.get(name)
        if default is _NO_DEFAULT and chosen is not None:
            # Near, not at, the server's value: a start trial that changes nothing else is then not a
            # repeat of the baseline (or of another such trial), and it measures the knob's slope there.
            if isinstance(distribution, FloatDistribution) and distribution.step is not None:
                chosen += distribution.step * self._rng.randint(-NEAR_STEPS, NEAR_STEPS)
            return nearest(distribution, chosen)  # clipped to the range, on its step
        return default

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {} if self._starting(study, trial) else self.base.infer_relative_search_space(study, trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return {} if self._starting(study, trial) else self.base.sample_relative(study, trial, search_space)

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        if not self._starting(study, trial):
            return self.base.sample_independent(study, trial, param_name, param_distribution)
        default = self._default(param_name, param_distribution)
        if default is not _NO_DEFAULT and self._rng.random() < self.keep_default:
            return default
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        super().reseed_rng()
        self._random.reseed_rng()


def _infeasible(trial: FrozenTrial) -> bool:
    """A finished trial that broke a constraint: an out-of-memory launch, or an objective's limit."""
    return trial.state is not TrialState.RUNNING and any(v > 0 for v in trial.constraints.values())


class FeasibleTPESampler(optuna.samplers.TPESampler):
    """TPE whose choice among its candidates also weighs how likely each is to be feasible.

    c-TPE's rule (Watanabe and Hutter, 2023) for one pass/fail constraint: a candidate's score, log l(x) -
    log g(x), gains log f(x) - log i(x), the Parzen densities of the feasible trials (completed, every
    constraint met) and of the infeasible ones (`trial.set_constraint` > 0: the driver sets it on each
    out-of-memory trial). Candidates still come from TPE's good density, so the search stays where the
    good trials are, but moves away from the configs next to them that did not start. Without both kinds
    of trial it is plain TPE. It hooks two of TPESampler's private methods (Optuna 5's, pinned in
    pyproject.toml; tests/test_samplers.py fails if they change).
    """

    def __init__(self, *args: Any, feasibility_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feasibility_weight = feasibility_weight
        self._fitting: tuple[Study, dict[str, BaseDistribution], list[FrozenTrial]] | None = None

    def _build_parzen_estimator(
        self,
        study: Study,
        search_space: dict[str, BaseDistribution],
        trials: list[FrozenTrial],
        handle_below: bool,
    ) -> Any:
        # TPESampler._sample builds the good density, then the bad one: together, every trial it uses.
        if handle_below:
            self._fitting = (study, search_space, list(trials))
        elif self._fitting is not None:
            self._fitting = (study, search_space, self._fitting[2] + list(trials))
        return super()._build_parzen_estimator(study, search_space, trials, handle_below)

    def _compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: Any, mpe_above: Any
    ) -> np.ndarray:
        score = super()._compute_acquisition_func(samples, mpe_below, mpe_above)
        if self._fitting is None or self.feasibility_weight == 0:
            return score
        study, space, trials = self._fitting
        self._fitting = None
        infeasible = [t for t in trials if _infeasible(t)]
        feasible = [t for t in trials if t.state is TrialState.COMPLETE and not _infeasible(t)]
        if not infeasible or not feasible:
            return score
        build = super()._build_parzen_estimator
        feasible_pdf = build(study, space, feasible, False)
        infeasible_pdf = build(study, space, infeasible, False)
        odds = feasible_pdf.log_pdf(samples) - infeasible_pdf.log_pdf(samples)
        return score + self.feasibility_weight * odds


class _WithParams:
    """A study as a sampler sees it, without the trials that set no parameter (the baseline)."""

    def __init__(self, study: Study) -> None:
        self._study = study

    def get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study.get_trials(*args, **kwargs) if t.params]

    def _get_trials(self, *args: Any, **kwargs: Any) -> list[FrozenTrial]:
        return [t for t in self._study._get_trials(*args, **kwargs) if t.params]

    @property
    def trials(self) -> list[FrozenTrial]:
        return self.get_trials()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._study, name)


def _with_params(study: Study) -> Study:
    return cast(Study, _WithParams(study))  # a Study in every way a sampler uses one


class WithoutBaseline(_Wrapper):
    """`base`, blind to the trials that set no parameter. A sampler that searches the intersection of every
    trial's parameters (Optuna's GPSampler) finds it empty once the baseline (SGLang's defaults, no
    parameters) is in the study, and then samples every parameter at random."""

    def __init__(self, base: BaseSampler) -> None:
        self.base = base

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.base.infer_relative_search_space(_with_params(study), trial)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        return self.base.sample_relative(_with_params(study), trial, search_space)

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        return self.base.sample_independent(_with_params(study), trial, param_name, param_distribution)


def gp(seed: int | None) -> BaseSampler:
    """Optuna's GPSampler (it needs PyTorch), searching the trials that set parameters."""
    return WithoutBaseline(optuna.samplers.GPSampler(seed=seed))


def tpe(
    seed: int | None,
    *,
    n_startup_trials: int = 10,
    keep_default: float = 0.8,
    feasibility_weight: float = 1.0,
    **options: Any,
) -> BaseSampler:
    """autotune's default: multivariate TPE, grouped for the conditional speculative knobs, started near
    the defaults, steering clear of the configs that run out of memory. The keyword arguments change its
    settings (`options` go to TPESampler; `feasibility_weight=0` is plain TPE after the start), for
    measuring other settings against it (benchmarks/sample_efficiency.py)."""
    settings = {"multivariate": True, "group": True, **options}
    base = FeasibleTPESampler(
        seed=seed, n_startup_trials=n_startup_trials, feasibility_weight=feasibility_weight, **settings
    )
    return DefaultsStartSampler(base, n_startup_trials=n_startup_trials, keep_default=keep_default, seed=seed)
