"""Means with confidence intervals, and paired gains that count as gains only outside the noise.

Small all-reduces on a real node vary by a third from one launch to the next, so every figure autotune
reports for them is a mean with a Student-t interval, and a comparison is made round by round (paired),
so that drift of the node over time cancels out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Gain", "MeanCI", "mean_ci", "paired_gain", "t_quantile"]

# Two-sided 95% Student-t quantiles by degrees of freedom, used where scipy is not installed.
_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
        2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
        2.045, 2.042)  # fmt: skip


def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student-t quantile for `confidence` (e.g. 0.95) and `df` degrees of freedom."""
    if not 0 < confidence < 1:
        raise ValueError(f"`0 < confidence < 1` must hold, but got ({confidence=}).")
    if df < 1:
        raise ValueError(f"`df >= 1` must hold, but got ({df=}).")
    try:
        from scipy.stats import t
    except ImportError:
        if confidence != 0.95:
            raise ValueError(
                f"without scipy only confidence 0.95 is known, but got ({confidence=})."
            ) from None
        return _T95[df - 1] if df <= len(_T95) else 1.96 + 2.4 / df
    return float(t.ppf((1 + confidence) / 2, df))


@dataclass(frozen=True)
class MeanCI:
    """A sample mean and the half-width of its confidence interval (nan with fewer than two samples)."""

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
    """How much better a candidate is than a reference, in percent of the reference, paired by round.

    `verdict` is `gain` only when the whole interval is above zero, `loss` when it is all below, and
    `no gain` when it contains zero: a difference inside the noise is no difference.
    """

    percent: MeanCI
    difference: MeanCI  # reference minus candidate for a metric to minimize, the other way to maximize

    @property
    def verdict(self) -> Verdict:
        if math.isnan(self.percent.half_width):
            return "no gain"
        if self.percent.low > 0:
            return "gain"
        if self.percent.high < 0:
            return "loss"
        return "no gain"

    def describe(self) -> str:
        """`gain: 18.2% ± 6.1% (95% CI, 8 rounds)` or `no gain: 1.3% ± 4.0% ... (inside the noise)`."""
        p = self.percent
        span = "" if math.isnan(p.half_width) else f" ± {p.half_width:.1f}%"
        tail = " (inside the noise)" if self.verdict == "no gain" else ""
        return f"{self.verdict}: {p.mean:+.1f}%{span} ({p.confidence:.0%} CI, {p.n} rounds){tail}"


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
