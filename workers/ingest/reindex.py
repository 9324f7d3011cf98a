"""``mnemos reindex``: re-embed every stored turn of stale tenants with the current rendering and encoder.

A tenant is stale when its stored embeddings were made with another rendering
(:mod:`mnemos.rendering`) or another encoder dimension than this configuration makes
(:mod:`workers.store.state`). For each stale tenant:

1. **Stage, in batches** (``reindex_batch_size`` rows, one transaction each, committed as they
   go): every stored turn, canonical and alias rows alike, is rendered, embedded and written to
   ``entries.reindex_embedding`` (with ``reindex_rendering`` and the truncation flag). The live
   ``embedding`` column is untouched, so workers keep serving the tenant at its old version
   meanwhile. A row already staged for this rendering and dimension is skipped: kill the command
   and run it again, and it continues where it stopped.
2. **Swap**, in one transaction under the tenant's ingest lock
   (:attr:`workers.store.rows.TenantLock.INGEST`, so no ingest write interleaves): stage the rows an
   ingest worker wrote since step 1, move every staged embedding into ``embedding``, record the
   tenant's new rendering and dimension, and bump its ``memory_version`` so query workers reload.
   When the dimension changed, the tenant's query clusters, bootstrap buffer and suppression
   scores are dropped (they live in the old embedding space; suppression bootstraps again).

After the swap, workers of the old version refuse the tenant (ingest leaves its turns pending for
a worker of the new version; a query worker fails the request with ``EmbeddingVersionError``).

Dedupe decisions are not redone: a row stays the canonical entry or the alias it was stored as,
even if the new embeddings would have decided otherwise (aliases keep their own turn and stay
searchable, so nothing is lost either way).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from tqdm import tqdm

from mnemos.encoder import Encoder
from mnemos.rendering import render_turn
from workers.runtime.errors import ReindexError
from workers.runtime.models import TruncationCounter
from workers.settings import Settings
from workers.store import PostgresStore, Store, TenantSession
from workers.store.rows import StagedEmbedding, TenantLock
from workers.store.state import (
    EmbeddingVersion,
    check_schema,
    current_version,
    read_tenant,
    tenant_versions,
)

log = logging.getLogger(__name__)


@dataclass
class ReindexReport:
    """What one run did: ``tenants`` moved to ``target``, turns ``embedded`` now, turns ``resumed``
    (already staged by an earlier, interrupted run), ``current`` tenants that needed nothing."""

    target: EmbeddingVersion
    tenants: int = 0
    embedded: int = 0
    resumed: int = 0
    current: int = 0


class Reindexer:
    """Re-embeds stale tenants of one store with one encoder (see the module docstring).

    ``on_batch(n)`` is called after each committed batch with the number of batches so far (tests
    interrupt a run there).
    """

    def __init__(self, settings: Settings, store: Store, encoder: Encoder, truncation: TruncationCounter, *,
                 progress: bool = True, on_batch: Callable[[int], None] | None = None) -> None:
        self.store = store
        self.encoder = encoder
        self.truncation = truncation
        self.batch_size = settings.reindex_batch_size
        self.target = current_version(encoder.dim)
        self.progress = progress
        self.on_batch = on_batch or (lambda _n: None)
        self._batches = 0
        assert self.target.dim is not None
        self._dim: int = self.target.dim

    def run(self, tenant_id: str | None = None) -> ReindexReport:
        """Reindex every stale tenant (or only ``tenant_id``).

        Raises SchemaOutdatedError (not migrated), ReindexError (``tenant_id`` unknown), StoreError.
        """
        check_schema(self.store)
        versions = tenant_versions(self.store)
        if tenant_id is not None:
            if tenant_id not in versions:
                raise ReindexError(f"tenant {tenant_id!r} is not stored; nothing to reindex")
            versions = {tenant_id: versions[tenant_id]}
        report = ReindexReport(self.target)
        stale = [t for t, v in versions.items() if (v.rendering, v.dim) != (self.target.rendering, self.target.dim)
                 and v.dim is not None]
        report.current = len(versions) - len(stale)
        todo: dict[str, int] = {}
        for tenant in stale:
            total, left = self._counts(tenant)
            todo[tenant] = left
            report.resumed += total - left
        with tqdm(total=sum(todo.values()), unit="turn", desc="reindex", disable=not self.progress) as bar:
            for tenant in stale:
                report.embedded += self._tenant(tenant, bar)
                report.tenants += 1
        return report

    def _counts(self, tenant_id: str) -> tuple[int, int]:
        with self.store.tenant(tenant_id) as tx:
            return tx.count_unstaged(self.target.rendering, self._dim)

    def _tenant(self, tenant_id: str, bar: tqdm) -> int:
        """Stage the tenant in committed batches, then swap under the ingest lock; returns rows embedded."""
        with self.store.tenant(tenant_id) as tx:
            record = read_tenant(tx)
        if record is None or record.embeddings.pair() == self.target.pair():
            return 0  # another run finished it meanwhile
        embedded, after = 0, 0
        while True:
            with self.store.tenant(tenant_id) as tx:
                done, after = self._stage_batch(tx, after)
            if not done:
                break
            embedded += done
            bar.update(done)
            self._batches += 1
            self.on_batch(self._batches)
        with self.store.tenant(tenant_id) as tx:
            tx.lock(TenantLock.INGEST)
            while True:  # rows an ingest worker wrote while the batches ran
                done, _ = self._stage_batch(tx, 0)
                if not done:
                    break
                embedded += done
                bar.update(done)
            self._swap(tx)
        log.info("reindexed a tenant: %d turns embedded as %s", embedded, self.target)
        return embedded

    def _stage_batch(self, tx: TenantSession, after: int) -> tuple[int, int]:
        """Embed up to ``batch_size`` not yet staged rows with ``entry_id > after``; returns (rows, last id)."""
        rows = tx.unstaged_entries(self.target.rendering, self._dim, after=after, limit=self.batch_size)
        if not rows:
            return 0, after
        rendered = [render_turn(r.role, r.text, r.image_caption, version=self.target.rendering) for r in rows]
        vectors = self.encoder.encode(rendered)
        truncated = self.truncation.truncated(rendered)
        tx.stage_embeddings(self.target.rendering, [StagedEmbedding(r.entry_id, v, cut) for r, v, cut
                                                    in zip(rows, vectors, truncated, strict=True)])
        return len(rows), rows[-1].entry_id

    def _swap(self, tx: TenantSession) -> None:
        """Every row is staged for the target (under the lock): make the staged embeddings live."""
        record = read_tenant(tx)
        assert record is not None
        tx.swap_staged()  # a row left unstaged makes it raise: nothing changes then
        if record.embeddings.dim != self.target.dim:  # clusters live in the old embedding space
            tx.lock(TenantLock.SUPPRESSION)
            tx.clear_suppression_state()
        tx.set_embedding_version(self.target.rendering, self._dim)
        tx.bump_memory_version()


def run_reindex(settings: Settings, *, tenant_id: str | None = None, progress: bool = True,
                encoder: Encoder | None = None, truncation: TruncationCounter | None = None,
                on_batch: Callable[[int], None] | None = None) -> ReindexReport:
    """Load the configured bi-encoder (unless given), open the store and reindex (see :class:`Reindexer`).

    Raises ModelSetupError, DatabaseMissingError, SchemaOutdatedError, ReindexError, StoreError.
    """
    from workers.runtime.models import load_encoder, load_truncation_counter

    encoder = encoder or load_encoder(settings)
    truncation = truncation or load_truncation_counter(settings)
    with PostgresStore(settings.database_url, settings.db_app_role) as store:
        return Reindexer(settings, store, encoder, truncation, progress=progress, on_batch=on_batch).run(tenant_id)
