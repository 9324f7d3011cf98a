"""Operating safely (issue "Operate it safely"): the job timeout in the worker, queue wait and expiry
measured, stranded jobs recovered, k honoured through the service, liveness of the loop itself, socket
and statement timeouts. Real Redis and Postgres, fake models; races are staged, never slept for."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from rq import Queue
from rq.exceptions import StopRequested
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from api.schemas import RetrievalRequest
from tests.integration.factories import client_for, ingest_turns, query_service, turn
from tests.support import JOB_TTLS, http_status, wait_until
from workers.launch.process import open_checked_store
from workers.query.intermediate import seen_key, sweep
from workers.query.worker import QueryWorker, retrieval_job
from workers.runtime.connections import redis_client as service_redis_client
from workers.runtime.errors import StoreError
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.liveness import Liveness
from workers.runtime.metrics import LIVENESS_PATH, ServiceMetrics, start_server
from workers.runtime.streams import StreamConsumer, run_consumer
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


class _Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _queue(settings: Settings, connection: redis.Redis) -> Queue:
    return Queue(settings.queue_name, connection=connection, serializer=JSONSerializer)


def _worker(settings: Settings, connection: redis.Redis, service: Any, cls: type[QueryWorker] = QueryWorker,
            **kwargs: Any) -> QueryWorker:
    return cls([_queue(settings, connection)], connection=connection, service=service,
               name=f"{settings.stream_prefix}-w{time.monotonic_ns()}", **kwargs)


def _sample(metrics: ServiceMetrics, name: str, labels: dict[str, str] | None = None) -> float | None:
    return metrics.registry.get_sample_value(name, labels or {})


def _payload(tenant: str = "alice", query: str = "grey cat", k: int = 3) -> dict[str, Any]:
    return RetrievalRequest(tenant, query, k=k).to_payload()


def _intermediate(queue: Queue) -> list[str]:
    return [i.decode() for i in queue.connection.lrange(queue.intermediate_queue_key, 0, -1)]


# --- the job timeout lives in the worker -----------------------------------------------------------------


def test_a_job_enqueued_without_a_timeout_is_stopped_at_the_workers_job_timeout(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    settings = settings.replace(job_timeout_s=1)
    service = query_service(settings, redis_client, store)
    service.handle_payload = lambda payload: time.sleep(4) or {}  # a job that would outlive the timeout
    job = _queue(settings, redis_client).enqueue(retrieval_job, _payload(), **JOB_TTLS)  # rq's default: 180 s
    assert job.timeout == 180
    _worker(settings, redis_client, service).work(burst=True)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "JobTimeoutException" in (job.latest_result().exc_string or "")


def test_queue_wait_and_end_to_end_time_are_measured_from_the_enqueue(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    service = query_service(settings, redis_client, store)
    job = _queue(settings, redis_client).enqueue(retrieval_job, _payload("nobody"), job_timeout=30, **JOB_TTLS)
    clock = _Clock(job.enqueued_at.timestamp() + 7.5)  # the job waited 7.5 s for a worker
    _worker(settings, redis_client, service, clock=clock).work(burst=True)
    assert job.get_status(refresh=True) == JobStatus.FINISHED
    metrics = service.metrics
    assert _sample(metrics, "mnemos_query_queue_wait_seconds_count") == 1
    assert _sample(metrics, "mnemos_query_queue_wait_seconds_sum") == pytest.approx(7.5)
    assert _sample(metrics, "mnemos_query_end_to_end_seconds_sum") == pytest.approx(7.5)
    assert _sample(metrics, "mnemos_query_queue_wait_seconds_bucket", {"le": "5.0"}) == 0


# --- stranded and expired jobs ------------------------------------------------------------------------------


class _StoppedAfterDequeue(QueryWorker):
    """SIGTERM lands between rq's dequeue (the id now in the intermediate list) and the job's start:
    rq's handler raises StopRequested in an idle worker, which is what this raises at that point."""

    def dequeue_job_and_maintain_ttl(self, timeout: int | None, max_idle_time: int | None = None) -> Any:
        result = super().dequeue_job_and_maintain_ttl(timeout, max_idle_time)
        assert result is not None, "the job was not dequeued"
        raise StopRequested()


