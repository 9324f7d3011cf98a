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
