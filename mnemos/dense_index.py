"""Exact inner-product index over normalised vectors, backed by ``faiss``.

``IndexIDMap2(IndexFlatIP)`` keeps entry ids next to vectors and accepts adds at any time; a
flat index has no training step, so an index grown by adds ranks exactly like one built in one
go. On unit vectors the inner product is the cosine. Source: *Clustered Retrieval-Induced Forgetting* §2.2
(FAISS inner product over all-MiniLM-L6-v2 vectors).

Guards: faiss pads short result lists with id -1, and an empty index searched with many queries
can return id 0; this wrapper never returns either, and returns empty lists for an empty index.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import faiss
import numpy as np

from mnemos.errors import DimensionMismatchError, DuplicateEntryError

_TIE_MARGIN = 8
"""Extra neighbours read past the k-th to detect ties that straddle the cut."""


def as_matrix(vectors: np.ndarray, dim: int, what: str) -> np.ndarray:
    """Return ``vectors`` as a C-contiguous ``(n, dim)`` float32 array; a ``(dim,)`` row is lifted.

    Raises:
        DimensionMismatchError: if the shape is not ``(n, dim)`` or ``(dim,)``.
    """
    arr = np.asarray(vectors, dtype=np.float32)
    if arr.ndim == 1 and arr.shape[0] == dim:
        arr = arr.reshape(1, dim)
    if arr.ndim != 2 or arr.shape[1] != dim:
        raise DimensionMismatchError(what, f"(n, {dim})", tuple(arr.shape))
    return np.ascontiguousarray(arr)


VECTOR_OVERHEAD_BYTES = 116
"""Estimated bytes per stored vector beyond its ``dim`` float32s: faiss's id (int64) and reverse id
map entry, and the Python set entry of its id."""


class DenseIndex:
    """Inner-product nearest neighbours over ``(n, dim)`` float32 unit vectors; ids are entry ids."""

    def __init__(self, dim: int) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
        self._ids: set[int] = set()

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def add(self, entry_ids: Sequence[int], vectors: np.ndarray) -> None:
        """Add ``(n, dim)`` float32 vectors (already L2-normalised) under ``entry_ids``.

        Raises:
            DimensionMismatchError: if ``vectors`` is not ``(len(entry_ids), dim)``.
            DuplicateEntryError: if an id is already indexed or repeated in the call.
        """
        ids = np.asarray([int(i) for i in entry_ids], dtype=np.int64)
        if ids.size == 0:
            return
        matrix = as_matrix(vectors, self.dim, "dense vectors")
        if matrix.shape[0] != ids.size:
            raise DimensionMismatchError("dense vectors", f"({ids.size}, {self.dim})", tuple(matrix.shape))
        id_list = ids.tolist()
        clash = (set(id_list) & self._ids) | {i for i, c in Counter(id_list).items() if c > 1}
        if clash:
            raise DuplicateEntryError(sorted(clash))
        self._index.add_with_ids(matrix, ids)
        self._ids.update(ids.tolist())

    def memory_bytes(self) -> int:
        """Estimated bytes held: ``dim`` float32s plus :data:`VECTOR_OVERHEAD_BYTES` per vector
        (faiss allocates outside Python, so this is counted, not measured)."""
        return len(self) * (4 * self.dim + VECTOR_OVERHEAD_BYTES)

    def reconstruct(self, entry_id: int) -> np.ndarray:
        """The stored ``(dim,)`` vector of ``entry_id`` (raises KeyError if absent)."""
        if int(entry_id) not in self._ids:
            raise KeyError(entry_id)
        return np.asarray(self._index.reconstruct(int(entry_id)), dtype=np.float32)

    def search(
        self, query_vectors: np.ndarray, n: int, allowed: np.ndarray | None = None
    ) -> list[list[tuple[int, float]]]:
        """Top ``n`` ``(entry_id, inner_product)`` per query row, best first, ties by entry id.

        Ties are resolved by entry id even across the n-th place, so the list for ``n`` is
        always the prefix of the list for any larger ``n``.

        ``query_vectors`` is ``(m, dim)`` (or one ``(dim,)`` row). Returns ``m`` lists; each is
        empty when the index is empty or ``n <= 0``, and never holds the padding id -1.
        ``allowed`` (``(a,)`` int64 entry ids; ids not indexed are ignored) restricts the search
        to those entries inside faiss (``SearchParameters(sel=IDSelectorBatch)``, exact on a
        flat index): the result equals a fresh index holding only the allowed vectors.

        Raises:
            DimensionMismatchError: if a query row does not have ``dim`` columns.
        """
        queries = as_matrix(query_vectors, self.dim, "query vectors")
        m = queries.shape[0]
        params = None
        total = int(self._index.ntotal)
        if allowed is not None:
            wanted = np.unique(np.asarray(allowed, dtype=np.int64))
            wanted = wanted[[int(i) in self._ids for i in wanted.tolist()]] if wanted.size else wanted
            total = int(wanted.size)
            if total:
                selector = faiss.IDSelectorBatch(wanted)  # bound to a name: faiss keeps a raw pointer
                # faiss's Python wrapper takes the fields as keywords (and keeps the selector alive);
                # the signature generated for its type information does not say so
                params = faiss.SearchParameters(sel=selector)  # type: ignore[call-arg]
        if n <= 0 or total == 0 or m == 0:
            return [[] for _ in range(m)]
        k = min(n, total)
        # faiss breaks ties at the k-th place arbitrarily; read on until the tie run at the
        # boundary ends, so ties always resolve to the lowest entry ids (same list for any n).
        fetch = min(total, k + _TIE_MARGIN)
        while True:
            scores, ids = self._index.search(queries, fetch, params=params)
            if fetch == total or not np.any(scores[:, k - 1] == scores[:, fetch - 1]):
                break
            fetch = min(total, 2 * fetch)
        results: list[list[tuple[int, float]]] = []
        for row_scores, row_ids in zip(scores, ids, strict=True):
            pairs = [(int(i), float(s)) for i, s in zip(row_ids, row_scores, strict=True) if i != -1]
            pairs.sort(key=lambda p: (-p[1], p[0]))
            results.append(pairs[:k])
        return results

    def search_split(self, query_vector: np.ndarray, n: int, allowed: np.ndarray) -> tuple[list[tuple[int, float]],
                                                                                         list[tuple[int, float]]]:
        """One inner-product pass over every vector, two rankings: the best ``n`` ``allowed`` entries
        (what ``search(query_vector, n, allowed)[0]`` returns) and the best ``n`` of all entries,
        each best first with ties by entry id.

        The query is compared once with every stored vector (faiss's range search below any score),
        and the restriction only chooses among those products. faiss computes them there as it does
        under :meth:`search`'s ID selector, to the bit, so the allowed ranking is exactly the
        filtered search's; an unrestricted :meth:`search` of a large index computes them through
        BLAS instead, which can differ in the last bit, so two entries whose products agree to
        within float rounding can swap places in the second ranking.

        Raises:
            DimensionMismatchError: if ``query_vector`` is not one ``(dim,)`` row.
        """
        query = as_matrix(query_vector, self.dim, "query vector")
        if query.shape[0] != 1:
            raise DimensionMismatchError("query vector", (self.dim,), tuple(query.shape))
        if n <= 0 or len(self) == 0:
            return [], []
        _, scores, ids = self._index.range_search(query, float("-inf"))
        inside = np.isin(ids, np.asarray(allowed, dtype=np.int64))
        return _best(ids[inside], scores[inside], n), _best(ids, scores, n)


def _best(ids: np.ndarray, scores: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The ``n`` best ``(entry_id, score)`` pairs of parallel arrays, best first, ties by entry id."""
    if ids.size > n:
        nth = np.partition(scores, ids.size - n)[ids.size - n]  # the n-th best score: keep every tie of it
        keep = scores >= nth
        ids, scores = ids[keep], scores[keep]
    order = np.lexsort((ids, -scores))[:n]
    return [(int(ids[i]), float(scores[i])) for i in order]
