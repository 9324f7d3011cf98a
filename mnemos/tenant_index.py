"""All canonical entries of one tenant: a BM25 index, a dense index, the entry map and sessions.

The session-level retriever (:class:`~mnemos.sessions.SessionIndex`, used by the session
feature of :mod:`mnemos.features`) grows with every added entry; turns that are not entries
(dedupe aliases) join their session through :meth:`TenantIndex.add_session_turns`, so session
transcripts, centroids and start dates cover everything said, as in the benchmark.

An alias's rendered text is appended to its canonical entry's BM25 document
(:meth:`TenantIndex.add_aliases`), so what an alias alone says can still be found: the canonical
entry is returned and lists the alias (docs/architecture.md, "Dedupe").

Every turn, canonical or alias, also keeps its own session, role and time in :attr:`TenantIndex.turns`
(a :class:`~mnemos.filters.TurnTable`), from which :meth:`TenantIndex.allowed_entries` turns an
:class:`~mnemos.filters.EntryFilter` (``as_of``, sessions, roles, ``occurred_after``) into the
entries a retrieval may consider. :attr:`TenantIndex.supersessions` records which turns later
turns correct (``metadata.supersedes``), for evidence packets (:mod:`mnemos.packets`); the caller
fills it, as it fills aliases.

A tenant index holds exactly one tenant's entries; :meth:`TenantIndex.add` refuses an entry of
another tenant (docs/architecture.md "Invariants": tenant isolation). Indexes are derived state: the
service rebuilds or extends them from Postgres and records the tenant's memory ``version``
they reflect.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from datetime import datetime

import numpy as np

from mnemos.bm25_index import BM25Index, vocabulary_bytes
from mnemos.dense_index import DenseIndex, as_matrix
from mnemos.errors import (
    DimensionMismatchError,
    DuplicateEntryError,
    InvalidParameterError,
    TenantMismatchError,
    UnknownEntryError,
)
from mnemos.filters import EntryFilter, TurnTable
from mnemos.records import Entry, TurnFacts
from mnemos.rendering import RENDERING_VERSION, Rendering, render_turn
from mnemos.sessions import SessionIndex
from mnemos.supersession import SupersessionTable

ENTRY_BYTES = 700
"""Estimated bytes per entry beyond its text: the :class:`~mnemos.records.Entry` object with its
ids, role and time, and the id-to-row maps."""


class TenantIndex:
    """BM25 + dense index + entry map of one tenant.

    Args:
        tenant_id: the tenant every entry must belong to.
        dim: embedding dimension (384 for all-MiniLM-L6-v2).
        version: the tenant memory version the index reflects (the service bumps it).
        rendering: how an entry becomes the text BM25, the session index and the reranker read
            (:func:`mnemos.rendering.render_turn`); the caller embeds with the same rendering.
    """

    def __init__(self, tenant_id: str, dim: int, version: int = 0,
                 rendering: Rendering | int = RENDERING_VERSION) -> None:
        self.tenant_id = tenant_id
        self.dim = dim
        self.version = version
        self.rendering = Rendering(rendering)
        self._vocabulary: dict[str, int] = {}  # shared: a rendered turn is tokenized once for both BM25 indexes
        self.bm25 = BM25Index(vocabulary=self._vocabulary)
        self.dense = DenseIndex(dim)
        self.sessions = SessionIndex(dim, vocabulary=self._vocabulary)
        self.turns = TurnTable()
        self._alias_facts: dict[int, list[tuple[str, TurnFacts]]] = {}  # entry id -> its aliases' own facts
        self.supersessions = SupersessionTable()
        self._entries: dict[int, Entry] = {}
        self._rows: dict[int, int] = {}
        self._vectors = np.zeros((0, dim), dtype=np.float32)
        self._n_rows = 0
        self._text_chars = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def add(self, entries: Sequence[Entry], embeddings: np.ndarray, version: int | None = None) -> None:
        """Add canonical entries with their ``(len(entries), dim)`` float32 unit embeddings.

        All checks run before anything is changed, so a refused call leaves the index as it was.
        ``version``, when given, becomes :attr:`version`. The entries also join their sessions
        in :attr:`sessions`, in the given order.

        Raises:
            TenantMismatchError: if an entry belongs to another tenant.
            DimensionMismatchError: if ``embeddings`` is not ``(len(entries), dim)``.
            DuplicateEntryError: if an entry id is already present or repeated.
        """
        for entry in entries:
            if entry.tenant_id != self.tenant_id:
                raise TenantMismatchError(self.tenant_id, entry.tenant_id)
        if not entries:
            if version is not None:
                self.version = version
            return
        matrix = as_matrix(embeddings, self.dim, "entry embeddings")
        if matrix.shape[0] != len(entries):
            raise DimensionMismatchError("entry embeddings", f"({len(entries)}, {self.dim})", tuple(matrix.shape))
        ids = [e.entry_id for e in entries]
        clash = {i for i in ids if i in self._entries} | {i for i, c in Counter(ids).items() if c > 1}
        if clash:
            raise DuplicateEntryError(sorted(clash))

        self.turns.add(ids, [e.facts for e in entries])  # first: it refuses a naive time before anything changes
        rendered = [self.render(e) for e in entries]
        counted = [self.bm25.count(text) for text in rendered]
        self.bm25.add_counted(ids, counted)
        self.dense.add(ids, matrix)
        self.sessions.add([e.session_id for e in entries], rendered, matrix, [e.occurred_at for e in entries],
                          counted=counted)
        self._append_vectors(ids, matrix)
        for entry in entries:
            self._entries[entry.entry_id] = entry
            self._text_chars += len(entry.text) + len(entry.image_caption or "")
        if version is not None:
            self.version = version

    def memory_bytes(self) -> int:
        """Estimated bytes this index holds (embeddings, BM25, texts, sessions, turn table).

        A constant-time sum of counted parts: every float32 array's size, and per token, vector,
        turn, session and entry an overhead measured once on CPython 3.11 (the constants beside each
        class; tests/unit/test_index_memory.py checks the sum against tracemalloc). A query worker
        sizes its cache of tenant indexes with it (``MNEMOS_INDEX_MEMORY_MB``).
        """
        return (self._vectors.nbytes + self._text_chars + len(self._entries) * ENTRY_BYTES
                + self.bm25.memory_bytes() + self.dense.memory_bytes() + self.sessions.memory_bytes()
                + self.turns.memory_bytes() + vocabulary_bytes(len(self._vocabulary)))

    def _append_vectors(self, ids: Sequence[int], matrix: np.ndarray) -> None:
        needed = self._n_rows + matrix.shape[0]
        if needed > self._vectors.shape[0]:
            grown = np.zeros((max(needed, 2 * self._vectors.shape[0], 16), self.dim), dtype=np.float32)
            grown[: self._n_rows] = self._vectors[: self._n_rows]
            self._vectors = grown
        self._vectors[self._n_rows : needed] = matrix
        for offset, entry_id in enumerate(ids):
            self._rows[entry_id] = self._n_rows + offset
        self._n_rows = needed

    def entry(self, entry_id: int) -> Entry:
        """The entry with ``entry_id``.

        Raises:
            UnknownEntryError: if the tenant has no such entry.
        """
        try:
            return self._entries[entry_id]
        except KeyError:
            raise UnknownEntryError(self.tenant_id, entry_id) from None

    def render(self, entry: Entry) -> str:
        """The text models see for ``entry`` under this index's rendering (whether indexed or not)."""
        return render_turn(entry.role, entry.text, entry.image_caption, version=self.rendering)

    def rendered(self, entry_id: int) -> str:
        """The rendered text of an indexed entry: what the cross-encoder scores and what BM25 indexed
        (BM25 also holds the texts of its aliases, :meth:`add_aliases`).

        Raises:
            UnknownEntryError: if the tenant has no such entry.
        """
        return self.render(self.entry(entry_id))

    def entries(self) -> Iterator[Entry]:
        """Every entry, in insertion order."""
        return iter(self._entries.values())

    def embeddings_of(self, entry_ids: Iterable[int]) -> np.ndarray:
        """``(n, dim)`` float32 embeddings of ``entry_ids``, in the given order.

        Raises:
            UnknownEntryError: if an id is not in the tenant.
        """
        ids = list(entry_ids)
        rows = []
        for entry_id in ids:
            if entry_id not in self._rows:
                raise UnknownEntryError(self.tenant_id, entry_id)
            rows.append(self._rows[entry_id])
        return self._vectors[np.asarray(rows, dtype=np.int64)].copy() if rows else np.zeros((0, self.dim), np.float32)

    def all_embeddings(self) -> tuple[list[int], np.ndarray]:
        """Every entry id (insertion order) and its ``(n, dim)`` embedding, e.g. for dedupe."""
        ids = list(self._entries)
        return ids, self._vectors[: self._n_rows].copy()

    def add_session_turns(
        self, session_ids: Sequence[str], texts: Sequence[str], embeddings: np.ndarray, occurred_at: Sequence[datetime]
    ) -> None:
        """Add turns that are not entries (dedupe aliases) to :attr:`sessions` only, in order.

        ``embeddings`` is ``(n, dim)`` float32; ``occurred_at`` tz-aware. Turn-level retrieval
        never sees them (their canonical entry stands for them).

        Raises:
            InvalidParameterError: if the sequences differ in length.
            DimensionMismatchError: if ``embeddings`` is not ``(n, dim)``.
        """
        self.sessions.add(session_ids, texts, embeddings, occurred_at)

    def add_aliases(
        self, entry_id: int, turn_ids: Sequence[str], facts: Sequence[TurnFacts] | None = None,
        texts: Sequence[str] | None = None,
    ) -> Entry:
        """Fold ``turn_ids`` into ``entry_id``'s aliases (dedupe); returns the updated entry.

        Alias turn ids already present (or equal to the canonical turn id) are skipped.
        ``facts[i]``, when given, is the session, role and time of ``turn_ids[i]``: the alias keeps
        them in :attr:`turns`, so the entry passes a filter that admits the alias. Without facts
        an alias is filtered by its canonical turn's fields only.

        ``texts[i]``, when given, is the rendered text of ``turn_ids[i]`` (rendered like
        :meth:`render`, under :attr:`rendering`): it is appended to the entry's BM25 document, so a
        query that matches only the alias's words finds the canonical entry, which lists the alias
        in ``aliases`` (docs/architecture.md, "Dedupe"). Dense search and the reranker keep the
        canonical's embedding and text.

        Raises:
            UnknownEntryError: if the tenant has no such entry.
            InvalidParameterError: if ``facts`` or ``texts`` and ``turn_ids`` differ in length.
        """
        entry = self.entry(entry_id)
        if facts is not None and len(facts) != len(turn_ids):
            raise InvalidParameterError(f"{len(turn_ids)} alias turn ids but {len(facts)} turn facts")
        if texts is not None and len(texts) != len(turn_ids):
            raise InvalidParameterError(f"{len(turn_ids)} alias turn ids but {len(texts)} alias texts")
        known = set(entry.turn_ids)
        extra = []
        extra_facts = []
        extra_texts = []
        for position, turn_id in enumerate(turn_ids):
            if turn_id not in known:
                known.add(turn_id)
                extra.append(turn_id)
                if facts is not None:
                    extra_facts.append(facts[position])
                if texts is not None:
                    extra_texts.append(texts[position])
        if extra_facts:
            self.turns.add([entry_id] * len(extra_facts), extra_facts)
            self._alias_facts.setdefault(entry_id, []).extend(zip(extra, extra_facts, strict=True))
        for text in extra_texts:
            self.bm25.extend(entry_id, text)
        if extra:
            entry = dataclasses.replace(entry, aliases=(*entry.aliases, *extra))
            self._entries[entry_id] = entry
        return entry

    def shown(self, entry_id: int, entry_filter: EntryFilter | None = None) -> Entry:
        """The entry as a retrieval under ``entry_filter`` shows it (a hit, a packet item).

        Without a filter, the entry itself. Under one, only the entry's turns the filter admits are
        shown: its ``aliases`` keep the admitted ones, and when the canonical turn is refused the
        entry (which passed through an alias, :meth:`allowed_entries`) is shown as its first admitted
        alias, in the order dedupe folded them: that turn's id, session, role and time. So a
        retrieval ``as_of`` February never shows, nor names, a May turn that repeats a January one,
        and a session filter never shows another session's turn. The text and entry id stay the
        canonical's (dedupe folds only near-identical texts; suppression is per entry). An alias
        recorded without facts is admitted with its canonical turn.

        Raises:
            UnknownEntryError: if the tenant has no such entry.
        """
        entry = self.entry(entry_id)
        if entry_filter is None or entry_filter.is_open:
            return entry
        facts = dict(self._alias_facts.get(entry_id, ()))
        canonical = entry_filter.admits(entry.facts)
        admitted = tuple(t for t in entry.aliases
                         if (entry_filter.admits(facts[t]) if t in facts else canonical))
        if canonical:
            return entry if admitted == entry.aliases else dataclasses.replace(entry, aliases=admitted)
        first = next((t for t in admitted if t in facts), None)
        if first is None:  # not an allowed entry: shown as stored
            return entry
        turn = facts[first]
        return dataclasses.replace(entry, turn_id=first, session_id=turn.session_id, role=turn.role,
                                   occurred_at=turn.occurred_at, aliases=tuple(t for t in admitted if t != first))

    def allowed_entries(self, entry_filter: EntryFilter) -> np.ndarray:
        """Sorted ``(n_allowed,)`` int64 ids of the entries with a turn (canonical or alias) the filter admits.

        Only this tenant's turns are consulted, so a filter naming another tenant's session
        admits nothing.
        """
        return self.turns.allowed(entry_filter)

    def alias_map(self) -> dict[str, str]:
        """``{turn_id: canonical turn_id}`` for every turn of the tenant (canonical maps to itself)."""
        mapping: dict[str, str] = {}
        for entry in self._entries.values():
            for turn_id in entry.turn_ids:
                mapping[turn_id] = entry.turn_id
        return mapping
