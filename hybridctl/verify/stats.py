"""Latency statistics in pure Python: percentiles, summaries and a paired bootstrap CI for a ratio of medians.

Pure Python (no numpy) because the control plane must run anywhere, and the sample sizes here are tens to a few thousand
values.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between order statistics (numpy's default)."""
    if not values:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q must be within [0, 100], got {q}")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    if low == high:
        return float(ordered[low])
    frac = rank - low
    return float(ordered[low] + (ordered[high] - ordered[low]) * frac)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50.0)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of an empty sequence")
    return math.fsum(values) / len(values)


@dataclass(frozen=True)
class Summary:
    """Distribution summary of one latency series (same unit as the input)."""

    count: int
    mean: float
    median: float
    p90: float
    p99: float
    min: float
    max: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def summarize(values: Sequence[float]) -> Summary | None:
    """Summary of a series, or None when it is empty (a report shows 'n/a' rather than a made-up zero)."""
    if not values:
        return None
    return Summary(
        count=len(values),
        mean=mean(values),
        median=median(values),
        p90=percentile(values, 90.0),
        p99=percentile(values, 99.0),
        min=float(min(values)),
        max=float(max(values)),
    )


@dataclass(frozen=True)
class RatioEstimate:
    """median(numerator) / median(denominator) with a bootstrap confidence interval."""

    ratio: float
    ci_low: float
    ci_high: float
    confidence: float
    resamples: int

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def ratio_of_medians(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    den = median(denominator)
    if den <= 0.0:
        raise ValueError("ratio of medians: the denominator's median must be positive")
    return median(numerator) / den


def bootstrap_ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    paired: bool = True,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
) -> RatioEstimate:
    """Percentile-bootstrap CI of median(numerator) / median(denominator).

    paired=True resamples indices jointly (warm and cold measured on the same document per trial, so their
    noise is
    correlated and must stay together); paired=False resamples each side on its own. A fixed seed makes a
    report
    reproducible from its inputs.
    """
    if not numerator or not denominator:
        raise ValueError("bootstrap needs at least one value on each side")
    if paired and len(numerator) != len(denominator):
        raise ValueError(f"paired bootstrap needs equal lengths, got {len(numerator)} and {len(denominator)}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be within (0, 1), got {confidence}")
    if resamples < 1:
        raise ValueError("resamples must be >= 1")
    rng = random.Random(seed)
    estimates: list[float] = []
    n_num, n_den = len(numerator), len(denominator)
    for _ in range(resamples):
        if paired:
            idx = [rng.randrange(n_num) for _ in range(n_num)]
            num = [numerator[i] for i in idx]
            den = [denominator[i] for i in idx]
        else:
            num = [numerator[rng.randrange(n_num)] for _ in range(n_num)]
            den = [denominator[rng.randrange(n_den)] for _ in range(n_den)]
        den_median = median(den)
        if den_median > 0.0:
            estimates.append(median(num) / den_median)
    if not estimates:
        raise ValueError("every bootstrap resample had a non-positive denominator median")
    tail = (1.0 - confidence) / 2.0 * 100.0
    return RatioEstimate(
        ratio=ratio_of_medians(numerator, denominator),
        ci_low=percentile(estimates, tail),
        ci_high=percentile(estimates, 100.0 - tail),
        confidence=confidence,
        resamples=resamples,
    )
