"""The run-to-run noise of a study's objective, measured on its own node(s), not assumed.

One launch of a config is one draw: the same flags on the same GPU give another value on the next launch
(about 0.5% on one H200 for throughput, more between machines or leases). The study launches the
baseline again once a few trials ran (`trust.repeat_baseline_after`; confirmation launches it again at the
end, which also catches drift), and pools the spread of every config measured more than once into one
relative standard deviation with its degrees of freedom. The stopping rule, the sampler's moves and the
answer (`autotune best`) read it; `status` and MLflow show it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Any, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from autotune.config import Study
from autotune.measure.stats import t_quantile
from autotune.study.records import StudyRecord, TrialRecord
from autotune.study.remeasure import enqueue_measurement
from autotune.study.rules import (
    ConfigMeasurements,
    at_no_rate,
    best_trial,
    direction_sign,
    is_feasible,
    maximizes,
    measurement_groups,
)
from autotune.study.storage import budget_used

__all__ = ["NoiseEstimate", "move_from", "noise_apart_from", "noise_estimate", "repeat_baseline"]

NEAR_BEST = 0.10  # the configs whose noise counts: a mean within 10% of the best one's


@dataclass(frozen=True)
class NoiseEstimate:
    """The pooled relative standard deviation of one measurement (0.01: 1%), its degrees of freedom (the
    measurements beyond the first of each config) and the configs it came from (their first trials)."""

    relative_sd: float
    dof: int
    configs: tuple[tuple[int, tuple[int, ...]], ...]  # (first trial, its measured trials) of each config
    earlier: str | None = None  # the earlier study it comes from, until this one measured its own
    # Some configs' spread is their load search's resolution, not what they measured (`pooled`).
    resolution: bool = False

    def band(self, confidence: float = 0.95, *, spread_known: bool = False) -> float:
        """The relative difference two single measurements of one config stay within at `confidence`:
        sqrt(2) standard deviations (a difference of two draws) times the t quantile of the estimate's
        degrees of freedom, or the normal one with `spread_known` (the spread taken as exact)."""
        quantile = (
            NormalDist().inv_cdf((1 + confidence) / 2) if spread_known else t_quantile(confidence, self.dof)
        )
        return quantile * math.sqrt(2) * self.relative_sd

    def describe(self) -> str:
        """`run-to-run noise: 0.62% (pooled relative SD, 3 degrees of freedom, from trials 0, 4 and 9)`."""
        if self.earlier is not None:
            return (
                f"run-to-run noise: {self.relative_sd:.2%} of a measurement, the earlier study "
                f"{self.earlier!r}'s ({self.dof} degree{'s' if self.dof != 1 else ''} of freedom) until this "
                f"study measured its own; two runs of one config differ by up to {self.band():.2%} (95%)"
            )
        sources = "; ".join(
            f"trial {of}'s config ({', '.join(map(str, trials))})" for of, trials in self.configs
        )
        floor = ", at least its load search's resolution" if self.resolution else ""
        return (
            f"run-to-run noise: {self.relative_sd:.2%} of a measurement (pooled relative SD{floor}, "
            f"{self.dof} degree{'s' if self.dof != 1 else ''} of freedom, from {sources}); two runs of one "
            f"config differ by up to {self.band():.2%} (95%)"
        )

    def record(self) -> dict[str, Any]:
        """JSON-ready, for `status --json`, `best --json` and MLflow."""
        return {
            "relative_sd_pct": 100 * self.relative_sd,
            "band_pct": 100 * self.band(),
            "dof": self.dof,
            "configs": [{"trial": of, "trials": list(trials)} for of, trials in self.configs],
            **({"earlier_study": self.earlier} if self.earlier is not None else {}),
        }


def pooled(
    groups: list[ConfigMeasurements], maximize: bool = True, keep: Collection[int] = ()
) -> NoiseEstimate | None:
    """The noise of `groups` measured more than once (each around its own mean), or None when none was.

    Only the configs within NEAR_BEST of the best mean count when any do, and those named in `keep` (by
    first trial): a config far below the best (a starved batch, 2300 against 4300 tok/s on the H200) can
    spread ten times more, and says nothing about the differences among the configs near the top, which the
    answer and the stopping rule judge."""
    repeated = [g for g in groups if g.n >= 2 and g.mean != 0]
    if not repeated:
        return None
    sign = 1.0 if maximize else -1.0
    top = max(sign * g.mean for g in repeated)
    near = [g for g in repeated if sign * g.mean >= top - NEAR_BEST * abs(top) or g.of in keep]
    squares, dof, sources, floored = 0.0, 0, [], False
    for group in near or repeated:
        mean = group.mean
        own = math.fsum(((v - mean) / mean) ** 2 for v in group.values)
        # Launches that ended in one load-search bracket can measure one value: their spread is no less
        # than the bracket's (on 4x L40S a leader measured 0.8144 req/s in 3 launches, "noise 0.00%").
        floor = (group.n - 1) * math.fsum(r**2 for r in group.resolutions) / group.n
        floored = floored or floor > own
        squares += max(own, floor)
        dof += group.n - 1
        sources.append((group.of, group.trials))
    if dof == 0:
        return None
    return NoiseEstimate(math.sqrt(squares / dof), dof, tuple(sources), resolution=floored)


def noise_apart_from(
    groups: Sequence[ConfigMeasurements],
    trials: Collection[int],
    maximize: bool = True,
    keep: int | None = None,
) -> NoiseEstimate | None:
    """The noise of `groups` (`pooled`'s rule, the config `keep` counted however far below the best) with the
    measurements of `trials` left out: the study's own noise from launches other than those a
    confirmation's pairs measured, so that pooling the two counts no launch's spread (nor its degree of
    freedom) twice. The earlier study's (`--from`) never: another node."""
    kept = []
    for group in groups:
        resolutions = group.resolutions or (0.0,) * group.n
        left = [
            (n, v, r)
            for n, v, r in zip(group.trials, group.values, resolutions, strict=True)
            if n not in trials
        ]
        kept.append(
            replace(
                group,
                trials=tuple(n for n, _, _ in left),
                values=tuple(v for _, v, _ in left),
                resolutions=tuple(r for _, _, r in left),
            )
        )
    # A max_load of 0 (no rate met the SLO) is the load search's floor, not a draw around a mean: defaults
    # that measured one give no relative spread, and count only as any config far below the best does.
    floored = any(g.of == keep and 0 in g.values for g in kept)
    return pooled(kept, maximize, () if keep is None or floored else (keep,))


def noise_estimate(optuna_study: optuna.Study) -> NoiseEstimate | None:
    """The study's noise estimate from every config it measured more than once; before any was, the earlier
    study's it started from (`--from`), else None; None for a multi-objective study."""
    if len(optuna_study.directions) != 1:
        return None
    own = pooled(measurement_groups(optuna_study), maximizes(optuna_study.direction))
    return own if own is not None else _earlier(optuna_study)


def _earlier(optuna_study: optuna.Study) -> NoiseEstimate | None:
    """The noise of the study this one started from (`autotune run --from`: study.warm_start), if any."""
    record = StudyRecord.of(optuna_study).warm_start or {}
    noise = record.get("noise")
    if not noise:
        return None
    return NoiseEstimate(float(noise["relative_sd"]), int(noise["dof"]), (), earlier=str(record.get("study")))


def repeat_baseline(
    study: Study, optuna_study: optuna.Study, affordable: Callable[[], bool] | None = None
) -> int | None:
    """Queue the baseline again once `trust.repeat_baseline_after` trials were launched (and once more after
    each as many more, while the stopping rule wants more degrees of freedom: `stop_early.min_noise_dof`),
    once it completed, where `affordable()` says the node hours pay for it; returns the baseline's trial
    number when queued."""
    trust = study.file.trust
    after = trust.repeat_baseline_after
    wanted = max(
        1,
        trust.stop_early.min_noise_dof if trust.stop_early.enabled else 1,
        trust.screen.min_noise_dof if trust.screen.enabled else 1,
    )
    if not after or len(optuna_study.directions) != 1 or budget_used(optuna_study) < after:
        return None
    trials = optuna_study.get_trials(deepcopy=False)
    records = [TrialRecord.of(t) for t in trials]
    repeats = sum(1 for r in records if r.baseline and r.remeasure_of is not None)
    if repeats >= wanted or budget_used(optuna_study) < after * (repeats + 1):
        return None
    base = next((g for g in measurement_groups(optuna_study) if g.baseline and g.n), None)
    if base is None or _at_floor(study, base) or (affordable is not None and not affordable()):
        return None
    enqueue_measurement(optuna_study, base)
    return base.of


def _at_floor(study: Study, defaults: ConfigMeasurements) -> bool:
    """A max_load's defaults at the floor (`at_no_rate`): a repeat measures no spread, and its load search
    down to the slowest rates is among the dearest launches (960-1600 s on 4x L40S against 420-620 s near
    the best)."""
    return study.objective.metric == "max_load" and at_no_rate(defaults, maximize=True)


def move_from(
    optuna_study: optuna.Study, trials: list[FrozenTrial], rng: random.Random
) -> FrozenTrial | None:
    """The trial the default sampler's moves start from (`trust.noise_ties`): the best, or once the noise is
    measured (2 degrees of freedom), any of the configs whose value lies within the noise band of the best's,
    drawn with `rng`: they are tied, and a lucky draw of one of them should not steer every later move."""
    best = best_trial(optuna_study, trials)
    noise = noise_estimate(optuna_study)
    if best is None or best.value is None or noise is None or noise.dof < 2:
        return best
    sign = direction_sign(optuna_study.direction)
    floor = sign * best.value - noise.band(spread_known=True) * abs(best.value)
    measured = [
        t for t in trials if t.state == TrialState.COMPLETE and is_feasible(t) and t.value is not None
    ]
    tied = [t for t in sorted(measured, key=lambda t: t.number) if sign * cast(float, t.value) >= floor]
    return rng.choice(tied) if tied else best