def test_a_job_stranded_by_a_stop_between_dequeue_and_start_is_run_by_the_next_worker(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, [turn("alice", "a1", "I adopted a grey cat named Pixel")])
    service = query_service(settings, redis_client, store)
    queue = _queue(settings, redis_client)
    stopping = _worker(settings, redis_client, service, _StoppedAfterDequeue)
    stopping.beats.idle()  # the client asks only while a query worker is live
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(client_for(settings, redis_client).retrieve, "alice", "grey cat", k=3, timeout_s=20)
        wait_until(lambda: queue.count == 1 or answer.done(), what="the request in the queue")
        stopping.work(burst=True)
        [job_id] = _intermediate(queue)  # stranded: dequeued, never started, still queued
        assert queue.count == 0 and Job.fetch(job_id, connection=redis_client).get_status() == JobStatus.QUEUED
        clock = _Clock()
        _worker(settings, redis_client, service, clock=clock).work(burst=True)  # sees it, leaves it (grace)
        assert _intermediate(queue) == [job_id] and not answer.done()
        clock.now += settings.intermediate_grace_s
        _worker(settings, redis_client, service, clock=clock).work(burst=True)  # puts it back and runs it
        result = answer.result(timeout=60)
    assert [hit.turn_id for hit in result.hits] == ["a1"]
    assert _intermediate(queue) == [] and not redis_client.exists(seen_key(queue, job_id))
    assert _sample(service.metrics, "mnemos_query_jobs_recovered_total") == 1


def test_the_sweep_leaves_started_and_fresh_jobs_alone_and_moves_each_id_once(
        settings: Settings, redis_client: redis.Redis) -> None:
    queue = _queue(settings, redis_client)
    running = queue.enqueue(retrieval_job, _payload(), **JOB_TTLS)
    stranded = queue.enqueue(retrieval_job, _payload(query="other"), **JOB_TTLS)
    for _ in range(2):  # as rq's dequeue does
        redis_client.lmove(queue.key, queue.intermediate_queue_key, "LEFT", "RIGHT")
    # a live worker started it in between (rq keeps "<job id>:<execution id>" members)
    redis_client.zadd(queue.started_job_registry.key, {f"{running.id}:exec1": time.time() + 60})
    clock = _Clock()
    assert sweep(queue, grace_s=5.0, clock=clock).requeued == ()  # first sighting
    clock.now += 4.9
    assert sweep(queue, grace_s=5.0, clock=clock).requeued == ()  # within the grace: a worker may be starting it
    clock.now += 0.1
    first, second = sweep(queue, grace_s=5.0, clock=clock), sweep(queue, grace_s=5.0, clock=clock)
    assert (first.requeued, second.requeued) == ((stranded.id,), ())
    assert queue.get_job_ids() == [stranded.id] and _intermediate(queue) == [running.id]


def test_expired_and_abandoned_jobs_are_counted_once(settings: Settings, redis_client: redis.Redis,
                                                    store: PostgresStore) -> None:
    service = query_service(settings, redis_client, store)
    queue = _queue(settings, redis_client)
    expired = queue.enqueue(retrieval_job, _payload(), **JOB_TTLS)
    redis_client.delete(expired.key)  # its TTL ran out while it waited: rq skips such an id silently
    _worker(settings, redis_client, service).work(burst=True)  # dequeues the id, finds no job
    assert _intermediate(queue) == [expired.id]
    client = client_for(settings, redis_client)
    client.require_query_worker = False
    with pytest.raises(Exception, match="no result"):  # RetrievalTimeout: the client cancels its queued job
        client.retrieve("alice", "anything", timeout_s=0.5)
    worker = _worker(settings, redis_client, service)
    worker.sweep_intermediate()
    worker.sweep_intermediate()
    assert _sample(service.metrics, "mnemos_query_jobs_expired_total") == 2
    assert _intermediate(queue) == []


# --- k through the service ------------------------------------------------------------------------------------


