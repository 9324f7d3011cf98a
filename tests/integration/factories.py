"""Builders shared by the integration tests (fake models, fresh metrics, a client)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeVar

import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.client import MnemosClient
from api.validation import limits_of
from workers.ingest.worker import IngestWorker
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.models import TruncationCounter, load_encoder, load_truncation_counter
from workers.settings import Settings
from workers.store import PostgresStore

if TYPE_CHECKING:
    from mnemos.rerank import Reranker
    from workers.query.worker import QueryService
    from workers.suppression.worker import SuppressionWorker

BASE_TIME = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
T = TypeVar("T")


def client_for(settings: Settings, connection: redis.Redis) -> MnemosClient:
    return MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                        limits=limits_of(settings), retrieve_timeout_s=settings.retrieve_timeout_s)


def sharded_client(settings: Settings, **options: Any) -> MnemosClient:
    """A client of every shard of ``settings`` (one Redis client per shard, from its shard map)."""
    from workers.runtime.connections import redis_client

    connections = [redis_client(settings.for_shard(s)) for s in range(settings.shards)]
    return MnemosClient(connections, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                        limits=limits_of(settings), retrieve_timeout_s=settings.retrieve_timeout_s,
                        shards=settings.shards, **options)


def retrieve_on_shard(client: MnemosClient, tenant: str, service: Any, query: str = "cello teacher",
                      k: int = 3) -> list[str]:
    """``client.retrieve`` in a thread, answered by a burst of a query worker of ``service`` (the
    tenant's shard's); returns the hits' turn ids."""
    from workers.query.worker import build_worker

    connection = client.connection_of(tenant)
    worker = build_worker(service.settings, connection, service, name=f"q-{tenant}-{time.monotonic_ns()}")
    worker.beats.idle()
    queue = client.queue_of(tenant)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(client.retrieve, tenant, query, k)
        deadline = time.monotonic() + 10.0
        while queue.count == 0 and not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.work(burst=True)
        return [hit.turn_id for hit in future.result(timeout=15).hits]


def ingest_worker(settings: Settings, connection: redis.Redis, store: PostgresStore,
                  truncation: TruncationCounter | None = None) -> IngestWorker:
    """An ingest worker with the settings' encoder and, unless given, its window (as `mnemos worker ingest`)."""
    return IngestWorker(settings, connection, store, load_encoder(settings),
                        truncation or load_truncation_counter(settings), ServiceMetrics())


def turn(tenant: str, turn_id: str, text: str, *, session: str = "s1", role: str = "user",
         minutes: int = 0, **extra: Any) -> dict[str, Any]:
    """A valid turn as a client would pass it (``extra`` overrides or adds fields)."""
    return {"tenant_id": tenant, "session_id": session, "turn_id": turn_id, "role": role, "text": text,
            "occurred_at": (BASE_TIME + timedelta(minutes=minutes)).isoformat(), **extra}


def drain(worker: IngestWorker, name: str = "c1", rounds: int = 5) -> int:
    """Read and handle batches until the stream has nothing new; returns the messages handled."""
    consumer = worker.consumer(name)
    consumer.ensure_group()
    handled = 0
    for _ in range(rounds):
        batch = consumer.read()
        if not batch:
            break
        consumer.ack(worker.handle(batch))
        handled += len(batch)
    return handled


def drain_shard(settings: Settings, client: MnemosClient, shard: int, name: str = "c1") -> int:
    """:func:`drain` with a fresh ingest worker of ``settings``'s shard ``shard`` (its own Redis and
    Postgres); returns the messages handled."""
    own = settings.for_shard(shard)
    with PostgresStore(own.database_url, own.db_app_role) as store:
        return drain(ingest_worker(own, client.connections[shard], store), name)


def ingest_turns(settings: Settings, connection: redis.Redis, store: PostgresStore, turns: list[dict[str, Any]],
                 rounds: int = 5) -> int:
    """Publish ``turns`` and store them with a fresh in-process ingest worker (:func:`drain`); returns
    the messages handled."""
    client_for(settings, connection).publish_turns(turns)
    return drain(ingest_worker(settings, connection, store), rounds=rounds)


def query_service(settings: Settings, connection: redis.Redis, store: PostgresStore,
                  reranker: Reranker | None | str = "settings") -> QueryService:
    """A query service with the settings' encoder and, unless given, their reranker (``None``: none)."""
    from workers.query.worker import QueryService
    from workers.runtime.models import load_reranker

    chosen = load_reranker(settings) if reranker == "settings" else reranker
    return QueryService(settings, connection, store, load_encoder(settings), chosen,  # type: ignore[arg-type]
                        ServiceMetrics())


def suppression_worker(settings: Settings, connection: redis.Redis, store: PostgresStore) -> SuppressionWorker:
    from workers.suppression.worker import SuppressionWorker

    return SuppressionWorker(settings, connection, store, ServiceMetrics())


CONVERSATION = [
    ("s1", "user", "I adopted a grey cat named Pixel last spring"),
    ("s1", "assistant", "Pixel sounds lovely, how old is she"),
    ("s1", "user", "She is two years old and loves the balcony"),
    ("s2", "user", "My brother Tomas moved to Porto for a job at a bakery"),
    ("s2", "assistant", "Porto is a good city for bakers"),
    ("s2", "user", "He bakes sourdough bread every morning at five"),
    ("s3", "user", "I started learning the cello in January"),
    ("s3", "user", "My cello teacher is called Ines and she is strict"),
]


def conversation_turns(tenant: str, prefix: str = "t") -> list[dict[str, object]]:
    return [turn(tenant, f"{prefix}{i}", text, session=session, role=role, minutes=i)
            for i, (session, role, text) in enumerate(CONVERSATION)]


def answered_by_worker(settings: Settings, connection: redis.Redis, service: Any, call: Callable[..., T],
                       *args: Any, **kwargs: Any) -> T:
    """``call(*args, **kwargs)`` (which enqueues one retrieval and waits) answered by a burst of the
    real query worker; ``call`` runs in a thread because the rq worker must own the main thread."""
    from workers.query.worker import build_worker

    queue = Queue(settings.queue_name, connection=connection, serializer=JSONSerializer)
    worker = build_worker(settings, connection, service, name=f"{settings.stream_prefix}-w{time.monotonic_ns()}")
    worker.beats.idle()  # the client refuses at once when no query worker has a live heartbeat
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(call, *args, **kwargs)
        deadline = time.monotonic() + 10.0
        while queue.count == 0 and not future.done() and time.monotonic() < deadline:
            time.sleep(0.01)
        worker.work(burst=True)
        return future.result(timeout=15)
