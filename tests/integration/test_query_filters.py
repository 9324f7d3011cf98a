"""Retrieval requests with ``as_of`` and ``filters`` through the real query worker (fake models).

The client sends the request through rq (in a thread, since the rq worker must own the main
thread for its signal handlers); the worker answers it from Postgres-backed indexes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.errors import InvalidInputError, Reason, RetrievalFailed
from api.schemas import Outcome, RetrievalRequest, RetrievalResult
from tests.integration.factories import (
    BASE_TIME,
    answered_by_worker,
    client_for,
    conversation_turns,
    ingest_turns,
    query_service,
    turn,
)
from tests.support import JOB_TTLS
from workers.query.worker import QueryService, build_worker
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

KYOTO = "We booked a trip to Kyoto in October"


def _through_the_queue(settings: Settings, connection: redis.Redis, service: QueryService,
                       *args: Any, **kwargs: Any) -> RetrievalResult:
    """``client.retrieve(*args, **kwargs)`` answered by a burst of the real query worker."""
    return answered_by_worker(settings, connection, service, client_for(settings, connection).retrieve,
                              *args, timeout_s=10.0, **kwargs)


def _outcome_entry_ids(connection: redis.Redis, settings: Settings) -> list[set[int]]:
    return [{row.entry_id for row in Outcome.from_stream_fields(fields).pool}
            for _, fields in connection.xrange(settings.outcomes_stream)]


def test_as_of_hides_later_turns_and_a_session_filter_keeps_one_session(settings: Settings,
                                                                        redis_client: redis.Redis,
                                                                        store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a")
                 + [turn("alice", "kyoto", KYOTO, session="s4", minutes=99)])
    service = query_service(settings, redis_client, store)

    now = _through_the_queue(settings, redis_client, service, "alice", "trip Kyoto", k=3)
    assert now.hits[0].turn_id == "kyoto"
    kyoto_entry = now.hits[0].entry_id

    as_of = BASE_TIME + timedelta(minutes=50)
    before = _through_the_queue(settings, redis_client, service, "alice", "trip Kyoto", k=10,
                                as_of=as_of.isoformat())
    assert before.hits and "kyoto" not in {h.turn_id for h in before.hits}
    assert all(h.occurred_at <= as_of for h in before.hits)
    assert kyoto_entry not in _outcome_entry_ids(redis_client, settings)[-1]  # never pooled, so never suppressed

    s2 = _through_the_queue(settings, redis_client, service, "alice", "cat Pixel cello", k=10,
                            filters={"session_ids": ["s2"]})
    assert sorted(h.turn_id for h in s2.hits) == ["a3", "a4", "a5"]  # every s2 turn, and nothing else
    assert _outcome_entry_ids(redis_client, settings)[-1] == {h.entry_id for h in s2.hits}

    both = _through_the_queue(settings, redis_client, service, "alice", "Porto bakery", k=10,
                              as_of=BASE_TIME + timedelta(minutes=4),
                              filters={"session_ids": ["s2", "s4"], "roles": ["assistant"],
                                       "occurred_after": (BASE_TIME + timedelta(minutes=1)).isoformat()})
    assert [h.turn_id for h in both.hits] == ["a4"]

    nothing = _through_the_queue(settings, redis_client, service, "alice", "trip Kyoto", k=10,
                                 as_of=BASE_TIME - timedelta(days=1))
    assert nothing.hits == () and nothing.pool_size == 0
    assert len(redis_client.xrange(settings.outcomes_stream)) == 4  # the empty request sent no outcome


def test_a_deduplicated_turn_lets_its_canonical_entry_through(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))
    ingest_turns(settings, redis_client, store, [turn("alice", "dup", "I adopted a grey cat named Pixel last spring",
                                                      session="s9", minutes=500)])
    # the same words from another speaker are another memory (dedupe never aliases across speakers)
    ingest_turns(settings, redis_client, store, [turn("alice", "echo", "I adopted a grey cat named Pixel last spring",
                                                      session="s8", role="assistant", minutes=300)])
    service = query_service(settings, redis_client, store)
    for filters in ({"session_ids": ["s9"]}, {"session_ids": ["s9"], "roles": ["user"]},
                    {"occurred_after": (BASE_TIME + timedelta(minutes=400)).isoformat()}):
        result = service.answer(RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "grey cat",
                                                        "filters": filters}))
        # the hit is the canonical entry shown as the alias that matched; the refused canonical turn is not named
        assert [(h.turn_id, h.session_id, h.role, h.aliases) for h in result.hits] == [("dup", "s9", "user", ())]
        assert result.hits[0].occurred_at == BASE_TIME + timedelta(minutes=500)
        assert result.hits[0].text == "I adopted a grey cat named Pixel last spring"
    alias_roles_only = service.answer(RetrievalRequest.parse(
        {"v": 1, "tenant_id": "alice", "query": "grey cat",
         "filters": {"session_ids": ["s9"], "roles": ["assistant"]}}))
    assert alias_roles_only.hits == ()  # the conditions must hold on one turn
    echo = service.answer(RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "grey cat",
                                                  "filters": {"session_ids": ["s8"]}}))
    assert [(h.turn_id, h.session_id, h.role, h.aliases) for h in echo.hits] == [("echo", "s8", "assistant", ())]


def test_bad_filters_are_refused_by_the_client_and_fail_the_job(settings: Settings, redis_client: redis.Redis,
                                                               store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    for kwargs, reason in ((dict(filters={"colour": "red"}), Reason.BAD_FILTER),
                           (dict(filters={"session_ids": []}), Reason.BAD_FILTER),
                           (dict(as_of="2024-03-01T09:00:00"), Reason.TIMESTAMP_WITHOUT_ZONE),
                           (dict(as_of="2024-03-01T09:00:00Z",
                                 filters={"occurred_after": "2024-03-02T00:00:00Z"}), Reason.BAD_FILTER)):
        with pytest.raises(InvalidInputError) as info:
            client.retrieve("alice", "cat", **kwargs)
        assert info.value.reason is reason
    assert queue.count == 0  # nothing was sent

    service = query_service(settings, redis_client, store)
    raw = {"v": 1, "tenant_id": "alice", "query": "cat", "filters": {"roles": "user"}}
    job = queue.enqueue("workers.query.worker.retrieval_job", raw, **JOB_TTLS)
    build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-bad").work(burst=True)
    with pytest.raises(RetrievalFailed, match="bad_filter"):
        request = RetrievalRequest("alice", "cat", request_id=job.id)
        client._wait(job, request.request_id, 2.0, lambda result: client._from_result(request, result))
    assert service.metrics.query_jobs.labels(status="error")._value.get() == 1


def test_as_of_is_the_reference_time_of_the_core(settings: Settings, redis_client: redis.Redis, store: PostgresStore,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.query.worker

    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))
    seen: list[dict[str, Any]] = []
    real = workers.query.worker.retrieve

    def spy(*args: Any, **kwargs: Any):
        seen.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(workers.query.worker, "retrieve", spy)
    service = query_service(settings, redis_client, store)
    service.answer(RetrievalRequest("alice", "what did I do last week", k=3))
    service.answer(RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "what did I do last week",
                                           "as_of": "2024-03-08T10:00:00+01:00"}))
    assert (seen[0]["reference_time"], seen[0]["allowed"]) == (None, None)  # nothing asked: the unfiltered path
    assert seen[1]["reference_time"] == BASE_TIME + timedelta(days=7) and seen[1]["allowed"].as_of == seen[1][
        "reference_time"]
