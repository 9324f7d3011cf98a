"""The statements of one tenant's transaction on Postgres (:class:`PostgresTenantSession`).

Rows are read by column name into the dataclasses of :mod:`workers.store.rows` (psycopg's
``class_row``/``dict_row``). The session's connection is already scoped to its tenant by
:meth:`workers.store.PostgresStore.tenant_tx`; every statement still names the tenant, so an index
on ``tenant_id`` serves it and a scoping bug could not widen a statement beyond one tenant.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import psycopg
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from api.catalog import SessionSummary, TurnRecord
from workers.store.postgres_forget import PostgresForget
from workers.store.rows import (
    CanonicalRow,
    Deltas,
    EntryRow,
    LedgerRow,
    StagedEmbedding,
    StagingRow,
    TenantLock,
    TenantRow,
    matrix_from_bytes,
    vector_to_bytes,
)

if TYPE_CHECKING:
    from workers.runtime.dead_letters import DeadLetter

R = TypeVar("R")

# rows whose staged embedding is not one of the target version (%(rendering)s, %(bytes)s = 4 x dim)
_UNSTAGED = ("(reindex_embedding IS NULL OR reindex_rendering IS DISTINCT FROM %(rendering)s"
             " OR octet_length(reindex_embedding) <> %(bytes)s)")


def insert_dead_letters(conn: psycopg.Connection, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
    """Insert ``letters`` inside the caller's transaction (idempotent per stream message: the
    ``dead_letters_message`` unique constraint drops a second letter for the same message); returns
    those inserted now."""
    inserted = []
    for item in letters:
        letter = item.printable()
        cur = conn.execute(
            "INSERT INTO dead_letters (stream, stream_id, reason, detail, tenant_id, turn_id, payload)"
            # no conflict target: naming the (stream, stream_id) arbiter would need SELECT on the row,
            # which row-level security (migration 0003) only grants for the scoped tenant's letters
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (letter.stream, letter.stream_id, letter.reason, letter.detail, letter.tenant_id, letter.turn_id,
             Jsonb(dict(letter.payload))))
        if cur.rowcount:
            inserted.append(item)
    return inserted


class PostgresTenantSession(PostgresForget):
    """:class:`workers.store.protocol.TenantSession` on one connection inside its tenant's transaction
    (the statements of a forget in :class:`~workers.store.postgres_forget.PostgresForget`)."""

    def __init__(self, conn: psycopg.Connection, tenant_id: str) -> None:
        self._conn = conn
        self._tenant_id = tenant_id

    @property
    def tenant_id(self) -> str:
        return self._tenant_id

    def _rows(self, cls: type[R], query: str, params: Sequence[Any] | dict[str, Any]) -> list[R]:
        with self._conn.cursor(row_factory=class_row(cls)) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    def _one(self, query: str, params: Sequence[Any] | dict[str, Any]) -> dict[str, Any] | None:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query, params)
            return cur.fetchone()

    # the tenant row -------------------------------------------------------------------------------

    def lock(self, lock: TenantLock) -> None:
        self._conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (int(lock), self._tenant_id))

    def tenant(self, *, lock: bool = False) -> TenantRow | None:
        rows = self._rows(TenantRow, "SELECT tenant_id, memory_version, rendering_version, embedding_dim,"
                          " suppression_version, forget_version FROM tenants WHERE tenant_id = %s"
                          + (" FOR UPDATE" if lock else ""), (self._tenant_id,))
        return rows[0] if rows else None

    def create_tenant(self, rendering: int, dim: int) -> None:
        self._conn.execute("INSERT INTO tenants (tenant_id, rendering_version, embedding_dim) VALUES (%s, %s, %s)"
                           " ON CONFLICT DO NOTHING", (self._tenant_id, rendering, dim))

    def set_embedding_version(self, rendering: int, dim: int) -> None:
        self._conn.execute("UPDATE tenants SET rendering_version = %s, embedding_dim = %s, updated_at = now()"
                           " WHERE tenant_id = %s", (rendering, dim, self._tenant_id))

    def bump_memory_version(self) -> None:
        self._conn.execute("UPDATE tenants SET memory_version = memory_version + 1, updated_at = now()"
                           " WHERE tenant_id = %s", (self._tenant_id,))

    # ingest ---------------------------------------------------------------------------------------

    def stored_turns(self, turn_ids: Sequence[str]) -> list[TurnRecord]:
        return self._rows(TurnRecord, "SELECT turn_id, session_id, role, text, occurred_at, metadata FROM entries"
                          " WHERE tenant_id = %s AND turn_id = ANY(%s)", (self._tenant_id, list(turn_ids)))

    def session_summaries(self) -> list[SessionSummary]:
        return self._rows(SessionSummary, "SELECT session_id, min(occurred_at) AS first_at, max(occurred_at) AS last_at,"
                          " count(*) AS turns FROM entries WHERE tenant_id = %s GROUP BY session_id"
                          " ORDER BY first_at, session_id", (self._tenant_id,))

    def canonical_entries(self, after: int) -> list[CanonicalRow]:
        return self._rows(CanonicalRow, "SELECT entry_id, embedding, role, text,"
                          " metadata->>'image_caption' AS image_caption, encoder_truncated FROM entries"
                          " WHERE tenant_id = %s AND canonical_entry_id IS NULL AND entry_id > %s ORDER BY entry_id",
                          (self._tenant_id, after))

    def allocate_entry_ids(self, n: int) -> list[int]:
        """From the entries sequence: rows keep stream order, and an in-batch alias can name its
        canonical entry before either is inserted."""
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT nextval(pg_get_serial_sequence('entries', 'entry_id')) AS entry_id"
                        " FROM generate_series(1, %s)", (n,))
            return sorted(int(r["entry_id"]) for r in cur)

    def insert_entries(self, rows: Sequence[EntryRow]) -> set[int]:
        """One pipelined round trip (``ON CONFLICT (tenant_id, turn_id) DO NOTHING``)."""
        params = [(r.entry_id, self._tenant_id, r.turn_id, r.session_id, r.role, r.text, r.occurred_at,
                   r.embedding, r.canonical_entry_id, Jsonb(dict(r.metadata)), r.encoder_truncated,
                   r.stream_id, r.readd_ms, r.readd_seq) for r in rows]
        stored: set[int] = set()
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.executemany(
                "INSERT INTO entries (entry_id, tenant_id, turn_id, session_id, role, text, occurred_at, embedding,"
                " canonical_entry_id, metadata, encoder_truncated, stream_id, readd_ms, readd_seq)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (tenant_id, turn_id) DO NOTHING RETURNING entry_id", params, returning=True)
            for _ in cur.results():
                row = cur.fetchone()
                if row is not None:
                    stored.add(int(row["entry_id"]))
        return stored

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        return insert_dead_letters(self._conn, letters)

    # query ----------------------------------------------------------------------------------------

    def entries_after(self, after: int) -> list[EntryRow]:
        return self._rows(EntryRow, "SELECT entry_id, turn_id, session_id, role, text, occurred_at, metadata,"
                          " embedding, canonical_entry_id, encoder_truncated, stream_id, readd_ms, readd_seq"
                          " FROM entries WHERE tenant_id = %s AND entry_id > %s ORDER BY entry_id",
                          (self._tenant_id, after))

    def count_entries(self) -> int:
        row = self._one("SELECT count(*) AS n FROM entries WHERE tenant_id = %s", (self._tenant_id,))
        return 0 if row is None else int(row["n"])

    def centroids(self) -> np.ndarray | None:
        row = self._one("SELECT k, dim, vectors FROM centroids WHERE tenant_id = %s", (self._tenant_id,))
        return None if row is None else matrix_from_bytes(bytes(row["vectors"]), int(row["k"]), int(row["dim"]))

    def suppression_scores(self, cluster: int | None = None) -> dict[tuple[int, int], float]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            if cluster is None:
                cur.execute("SELECT entry_id, cluster, score FROM suppression WHERE tenant_id = %s",
                            (self._tenant_id,))
            else:  # the query worker's read, served by the (tenant_id, cluster) index
                cur.execute("SELECT entry_id, cluster, score FROM suppression WHERE tenant_id = %s AND cluster = %s",
                            (self._tenant_id, cluster))
            return {(int(r["entry_id"]), int(r["cluster"])): float(r["score"]) for r in cur}

    # suppression ----------------------------------------------------------------------------------

    def own_entry_ids(self, entry_ids: Sequence[int]) -> set[int]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT entry_id FROM entries WHERE tenant_id = %s AND entry_id = ANY(%s)",
                        (self._tenant_id, list(entry_ids)))
            return {int(r["entry_id"]) for r in cur}

    def record_outcome(self, outcome_id: str, cluster: int | None, deltas: Deltas, stream_id: str | None) -> bool:
        """``ON CONFLICT (tenant_id, outcome_id) DO NOTHING``: the ledger row is the idempotency key."""
        row = self._one(
            "INSERT INTO applied_outcomes (tenant_id, outcome_id, cluster, deltas, stream_id)"
            " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (tenant_id, outcome_id) DO NOTHING RETURNING outcome_id",
            (self._tenant_id, outcome_id, cluster, Jsonb([[e, c, d] for (e, c), d in sorted(deltas.items())]),
             stream_id))
        return row is not None

    def bump_suppression_version(self, outcome_id: str) -> int | None:
        """The row lock of the UPDATE serialises concurrent workers of one tenant, so versions follow
        commit order: replaying the ledger by version rebuilds the state each retrieval read."""
        row = self._one("UPDATE tenants SET suppression_version = suppression_version + 1 WHERE tenant_id = %s"
                        " RETURNING suppression_version", (self._tenant_id,))
        if row is None:
            return None
        version = int(row["suppression_version"])
        self._conn.execute("UPDATE applied_outcomes SET suppression_version = %s"
                           " WHERE tenant_id = %s AND outcome_id = %s", (version, self._tenant_id, outcome_id))
        return version

    def add_suppression(self, deltas: Deltas) -> None:
        """One ``INSERT ... ON CONFLICT DO UPDATE`` per key: the deltas are summed per key already,
        because one statement may not touch a row twice (docs/architecture.md "Pitfalls")."""
        if not deltas:
            return
        with self._conn.cursor() as cur:
            cur.executemany(  # an entry a forget deleted since the outcome was read is skipped
                "INSERT INTO suppression (tenant_id, entry_id, cluster, score) SELECT %s, %s, %s, %s"
                " WHERE EXISTS (SELECT 1 FROM entries WHERE tenant_id = %s AND entry_id = %s)"
                " ON CONFLICT (tenant_id, entry_id, cluster)"
                " DO UPDATE SET score = suppression.score + excluded.score, updated_at = now()",
                [(self._tenant_id, e, c, d, self._tenant_id, e) for (e, c), d in sorted(deltas.items())])

    def ledger(self) -> list[LedgerRow]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT outcome_id, cluster, suppression_version, deltas FROM applied_outcomes"
                        " WHERE tenant_id = %s ORDER BY suppression_version, applied_at", (self._tenant_id,))
            return [LedgerRow(str(r["outcome_id"]), r["cluster"], r["suppression_version"],
                              tuple((int(e), int(c), float(d)) for e, c, d in r["deltas"])) for r in cur]

    def buffer_query(self, outcome_id: str, embedding: np.ndarray) -> None:
        self._conn.execute("INSERT INTO query_buffer (tenant_id, outcome_id, embedding) VALUES (%s, %s, %s)",
                           (self._tenant_id, outcome_id, vector_to_bytes(embedding)))

    def buffered_count(self) -> int:
        row = self._one("SELECT count(*) AS n FROM query_buffer WHERE tenant_id = %s", (self._tenant_id,))
        return 0 if row is None else int(row["n"])

    def buffered_queries(self) -> list[bytes]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT embedding FROM query_buffer WHERE tenant_id = %s ORDER BY seq", (self._tenant_id,))
            return [bytes(r["embedding"]) for r in cur]

    def save_centroids(self, centroids: np.ndarray, n_queries: int) -> None:
        k, dim = centroids.shape
        self._conn.execute("INSERT INTO centroids (tenant_id, k, dim, vectors, n_queries) VALUES (%s, %s, %s, %s, %s)",
                           (self._tenant_id, k, dim, vector_to_bytes(centroids), n_queries))

    # reindex --------------------------------------------------------------------------------------

    def count_unstaged(self, rendering: int, dim: int) -> tuple[int, int]:
        row = self._one(f"SELECT count(*) AS total, count(*) FILTER (WHERE {_UNSTAGED}) AS unstaged"
                        " FROM entries WHERE tenant_id = %(tenant)s",
                        {"rendering": rendering, "bytes": 4 * dim, "tenant": self._tenant_id})
        assert row is not None  # an aggregate always returns its row
        return int(row["total"]), int(row["unstaged"])

    def unstaged_entries(self, rendering: int, dim: int, *, after: int, limit: int) -> list[StagingRow]:
        return self._rows(
            StagingRow, "SELECT entry_id, role, text, metadata->>'image_caption' AS image_caption FROM entries"
            f" WHERE tenant_id = %(tenant)s AND entry_id > %(after)s AND {_UNSTAGED}"
            " ORDER BY entry_id LIMIT %(limit)s",
            {"rendering": rendering, "bytes": 4 * dim, "tenant": self._tenant_id, "after": after, "limit": limit})

    def stage_embeddings(self, rendering: int, staged: Sequence[StagedEmbedding]) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(
                "UPDATE entries SET reindex_embedding = %s, reindex_rendering = %s, reindex_truncated = %s"
                " WHERE tenant_id = %s AND entry_id = %s",
                [(vector_to_bytes(s.embedding), rendering, s.truncated, self._tenant_id, s.entry_id) for s in staged])

    def swap_staged(self) -> None:
        """A row left unstaged would set ``embedding`` NULL: the NOT NULL constraint refuses it."""
        self._conn.execute(
            "UPDATE entries SET embedding = reindex_embedding, encoder_truncated = reindex_truncated,"
            " reindex_embedding = NULL, reindex_rendering = NULL, reindex_truncated = NULL WHERE tenant_id = %s",
            (self._tenant_id,))

    def clear_suppression_state(self) -> None:
        for statement in ("DELETE FROM suppression WHERE tenant_id = %s", "DELETE FROM centroids WHERE tenant_id = %s",
                          "DELETE FROM query_buffer WHERE tenant_id = %s"):
            self._conn.execute(statement, (self._tenant_id,))
