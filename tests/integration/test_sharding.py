"""Two shards on the local Redis and Postgres (fake encoder and reranker; docs/scaling.md).

Each tenant's turns go to its shard's turns stream and are ingested by that shard's ingest worker;
its retrievals go to its shard's rq queue and are answered by that shard's query worker (whose
tenant cache then holds its tenants only); its outcomes go to its shard's outcomes stream, read by
that shard's suppression worker. Growing from two shards to three moves only the tenants the ring
gives the new shard, and every turn published before and after the change is stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from api import sharding
from api.client import MnemosClient
from api.schemas import Outcome
from api.validation import limits_of
from bench.faults.shards import shard_tenants
from tests.integration.factories import (
    conversation_turns,
    drain,
    ingest_worker,
    query_service,
    suppression_worker,
)
from tests.support import delete_queue_jobs
from workers.query.worker import QueryService, build_worker
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    return {"shards": 2}


@pytest.fixture(autouse=True)
def _shard_jobs(settings: Settings, redis_client: redis.Redis) -> Iterator[None]:
    yield  # the settings fixture deletes the jobs of the unsharded queue name only
    for shard in range(3):
        delete_queue_jobs(redis_client, sharding.queue_name(settings.queue_name, shard, 3))


def _client(settings: Settings, connection: redis.Redis, shards: int) -> MnemosClient:
    return MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                        limits=limits_of(settings), retrieve_timeout_s=settings.retrieve_timeout_s, shards=shards)



def _tenants_in(connection: redis.Redis, stream: str) -> set[str]:
    return {fields[b"tenant_id"].decode() for _, fields in connection.xrange(stream)}


def _retrieve_through(client: MnemosClient, tenant: str, services: dict[int, QueryService],
                      connection: redis.Redis) -> list[str]:
    """``client.retrieve`` in a thread; a query worker of every shard takes a burst (the tenant's last)."""
    workers = {shard: build_worker(service.settings, connection, service,
                                   name=f"{service.settings.stream_prefix}-q{shard}-{time.monotonic_ns()}")
               for shard, service in services.items()}
    for worker in workers.values():
        worker.beats.idle()  # the client asks for a live query worker of the tenant's queue
    queue = client.queue_of(tenant)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.retrieve, tenant, "cello teacher", 3)
        deadline = time.monotonic() + 10.0
        while queue.count == 0 and not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        own = client.shard_of(tenant)
        for shard in sorted(workers, key=lambda s: s == own):  # the other shards' workers first: nothing for them
            workers[shard].work(burst=True)
        return [hit.turn_id for hit in future.result(timeout=15).hits]


def test_each_tenant_is_served_by_its_shard_s_workers(settings: Settings, redis_client: redis.Redis,
                                                      store: PostgresStore) -> None:
    by_shard = shard_tenants(per_shard=2, shards=2)
    client = _client(settings, redis_client, shards=2)
    turns = [t for pair in zip(*(conversation_turns(x, f"{x}-") for x in by_shard[0] + by_shard[1]), strict=True)
             for t in pair]  # tenants interleaved, as a real mix arrives
    client.publish_turns(turns)
    shard_settings = {shard: settings.replace(shard=shard) for shard in (0, 1)}
    for shard, own in shard_settings.items():
        assert _tenants_in(redis_client, own.turns_stream) == set(by_shard[shard])
        worker = ingest_worker(own, redis_client, store)
        assert drain(worker, name=f"ingest-{shard}") == 16
        assert worker.metrics.ingest_turns_indexed._value.get() == 16
    services = {shard: query_service(own, redis_client, store) for shard, own in shard_settings.items()}
    for tenant in by_shard[0] + by_shard[1]:
        hits = _retrieve_through(client, tenant, services, redis_client)
        assert hits and all(h.startswith(f"{tenant}-") for h in hits)
    for shard, own in shard_settings.items():
        assert sorted(services[shard].cache.tenants()) == sorted(by_shard[shard])
        consumer = suppression_worker(own, redis_client, store).consumer(f"suppression-{shard}")
        consumer.ensure_group()
        outcomes = [Outcome.from_stream_fields(m.fields) for m in consumer.read()]
        assert sorted(o.tenant_id for o in outcomes) == sorted(by_shard[shard])


def test_adding_a_shard_moves_only_its_tenants_and_loses_no_turn(settings: Settings, redis_client: redis.Redis,
                                                                 store: PostgresStore) -> None:
    tenants = [f"tenant-{n}" for n in range(12)]
    before, after = _client(settings, redis_client, shards=2), _client(settings, redis_client, shards=3)
    moved = [t for t in tenants if before.shard_of(t) != after.shard_of(t)]
    assert moved and {after.shard_of(t) for t in moved} == {2}  # only to the new shard
    turns = {t: conversation_turns(t, f"{t}-") for t in tenants}
    before.publish_turns([turn for t in tenants for turn in turns[t][:4]])
    after.publish_turns([turn for t in tenants for turn in turns[t][4:]])  # the change happens mid-conversation
    grown = settings.replace(shards=3)
    assert [grown.replace(shard=s).turns_stream for s in (0, 1)] == [settings.replace(shard=s).turns_stream
                                                                     for s in (0, 1)]
    assert _tenants_in(redis_client, grown.replace(shard=2).turns_stream) == set(moved)
    for shard in range(3):  # the old shards' workers drain what was published before the change
        drain(ingest_worker(grown.replace(shard=shard), redis_client, store), name=f"ingest-{shard}")
    for tenant in tenants:
        with store.tenant(tenant, snapshot=True) as tx:
            assert sorted(r.turn_id for r in tx.entries_after(0)) == sorted(str(t["turn_id"]) for t in turns[tenant])
