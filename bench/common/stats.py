"""Uncertainty for per-question metrics: percentile bootstrap CIs and paired permutation tests.

The protocol is the one of *Clustered Retrieval-Induced Forgetting* §4.1 and §5.1: 95% percentile bootstrap intervals on the mean
over questions (10,000 resamples) and two-sided paired permutation tests on per-question
differences (10,000 permutations). Everything is seeded, so a rerun gives the same numbers.
``scipy.stats`` is imported by the functions that use it, not by this module: the CLI's commands import
this module when they are registered, and scipy.stats alone takes about half a second to import.

All functions take 1-d arrays of per-question values (NDCG@10, Recall@10, ...) where index ``i``
of two arrays is the same question; ``NaN`` is not allowed (drop unlabeled questions first).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = [
    "DEFAULT_RESAMPLES",
    "PairedComparison",
    "bootstrap_ci",
    "compare_paired",
    "format_p",
    "permutation_pvalue",
]

DEFAULT_RESAMPLES = 10_000
_CHUNK = 1_000  # resamples drawn at once: bounds memory at _CHUNK * n values


def _as_vector(values: np.ndarray | list[float], name: str) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-d, got shape {array.shape}")
    if np.isnan(array).any():
        raise ValueError(f"{name} contains NaN")
    return array


def bootstrap_ci(
    values: np.ndarray | list[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (shape ``(n,)``), by
    ``scipy.stats.bootstrap`` (``method="percentile"``, resamples drawn from
    ``numpy.random.default_rng(seed)``, ``_CHUNK`` at a time). ``n == 0`` gives ``(nan, nan)``;
    ``n == 1`` gives ``(x, x)``.

    Raises:
        ValueError: if ``values`` is not 1-d, holds NaN, or ``confidence`` is not in (0, 1).
    """
    x = _as_vector(values, "values")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if x.size == 0:
        return (float("nan"), float("nan"))
    if x.size == 1 or np.all(x == x[0]):
        return (float(x[0]), float(x[0]))
    from scipy import stats as scipy_stats

    result = scipy_stats.bootstrap((x,), np.mean, n_resamples=n_resamples, confidence_level=confidence,
                                   method="percentile", vectorized=True, batch=_CHUNK,
                                   random_state=np.random.default_rng(seed))
    return (float(result.confidence_interval.low), float(result.confidence_interval.high))


def _mean_difference(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    return np.mean(a - b, axis=axis)


def permutation_pvalue(
    treatment: np.ndarray | list[float],
    control: np.ndarray | list[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> float:
    """Two-sided paired permutation p-value for ``mean(treatment - control) == 0``.

    Uses ``scipy.stats.permutation_test`` with ``permutation_type="samples"`` (the values of a
    pair are swapped at random, i.e. the sign of each difference is flipped). When ``2**n`` is
    at most ``n_resamples`` scipy enumerates every sign pattern and the p-value is exact. If all
    differences are zero the answer is 1.0; so it is for a single pair, whose two sign patterns
    are equally extreme (scipy refuses fewer than two observations).

    Raises:
        ValueError: if the arrays differ in length, are not 1-d, or hold NaN.
    """
    a = _as_vector(treatment, "treatment")
    b = _as_vector(control, "control")
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in length: {a.size} vs {b.size}")
    if a.size < 2 or np.all(a == b):
        return 1.0
    from scipy import stats as scipy_stats

    result = scipy_stats.permutation_test(
        (a, b),
        _mean_difference,
        permutation_type="samples",
        vectorized=True,
        n_resamples=n_resamples,
        alternative="two-sided",
        random_state=np.random.default_rng(seed),
    )
    return float(min(1.0, result.pvalue))


@dataclass(frozen=True)
class PairedComparison:
    """Treatment minus control on the same questions.

    ``delta`` is the mean per-question difference, ``delta_ci95`` its percentile bootstrap
    interval, ``p_value`` the two-sided paired permutation p-value, ``n`` the number of pairs.
    """

    delta: float
    delta_ci95: tuple[float, float]
    p_value: float
    n: int


def compare_paired(
    treatment: np.ndarray | list[float],
    control: np.ndarray | list[float],
    *,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> PairedComparison:
    """Mean difference, its bootstrap CI and the permutation p-value (see the two functions above)."""
    a = _as_vector(treatment, "treatment")
    b = _as_vector(control, "control")
    if a.shape != b.shape:
        raise ValueError(f"paired arrays differ in length: {a.size} vs {b.size}")
    diff = a - b
    return PairedComparison(
        delta=float(diff.mean()) if diff.size else float("nan"),
        delta_ci95=bootstrap_ci(diff, n_resamples=n_resamples, seed=seed),
        p_value=permutation_pvalue(a, b, n_resamples=n_resamples, seed=seed),
        n=int(diff.size),
    )


def format_p(value: float) -> str:
    """A p-value for a table: ``"< 0.001"`` below 0.001, else three decimals (``"0.046"``)."""
    return "< 0.001" if value < 0.001 else f"{value:.3f}"
