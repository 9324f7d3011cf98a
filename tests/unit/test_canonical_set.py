"""The growable canonical set decides exactly as the dedupe it replaced in the ingest worker.

``_reference`` is ``mnemos.dedupe.dedupe_batch`` as it was before the set existed (a full
``(n, m)`` mask of the signatures, then a masked argmax per row), kept here as the oracle. Batches
arrive one after another and their canonical rows join the existing ones, as in the worker; the
data plants exact twins (ties), near duplicates, and near duplicates whose best match the guard
refuses (with and without an equal-signature match further down the row).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import pytest

from mnemos.canonical_set import MIN_CAPACITY, CanonicalSet
from mnemos.dedupe import DedupeDecision, Signature, Token, TokenKind, dedupe_batch
from mnemos.errors import DimensionMismatchError, InvalidParameterError

from .conftest import unit_rows

DIM = 16
KINDS = [Signature("user", ()), Signature("assistant", ()),
         Signature("user", (Token(TokenKind.NUMBER, "0612"),)), Signature("user", (Token(TokenKind.NUMBER, "0699"),))]


def _reference(new: np.ndarray, existing: np.ndarray, threshold: float, new_sigs: Sequence[Hashable] | None,
               existing_sigs: Sequence[Hashable] | None) -> list[tuple[int | None, int | None, float | None]]:
    """The former dedupe_batch body (guard on when signatures are given), as (existing, batch, similarity)."""
    n, m = new.shape[0], existing.shape[0]
    sims_existing = new @ existing.T if m else np.zeros((n, 0), np.float32)
    sims_batch = new @ new.T
    if new_sigs is not None and existing_sigs is not None:
        codes: dict[Hashable, int] = {}
        new_codes = np.array([codes.setdefault(s, len(codes)) for s in new_sigs], np.int64)
        existing_codes = np.array([codes.setdefault(s, len(codes)) for s in existing_sigs], np.int64)
        sims_existing = np.where(new_codes[:, None] == existing_codes[None, :], sims_existing, -np.inf)
        sims_batch = np.where(new_codes[:, None] == new_codes[None, :], sims_batch, -np.inf)
    canonical_rows: list[int] = []
    out: list[tuple[int | None, int | None, float | None]] = []
    for i in range(n):
        if m:
            j = int(np.argmax(sims_existing[i]))
            if float(sims_existing[i, j]) >= threshold:
                out.append((j, None, float(sims_existing[i, j])))
                continue
        if canonical_rows:
            candidates = sims_batch[i, canonical_rows]
            best = int(np.argmax(candidates))
            if float(candidates[best]) >= threshold:
                out.append((None, canonical_rows[best], float(candidates[best])))
                continue
        canonical_rows.append(i)
        out.append((None, None, None))  # the decision's NaN similarity
    return out


def _triples(decisions: list[DedupeDecision]) -> list[tuple[int | None, int | None, float | None]]:
    return [(d.existing, d.batch, None if d.is_duplicate is False else d.similarity) for d in decisions]


def _near(rng: np.random.Generator, rows: np.ndarray, noise: float) -> np.ndarray:
    x = rows + noise * rng.standard_normal(rows.shape).astype(np.float32)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def _batch(rng: np.random.Generator, stored: np.ndarray, stored_sigs: list[Signature], n: int
           ) -> tuple[np.ndarray, list[Signature]]:
    """``n`` rows: fresh ones, twins and near copies of stored rows (same or another signature), and
    near copies of earlier rows of the batch."""
    rows, sigs = [], []
    for i in range(n):
        kind = rng.integers(0, 5) if len(stored) else 0
        if kind == 0 or (kind == 4 and i == 0):  # fresh
            rows.append(unit_rows(rng, 1, DIM)[0])
            sigs.append(KINDS[int(rng.integers(0, len(KINDS)))])
            continue
        if kind == 4:  # near an earlier row of the batch, maybe with another signature
            j = int(rng.integers(0, i))
            rows.append(_near(rng, rows[j][None], 0.05)[0])
            sigs.append(sigs[j] if rng.random() < 0.6 else KINDS[int(rng.integers(0, len(KINDS)))])
            continue
        j = int(rng.integers(0, len(stored)))
        rows.append(stored[j] if kind == 1 else _near(rng, stored[j][None], 0.02 if kind == 2 else 0.06)[0])
        sigs.append(stored_sigs[j] if kind != 3 or rng.random() < 0.3 else KINDS[int(rng.integers(0, len(KINDS)))])
    return np.stack(rows).astype(np.float32), sigs


@pytest.mark.parametrize("guard", [True, False])
def test_batches_decide_as_the_former_dedupe_batch(guard: bool) -> None:
    rng = np.random.default_rng(7)
    stored = np.zeros((0, DIM), np.float32)  # what the former worker held: a matrix, vstacked
    stored_sigs: list[Signature] = []
    canon = CanonicalSet(DIM)
    refused = fallbacks = duplicates = 0
    for _ in range(40):
        new, sigs = _batch(rng, stored, stored_sigs, int(rng.integers(1, 24)))
        expected = _reference(new, stored, 0.95, sigs if guard else None, stored_sigs if guard else None)
        got = canon.dedupe(new, 0.95, new_signatures=sigs if guard else None, guard=guard)
        assert _triples(got) == expected  # the same targets and the same float32 cosines
        assert _triples(dedupe_batch(new, stored, 0.95, new_signatures=sigs, existing_signatures=stored_sigs,
                                     guard=guard)) == expected
        if stored.shape[0]:
            sims = new @ stored.T
            best = sims.argmax(axis=1)
            refusals = [d for i, d in enumerate(got) if sims[i, best[i]] >= 0.95 and stored_sigs[best[i]] != sigs[i]]
            refused += len(refusals)
            fallbacks += sum(d.existing is not None for d in refusals)
        duplicates += sum(d.is_duplicate for d in got)
        keep = [d.row for d in got if not d.is_duplicate]
        stored = np.vstack([stored, new[keep]])
        stored_sigs += [sigs[i] for i in keep]
        canon.add(new[keep], [sigs[i] for i in keep])
        assert np.array_equal(canon.vectors, stored)
    assert duplicates > 100 and stored.shape[0] > 100 and canon.capacity > MIN_CAPACITY  # both outcomes, and growth
    assert not guard or (refused > 10 and fallbacks > 3)  # the guard refused best matches, some had a next best


def test_a_refused_best_match_falls_back_to_the_best_equal_signature_at_or_above_the_threshold() -> None:
    rng = np.random.default_rng(3)
    base = unit_rows(rng, 1, DIM)
    twin = np.vstack([base, base, _near(rng, base, 0.01), base])  # ties at 1.0 on rows 0, 1 and 3
    sigs = [KINDS[2], KINDS[3], KINDS[3], KINDS[3]]
    canon = CanonicalSet(DIM)
    canon.add(twin, sigs)
    (decision,) = canon.dedupe(base, new_signatures=[KINDS[3]])
    assert decision.existing == 1  # row 0 refused; rows 1 and 3 tie: the lowest index wins
    (decision,) = canon.dedupe(base, new_signatures=[KINDS[0]])
    assert not decision.is_duplicate  # no equal signature at all
    assert _triples(canon.dedupe(base, new_signatures=[KINDS[3]])) == _reference(base, twin, 0.95, [KINDS[3]], sigs)


def test_adding_grows_the_buffer_by_doubling_and_keeps_every_row() -> None:
    rng = np.random.default_rng(5)
    canon = CanonicalSet(DIM)
    assert len(canon) == 0 and canon.vectors.shape == (0, DIM) and canon.codes.shape == (0,)
    rows, capacities = [], []
    for size in (1, 5, 60, 3, 200, 1):
        block = unit_rows(rng, size, DIM)
        canon.add(block, [KINDS[len(rows) % 2]] * size)
        rows.append(block)
        capacities.append(canon.capacity)
    assert capacities == [MIN_CAPACITY, MIN_CAPACITY, 2 * MIN_CAPACITY, 2 * MIN_CAPACITY, 269, 538]
    assert np.array_equal(canon.vectors, np.vstack(rows)) and canon.vectors.flags.c_contiguous
    assert canon.codes.tolist() == [0] + [1] * 5 + [0] * 60 + [1] * 3 + [0] * 200 + [1]
    assert canon.codes_of([KINDS[1], KINDS[3]]).tolist() == [1, 2]  # known, then a new code


def test_shapes_and_signature_counts_are_checked() -> None:
    canon = CanonicalSet(4)
    with pytest.raises(DimensionMismatchError):
        canon.add(np.zeros((2, 5), np.float32), [KINDS[0]] * 2)
    with pytest.raises(InvalidParameterError):
        canon.add(np.zeros((2, 4), np.float32), [KINDS[0]])
    with pytest.raises(DimensionMismatchError):
        canon.dedupe(np.zeros(4, np.float32), new_signatures=[KINDS[0]])
    with pytest.raises(InvalidParameterError):
        canon.dedupe(np.zeros((2, 4), np.float32))  # the guard is on by default
    with pytest.raises(InvalidParameterError):
        CanonicalSet(0)
    assert canon.dedupe(np.zeros((0, 4), np.float32), new_signatures=[]) == []
