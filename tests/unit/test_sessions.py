"""SessionIndex: BM25 over transcripts fused with centroid cosine (AssoMem §4.2), built incrementally."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mnemos.bm25_index import BM25Index
from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.fusion import reciprocal_rank_fusion
from mnemos.sessions import SessionIndex

from .conftest import unit_rows

T0 = datetime(2024, 3, 1, tzinfo=UTC)
WORDS = ("cat", "dog", "bread", "cello", "porto", "kyoto", "trip", "garden", "tax", "dentist", "rose", "lisbon")


def _oracle_rank(session_ids, texts, vectors, query, query_vector) -> tuple[str, ...]:
    """The bench's former SessionRanker, built in one go: joined transcripts, float32 mean centroids."""
    order = list(dict.fromkeys(session_ids))
    bm25 = BM25Index()
    bm25.add(list(range(len(order))), [" ".join(t for s, t in zip(session_ids, texts, strict=True) if s == sid)
                                       for sid in order])
    centroids = np.zeros((len(order), vectors.shape[1]), dtype=np.float32)
    for j, sid in enumerate(order):
        mean = vectors[[i for i, s in enumerate(session_ids) if s == sid]].mean(axis=0)
        norm = float(np.linalg.norm(mean))
        centroids[j] = mean / norm if norm > 0 else mean
    lexical = [i for i, _ in bm25.search(query, len(order))]
    dense = [int(i) for i in np.argsort(-(centroids @ np.asarray(query_vector, dtype=np.float32)), kind="stable")]
    return tuple(order[i] for i, _ in reciprocal_rank_fusion([lexical, dense]))


def _turns(rng: np.random.Generator, n: int, dim: int = 16):
    sessions = [f"s{int(rng.integers(12))}" for _ in range(n)]
    texts = [" ".join(rng.choice(WORDS, size=4)) + f", said #{i}!" for i in range(n)]
    times = [T0 + timedelta(hours=int(rng.integers(500))) for _ in range(n)]
    return sessions, texts, unit_rows(rng, n, dim), times


def test_incremental_adds_rank_exactly_like_a_fresh_build(rng: np.random.Generator) -> None:
    sessions, texts, vectors, times = _turns(rng, 120)
    fresh = SessionIndex(16)
    fresh.add(sessions, texts, vectors, times)
    grown = SessionIndex(16)
    cuts = [0, 1, 2, 7, 30, 31, 80, 120]
    queries = [("cat porto", vectors[3]), ("trip to kyoto", vectors[50]), ("?!", vectors[99]), ("zebra", None)]
    for a, b in zip(cuts, cuts[1:], strict=False):
        grown.add(sessions[a:b], texts[a:b], vectors[a:b], times[a:b])
        grown.rank("cat", vectors[0])  # searching between adds must not freeze anything
    assert grown.session_ids == fresh.session_ids and grown.n_turns == fresh.n_turns == 120
    for query, vector in queries:
        assert grown.rank(query, vector) == fresh.rank(query, vector)
        if vector is not None:
            assert fresh.rank(query, vector) == _oracle_rank(sessions, texts, vectors, query, vector)
    for sid in fresh.session_ids:
        assert grown.date(sid) == fresh.date(sid) == min(t for s, t in zip(sessions, times, strict=True) if s == sid)


def test_rank_fuses_lexical_and_dense(rng: np.random.Generator) -> None:
    index = SessionIndex(4)
    basis = np.eye(4, dtype=np.float32)
    index.add(["a", "a", "b", "c"], ["my grey cat", "she is two", "sourdough bread in Porto", "cello lessons"],
              basis[[0, 0, 1, 2]], [T0] * 4)
    assert index.rank("cat", basis[0]) == ("a", "b", "c")  # both retrievers agree on a
    assert index.rank("cello", basis[1])[0] in ("b", "c")
    assert index.rank("cat", None) == ("a",)  # without a vector only lexical matches come back
    assert len(index) == 3 and "b" in index and "z" not in index
    assert SessionIndex(4).rank("cat", basis[0]) == ()


def test_guards() -> None:
    index = SessionIndex(4)
    with pytest.raises(InvalidParameterError):
        index.add(["a"], ["x", "y"], np.eye(4, dtype=np.float32)[:1], [T0])
    with pytest.raises(DimensionMismatchError):
        index.add(["a", "b"], ["x", "y"], np.eye(4, dtype=np.float32)[:1], [T0, T0])
    assert len(index) == 0 and index.n_turns == 0
    index.add(["a"], ["x"], np.eye(4, dtype=np.float32)[:1], [T0])
    with pytest.raises(DimensionMismatchError):
        index.rank("x", np.ones(3, dtype=np.float32))
    with pytest.raises(KeyError):
        index.date("nope")
    with pytest.raises(InvalidParameterError):
        SessionIndex(0)
