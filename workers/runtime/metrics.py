"""Every Prometheus metric of the service, in one observer module (names fixed by
docs/architecture.md "Metrics").

A :class:`ServiceMetrics` owns its ``CollectorRegistry`` (tests make their own; a worker process
makes one and serves it with :func:`serve`). Labels are low-cardinality enums only: never a
tenant id, a turn id or text. Durations are seconds, counters end in ``_total``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Mapping
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app

from api.errors import Reason
from workers.runtime import metrics_http
from workers.runtime.liveness import Liveness
from workers.runtime.metrics_http import LIVENESS_PATH

log = logging.getLogger(__name__)

STAGES = ("refresh", "bm25", "dense", "fusion", "suppression", "rerank", "features", "total")
JOB_STATUSES = ("ok", "error")
_FAST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# what a client waits: queueing can reach the client's own timeout (30 s by default) and beyond
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)
_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
_POOL_BUCKETS = (0, 5, 10, 20, 30, 50, 75, 100, 150, 200)


WORKERS = ("ingest", "query", "suppression")
MCP = "mcp"  # the `mnemos mcp` server (integrations/mcp_server): a process with metrics, not a stream worker
MCP_TOOLS = ("remember", "recall", "forget", "list_sessions")  # tool label values; any other name counts as "unknown"
MCP_OUTCOMES = ("ok", "tool_error")  # a tool result, or a tool error (bad arguments, a service that failed)


class ServiceMetrics:
    """The metrics of the three workers, registered in ``registry`` (a fresh one by default).

    With ``worker`` set (one of :data:`WORKERS`, or :data:`MCP`), only that worker's families plus the shared ones
    (streams, queue, worker up, dead letters) are registered, so its ``/metrics`` lists no other
    worker's families at zero; the others still exist as unregistered objects, so every observer
    works in every process. Without it (tests, the deploy checks) all families are registered.

    Raises:
        ValueError: if ``worker`` is not None and not one of :data:`WORKERS` or :data:`MCP`.
    """

    def __init__(self, registry: CollectorRegistry | None = None, worker: str | None = None) -> None:
        if worker is not None and worker not in (*WORKERS, MCP):
            raise ValueError(f"worker must be one of {(*WORKERS, MCP)} or None, got {worker!r}")
        self.registry = registry if registry is not None else CollectorRegistry()
        shared = self.registry

        def own(kind: str) -> CollectorRegistry | None:
            return shared if worker in (None, kind) else None

        self._ingest_families(own("ingest"))
        self._query_families(own("query"))
        self._suppression_families(own("suppression"))
        self._mcp_families(own(MCP))
        self._shared_families(shared)
        # every label value a rule or dashboard divides by or alerts on exists at 0 from the start: a
        # labelled counter first created at 1 reads as no increase, so the first event would not alert
        for reason in Reason:
            self.dead_letters.labels(reason=reason.value)
            self.ingest_rejected.labels(reason=reason.value)
        for status in JOB_STATUSES:
            self.query_jobs.labels(status=status)
            self.query_catalog_jobs.labels(status=status)

    def _ingest_families(self, r: CollectorRegistry | None) -> None:
        """The ingest worker's families, registered in ``r`` (None: not registered)."""
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
        self.forget_events = Counter(
            "mnemos_ingest_forget_events_total", "Forget events applied (docs/architecture.md \"Forget\")", registry=r)
        self.forget_turns = Counter(
            "mnemos_ingest_forgotten_turns_total", "Stored turns (canonical entries and aliases) erased by forget events",
            registry=r)
        self.ingest_tombstoned = Counter(
            "mnemos_ingest_turns_tombstoned_total",
            "Turn messages dropped because a forget covered them (published before it, or a forgotten turn id "
            "published again without readd)", registry=r)

    def _query_families(self, r: CollectorRegistry | None) -> None:
        """The query worker's families, registered in ``r`` (None: not registered)."""
        self.query_jobs = Counter("mnemos_query_jobs_total", "Retrieval jobs", ["status"], registry=r)
        self.query_stage_seconds = Histogram(
            "mnemos_query_stage_seconds", "Seconds per retrieval stage", ["stage"], buckets=_FAST_BUCKETS,
            registry=r)
        self.query_deep_passes = Counter("mnemos_query_deep_passes_total", "Retrievals that took the deep pass",
                                         registry=r)
        self.query_pool_size = Histogram("mnemos_query_pool_size", "Entries reranked per retrieval",
                                         buckets=_POOL_BUCKETS, registry=r)
        self._register_rerank(r)
        self.query_index_refreshes = Counter(
            "mnemos_query_index_refreshes_total", "Tenant index loads or incremental refreshes", registry=r)
        self.query_queue_wait = Histogram(
            "mnemos_query_queue_wait_seconds", "Seconds from a retrieval job's enqueue to its start (queueing)",
            buckets=_WAIT_BUCKETS, registry=r)
        self.query_end_to_end = Histogram(
            "mnemos_query_end_to_end_seconds",
            "Seconds from a retrieval job's enqueue to its end, ok or error (queueing plus work: what a client "
            "waits)", buckets=_WAIT_BUCKETS, registry=r)
        self.query_jobs_expired = Counter(
            "mnemos_query_jobs_expired_total",
            "Retrieval jobs that left the queue unanswered: expired before a worker took them, or cancelled "
            "by a client that gave up waiting", registry=r)
        self._register_tenant_cache(r)
        self.query_catalog_jobs = Counter(
            "mnemos_query_catalog_jobs_total", "Catalog jobs (a tenant's sessions, or its turns by id; workers/query/catalog.py)",
            ["status"], registry=r)
        self.query_jobs_recovered = Counter(
            "mnemos_query_jobs_recovered_total",
            "Retrieval jobs put back in the queue after a worker stopped between dequeuing and starting them",
            registry=r)

    def _suppression_families(self, r: CollectorRegistry | None) -> None:
        """The suppression worker's families, registered in ``r`` (None: not registered)."""
        self.suppression_applied = Counter(
            "mnemos_suppression_outcomes_applied_total", "Outcomes applied (ledger rows written)", registry=r)
        self.suppression_duplicates = Counter(
            "mnemos_suppression_duplicates_skipped_total", "Redelivered outcomes skipped by the ledger", registry=r)
        self.suppression_outdated = Counter(
            "mnemos_suppression_outcomes_outdated_total",
            "Outcomes skipped with no effect: a forget after their retrieval erased their whole pool, or their "
            "tenant has no stored turns", registry=r)
        self.suppression_entries_updated = Counter(
            "mnemos_suppression_entries_updated_total", "(entry, cluster) scores changed", registry=r)
        self.suppression_bootstrapped = Gauge(
            "mnemos_suppression_bootstrapped_tenants", "Tenants whose centroids this worker froze", registry=r)
        self.suppression_apply_seconds = Histogram(
            "mnemos_suppression_apply_seconds", "Seconds per outcome transaction", buckets=_FAST_BUCKETS,
            registry=r)

    def _mcp_families(self, r: CollectorRegistry | None) -> None:
        """The MCP server's families (``mnemos mcp``), registered in ``r`` (None: not registered); every
        (tool, outcome) pair exists at 0 from the start."""
        self.mcp_tool_calls = Counter(
            "mnemos_mcp_tool_calls_total", "MCP tool calls by tool and outcome (ok, or a tool error the model reads)",
            ["tool", "outcome"], registry=r)
        self.mcp_tool_seconds = Histogram(
            "mnemos_mcp_tool_seconds", "Seconds per MCP tool call, as the server handled it (arguments to result)",
            ["tool"], buckets=_WAIT_BUCKETS, registry=r)
        for tool in (*MCP_TOOLS, "unknown"):
            self.mcp_tool_seconds.labels(tool=tool)
            for outcome in MCP_OUTCOMES:
                self.mcp_tool_calls.labels(tool=tool, outcome=outcome)

    def _shared_families(self, r: CollectorRegistry) -> None:
        """The families of every worker (streams, queue, up, dead letters, heartbeat, refusals)."""
        self.stream_length = Gauge("mnemos_stream_length", "XLEN of a stream", ["stream", "group"], registry=r)
        self.stream_pending = Gauge(
            "mnemos_stream_pending", "Entries delivered but not acknowledged", ["stream", "group"], registry=r)
        self.stream_lag = Gauge("mnemos_stream_lag", "Entries not yet delivered to the group", ["stream", "group"],
                                registry=r)
        self.queue_length = Gauge("mnemos_queue_length", "Jobs waiting in an rq queue", ["queue"], registry=r)
        self.tenants_frozen = Gauge(
            "mnemos_tenants_frozen", "Tenants a shard's tenant directory holds frozen: a move (mnemos reshard move) "
            "running or stopped; their clients wait, then get TenantMoving", ["directory"], registry=r)
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

    def _register_tenant_cache(self, r: CollectorRegistry | None) -> None:
        """The query worker's tenant index cache (workers/query/tenant_cache.py): never labelled by tenant."""
        self.tenant_cache_hits = Counter(
            "mnemos_query_tenant_cache_hits_total", "Retrievals answered from a cached tenant index (possibly extended)",
            registry=r)
        self.tenant_cache_misses = Counter(
            "mnemos_query_tenant_cache_misses_total",
            "Tenant indexes built from Postgres: a tenant's first request, a reload after an eviction, a forget",
            registry=r)
        self.tenant_cache_evictions = Counter(
            "mnemos_query_tenant_cache_evictions_total",
            "Tenant indexes evicted, least recently used first, to keep MNEMOS_INDEX_MEMORY_MB and "
            "MNEMOS_MAX_CACHED_TENANTS", registry=r)
        self.tenant_cache_bytes = Gauge(
            "mnemos_query_tenant_cache_bytes", "Estimated bytes of every cached tenant index together", registry=r)
        self.tenant_cache_tenants = Gauge(
            "mnemos_query_tenant_cache_tenants", "Tenant indexes cached in the query worker", registry=r)

    def _register_rerank(self, r: CollectorRegistry | None) -> None:
        """The query worker's reranker counters (cache hits and misses, truncated pairs)."""
        self.query_rerank_cache_hits = Counter(
            "mnemos_query_rerank_cache_hits_total",
            "(query, turn) pairs scored from the query worker's rerank cache instead of the model", registry=r)
        self.query_rerank_cache_misses = Counter(
            "mnemos_query_rerank_cache_misses_total",
            "(query, turn) pairs the query worker's rerank cache could not answer (sent to the model)", registry=r)
        self.query_packet_cache_hits = Counter(
            "mnemos_query_packet_cache_hits_total",
            "evidence packet requests the query worker answered from its packet cache (nothing scored again)",
            registry=r)
        self.query_packet_cache_misses = Counter(
            "mnemos_query_packet_cache_misses_total",
            "evidence packet requests the query worker's packet cache could not answer (retrieved and built)",
            registry=r)
        self.query_rerank_pairs_truncated = Counter(
            "mnemos_query_rerank_pairs_truncated_total",
            "(query, turn) pairs longer than the cross-encoder's max length (the turn lost tokens)", registry=r)
        self.query_rerank_queries_truncated = Counter(
            "mnemos_query_rerank_queries_truncated_total",
            "(query, turn) pairs whose query lost tokens too (the query alone nearly filled the max length)",
            registry=r)

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

    def forgotten(self, turns: int) -> None:
        """One applied forget event that erased ``turns`` stored turns (never labelled by tenant)."""
        self.forget_events.inc()
        if turns:
            self.forget_turns.inc(turns)

    def tombstoned(self, n: int = 1) -> None:
        """Turn messages a tombstone kept out."""
        self.ingest_tombstoned.inc(n)

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

    def catalog_job(self, status: str) -> None:
        """One catalog job ended with ``status`` (one of :data:`JOB_STATUSES`)."""
        self.query_catalog_jobs.labels(status=status).inc()

    def query_rerank(self, *, cache_hits: int = 0, cache_misses: int = 0, pairs_truncated: int = 0,
                     queries_truncated: int = 0) -> None:
        """One retrieval's reranking counts: pairs answered by the cache or not, pairs truncated."""
        for counter, n in ((self.query_rerank_cache_hits, cache_hits), (self.query_rerank_cache_misses, cache_misses),
                           (self.query_rerank_pairs_truncated, pairs_truncated),
                           (self.query_rerank_queries_truncated, queries_truncated)):
            if n:
                counter.inc(n)

    def packet_cache(self, *, hit: bool) -> None:
        """One evidence packet request: answered from the packet cache or not."""
        (self.query_packet_cache_hits if hit else self.query_packet_cache_misses).inc()

    def tenant_cache(self, *, hits: int = 0, misses: int = 0, evictions: int = 0, cached_bytes: int,
                     tenants: int) -> None:
        """Changes of the query worker's tenant cache since the last report, and its size now."""
        for counter, n in ((self.tenant_cache_hits, hits), (self.tenant_cache_misses, misses),
                           (self.tenant_cache_evictions, evictions)):
            if n:
                counter.inc(n)
        self.tenant_cache_bytes.set(cached_bytes)
        self.tenant_cache_tenants.set(tenants)

    def outcome_applied(self, *, seconds: float, entries_updated: int, duplicate: bool) -> None:
        self.suppression_apply_seconds.observe(seconds)
        if duplicate:
            self.suppression_duplicates.inc()
        else:
            self.suppression_applied.inc()
            self.suppression_entries_updated.inc(entries_updated)

    def job_timing(self, *, queue_wait_s: float | None = None, end_to_end_s: float | None = None) -> None:
        """A retrieval job's time in the queue (at its start) or from enqueue to its end (seconds,
        clamped at 0: the enqueue time comes from the client's clock)."""
        if queue_wait_s is not None:
            self.query_queue_wait.observe(max(0.0, queue_wait_s))
        if end_to_end_s is not None:
            self.query_end_to_end.observe(max(0.0, end_to_end_s))

    def jobs_expired(self, n: int = 1) -> None:
        if n:
            self.query_jobs_expired.inc(n)

    def jobs_recovered(self, n: int = 1) -> None:
        if n:
            self.query_jobs_recovered.inc(n)

    def mcp_tool_call(self, tool: str, *, ok: bool, seconds: float) -> None:
        """One MCP tool call (a name outside :data:`MCP_TOOLS` counts as ``unknown``): its outcome and
        its seconds."""
        label = tool if tool in MCP_TOOLS else "unknown"
        self.mcp_tool_calls.labels(tool=label, outcome="ok" if ok else "tool_error").inc()
        self.mcp_tool_seconds.labels(tool=label).observe(max(0.0, seconds))

    def heartbeat(self, worker: str, unix_s: float) -> None:
        self.worker_heartbeat.labels(worker=worker).set(unix_s)

    def version_refusal(self, worker: str, n: int = 1) -> None:
        self.version_refusals.labels(worker=worker).inc(n)

    def stream_state(self, stream: str, group: str, *, length: int, pending: int, lag: int | None) -> None:
        self.stream_length.labels(stream=stream, group=group).set(length)
        self.stream_pending.labels(stream=stream, group=group).set(pending)
        if lag is not None:
            self.stream_lag.labels(stream=stream, group=group).set(lag)
        else:  # Redis cannot tell the lag now (a trimmed or deleted entry, Redis < 7): unknown, not the old value
            with contextlib.suppress(KeyError):
                self.stream_lag.remove(stream, group)


