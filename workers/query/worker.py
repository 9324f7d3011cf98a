"""Query worker: rq jobs on queue ``retrievals`` answered from per-tenant in-memory indexes.

The worker is an rq :class:`~rq.worker.SimpleWorker` subclass: jobs run in the worker process
itself (no fork per job), so tenant indexes and the models loaded at start survive between jobs
(docs/architecture.md "Pitfalls", 1). Jobs are JSON (``rq.serializers.JSONSerializer``), never pickle. The job
function :func:`retrieval_job` finds the process's :class:`QueryService` through a context
variable that :class:`QueryWorker` sets around each job, so it fails loudly anywhere else.

Per request: embed the query; in one snapshot read the tenant's memory and suppression versions,
extend its index if the memory version moved, load its clusters and its suppression scores for the
query's cluster (the suppression version says which outcomes that state holds: it comes back in
the result); run
:func:`mnemos.pipeline.retrieve` (with the post-rerank features the settings switch on, the
request's ``as_of`` and ``filters`` as its candidate filter and ``as_of`` as the reference time);
XADD the outcome to ``<prefix>:outcomes``; return the result. A request with ``budget_tokens`` also
gets an evidence packet built from the retrieval's reranked pool, and the whole answer is cached per
(tenant, query, filters, ``as_of``, budget, memory version, model versions), so a repeat at an
unchanged memory is answered without scoring again (:mod:`workers.query.packets`; counted in
``mnemos_query_packet_cache_hits_total`` / ``_misses_total``).
An unknown tenant gets an empty result (an empty packet when it asked for one; no outcome), not an
error. A tenant whose stored embeddings were made with another rendering or encoder dimension than
this worker's (reindexed while this worker runs, say) fails the request with
:class:`~workers.runtime.errors.EmbeddingVersionError` instead of mixing versions. The worker renews its heartbeat (:mod:`workers.runtime.heartbeats`) from rq's
loop: on every dequeue wait (every ``heartbeat_ttl_s / 3`` seconds while idle) and before each job.

The reranker is wrapped in a :class:`mnemos.rerank.CachedReranker` of ``rerank_cache_pairs``
(model version, tenant, query, rendered turn) scores, least recently used evicted, so a repeated
question at an unchanged memory skips the model for the turns it already scored. Each request is
scored through its tenant's scope of the cache: another tenant's identical question and turn text
is scored afresh, so neither the result's cache counts nor its latency reveal what others asked. Per request the worker
adds the reranker's counts to ``mnemos_query_rerank_cache_hits_total`` / ``_misses_total`` and to
``mnemos_query_rerank_pairs_truncated_total`` / ``_queries_truncated_total`` (pairs longer than
the cross-encoder's max length; see :mod:`mnemos.rerank_pairs`). A cached score is the one the
model gave the pair the first time (batch composition can move the last float bits).
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import redis
from rq import Queue
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from api import schemas
from api.directory import MOVED_RESULT_TTL_S, marked
from api.errors import InvalidInputError, Reason
from api.packets import Packet
from api.validation import limits_of
from mnemos.encoder import Encoder
from mnemos.packets import token_counter
from mnemos.pipeline import retrieve
from mnemos.rerank import CachedReranker, Reranker
from mnemos.suppression import SuppressionTable
from workers.query.config import retrieval_config
from workers.query.intermediate import sweep
from workers.query.jobs import QueryJob
from workers.query.packets import PacketCache, PacketKey, build_packet
from workers.query.tenant_cache import CacheStats, TenantCache, TenantState
from workers.runtime.errors import EmbeddingVersionError, OutsideQueryWorkerError
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.liveness import Liveness
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.wire import entry_filter, outcome_message, result_message
from workers.settings import Settings
from workers.store import Store
from workers.store.state import current_version, require_tenant_version

log = logging.getLogger(__name__)

_SERVICE: contextvars.ContextVar[QueryService | None] = contextvars.ContextVar("mnemos_query_service",
                                                                                default=None)


@dataclass(frozen=True)
class RerankCounts:
    """Running totals of a reranker chain (a cache and the model it wraps), for per-request deltas.
    ``has_cache``: the chain holds a score cache (without one, hits and misses stay 0 and say nothing)."""

    cache_hits: int = 0
    cache_misses: int = 0
    pairs_truncated: int = 0
    queries_truncated: int = 0
    has_cache: bool = False

    @classmethod
    def of(cls, reranker: Reranker | None) -> RerankCounts:
        """Sum the counters found along ``reranker`` and its ``inner`` rerankers (absent ones count 0)."""
        totals = dict.fromkeys(("cache_hits", "cache_misses", "pairs_truncated", "queries_truncated"), 0)
        node: object = reranker
        has_cache = False
        while node is not None:
            for name in totals:
                totals[name] += int(getattr(node, name, 0))
            has_cache = has_cache or hasattr(node, "cache_hits")
            node = getattr(node, "inner", None)
        return cls(**totals, has_cache=has_cache)

    def since(self, before: RerankCounts) -> RerankCounts:
        return RerankCounts(self.cache_hits - before.cache_hits, self.cache_misses - before.cache_misses,
                            self.pairs_truncated - before.pairs_truncated,
                            self.queries_truncated - before.queries_truncated, self.has_cache)


class QueryService:
    """Answers retrieval requests of any tenant from this process's cache (single-threaded)."""

    def __init__(self, settings: Settings, connection: redis.Redis, store: Store, encoder: Encoder,
                 reranker: Reranker | None, metrics: ServiceMetrics,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.settings = settings
        self.connection = connection
        self.store = store
        self.encoder = encoder
        self.reranker: Reranker | None = reranker
        self.rerank_cache: CachedReranker | None = None
        if reranker is not None and settings.rerank_cache_pairs > 0:
            self.rerank_cache = CachedReranker(reranker, max_entries=settings.rerank_cache_pairs)
            self.reranker = self.rerank_cache
        self.metrics = metrics
        self.clock = clock
        self.limits = limits_of(settings)
        self.config = retrieval_config(settings, rerank=reranker is not None)
        self.cache = TenantCache(encoder.dim, settings.max_cached_tenants, on_drop=self._drop_texts,
                                 max_bytes=settings.index_memory_bytes)
        self.version = current_version(encoder.dim)  # rendering and dimension this worker compares against
        self.count_tokens = token_counter(reranker)  # the cross-encoder's tokenizer counts packet budgets
        self.packets = PacketCache(settings.packet_cache_size)
        self.models = (f"{settings.bi_encoder}|{self.version}|"
                       f"{getattr(self.reranker, 'model_version', '') if reranker is not None else 'none'}")

    def handle_payload(self, payload: Any) -> dict[str, Any]:
        """Job entry: validate, answer, count; returns the JSON result (raises on invalid input).

        Every failure, a payload that is not a JSON object included, counts as an errored job.
        """
        try:
            if not isinstance(payload, dict):
                raise InvalidInputError(Reason.MALFORMED_MESSAGE, "payload", "must be a JSON object")
            request = schemas.RetrievalRequest.parse(payload, self.limits)
            result = self.answer(request)
        except Exception:
            self.metrics.query_job("error")
            raise
        return result.to_payload()

    def answer(self, request: schemas.RetrievalRequest) -> schemas.RetrievalResult:
        """Answer one validated request (the module docstring says how); reports the tenant cache's
        hits, misses, evictions and size to the metrics whatever the outcome."""
        started = self.clock()
        query_vector = self.encoder.encode([request.query])[0]
        encode_s = self.clock() - started
        refresh_started = self.clock()
        cache_before = dataclasses.replace(self.cache.stats)
        try:
            return self._answer(request, query_vector, started, encode_s, refresh_started)
        finally:
            self._report_cache(cache_before)

    def _answer(self, request: schemas.RetrievalRequest, query_vector: np.ndarray, started: float, encode_s: float,
                refresh_started: float) -> schemas.RetrievalResult:
        tenant_id = request.tenant_id
        with self.store.tenant(tenant_id, snapshot=True) as tx:
            try:
                tenant = require_tenant_version(tx, self.version)
            except EmbeddingVersionError:
                self.cache.evict(tenant_id)
                self.metrics.version_refusal("query")
                raise
            if tenant is None:
                self.cache.evict(tenant_id)
                return self._empty(request, started)
            version, suppression_version = tenant.memory_version, tenant.suppression_version
            key = PacketKey.of(request, version, tenant.forget_version, self.models)
            cached = None if key is None else self.packets.get(key)
            if key is not None:
                self.metrics.packet_cache(hit=cached is not None)
            if cached is not None:
                return self._cached(request, cached, started)
            state, refreshed = self.cache.refresh(tx, version, tenant.forget_version)
            clusters = TenantCache.load_clusters(tx, state, self.settings.clusters_k)
            cluster = None if clusters is None else clusters.assign(query_vector)
            table = None
            if cluster is not None and self.settings.suppression:
                table = SuppressionTable(tx.suppression_scores(cluster))
        refresh_s = self.clock() - refresh_started
        counts_before = RerankCounts.of(self.reranker)
        # scored through the tenant's scope of the score cache: a cached pair never answers for another tenant
        reranker = self.reranker if self.rerank_cache is None else self.rerank_cache.scoped(request.tenant_id)
        allowed = entry_filter(request)  # the request's restrictions, converted once for retrieval and packet
        # the knowledge time also anchors relative time expressions; without it they stay unresolved;
        # a packet request keeps the retrievers' unfiltered lists for its hidden candidates (no second search)
        core = retrieve(state.index, request.query, query_vector, k=request.k, config=self.config.for_k(request.k),
                        reranker=reranker, suppression=table, cluster=cluster,
                        outcome_id=request.request_id, clock=self.clock, reference_time=request.as_of,
                        allowed=allowed, unfiltered=key is not None)
        if core.outcome is not None:
            message = outcome_message(core.outcome, with_embedding=clusters is None,
                                      forget_version=tenant.forget_version)
            self.connection.xadd(self.settings.outcomes_stream, message.to_stream_fields())  # type: ignore[arg-type]
        t = core.timings
        # the metric's "dense" stage includes embedding the query; the payload also reports it apart
        stages = {"refresh": refresh_s, "bm25": t.bm25, "dense": t.dense + encode_s, "fusion": t.fusion,
                  "suppression": t.suppression, "rerank": t.rerank, "features": t.features,
                  "total": self.clock() - started,
                  "encode": encode_s}
        self.metrics.query_job("ok", stages, pool_size=core.pool_size, deep_pass=core.deep_pass, refreshed=refreshed)
        counts = RerankCounts.of(self.reranker).since(counts_before)
        self.metrics.query_rerank(cache_hits=counts.cache_hits, cache_misses=counts.cache_misses,
                                  pairs_truncated=counts.pairs_truncated, queries_truncated=counts.queries_truncated)
        packet = None
        if key is not None:
            packet_started = self.clock()
            packet = build_packet(state.index, request, allowed, core, self.settings, self.count_tokens)
            stages = {**stages, "packet": self.clock() - packet_started}  # after the metrics: not in their total
        result = result_message(core, request, stage_seconds=stages, memory_version=version,
                                suppression_version=suppression_version,
                                rerank_pairs_scored=counts.cache_misses if counts.has_cache else None,
                                rerank_pairs_cached=counts.cache_hits if counts.has_cache else None, packet=packet)
        if key is not None:
            self.packets.put(key, result)
        return result

    def _cached(self, request: schemas.RetrievalRequest, cached: schemas.RetrievalResult,
                started: float) -> schemas.RetrievalResult:
        """A packet request answered from the packet cache: the cached answer under this request's id
        (nothing retrieved, so no outcome is sent)."""
        stages = {"total": self.clock() - started}
        self.metrics.query_job("ok", stages)
        return dataclasses.replace(cached, request_id=request.request_id, stage_seconds=stages,
                                   rerank_pairs_scored=0, rerank_pairs_cached=0)

    def _report_cache(self, before: CacheStats) -> None:
        """Add the tenant cache's counts since ``before`` to the metrics; set its size gauges."""
        now = self.cache.stats
        self.metrics.tenant_cache(hits=now.hits - before.hits, misses=now.misses - before.misses,
                                  evictions=now.evictions - before.evictions, cached_bytes=self.cache.total_bytes,
                                  tenants=len(self.cache))

    def _drop_texts(self, old: TenantState, new: TenantState | None) -> None:
        """A tenant state was dropped: its texts the new state no longer holds leave the rerank cache
        (a forgotten turn's rendering must not outlive it, docs/architecture.md "Forget")."""
        if self.rerank_cache is not None:
            gone = old.rendered_texts() - (new.rendered_texts() if new is not None else set())
            self.rerank_cache.discard(gone, scope=old.index.tenant_id)  # never another tenant's pairs
        self.packets.discard_tenant(old.index.tenant_id)  # cached packets hold texts too

    def _empty(self, request: schemas.RetrievalRequest, started: float) -> schemas.RetrievalResult:
        """The answer for an unknown tenant: no hits and, when the request set ``budget_tokens``, an
        empty packet (never None: a caller reads ``result.packet`` whenever it asked for one)."""
        stages = {"total": self.clock() - started}
        self.metrics.query_job("ok", stages)
        packet = None if request.budget_tokens is None else Packet((), (), request.budget_tokens, 0)
        return schemas.RetrievalResult(request.request_id, request.tenant_id, (), 0, False, None, None, stages, 0,
                                       packet=packet)

    def warm_up(self) -> None:
        """Run the models once so the first job does not pay for lazy initialisation."""
        vector = self.encoder.encode(["warm up"])
        if self.reranker is not None:
            self.reranker.score("warm up", ["warm up"])
        assert np.isfinite(vector).all()


def bound_service(job: str = "retrieval_job") -> QueryService:
    """The :class:`QueryService` of the :class:`QueryWorker` running the current job (``job`` names the
    job function for the error). Raises OutsideQueryWorkerError when none is bound (e.g. a forking rq
    worker picked the job up)."""
    service = _SERVICE.get()
    if service is None:
        raise OutsideQueryWorkerError(f"{job} must run in a mnemos query worker (SimpleWorker)")
    return service


def retrieval_job(payload: dict[str, Any]) -> dict[str, Any]:
    """The rq job function (``workers.query.worker.retrieval_job``): runs inside a :class:`QueryWorker`.

    Raises OutsideQueryWorkerError when no service is bound (e.g. a forking rq worker picked it up),
    InvalidInputError for an invalid payload.
    """
    return bound_service().handle_payload(payload)


PUBSUB_POLL_S = 0.5  # read timeout of rq's command-channel thread: bounds how long a stopping worker joins it


class QueryWorker(SimpleWorker):
    """An rq SimpleWorker bound to a :class:`QueryService` (jobs run in this process, no fork).

    Beyond rq's loop it caps every job at ``job_timeout_s`` (a job enqueued without a timeout would
    otherwise get rq's 180 s), observes each job's queue wait and end-to-end time, and sweeps the
    queue's intermediate list at start and then every few seconds (:mod:`workers.query.intermediate`):
    stranded jobs go back in the queue, expired ones are counted.
    """

    def __init__(self, *args: Any, service: QueryService, liveness: Liveness | None = None,
                 clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        kwargs.setdefault("serializer", JSONSerializer)
        kwargs.setdefault("job_class", QueryJob)  # runs only the query worker's own jobs (workers.query.jobs)
        # read by rq's __init__ already (it sizes the connection's socket timeout from them)
        self._dequeue_timeout_s = service.settings.dequeue_wait_s
        self._socket_timeout_s = service.settings.redis_socket_timeout_s
        super().__init__(*args, **kwargs)
        self.service = service
        self.clock = clock
        self.stop_signalled = False  # SIGTERM/SIGINT seen: the process should end, not restart the loop
        self.drained = False  # the last dequeue found the queue empty (a burst's end, not a Redis timeout)
        settings = service.settings
        self.beats = Heartbeat(self.connection, settings, "query", self.name, metrics=service.metrics,
                               busy_s=settings.job_timeout_s, liveness=liveness,
                               info={"queue": settings.retrieval_queue, "shard": settings.shard,
                                     "rendering": service.version.rendering, "dim": service.version.dim})
        self._next_sweep = 0.0  # monotonic time of the next intermediate-list sweep

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        """rq's dequeue, remembering whether it found the queue empty (:attr:`drained`)."""
        result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        self.drained = result is None
        return result

    @property
    def dequeue_timeout(self) -> int:
        """Seconds one blocking dequeue waits: short enough that an idle worker renews its heartbeat."""
        return self._dequeue_timeout_s

    @property
    def connection_timeout(self) -> int:
        """rq raises the connection's socket timeout to this when lower: ours already exceeds the dequeue wait."""
        return int(self._socket_timeout_s)

    def subscribe(self) -> None:
        """rq's command channel (stop-job, shutdown), polled every ``PUBSUB_POLL_S`` seconds.

        rq 3 starts the listener thread with a 60 s read timeout, and since redis-py 8.2 the
        thread's ``stop`` joins it until that read returns: every worker (a SIGTERM'd one, a burst
        one) then waited up to 60 s in ``unsubscribe`` before it exited, past Kubernetes' grace
        period and past the ``failure_ttl`` of a failed job a test was about to read. A short
        read timeout bounds the exit at ``PUBSUB_POLL_S``; commands arrive as fast as before.
        """
        log.debug("worker %s: subscribing to %s", self.name, self.pubsub_channel_name)
        self.pubsub = self.connection.pubsub()
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(
            sleep_time=PUBSUB_POLL_S, daemon=True, exception_handler=self._pubsub_exception_handler)

    def bootstrap(self, *args: Any, **kwargs: Any) -> None:
        """rq's start-up (birth, heartbeat, command channel) with its SIGTERM/SIGINT handlers already
        installed: rq installs them only after it, so a worker stopped while it was starting (its
        heartbeat already published) died of the signal instead of exiting cleanly."""
        self._install_signal_handlers()
        super().bootstrap(*args, **kwargs)

    def register_birth(self) -> None:
        self.beats.idle()  # alive before rq lists it, so a client never sees a listed worker without a heartbeat
        super().register_birth()
        self.sweep_intermediate()

    def sweep_intermediate(self, *, force: bool = True) -> None:
        """Recover stranded jobs and count expired ones (:func:`workers.query.intermediate.sweep`); with
        ``force`` False at most every ``min(intermediate_grace_s, dequeue wait)`` seconds. Redis errors
        are logged: the next sweep retries."""
        settings = self.service.settings
        if not force and time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + min(settings.intermediate_grace_s, self.dequeue_timeout)
        for queue in self.queues:
            try:
                report = sweep(queue, grace_s=settings.intermediate_grace_s, clock=self.clock)
            except redis.RedisError as exc:
                log.warning("could not sweep %s: %s", queue.intermediate_queue_key, exc)
                continue
            self.service.metrics.jobs_expired(report.expired)
            self.service.metrics.jobs_recovered(len(report.requeued))

    def register_death(self) -> None:
        self.beats.stop()
        super().register_death()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """rq's own heartbeat (on every dequeue wait and after each job), plus ours."""
        super().heartbeat(timeout, pipeline)
        if pipeline is None:  # with a pipeline rq is preparing a job: execute_job beat busy already
            self.beats.idle()
            self.sweep_intermediate(force=False)

    def request_stop(self, signum: int, frame: Any) -> None:
        self.stop_signalled = True
        super().request_stop(signum, frame)

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """A request refused as invalid (:class:`~api.errors.InvalidInputError`: a raw job that
        bypassed the client's validation) is one WARNING line with its reason, not rq's ERROR line
        with the traceback, which says nothing about the worker; any other failure is logged by rq.
        Either way rq then records the failure on the job (``latest_result().exc_string`` holds
        the reason) and runs the registered exception handlers."""
        exc = exc_info[1] if len(exc_info) > 1 else None
        if not isinstance(exc, InvalidInputError):
            super().handle_exception(job, *exc_info)
            return
        log.warning("job %s refused: %s", job.id, " ".join(str(exc).split()))
        call_exception_handlers(self._exc_handlers, job, *exc_info)

    def handle_job_success(self, job: Job, queue: Queue, started_job_registry: Any, execution: Any) -> None:
        """rq's success handling (it stores the result), but the result of a tenant this shard is moving
        away or no longer serves is kept at most :data:`api.directory.MOVED_RESULT_TTL_S`: a job that
        ran across a move stores its answer after the move let the tenant's other results expire, and
        a forget made on the new shard cannot erase it here (break-it session, 2026-12-07)."""
        value, s = job._result, self.service.settings
        try:
            if isinstance(value, dict) and isinstance(value.get("tenant_id"), str) and marked(
                    self.connection, s.stream_prefix, s.shard, s.shards, value["tenant_id"]):
                ttl = job.get_result_ttl(self.default_result_ttl)
                job.result_ttl = MOVED_RESULT_TTL_S if ttl < 0 or ttl > MOVED_RESULT_TTL_S else ttl
        except redis.RedisError as exc:  # storing the result fails the same way: rq handles it there
            log.warning("could not read the tenant directory for job %s: %s", job.id, exc)
        super().handle_job_success(job, queue, started_job_registry, execution)

    def execute_job(self, job: Job, queue: Queue) -> None:
        self.beats.busy()
        limit = self.service.settings.job_timeout_s
        if job.timeout is None or job.timeout <= 0 or job.timeout > limit:  # rq: None = 180 s, -1 = never
            job.timeout = limit
        enqueued = _unix_s(job.enqueued_at)
        if enqueued is not None:
            self.service.metrics.job_timing(queue_wait_s=self.clock() - enqueued)
        token = _SERVICE.set(self.service)
        try:
            super().execute_job(job, queue)
        finally:
            _SERVICE.reset(token)
            if enqueued is not None:
                self.service.metrics.job_timing(end_to_end_s=self.clock() - enqueued)


def _unix_s(moment: datetime | None) -> float | None:
    """Unix seconds of an rq timestamp (rq writes UTC; a naive one is read as UTC)."""
    if moment is None:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def build_worker(settings: Settings, connection: redis.Redis, service: QueryService, name: str | None = None,
                 liveness: Liveness | None = None) -> QueryWorker:
    queue = Queue(settings.retrieval_queue, connection=connection, serializer=JSONSerializer, job_class=QueryJob)
    return QueryWorker([queue], connection=connection, service=service, name=name, liveness=liveness)
