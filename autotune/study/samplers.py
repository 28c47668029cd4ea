"""Samplers: Optuna's, plus a start near SGLang's defaults for the sampler autotune uses by default.

Random configs of a joint NCCL / SGLang / speculative space are mostly worse than the defaults, so the
default sampler starts near them (`DefaultsStartSampler`), learns where the feasible region ends
(`FeasibleTPESampler`) and moves from the best trial as a person tuning by hand would (`IncumbentMoves`);
`WithoutBaseline` serves samplers that search only the parameters every trial shares. The reasoning:
docs/design.md, "Samplers"; the measurements behind each choice: benchmarks/RESULTS.md.
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

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

from autotune.config.objective import InFlight
from autotune.config.search_space import SpeculativeRules, same_value
from autotune.config.study import SamplerSpec
from autotune.study import optuna_internals
from autotune.study.records import StudyRecord, TrialRecord, record_proposed
from autotune.study.rules import (
    ConfigKey,
    at_no_rate,
    best_trial,
    config_key,
    is_feasible,
    measurement_groups,
)
from autotune.trial.failures import FailureKind
from autotune.trial.memory_fraction import MEM_FRACTION, config_fraction, fraction_to_hold, minimum_viable

_NO_DEFAULT = object()
NEAR_STEPS = 2  # a start trial keeps a range knob within this many steps of the server's own value
BRANCH_TRIALS = 3  # trials each speculative algorithm gets on purpose right after the start
# The start's finished trials, the baseline's among them: the baseline and one proposal near the defaults,
# then the moves from the best (the branch trials first). They find more in a few launches than proposals
# near the defaults, and move from the defaults where the proposal lost to them (IncumbentMoves._reference):
# a start of 10, then 3, cost every profile node hours for the same answers and the coder its first
# good launch by auto_benchmark's node hours (benchmarks/RESULTS.md, "A start of the baseline and one
# proposal").
START_TRIALS = 2
# A line search goes on past a neighbour worse than the best by more than this share of the best's value:
# less is within the run-to-run noise of the nodes measured (benchmarks/RESULTS.md, issue 29).
CLIMB_MARGIN = 0.005
LINE_SEARCH = "a line search"  # how `autotune status` names its trials (PROPOSED_ATTR)
# A best whose KV pool held fewer tokens than the workload keeps in flight raises its memory fraction at most
# this many steps at once, the two launches of a line search's growing steps (1 + 2): holding them all may
# take the memory a fast config needs for activations and graphs (on the MoE coder profile an uncapped jump
# to 0.93 was slower than 0.83 every time; benchmarks/RESULTS.md, "The KV pool's shortfall").
POOL_STEPS = 3
MAX_RUNNING = "--max-running-requests"  # SGLang's cap on the requests it runs at once
RUNNING_CAP = "a cap on running requests"  # how `autotune status` names them (IncumbentMoves._running_cap)
TPOT_LIMIT = "tpot_ms"  # the SLO's limit on the time per output token (workloads.Slo)
# Where a line search finds the memory's edge, the flag whose smaller value moves it, by how the launch past
# it failed (beside FailureKind.flag_to_lower's): a prefill batch's activations grow with the chunk.
EDGE_KNOBS = {FailureKind.OOM_UNDER_LOAD.value: "--chunked-prefill-size"}
# SGLang's documented defaults for an EAGLE tree, "the same for EAGLE-2 and EAGLE-3": num_steps 5,
# eagle_topk 4, num_draft_tokens 8 (docs.sglang.io/advanced_features/speculative_decoding.html), where
# a branch's first trial starts; the docs send the user on to bench_speculative.py, as the moves do.
DOCUMENTED_TREE = {
    SpeculativeRules.STEPS: 5,
    SpeculativeRules.TOPK: 4,
    SpeculativeRules.DRAFT_TOKENS: 8,
}
# The trees a speculative branch gets on purpose, in order (see IncumbentMoves._branch).
BRANCH_PLAN = ("SGLang's documented tree", "the chain of SGLang's adaptive mode", "twice the draft tokens")
TREE_KNOBS = (SpeculativeRules.STEPS, SpeculativeRules.TOPK, SpeculativeRules.DRAFT_TOKENS)
# SGLang hands an all-reduce to the first of its communicators that takes it: the custom kernel (every tensor
# under 8 MiB where it runs: full NVLink, or two GPUs), quick all-reduce, mscclpp, torch symmetric memory,
# NCCL (reference/sglang.md). So turning torch symmetric memory on alone reaches only the large all-reduces,
# and turning the custom kernel off alone hands the small ones to NCCL: the path is tried as one move, then
# with FlashInfer's fusion of the all-reduce and the norm after it. Each step once, from the best.
FUSION = "--enable-flashinfer-allreduce-fusion"
_SYMM_MEM = {"--disable-custom-all-reduce": True, "--enable-torch-symm-mem": True}
ALLREDUCE_PLAN: tuple[tuple[str, dict[str, Any]], ...] = (
    ("torch symmetric memory in place of the custom all-reduce", _SYMM_MEM),
    ("torch symmetric memory and FlashInfer's all-reduce fusion", {**_SYMM_MEM, FUSION: True}),
)
# How `autotune status` names the branches' trials (PROPOSED_ATTR).
SPECULATIVE_BRANCH = f"exploring {SpeculativeRules.ALGORITHM}"
ALLREDUCE_BRANCH = "exploring the all-reduce path"
# Why a start speculates where SGLang's defaults met the SLO at no rate (DefaultsStartSampler).
NO_RATE_SAID = "SGLang's defaults met your SLO at no rate"
# NGRAM has no tree (SpeculativeRules): its branch tries SGLang's own draft tokens, then half and twice them.
NGRAM_PLAN = (
    f"SGLang's ngram default of {SpeculativeRules.NGRAM_DEFAULT_DRAFT_TOKENS} draft tokens",
    "half the ngram draft tokens",
    "twice the ngram draft tokens",
)


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
    """`base` after `n_startup_trials`; before, each parameter keeps its default with `keep_default`. Where
    SGLang's defaults met the objective's SLO at no rate (`at_no_rate`), the start's proposal is the defaults
    with SGLang's documented tree of the first speculative algorithm that has one (`tree_algorithms`): a
    proposal near the defaults would walk its load search down the slow rates where they missed (555-837 s
    of 2.9 node hours on 4x L40S, an hour without a budget), and speculation is what cuts the time per
    output token. The speculative branch counts it as its documented tree (IncumbentMoves._branch)."""

    def __init__(
        self,
        base: BaseSampler,
        *,
        n_startup_trials: int = 10,
        keep_default: float = 0.8,
        start_values: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        if not 0.0 <= keep_default <= 1.0:
            raise ValueError(f"`0 <= keep_default <= 1` must hold, but got ({keep_default=}).")
        self.base = base
        # Values a cheaper study found for some knobs (an NCCL all-reduce study's best): kept in their place.
        self.start_values = dict(start_values or {})
        self.n_startup_trials = n_startup_trials
        self.keep_default = keep_default
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._decided: dict[int, bool] = {}
        self._server_choices: dict[str, float] = {}
        # The speculative algorithms with a tree the search space offers (set by the study loop).
        self.tree_algorithms: tuple[str, ...] = ()
        self._speculative: str | None = None  # the start's algorithm where the defaults met no rate

    def _starting(self, study: Study, trial: FrozenTrial) -> bool:
        # Asked once per parameter: decided once per trial (reading every trial from storage is slow).
        if trial.number not in self._decided:
            self._decided = {trial.number: len(_finished(study)) < self.n_startup_trials}
            self._speculative = None
            if self._decided[trial.number]:
                self._server_choices = StudyRecord.of(study).server_choices
                self._speculative = self._no_rate_start(study)
        return self._decided[trial.number]

    def _no_rate_start(self, study: Study) -> str | None:
        """The algorithm the start's proposal speculates with: the first with a tree, where every launch of
        SGLang's defaults measured 0; None otherwise."""
        if not self.tree_algorithms or study.direction != optuna.study.StudyDirection.MAXIMIZE:
            return None
        defaults = next((g for g in measurement_groups(study) if g.baseline), None)
        return self.tree_algorithms[0] if at_no_rate(defaults, maximize=True) else None

    def _default(self, name: str, distribution: BaseDistribution) -> Any:
        """The value that leaves the server's own behaviour, or near it; _NO_DEFAULT when unknown."""
        if name in self.start_values and _contains(distribution, self.start_values[name]):
            return self.start_values[name]
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
        if self._speculative is not None:
            speculated = self._speculative_start(study, trial, param_name, param_distribution)
            if speculated is not _NO_DEFAULT:
                return speculated
            if default is not _NO_DEFAULT:
                return default
        # A knob with no "unset" (the memory fraction) stays near the server's choice in every start trial.
        if default is not _NO_DEFAULT and (
            self._rng.random() < self.keep_default or default_of(param_distribution) is _NO_DEFAULT
        ):
            return default
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def _speculative_start(
        self, study: Study, trial: FrozenTrial, name: str, distribution: BaseDistribution
    ) -> Any:
        """The no-rate start's value of a speculative knob (the algorithm, its documented tree), and why the
        trial runs where it is the algorithm; _NO_DEFAULT for the other knobs."""
        algorithm = self._speculative
        if name == SpeculativeRules.ALGORITHM and _contains(distribution, algorithm):
            why = f"{SPECULATIVE_BRANCH} {algorithm}: SGLang's defaults with {BRANCH_PLAN[0]}, first"
            record_proposed(optuna_internals.StoredTrial(study, trial), f"{why} ({NO_RATE_SAID})")
            return algorithm
        if name in DOCUMENTED_TREE:
            return nearest(distribution, DOCUMENTED_TREE[name])
        return _NO_DEFAULT

    def reseed_rng(self) -> None:
        super().reseed_rng()
        self._random.reseed_rng()
        self._rng.seed()  # a fresh seed from the OS, as Optuna reseeds its own samplers