def serve(metrics: ServiceMetrics, port: int, worker: str, liveness: Liveness | None = None,
          host: str = "0.0.0.0") -> bool:
    """Serve ``/metrics`` (and :data:`LIVENESS_PATH`) on ``host:port`` (``MNEMOS_METRICS_HOST``; all
    interfaces by default, as Prometheus scrapes the pod IP) and mark ``worker`` up; True when serving.

    A port already in use (another worker of the same kind on this host, e.g. ``mnemos demo``
    next to ``mnemos up``) is logged as a warning and the worker runs on without a metrics
    endpoint: the metrics are for observing the work, not a reason to refuse it.
    """
    metrics.worker_up.labels(worker=worker).set(1)
    try:
        start_server(metrics, port, liveness, host)
    except OSError as exc:
        log.warning("the %s worker serves no metrics: cannot listen on port %d (%s); set "
                    "MNEMOS_%s_METRICS_PORT to a free port or MNEMOS_METRICS_ENABLED=false", worker, port,
                    exc.strerror or exc, worker.upper())
        return False
    log.info("metrics of the %s worker on %s:%d/metrics, liveness on %s:%d%s", worker, host, port, host, port,
             LIVENESS_PATH)
    return True


def start_server(metrics: ServiceMetrics, port: int, liveness: Liveness | None = None,
                 host: str = "0.0.0.0") -> WSGIServer:
    """Start the HTTP server of ``metrics`` on ``host:port`` in a daemon thread and return it
    (``shutdown()`` stops it): :func:`workers.runtime.metrics_http.start_server` over this registry.

    Raises OSError when the port cannot be bound.
    """
    return metrics_http.start_server(make_wsgi_app(metrics.registry), port, liveness, host)
