"""What the workers need from their database, as two Protocols: :class:`Store` and :class:`TenantSession`.

A :class:`Store` opens transactions. Everything about one tenant happens in a
:class:`TenantSession`, one transaction scoped to that tenant: it sees and writes only that
tenant's rows (Postgres enforces it with row-level security, docs/architecture.md "Invariants"),
commits when the ``with`` block ends cleanly and rolls back everything when it raises. With
``snapshot`` the session is REPEATABLE READ READ ONLY: every read sees one consistent state (the
query worker reads a memory version and the entries behind it together) and a write raises.

Implementations: :class:`workers.store.PostgresStore` (the service's) and
:class:`workers.store.FakeStore` (in memory, for fast tests of the worker logic). Errors of either
are :class:`workers.runtime.errors.StoreError` (``transient`` when retrying may help).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import numpy as np

from api.catalog import SessionSummary, TurnRecord
from workers.store.rows import (
    CanonicalRow,
    Deltas,
    EntryLink,
    EntryRow,
    LedgerRow,
    SchemaState,
    StagedEmbedding,
    StagingRow,
    TenantLock,
    TenantRow,
    TenantVersionRow,
    Tombstone,
)

if TYPE_CHECKING:
    from workers.runtime.dead_letters import DeadLetter


class TenantSession(Protocol):
    """One transaction of one tenant (see the module docstring). Methods by the worker that uses them."""

    @property
    def tenant_id(self) -> str:
        """The tenant this transaction is scoped to."""
        ...

    # the tenant row -------------------------------------------------------------------------------

    def lock(self, lock: TenantLock) -> None:
        """Take the tenant's ``lock`` until the transaction ends (waits for another holder)."""
        ...

    def tenant(self, *, lock: bool = False) -> TenantRow | None:
        """The tenant's row, or None for an unknown tenant; ``lock`` holds the row's lock to the end
        of the transaction (``FOR UPDATE``: a forget, which updates the row first, commits wholly
        before or after it)."""
        ...

    def create_tenant(self, rendering: int, dim: int) -> None:
        """Create the tenant's row with this embedding version unless it exists (then nothing changes)."""
        ...

    def set_embedding_version(self, rendering: int, dim: int) -> None:
        """Record the rendering and dimension of the tenant's stored embeddings."""
        ...

    def bump_memory_version(self) -> None:
        """Add one to the tenant's memory version (every commit that changed its entries)."""
        ...

    # ingest ---------------------------------------------------------------------------------------

    def stored_turns(self, turn_ids: Sequence[str]) -> list[TurnRecord]:
        """The stored turns among ``turn_ids`` (any order)."""
        ...

    def session_summaries(self) -> list[SessionSummary]:
        """Every session of the tenant with its first and last turn time and its stored turns, by
        first turn time, then session id (the catalog's ``sessions``, :mod:`workers.query.catalog`)."""
        ...

    def canonical_entries(self, after: int) -> list[CanonicalRow]:
        """Canonical entries with ``entry_id > after``, by id."""
        ...

    def allocate_entry_ids(self, n: int) -> list[int]:
        """``n`` fresh entry ids, ascending (never handed out again, even after a rollback)."""
        ...

    def insert_entries(self, rows: Sequence[EntryRow]) -> set[int]:
        """Insert ``rows``; a turn id the tenant already has is skipped. Returns the ids inserted."""
        ...

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """Record refused messages; a second letter for the same stream message is dropped. Returns
        the letters recorded now (a retried batch's are there already)."""
        ...

    # query ----------------------------------------------------------------------------------------

    def entries_after(self, after: int) -> list[EntryRow]:
        """Every stored turn (canonical entries and aliases) with ``entry_id > after``, by id."""
        ...

    def count_entries(self) -> int:
        """How many turns the tenant has stored (aliases included)."""
        ...

    def centroids(self) -> np.ndarray | None:
        """The tenant's frozen ``(k, dim)`` query centroids, or None before its bootstrap."""
        ...

    def suppression_scores(self, cluster: int | None = None) -> dict[tuple[int, int], float]:
        """Suppression scores by ``(entry_id, cluster)``, of one cluster or (None) of all."""
        ...

    # suppression ----------------------------------------------------------------------------------

    def own_entry_ids(self, entry_ids: Sequence[int]) -> set[int]:
        """The ids among ``entry_ids`` that are this tenant's entries."""
        ...

    def record_outcome(self, outcome_id: str, cluster: int | None, deltas: Deltas, stream_id: str | None) -> bool:
        """Add the outcome's ledger row; False (and nothing written) when it is already there."""
        ...

    def bump_suppression_version(self, outcome_id: str) -> int | None:
        """Add one to the tenant's suppression version and record it on the outcome's ledger row;
        returns the new version (None: the tenant has no row). Serialises writers of one tenant."""
        ...

    def add_suppression(self, deltas: Deltas) -> None:
        """Add each delta to the score of its ``(entry_id, cluster)`` (a missing score starts at 0); a
        delta of an entry the tenant no longer has (a forget committed meanwhile) is skipped."""
        ...

    def ledger(self) -> list[LedgerRow]:
        """Every applied outcome, by the suppression version it produced, then by application time."""
        ...

    def buffer_query(self, outcome_id: str, embedding: np.ndarray) -> None:
        """Append a ``(dim,)`` query embedding to the tenant's bootstrap buffer."""
        ...

    def buffered_count(self) -> int:
        """How many query embeddings the bootstrap buffer holds."""
        ...

    def buffered_queries(self) -> list[bytes]:
        """The buffered query embeddings (float32 bytes), in the order they were buffered."""
        ...

    def save_centroids(self, centroids: np.ndarray, n_queries: int) -> None:
        """Freeze the tenant's ``(k, dim)`` centroids, fitted on ``n_queries`` buffered queries."""
        ...

    # reindex --------------------------------------------------------------------------------------

    def count_unstaged(self, rendering: int, dim: int) -> tuple[int, int]:
        """``(stored turns, turns without a staged embedding of this rendering and dimension)``."""
        ...

    def unstaged_entries(self, rendering: int, dim: int, *, after: int, limit: int) -> list[StagingRow]:
        """Up to ``limit`` turns with ``entry_id > after`` not staged for this version, by id."""
        ...

    def stage_embeddings(self, rendering: int, staged: Sequence[StagedEmbedding]) -> None:
        """Stage new embeddings beside the live ones (the live ``embedding`` is untouched)."""
        ...

    def swap_staged(self) -> None:
        """Make every staged embedding live and clear the staging; raises StoreError when a turn has
        none staged (nothing is changed then)."""
        ...

    def clear_suppression_state(self) -> None:
        """Drop the tenant's suppression scores, centroids and bootstrap buffer."""
        ...

    # forget (docs/architecture.md "Forget") -------------------------------------------------------

    def bump_forget_version(self) -> None:
        """Add one to the tenant's memory version and to its forget version (a forget was applied)."""
        ...

    def entry_links(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None
                    ) -> list[EntryLink]:
        """Stored turns with one of ``turn_ids``, or of ``session_id``, or (neither given) all; by id."""
        ...

    def aliases_of(self, entry_ids: Sequence[int]) -> list[EntryLink]:
        """The aliases of the entries ``entry_ids``, by id."""
        ...

    def set_canonical(self, changes: Mapping[int, int | None]) -> None:
        """Make each entry of ``changes`` an alias of the entry it maps to (None: a canonical entry)."""
        ...

    def delete_entries(self, entry_ids: Sequence[int]) -> None:
        """Delete these entries (embeddings and staged embeddings with them) and their suppression
        scores; no other entry may still name one of them as its canonical entry."""
        ...

    def delete_dead_letters(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None,
                            through: tuple[str, str] | None = None) -> int:
        """Delete the tenant's dead letters of ``turn_ids``, of ``session_id`` (the session id in
        their payload) or (neither given) all of them; returns how many. ``through`` =
        ``(stream, stream_id)``: a letter of a message of ``stream`` after ``stream_id`` is kept (it
        was published after the forget at ``stream_id``; letters of other streams are deleted)."""
        ...

    def delete_tenant_state(self) -> None:
        """Delete the tenant's rows of every table but ``tenants``, ``entries`` (see
        :meth:`delete_entries`), ``tombstones`` and ``dead_letters`` (see
        :meth:`delete_dead_letters`): suppression scores, centroids, the bootstrap buffer, the ledger."""
        ...

    def tombstones(self, *, session_ids: Sequence[str], turn_ids: Sequence[str]) -> list[Tombstone]:
        """The tenant's tombstone (if any) and those of ``session_ids`` and ``turn_ids`` (scopes
        ``turn``, ``swept`` and ``replace``)."""
        ...

    def swept_at(self, stream_ms: int, stream_seq: int) -> list[str]:
        """The turn ids the tenant's ``swept`` tombstones name at exactly this stream position (those a
        session or tenant forget there swept, unless a later one moved them on), sorted."""
        ...

    def add_tombstones(self, rows: Sequence[Tombstone]) -> None:
        """Record tombstones; one that exists keeps the later of the two stream positions (moving
        forward drops a re-add position before the new one)."""
        ...

    def record_repeat(self, turn_id: str, stream_id: str, readd: bool) -> None:
        """Record that the message ``stream_id`` repeated the stored value of ``turn_id`` (a
        redelivery, a retry, a re-add of it). An entry no re-add ever carried gets the earlier of the
        two as ``stream_id`` (in stream order the value was stored from the first, so a forget
        between them erases it); one a re-add carried keeps its own (the re-add stored it again,
        after what came between). A re-add (``readd``: a re-add or a replacement) makes the re-add
        position (``readd_ms``/``readd_seq``) the later of the two (a forget by request before it
        then keeps the value; migration 0009). Raises ValueError for an id that is not a stream id."""
        ...

    def mark_readded(self, turn_ids: Sequence[str], at: tuple[int, int]) -> None:
        """Record that an explicit re-add at stream position ``at`` stored ``turn_ids`` again: their
        tombstones (those before ``at``) keep the earliest such position; messages published before
        it stay dropped, it and later ones are ordinary (scopes ``turn`` and ``swept``)."""
        ...


class Store(Protocol):
    """The workers' database (see the module docstring)."""

    def tenant(self, tenant_id: str, *, snapshot: bool = False) -> AbstractContextManager[TenantSession]:
        """One transaction scoped to ``tenant_id``; commits on a clean exit, rolls back on an error.

        Raises StoreError for an empty tenant id (never retried) and on connection or server errors.
        """
        ...

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """Record refused messages of any tenant (or of none) in a transaction of their own; returns
        those recorded now."""
        ...

    def schema_state(self) -> SchemaState:
        """Which migrations the database has (see :class:`SchemaState`)."""
        ...

    def tenant_versions(self) -> list[TenantVersionRow]:
        """The embedding version of every tenant, by tenant id."""
        ...

    def ping(self) -> None:
        """Raise StoreError unless the database answers."""
        ...

    def close(self) -> None:
        """Release the connections."""
        ...
