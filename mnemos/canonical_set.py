"""One tenant's canonical entries as the ingest worker dedupes against them, grown in place.

The ingest worker keeps, per cached tenant, the embeddings and the dedupe signatures of every
canonical entry (docs/architecture.md "Dedupe"). Copying them into a new matrix on every batch,
and coding every stored signature again, costs ``O(N)`` per batch for a tenant of ``N`` canonical
entries on top of the similarity search (docs/scaling.md, "Ingest of a large tenant"). Here the
embeddings live in a buffer whose capacity doubles when full, so adding ``k`` rows costs ``O(k)``
amortised, and each signature is coded once, when its row is added: a dict from signature to an
int64 code that the set keeps. :meth:`CanonicalSet.dedupe` decides exactly as
:func:`mnemos.dedupe.dedupe_batch` on the same rows (both call :func:`mnemos.dedupe.decide`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np

from mnemos.dedupe import DEFAULT_THRESHOLD, DedupeDecision, decide
from mnemos.errors import DimensionMismatchError, InvalidParameterError

MIN_CAPACITY = 64
"""Rows allocated by the first :meth:`CanonicalSet.add` (more if it brings more)."""


class CanonicalSet:
    """Canonical embeddings and signature codes of one tenant, in the order they were added.

    Row ``j`` of :attr:`vectors` and :attr:`codes` is the ``j``-th canonical added; callers keep
    their own row -> entry id list. Memory: up to twice the filled rows (the doubling), so about
    ``2 * N * dim * 4`` bytes of embeddings at most, plus one dict entry per distinct signature.
    Not thread-safe (the ingest worker is single-threaded).
    """

    def __init__(self, dim: int) -> None:
        """An empty set of ``dim``-dimensional embeddings.

        Raises:
            InvalidParameterError: if ``dim`` is not positive.
        """
        if dim <= 0:
            raise InvalidParameterError(f"CanonicalSet needs a positive dimension, got {dim}")
        self._vectors = np.empty((0, dim), np.float32)
        self._codes = np.empty(0, np.int64)
        self._size = 0
        self._code_of: dict[Hashable, int] = {}

    def __len__(self) -> int:
        return self._size

    @property
    def dim(self) -> int:
        """Embedding dimension (columns of :attr:`vectors`)."""
        return int(self._vectors.shape[1])

    @property
    def capacity(self) -> int:
        """Rows allocated (``>= len(self)``)."""
        return int(self._vectors.shape[0])

    @property
    def vectors(self) -> np.ndarray:
        """``(len(self), dim)`` float32 C-contiguous view of the filled rows (valid until the next add)."""
        return self._vectors[:self._size]

    @property
    def codes(self) -> np.ndarray:
        """``(len(self),)`` int64 signature codes of the filled rows: equal codes, equal signatures."""
        return self._codes[:self._size]

    def codes_of(self, signatures: Sequence[Hashable]) -> np.ndarray:
        """``(len(signatures),)`` int64 codes, in the set's code space; an unseen signature gets a new code."""
        code_of = self._code_of
        return np.fromiter((code_of.setdefault(s, len(code_of)) for s in signatures), np.int64, len(signatures))

    def add(self, vectors: np.ndarray, signatures: Sequence[Hashable]) -> None:
        """Append ``k`` canonical rows: ``(k, dim)`` embeddings (cast to float32) and their ``k`` signatures.

        Amortised ``O(k * dim)``: the buffer is reallocated (to twice its capacity, or to what is
        needed if more) only when full, and then copies the filled rows once.

        Raises:
            DimensionMismatchError: if ``vectors`` is not ``(k, dim)``.
            InvalidParameterError: if ``len(signatures) != k``.
        """
        vectors = np.asarray(vectors, dtype=np.float32)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise DimensionMismatchError("canonical embeddings", f"(k, {self.dim})", tuple(vectors.shape))
        k = vectors.shape[0]
        if len(signatures) != k:
            raise InvalidParameterError(f"{k} canonical embeddings but {len(signatures)} signatures")
        needed = self._size + k
        if needed > self.capacity:
            capacity = max(needed, 2 * self.capacity, MIN_CAPACITY)
            grown_vectors = np.empty((capacity, self.dim), np.float32)
            grown_vectors[:self._size] = self.vectors
            grown_codes = np.empty(capacity, np.int64)
            grown_codes[:self._size] = self.codes
            self._vectors, self._codes = grown_vectors, grown_codes
        self._vectors[self._size:needed] = vectors
        self._codes[self._size:needed] = self.codes_of(signatures)
        self._size = needed

    def dedupe(
        self,
        new: np.ndarray,
        threshold: float = DEFAULT_THRESHOLD,
        *,
        new_signatures: Sequence[Hashable] | None = None,
        guard: bool = True,
    ) -> list[DedupeDecision]:
        """:func:`mnemos.dedupe.dedupe_batch` of ``new`` against this set's rows (``existing`` indexes rows).

        Args:
            new: ``(n, dim)`` float32 unit embeddings of the incoming turns, in arrival order.
            threshold: cosine at or above which a row may be a duplicate.
            new_signatures: ``n`` signatures of the incoming turns (row order); required with ``guard``.
            guard: as in :func:`~mnemos.dedupe.dedupe_batch`; when False the signatures are not read.

        Returns:
            ``n`` decisions, in row order. Cost: the ``(n, len(self))`` product and its row maxima,
            ``O(len(self))`` per row the guard refuses its best match, and ``O(n^2)``; nothing else
            grows with the set.

        Raises:
            DimensionMismatchError: if ``new`` is not ``(n, dim)``.
            InvalidParameterError: if ``guard`` is on and ``new_signatures`` is missing or not ``n`` long.
        """
        new = np.asarray(new, dtype=np.float32)
        if new.ndim != 2 or new.shape[1] != self.dim:
            raise DimensionMismatchError("new embeddings", f"(n, {self.dim})", tuple(new.shape))
        if not guard:
            return decide(new, self.vectors, threshold)
        if new_signatures is None or len(new_signatures) != new.shape[0]:
            raise InvalidParameterError(
                f"the dedupe guard needs one signature per new row ({new.shape[0]}), or guard=False")
        return decide(new, self.vectors, threshold, self.codes_of(new_signatures), self.codes)