def fraction_floor(trials: Sequence[FrozenTrial], distribution: BaseDistribution) -> float | None:
    """The smallest --mem-fraction-static on the distribution's steps that the server's own messages allow:
    above the minimum viable fraction a KV_POOL_TOO_SMALL trial's message names, or a step above the
    fraction of one whose message names none (SGLang's older "Not enough memory" line). None before any
    such trial. Draft weights raise the minimum, so the largest over the trials is kept."""
    floors = []
    for trial in trials:
        record = TrialRecord.of(trial)
        if record.failure_kind != FailureKind.KV_POOL_TOO_SMALL:
            continue
        line = record.failure or ""
        named = minimum_viable(line)
        failed = config_fraction(trial.params)
        above = failed + (getattr(distribution, "step", None) or 0.01) if failed is not None else None
        if named is not None:
            floors.append(max(named, above or 0.0))
        elif above is not None and "Not enough memory" in line:  # not a prompt longer than the pool
            floors.append(above)
    if not floors or not isinstance(distribution, FloatDistribution):
        return None
    floor, step = max(floors), distribution.step
    if step:  # the first step at or above the floor
        floor = distribution.low + math.ceil((floor - distribution.low) / step - 1e-9) * step
    return round(min(max(floor, distribution.low), distribution.high), 10)


def _infeasible(trial: FrozenTrial) -> bool:
    """A finished trial that broke a constraint: an out-of-memory launch, or an objective's limit."""
    return trial.state is not TrialState.RUNNING and not is_feasible(trial)


