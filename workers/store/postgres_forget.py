"""The statements of a forget on Postgres (docs/architecture.md "Forget"), mixed into
:class:`workers.store.postgres_tenant.PostgresTenantSession`.

Every statement names the session's tenant (row-level security scopes the connection as well).
Dead letters are deleted through the delete policy of migration 0006; the service's role still
cannot read another tenant's letters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import psycopg
from psycopg.rows import class_row

from workers.runtime.streams import stream_position
from workers.store.rows import EntryLink, Tombstone

R = TypeVar("R")

_LINK = "SELECT entry_id, turn_id, session_id, canonical_entry_id, stream_id, readd_ms, readd_seq FROM entries"
_TENANT_TABLES = ("suppression", "centroids", "query_buffer", "applied_outcomes")


class PostgresForget:
    """The forget statements of :class:`~workers.store.protocol.TenantSession` (a mixin: the
    session provides ``_conn`` and ``_tenant_id``)."""

    _conn: psycopg.Connection
    _tenant_id: str

    def _links(self, cls: type[R], query: str, params: Sequence[Any]) -> list[R]:
        with self._conn.cursor(row_factory=class_row(cls)) as cur:
            cur.execute(query, params)
            return cur.fetchall()

    def bump_forget_version(self) -> None:
        self._conn.execute("UPDATE tenants SET memory_version = memory_version + 1,"
                           " forget_version = forget_version + 1, updated_at = now() WHERE tenant_id = %s",
                           (self._tenant_id,))

    def entry_links(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None
                    ) -> list[EntryLink]:
        if turn_ids is not None:
            return self._links(EntryLink, f"{_LINK} WHERE tenant_id = %s AND turn_id = ANY(%s) ORDER BY entry_id",
                               (self._tenant_id, list(turn_ids)))
        if session_id is not None:
            return self._links(EntryLink, f"{_LINK} WHERE tenant_id = %s AND session_id = %s ORDER BY entry_id",
                               (self._tenant_id, session_id))
        return self._links(EntryLink, f"{_LINK} WHERE tenant_id = %s ORDER BY entry_id", (self._tenant_id,))

    def aliases_of(self, entry_ids: Sequence[int]) -> list[EntryLink]:
        return self._links(EntryLink, f"{_LINK} WHERE tenant_id = %s AND canonical_entry_id = ANY(%s)"
                           " ORDER BY entry_id", (self._tenant_id, list(entry_ids)))

    def set_canonical(self, changes: Mapping[int, int | None]) -> None:
        if not changes:
            return
        with self._conn.cursor() as cur:
            cur.executemany("UPDATE entries SET canonical_entry_id = %s WHERE tenant_id = %s AND entry_id = %s",
                            [(canonical, self._tenant_id, e) for e, canonical in sorted(changes.items())])

    def delete_entries(self, entry_ids: Sequence[int]) -> None:
        if not entry_ids:
            return
        ids = list(entry_ids)
        self._conn.execute("DELETE FROM suppression WHERE tenant_id = %s AND entry_id = ANY(%s)", (self._tenant_id, ids))
        self._conn.execute("DELETE FROM entries WHERE tenant_id = %s AND entry_id = ANY(%s)", (self._tenant_id, ids))

    def delete_dead_letters(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None,
                            through: tuple[str, str] | None = None) -> int:
        where, params = ["tenant_id = %s"], list[Any]([self._tenant_id])
        if turn_ids is not None:
            where.append("(turn_id = ANY(%s) OR payload->>'turn_id' = ANY(%s))")
            params += [list(turn_ids), list(turn_ids)]
        elif session_id is not None:
            where.append("payload->>'session_id' = %s")
            params.append(session_id)
        if through is not None:  # keep the letters of messages published after the forget
            stream, (ms, seq) = through[0], stream_position(through[1])
            where.append("NOT (stream = %s AND (CASE WHEN stream_id ~ '^[0-9]{1,18}-[0-9]{1,18}$' THEN"
                         " (split_part(stream_id, '-', 1)::bigint, split_part(stream_id, '-', 2)::bigint)"
                         " > (%s::bigint, %s::bigint) ELSE false END))")
            params += [stream, ms, seq]
        cur = self._conn.execute(f"DELETE FROM dead_letters WHERE {' AND '.join(where)}", params)
        return max(0, cur.rowcount)

    def delete_tenant_state(self) -> None:
        for table in _TENANT_TABLES:
            self._conn.execute(f"DELETE FROM {table} WHERE tenant_id = %s", (self._tenant_id,))

    def tombstones(self, *, session_ids: Sequence[str], turn_ids: Sequence[str]) -> list[Tombstone]:
        return self._links(
            Tombstone, "SELECT scope, key, stream_ms, stream_seq, readd_ms, readd_seq FROM tombstones WHERE tenant_id = %s"
            " AND (scope = 'tenant' OR (scope = 'session' AND key = ANY(%s)) OR (scope IN ('turn', 'swept', 'replace')"
            " AND key = ANY(%s)))"
            " ORDER BY scope, key", (self._tenant_id, list(session_ids), list(turn_ids)))

    def swept_at(self, stream_ms: int, stream_seq: int) -> list[str]:
        rows = self._conn.execute("SELECT key FROM tombstones WHERE tenant_id = %s AND scope = 'swept' AND stream_ms = %s"
                                  " AND stream_seq = %s ORDER BY key", (self._tenant_id, stream_ms, stream_seq)).fetchall()
        return [row[0] for row in rows]

    def add_tombstones(self, rows: Sequence[Tombstone]) -> None:
        if not rows:
            return
        with self._conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO tombstones (tenant_id, scope, key, stream_ms, stream_seq) VALUES (%s, %s, %s, %s, %s)"
                " ON CONFLICT (tenant_id, scope, key) DO UPDATE SET stream_ms = excluded.stream_ms,"
                " stream_seq = excluded.stream_seq, forgotten_at = now(),"
                " readd_ms = CASE WHEN (tombstones.readd_ms, tombstones.readd_seq) > (excluded.stream_ms,"
                " excluded.stream_seq) THEN tombstones.readd_ms END, readd_seq = CASE WHEN (tombstones.readd_ms,"
                " tombstones.readd_seq) > (excluded.stream_ms, excluded.stream_seq) THEN tombstones.readd_seq END"
                " WHERE (tombstones.stream_ms, tombstones.stream_seq) < (excluded.stream_ms, excluded.stream_seq)",
                [(self._tenant_id, t.scope, t.key, t.stream_ms, t.stream_seq) for t in rows])

    def record_repeat(self, turn_id: str, stream_id: str, readd: bool) -> None:
        at = stream_position(stream_id)
        self._conn.execute(  # the new stream id is computed from the row as it was, before its re-add position
            "UPDATE entries SET stream_id = %s WHERE tenant_id = %s AND turn_id = %s AND readd_ms IS NULL"
            " AND stream_id ~ '^[0-9]+-[0-9]+$'"
            " AND (split_part(stream_id, '-', 1)::numeric, split_part(stream_id, '-', 2)::numeric) > (%s, %s)",
            (stream_id, self._tenant_id, turn_id, *at))
        if readd:
            self._conn.execute(
                "UPDATE entries SET readd_ms = %s, readd_seq = %s WHERE tenant_id = %s AND turn_id = %s"
                " AND (readd_ms IS NULL OR (readd_ms, readd_seq) < (%s, %s))", (*at, self._tenant_id, turn_id, *at))

    def mark_readded(self, turn_ids: Sequence[str], at: tuple[int, int]) -> None:
        if turn_ids:
            self._conn.execute(
                "UPDATE tombstones SET readd_ms = %s, readd_seq = %s WHERE tenant_id = %s AND scope IN ('turn', 'swept')"
                " AND key = ANY(%s) AND (stream_ms, stream_seq) < (%s, %s)"
                " AND (readd_ms IS NULL OR (readd_ms, readd_seq) > (%s, %s))",
                (*at, self._tenant_id, list(turn_ids), *at, *at))
