"""Incremental BM25 index over one tenant's entries, backed by ``bm25s``.

``bm25s`` builds an immutable sparse score matrix. To support adds without rebuilding at every
add, this class keeps the tokenized documents and rebuilds the ``bm25s`` index lazily, once, on
the first search after one or more adds. The ranking is therefore identical to a fresh build
over the same documents in the same order.

Scoring uses the Lucene variant (``method="lucene"``): its IDF ``log(1 + (N - df + 0.5) /
(df + 0.5))`` is positive for every term, so small corpora never produce zero or negative
scores for a matching document (the Robertson IDF can, when a term is in half the corpus or
more). Only documents with a score > 0 are returned.

Source: *Clustered Retrieval-Induced Forgetting* §2.2 (BM25 over word tokens) and its post-submission tokenizer note, and the
lethe research journal's tokenizer sweep (regex word tokens, no stemming, no stopwords:
:mod:`mnemos.tokenizer`); docs/architecture.md "Retrieval".
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence

import bm25s
import numpy as np

from mnemos.errors import DuplicateEntryError
from mnemos.tokenizer import tokenize

logger = logging.getLogger(__name__)

BM25_METHOD = "lucene"
"""bm25s scoring variant: Lucene's non-negative IDF (see module docstring)."""

TOKEN_BYTES = 72
"""Estimated bytes per indexed token: its ``str`` object (about 55 bytes for a short word) and list
slot in the kept documents, and its share of bm25s's sparse score matrix (float32 + int32)."""
DOC_BYTES = 240
"""Estimated bytes per document: its token list, id bookkeeping (list, set, position map) and column
pointer."""


class BM25Index:
    """BM25 over entry texts; ids are entry ids (int).

    Args:
        k1: term-frequency saturation (bm25s default 1.5).
        b: length normalisation (bm25s default 0.75).
        tokenizer: text to tokens; defaults to :func:`mnemos.tokenizer.tokenize`.
    """

    def __init__(
        self, k1: float = 1.5, b: float = 0.75, tokenizer: Callable[[str], list[str]] = tokenize
    ) -> None:
        self.k1 = k1
        self.b = b
        self._tokenize = tokenizer
        self._ids: list[int] = []
        self._id_set: set[int] = set()
        self._positions: dict[int, int] = {}
        self._docs: list[list[str]] = []
        self._retriever: bm25s.BM25 | None = None
        self._dirty = False
        self._id_array = np.zeros(0, dtype=np.int64)
        self._n_tokens = 0
        self.builds = 0
        """How many times the bm25s index was (re)built; exposed so tests can see laziness."""

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, entry_ids: Sequence[int], texts: Sequence[str]) -> None:
        """Add documents; the bm25s index is rebuilt once, on the next :meth:`search`.

        Documents that tokenize to nothing are kept (they count in ``len``) but never match.

        Raises:
            ValueError: if ``entry_ids`` and ``texts`` differ in length.
            DuplicateEntryError: if an id is already indexed or repeated in the call.
        """
        if len(entry_ids) != len(texts):
            raise ValueError(f"{len(entry_ids)} entry ids but {len(texts)} texts")
        ids = [int(i) for i in entry_ids]
        clash = (set(ids) & self._id_set) | {i for i, c in Counter(ids).items() if c > 1}
        if clash:
            raise DuplicateEntryError(sorted(clash))
        if not ids:
            return
        self._positions.update((entry_id, len(self._ids) + offset) for offset, entry_id in enumerate(ids))
        self._ids.extend(ids)
        self._id_set.update(ids)
        docs = [self._tokenize(text) for text in texts]
        self._docs.extend(docs)
        self._n_tokens += sum(map(len, docs))
        self._dirty = True

    def extend(self, entry_id: int, text: str) -> None:
        """Append ``text`` to the indexed document ``entry_id`` (a growing transcript).

        The document then ranks as if it had been added as ``old text + " " + text``: the
        tokenizer splits on whitespace and works character by character, so tokens never span
        the join. The bm25s index is rebuilt once, on the next :meth:`search`.

        Raises:
            KeyError: if ``entry_id`` is not indexed.
        """
        position = self._positions[int(entry_id)]
        tokens = self._tokenize(text)
        if tokens:
            self._docs[position].extend(tokens)
            self._n_tokens += len(tokens)
            self._dirty = True

    @property
    def n_tokens(self) -> int:
        """Tokens indexed over every document (alias texts appended by :meth:`extend` included)."""
        return self._n_tokens

    def memory_bytes(self) -> int:
        """Estimated bytes this index holds: :data:`TOKEN_BYTES` per token plus :data:`DOC_BYTES`
        per document (a constant-time estimate, not a measurement)."""
        return self._n_tokens * TOKEN_BYTES + len(self._ids) * DOC_BYTES

    def _ensure_index(self) -> bm25s.BM25 | None:
        """Rebuild the bm25s index if documents were added; None when no document has a token."""
        if self._dirty:
            self._dirty = False
            self._id_array = np.asarray(self._ids, dtype=np.int64)
            if any(self._docs):
                retriever = bm25s.BM25(k1=self.k1, b=self.b, method=BM25_METHOD)
                retriever.index(self._docs, show_progress=False)
                self._retriever = retriever
                self.builds += 1
                logger.debug("rebuilt BM25 index over %d documents", len(self._docs))
            else:  # bm25s cannot build a vocabulary of nothing
                self._retriever = None
        return self._retriever

    def scores(self, query: str, allowed: np.ndarray | None = None) -> np.ndarray:
        """BM25 score of every indexed document for ``query``, in insertion order.

        Returns a ``(len(self),)`` float32 array; all zeros when the query has no token in the
        vocabulary or no document has a token. ``allowed`` (entry ids, any order) zeroes every
        other document through bm25s's ``weight_mask``; the allowed documents keep exactly their
        unrestricted scores, because IDF and average length stay those of the whole index (like a
        filter clause in Lucene: a restriction chooses documents, it does not reweigh terms).
        """
        retriever = self._ensure_index()
        tokens = self._tokenize(query)
        if retriever is None or not tokens:
            return np.zeros(len(self._ids), dtype=np.float32)
        token_ids = retriever.get_tokens_ids(tokens)
        if not token_ids:  # bm25s.get_scores indexes tokens[0]; guard the out-of-vocabulary case
            return np.zeros(len(self._ids), dtype=np.float32)
        mask = None if allowed is None else np.isin(self._id_array, allowed).astype(np.float32)
        return np.asarray(retriever.get_scores_from_ids(token_ids, weight_mask=mask), dtype=np.float32)

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The best ``n`` documents for ``query`` as ``(entry_id, score)``, best first.

        Only scores > 0 are returned; ties break by ascending entry id. ``[]`` when the query has
        no tokens (empty, punctuation only), the index is empty, or ``n <= 0``. With ``allowed``
        (``(m,)`` int64 entry ids) only those documents are scored (see :meth:`scores`): the result
        is the unrestricted ranking with every other document removed, however few are allowed.
        """
        if n <= 0 or not self._ids or (allowed is not None and len(allowed) == 0):
            return []
        scores = self.scores(query, allowed)
        positive = np.flatnonzero(scores > 0)
        if positive.size == 0:
            return []
        ids = self._id_array[positive]
        vals = scores[positive]
        order = np.lexsort((ids, -vals))[:n]
        return [(int(ids[i]), float(vals[i])) for i in order]
