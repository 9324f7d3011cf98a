"""Incremental BM25 index over one tenant's entries: term counts kept per document, the score
matrix rebuilt in numpy.

Each document is tokenized once, when it is added (or extended), into term ids of a vocabulary the
index grows and their counts (``int32`` arrays). The score matrix (documents x terms, float32,
compressed by column) is rebuilt lazily, once, on the first search after one or more changes, from
those counts alone: no text is tokenized again and no Python loop runs over tokens, so a rebuild
costs a few numpy passes over the stored (document, term) pairs (0.57 s p50 for a request that
added 5 turns to a 200k-turn tenant, both of its BM25 matrices rebuilt; docs/scaling.md). The ranking is that of a fresh build over the same documents
in the same order. A query sums the matrix's columns of its tokens (a repeated token counts twice),
as ``bm25s`` does.

Scoring is the Lucene variant of ``bm25s`` (``method="lucene"``): IDF ``log(1 + (N - df + 0.5) /
(df + 0.5))``, positive for every term, so small corpora never produce zero or negative scores for
a matching document (the Robertson IDF can, when a term is in half the corpus or more), and term
weight ``idf * tf / (tf + k1 (1 - b + b dl / avgdl))`` (Kamphuis et al., *Which BM25 Do You Mean?
A Large-Scale Reproducibility Study of Scoring Variants*, 2020). Only documents with a score > 0 are
returned. ``bm25s`` builds the same matrix but from the token strings on every rebuild, which took
minutes at 200k turns and held every token as a Python string.

Source: *Clustered Retrieval-Induced Forgetting* §2.2 (BM25 over word tokens) and its
post-submission tokenizer note, and the lethe research journal's tokenizer sweep (regex word tokens,
no stemming, no stopwords: :mod:`mnemos.tokenizer`); docs/architecture.md "Retrieval".
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse

from mnemos.errors import DuplicateEntryError
from mnemos.tokenizer import tokenize

logger = logging.getLogger(__name__)

PAIR_BYTES = 16
"""Estimated bytes per distinct (document, term) pair: its term id and count (``int32`` each) and
its entry of the score matrix (float32 value, ``int32`` row index)."""
TERM_BYTES = 120
"""Estimated bytes per vocabulary term: its ``str`` object and dict slot, and its column pointer."""
DOC_BYTES = 240
"""Estimated bytes per document: its length, id bookkeeping (list, set, position map) and row
pointers."""


def vocabulary_bytes(terms: int) -> int:
    """Estimated bytes of a vocabulary of ``terms`` terms (:data:`TERM_BYTES` each)."""
    return terms * TERM_BYTES


@dataclass(frozen=True)
class TermCounts:
    """One text counted against a vocabulary (:meth:`BM25Index.count`): distinct term ids and their
    counts (``(m,)`` int32 each, in first-occurrence order), its token count, and the id of the
    vocabulary the term ids belong to."""

    terms: np.ndarray
    counts: np.ndarray
    length: int
    vocabulary: int


class BM25Index:
    """BM25 over entry texts; ids are entry ids (int).

    Args:
        k1: term-frequency saturation (bm25s default 1.5).
        b: length normalisation (bm25s default 0.75).
        tokenizer: text to tokens; defaults to :func:`mnemos.tokenizer.tokenize`.
        vocabulary: a term -> id dict shared with other indexes (a tenant's turn and session
            indexes share one, so a text is tokenized and counted once for both); a new one by
            default. Only grown, never shrunk.
    """

    def __init__(
        self, k1: float = 1.5, b: float = 0.75, tokenizer: Callable[[str], list[str]] = tokenize,
        vocabulary: dict[str, int] | None = None,
    ) -> None:
        self.k1 = k1
        self.b = b
        self._tokenize = tokenizer
        self._vocab: dict[str, int] = {} if vocabulary is None else vocabulary
        self._owns_vocabulary = vocabulary is None
        self._ids: list[int] = []
        self._id_set: set[int] = set()
        self._positions: dict[int, int] = {}
        self._lengths: list[int] = []  # per document: tokens
        self._counts = sparse.csr_matrix((0, 0), dtype=np.int32)  # documents x terms, as of the last build
        self._pending: list[tuple[int, np.ndarray, np.ndarray]] = []  # (document, term ids, counts) not yet merged
        self._matrix: sparse.csc_matrix | None = None
        self._dirty = False
        self._id_array = np.zeros(0, dtype=np.int64)
        self._n_tokens = 0
        self._n_pairs = 0
        self.builds = 0
        """How many times the score matrix was (re)built; exposed so tests can see laziness."""

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, entry_ids: Sequence[int], texts: Sequence[str]) -> None:
        """Add documents; the score matrix is rebuilt once, on the next :meth:`search`.

        Documents that tokenize to nothing are kept (they count in ``len`` and in the average
        length) but never match.

        Raises:
            ValueError: if ``entry_ids`` and ``texts`` differ in length.
            DuplicateEntryError: if an id is already indexed or repeated in the call.
        """
        if len(entry_ids) != len(texts):
            raise ValueError(f"{len(entry_ids)} entry ids but {len(texts)} texts")
        self._check_new([int(i) for i in entry_ids])
        self.add_counted(entry_ids, [self.count(text) for text in texts])

    def add_counted(self, entry_ids: Sequence[int], counted: Sequence[TermCounts]) -> None:
        """:meth:`add` of texts already counted by :meth:`count` (of this index or of one sharing
        its vocabulary).

        Raises:
            ValueError: if the lengths differ or a count belongs to another vocabulary.
            DuplicateEntryError: if an id is already indexed or repeated in the call.
        """
        if len(entry_ids) != len(counted):
            raise ValueError(f"{len(entry_ids)} entry ids but {len(counted)} counted texts")
        ids = [int(i) for i in entry_ids]
        self._check_new(ids)
        self._check_vocabulary(counted)
        if not ids:
            return
        self._positions.update((entry_id, len(self._ids) + offset) for offset, entry_id in enumerate(ids))
        self._ids.extend(ids)
        self._id_set.update(ids)
        for position, counts in enumerate(counted, start=len(self._lengths)):
            self._lengths.append(0)
            self._append(position, counts)
        self._dirty = True

    def _check_new(self, ids: list[int]) -> None:
        clash = (set(ids) & self._id_set) | {i for i, c in Counter(ids).items() if c > 1}
        if clash:
            raise DuplicateEntryError(sorted(clash))

    def _check_vocabulary(self, counted: Sequence[TermCounts]) -> None:
        if any(c.vocabulary != id(self._vocab) for c in counted):
            raise ValueError("term counts of another vocabulary")

    def extend(self, entry_id: int, text: str) -> None:
        """Append ``text`` to the indexed document ``entry_id`` (a growing transcript).

        The document then ranks as if it had been added as ``old text + " " + text``: the
        tokenizer splits on whitespace and works character by character, so tokens never span
        the join. The score matrix is rebuilt once, on the next :meth:`search`.

        Raises:
            KeyError: if ``entry_id`` is not indexed.
        """
        self.extend_counted(entry_id, self.count(text))

    def extend_counted(self, entry_id: int, counted: TermCounts) -> None:
        """:meth:`extend` with a text already counted by :meth:`count`.

        Raises:
            KeyError: if ``entry_id`` is not indexed.
            ValueError: if ``counted`` belongs to another vocabulary.
        """
        position = self._positions[int(entry_id)]
        self._check_vocabulary([counted])
        if counted.length:
            self._append(position, counted)
            self._dirty = True

    def count(self, text: str) -> TermCounts:
        """``text`` tokenized and counted against this index's vocabulary; its new terms join the
        vocabulary (in sorted order, so ids do not depend on hashing). Nothing is indexed."""
        tokens = self._tokenize(text)
        counted = Counter(tokens)
        vocab = self._vocab
        new = sorted(set(counted).difference(vocab))  # iterates the text's terms, not the vocabulary
        vocab.update(zip(new, range(len(vocab), len(vocab) + len(new)), strict=True))
        terms = np.fromiter(map(vocab.__getitem__, counted), dtype=np.int32, count=len(counted))
        counts = np.fromiter(counted.values(), dtype=np.int32, count=len(counted))
        return TermCounts(terms, counts, len(tokens), id(vocab))

    def _append(self, position: int, counted: TermCounts) -> None:
        """Add ``counted`` to document ``position`` (pending until the next build)."""
        if not counted.length:
            return
        self._pending.append((position, counted.terms, counted.counts))
        self._lengths[position] += counted.length
        self._n_tokens += counted.length
        self._n_pairs += len(counted.terms)

    @property
    def n_tokens(self) -> int:
        """Tokens indexed over every document (alias texts appended by :meth:`extend` included)."""
        return self._n_tokens

    def memory_bytes(self) -> int:
        """Estimated bytes this index holds: :data:`PAIR_BYTES` per distinct (document, term)
        pair, :data:`DOC_BYTES` per document and, when the vocabulary is its own (not passed in),
        :func:`vocabulary_bytes` (a constant-time estimate, not a measurement)."""
        own = vocabulary_bytes(len(self._vocab)) if self._owns_vocabulary else 0
        return self._n_pairs * PAIR_BYTES + len(self._ids) * DOC_BYTES + own

    def _ensure_index(self) -> sparse.csc_matrix | None:
        """Rebuild the score matrix if documents changed; None when no document has a token."""
        if self._dirty:
            self._dirty = False
            self._id_array = np.asarray(self._ids, dtype=np.int64)
            self._matrix = self._build() if self._n_pairs else None
            if self._matrix is not None:
                self.builds += 1
                logger.debug("rebuilt BM25 matrix over %d documents", len(self._ids))
        return self._matrix

    def _build(self) -> sparse.csc_matrix:
        """The ``(documents, terms)`` float32 matrix of Lucene BM25 term weights (module docstring).

        The pending counts are merged into the count matrix first: one sparse sum, repeated
        (document, term) pairs added up, so a transcript extended turn by turn ends as one row."""
        n, n_terms = len(self._ids), len(self._vocab)
        self._counts.resize((n, n_terms))  # new documents (tokenless ones too) and terms
        if self._pending:
            rows = np.concatenate([np.full(len(t), d, dtype=np.int64) for d, t, _ in self._pending])
            terms = np.concatenate([t for _, t, _ in self._pending])
            counts = np.concatenate([c for _, _, c in self._pending])
            delta = sparse.csr_matrix((counts, (rows, terms)), shape=(n, n_terms), dtype=np.int32)
            self._counts = (self._counts + delta).tocsr()
            self._pending = []
            self._n_pairs = int(self._counts.nnz)
        counts = self._counts
        tf = counts.data.astype(np.float32)
        per_doc = np.diff(counts.indptr)
        lengths = np.asarray(self._lengths, dtype=np.float32)
        df = np.bincount(counts.indices, minlength=n_terms).astype(np.float64)
        idf = np.log1p((n - df + 0.5) / (df + 0.5)).astype(np.float32)
        norm = (self.k1 * ((1.0 - self.b) + self.b * lengths / np.float32(lengths.mean()))).astype(np.float32)
        weights = idf[counts.indices] * tf / (tf + np.repeat(norm, per_doc))
        return sparse.csr_matrix((weights, counts.indices, counts.indptr), shape=(n, n_terms)).tocsc()

    def scores(self, query: str, allowed: np.ndarray | None = None) -> np.ndarray:
        """BM25 score of every indexed document for ``query``, in insertion order.

        Returns a ``(len(self),)`` float32 array; all zeros when the query has no token in the
        vocabulary or no document has a token. ``allowed`` (entry ids, any order) zeroes every
        other document; the allowed documents keep exactly their unrestricted scores, because IDF
        and average length stay those of the whole index (like a filter clause in Lucene: a
        restriction chooses documents, it does not reweigh terms).
        """
        matrix = self._ensure_index()
        out = np.zeros(len(self._ids), dtype=np.float32)
        if matrix is None:
            return out
        for token in self._tokenize(query):
            term = self._vocab.get(token)
            if term is None or term >= matrix.shape[1]:  # unknown, or new in a shared vocabulary since the build
                continue
            start, stop = matrix.indptr[term], matrix.indptr[term + 1]
            out[matrix.indices[start:stop]] += matrix.data[start:stop]
        if allowed is not None:
            out[~np.isin(self._id_array, allowed)] = 0.0
        return out

    def search(self, query: str, n: int, allowed: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The best ``n`` documents for ``query`` as ``(entry_id, score)``, best first.

        Only scores > 0 are returned; ties break by ascending entry id. ``[]`` when the query has
        no tokens (empty, punctuation only), the index is empty, or ``n <= 0``. With ``allowed``
        (``(m,)`` int64 entry ids) only those documents are scored (see :meth:`scores`): the result
        is the unrestricted ranking with every other document removed, however few are allowed.
        """
        if n <= 0 or not self._ids or (allowed is not None and len(allowed) == 0):
            return []
        return self._best(self.scores(query, allowed), n)

    def search_split(self, query: str, n: int, allowed: np.ndarray) -> tuple[list[tuple[int, float]],
                                                                            list[tuple[int, float]]]:
        """One scoring pass, two rankings: the best ``n`` ``allowed`` documents (what
        ``search(query, n, allowed)`` returns) and the best ``n`` of all documents (what
        ``search(query, n)`` returns), each as :meth:`search` orders it.

        The query is scored once, over the whole index; the restriction only chooses among those
        scores (:meth:`scores`), so both rankings are exactly those of the two searches.
        """
        if n <= 0 or not self._ids:
            return [], []
        scores = self.scores(query)
        return self._best(scores, n, np.isin(self._id_array, allowed)), self._best(scores, n)

    def _best(self, scores: np.ndarray, n: int, among: np.ndarray | None = None) -> list[tuple[int, float]]:
        """The ``n`` best documents with a score > 0 (only those where ``among`` is True, when given),
        best first, ties by ascending entry id."""
        keep = scores > 0
        if among is not None:
            keep &= among
        positive = np.flatnonzero(keep)
        if positive.size == 0:
            return []
        ids = self._id_array[positive]
        vals = scores[positive]
        order = np.lexsort((ids, -vals))[:n]
        return [(int(ids[i]), float(vals[i])) for i in order]
