"""One tenant's rows copied from one shard's database to another's, its entry ids renumbered, and
then deleted from the first (docs/scaling.md "Moving a tenant between shards").

Entry ids come from each database's own sequence, so a tenant's ids may already belong to another
tenant on the target: every entry gets a new id from the target's sequence, in the order of the old
ids (ids keep growing in commit order, docs/architecture.md "Ordering"), and every reference is
rewritten with the map: an alias's canonical entry, a suppression score's entry, the deltas of the
applied-outcomes ledger (a delta of an entry no longer stored is dropped, as its score was).
Tombstones, the cluster centroids, the bootstrap buffer and the tenant's dead letters are copied as
they are; the tenant row keeps its versions, with ``memory_version`` and ``forget_version`` one
higher, so a query or ingest worker of the target that still caches the tenant from an earlier stay
rebuilds it. The tenant's in-memory indexes are derived state: they are not copied, the target's
query workers build them on the first request.

Both connections are tenant-scoped transactions (:meth:`workers.store.PostgresStore.tenant_tx`), so
row-level security confines every statement to the tenant as well. Entries are read and written in
chunks of :data:`CHUNK` rows; only the id map (two integers an entry) is held whole.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from workers.runtime.errors import StoreError
from workers.store.postgres_tenant import PostgresTenantSession
from workers.store.rows import TenantLock, Tombstone

CHUNK = 2000
"""Entries read, renumbered and written per round trip."""

_ENTRY_COLUMNS = ("turn_id", "session_id", "role", "text", "occurred_at", "embedding", "metadata", "encoder_truncated",
                  "stream_id", "created_at", "reindex_embedding", "reindex_rendering", "reindex_truncated", "readd_ms",
                  "readd_seq")
_TABLES = ("suppression", "centroids", "query_buffer", "applied_outcomes", "dead_letters", "tombstones")


@dataclass(frozen=True)
class CopyReport:
    """What one tenant's copy wrote on the target: rows per table, and the entry id map (old -> new)."""

    entries: int
    aliases: int
    suppression: int
    ledger: int
    buffered: int
    tombstones: tuple[Tombstone, ...]
    dead_letters: int
    centroids: bool
    id_map: Mapping[int, int]


def _rows(conn: psycopg.Connection, query: str, params: Sequence[Any]) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(query, params)
        return cur.fetchall()


def lock_tenant(conn: psycopg.Connection, tenant_id: str) -> None:
    """Hold the tenant's ingest and suppression locks and its tenant row until the transaction ends:
    an ingest, forget or suppression transaction of the tenant waits for the move, and one already
    running commits first."""
    session = PostgresTenantSession(conn, tenant_id)
    session.lock(TenantLock.INGEST)
    session.lock(TenantLock.SUPPRESSION)
    conn.execute("SELECT tenant_id FROM tenants WHERE tenant_id = %s FOR UPDATE", (tenant_id,))


MOVE_LOCK = 0x4D4E4D31  # "MNM1"
"""Class key of the session-level advisory lock ``(MOVE_LOCK, hashtext(tenant_id))`` of a tenant move."""


