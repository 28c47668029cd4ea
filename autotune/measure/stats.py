"""Means with confidence intervals, and gains that count as gains only outside the noise.

Small all-reduces on a real node vary by a third from one launch to the next, and a serving benchmark by
a few percent, so every figure autotune reports from repeated measurements is a mean with a Student-t
interval (scipy). A gain is measured paired where the two configs ran round by round (drift of the
node over time cancels out) and unpaired (Welch) where they ran on separate launches.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Gain", "MeanCI", "Verdict", "mean_ci", "paired_gain", "t_quantile", "welch_gain"]


def t_quantile(confidence: float, df: float) -> float:
    """The two-sided Student-t quantile for `confidence` (e.g. 0.95) and `df` degrees of freedom."""
    if not 0 < confidence < 1:
        raise ValueError(f"`0 < confidence < 1` must hold, but got ({confidence=}).")
    if not df > 0:
        raise ValueError(f"`df > 0` must hold, but got ({df=}).")
    # Student-t's inverse CDF (scipy.stats.t.ppf's own), imported on first use from scipy.special: a job
    # that reports an interval then starts in half the time it takes to import scipy.stats.
    from scipy.special import stdtrit

    return float(stdtrit(df, (1 + confidence) / 2))


@dataclass(frozen=True)
class MeanCI:
    """A mean and the half-width of its confidence interval (nan with fewer than two samples).

    `std` is the spread whose `std / sqrt(n)` is the mean's standard error: the samples' standard deviation
    for a plain mean.
    """

    mean: float
    half_width: float
    n: int
    std: float
    confidence: float = 0.95

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def describe(self, digits: int = 2) -> str:
        """`23.41 ± 0.52 (95% CI, n=10)`."""
        if math.isnan(self.half_width):
            return f"{self.mean:.{digits}f} (n={self.n})"
        return f"{self.mean:.{digits}f} ± {self.half_width:.{digits}f} ({self.confidence:.0%} CI, n={self.n})"


def mean_ci(samples: Sequence[float], confidence: float = 0.95) -> MeanCI:
    """The mean of `samples` with its Student-t confidence interval."""
    n = len(samples)
    if n == 0:
        raise ValueError("`samples` must not be empty, but got [].")
    mean = math.fsum(samples) / n
    if n < 2:
        return MeanCI(mean, math.nan, n, math.nan, confidence)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in samples) / (n - 1))
    return MeanCI(mean, t_quantile(confidence, n - 1) * std / math.sqrt(n), n, std, confidence)


Verdict = Literal["gain", "loss", "no gain"]


@dataclass(frozen=True)
class Gain:
    """How much better a candidate is than a reference, in percent of the reference (better is positive).

    `paired`: measured round by round, the mean of the rounds' relative differences (`paired_gain`);
    otherwise separate launches, the difference of the means with Welch's interval (`welch_gain`).
    `verdict` is `gain` only when the whole interval is above zero, `loss` when it is all below, and
    `no gain` when it contains zero or there is none: a difference inside the noise is no difference.
    """

    percent: MeanCI
    difference: MeanCI  # reference minus candidate for a metric to minimize, the other way to maximize
    paired: bool = True

    @property
    def pct(self) -> float:
        return self.percent.mean

    @property
    def low_pct(self) -> float | None:
        """The interval's low end in percent; None without an interval (a side measured once)."""
        return None if math.isnan(self.percent.half_width) else self.percent.low

    @property
    def high_pct(self) -> float | None:
        return None if math.isnan(self.percent.half_width) else self.percent.high

    @property
    def confidence(self) -> float:
        return self.percent.confidence

    @property
    def within_noise(self) -> bool:
        """Whether the interval reaches zero: the measurements cannot tell the candidate from the reference
        (False without an interval: nothing is known about the noise)."""
        return self.low_pct is not None and self.high_pct is not None and self.low_pct <= 0 <= self.high_pct

    @property
    def verdict(self) -> Verdict:
        if self.low_pct is None or self.high_pct is None:
            return "no gain"
        if self.low_pct > 0:
            return "gain"
        if self.high_pct < 0:
            return "loss"
        return "no gain"

    def describe(self) -> str:
        """`gain: +18.2% ± 6.1% (95% CI, 8 rounds)` or `no gain: +1.3% ± 4.0% ... (inside the noise)`."""
        p = self.percent
        span = "" if math.isnan(p.half_width) else f" ± {p.half_width:.1f}%"
        tail = " (inside the noise)" if self.verdict == "no gain" else ""
        count = f"{p.n} rounds" if self.paired else f"Welch, {p.n} measurements of the candidate"
        return f"{self.verdict}: {p.mean:+.1f}%{span} ({p.confidence:.0%} CI, {count}){tail}"


def paired_gain(
    reference: Sequence[float], candidate: Sequence[float], *, minimize: bool, confidence: float = 0.95
) -> Gain:
    """The candidate's gain over the reference from paired measurements (round i of each together)."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(
            "`reference` and `candidate` must be paired and non-empty, but got "
            f"({len(reference)} and {len(candidate)} values)."
        )
    sign = 1.0 if minimize else -1.0
    differences = [sign * (r - c) for r, c in zip(reference, candidate, strict=True)]
    percents = [100.0 * d / abs(r) for d, r in zip(differences, reference, strict=True)]
    return Gain(mean_ci(percents, confidence), mean_ci(differences, confidence))


def welch_gain(
    reference: Sequence[float], candidate: Sequence[float], *, minimize: bool, confidence: float = 0.95
) -> Gain:
    """The candidate's gain over the reference from unpaired measurements (separate launches): the
    difference of the means in percent of the reference's mean, with Welch's t interval (no interval
    when either side was measured once)."""
    if not reference or not candidate:
        raise ValueError(
            f"`reference` and `candidate` must be non-empty, but got ({len(reference)} and "
            f"{len(candidate)} values)."
        )
    ref, cand = mean_ci(reference, confidence), mean_ci(candidate, confidence)
    if ref.mean == 0:
        raise ValueError(f"the reference's mean must not be 0 (a gain is in percent of it), but got {ref}.")
    sign = 1.0 if minimize else -1.0
    diff = sign * (ref.mean - cand.mean)
    half, spread = math.nan, math.nan
    if ref.n >= 2 and cand.n >= 2:
        se = math.sqrt(ref.std**2 / ref.n + cand.std**2 / cand.n)
        spread = se * math.sqrt(cand.n)
        half = 0.0
        if se > 0:  # identical values on both sides: no spread, and nothing for a t-test to divide by
            from scipy.stats import ttest_ind

            test = ttest_ind(candidate, reference, equal_var=False)
            low, high = test.confidence_interval(confidence)
            half = (float(high) - float(low)) / 2
    scale = 100.0 / abs(ref.mean)
    difference = MeanCI(diff, half, cand.n, spread, confidence)
    percent = MeanCI(diff * scale, half * scale, cand.n, spread * scale, confidence)
    return Gain(percent, difference, paired=False)
