"""Suppression worker: stream ``<prefix>:outcomes`` (group ``suppression``) into suppression scores.

Per outcome, in ONE transaction scoped to its tenant (*Clustered Retrieval-Induced Forgetting*, Algorithm 1,
lines 9-12; docs/architecture.md "Suppression"):

1. insert the ledger row ``applied_outcomes (tenant_id, outcome_id)`` with ``ON CONFLICT DO
   NOTHING``; if it already existed the outcome is a redelivery and nothing else happens;
2. compute the deltas with the configured rule (rank-gap, Eq. 2, by default), already summed per
   (entry, cluster) so no statement touches a row twice, store them in the ledger row (the scores
   can be recomputed from the ledger) and add them with
   ``INSERT ... ON CONFLICT DO UPDATE SET score = suppression.score + excluded.score``;
3. while the tenant has no frozen centroids, append the query embedding to its bootstrap buffer;
   when the buffer reaches ``bootstrap_factor x K`` embeddings, fit k-means
   (:class:`mnemos.suppression.QueryClusters`) and freeze the centroids.

Every outcome applied (not a redelivery) also bumps the tenant's ``suppression_version`` in the
same transaction and records the new version in its ledger row (migration 0005): a retrieval
reports the version it read, and the ledger in version order replays the state it saw.

Then COMMIT, and only then XACK. Outcomes produced before bootstrap carry cluster None: they only
feed the buffer (no cue to suppress under yet); with K = 1 (global suppression) every outcome has
cluster 0 from the first query.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import redis

from api.directory import marked
from api.errors import InvalidInputError, Reason
from api.schemas import Outcome as OutcomeMessage
from mnemos.suppression import QueryClusters, UpdateRule, outcome_deltas, warm_up_kmeans
from workers.runtime.dead_letters import DeadLetter, payload_of
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.streams import StreamConsumer, StreamMessage, consumer_name, run_consumer
from workers.runtime.wire import outcome_record
from workers.settings import Settings
from workers.store import Store, TenantSession
from workers.store.rows import VECTOR_DTYPE, TenantLock, TenantRow, vectors_from_bytes
from workers.store.state import read_tenant

log = logging.getLogger(__name__)

GROUP = "suppression"
UPSTREAM_LOSS = ("outcomes not yet applied: their suppression updates are gone (answers are unaffected; "
                 "suppression learns on from the next outcomes)")


class _MovedAway(Exception):
    """Raised when an outcome's tenant is marked in this shard's directory (being moved or moved away)."""


class SuppressionWorker:
    """Applies outcomes exactly once in effect (see the module docstring). Single-threaded."""

    def __init__(self, settings: Settings, connection: redis.Redis, store: Store, metrics: ServiceMetrics) -> None:
        self.settings = settings
        self.connection = connection
        self.store = store
        self.metrics = metrics
        self.rule = UpdateRule(settings.update_rule)
        self._bootstrapped = 0

    def warm_up(self) -> None:
        """Fit a tiny k-means once before taking outcomes, so the first tenant's bootstrap does not
        wait seconds for scikit-learn to import while its queries go on unclustered. Freezes and
        logs nothing: no tenant's clusters are involved."""
        if self.settings.clusters_k > 1:
            warm_up_kmeans()

    def handle(self, batch: list[StreamMessage]) -> list[str]:
        rejected: list[DeadLetter] = []
        left: set[str] = set()  # outcomes of a tenant being moved or moved away: the move takes them
        for message in batch:
            try:
                outcome = OutcomeMessage.from_stream_fields(message.fields)
            except InvalidInputError as exc:
                rejected.append(DeadLetter(self.settings.outcomes_stream, message.stream_id, exc.reason.value,
                                           str(exc), payload=payload_of(message.fields)))
                continue
            try:
                self.apply(outcome, message.stream_id)
            except _MovedAway:
                left.add(message.stream_id)
            except InvalidInputError as exc:  # parsed, but does not fit its tenant (rolled back, nothing applied)
                rejected.append(DeadLetter(self.settings.outcomes_stream, message.stream_id, exc.reason.value,
                                           str(exc), payload=payload_of(message.fields)))
        if rejected:
            self.store.record_dead_letters(rejected)
            for letter in rejected:
                self.metrics.rejected(letter.reason, turn=False)
        return [m.stream_id for m in batch if m.stream_id not in left]

    def apply(self, message: OutcomeMessage, stream_id: str | None = None) -> bool:
        """Apply one outcome in one transaction; False when the ledger says it was applied before, or
        when a forget made it moot (:func:`_forgotten_since`: acknowledged with no effect, no ledger row)."""
        started = time.perf_counter()
        outcome = outcome_record(message)
        deltas = outcome_deltas(outcome, self.rule, self.settings.eta)
        tenant_id = outcome.tenant_id
        froze = False
        with self.store.tenant(tenant_id) as tx:
            bootstraps = message.query_embedding is not None and self.settings.clusters_k > 1
            if bootstraps:
                # the bootstrap lock before the tenant row's, in the order a tenant move and a reindex
                # take them (a break-it session found the reverse order deadlocking with a move)
                tx.lock(TenantLock.SUPPRESSION)
            row = tx.tenant(lock=True)  # the row lock: a forget commits wholly before or after this outcome
            s = self.settings
            if row is None:
                if marked(self.connection, s.stream_prefix, s.shard, s.shards, tenant_id):
                    raise _MovedAway(tenant_id)  # moved away: its rows left with it, the outcome follows them
                # no turn of the tenant was ever stored here: nothing to learn, nothing to record
                log.warning("outcome %s names tenant %r, which has no stored turns here; skipped",
                            outcome.outcome_id, tenant_id)
                self.metrics.suppression_outdated.inc()
                return False
            stale = _forgotten_since(row, message)
            if stale and not tx.own_entry_ids(sorted({p.entry_id for p in message.pool})):
                self.metrics.suppression_outdated.inc()  # nothing of its pool is left to learn about
                return False
            # a query asked before a forget is not buffered: a tenant forget erases the tenant's queries
            clustered = bootstraps and not stale
            if clustered:
                _check_embedding(tx, len(message.query_embedding or ()))
            if deltas:  # isolation: only this tenant's entries can be suppressed under its id
                ids = sorted({e for e, _ in deltas})
                own = tx.own_entry_ids(ids)
                if len(own) != len(ids):
                    log.warning("outcome %s names %d entries outside its tenant; ignoring them",
                                outcome.outcome_id, len(ids) - len(own))
                    deltas = {key: d for key, d in deltas.items() if key[0] in own}
            if not tx.record_outcome(outcome.outcome_id, outcome.cluster, deltas, stream_id):
                self.metrics.outcome_applied(seconds=time.perf_counter() - started, entries_updated=0,
                                             duplicate=True)
                return False
            # the tenant row's lock serialises this tenant's writers: versions follow commit order
            tx.bump_suppression_version(outcome.outcome_id)
            # after the tenant row's lock, which a move holds: its marker is set by then
            if marked(self.connection, s.stream_prefix, s.shard, s.shards, tenant_id):
                raise _MovedAway(tenant_id)  # rolls back, left pending: docs/scaling.md "Moving a tenant between shards"
            tx.add_suppression(deltas)
            if clustered:
                froze = self._buffer(tx, outcome.outcome_id, np.asarray(message.query_embedding))
        if froze:
            self._bootstrapped += 1
            self.metrics.suppression_bootstrapped.set(self._bootstrapped)
        self.metrics.outcome_applied(seconds=time.perf_counter() - started, entries_updated=len(deltas),
                                     duplicate=False)
        return True

    def _buffer(self, tx: TenantSession, outcome_id: str, embedding: np.ndarray) -> bool:
        """Append to the bootstrap buffer; fit and freeze the centroids when it is full. True if frozen now."""
        tx.lock(TenantLock.SUPPRESSION)
        if tx.centroids() is not None:
            return False  # already frozen: late bootstrap outcomes are not needed any more
        tx.buffer_query(outcome_id, embedding)
        clusters = QueryClusters(k=self.settings.clusters_k, bootstrap_factor=self.settings.bootstrap_factor)
        if tx.buffered_count() < clusters.bootstrap_size:
            return False
        blobs = tx.buffered_queries()
        fitting = [b for b in blobs if len(b) == embedding.shape[0] * VECTOR_DTYPE.itemsize]
        if len(fitting) < len(blobs):  # buffered before outcomes were checked against the tenant's dimension
            log.warning("skipping %d buffered queries of another dimension", len(blobs) - len(fitting))
        for vector in vectors_from_bytes(fitting, embedding.shape[0]):
            clusters.observe(vector)
        assert clusters.centroids is not None
        tx.save_centroids(clusters.centroids, n_queries=len(fitting))
        log.info("froze %d query clusters of a tenant from %d queries", clusters.centroids.shape[0], len(blobs))
        return True

    def poison(self, message: StreamMessage, exc: Exception) -> bool:
        """Dead-letter an outcome the worker failed on by itself (``processing_error``); returns True
        (acknowledge it)."""
        letter = DeadLetter(self.settings.outcomes_stream, message.stream_id, Reason.PROCESSING_ERROR.value,
                            f"{type(exc).__name__}: {exc}", payload=payload_of(message.fields))
        self.store.record_dead_letters([letter])
        self.metrics.rejected(letter.reason, turn=False)
        return True

    def on_lost(self, stream_id: str) -> None:
        log.error("outcome %s was trimmed before it was acknowledged", stream_id)
        self.metrics.rejected(Reason.TRIMMED_BEFORE_ACK.value, turn=False)

    def consumer(self, name: str | None = None) -> StreamConsumer:
        s = self.settings
        return StreamConsumer(
            self.connection, s.outcomes_stream, GROUP, name or consumer_name("suppression"),
            batch_size=s.outcome_batch_size, block_ms=s.block_ms, claim_idle_ms=s.claim_idle_ms,
            claim_interval_s=s.claim_interval_s, on_lost=self.on_lost, upstream_loss=UPSTREAM_LOSS)

    def run(self, stop: threading.Event, name: str | None = None, heartbeat: Heartbeat | None = None) -> None:
        """Consume until ``stop`` is set (renewing ``heartbeat`` from the loop)."""
        log.info("suppression worker consuming %s as group %s", self.settings.outcomes_stream, GROUP)
        run_consumer(self.consumer(name), self.handle, stop, poison=self.poison,
                     trim_interval_s=self.settings.trim_interval_s, heartbeat=heartbeat)


