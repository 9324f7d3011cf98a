"""An in-memory :class:`~workers.store.protocol.Store` for fast tests of the worker logic.

:class:`FakeStore` keeps the tables as Python objects and behaves like the Postgres store where
the workers can tell: a tenant session sees and writes only its tenant's rows; it commits on a
clean exit and rolls every change back when the block raises (entry ids, like a sequence, are
not given back); a snapshot session refuses writes; inserts are idempotent on ``(tenant,
turn_id)``, ledger rows on ``(tenant, outcome_id)``, dead letters on ``(stream, stream_id)``.
Sessions do not run concurrently (the workers are single-threaded), so locks are only recorded
(``locks_taken``). ``fail_next_commit`` makes the next transaction raise at its commit, as a
lost connection would. The integration test ``tests/integration/test_store_contract.py`` runs the
same scenarios against this fake and the Postgres store.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import numpy as np

from api.catalog import SessionSummary, TurnRecord
from workers.runtime.errors import StoreError
from workers.store.fake_forget import FakeForget
from workers.store.fake_tables import _Entry, _Tables
from workers.store.rows import (
    CanonicalRow,
    Deltas,
    EntryRow,
    LedgerRow,
    SchemaState,
    StagedEmbedding,
    StagingRow,
    TenantLock,
    TenantRow,
    TenantVersionRow,
    matrix_from_bytes,
    vector_to_bytes,
)
from workers.store.schema import discover  # the migrations this code ships

if TYPE_CHECKING:
    from workers.runtime.dead_letters import DeadLetter


class FakeStore:
    """The in-memory store (see the module docstring).

    Args:
        applied_migrations: versions :meth:`schema_state` reports; None: every migration this code ships.
    """

    def __init__(self, applied_migrations: Iterable[str] | None = None) -> None:
        self.tables = _Tables()
        self.locks_taken: list[tuple[str, TenantLock]] = []
        self.fail_next_commit: StoreError | None = None
        self.closed = False
        self._applied = None if applied_migrations is None else frozenset(applied_migrations)
        self._next_entry_id = 1
        self._applied_count = 0

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        before = copy.deepcopy(self.tables)
        try:
            yield
            if self.fail_next_commit is not None:
                failure, self.fail_next_commit = self.fail_next_commit, None
                raise failure
        except BaseException:
            self.tables = before
            raise

    @contextmanager
    def tenant(self, tenant_id: str, *, snapshot: bool = False) -> Iterator[FakeTenantSession]:
        if not tenant_id:
            raise StoreError("tenant_tx needs a non-empty tenant id")
        with self._transaction():
            yield FakeTenantSession(self, tenant_id, read_only=snapshot)

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        with self._transaction():
            return _insert_letters(self.tables, letters)

    def schema_state(self) -> SchemaState:
        if self._applied is None:
            return SchemaState(True, True, frozenset(m.version for m in discover()))
        return SchemaState(bool(self._applied), True, self._applied)

    def tenant_versions(self) -> list[TenantVersionRow]:
        return [TenantVersionRow(t.tenant_id, t.rendering_version, t.embedding_dim)
                for _, t in sorted(self.tables.tenants.items())]

    def ping(self) -> None:
        if self.closed:
            raise StoreError("the store is closed", transient=True)

    def close(self) -> None:
        self.closed = True

    def allocate(self, n: int) -> list[int]:
        ids = list(range(self._next_entry_id, self._next_entry_id + n))
        self._next_entry_id += n
        return ids

    def applied_order(self) -> int:
        self._applied_count += 1
        return self._applied_count


def _insert_letters(tables: _Tables, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    inserted = []
    for item in letters:
        letter = item.printable()
        if (letter.stream, letter.stream_id) not in tables.dead_letters:
            tables.dead_letters[(letter.stream, letter.stream_id)] = letter
            inserted.append(item)
    return inserted


def _unstaged(entry: _Entry, rendering: int, dim: int) -> bool:
    return entry.staged is None or entry.staged[1] != rendering or len(entry.staged[0]) != 4 * dim


class FakeTenantSession(FakeForget):
    """:class:`workers.store.protocol.TenantSession` over a :class:`FakeStore`'s tables (the forget
    methods in :class:`~workers.store.fake_forget.FakeForget`)."""

    def __init__(self, store: FakeStore, tenant_id: str, *, read_only: bool) -> None:
        self._store = store
        self._tenant_id = tenant_id
        self._read_only = read_only

    @property
    def tenant_id(self) -> str:
        return self._tenant_id

    @property
    def _t(self) -> _Tables:
        return self._store.tables

    def _write(self) -> _Tables:
        if self._read_only:
            raise StoreError("ReadOnlySqlTransaction: cannot write in a read-only snapshot", transient=False)
        return self._store.tables

    def _entries(self) -> list[tuple[int, _Entry]]:
        return sorted((i, e) for i, e in self._t.entries.items() if e.tenant_id == self._tenant_id)

    # the tenant row -------------------------------------------------------------------------------

    def lock(self, lock: TenantLock) -> None:
        self._store.locks_taken.append((self._tenant_id, lock))

    def tenant(self, *, lock: bool = False) -> TenantRow | None:
        return self._t.tenants.get(self._tenant_id)  # one transaction at a time: every read is locked

    def create_tenant(self, rendering: int, dim: int) -> None:
        self._write().tenants.setdefault(self._tenant_id, TenantRow(self._tenant_id, 0, rendering, dim, 0))

    def _update_tenant(self, **changes: Any) -> TenantRow | None:
        row = self._write().tenants.get(self._tenant_id)
        if row is None:
            return None
        row = TenantRow(**{**row.__dict__, **changes})
        self._t.tenants[self._tenant_id] = row
        return row

    def set_embedding_version(self, rendering: int, dim: int) -> None:
        self._update_tenant(rendering_version=rendering, embedding_dim=dim)

    def bump_memory_version(self) -> None:
        self._write()
        row = self.tenant()
        if row is not None:
            self._update_tenant(memory_version=row.memory_version + 1)

    # ingest ---------------------------------------------------------------------------------------

    def stored_turns(self, turn_ids: Sequence[str]) -> list[TurnRecord]:
        wanted = set(turn_ids)
        return [TurnRecord(e.row.turn_id, e.row.session_id, e.row.role, e.row.text, e.row.occurred_at,
                           dict(e.row.metadata)) for _, e in self._entries() if e.row.turn_id in wanted]

    def session_summaries(self) -> list[SessionSummary]:
        times: dict[str, list[datetime]] = {}
        for _, e in self._entries():
            times.setdefault(e.row.session_id, []).append(e.row.occurred_at)
        rows = [SessionSummary(s, min(t), max(t), len(t)) for s, t in times.items()]
        return sorted(rows, key=lambda r: (r.first_at, r.session_id))

    def canonical_entries(self, after: int) -> list[CanonicalRow]:
        return [CanonicalRow(i, e.row.embedding, e.row.role, e.row.text, e.row.image_caption, e.row.encoder_truncated)
                for i, e in self._entries() if i > after and e.row.canonical_entry_id is None]

    def allocate_entry_ids(self, n: int) -> list[int]:
        return self._store.allocate(n)

    def insert_entries(self, rows: Sequence[EntryRow]) -> set[int]:
        tables = self._write()
        known = {e.row.turn_id for _, e in self._entries()}
        inserted: set[int] = set()
        for row in rows:
            if row.turn_id in known:
                continue
            if row.entry_id in tables.entries:
                raise StoreError(f"UniqueViolation: entry id {row.entry_id} exists", transient=False)
            known.add(row.turn_id)
            tables.entries[row.entry_id] = _Entry(self._tenant_id, replace(row, metadata=dict(row.metadata)))
            inserted.add(row.entry_id)
        return inserted

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        return _insert_letters(self._write(), letters)

    # query ----------------------------------------------------------------------------------------

    def entries_after(self, after: int) -> list[EntryRow]:
        return [e.row for i, e in self._entries() if i > after]

    def count_entries(self) -> int:
        return len(self._entries())

    def centroids(self) -> np.ndarray | None:
        stored = self._t.centroids.get(self._tenant_id)
        return None if stored is None else matrix_from_bytes(stored[0], stored[1], stored[2])

    def suppression_scores(self, cluster: int | None = None) -> dict[tuple[int, int], float]:
        return {(e, c): s for (t, e, c), s in self._t.suppression.items()
                if t == self._tenant_id and (cluster is None or c == cluster)}

    # suppression ----------------------------------------------------------------------------------

    def own_entry_ids(self, entry_ids: Sequence[int]) -> set[int]:
        return {i for i in entry_ids if i in self._t.entries and self._t.entries[i].tenant_id == self._tenant_id}

    def record_outcome(self, outcome_id: str, cluster: int | None, deltas: Deltas, stream_id: str | None) -> bool:
        tables = self._write()
        if (self._tenant_id, outcome_id) in tables.ledger:
            return False
        row = LedgerRow(outcome_id, cluster, None, tuple((e, c, d) for (e, c), d in sorted(deltas.items())))
        tables.ledger[(self._tenant_id, outcome_id)] = (self._store.applied_order(), row)
        return True

    def bump_suppression_version(self, outcome_id: str) -> int | None:
        self._write()
        row = self.tenant()
        if row is None:
            return None
        version = row.suppression_version + 1
        self._update_tenant(suppression_version=version)
        key = (self._tenant_id, outcome_id)
        if key in self._t.ledger:
            order, entry = self._t.ledger[key]
            self._t.ledger[key] = (order, LedgerRow(entry.outcome_id, entry.cluster, version, entry.deltas))
        return version

    def add_suppression(self, deltas: Deltas) -> None:
        tables = self._write()
        for (entry_id, cluster), delta in deltas.items():
            if entry_id not in tables.entries or tables.entries[entry_id].tenant_id != self._tenant_id:
                continue  # deleted by a forget since the outcome was read
            key = (self._tenant_id, entry_id, cluster)
            tables.suppression[key] = tables.suppression.get(key, 0.0) + float(delta)

    def ledger(self) -> list[LedgerRow]:
        rows = [(order, row) for (t, _), (order, row) in self._t.ledger.items() if t == self._tenant_id]
        # Postgres sorts NULL versions last
        rows.sort(key=lambda item: (item[1].suppression_version is None, item[1].suppression_version or 0, item[0]))
        return [row for _, row in rows]

    def buffer_query(self, outcome_id: str, embedding: np.ndarray) -> None:
        self._write().buffer.setdefault(self._tenant_id, []).append((outcome_id, vector_to_bytes(embedding)))

    def buffered_count(self) -> int:
        return len(self._t.buffer.get(self._tenant_id, []))

    def buffered_queries(self) -> list[bytes]:
        return [blob for _, blob in self._t.buffer.get(self._tenant_id, [])]

    def save_centroids(self, centroids: np.ndarray, n_queries: int) -> None:
        tables = self._write()
        if self._tenant_id in tables.centroids:
            raise StoreError("UniqueViolation: the tenant's centroids exist", transient=False)
        k, dim = centroids.shape
        tables.centroids[self._tenant_id] = (vector_to_bytes(centroids), k, dim, n_queries)

    # reindex --------------------------------------------------------------------------------------

    def count_unstaged(self, rendering: int, dim: int) -> tuple[int, int]:
        entries = self._entries()
        return len(entries), sum(_unstaged(e, rendering, dim) for _, e in entries)

    def unstaged_entries(self, rendering: int, dim: int, *, after: int, limit: int) -> list[StagingRow]:
        rows = [StagingRow(i, e.row.role, e.row.text, e.row.image_caption)
                for i, e in self._entries() if i > after and _unstaged(e, rendering, dim)]
        return rows[:limit]

    def stage_embeddings(self, rendering: int, staged: Sequence[StagedEmbedding]) -> None:
        tables = self._write()
        for item in staged:
            entry = tables.entries.get(item.entry_id)
            if entry is not None and entry.tenant_id == self._tenant_id:
                entry.staged = (vector_to_bytes(item.embedding), rendering, item.truncated)

    def swap_staged(self) -> None:
        self._write()
        entries = self._entries()
        if any(e.staged is None for _, e in entries):
            raise StoreError('NotNullViolation: null value in column "embedding"', transient=False)
        for _, entry in entries:
            assert entry.staged is not None
            embedding, _, truncated = entry.staged
            entry.row = replace(entry.row, embedding=embedding, encoder_truncated=truncated)
            entry.staged = None

    def clear_suppression_state(self) -> None:
        tables = self._write()
        tables.suppression = {k: v for k, v in tables.suppression.items() if k[0] != self._tenant_id}
        tables.centroids.pop(self._tenant_id, None)
        tables.buffer.pop(self._tenant_id, None)
