"""Statistics for verify and bench: percentiles, summaries, the paired bootstrap CI of a ratio of medians."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridctl.verify.stats import bootstrap_ratio_ci, mean, median, percentile, ratio_of_medians, summarize

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


def test_percentile_matches_numpy_linear_definition() -> None:
    values = [15.0, 20.0, 35.0, 40.0, 50.0]
    # numpy.percentile(values, q) with the default (linear) method.
    assert percentile(values, 0) == 15.0
    assert percentile(values, 100) == 50.0
    assert percentile(values, 50) == 35.0
    assert percentile(values, 40) == pytest.approx(29.0)
    assert percentile(values, 90) == pytest.approx(46.0)
    assert percentile([3.0, 1.0, 2.0, 4.0], 50) == 2.5  # order of input does not matter


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="empty"):
        percentile([], 50)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        percentile([1.0], 101)


@settings(max_examples=60, deadline=None)
@given(st.lists(finite, min_size=1, max_size=40), st.floats(0, 100), st.floats(0, 100))
def test_percentile_is_monotone_and_bounded(values: list[float], q1: float, q2: float) -> None:
    lo, hi = sorted((q1, q2))
    assert percentile(values, lo) <= percentile(values, hi) + 1e-9
    assert min(values) - 1e-9 <= percentile(values, lo) <= max(values) + 1e-9


def test_summary_fields_and_empty() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s is not None
    assert (s.count, s.median, s.min, s.max) == (5, 3.0, 1.0, 100.0)
    assert s.mean == pytest.approx(22.0)
    assert s.p90 == pytest.approx(61.6)
    assert s.p99 == pytest.approx(96.16)
    assert summarize([]) is None
    assert set(s.to_dict()) == {"count", "mean", "median", "p90", "p99", "min", "max"}
    assert mean([1.0, 2.0]) == 1.5 and median([5.0]) == 5.0


def test_bootstrap_of_constant_samples_is_exact() -> None:
    est = bootstrap_ratio_ci([2.0] * 5, [4.0] * 5, resamples=200)
    assert (est.ratio, est.ci_low, est.ci_high) == (0.5, 0.5, 0.5)


def test_bootstrap_ci_brackets_a_clear_effect_and_is_reproducible() -> None:
    rng = random.Random(7)
    cold = [100 + rng.gauss(0, 5) for _ in range(20)]
    warm = [c * 0.4 + rng.gauss(0, 2) for c in cold]
    a = bootstrap_ratio_ci(warm, cold, seed=3)
    b = bootstrap_ratio_ci(warm, cold, seed=3)
    assert a == b
    assert a.ci_low <= a.ratio <= a.ci_high
    assert 0.3 < a.ci_low and a.ci_high < 0.5
    assert a.ratio == pytest.approx(ratio_of_medians(warm, cold))


def test_bootstrap_wider_with_noisier_data() -> None:
    rng = random.Random(1)
    cold = [100.0 + rng.gauss(0, 1) for _ in range(10)]
    quiet = [50.0 + rng.gauss(0, 1) for _ in range(10)]
    noisy = [50.0 + rng.gauss(0, 20) for _ in range(10)]
    width_quiet = bootstrap_ratio_ci(quiet, cold).ci_high - bootstrap_ratio_ci(quiet, cold).ci_low
    est_noisy = bootstrap_ratio_ci(noisy, cold)
    assert est_noisy.ci_high - est_noisy.ci_low > width_quiet


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=1, max_size=12), st.booleans())
def test_bootstrap_interval_is_ordered_and_within_resample_range(
    pairs: list[tuple[float, float]], paired: bool
) -> None:
    warm = [w for w, _ in pairs]
    cold = [c for _, c in pairs]
    est = bootstrap_ratio_ci(warm, cold, paired=paired, resamples=100)
    assert est.ci_low <= est.ci_high
    assert min(warm) / max(cold) - 1e-9 <= est.ci_low
    assert est.ci_high <= max(warm) / min(cold) + 1e-9
    assert math.isfinite(est.ratio)


def test_bootstrap_argument_errors() -> None:
    with pytest.raises(ValueError, match="equal lengths"):
        bootstrap_ratio_ci([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_ratio_ci([], [1.0])
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_ratio_ci([1.0], [1.0], confidence=1.0)
    with pytest.raises(ValueError, match="positive"):
        ratio_of_medians([1.0], [0.0])
