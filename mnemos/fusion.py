"""Fusion of the retrievers' candidate lists: reciprocal rank fusion and a score-normalised convex
combination, chosen by :class:`Fusion` (docs/architecture.md "Retrieval").

RRF score of an id = sum over the lists that contain it of ``1 / (k + rank)``, rank 1-based,
k = 60 (*Reciprocal Rank Fusion outperforms Condorcet and individual Rank Learning Methods*,
Cormack, Clarke and Buettcher, SIGIR 2009; *Retrieval Is Not Enough* §3 fixes k = 60; *Clustered Retrieval-Induced Forgetting*
§2.2 fuses BM25 and dense).

Convex score of an id = ``w * bm25_norm + (1 - w) * dense_norm``, each list's scores min-max
normalised over the candidates it returned, 0 for an id the list lacks (*An Analysis of Fusion
Functions for Hybrid Retrieval*, Bruch, Gai and Ingber, ACM TOIS 2023, §4: the convex combination
of normalised scores, with min-max normalisation; txtai's hybrid search fuses this way too).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum

from mnemos.errors import InvalidParameterError

DEFAULT_RRF_K = 60
DEFAULT_CONVEX_WEIGHT = 0.5

ScoredList = Sequence[tuple[int, float]]
"""One retriever's candidates: ``(entry_id, score)`` pairs, best first (higher score is better)."""


class Fusion(StrEnum):
    """How the BM25 and dense candidate lists become one ranking (:data:`FUSION_FUNCTIONS`)."""

    RRF = "rrf"
    CONVEX = "convex"


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


def min_max_normalise(scored: ScoredList) -> dict[int, float]:
    """``entry_id -> (score - min) / (max - min)`` over the ids of ``scored``, in [0, 1].

    The min and max are those of the candidates given (not of the whole index), so the list's best
    candidate maps to 1 and its last to 0. When every score is equal (one candidate, or a flat
    list) each maps to 1: being retrieved at all must count more than being missing, which counts
    0. An id repeated in ``scored`` keeps its first (best) score. ``[]`` gives ``{}``.

    Raises:
        InvalidParameterError: if a score is NaN or infinite.
    """
    first: dict[int, float] = {}
    for entry_id, score in scored:
        if not math.isfinite(score):
            raise InvalidParameterError(f"fusion scores must be finite, got {score} for entry {entry_id}")
        first.setdefault(int(entry_id), float(score))
    if not first:
        return {}
    low, high = min(first.values()), max(first.values())
    if high == low:
        return dict.fromkeys(first, 1.0)
    return {entry_id: (score - low) / (high - low) for entry_id, score in first.items()}


def convex_fusion(bm25: ScoredList, dense: ScoredList, weight: float = DEFAULT_CONVEX_WEIGHT) -> list[tuple[int, float]]:
    """Fuse two scored lists into ``(id, w * bm25_norm + (1 - w) * dense_norm)`` pairs, best first.

    Each list is min-max normalised on its own (:func:`min_max_normalise`); an id missing from a
    list counts 0 there. Scores are in [0, 1]. Ties break by ascending id. ``weight`` 1 ranks by
    BM25 alone and 0 by dense alone (ids of the other list then score 0, as does each list's own
    last candidate, and follow in id order). Both lists empty gives ``[]``.

    Args:
        bm25: BM25 ``(entry_id, score)`` candidates, best first (may be empty).
        dense: dense ``(entry_id, inner product)`` candidates, best first (may be empty).
        weight: w, the BM25 share, in [0, 1].

    Raises:
        InvalidParameterError: if ``weight`` is not a number in [0, 1] or a score is not finite.
    """
    if not 0.0 <= weight <= 1.0:  # False for NaN too
        raise InvalidParameterError(f"convex fusion weight must be in [0, 1], got {weight}")
    lexical, semantic = min_max_normalise(bm25), min_max_normalise(dense)
    fused = {entry_id: weight * lexical.get(entry_id, 0.0) + (1.0 - weight) * semantic.get(entry_id, 0.0)
             for entry_id in lexical.keys() | semantic.keys()}
    return sorted(fused.items(), key=lambda item: (-item[1], item[0]))


def _rrf(bm25: ScoredList, dense: ScoredList, rrf_k: int, convex_weight: float) -> list[tuple[int, float]]:
    return reciprocal_rank_fusion([[eid for eid, _ in bm25], [eid for eid, _ in dense]], k=rrf_k)


def _convex(bm25: ScoredList, dense: ScoredList, rrf_k: int, convex_weight: float) -> list[tuple[int, float]]:
    return convex_fusion(bm25, dense, weight=convex_weight)


FUSION_FUNCTIONS: dict[Fusion, Callable[[ScoredList, ScoredList, int, float], list[tuple[int, float]]]] = {
    Fusion.RRF: _rrf,
    Fusion.CONVEX: _convex,
}
"""Each fusion as ``f(bm25, dense, rrf_k, convex_weight)``; a function reads only its own parameter."""


def fuse(
    method: Fusion,
    bm25: ScoredList,
    dense: ScoredList,
    *,
    rrf_k: int = DEFAULT_RRF_K,
    convex_weight: float = DEFAULT_CONVEX_WEIGHT,
) -> list[tuple[int, float]]:
    """The BM25 and dense candidates fused by ``method``: ``(entry_id, fused score)``, best first,
    ties by ascending id. RRF reads only the lists' order (``rrf_k``), convex fusion only their
    scores (``convex_weight``). A disabled retriever is an empty list.

    Raises:
        InvalidParameterError: if ``method`` is not a :class:`Fusion`, or as the chosen function does.
    """
    try:
        function = FUSION_FUNCTIONS[Fusion(method)]
    except ValueError:
        raise InvalidParameterError(f"fusion must be one of {', '.join(f.value for f in Fusion)}, "
                                    f"got {method!r}") from None
    return function(bm25, dense, rrf_k, convex_weight)