def try_move_lock(conn: psycopg.Connection, tenant_id: str) -> bool:
    """Take the tenant's move lock for ``conn``'s session (held until it unlocks or closes, a crash
    included); False, taking nothing, when another session holds it."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s, hashtext(%s))", (MOVE_LOCK, tenant_id)).fetchone()
    return bool(row and row[0])


def release_move_lock(conn: psycopg.Connection, tenant_id: str) -> None:
    """Release the tenant's move lock held by ``conn``'s session now. Closing the connection releases it
    too, but only once the server's backend has ended, after the close returns: a move run right after
    a failed one could find it still held."""
    conn.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (MOVE_LOCK, tenant_id))


def tenant_present(conn: psycopg.Connection, tenant_id: str) -> bool:
    """Whether any row of the tenant is in this database (its tenant row, an entry, a tombstone, ...)."""
    tables = ("tenants", "entries", *_TABLES)
    query = " UNION ALL ".join(f"(SELECT 1 AS found FROM {table} WHERE tenant_id = %s LIMIT 1)" for table in tables)
    return bool(_rows(conn, query, [tenant_id] * len(tables)))


def copy_tenant(source: psycopg.Connection, target: psycopg.Connection, tenant_id: str) -> CopyReport:
    """Copy every row of ``tenant_id`` from ``source`` to ``target`` with new entry ids (module docstring).

    Raises StoreError when the target already holds a row of the tenant (a move that stopped half way
    or a tenant that was never routed away from the target: nothing is overwritten)."""
    if tenant_present(target, tenant_id):
        raise StoreError(f"tenant {tenant_id!r} already has rows in the target database: roll the earlier move "
                         "back first (docs/scaling.md \"Moving a tenant between shards\")")
    for row in _rows(source, "SELECT memory_version, rendering_version, embedding_dim, suppression_version,"
                     " forget_version, created_at FROM tenants WHERE tenant_id = %s", (tenant_id,)):
        target.execute("INSERT INTO tenants (tenant_id, memory_version, rendering_version, embedding_dim,"
                       " suppression_version, forget_version, created_at) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                       (tenant_id, row["memory_version"] + 1, row["rendering_version"], row["embedding_dim"],
                        row["suppression_version"], row["forget_version"] + 1, row["created_at"]))
    id_map, aliases = _copy_entries(source, target, tenant_id)
    with target.cursor() as cur:
        cur.executemany("UPDATE entries SET canonical_entry_id = %s WHERE tenant_id = %s AND entry_id = %s",
                        [(id_map[old], tenant_id, new) for new, old in aliases])
    stones = _copy_small_tables(source, target, tenant_id, id_map)
    return CopyReport(entries=len(id_map), aliases=len(aliases), id_map=id_map, **stones)


def _copy_entries(source: psycopg.Connection, target: psycopg.Connection,
                  tenant_id: str) -> tuple[dict[int, int], list[tuple[int, int]]]:
    """Entries in id order, chunk by chunk, each with a new id from the target's sequence and no
    canonical link yet; returns the id map and the ``(new id, old canonical id)`` of every alias."""
    id_map: dict[int, int] = {}
    aliases: list[tuple[int, int]] = []
    columns = ", ".join(_ENTRY_COLUMNS)
    after = 0
    while True:
        chunk = _rows(source, f"SELECT entry_id, canonical_entry_id, {columns} FROM entries"
                      " WHERE tenant_id = %s AND entry_id > %s ORDER BY entry_id LIMIT %s", (tenant_id, after, CHUNK))
        if not chunk:
            return id_map, aliases
        fresh = sorted(int(r["entry_id"]) for r in _rows(
            target, "SELECT nextval(pg_get_serial_sequence('entries', 'entry_id')) AS entry_id"
            " FROM generate_series(1, %s)", (len(chunk),)))
        params = []
        for row, new_id in zip(chunk, fresh, strict=True):
            id_map[int(row["entry_id"])] = new_id
            if row["canonical_entry_id"] is not None:
                aliases.append((new_id, int(row["canonical_entry_id"])))
            params.append((new_id, tenant_id, *[Jsonb(row[c]) if c == "metadata" else row[c] for c in _ENTRY_COLUMNS]))
        with target.cursor() as cur:
            cur.executemany(f"INSERT INTO entries (entry_id, tenant_id, {columns})"
                            f" VALUES ({', '.join(['%s'] * (len(_ENTRY_COLUMNS) + 2))})", params)
        after = int(chunk[-1]["entry_id"])


def _copy_small_tables(source: psycopg.Connection, target: psycopg.Connection, tenant_id: str,
                       id_map: Mapping[int, int]) -> dict[str, Any]:
    """Scores, ledger, bootstrap buffer, centroids, tombstones and dead letters (ids remapped)."""
    scores = [(tenant_id, id_map[int(r["entry_id"])], r["cluster"], r["score"], r["updated_at"]) for r in _rows(
        source, "SELECT entry_id, cluster, score, updated_at FROM suppression WHERE tenant_id = %s", (tenant_id,))
        if int(r["entry_id"]) in id_map]
    ledger = [(tenant_id, r["outcome_id"], r["cluster"],
               Jsonb([[id_map[int(e)], c, d] for e, c, d in r["deltas"] if int(e) in id_map]),
               r["stream_id"], r["applied_at"], r["suppression_version"]) for r in _rows(
        source, "SELECT outcome_id, cluster, deltas, stream_id, applied_at, suppression_version FROM applied_outcomes"
        " WHERE tenant_id = %s", (tenant_id,))]
    buffered = [(tenant_id, r["outcome_id"], r["embedding"], r["created_at"]) for r in _rows(
        source, "SELECT outcome_id, embedding, created_at FROM query_buffer WHERE tenant_id = %s ORDER BY seq",
        (tenant_id,))]
    centroids = [(tenant_id, r["k"], r["dim"], r["vectors"], r["n_queries"], r["frozen_at"]) for r in _rows(
        source, "SELECT k, dim, vectors, n_queries, frozen_at FROM centroids WHERE tenant_id = %s", (tenant_id,))]
    stones = _rows(source, "SELECT scope, key, stream_ms, stream_seq, forgotten_at, readd_ms, readd_seq FROM tombstones"
                   " WHERE tenant_id = %s", (tenant_id,))
    letters = [(r["stream"], r["stream_id"], r["reason"], r["detail"], tenant_id, r["turn_id"], Jsonb(r["payload"]),
                r["created_at"]) for r in _rows(
        source, "SELECT stream, stream_id, reason, detail, turn_id, payload, created_at FROM dead_letters"
        " WHERE tenant_id = %s ORDER BY dead_letter_id", (tenant_id,))]
    with target.cursor() as cur:
        cur.executemany("INSERT INTO suppression (tenant_id, entry_id, cluster, score, updated_at)"
                        " VALUES (%s, %s, %s, %s, %s)", scores)
        cur.executemany("INSERT INTO applied_outcomes (tenant_id, outcome_id, cluster, deltas, stream_id, applied_at,"
                        " suppression_version) VALUES (%s, %s, %s, %s, %s, %s, %s)", ledger)
        cur.executemany("INSERT INTO query_buffer (tenant_id, outcome_id, embedding, created_at)"
                        " VALUES (%s, %s, %s, %s)", buffered)
        cur.executemany("INSERT INTO centroids (tenant_id, k, dim, vectors, n_queries, frozen_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s)", centroids)
        cur.executemany("INSERT INTO tombstones (tenant_id, scope, key, stream_ms, stream_seq, forgotten_at,"
                        " readd_ms, readd_seq) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
                        [(tenant_id, r["scope"], r["key"], r["stream_ms"], r["stream_seq"], r["forgotten_at"],
                          r["readd_ms"], r["readd_seq"]) for r in stones])
        cur.executemany("INSERT INTO dead_letters (stream, stream_id, reason, detail, tenant_id, turn_id, payload,"
                        " created_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING", letters)
    return {"suppression": len(scores), "ledger": len(ledger), "buffered": len(buffered), "centroids": bool(centroids),
            "tombstones": tuple(_tombstone(r) for r in stones),
            "dead_letters": len(letters)}


def tenant_tombstones(conn: psycopg.Connection, tenant_id: str) -> tuple[Tombstone, ...]:
    """Every tombstone of the tenant."""
    return tuple(_tombstone(r) for r in _rows(
        conn, "SELECT scope, key, stream_ms, stream_seq, readd_ms, readd_seq FROM tombstones WHERE tenant_id = %s",
        (tenant_id,)))


def handled(conn: psycopg.Connection, tenant_id: str, stream: str) -> set[str]:
    """Stream ids of the tenant's messages whose effect is stored already: a stored entry's (the
    stream id that carried it; a tenant's positions grow across its moves, so another stream's
    cannot equal one of ``stream``'s) and a dead letter's of ``stream``."""
    return {r["stream_id"] for r in _rows(
        conn, "SELECT stream_id FROM dead_letters WHERE tenant_id = %s AND stream = %s"
        " UNION SELECT stream_id FROM entries WHERE tenant_id = %s AND stream_id IS NOT NULL",
        (tenant_id, stream, tenant_id))}


def _tombstone(row: Mapping[str, Any]) -> Tombstone:
    return Tombstone(row["scope"], row["key"], int(row["stream_ms"]), int(row["stream_seq"]), row["readd_ms"],
                     row["readd_seq"])


def entry_ids_by_turn(conn: psycopg.Connection, tenant_id: str) -> dict[str, int]:
    """Every stored turn id of the tenant with its entry id (to rebuild a copy's id map by turn id)."""
    return {str(r["turn_id"]): int(r["entry_id"])
            for r in _rows(conn, "SELECT turn_id, entry_id FROM entries WHERE tenant_id = %s", (tenant_id,))}


def delete_tenant(conn: psycopg.Connection, tenant_id: str) -> None:
    """Delete every row of ``tenant_id`` in this database (aliases unlinked first, the tenant row last)."""
    for table in _TABLES:
        conn.execute(f"DELETE FROM {table} WHERE tenant_id = %s", (tenant_id,))
    conn.execute("UPDATE entries SET canonical_entry_id = NULL WHERE tenant_id = %s AND canonical_entry_id IS NOT NULL",
                 (tenant_id,))
    conn.execute("DELETE FROM entries WHERE tenant_id = %s", (tenant_id,))
    conn.execute("DELETE FROM tenants WHERE tenant_id = %s", (tenant_id,))


__all__ = ["CHUNK", "CopyReport", "copy_tenant", "delete_tenant", "entry_ids_by_turn", "lock_tenant", "tenant_present",
           "tenant_tombstones"]