def test_the_service_honours_k_for_every_k_up_to_max_k(settings: Settings, redis_client: redis.Redis,
                                                       store: PostgresStore) -> None:
    turns = [turn("alice", f"t{i}", f"note {i} on topic{i % 7} with item{i} and tag{i * 13}", session=f"s{i % 5}",
                  role="user" if i % 3 else "assistant", minutes=i) for i in range(45)]
    ingest_turns(settings, redis_client, store, turns, rounds=10)
    service = query_service(settings, redis_client, store)
    everyone = {t["turn_id"] for t in turns}
    assistants = {t["turn_id"] for t in turns if t["role"] == "assistant"}  # the brute-force count of a filter
    for k in range(1, settings.max_k + 1):
        hits = service.answer(RetrievalRequest("alice", "topic3 item5 note", k=k)).hits
        assert len(hits) == min(k, len(everyone)) and len({h.turn_id for h in hits}) == len(hits), k
        request = RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "topic3 note", "k": k,
                                          "filters": {"roles": ["assistant"]}}, service.limits)
        hits = service.answer(request).hits
        assert len(hits) == min(k, len(assistants)) and {h.turn_id for h in hits} <= assistants, k


# --- liveness follows the loop, not the metrics thread ------------------------------------------------------


def _status(port: int) -> int:
    return http_status(port, LIVENESS_PATH, timeout_s=5)


def test_liveness_fails_while_the_loop_is_stuck_and_recovers_after(settings: Settings,
                                                                   redis_client: redis.Redis) -> None:
    settings = settings.replace(heartbeat_ttl_s=1.5)
    metrics, liveness = ServiceMetrics(worker="ingest"), Liveness(settings.heartbeat_ttl_s)
    server = start_server(metrics, 0, liveness)
    port = server.server_port
    beat = Heartbeat(redis_client, settings, "ingest", "stuck", metrics=metrics, busy_s=0.5, liveness=liveness)
    consumer = StreamConsumer(redis_client, settings.turns_stream, "ingest", "stuck", batch_size=10, block_ms=100,
                              claim_idle_ms=60_000, claim_interval_s=60)
    release, stop = threading.Event(), threading.Event()

    def handle(batch: list) -> list[str]:
        release.wait(60)  # e.g. a Postgres call that never returns
        return [m.stream_id for m in batch]

    thread = threading.Thread(target=run_consumer, args=(consumer, handle, stop),
                              kwargs={"poison": lambda m, e: True, "heartbeat": beat})
    thread.start()
    try:
        wait_until(lambda: _status(port) == 200, what="liveness while the loop idles")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert b"mnemos_worker_heartbeat_timestamp_seconds" in response.read()  # the metrics stay where they were
        redis_client.xadd(settings.turns_stream, {"x": "1"})
        wait_until(lambda: _status(port) == 503, what="liveness to fail while the loop is stuck")
        release.set()
        wait_until(lambda: _status(port) == 200, what="liveness once the loop moves again")
    finally:
        release.set()
        stop.set()
        thread.join(30)
        server.shutdown()
        server.server_close()


# --- socket and statement timeouts ---------------------------------------------------------------------------


def test_an_idle_blocking_read_longer_than_redis_pys_default_timeout_is_quiet(
        settings: Settings, caplog: pytest.LogCaptureFixture) -> None:
    settings = settings.replace(block_ms=6000)  # redis-py 8 reads time out after 5 s by default
    connection = service_redis_client(settings)
    consumer = StreamConsumer(connection, settings.turns_stream, "ingest", "idle", batch_size=10,
                              block_ms=settings.block_ms, claim_idle_ms=60_000, claim_interval_s=60)
    consumer.ensure_group()
    consumer.read()  # replays its own (empty) pending list first
    stop = threading.Event()
    with caplog.at_level(logging.WARNING):
        started = time.monotonic()
        assert consumer.read() == []  # one idle read, blocked for the whole block time
        assert time.monotonic() - started >= 5.5, "the read must have blocked past redis-py's default timeout"
        stop.set()
    assert not [r for r in caplog.records if "Timeout" in r.getMessage()]
    connection.close()


def test_a_statement_over_the_timeout_is_cancelled_and_transient(settings: Settings) -> None:
    store = open_checked_store(settings.replace(db_statement_timeout_s=0.2), "suppression")
    try:
        with pytest.raises(StoreError) as caught, store.plain_tx() as conn:
            conn.execute("SELECT pg_sleep(3)")
        assert caught.value.transient and "statement timeout" in str(caught.value)
        with store.plain_tx() as conn:  # the connection is fine afterwards
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        store.close()
