"""Reciprocal rank fusion of ranked candidate lists.

RRF score of an id = sum over the lists that contain it of ``1 / (k + rank)``, rank 1-based,
k = 60 (*Reciprocal Rank Fusion outperforms Condorcet and individual Rank Learning Methods*,
Cormack, Clarke and Buettcher, SIGIR 2009; *Retrieval Is Not Enough* §3 fixes k = 60; *Clustered Retrieval-Induced Forgetting*
§2.2 fuses BM25 and dense).
"""

from __future__ import annotations

from collections.abc import Sequence

from mnemos.errors import InvalidParameterError

DEFAULT_RRF_K = 60


def reciprocal_rank_fusion(ranked: Sequence[Sequence[int]], k: int = DEFAULT_RRF_K) -> list[tuple[int, float]]:
    """Fuse best-first id lists into ``(id, rrf_score)`` pairs, best first.

    An id repeated within one list counts once, at its first position (later repeats are dropped
    before ranks are counted). Ties in score break by
    ascending id, so the output is deterministic. Empty input gives ``[]``.

    Raises:
        InvalidParameterError: if ``k`` is negative.
    """
    if k < 0:
        raise InvalidParameterError(f"RRF k must be >= 0, got {k}")
    scores: dict[int, float] = {}
    for ids in ranked:
        seen: set[int] = set()
        rank = 0
        for entry_id in ids:
            if entry_id in seen:
                continue
            seen.add(entry_id)
            rank += 1
            scores[entry_id] = scores.get(entry_id, 0.0) + 1.0 / (k + rank)
    return sorted(scores.items(), key=lambda item: (-item[1], item[0]))