class FeasibleTPESampler(optuna_internals.HookedTPESampler):
    """TPE whose choice among its candidates also weighs how likely each is to be feasible.

    c-TPE's rule (Watanabe and Hutter, 2023) for one pass/fail constraint: a candidate's score, log l(x) -
    log g(x), gains log f(x) - log i(x), the Parzen densities of the feasible trials (completed, every
    constraint met) and of the infeasible ones (`trial.set_constraint` > 0: the driver sets it on each
    out-of-memory trial). Candidates still come from TPE's good density, so the search stays where the
    good trials are, but moves away from the configs next to them that did not start. Without both kinds
    of trial it is plain TPE. It overrides two steps of TPESampler's proposal, which are private in Optuna
    (autotune.study.optuna_internals keeps them; tests/study/test_optuna_internals.py fails if they change).
    """

    def __init__(self, *args: Any, feasibility_weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.feasibility_weight = feasibility_weight
        self._fitting: tuple[Study, dict[str, BaseDistribution], list[FrozenTrial]] | None = None

    def build_parzen_estimator(
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
        return super().build_parzen_estimator(study, search_space, trials, handle_below)

    def compute_acquisition_func(
        self, samples: dict[str, np.ndarray], mpe_below: Any, mpe_above: Any
    ) -> np.ndarray:
        score = super().compute_acquisition_func(samples, mpe_below, mpe_above)
        if self._fitting is None or self.feasibility_weight == 0:
            return score
        study, space, trials = self._fitting
        self._fitting = None
        infeasible = [t for t in trials if _infeasible(t)]
        feasible = [t for t in trials if _feasible(t)]
        if not infeasible or not feasible:
            return score
        build = super().build_parzen_estimator
        feasible_pdf = build(study, space, feasible, False)
        infeasible_pdf = build(study, space, infeasible, False)
        odds = feasible_pdf.log_pdf(samples) - infeasible_pdf.log_pdf(samples)
        return score + self.feasibility_weight * odds


def _with_params(study: Study) -> Study:
    return optuna_internals.study_with_trials(study, lambda t: bool(t.params))


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


_FLAG_TO_LOWER = {kind.value: kind.flag_to_lower for kind in FailureKind if kind.flag_to_lower}


_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def _finished(study: Study) -> list[FrozenTrial]:
    return study.get_trials(deepcopy=False, states=_FINISHED)


_Planned = tuple[dict[str, Any], str]  # a trial's config, and why a move or a repair planned it
Reference = Callable[[Study, list[FrozenTrial], random.Random], FrozenTrial | None]


def _best_of(study: Study, trials: list[FrozenTrial], rng: random.Random) -> FrozenTrial | None:
    return best_trial(study, trials)


def _contains(distribution: BaseDistribution, value: Any) -> bool:
    if isinstance(distribution, CategoricalDistribution):
        return any(same_value(value, choice) for choice in distribution.choices)
    if isinstance(distribution, FloatDistribution | IntDistribution):
        return isinstance(value, int | float) and distribution.low <= value <= distribution.high
    return False


class IncumbentMoves(_Wrapper):
    """`base`, with the trials a person tuning by hand would run, planned from the trials so far: a repair
    (a failure SGLang says a smaller value of one flag cures runs again with less of it), a move (one or two
    knobs of the best feasible trial changed), a branch trial right after the start (each speculative tree
    once, and in turn with them each step of the all-reduce path's) and a line search along a range knob
    (`_climb`). A config that ran is not planned again; a multi-objective study gets `base` alone. Each
    kind, and why: docs/design.md, "IncumbentMoves"."""

    def __init__(
        self,
        base: BaseSampler,
        *,
        n_startup_trials: int = 10,
        share: float = 0.8,
        second: float = 0.3,
        branch_trials: int = BRANCH_TRIALS,
        floor: bool = True,
        climb: bool = True,
        staged: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        for name, value in (("share", share), ("second", second)):
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"`0 <= {name} <= 1` must hold, but got ({name}={value}).")
        self.base = base
        self.n_startup_trials = n_startup_trials
        self.share = share
        self.second = second
        self.branch_trials = branch_trials
        self.floor = floor
        self.climb = climb
        self._rng = random.Random(seed)
        self._random = optuna.samplers.RandomSampler(seed=seed)
        self._plans: dict[int, dict[str, Any] | None] = {}
        self._floor: list[FrozenTrial] = []  # the finished trials, for the memory fraction's floor
        # Knobs the study holds at one value (a flag with one value left that this hardware runs, fixed by
        # autotune.study.incompatible): a move that changed one would be undone and repeat the config it left.
        self._held: dict[str, Any] = {}
        # Values a cheaper stage measured on this node (an NCCL all-reduce study's best), held in every trial.
        self.staged = dict(staged or {})
        # The trial the moves start from among the finished ones: the best (the study loop may set another
        # rule, such as any config within the run-to-run noise of the best: study.noise.move_from).
        self.reference: Reference = _best_of
        # The requests the workload keeps in flight on each replica of a trial's params (set by the study
        # loop: Study.in_flight): a best whose KV pool held fewer of their tokens gets its fraction raised.
        self.in_flight: Callable[[Mapping[str, Any]], InFlight | None] = lambda _params: None

    @property
    def held(self) -> dict[str, Any]:
        """The knobs no move changes: the staged values, and those the study fixed (set by the study loop)."""
        return {**self.staged, **self._held}

    @held.setter
    def held(self, fixed: Mapping[str, Any]) -> None:
        self._held = dict(fixed)

    def _plan(self, study: Study, trial: FrozenTrial) -> dict[str, Any] | None:
        # Asked once per parameter: planned once per trial.
        if trial.number not in self._plans:
            # A queued trial (the baseline, a config asked for by hand) runs its own values: no plan, no why.
            queued = bool(optuna_internals.fixed_params(trial))
            plan, why = (None, "") if queued else (self._new_plan(study) or (None, ""))
            if plan is not None:  # a system attr, as Optuna's own samplers keep theirs
                record_proposed(optuna_internals.StoredTrial(study, trial), why)
            self._plans = {trial.number: plan}
            self._floor = _finished(study)
        return self._plans[trial.number]

    def _viable(self, name: str, distribution: BaseDistribution, value: Any) -> Any:
        """Every proposal's memory fraction at least the smallest the server's messages said starts."""
        if name != MEM_FRACTION or not isinstance(value, float) or not self.floor:
            return value
        floor = fraction_floor(self._floor, distribution)
        return value if floor is None or value >= floor else floor

    def _new_plan(self, study: Study) -> _Planned | None:
        """The next trial's config and why, or None to leave the trial to `base`."""
        trials = study.get_trials(deepcopy=False)  # one read of storage per planned trial
        finished = [t for t in trials if t.state in _FINISHED]
        with_params = [t for t in trials if t.params]
        tried = {config_key(t.params) for t in with_params}
        repair = self._repair(finished, tried)
        if repair is not None or len(study.directions) > 1 or len(finished) < self.n_startup_trials:
            return repair
        # The study's answer, moved from (or, set by the study loop, a config tied with it within noise).
        best = self._reference(study, finished)
        if best is None:
            return None
        # The baseline's, where it leads: its knobs at their defaults, also as a plan asks them (with the
        # NCCL stage's values: the branches' "off" trial would otherwise run the defaults again).
        tried |= {config_key(best.params), config_key(_as_asked(best.params, self.held))}
        proposed = [TrialRecord.of(t).proposed or "" for t in finished]  # why each finished trial ran
        branches = [
            (kind, planned)
            for kind, planned in (
                (SPECULATIVE_BRANCH, self._branch(best, finished, with_params, tried)),
                (ALLREDUCE_BRANCH, self._allreduce_branch(best, proposed, with_params, tried)),
            )
            if planned is not None
        ]
        if branches:  # in turn, fewer trials so far first: each finds what the other's moves miss
            return min(branches, key=lambda branch: sum(why.startswith(branch[0]) for why in proposed))[1]
        capped = self._running_cap(best, tried)
        if capped is not None:
            return capped
        climb = self._climb(study, best, finished, tried) if self.climb else None
        if climb is not None or self._rng.random() >= self.share:
            return climb
        for _ in range(20):  # a move that repeats a tried config is drawn again
            move = self._move(best, with_params)
            if _asked(move, best.params, with_params) not in tried:
                changed = ", ".join(n for n in move if not same_value(move[n], best.params.get(n)))
                return move, f"a move from trial {best.number}, the best so far: {changed} changed"
        return None

    def _reference(self, study: Study, finished: list[FrozenTrial]) -> FrozenTrial | None:
        """The trial the moves start from (`reference`), among those that set knobs and the baseline. The
        baseline sets none: where it leads, it is moved from as the trial it is with every knob of the
        best trial that set them at its default (a range at SGLang's choice in the baseline, else left),
        speculation's tree knobs left out. A start whose proposals all lost to the defaults then does not
        hand its worst knob (a cap of 16 running requests: 0.67 of the defaults) to every branch trial."""
        knobs = [t for t in finished if t.params]
        baseline = [t for t in finished if not t.params and TrialRecord.of(t).baseline]
        best = self.reference(study, knobs + baseline, self._rng)
        if best is None or best.params or not knobs:
            return best
        template = self.reference(study, knobs, self._rng)
        if template is None:  # no trial that set knobs was measured: nothing to move
            return None
        chosen = StudyRecord.of(study).server_choices
        params: dict[str, Any] = {}
        for name, distribution in template.distributions.items():
            value = default_of(distribution)
            if value is _NO_DEFAULT and name in chosen:
                value = nearest(distribution, chosen[name])
            params[name] = template.params[name] if value is _NO_DEFAULT else value
        if params.get(SpeculativeRules.ALGORITHM) is None:
            params = {n: v for n, v in params.items() if n not in TREE_KNOBS}
        defaults = copy.deepcopy(best)
        defaults.params = params
        defaults.distributions = {n: template.distributions[n] for n in params}
        return defaults

    def _running_cap(self, best: FrozenTrial, tried: set[ConfigKey]) -> _Planned | None:
        """The best trial with SGLang's cap on running requests (MAX_RUNNING) lowered, where more of the
        requests at the load it missed the SLO at broke the time per output token (`tpot_ms`) than any other
        limit: to the smallest value the space offers at or above the requests it ran at once on average
        there, or, where its cap is at or below that already, to the next value down. The bursts above the
        cap then wait in the queue instead of slowing every decode past the limit; a best still missing on
        TPOT steps down again, one launch a step, until its misses break another limit or a lower cap loses.
        On 4x L40S the best known config is EAGLE-3's with a cap of 8 (0.875 req/s; 0.818 unset, at 16, 32
        and 64), which the sweep's one random move of the knob seldom found; on real SGLang a 1.1B model's
        defaults missed 4 ms a token with 30 running at once (benchmarks/RESULTS-sglang-h200.md). None where
        nothing says, the cap is held or at the space's smallest, or that config ran."""
        missed = TrialRecord.of(best).load_missed
        distribution = best.distributions.get(MAX_RUNNING)
        held = MAX_RUNNING in self.held
        if missed is None or held or not isinstance(distribution, CategoricalDistribution):
            return None  # nothing says, or the study holds the cap
        over = {name: int(count) for name, count in dict(missed.get("over") or {}).items()}
        tpot = over.pop(TPOT_LIMIT, 0)
        if tpot <= max(over.values(), default=0):
            return None  # its misses broke another limit as often: fewer at once would queue more
        in_flight = float(missed.get("in_flight") or 0.0)
        current = best.params.get(MAX_RUNNING)
        lower = [c for c in _numbers(distribution) if not isinstance(current, int | float) or c < current]
        cap = min((c for c in lower if c >= in_flight), default=max(lower, default=None))
        if cap is None:
            return None
        plan = _as_asked({**best.params, MAX_RUNNING: cap}, self.held)
        if config_key(plan) in tried:
            return None
        load = float(missed.get("load") or 0.0)
        why = (
            f"{RUNNING_CAP} from trial {best.number}, the best so far: {MAX_RUNNING} {cap} ({tpot} requests "
            f"broke {TPOT_LIMIT} at {load:g}, {in_flight:g} running at once on average)"
        )
        return plan, why

    def _repair(
        self, finished: list[FrozenTrial], tried: set[ConfigKey]
    ) -> tuple[dict[str, Any], str] | None:
        for failed in sorted(finished, key=lambda t: -t.number):
            record = TrialRecord.of(failed)
            flag = _FLAG_TO_LOWER.get(str(record.failure_kind_text))
            if flag is None or flag not in failed.params or flag in self.held:
                continue
            if str(record.proposed or "").startswith(LINE_SEARCH):
                continue  # past the edge on purpose: the line search goes back, and moves the edge itself
            # Unset means SGLang's own value, which the server logged before it failed.
            current = failed.params[flag]
            if current is None:
                current = record.server_choices.get(flag)
            smaller = [c for c in _numbers(failed.distributions[flag]) if current is None or c < current]
            if smaller:
                repaired = _as_asked({**failed.params, flag: min(smaller)}, self.held)
                if config_key(repaired) not in tried:
                    kind = record.failure_kind_text
                    return repaired, f"a repair of trial {failed.number} ({kind}): {flag} {min(smaller)}"
        return None

    def _branch(
        self,
        best: FrozenTrial,
        finished: list[FrozenTrial],
        with_params: list[FrozenTrial],
        tried: set[ConfigKey],
    ) -> _Planned | None:
        """A trial of a speculative algorithm explored on purpose, as the group method's speculative stage
        gives it, on the best trial's other knobs: speculation off (once, unless `branch_trials` trials ran
        without it), and for an algorithm the first `branch_trials` trees of BRANCH_PLAN that have not run:
        SGLang's documented tree; the chain (topk 1) its adaptive mode runs, at the steps that mode picks
        from the documented tree's accept length; the documented tree with twice the draft tokens
        (bench_speculative.py's next value). A tree's knobs pay off together, which moves of one knob at a
        time from a random tree rarely find; without these trials a start that keeps the algorithm unset can
        reach trial 40 without a fair EAGLE-3 trial. A branch that keeps failing stops."""
        name = SpeculativeRules.ALGORITHM
        distribution = best.distributions.get(name)
        if (
            self.branch_trials == 0
            or name in self.held
            or not isinstance(distribution, CategoricalDistribution)
        ):
            return None
        for choice in distribution.choices:
            # A trial without the knob (the baseline) ran with SGLang's default: speculation off.
            ran = [t for t in finished if same_value(t.params.get(name), choice)]
            ran_well = [t for t in ran if _feasible(t)]
            start = _as_asked(best.params, self.held)
            plan = {n: v for n, v in start.items() if not SpeculativeRules.is_speculative_flag(n)}
            plan[name] = choice
            if choice is None:  # speculation off has no tree: the best trial without it, once
                if len(ran_well) < self.branch_trials and _asked(plan, best.params, with_params) not in tried:
                    return plan, f"{SPECULATIVE_BRANCH} off: trial {best.number} without it"
                continue
            why = f"{SPECULATIVE_BRANCH} {choice}"
            planned = [t for t in ran if (TrialRecord.of(t).proposed or "").startswith(why)]
            if len(planned) >= self.branch_trials or len(ran) - len(ran_well) >= 2 * self.branch_trials:
                continue  # explored (a branch that keeps failing stops too: the repairs had their turn)
            # The ranges of the tree's knobs, from any trial that had them (the best may have none).
            ranges = {n: d for t in with_params for n, d in t.distributions.items() if n in TREE_KNOBS}
            lacking = _lacking(with_params)
            steps = BRANCH_PLAN if SpeculativeRules.has_tree(choice) else NGRAM_PLAN
            # A best of this algorithm had its fraction raised already where its pool ran short (_climb).
            pool = (
                None
                if same_value(best.params.get(name), choice)
                else self._branch_pool(plan, ran, best.distributions.get(MEM_FRACTION), finished)
            )
            for step in steps[len(planned) : self.branch_trials]:
                if SpeculativeRules.has_tree(choice):
                    moved = {**plan, **_planned_tree(step, ran_well, ranges, lacking)}
                else:
                    moved = {**plan, **_planned_ngram(step, ranges)}
                if pool is not None:
                    moved[MEM_FRACTION] = pool[0]
                if _asked(moved, best.params, with_params) not in tried:
                    return moved, f"{why}: trial {best.number} with {step}" + (pool[1] if pool else "")
        return None

    def _allreduce_branch(
        self,
        best: FrozenTrial,
        proposed: list[str],
        with_params: list[FrozenTrial],
        tried: set[ConfigKey],
    ) -> _Planned | None:
        """The next step of ALLREDUCE_PLAN not yet run (none of the finished trials was `proposed` for it), on
        the best trial's other knobs, where the space has every flag of the step free and the best does not
        set them all already."""
        # The flags' ranges, from any trial that had them (the best may be the baseline, which has none).
        ranges = {n: d for t in with_params for n, d in t.distributions.items()}
        for step, flags in ALLREDUCE_PLAN:
            why = f"{ALLREDUCE_BRANCH}: {step}"
            if any(said.startswith(why) for said in proposed):
                continue
            if any(
                name in self.held or name not in ranges or not _contains(ranges[name], value)
                for name, value in flags.items()
            ) or all(same_value(best.params.get(name), value) for name, value in flags.items()):
                continue
            plan = {**_as_asked(best.params, self.held), **flags}
            if _asked(plan, best.params, with_params) not in tried:
                return plan, f"{why}, from trial {best.number}"
        return None

    def _branch_pool(
        self,
        plan: Mapping[str, Any],
        ran: list[FrozenTrial],
        distribution: BaseDistribution | None,
        finished: list[FrozenTrial],
    ) -> tuple[float, str] | None:
        """The memory fraction a branch's next tree runs at where an earlier trial of its algorithm (measured,
        or cut after a short run) had a KV pool short of the tokens the workload keeps in flight (its draft
        model takes memory the best trial, without one, gave the pool): the fraction that holds them, as
        the line search's probe raises a best's (`_held_short`), and why; None where none was short. A
        tree judged on a starved pool queues requests and loses to the best on memory, not on its
        speculation."""
        value = plan.get(MEM_FRACTION)
        if MEM_FRACTION in self.held or not isinstance(distribution, FloatDistribution):
            return None
        if not isinstance(value, float):  # a plan that does not set the fraction
            return None
        step = distribution.step or (distribution.high - distribution.low) / 25
        raised = [(found, t.number) for t in ran if (found := self._held_short(t, step)) is not None]
        if not raised:
            return None
        (target, held, tokens), number = max(raised, key=lambda pair: pair[0][0])
        why = f" at {MEM_FRACTION} raised (trial {number}'s KV pool held {held} of {tokens} tokens in flight)"
        target = min(target, value + POOL_STEPS * step)  # at most POOL_STEPS above the best's in all
        moved = nearest(distribution, _short_of(_edge(finished, MEM_FRACTION, value, 1), target, 1, step))
        return (moved, why) if moved > value + step / 2 else None

    def _climb(
        self, study: Study, best: FrozenTrial, finished: list[FrozenTrial], tried: set[ConfigKey]
    ) -> _Planned | None:
        """A line search along a range knob (the memory fraction) from the best trial: growing steps the way
        its neighbours rise, then halfway back towards where a config ran out of memory. The best configs sit
        at the memory edge, and the edge moves with the other memory knobs, so it is looked for again from
        each new best (docs/design.md, "The line search")."""
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        assert best.value is not None  # the best trial is a feasible COMPLETE one
        top = best.value

        def worse(trial: FrozenTrial) -> bool:
            assert trial.value is not None
            gap = (top - trial.value) if maximize else (trial.value - top)
            return gap > CLIMB_MARGIN * abs(top)

        for name, distribution in sorted(best.distributions.items()):
            value = best.params.get(name)
            if (
                name in self.held
                or name in TREE_KNOBS
                or not isinstance(distribution, FloatDistribution | IntDistribution)
                or not isinstance(value, int | float)
            ):
                continue
            step = distribution.step or (distribution.high - distribution.low) / 25
            line = [t for t in finished if t.number != best.number and _on_line(t, best, name)]
            sides = {
                side: sorted(
                    (t for t in line if side * (t.params[name] - value) > 0),
                    key=lambda t: abs(t.params[name] - value),
                )
                for side in (-1, 1)
            }
            # The nearest value above and below the best that any config ran out of memory at.
            edges = {side: _edge(finished, name, value, side) for side in (-1, 1)}
            targets = []
            up = edges[1]
            if (
                not line
                and (up is None or up - value > step * 1.5)
                and _matters(name, finished, CLIMB_MARGIN)
            ):
                targets.append(value + step)  # a probe of which way the line goes, short of a known edge
            for side in (-1, 1):
                behind, ahead = sides[-side], sides[side]
                if not behind or not _feasible(behind[0]) or not worse(behind[0]):
                    continue
                if not ahead:
                    target = value + 2 * (value - behind[0].params[name])
                    targets.append(_short_of(edges[side], target, side, step))
                elif not _feasible(ahead[0]):
                    halves = math.floor(abs(ahead[0].params[name] - value) / step / 2 + 1e-9)
                    if halves == 0:  # the edge: move it, with less of what ran out of memory there
                        shift = _edge_shift(ahead[0], tried, self.held)
                        if shift is not None:
                            plan, why = shift
                            return plan, f"{LINE_SEARCH} from trial {best.number}, the best so far: {why}"
                    targets.append(value + side * halves * step)
            held_short = self._pool_short(best, name, step, sides[1], edges[1])
            if held_short is not None:
                targets.insert(0, held_short[0])
            for target in targets:
                moved = nearest(distribution, target)
                side = 1 if moved > value else -1
                ahead = sides[side]
                if same_value(moved, value, tolerance=step / 2) or (
                    ahead and side * (ahead[0].params[name] - moved) <= 0
                ):
                    continue  # at the range's end, or no step left between the best and the edge
                plan = _as_asked({**best.params, name: moved}, self.held)
                if config_key(plan) not in tried:
                    why = f"{LINE_SEARCH} from trial {best.number}, the best so far: {name} {moved}"
                    if held_short is not None and target == held_short[0]:
                        why += held_short[1]
                    return plan, why
        return None

    def _pool_short(
        self, best: FrozenTrial, name: str, step: float, above: list[FrozenTrial], edge: float | None
    ) -> tuple[float, str] | None:
        """Where the best trial's KV pool held fewer tokens than the workload keeps in flight (its memory
        report against `in_flight`), the memory fraction that would hold them, on the knob's step, at
        most POOL_STEPS up and short of the nearest value a config ran out of memory at (`edge`), and why;
        None where it held them, nothing says, or a trial above the best on this line ran already. SGLang
        then runs fewer requests at a time and queues the rest: the first thing a person reading its log
        raises, with no need of two trials showing the fraction matters."""
        if name != MEM_FRACTION or above:
            return None
        short = self._held_short(best, step)
        if short is None:
            return None
        target, held, tokens = short
        why = f" (its KV pool held {held} of the workload's {tokens} tokens in flight)"
        return _short_of(edge, target, 1, step), why

    def _held_short(self, trial: FrozenTrial, step: float) -> tuple[float, int, int] | None:
        """Where `trial`'s KV pool held fewer tokens than the workload keeps in flight (its memory report
        against `in_flight`), the memory fraction that would hold them (at most POOL_STEPS steps up), the
        tokens it held and those in flight; None where it held them or nothing says."""
        in_flight = self.in_flight(trial.params)
        value = trial.params.get(MEM_FRACTION)
        if in_flight is None or not isinstance(value, float):
            return None
        record = TrialRecord.of(trial)
        running = trial.params.get(MAX_RUNNING)  # a server that runs fewer at once cannot use the room
        tokens = in_flight.tokens(running if isinstance(running, int) else None)
        fit = fraction_to_hold(tokens, value, record.server_memory)
        if fit is None:
            return None
        steps = min(math.ceil((fit - value) / step - 1e-9), POOL_STEPS)
        return value + steps * step, int(record.server_memory["kv_cache_tokens"]), tokens

    def _move(self, best: FrozenTrial, trials: list[FrozenTrial]) -> dict[str, Any]:
        params = _as_asked(best.params, self.held)
        free = sorted(n for n in params if n not in self.held)
        if not free:  # every knob held: no move (the config ran, so it is not planned again)
            return params
        count = min(2 if self._rng.random() < self.second else 1, len(free))
        # A sweep: the first knob is one no trial has yet moved from this best, while there is one.
        moved = set().union(*(_moved_from(best, t) for t in trials if t.number != best.number))
        first = self._rng.choice([n for n in free if n not in moved] or free)
        for name in [first, *self._rng.sample([n for n in free if n != first], count - 1)]:
            if name in TREE_KNOBS and all(best.params.get(n) is not None for n in TREE_KNOBS[:2]):
                # The tree's knobs move together, to a neighbouring tree.
                params = {n: v for n, v in params.items() if n not in TREE_KNOBS}
                params.update(self._tree_step(best, name, _lacking(trials)))
                continue
            params[name] = self._changed(best.distributions[name], params[name])
        return params

    def _tree_step(self, best: FrozenTrial, knob: str, lacking: set[str]) -> dict[str, Any]:
        """The best trial's EAGLE tree with `knob` moved to a neighbouring value: a step more or fewer (for a
        chain also the steps SGLang's adaptive mode picks from the trial's accept length), the next topk
        down or up with the draft tokens scaled along, or twice or half the draft tokens."""
        p = best.params
        steps, topk = int(p[SpeculativeRules.STEPS]), int(p[SpeculativeRules.TOPK])
        draft = int(p.get(SpeculativeRules.DRAFT_TOKENS, steps + 1))
        if knob == SpeculativeRules.STEPS:
            options = {steps - 1, steps + 1}
            accept_length = TrialRecord.of(best).accept_length
            if topk == 1 and accept_length is not None:
                options.add(adaptive_steps(accept_length))
            steps = self._rng.choice(sorted(options - {steps}))
        elif knob == SpeculativeRules.TOPK:
            choices = sorted(_numbers(best.distributions[knob]))
            at = choices.index(topk) if topk in choices else 0
            neighbours = choices[max(at - 1, 0) : at] + choices[at + 1 : at + 2]
            if neighbours:
                new = int(self._rng.choice(neighbours))
                draft, topk = max(2, draft * new // topk), new
        else:
            draft = self._rng.choice([2 * draft, draft // 2])
        return _tree(best.distributions, steps, topk, draft, lacking)

    def _changed(self, distribution: BaseDistribution, value: Any) -> Any:
        """Another value: any other choice, or a few steps away on a range."""
        if isinstance(distribution, CategoricalDistribution):
            others = [c for c in distribution.choices if not same_value(c, value)]
            return self._rng.choice(others) if others else value
        if isinstance(distribution, FloatDistribution):
            step = distribution.step or (distribution.high - distribution.low) / 25
            return nearest(distribution, value + step * self._rng.choice([-3, -2, -1, 1, 2, 3]))
        if isinstance(distribution, IntDistribution):
            # On its step (a step of 1 draws as randint(low, high) did, so seeded studies repeat).
            return self._rng.choice(_numbers(distribution))
        return value

    def infer_relative_search_space(self, study: Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        if self._plan(study, trial) is not None:
            return {}
        space = self.base.infer_relative_search_space(study, trial)
        return {n: d for n, d in space.items() if n not in self.staged}

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if self._plan(study, trial) is not None:
            return {}
        sampled = self.base.sample_relative(study, trial, search_space)
        return {n: self._viable(n, search_space[n], v) for n, v in sampled.items()}

    def sample_independent(
        self, study: Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        if param_name in self.staged and _contains(param_distribution, self.staged[param_name]):
            return self.staged[param_name]
        plan = self._plan(study, trial)
        if plan is None:
            value = self.base.sample_independent(study, trial, param_name, param_distribution)
        elif param_name in plan and _contains(param_distribution, plan[param_name]):
            value = plan[param_name]
        elif param_name in plan and isinstance(param_distribution, IntDistribution):
            value = nearest(param_distribution, plan[param_name])  # a planned tree's steps or draft tokens
        else:
            value = self._random.sample_independent(study, trial, param_name, param_distribution)
        return self._viable(param_name, param_distribution, value)

    def reseed_rng(self) -> None:
        super().reseed_rng()
        self._random.reseed_rng()
        self._rng.seed()  # a fresh seed from the OS, as Optuna reseeds its own samplers


def _asked(move: dict[str, Any], start: dict[str, Any], trials: list[FrozenTrial]) -> ConfigKey | None:
    """The key of the config a move will give once the search space asks for its knobs: a knob that only
    exists under some values of another (a speculative tree under an algorithm) is not asked when the move
    switches that other knob to a value without it. What each changed value brings is read from the trials
    that had it; None when a changed value is in no trial yet (the config cannot have been tried)."""
    names = set(move)
    for name in (n for n in move if not same_value(move[n], start.get(n))):
        seen = [t for t in trials if name in t.params and same_value(t.params[name], move[name])]
        if not seen:
            return None
        names &= set().union(*(t.params for t in seen))
    return config_key({n: move[n] for n in names})


def _as_asked(params: Mapping[str, Any], held: Mapping[str, Any]) -> dict[str, Any]:
    """`params` with the knobs the study holds at their held values, as a trial will ask them: a plan checked
    against the tried configs without them repeats one (a knob screening held after the best ran without)."""
    return {**params, **{n: v for n, v in held.items() if n in params}}


def _edge_shift(
    failed: FrozenTrial, tried: set[ConfigKey], held: Mapping[str, Any]
) -> tuple[dict[str, Any], str] | None:
    """The config that ran out of memory next to the best, with the next smaller value of the flag whose
    memory ran out (EDGE_KNOBS, else the one SGLang's message names), when it has not run."""
    record = TrialRecord.of(failed)
    kind = str(record.failure_kind_text)
    flag = EDGE_KNOBS.get(kind) or _FLAG_TO_LOWER.get(kind)
    if flag is None or flag not in failed.params or flag in held:
        return None
    current = failed.params[flag]
    if current is None:  # SGLang's own value, which the server logged choosing
        current = record.server_choices.get(flag)
    smaller = [c for c in _numbers(failed.distributions[flag]) if current is not None and c < current]
    if not smaller:
        return None
    plan = {**_as_asked(failed.params, held), flag: max(smaller)}
    if config_key(plan) in tried:
        return None
    return plan, f"trial {failed.number}'s config ({kind}) with {flag} {max(smaller)}"


def _edge(finished: Sequence[FrozenTrial], name: str, value: float, side: int) -> float | None:
    """The nearest value of `name` beyond `value` going `side` (1: up) that a config ran out of memory at,
    or None."""
    return min(
        (
            t.params[name]
            for t in finished
            if _infeasible(t)
            and isinstance(t.params.get(name), int | float)
            and side * (t.params[name] - value) > 0
        ),
        key=lambda edge: abs(edge - value),
        default=None,
    )


def _short_of(edge: float | None, target: float, side: int, step: float) -> float:
    """`target` on a line going `side` (1: up), at least a step short of `edge`, the nearest value another
    config ran out of memory at that way (None: none)."""
    if edge is not None and side * (target - (edge - side * step)) > 0:
        return edge - side * step
    return target


def _matters(name: str, trials: Sequence[FrozenTrial], margin: float) -> bool:
    """Whether two measured configs that differ in `name` alone differ in value by more than `margin` of
    the larger: evidence that the knob moves the objective in this study, somewhere."""
    measured = [t for t in trials if _feasible(t) and isinstance(t.params.get(name), int | float)]
    for i, one in enumerate(measured):
        for other in measured[i + 1 :]:
            assert one.value is not None and other.value is not None
            if abs(one.value - other.value) > margin * max(abs(one.value), abs(other.value)) and _on_line(
                other, one, name
            ):
                return True
    return False


def _on_line(trial: FrozenTrial, best: FrozenTrial, name: str) -> bool:
    """Whether `trial` is `best` with only `name` changed (a finished launch: measured, or failed)."""
    if name not in trial.params or trial.state is TrialState.RUNNING:
        return False
    names = {*best.params, *trial.params} - {name}
    return all(same_value(trial.params.get(n), best.params.get(n)) for n in names)


def _feasible(trial: FrozenTrial) -> bool:
    return trial.state is TrialState.COMPLETE and trial.value is not None and not _infeasible(trial)


def _numbers(distribution: BaseDistribution) -> list[float]:
    if isinstance(distribution, CategoricalDistribution):
        return [c for c in distribution.choices if isinstance(c, int | float) and not isinstance(c, bool)]
    if isinstance(distribution, IntDistribution):
        return list(range(distribution.low, distribution.high + 1, distribution.step))
    return []


def _moved_from(best: FrozenTrial, trial: FrozenTrial) -> set[str]:
    """The knobs `trial` changed from `best` when it is a move of one or two knobs (a tree counts as one),
    else none."""
    names = {*best.params, *trial.params}
    changed = {n for n in names if not same_value(trial.params.get(n), best.params.get(n))}
    tree = changed & set(TREE_KNOBS)
    return changed if len(changed - tree) + bool(tree) <= 2 else set()


def adaptive_steps(accept_length: float) -> int:
    """The --speculative-num-steps SGLang's adaptive speculative decoding keeps for an accept length: one
    step beyond the accepted draft tokens, round(accepted) + 1 (`AdaptiveSpeculativeParams`,
    srt/speculative/adaptive_spec_params.py, topk 1 only). The server's accept length counts the bonus
    token too, so this is round(accept_length)."""
    return max(1, round(accept_length))


def _planned_tree(
    step: str, ran: list[FrozenTrial], distributions: Mapping[str, BaseDistribution], lacking: set[str]
) -> dict[str, Any]:
    """The tree of one BRANCH_PLAN step; the chain's steps come from the documented tree's accept length."""
    steps, topk, draft = (DOCUMENTED_TREE[n] for n in TREE_KNOBS)
    if step == BRANCH_PLAN[1]:
        lengths = [
            length
            for t in ran
            if (length := TrialRecord.of(t).accept_length) is not None
            and all(same_value(t.params.get(n), v) for n, v in DOCUMENTED_TREE.items())
        ]
        steps, topk = (adaptive_steps(lengths[0]) if lengths else steps), 1
    elif step == BRANCH_PLAN[2]:
        draft *= 2
    return _tree(distributions, steps, topk, draft, lacking)


def _planned_ngram(step: str, distributions: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """The draft tokens of one NGRAM_PLAN step, on the search space's range (none where it has no range:
    SGLang's default then, every step the same config)."""
    range_ = distributions.get(SpeculativeRules.DRAFT_TOKENS)
    if not isinstance(range_, IntDistribution):
        return {}
    draft = SpeculativeRules.NGRAM_DEFAULT_DRAFT_TOKENS
    draft = draft // 2 if step == NGRAM_PLAN[1] else 2 * draft if step == NGRAM_PLAN[2] else draft
    return {SpeculativeRules.DRAFT_TOKENS: int(nearest(range_, draft))}


def _tree(
    distributions: Mapping[str, BaseDistribution], steps: int, topk: int, draft: int, lacking: set[str]
) -> dict[str, Any]:
    """An EAGLE tree as SGLang takes it: steps within the search space's range, no draft tokens for a chain
    (SGLang sets steps + 1), at most the tree's candidates (SpeculativeRules.max_draft_tokens); without
    the knobs the search space lacks (planning one would hide a repeated config)."""
    range_ = distributions.get(SpeculativeRules.STEPS)
    if isinstance(range_, IntDistribution):
        steps = int(nearest(range_, steps))
    tree = {SpeculativeRules.STEPS: steps, SpeculativeRules.TOPK: topk}
    if topk > 1:
        most = SpeculativeRules.max_draft_tokens(steps, topk)
        tree[SpeculativeRules.DRAFT_TOKENS] = max(2, min(draft, most))
    return {n: v for n, v in tree.items() if n not in lacking}


def _lacking(trials: Sequence[FrozenTrial]) -> set[str]:
    """The tree knobs the search space lacks, as trials that would have been asked them show."""
    lacking = set()
    for params in (t.params for t in trials):
        tree = SpeculativeRules.has_tree(params.get(SpeculativeRules.ALGORITHM))  # NGRAM asks no steps
        if tree and SpeculativeRules.STEPS not in params:
            lacking.add(SpeculativeRules.STEPS)
        if params.get(SpeculativeRules.STEPS) is not None and SpeculativeRules.TOPK not in params:
            lacking.add(SpeculativeRules.TOPK)
        topk = params.get(SpeculativeRules.TOPK)
        if isinstance(topk, int) and topk > 1 and SpeculativeRules.DRAFT_TOKENS not in params:
            lacking.add(SpeculativeRules.DRAFT_TOKENS)
    if lacking & {SpeculativeRules.STEPS, SpeculativeRules.TOPK}:  # SGLang asks neither without them
        lacking |= {SpeculativeRules.TOPK, SpeculativeRules.DRAFT_TOKENS}
    return lacking


def gp(seed: int | None) -> BaseSampler:
    """Optuna's GPSampler (it needs PyTorch), searching the trials that set parameters."""
    return WithoutBaseline(optuna.samplers.GPSampler(seed=seed))


def tpe(
    seed: int | None,
    *,
    n_startup_trials: int = START_TRIALS,
    keep_default: float = 0.8,
    feasibility_weight: float = 1.0,
    moves: float = 0.8,
    second: float = 0.3,
    branch_trials: int = BRANCH_TRIALS,
    floor: bool = True,
    climb: bool = True,
    start_values: Mapping[str, Any] | None = None,
    staged: Mapping[str, Any] | None = None,
    **options: Any,
) -> BaseSampler:
    """autotune's default: multivariate TPE, grouped for the conditional speculative knobs, started near
    the defaults, steering clear of the configs that run out of memory, with a share `moves` of the trials
    after the start moving from the best trial (two knobs at once with probability `second`), and repairs
    of CUDA-graph OOMs. The keyword arguments change its settings (`options` go to TPESampler;
    `feasibility_weight=0` and `moves=0` leave plain TPE after the start, repairs aside), for measuring
    other settings against it (benchmarks/sample_efficiency.py, benchmarks/trust.py's SAMPLER_SETTINGS)."""
    settings = {"multivariate": True, "group": True, **options}
    base = FeasibleTPESampler(
        seed=seed, n_startup_trials=n_startup_trials, feasibility_weight=feasibility_weight, **settings
    )
    start = DefaultsStartSampler(
        base,
        n_startup_trials=n_startup_trials,
        keep_default=keep_default,
        start_values=start_values,
        seed=seed,
    )
    return IncumbentMoves(
        start,
        n_startup_trials=n_startup_trials,
        share=moves,
        second=second,
        branch_trials=branch_trials,
        floor=floor,
        climb=climb,
        staged=staged,
        seed=seed,
    )


# A study file's `sampler.name` -> its sampler for a seed; the names are the ones autotune.config accepts.
SAMPLERS: Mapping[str, Callable[[int | None], BaseSampler]] = {
    "tpe": tpe,  # TPE near SGLang's defaults, with moves and repairs
    "tpe-plain": lambda seed: optuna.samplers.TPESampler(seed=seed),
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "gp": gp,  # needs PyTorch
    "nsga2": lambda seed: optuna.samplers.NSGAIISampler(seed=seed),
}


def build(
    spec: SamplerSpec,
    staged: Mapping[str, Any] | None = None,
    *,
    trials_so_far: int = 0,
) -> BaseSampler:
    """A new sampler of the study file's kind and seed, for a study that has `trials_so_far` trials.

    `staged`: values a cheaper stage measured on the node (autotune.study.stages), held in every trial (tpe
    keeps them out of its moves, others have them fixed). A continued study draws from a seed of its own,
    made from the file's and the trials so far: the file's seed again would replay the first trials'
    proposals (a resumed study on the H200 re-ran trials 1 and 2). The same study resumed at the same point
    still proposes the same trials."""
    seed = continued_seed(spec.seed, trials_so_far)
    if spec.name == "tpe":
        return tpe(seed, staged=staged)
    sampler = SAMPLERS[spec.name](seed)
    return optuna.samplers.PartialFixedSampler(dict(staged), sampler) if staged else sampler


def continued_seed(seed: int | None, trials_so_far: int) -> int | None:
    """The seed for a study continued after `trials_so_far` trials: the study file's for a new study."""
    if seed is None or trials_so_far == 0:
        return seed
    return random.Random(f"{seed}/{trials_so_far}").getrandbits(32)
