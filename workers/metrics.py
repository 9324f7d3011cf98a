"""Every Prometheus metric of the service, in one observer module (names fixed by SPEC.md).

A :class:`ServiceMetrics` owns its ``CollectorRegistry`` (tests make their own; a worker process
makes one and serves it with :func:`serve`). Labels are low-cardinality enums only: never a
tenant id, a turn id or text. Durations are seconds, counters end in ``_total``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

STAGES = ("refresh", "bm25", "dense", "fusion", "suppression", "rerank", "features", "total")
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_POOL_BUCKETS = (0, 5, 10, 20, 30, 50, 75, 100, 150, 200)


WORKERS = ("ingest", "query", "suppression")


class ServiceMetrics:
    """The metrics of the three workers, registered in ``registry`` (a fresh one by default).

    With ``worker`` set (one of :data:`WORKERS`), only that worker's families plus the shared ones
    (streams, queue, worker up, dead letters) are registered, so its ``/metrics`` lists no other
    worker's families at zero; the others still exist as unregistered objects, so every observer
    works in every process. Without it (tests, the deploy checks) all families are registered.

    Raises:
        ValueError: if ``worker`` is not None and not one of :data:`WORKERS`.
    """

    def __init__(self, registry: CollectorRegistry | None = None, worker: str | None = None) -> None:
        if worker is not None and worker not in WORKERS:
            raise ValueError(f"worker must be one of {WORKERS} or None, got {worker!r}")
        self.registry = registry if registry is not None else CollectorRegistry()
        shared = self.registry

        def own(kind: str) -> CollectorRegistry | None:
            return shared if worker in (None, kind) else None

        # ingest
        r = own("ingest")
        self.ingest_turns_read = Counter("mnemos_ingest_turns_read_total", "Turns read from the stream", registry=r)
        self.ingest_turns_indexed = Counter(
            "mnemos_ingest_turns_indexed_total", "Turns written as canonical entries", registry=r)
        self.ingest_duplicates = Counter(
            "mnemos_ingest_duplicates_total", "Turns stored as aliases of a near-duplicate entry", registry=r)
        self.ingest_rejected = Counter(
            "mnemos_ingest_turns_rejected_total", "Turns sent to the dead letter", ["reason"], registry=r)
        self.ingest_embed_seconds = Histogram(
            "mnemos_ingest_embed_seconds", "Bi-encoder seconds per batch", buckets=_FAST_BUCKETS, registry=r)
        self.ingest_batch_size = Histogram(
            "mnemos_ingest_batch_size", "Turns per stream batch", buckets=_SIZE_BUCKETS, registry=r)
        self.ingest_commit_seconds = Histogram(
            "mnemos_ingest_commit_seconds", "Postgres seconds per batch (dedupe, insert, commit)",
            buckets=_FAST_BUCKETS, registry=r)
        self.ingest_claimed = Counter(
            "mnemos_ingest_claimed_total", "Stream entries claimed from idle consumers", registry=r)
        self.ingest_truncated = Counter(
            "mnemos_ingest_encoder_truncated_total",
            "Turns longer than the bi-encoder window (full text kept in Postgres and BM25)", registry=r)
        # query
        r = own("query")
        self.query_jobs = Counter("mnemos_query_jobs_total", "Retrieval jobs", ["status"], registry=r)
        self.query_stage_seconds = Histogram(
            "mnemos_query_stage_seconds", "Seconds per retrieval stage", ["stage"], buckets=_FAST_BUCKETS,
            registry=r)
        self.query_deep_passes = Counter("mnemos_query_deep_passes_total", "Retrievals that took the deep pass",
                                         registry=r)
        self.query_pool_size = Histogram("mnemos_query_pool_size", "Entries reranked per retrieval",
                                         buckets=_POOL_BUCKETS, registry=r)
        self.query_rerank_cache_hits = Counter(
            "mnemos_query_rerank_cache_hits_total",
            "(query, turn) pairs scored from the query worker's rerank cache instead of the model", registry=r)
        self.query_index_refreshes = Counter(
            "mnemos_query_index_refreshes_total", "Tenant index loads or incremental refreshes", registry=r)
        # suppression
        r = own("suppression")
        self.suppression_applied = Counter(
            "mnemos_suppression_outcomes_applied_total", "Outcomes applied (ledger rows written)", registry=r)
        self.suppression_duplicates = Counter(
            "mnemos_suppression_duplicates_skipped_total", "Redelivered outcomes skipped by the ledger", registry=r)
        self.suppression_entries_updated = Counter(
            "mnemos_suppression_entries_updated_total", "(entry, cluster) scores changed", registry=r)
        self.suppression_bootstrapped = Gauge(
            "mnemos_suppression_bootstrapped_tenants", "Tenants whose centroids this worker froze", registry=r)
        self.suppression_apply_seconds = Histogram(
            "mnemos_suppression_apply_seconds", "Seconds per outcome transaction", buckets=_FAST_BUCKETS,
            registry=r)
        # streams and queue
        r = shared
        self.stream_length = Gauge("mnemos_stream_length", "XLEN of a stream", ["stream", "group"], registry=r)
        self.stream_pending = Gauge(
            "mnemos_stream_pending", "Entries delivered but not acknowledged", ["stream", "group"], registry=r)
        self.stream_lag = Gauge("mnemos_stream_lag", "Entries not yet delivered to the group", ["stream", "group"],
                                registry=r)
        self.queue_length = Gauge("mnemos_queue_length", "Jobs waiting in an rq queue", ["queue"], registry=r)
        # every worker
        self.worker_up = Gauge("mnemos_worker_up", "1 while the worker runs", ["worker"], registry=r)
        self.dead_letters = Counter("mnemos_dead_letters_total", "Messages dead-lettered or lost", ["reason"],
                                    registry=r)
        self.worker_heartbeat = Gauge(
            "mnemos_worker_heartbeat_timestamp_seconds",
            "Unix time of the worker loop's last heartbeat (stale: the loop stopped)", ["worker"], registry=r)
        self.version_refusals = Counter(
            "mnemos_embedding_version_refusals_total",
            "Turns (ingest) or requests (query) refused because their tenant's stored embeddings were made "
            "with another rendering or encoder dimension", ["worker"], registry=r)

    # observers ----------------------------------------------------------------------------------

    def ingest_batch(self, *, read: int, claimed: int, embed_s: float, commit_s: float, indexed: int,
                     duplicates: int, truncated: int) -> None:
        self.ingest_turns_read.inc(read)
        if claimed:
            self.ingest_claimed.inc(claimed)
        self.ingest_batch_size.observe(read)
        self.ingest_embed_seconds.observe(embed_s)
        self.ingest_commit_seconds.observe(commit_s)
        self.ingest_turns_indexed.inc(indexed)
        self.ingest_duplicates.inc(duplicates)
        if truncated:
            self.ingest_truncated.inc(truncated)

    def rejected(self, reason: str, *, turn: bool = True) -> None:
        """One dead-lettered (or lost) message; ``turn`` also counts it as a rejected turn."""
        self.dead_letters.labels(reason=reason).inc()
        if turn:
            self.ingest_rejected.labels(reason=reason).inc()

    def query_job(self, status: str, stage_seconds: Mapping[str, float] | None = None, *, pool_size: int = 0,
                  deep_pass: bool = False, refreshed: bool = False) -> None:
        self.query_jobs.labels(status=status).inc()
        if refreshed:
            self.query_index_refreshes.inc()
        if stage_seconds is None:
            return
        for stage in STAGES:
            if stage in stage_seconds:
                self.query_stage_seconds.labels(stage=stage).observe(stage_seconds[stage])
        self.query_pool_size.observe(pool_size)
        if deep_pass:
            self.query_deep_passes.inc()

    def outcome_applied(self, *, seconds: float, entries_updated: int, duplicate: bool) -> None:
        self.suppression_apply_seconds.observe(seconds)
        if duplicate:
            self.suppression_duplicates.inc()
        else:
            self.suppression_applied.inc()
            self.suppression_entries_updated.inc(entries_updated)

    def heartbeat(self, worker: str, unix_s: float) -> None:
        self.worker_heartbeat.labels(worker=worker).set(unix_s)

    def version_refusal(self, worker: str, n: int = 1) -> None:
        self.version_refusals.labels(worker=worker).inc(n)

    def stream_state(self, stream: str, group: str, *, length: int, pending: int, lag: int | None) -> None:
        self.stream_length.labels(stream=stream, group=group).set(length)
        self.stream_pending.labels(stream=stream, group=group).set(pending)
        if lag is not None:
            self.stream_lag.labels(stream=stream, group=group).set(lag)


def serve(metrics: ServiceMetrics, port: int, worker: str) -> bool:
    """Serve ``/metrics`` on ``port`` (all interfaces) and mark ``worker`` up; True when serving.

    A port already in use (another worker of the same kind on this host, e.g. ``mnemos demo``
    next to ``mnemos up``) is logged as a warning and the worker runs on without a metrics
    endpoint: the metrics are for observing the work, not a reason to refuse it.
    """
    metrics.worker_up.labels(worker=worker).set(1)
    try:
        start_http_server(port, registry=metrics.registry)
    except OSError as exc:
        log.warning("the %s worker serves no metrics: cannot listen on port %d (%s); set "
                    "MNEMOS_%s_METRICS_PORT to a free port or MNEMOS_METRICS_ENABLED=false", worker, port,
                    exc.strerror or exc, worker.upper())
        return False
    log.info("metrics of the %s worker on :%d/metrics", worker, port)
    return True
