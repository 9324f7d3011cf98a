"""Near-duplicate detection at write time: cosine >= 0.95 within a tenant becomes an alias.

Source: seed 004 checkpoint 7 (cosine-similarity dedup at 0.95, +16.5% NDCG) and its dedupe
compaction note (an alias table keeps every absorbed turn, so a gold turn still counts when its
canonical is retrieved). DESIGN.md: dedupe is scoped to one tenant; nothing is dropped.

Rule, for each row i of an incoming batch, in order:

1. its best match among the tenant's existing canonical entries, if cosine >= threshold;
2. otherwise its best match among the *earlier canonical* rows of the same batch, if
   cosine >= threshold;
3. otherwise row i is itself canonical.

Ties go to the lowest index. Rows that became aliases are never match targets, so alias chains
cannot form: every alias points straight at a canonical.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnemos.errors import DimensionMismatchError

DEFAULT_THRESHOLD = 0.95
"""Cosine at or above which two turns of one tenant are the same memory (seed 004 checkpoint 7)."""


@dataclass(frozen=True)
class DedupeDecision:
    """What to do with one incoming row.

    Exactly one of ``existing`` / ``batch`` is set for a duplicate, neither for a canonical row.

    Attributes:
        row: index of the row in the incoming batch.
        existing: index into the ``existing`` matrix of the canonical it aliases, or None.
        batch: index of the earlier canonical row of the same batch it aliases, or None.
        similarity: cosine to that canonical (NaN for a canonical row).
    """

    row: int
    existing: int | None
    batch: int | None
    similarity: float

    @property
    def is_duplicate(self) -> bool:
        """True when the row becomes an alias of an existing entry or of an earlier batch row."""
        return self.existing is not None or self.batch is not None


def _check(new: np.ndarray, existing: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    new = np.asarray(new, dtype=np.float32)
    if new.ndim != 2:
        raise DimensionMismatchError("new embeddings", "(n, dim)", tuple(new.shape))
    dim = new.shape[1]
    existing = np.asarray(existing, dtype=np.float32)
    if existing.size == 0:
        existing = existing.reshape(0, dim)
    if existing.ndim != 2 or existing.shape[1] != dim:
        raise DimensionMismatchError("existing embeddings", f"(m, {dim})", tuple(existing.shape))
    return new, existing


def dedupe_batch(
    new: np.ndarray, existing: np.ndarray, threshold: float = DEFAULT_THRESHOLD
) -> list[DedupeDecision]:
    """Decide, for each row of ``new``, whether it is canonical or an alias (module docstring).

    Args:
        new: ``(n, dim)`` float32 unit embeddings of the incoming turns, in arrival order.
        existing: ``(m, dim)`` float32 unit embeddings of the tenant's canonical entries (m may be 0).
        threshold: cosine at or above which a row is a duplicate.

    Returns:
        ``n`` decisions, in row order.

    Raises:
        DimensionMismatchError: if the matrices are not 2-D with the same number of columns.
    """
    new, existing = _check(new, existing)
    sims_existing = new @ existing.T if existing.shape[0] else np.zeros((new.shape[0], 0), np.float32)
    sims_batch = new @ new.T
    canonical_rows: list[int] = []
    decisions: list[DedupeDecision] = []
    for i in range(new.shape[0]):
        if sims_existing.shape[1]:
            j = int(np.argmax(sims_existing[i]))
            sim = float(sims_existing[i, j])
            if sim >= threshold:
                decisions.append(DedupeDecision(i, existing=j, batch=None, similarity=sim))
                continue
        if canonical_rows:
            candidates = sims_batch[i, canonical_rows]
            best = int(np.argmax(candidates))
            sim = float(candidates[best])
            if sim >= threshold:
                decisions.append(DedupeDecision(i, existing=None, batch=canonical_rows[best], similarity=sim))
                continue
        canonical_rows.append(i)
        decisions.append(DedupeDecision(i, existing=None, batch=None, similarity=float("nan")))
    return decisions


def find_duplicates(
    new: np.ndarray, existing: np.ndarray, threshold: float = DEFAULT_THRESHOLD
) -> list[int | None]:
    """Compact form of :func:`dedupe_batch`: one int or None per row of ``new``.

    ``j >= 0`` means "alias of ``existing[j]``"; ``-(j + 1)`` means "alias of the earlier
    canonical row ``j`` of ``new``"; ``None`` means "canonical". Prefer :func:`dedupe_batch`
    in new code; this encoding exists because the shared spec names it.

    Raises:
        DimensionMismatchError: as :func:`dedupe_batch`.
    """
    out: list[int | None] = []
    for decision in dedupe_batch(new, existing, threshold):
        if decision.existing is not None:
            out.append(decision.existing)
        elif decision.batch is not None:
            out.append(-(decision.batch + 1))
        else:
            out.append(None)
    return out
