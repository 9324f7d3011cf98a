"""Process entry points of the three workers: load everything, then consume until told to stop.

Each ``run_*`` builds its clients and models from a :class:`Settings` value (models before the
first message or job), checks its database (:func:`open_checked_store`), serves its metrics port,
starts the stream/queue sampler, and returns an exit code: 2, with one log line, when it cannot
start (the database missing or not migrated, stored embeddings of another rendering or encoder
dimension than this worker's, a model that does not load, Postgres unreachable). SIGTERM and
SIGINT stop the stream workers after the current batch; rq handles them itself for the query
worker (warm shutdown after the current job). Every loop renews a heartbeat
(:mod:`workers.runtime.heartbeats`), which also keeps the process's :class:`~workers.runtime.liveness.Liveness`
(``GET /livez`` on the metrics port) passing while the loop advances.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Protocol

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from api import sharding
from workers.ingest import worker as ingest
from workers.runtime.connections import redis_client
from workers.runtime.errors import ModelSetupError, StoreError, StoreStateError
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.liveness import Liveness
from workers.runtime.metrics import ServiceMetrics, serve
from workers.runtime.models import limit_blas_threads, load_encoder, load_reranker, load_truncation_counter
from workers.runtime.redaction import redact_url
from workers.runtime.streams import StreamSampler, consumer_name
from workers.settings import Settings
from workers.store import PostgresStore, Store
from workers.store.state import EmbeddingVersion, check_store, current_version
from workers.suppression import worker as suppression

if TYPE_CHECKING:
    from workers.query.worker import QueryService

log = logging.getLogger(__name__)


def open_checked_store(settings: Settings, kind: str, version: EmbeddingVersion | None = None) -> PostgresStore:
    """The worker's store, once the database exists, is migrated and (with ``version``) holds only
    embeddings of that version.

    Raises DatabaseMissingError, SchemaOutdatedError, EmbeddingVersionError (StoreStateError: an
    operator must act) or StoreError (Postgres unreachable, with its reason).
    """
    log.info("%s worker: redis %s, postgres %s%s", kind, redact_url(settings.redis_url),
             redact_url(settings.database_url), "" if version is None else f", embeds {version}")
    store = PostgresStore(settings.database_url, settings.db_app_role,
                  statement_timeout_s=settings.db_statement_timeout_s).open()
    try:
        check_store(store, version)
    except BaseException:
        store.close()
        raise
    return store


def _metrics(settings: Settings, port: int, worker: str, connection: redis.Redis,
             liveness: Liveness) -> tuple[ServiceMetrics, StreamSampler]:
    metrics = ServiceMetrics(worker=worker)
    if settings.metrics_enabled:
        serve(metrics, port, worker, liveness, settings.metrics_host)
    streams = [(settings.turns_stream, ingest.GROUP), (settings.outcomes_stream, suppression.GROUP)]
    directory = (sharding.directory_key(settings.stream_prefix, settings.shard, settings.shards)
                 if settings.shards > 1 else None)
    sampler = StreamSampler(connection, metrics, streams, [settings.retrieval_queue],
                           settings.sample_interval_s, directory)
    return metrics, sampler.start()


def _stop_on_signals(stop: threading.Event) -> None:
    def handler(signum: int, _frame: FrameType | None) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


class _StreamWorker(Protocol):
    def run(self, stop: threading.Event, name: str | None = None, heartbeat: Heartbeat | None = None) -> None: ...


def _run_stream_worker(settings: Settings, kind: str, port: int,
                       build: Callable[[redis.Redis, Store, ServiceMetrics], _StreamWorker],
                       version: EmbeddingVersion | None = None, info: dict[str, object] | None = None) -> int:
    """Open and check the store, serve metrics, and run the worker ``build`` makes until SIGTERM/SIGINT."""
    limit_blas_threads(settings)
    try:
        store = open_checked_store(settings, kind, version)
    except (StoreError, StoreStateError) as exc:
        log.error("%s worker cannot start: %s", kind, exc)
        return 2
    connection = redis_client(settings)
    liveness = Liveness(settings.heartbeat_ttl_s)
    metrics, sampler = _metrics(settings, port, kind, connection, liveness)
    stop = threading.Event()
    _stop_on_signals(stop)
    name = consumer_name(kind)
    heartbeat = Heartbeat(connection, settings, kind, name, metrics=metrics, busy_s=settings.claim_idle_ms / 1000,
                          info={**(info or {}), "shard": settings.shard}, liveness=liveness)
    try:
        build(connection, store, metrics).run(stop, name=name, heartbeat=heartbeat)
    finally:
        heartbeat.stop()
        sampler.stop()
        store.close()
    return 0


def run_ingest(settings: Settings) -> int:
    try:
        encoder = load_encoder(settings)
        truncation = load_truncation_counter(settings)
    except ModelSetupError as exc:
        log.error("ingest worker cannot start: %s", exc)
        return 2
    version = current_version(encoder.dim)
    return _run_stream_worker(
        settings, "ingest", settings.ingest_metrics_port,
        lambda connection, store, metrics: ingest.IngestWorker(settings, connection, store, encoder, truncation,
                                                               metrics),
        version, {"rendering": version.rendering, "dim": version.dim})


def run_suppression(settings: Settings) -> int:
    def build(connection: redis.Redis, store: Store, metrics: ServiceMetrics) -> suppression.SuppressionWorker:
        worker = suppression.SuppressionWorker(settings, connection, store, metrics)
        worker.warm_up()
        return worker

    return _run_stream_worker(settings, "suppression", settings.suppression_metrics_port, build)


class _WorkLoopEnded(Exception):
    """rq's work loop ended, or lost Redis, without a stop request, after running ``ran_s`` seconds:
    :func:`run_query` starts a fresh rq worker. Never leaves this module."""

    def __init__(self, ran_s: float) -> None:
        super().__init__(f"rq work loop ended without a stop request after {ran_s:.1f}s")
        self.ran_s = ran_s


class _RestartBackoff(ExponentialBackoff):
    """The wait before a fresh rq worker starts: 0.5 s after the first end, twice as long after each
    next one, up to ``cap`` seconds, and 0.5 s again after a worker that had run fine for
    ``HEALTHY_S`` seconds (a new outage, not the same one going on)."""

    HEALTHY_S = 60.0

    def __init__(self, cap: float) -> None:
        super().__init__(cap=cap, base=0.25)
        self._failures_before = 0  # the ends counted before the last worker that had run fine

    def compute(self, failures: int) -> float:
        return super().compute(failures - self._failures_before)

    def ended(self, exc: Exception, failures: int) -> None:
        """Retry's failure handler: count from here when the worker had run fine, and log the wait."""
        if isinstance(exc, _WorkLoopEnded) and exc.ran_s > self.HEALTHY_S:
            self._failures_before = failures - 1
        log.warning("rq work loop ended without a stop request (Redis lost?); restarting it in %.1fs",
                    self.compute(failures))


