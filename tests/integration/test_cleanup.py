"""The service fixtures leave no rq job of a test behind (rq keys jobs by id, not by queue name)."""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from api.errors import RetrievalTimeout
from api.schemas import RetrievalRequest
from tests.integration.factories import client_for, query_service
from tests.support import delete_test_keys
from workers.query.worker import build_worker
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.metrics import ServiceMetrics
from workers.settings import Settings
from workers.store import PostgresStore


def _jobs_with_origin(client: redis.Redis, queue_name: str) -> list[bytes]:
    prefix = Job.redis_job_namespace_prefix.encode()
    return [key for key in client.scan_iter(match=prefix + b"*", count=1000)
            if b":" not in key[len(prefix):] and client.hget(key, "origin") == queue_name.encode()]


def test_teardown_deletes_every_job_and_result_of_the_test_queue(settings: Settings, redis_client: redis.Redis,
                                                                 store: PostgresStore) -> None:
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    # rq's default ttls (a failed job is kept one year), as a careless raw enqueue would leave them
    done = queue.enqueue("workers.query.worker.retrieval_job", RetrievalRequest("alice", "cat", k=1).to_payload())
    failed = queue.enqueue("workers.query.worker.retrieval_job", {"v": 99, "tenant_id": "alice", "query": "q"})
    build_worker(settings, redis_client, query_service(settings, redis_client, store),
                 name=f"{settings.stream_prefix}-w").work(burst=True)
    assert failed.get_status() == "failed" and done.latest_result() is not None
    queued = queue.enqueue("workers.query.worker.retrieval_job", {"v": 1, "tenant_id": "alice", "query": "never run"})
    Heartbeat(redis_client, settings, "query", "silent", metrics=ServiceMetrics(),
              info={"queue": settings.queue_name}).idle()  # live, but takes no job
    with pytest.raises(RetrievalTimeout):  # its job is canceled
        client_for(settings, redis_client).retrieve("alice", "nobody answers", timeout_s=0.5)
    assert len(_jobs_with_origin(redis_client, settings.queue_name)) == 4

    delete_test_keys(redis_client, settings)

    assert _jobs_with_origin(redis_client, settings.queue_name) == []
    for job in (done, failed, queued):
        assert not redis_client.exists(Job.key_for(job.id), Result.get_key(job.id))
    assert not list(redis_client.scan_iter(match=f"*{settings.stream_prefix}*"))


def _database_exists(url: str) -> bool:
    import psycopg

    from tests.support import PG_ADMIN_URL

    name = psycopg.conninfo.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as admin:
        return admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def test_a_run_that_fails_with_redis_down_still_drops_its_database(settings: Settings) -> None:
    """New-user trial (2026-12-08): the cleanup read Redis first, so with Redis down it raised again
    and every failed run left a database ``mnemos_bench_<stamp>`` behind."""
    from bench.common.harness import isolated_settings, run_stamp, running_service

    run = isolated_settings(settings, stamp=run_stamp(), redis_url="redis://127.0.0.1:1/0")
    with (pytest.raises(RuntimeError, match="the run's own failure"),  # the cause, not a cleanup error
          running_service(run, kinds=())):
        assert _database_exists(run.database_url)
        raise RuntimeError("the run's own failure")
    assert not _database_exists(run.database_url)


def test_a_worker_that_exits_at_start_ends_the_wait_at_once(settings: Settings, tmp_path) -> None:
    """New-user trial: a wrong reranker directory made ``make run`` wait 300 s for a query worker
    that had already exited."""
    import time

    import click

    from bench.common.harness import isolated_settings, run_stamp, running_service

    run = isolated_settings(settings, stamp=run_stamp(), cross_encoder=str(tmp_path / "no-such-model"),
                            metrics_enabled=False)
    started = time.monotonic()
    with (pytest.raises(click.ClickException, match="the query worker exited with status 2 before it listened"),
          running_service(run, kinds=("query",), ready_timeout_s=600)):
        pass
    assert time.monotonic() - started < 300  # well before the wait's own limit
    assert not _database_exists(run.database_url)


def test_deleting_a_queue_removes_its_name_from_rqs_set_of_queues(settings: Settings,
                                                                 redis_client: redis.Redis) -> None:
    from bench.common.queue_cleanup import delete_queue

    queue = Queue(settings.queue_name, connection=redis_client)
    queue.enqueue("builtins.len", "abc")
    assert queue.key.encode() in redis_client.smembers(Queue.redis_queues_keys)
    delete_queue(redis_client, settings.queue_name)
    assert queue.key.encode() not in redis_client.smembers(Queue.redis_queues_keys)
