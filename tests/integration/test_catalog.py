"""Catalog reads (a tenant's sessions, its turns by id) through the real query worker, and the
client's view of the ingest group's acknowledgements, against the real Redis and Postgres."""

from __future__ import annotations

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.catalog import CATALOG_JOB, CatalogKind, CatalogRequest
from api.client import INGEST_GROUP
from api.errors import InvalidInputError
from tests.integration import factories
from tests.support import JOB_TTLS
from workers.ingest.worker import GROUP
from workers.query.catalog import answer_catalog
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def test_the_client_names_the_ingest_workers_group() -> None:
    assert INGEST_GROUP == GROUP


def test_sessions_and_turns_of_one_tenant_only(settings: Settings, redis_client: redis.Redis,
                                               store: PostgresStore) -> None:
    client = factories.client_for(settings, redis_client)
    client.publish_turns(factories.conversation_turns("alice", "a") + factories.conversation_turns("bob", "b")
                         + [factories.turn("bob", "b-only", "a session alice never had", session="s9")])
    factories.drain(factories.ingest_worker(settings, redis_client, store))
    service = factories.query_service(settings, redis_client, store)
    sessions = factories.answered_by_worker(settings, redis_client, service, client.sessions, "alice")
    assert [(s.session_id, s.turns) for s in sessions] == [("s1", 3), ("s2", 3), ("s3", 2)]
    assert sessions[0].first_at == factories.BASE_TIME and sessions[0].last_at.minute == 2
    assert sessions[2].first_at.tzinfo is not None
    turns = factories.answered_by_worker(settings, redis_client, service, client.turns, "alice",
                                         ["a3", "b-only", "a0", "nope"])
    assert [(t.turn_id, t.session_id, t.role) for t in turns] == [("a3", "s2", "user"), ("a0", "s1", "user")]
    assert turns[1].text == "I adopted a grey cat named Pixel last spring"
    # another tenant's ids name nothing; an unknown tenant has nothing
    assert answer_catalog(store, CatalogRequest("alice", CatalogKind.TURNS, "r1", ("b0", "b1"))).turns == ()
    assert answer_catalog(store, CatalogRequest("nobody", CatalogKind.SESSIONS, "r2")).sessions == ()


def test_bad_catalog_requests_are_refused_before_and_after_the_queue(settings: Settings, redis_client: redis.Redis,
                                                                     store: PostgresStore) -> None:
    client = factories.client_for(settings, redis_client)
    with pytest.raises(InvalidInputError, match="turn_ids"):
        client.turns("alice", [])
    with pytest.raises(InvalidInputError, match="kind"):
        CatalogRequest.parse({"v": 1, "tenant_id": "alice", "kind": "everything"}, client.limits)
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    service = factories.query_service(settings, redis_client, store)
    job = queue.enqueue(CATALOG_JOB, {"v": 1, "tenant_id": "alice", "kind": "sessions", "turn_ids": ["x"]},
                        **JOB_TTLS)
    from workers.query.worker import build_worker

    worker = build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-catalog")
    worker.work(burst=True)
    result = job.latest_result()
    assert result is not None and "turn_ids" in (result.exc_string or "")
    assert service.metrics.query_catalog_jobs.labels(status="error")._value.get() == 1


def test_acknowledged_follows_the_ingest_groups_commit(settings: Settings, redis_client: redis.Redis,
                                                       store: PostgresStore) -> None:
    client = factories.client_for(settings, redis_client)
    stream_id = client.publish_turn(factories.turn("alice", "t1", "the first turn"))
    assert not client.acknowledged("alice", stream_id)  # no group yet
    worker = factories.ingest_worker(settings, redis_client, store)
    consumer = worker.consumer("c1")
    consumer.ensure_group()
    assert not client.acknowledged("alice", stream_id)
    batch = consumer.read()
    assert not client.acknowledged("alice", stream_id)  # delivered, pending
    consumer.ack(worker.handle(batch))
    assert client.acknowledged("alice", stream_id)
    later = client.forget("alice", turn_ids=["t1"])
    assert not client.wait_acknowledged("alice", later, timeout_s=0.05)
    factories.drain(worker)
    assert client.wait_acknowledged("alice", later, timeout_s=5.0)