def _forgotten_since(row: TenantRow, message: OutcomeMessage) -> bool:
    """True when a forget committed after the outcome's retrieval read the tenant (``row``, read
    under its lock, so a forget commits wholly before or after this outcome; docs/architecture.md
    "Forget"). Such an outcome updates only the pooled entries that survive and never buffers its
    query embedding (a tenant forget erases the tenant's queries; the turns around a turn forget
    need no old query), and one whose whole pool is gone is skipped (no ledger row, no version). An
    outcome without ``forget_version`` (an older query worker) is never stale."""
    return message.forget_version is not None and message.forget_version < row.forget_version


def _check_embedding(tx: TenantSession, floats: int) -> None:
    """Refuse an outcome whose query embedding cannot join the tenant's query clusters.

    Raises:
        InvalidInputError: ``malformed_message`` when the tenant's embeddings have another
            dimension than the outcome's ``floats`` (one such vector in the bootstrap buffer would
            otherwise fail every later fit of the tenant's clusters).
    """
    record = read_tenant(tx)
    dim = None if record is None else record.embeddings.dim
    if dim is not None and floats != dim:
        raise InvalidInputError(Reason.MALFORMED_MESSAGE, "query_embedding",
                                f"has {floats} floats; the tenant's embeddings have {dim}")
