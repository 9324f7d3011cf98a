"""Session-level retrieval of one tenant: which conversation sessions a query is about.

The session-level retriever of the "session-utterance" baseline of *AssoMem* (§4.2): a session is the
transcript of its turns. Sessions are ranked by reciprocal rank fusion (the retrieval's ``rrf_k``, 60 by default) of

* BM25 over session transcripts (the turns' texts joined by spaces, same tokenizer as the
  turn-level index; only sessions with a positive score), and
* the cosine between the query vector and each session's centroid (the normalised float32 mean
  of its turn vectors, every session, ties in insertion order).

Turns can be added at any time (:meth:`SessionIndex.add`), in batches or one by one: the index
then ranks exactly like one built in one go from the same turns in the same order, because the
BM25 documents are rebuilt lazily from the grown transcripts and each centroid is a float32
running sum over its turns in insertion order (the sequence ``numpy.mean(axis=0)`` adds in).
A session's date is the earliest ``occurred_at`` of its turns (its start).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import numpy as np

from mnemos.bm25_index import BM25Index, TermCounts
from mnemos.dense_index import as_matrix
from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion

__all__ = ["SessionIndex"]


SESSION_BYTES = 300
"""Estimated bytes per session beyond its arrays and BM25 document: its id, number, count and date."""


class SessionIndex:
    """BM25 over session transcripts fused with cosine to session centroids (AssoMem §4.2).

    Args:
        dim: embedding dimension of the turn vectors (384 for all-MiniLM-L6-v2).
        vocabulary: the term -> id dict of the transcripts' BM25 index, shared with the tenant's
            turn index so that :meth:`add` can take the turns' own term counts.
    """

    def __init__(self, dim: int, vocabulary: dict[str, int] | None = None) -> None:
        if dim < 1:
            raise InvalidParameterError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._numbers: dict[str, int] = {}
        self._ids: list[str] = []
        self._bm25 = BM25Index(vocabulary=vocabulary)
        self._sums = np.zeros((0, dim), dtype=np.float32)
        self._counts: list[int] = []
        self._dates: list[datetime] = []
        self._centroids = np.zeros((0, dim), dtype=np.float32)
        self._stale: set[int] = set()
        self.n_turns = 0
        """Turns added so far (every session together)."""

    def __len__(self) -> int:
        """Number of sessions."""
        return len(self._ids)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._numbers

    def memory_bytes(self) -> int:
        """Estimated bytes held: the ``(capacity, dim)`` float32 sums and centroids, the transcripts'
        BM25 index (:meth:`mnemos.bm25_index.BM25Index.memory_bytes`) and :data:`SESSION_BYTES` per
        session."""
        return (self._sums.nbytes + self._centroids.nbytes + self._bm25.memory_bytes()
                + len(self._ids) * SESSION_BYTES)

    @property
    def session_ids(self) -> tuple[str, ...]:
        """Every session id, in the order its first turn was added."""
        return tuple(self._ids)

    def add(
        self,
        session_ids: Sequence[str],
        texts: Sequence[str],
        embeddings: np.ndarray,
        occurred_at: Sequence[datetime],
        counted: Sequence[TermCounts] | None = None,
    ) -> None:
        """Add turns, in order: their session ids, texts, ``(n, dim)`` float32 unit vectors and times.
        ``counted``, when given, is each text already counted by a BM25 index sharing this one's
        vocabulary (:meth:`mnemos.bm25_index.BM25Index.count`): the texts are then not tokenized again.

        A new session id starts a session; a known one grows its transcript and centroid, and
        its date becomes the earlier of the two. All checks run before anything changes.

        Raises:
            InvalidParameterError: if the sequences differ in length.
            DimensionMismatchError: if ``embeddings`` is not ``(len(session_ids), dim)``.
        """
        n = len(session_ids)
        if not (len(texts) == len(occurred_at) == n) or (counted is not None and len(counted) != n):
            raise InvalidParameterError(
                f"{n} session ids, {len(texts)} texts and {len(occurred_at)} times must match"
            )
        if n == 0:
            return
        matrix = as_matrix(embeddings, self.dim, "turn embeddings")
        if matrix.shape[0] != n:
            raise DimensionMismatchError("turn embeddings", f"({n}, {self.dim})", tuple(matrix.shape))
        self._grow(len(self._ids) + len({s for s in session_ids if s not in self._numbers}))
        counts = [self._bm25.count(text) for text in texts] if counted is None else counted
        for row, (session, when) in enumerate(zip(session_ids, occurred_at, strict=True)):
            number = self._numbers.get(session)
            if number is None:
                number = self._numbers[session] = len(self._ids)
                self._ids.append(session)
                self._counts.append(0)
                self._dates.append(when)
                self._bm25.add_counted([number], [counts[row]])
            else:  # the transcript grows by " " + text: the same tokens
                self._bm25.extend_counted(number, counts[row])
                if when < self._dates[number]:
                    self._dates[number] = when
            self._sums[number] += matrix[row]
            self._counts[number] += 1
            self._stale.add(number)
        self.n_turns += n

    def _grow(self, size: int) -> None:
        if size > self._sums.shape[0]:
            capacity = max(size, 2 * self._sums.shape[0], 16)
            sums = np.zeros((capacity, self.dim), dtype=np.float32)
            sums[: len(self._ids)] = self._sums[: len(self._ids)]
            self._sums = sums

    def _refresh_centroids(self) -> np.ndarray:
        n = len(self._ids)
        if self._centroids.shape[0] != n:
            grown = np.zeros((n, self.dim), dtype=np.float32)
            grown[: self._centroids.shape[0]] = self._centroids
            self._centroids = grown
        for number in self._stale:
            mean = self._sums[number] / np.float32(self._counts[number])
            norm = float(np.linalg.norm(mean))
            self._centroids[number] = mean / norm if norm > 0 else mean
        self._stale.clear()
        return self._centroids

    def date(self, session_id: str) -> datetime:
        """The session's start: the earliest ``occurred_at`` of its turns.

        Raises:
            KeyError: if no turn of ``session_id`` was added.
        """
        return self._dates[self._numbers[session_id]]

    def rank(self, query: str, query_embedding: np.ndarray | None, *, rrf_k: int = DEFAULT_RRF_K) -> tuple[str, ...]:
        """Session ids, best first: RRF (constant ``rrf_k``, the retrieval's own) of the BM25 ranking
        and the centroid-cosine ranking.

        ``query_embedding`` is the ``(dim,)`` (or ``(1, dim)``) float32 unit query vector; with
        None only BM25 ranks, so only sessions sharing a token with the query are returned.
        With a vector every session is returned. ``()`` for an empty index.

        Raises:
            DimensionMismatchError: if the query vector is not ``(dim,)``.
        """
        n = len(self._ids)
        if n == 0:
            return ()
        lists = [[i for i, _ in self._bm25.search(query, n)]]
        if query_embedding is not None:
            vector = np.asarray(query_embedding, dtype=np.float32)
            if vector.ndim == 2 and vector.shape[0] == 1:
                vector = vector[0]
            if vector.shape != (self.dim,):
                raise DimensionMismatchError("query embedding", (self.dim,), tuple(vector.shape))
            cosines = self._refresh_centroids() @ vector
            lists.append([int(i) for i in np.argsort(-cosines, kind="stable")])
        fused = reciprocal_rank_fusion(lists, k=rrf_k)
        return tuple(self._ids[i] for i, _ in fused)
