"""Dedupe at cosine >= 0.95 (seed 004 checkpoint 7) against a brute-force cosine oracle."""

import math

import numpy as np
import pytest

from mnemos.dedupe import DEFAULT_THRESHOLD, dedupe_batch, find_duplicates
from mnemos.errors import DimensionMismatchError

from .conftest import unit_rows


def _at_cos(base: np.ndarray, other: np.ndarray, cos: float) -> np.ndarray:
    """A unit vector at exactly ``cos`` to unit ``base``, in the plane of base and other."""
    ortho = other - (other @ base) * base
    ortho /= np.linalg.norm(ortho)
    return (cos * base + math.sqrt(1 - cos * cos) * ortho).astype(np.float32)


def _oracle(new, existing, threshold):
    """Pairwise cosine loops: existing canonicals first, then earlier canonical batch rows."""
    out, canon = [], []
    for i, row in enumerate(new):
        cos_e = [float(sum(float(a) * float(b) for a, b in zip(row, e, strict=True))) for e in existing]
        if cos_e and max(cos_e) >= threshold:
            out.append(cos_e.index(max(cos_e)))
            continue
        cos_b = [float(sum(float(a) * float(b) for a, b in zip(row, new[j], strict=True))) for j in canon]
        if cos_b and max(cos_b) >= threshold:
            out.append(-(canon[cos_b.index(max(cos_b))] + 1))
            continue
        canon.append(i)
        out.append(None)
    return out


def test_matches_bruteforce_oracle_on_planted_duplicates(rng):
    existing = unit_rows(rng, 30, 12)
    fresh = unit_rows(rng, 10, 12)
    planted = [_at_cos(existing[3], fresh[0], 0.97), _at_cos(fresh[1], fresh[2], 0.99),
               _at_cos(existing[7], fresh[3], 0.93)]
    new = np.vstack([fresh[1:2], planted[0][None], fresh[4:8], planted[1][None], planted[2][None]])
    got = find_duplicates(new, existing)
    assert got == _oracle(new, existing, DEFAULT_THRESHOLD)
    assert got[1] == 3       # planted near copy of existing[3]
    assert got[6] == -1      # near copy of batch row 0 (fresh[1])
    assert got[7] is None    # 0.93 is below the threshold
    assert len(got) == len(new)  # nothing dropped


def test_threshold_is_inclusive_and_best_match_wins(rng):
    base, other = unit_rows(rng, 2, 6)
    at_096 = _at_cos(base, other, 0.96)
    at_099 = _at_cos(base, other, 0.99)
    existing = np.vstack([at_096, at_099])
    (decision,) = dedupe_batch(base[None], existing)
    assert decision.existing == 1 and decision.similarity == pytest.approx(0.99, abs=1e-5)
    assert dedupe_batch(base[None], existing, threshold=0.995)[0].is_duplicate is False
    exact = _at_cos(base, other, 0.96)
    assert find_duplicates(exact[None], base[None], threshold=0.96 - 1e-6) == [0]


def test_within_batch_aliases_point_at_canonicals_only(rng):
    a, helper = unit_rows(rng, 2, 8)
    b = _at_cos(a, helper, 0.96)
    c = _at_cos(b, -a + helper, 0.96)  # close to b, less close to a
    assert float(a @ c) < 0.95
    decisions = dedupe_batch(np.vstack([a, b, c]), np.zeros((0, 8), np.float32))
    assert [d.batch for d in decisions] == [None, 0, None]  # b aliases a; c does not chain through b
    assert [d.existing for d in decisions] == [None, None, None]


def test_existing_match_beats_batch_match(rng):
    a, helper = unit_rows(rng, 2, 8)
    twin = _at_cos(a, helper, 0.98)
    decisions = dedupe_batch(np.vstack([a, twin]), a[None])
    assert [d.existing for d in decisions] == [0, 0]


def test_empty_inputs_and_shape_errors(rng):
    assert find_duplicates(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32)) == []
    assert find_duplicates(unit_rows(rng, 2, 4), np.zeros((0,), np.float32)) == [None, None]
    with pytest.raises(DimensionMismatchError):
        find_duplicates(unit_rows(rng, 2, 4), unit_rows(rng, 2, 5))
    with pytest.raises(DimensionMismatchError):
        find_duplicates(np.zeros(4, np.float32), unit_rows(rng, 2, 4))


def test_cosine_exactly_at_threshold_is_a_duplicate():
    t = np.float32(0.96)
    threshold = float(t)  # the float32 value itself, so the cosine below equals it bit for bit
    e1 = np.array([1.0, 0.0], np.float32)
    at_t = np.array([t, np.sqrt(np.float32(1) - t * t)], np.float32)  # e1 . at_t == t exactly
    assert float(e1 @ at_t) == threshold
    assert find_duplicates(e1[None], at_t[None], threshold=threshold) == [0]
    assert find_duplicates(np.vstack([e1, at_t]), np.zeros((0, 2), np.float32), threshold=threshold) == [None, -1]
