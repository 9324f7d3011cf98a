"""Per-tenant indexes of a query worker, refreshed from Postgres by memory version.

A tenant's :class:`TenantState` holds its :class:`mnemos.tenant_index.TenantIndex`, the last
entry id it has seen and, once the suppression worker froze them, its query clusters. On each
request the worker reads the tenant's memory version and, in the same REPEATABLE READ snapshot,
only the entries with a larger id (entries of one tenant are inserted under its advisory lock, so
ids grow in commit order): new canonical entries are added to the index, new aliases folded into
their canonical entry (keeping their own session, role and time for request filters; their
rendered text joins the canonical entry's BM25 document, docs/architecture.md "Dedupe"), and every
new turn (canonical or alias) joins its session in the index's session-level retriever (the
post-rerank session feature reads it). Within one refresh the canonical turns join before the
aliases, so a session's centroid may differ from a fresh build's in the last float32 bit;
rankings do not otherwise depend on how refreshes were cut. The worker is single-threaded, so no
request reads an index while it is being extended; if an extension fails half-way the state is
dropped and rebuilt from scratch (a fresh object swapped in whole): at once after a
:class:`~mnemos.errors.MnemosError`, on the next request after any other exception (rq's job
timeout interrupts a job anywhere), which propagates.

The cache is an LRU bounded twice: at most ``max_tenants`` states (``MNEMOS_MAX_CACHED_TENANTS``)
and at most ``max_bytes`` of estimated memory over all of them (``MNEMOS_INDEX_MEMORY_MB``; each
state's estimate is :meth:`TenantState.memory_bytes`, taken after every refresh). After a refresh
the least recently used states are evicted until both bounds hold; the state just answered is never
evicted, so a tenant larger than the whole budget is still served (alone). An evicted tenant is
reloaded from Postgres on its next request and answers as before: the index is derived state.
:attr:`TenantCache.stats` counts hits (a cached state reused, possibly extended), misses (a state
built from the snapshot: first request, after an eviction, after a forget) and evictions.

A forget (docs/architecture.md "Forget") deletes entries below the last id a state has seen,
which extending by id cannot notice: the state records the tenant's forget version, and a state
of another forget version is dropped and rebuilt from the snapshot. Whenever a state is dropped
(forget, LRU, another embedding version, an unknown tenant) ``on_drop(old, new)`` is called with
it and its replacement (None if none), so the worker can drop what it cached about the texts the
old state held and the new one does not (the rerank cache, the packet cache). Turns whose
``metadata.supersedes`` names earlier turns are recorded in the index's supersession table
(docs/architecture.md "Evidence packets").
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC

import numpy as np

from mnemos.errors import MnemosError
from mnemos.records import Entry, TurnFacts
from mnemos.rendering import render_turn
from mnemos.suppression import QueryClusters
from mnemos.tenant_index import TenantIndex
from workers.store import TenantSession
from workers.store.rows import vectors_from_bytes

log = logging.getLogger(__name__)


@dataclass
class TenantState:
    """What a query worker keeps for one tenant."""

    index: TenantIndex
    last_entry_id: int = 0
    clusters: QueryClusters | None = None
    forget_version: int = 0  # the tenant's forget version the index was built at

    def memory_bytes(self) -> int:
        """Estimated bytes of the state: its index (:meth:`mnemos.tenant_index.TenantIndex.memory_bytes`)
        and its frozen cluster centroids."""
        centroids = None if self.clusters is None else self.clusters.centroids
        return self.index.memory_bytes() + (centroids.nbytes if isinstance(centroids, np.ndarray) else 0)

    def rendered_texts(self) -> set[str]:
        """The rendered text of every indexed entry (what the reranker scores)."""
        return {self.index.render(entry) for entry in self.index.entries()}


DropHook = Callable[[TenantState, "TenantState | None"], None]


@dataclass
class CacheStats:
    """Running totals of a :class:`TenantCache` (see the module docstring for what counts as what)."""

    hits: int = 0
    misses: int = 0
    evictions: int = 0


class TenantCache:
    """LRU of tenant states bounded by count and estimated bytes; :meth:`refresh` brings one up to a
    memory version (inside a snapshot tx).

    Args:
        dim: embedding dimension of the stored vectors.
        max_tenants: most states kept (>= 1).
        on_drop: called with every dropped state and its replacement (None if none).
        max_bytes: most estimated bytes kept over all states (None: no byte bound).
    """

    def __init__(self, dim: int, max_tenants: int = 256, on_drop: DropHook | None = None,
                 max_bytes: int | None = None) -> None:
        self.dim = dim
        self.max_tenants = max_tenants
        self.max_bytes = max_bytes
        self.on_drop = on_drop
        self.stats = CacheStats()
        self._states: OrderedDict[str, TenantState] = OrderedDict()
        self._bytes: dict[str, int] = {}
        self._total_bytes = 0

    @property
    def total_bytes(self) -> int:
        """Estimated bytes of every cached state together (as of each one's last refresh)."""
        return self._total_bytes

    def tenants(self) -> list[str]:
        """Cached tenant ids, least recently used first."""
        return list(self._states)

    def _account(self, tenant_id: str, size: int | None) -> None:
        """Record ``tenant_id``'s estimated bytes (None: it left the cache)."""
        self._total_bytes -= self._bytes.pop(tenant_id, 0)
        if size is not None:
            self._bytes[tenant_id] = size
            self._total_bytes += size

    def _dropped(self, old: TenantState, new: TenantState | None) -> None:
        if self.on_drop is not None:
            self.on_drop(old, new)

    def __len__(self) -> int:
        return len(self._states)

    def get(self, tenant_id: str) -> TenantState | None:
        return self._states.get(tenant_id)

    def evict(self, tenant_id: str) -> None:
        """Drop the tenant's state (its stored embeddings changed version, or it is unknown now);
        no-op when not cached."""
        old = self._states.pop(tenant_id, None)
        self._account(tenant_id, None)
        if old is not None:
            self._dropped(old, None)

    def refresh(self, tx: TenantSession, version: int, forget_version: int = 0) -> tuple[TenantState, bool]:
        """The state of ``tx``'s tenant at memory ``version`` and ``forget_version`` (both read in
        ``tx``); True when anything was loaded."""
        tenant_id = tx.tenant_id
        old = state = self._states.get(tenant_id)
        refreshed = False
        if state is not None and state.forget_version != forget_version:
            state = None  # entries were deleted or promoted: rebuild
        if state is None or state.index.version != version:
            refreshed = True
            try:
                if state is not None:
                    try:
                        self._extend(tx, state, version)
                    except MnemosError as exc:
                        log.warning("tenant index extension failed (%s); rebuilding", exc)
                        state = None
                if state is None:
                    state = TenantState(TenantIndex(tenant_id, self.dim, version=-1), forget_version=forget_version)
                    self._extend(tx, state, version)
            except BaseException:  # rq's job timeout (SIGALRM), a bug, or the rebuild failing too: the cached
                self.evict(tenant_id)  # state may be half-extended; the next request builds a fresh one
                raise
        if old is not None and old is not state:
            self._dropped(old, state)
        if state is old:
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        self._states[tenant_id] = state
        self._states.move_to_end(tenant_id)
        self._account(tenant_id, state.memory_bytes())
        self._evict_over_bounds()
        return state, refreshed

    def _over_bounds(self) -> bool:
        return len(self._states) > self.max_tenants or (self.max_bytes is not None
                                                         and self._total_bytes > self.max_bytes)

    def _evict_over_bounds(self) -> None:
        """Evict least recently used states until both bounds hold, never the most recent one."""
        while len(self._states) > 1 and self._over_bounds():
            tenant_id, evicted = self._states.popitem(last=False)
            self._account(tenant_id, None)
            self.stats.evictions += 1
            self._dropped(evicted, None)
        if self._over_bounds():
            log.debug("tenant index of ~%d bytes alone exceeds the cache budget of %s bytes", self._total_bytes,
                      self.max_bytes)

    def _extend(self, tx: TenantSession, state: TenantState, version: int) -> None:
        tenant_id = state.index.tenant_id
        rows = tx.entries_after(state.last_entry_id)
        canonical = [r for r in rows if r.canonical_entry_id is None]
        entries = [Entry(r.entry_id, tenant_id, r.turn_id, r.session_id, r.role, r.text, r.occurred_at.astimezone(UTC),
                         image_caption=r.image_caption) for r in canonical]
        vectors = vectors_from_bytes([r.embedding for r in canonical], self.dim)
        aliases: dict[int, list[str]] = {}
        alias_facts: dict[int, list[TurnFacts]] = {}
        alias_texts: dict[int, list[str]] = {}
        alias_rows = [r for r in rows if r.canonical_entry_id is not None]
        rendered = [render_turn(r.role, r.text, r.image_caption, version=state.index.rendering) for r in alias_rows]
        for r, text in zip(alias_rows, rendered, strict=True):
            assert r.canonical_entry_id is not None
            aliases.setdefault(r.canonical_entry_id, []).append(r.turn_id)
            alias_facts.setdefault(r.canonical_entry_id, []).append(
                TurnFacts(r.session_id, r.role, r.occurred_at.astimezone(UTC)))
            alias_texts.setdefault(r.canonical_entry_id, []).append(text)
        state.index.add(entries, vectors, version=version)
        for entry_id, turn_ids in aliases.items():
            # an alias keeps its own session, role and time for filters, and its text counts for BM25
            state.index.add_aliases(entry_id, turn_ids, alias_facts[entry_id], alias_texts[entry_id])
        if alias_rows:  # an alias is still a turn of its own session (transcript, centroid, start)
            state.index.add_session_turns([r.session_id for r in alias_rows], rendered,
                                          vectors_from_bytes([r.embedding for r in alias_rows], self.dim),
                                          [r.occurred_at.astimezone(UTC) for r in alias_rows])
        for r in rows:  # metadata.supersedes (validated at ingest; a turn stored before that may hold anything)
            named = [t for t in r.supersedes if isinstance(t, str)] if isinstance(r.supersedes, list | tuple) else []
            if named:
                state.index.supersessions.add(r.turn_id, r.occurred_at.astimezone(UTC), named)
        if rows:
            state.last_entry_id = rows[-1].entry_id
        log.debug("tenant index %s: +%d entries, +%d aliases, version %d", tenant_id, len(entries),
                  sum(map(len, aliases.values())), version)

    @staticmethod
    def load_clusters(tx: TenantSession, state: TenantState, k: int) -> QueryClusters | None:
        """The tenant's frozen clusters: K = 1 is global (always cluster 0), else stored centroids or None."""
        if state.clusters is not None:
            return state.clusters
        if k == 1:
            state.clusters = QueryClusters(k=1)
        else:
            centroids = tx.centroids()
            if centroids is not None:
                state.clusters = QueryClusters.from_centroids(centroids)
        return state.clusters
