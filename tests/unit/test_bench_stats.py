"""bench.common.stats against hand-computed values and scipy."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from bench.common.stats import bootstrap_ci, compare_paired, permutation_pvalue


def test_exact_permutation_pvalue_by_hand() -> None:
    # differences [1, 2, 3]: of the 8 sign patterns only (+,+,+) and (-,-,-) reach |mean| >= 2
    assert permutation_pvalue([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]) == pytest.approx(2 / 8)


def test_exact_permutation_pvalue_with_ties_by_hand() -> None:
    # differences [1, 1, 0, 0]: |mean| >= 0.5 for the 4 patterns where both ones share a sign (of 16)
    assert permutation_pvalue([1.0, 1.0, 5.0, 2.0], [0.0, 0.0, 5.0, 2.0]) == pytest.approx(8 / 16)


def test_a_single_pair_has_p_one_by_hand() -> None:
    # one difference: its two sign patterns are equally extreme (a category holding one question)
    assert permutation_pvalue([0.7], [0.2]) == 1.0
    assert compare_paired([0.7], [0.2]).delta == pytest.approx(0.5)


def test_permutation_matches_scipy_directly() -> None:
    rng = np.random.default_rng(3)
    a, b = rng.random(60), rng.random(60)
    expected = scipy_stats.permutation_test(
        (a, b), lambda x, y, axis: np.mean(x - y, axis=axis), permutation_type="samples", vectorized=True,
        n_resamples=2000, random_state=np.random.default_rng(7),
    ).pvalue
    assert permutation_pvalue(a, b, n_resamples=2000, seed=7) == pytest.approx(expected)


def test_permutation_identical_arrays_give_one_and_clear_shift_gives_small_p() -> None:
    x = np.linspace(0, 1, 50)
    assert permutation_pvalue(x, x) == 1.0
    assert permutation_pvalue(x + 0.2, x, n_resamples=2000) < 0.001


def test_permutation_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        permutation_pvalue([1.0, 2.0], [1.0])


def test_bootstrap_matches_the_hand_written_one_it_replaced() -> None:
    # the intervals the earlier numpy resampling loop gave on the same data (seed 0, 10,000 resamples):
    # the library's percentile bootstrap agrees within resampling noise
    x = np.random.default_rng(1).random(400)
    hits = (np.random.default_rng(2).random(300) < 0.3).astype(float)
    for values, (old_lo, old_hi) in ((x, (0.45881, 0.51439)), (hits, (0.29333, 0.40000))):
        lo, hi = bootstrap_ci(values, seed=0)
        assert lo == pytest.approx(old_lo, abs=0.004) and hi == pytest.approx(old_hi, abs=0.004)


def test_bootstrap_close_to_scipy_percentile_interval() -> None:
    x = np.random.default_rng(1).random(400)
    lo, hi = bootstrap_ci(x, n_resamples=10_000, seed=0)
    ref = scipy_stats.bootstrap((x,), np.mean, n_resamples=10_000, method="percentile", random_state=0)
    assert lo == pytest.approx(ref.confidence_interval.low, abs=0.004)
    assert hi == pytest.approx(ref.confidence_interval.high, abs=0.004)
    assert lo < x.mean() < hi


def test_bootstrap_is_seeded_and_handles_degenerate_sizes() -> None:
    x = np.arange(10, dtype=float)
    assert bootstrap_ci(x, n_resamples=500, seed=4) == bootstrap_ci(x, n_resamples=500, seed=4)
    assert bootstrap_ci([0.7], n_resamples=100) == (0.7, 0.7)
    lo, hi = bootstrap_ci([], n_resamples=100)
    assert math.isnan(lo) and math.isnan(hi)
    with pytest.raises(ValueError):
        bootstrap_ci([1.0, float("nan")])


def test_compare_paired_reports_mean_difference() -> None:
    a, b = np.array([0.5, 0.7, 0.9, 0.4]), np.array([0.4, 0.7, 0.6, 0.4])
    result = compare_paired(a, b, n_resamples=1000)
    assert result.delta == pytest.approx(0.1)
    assert result.n == 4
    assert result.delta_ci95[0] <= 0.1 <= result.delta_ci95[1]
    assert result.p_value == pytest.approx(permutation_pvalue(a, b, n_resamples=1000))