def run_query(settings: Settings, *, burst: bool = False, max_backoff_s: float = 5.0,
              rq_log_level: str = "WARNING") -> int:
    """Take retrieval jobs until SIGTERM/SIGINT (or, with ``burst``, until the queue is empty); 0,
    or 2 when it cannot start, or 1 when a burst ended before the queue was empty (Redis lost or
    timed out).

    rq's own loggers (``rq.worker``, ``rq.job``) log at ``rq_log_level``: at INFO they write two
    lines per job, which drowns everything else in a benchmark of thousands of questions.

    rq's work loop quits on any unhandled error, a lost Redis connection included; the worker then
    starts a fresh rq worker around the same :class:`QueryService` (models and tenant indexes stay
    loaded) after a backoff, as the stream workers do, instead of exiting.
    """
    from rq.exceptions import StopRequested

    from workers.query.worker import QueryService

    limit_blas_threads(settings)
    try:
        encoder = load_encoder(settings)
        reranker = load_reranker(settings)
        store = open_checked_store(settings, "query", current_version(encoder.dim))
    except (ModelSetupError, StoreError, StoreStateError) as exc:
        log.error("query worker cannot start: %s", exc)
        return 2
    connection = redis_client(settings)
    liveness = Liveness(settings.heartbeat_ttl_s)
    metrics, sampler = _metrics(settings, settings.query_metrics_port, "query", connection, liveness)
    service = QueryService(settings, connection, store, encoder, reranker, metrics)
    service.warm_up()
    backoff = _RestartBackoff(max_backoff_s)
    retry = Retry(backoff, retries=-1, supported_errors=(_WorkLoopEnded,))
    try:
        retry.call_with_retry(
            lambda: _take_jobs(settings, connection, service, liveness, burst=burst, rq_log_level=rq_log_level),
            backoff.ended, with_failure_count=True)
    except StopRequested:  # SIGTERM/SIGINT while waiting to restart (rq's handlers stay installed)
        pass
    except _BurstFailed as exc:
        log.error("query worker (burst): %s", exc)
        return 1
    finally:
        sampler.stop()
        store.close()
    return 0


class _BurstFailed(Exception):
    """A burst (``--burst``) that could not run until the queue was empty."""


def _take_jobs(settings: Settings, connection: redis.Redis, service: QueryService, liveness: Liveness, *,
               burst: bool, rq_log_level: str) -> None:
    """Run one rq worker around ``service`` until it stops; raises :class:`_WorkLoopEnded` when its
    work loop ended, or lost Redis, without a stop request (in ``burst`` mode the end is the stop)."""
    from rq.exceptions import StopRequested

    from workers.query.worker import build_worker

    began = time.monotonic()
    liveness.extend(settings.heartbeat_ttl_s)  # starting (again) is progress: the worker beats from here on
    try:
        worker = build_worker(settings, connection, service, liveness=liveness)
        log.info("query worker %s taking jobs from queue %s", worker.name, settings.retrieval_queue)
        worker.work(burst=burst, with_scheduler=False, logging_level=rq_log_level)
        if burst and not (worker.drained or worker.stop_signalled):  # rq quits its loop on a Redis timeout too
            raise _BurstFailed("the work loop ended before the queue was empty (a Redis timeout or an error: "
                               "see the log above)")
        stopped = burst or worker.stop_signalled
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        if burst:  # the queue was not emptied: the burst failed, it did not end
            raise _BurstFailed(f"lost Redis before the queue was empty: {exc}") from exc
        log.warning("query worker lost Redis: %s", exc)
        stopped = False
    except StopRequested:  # SIGTERM/SIGINT outside a job (rq's handlers are installed)
        stopped = True
    if not stopped:
        raise _WorkLoopEnded(time.monotonic() - began)
