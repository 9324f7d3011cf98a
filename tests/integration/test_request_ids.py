"""A tenant's request id names one request (issue 29, part 3, item 3): two callers of one tenant that
send different queries under the same request id never get each other's hits, and suppression
sees one outcome under that id. Across tenants the same id is independent (test_isolation_paths)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from api.errors import MnemosClientError, Reason, RequestIdReused
from api.schemas import Outcome, RetrievalRequest, RetrievalResult
from tests.integration.factories import (
    answered_by_worker,
    client_for,
    conversation_turns,
    drain,
    ingest_worker,
    query_service,
)
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

QUERIES = ("grey cat Pixel balcony", "cello teacher Ines strict")


def _outcome_ids(connection: redis.Redis, settings: Settings) -> list[str]:
    return [Outcome.from_stream_fields(fields).outcome_id for _, fields in connection.xrange(settings.outcomes_stream)]


def test_a_reused_request_id_with_another_query_is_refused_never_answered_with_its_hits(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns(conversation_turns("alice"))
    drain(ingest_worker(settings, redis_client, store))
    service = query_service(settings, redis_client, store)
    expected = {q: service.answer(RetrievalRequest("alice", q, k=3, request_id=f"oracle-{i}")).hits[0].turn_id
                for i, q in enumerate(QUERIES)}
    assert len(set(expected.values())) == 2  # the two queries have different answers
    barrier = threading.Barrier(len(QUERIES))

    def ask(query: str) -> RetrievalResult | MnemosClientError:
        barrier.wait(timeout=30)  # both callers at once
        try:
            return client.retrieve("alice", query, k=3, request_id="shared", timeout_s=30.0)
        except MnemosClientError as exc:
            return exc

    def both() -> list[RetrievalResult | MnemosClientError]:
        with ThreadPoolExecutor(len(QUERIES)) as pool:
            return list(pool.map(ask, QUERIES))

    answers = dict(zip(QUERIES, answered_by_worker(settings, redis_client, service, both), strict=True))
    refused = {q: a for q, a in answers.items() if isinstance(a, RequestIdReused)}
    answered = {q: a for q, a in answers.items() if isinstance(a, RetrievalResult)}
    assert len(refused) == 1 and len(answered) == 1, answers
    ((query, result),), ((other, error),) = answered.items(), refused.items()
    assert result.hits[0].turn_id == expected[query]  # its own query's hits
    assert error.reason is Reason.REQUEST_ID_REUSED and error.field == "request_id" and "shared" in str(error)
    assert _outcome_ids(redis_client, settings).count("shared") == 1  # suppression sees one outcome

    # the same request again is a retry, answered afresh; the other query stays refused under this id
    retry = answered_by_worker(settings, redis_client, service, client.retrieve, "alice", query, k=3,
                               request_id="shared", timeout_s=30.0)
    assert retry.hits[0].turn_id == expected[query]
    with pytest.raises(RequestIdReused):
        answered_by_worker(settings, redis_client, service, client.retrieve, "alice", other, k=3,
                           request_id="shared", timeout_s=30.0)
    # another tenant's "shared" is another request
    client.publish_turns(conversation_turns("bob"))
    drain(ingest_worker(settings, redis_client, store))
    theirs = answered_by_worker(settings, redis_client, service, client.retrieve, "bob", other, k=3,
                                request_id="shared", timeout_s=30.0)
    assert theirs.tenant_id == "bob" and theirs.hits[0].turn_id == expected[other]
