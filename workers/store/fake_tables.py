"""The in-memory store's tables (:class:`workers.store.fake.FakeStore`), in a module of their own so that
the forget mixin (:mod:`workers.store.fake_forget`) can name them without importing the store back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.store.rows import EntryRow, LedgerRow, TenantRow, Tombstone

if TYPE_CHECKING:
    from workers.runtime.dead_letters import DeadLetter


@dataclass
class _Entry:
    tenant_id: str
    row: EntryRow
    staged: tuple[bytes, int, bool] | None = None  # (embedding, rendering, truncated) of mnemos reindex


@dataclass
class _Tables:
    tenants: dict[str, TenantRow] = field(default_factory=dict)
    entries: dict[int, _Entry] = field(default_factory=dict)
    suppression: dict[tuple[str, int, int], float] = field(default_factory=dict)
    ledger: dict[tuple[str, str], tuple[int, LedgerRow]] = field(default_factory=dict)  # (order applied, row)
    buffer: dict[str, list[tuple[str, bytes]]] = field(default_factory=dict)
    centroids: dict[str, tuple[bytes, int, int, int]] = field(default_factory=dict)  # (vectors, k, dim, n_queries)
    dead_letters: dict[tuple[str, str], DeadLetter] = field(default_factory=dict)
    tombstones: dict[tuple[str, str, str], Tombstone] = field(default_factory=dict)  # (tenant, scope, key)
