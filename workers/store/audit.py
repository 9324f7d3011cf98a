"""Reads across every tenant, for the fault benchmark's counting of lost and duplicated effects.

:class:`Audit` connects with the login role of the URL and sets no tenant scope: it sees every
tenant only when that role bypasses row-level security (the owner of a benchmark's own database,
or a superuser). The workers never use it; they read one tenant per transaction through
:class:`workers.store.protocol.TenantSession`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row

from workers.runtime.errors import StoreError


@dataclass(frozen=True)
class EntryLink:
    """A stored turn and the entry it is an alias of (``canonical_*`` None: a canonical entry, or a
    dangling link): the canonical entry's own tenant and own canonical link, to check dedupe."""

    tenant_id: str
    turn_id: str
    entry_id: int
    canonical_entry_id: int | None
    canonical_tenant_id: str | None
    canonical_of_canonical: int | None


@dataclass(frozen=True)
class LedgerEntry:
    """One applied outcome of any tenant with its ``(entry_id, cluster, delta)`` deltas."""

    tenant_id: str
    outcome_id: str
    deltas: tuple[tuple[int, int, float], ...]


@dataclass(frozen=True)
class BufferCount:
    """A tenant's bootstrap buffer: rows, and distinct outcomes among them."""

    tenant_id: str
    rows: int
    outcomes: int


class Audit:
    """Cross-tenant reads on one connection (see the module docstring); open with :meth:`connect`."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    @classmethod
    @contextmanager
    def connect(cls, database_url: str, timeout_s: float | None = None) -> Iterator[Audit]:
        """An :class:`Audit` on a fresh connection (``timeout_s``: seconds to connect, None: libpq's
        default); raises StoreError when Postgres fails."""
        url = database_url if timeout_s is None else psycopg.conninfo.make_conninfo(
            database_url, connect_timeout=max(1, round(timeout_s)))
        try:
            with psycopg.connect(url) as conn:
                yield cls(conn)
        except psycopg.Error as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}",
                             transient=isinstance(exc, psycopg.OperationalError)) from exc

    def _rows(self, query: str) -> list[dict[str, Any]]:
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute(query)
            return cur.fetchall()

    def turn_keys(self) -> set[tuple[str, str]]:
        """``(tenant_id, turn_id)`` of every stored turn."""
        return {(r["tenant_id"], r["turn_id"]) for r in self._rows("SELECT tenant_id, turn_id FROM entries")}

    def dead_letter_keys(self) -> set[tuple[str, str]]:
        """``(tenant_id, turn_id)`` of every dead letter (either None when the message had none)."""
        return {(r["tenant_id"], r["turn_id"]) for r in self._rows("SELECT tenant_id, turn_id FROM dead_letters")}

    def count_entries(self) -> int:
        return int(self._rows("SELECT count(*) AS n FROM entries")[0]["n"])

    def entry_links(self) -> list[EntryLink]:
        """Every stored turn with its canonical entry's tenant and link (see :class:`EntryLink`)."""
        with self._conn.cursor(row_factory=class_row(EntryLink)) as cur:
            cur.execute("SELECT e.tenant_id, e.turn_id, e.entry_id, e.canonical_entry_id,"
                        " c.tenant_id AS canonical_tenant_id, c.canonical_entry_id AS canonical_of_canonical"
                        " FROM entries e LEFT JOIN entries c ON c.entry_id = e.canonical_entry_id")
            return cur.fetchall()

    def entry_ids(self) -> dict[str, list[int]]:
        """Every tenant's entry ids, ascending."""
        ids: dict[str, list[int]] = {}
        for r in self._rows("SELECT tenant_id, entry_id FROM entries ORDER BY entry_id"):
            ids.setdefault(r["tenant_id"], []).append(int(r["entry_id"]))
        return ids

    def outcome_keys(self) -> set[tuple[str, str]]:
        """``(tenant_id, outcome_id)`` of every applied outcome."""
        return {(r["tenant_id"], r["outcome_id"])
                for r in self._rows("SELECT tenant_id, outcome_id FROM applied_outcomes")}

    def ledger(self) -> list[LedgerEntry]:
        """Every applied outcome, by application time."""
        rows = self._rows("SELECT tenant_id, outcome_id, deltas FROM applied_outcomes ORDER BY applied_at")
        return [LedgerEntry(r["tenant_id"], r["outcome_id"], tuple((int(e), int(c), float(d)) for e, c, d in r["deltas"]))
                for r in rows]

    def suppression_scores(self) -> dict[tuple[str, int, int], float]:
        """Every score by ``(tenant_id, entry_id, cluster)``."""
        return {(r["tenant_id"], int(r["entry_id"]), int(r["cluster"])): float(r["score"])
                for r in self._rows("SELECT tenant_id, entry_id, cluster, score FROM suppression")}

    def buffer_counts(self) -> list[BufferCount]:
        """Each tenant's bootstrap buffer (tenants with an empty buffer are absent)."""
        with self._conn.cursor(row_factory=class_row(BufferCount)) as cur:
            cur.execute("SELECT tenant_id, count(*) AS rows, count(DISTINCT outcome_id) AS outcomes"
                        " FROM query_buffer GROUP BY tenant_id")
            return cur.fetchall()

    def frozen_tenants(self) -> set[str]:
        """Tenants whose query centroids are frozen."""
        return {r["tenant_id"] for r in self._rows("SELECT tenant_id FROM centroids")}
