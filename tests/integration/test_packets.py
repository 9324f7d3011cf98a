"""Evidence packets through the streams and the queue (real Redis and Postgres, fake encoder and reranker)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis

from api.errors import InvalidInputError, Reason
from api.schemas import RetrievalRequest
from tests.integration import factories
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _moves() -> list[dict[str, object]]:
    old = factories.turn("alice", "home-old", "I live in Lisbon near the river", session="s1", minutes=1)
    new = factories.turn("alice", "home-new", "I moved from Lisbon to Porto, I live in Porto now", session="s4",
                         minutes=500)
    new["metadata"] = {"supersedes": ["home-old"]}
    return [*factories.conversation_turns("alice", "a"), old, new]


def test_a_packet_comes_back_through_the_queue_with_qualifiers_and_omissions(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, _moves())
    client = factories.client_for(settings, redis_client)
    service = factories.query_service(settings, redis_client, store)
    result = factories.answered_by_worker(settings, redis_client, service, client.retrieve, "alice",
                                          "where do I live Lisbon", k=5, budget_tokens=40)
    packet = result.packet
    assert packet is not None and packet.budget_tokens == 40 and 0 < packet.used_tokens <= 40
    assert len(packet.prompt_text().split()) == packet.used_tokens  # the fake reranker counts words
    turns = [item.turn_id for item in packet.items]
    assert "home-new" in turns and "home-old" not in turns
    assert [(o.reason, o.because_of) for o in packet.omitted if o.turn_id == "home-old"] == [("superseded", "home-new")]
    new = next(item for item in packet.items if item.turn_id == "home-new")
    assert new.qualifiers.session_id == "s4" and new.qualifiers.role == "user"
    assert new.line.endswith("user: I moved from Lisbon to Porto, I live in Porto now") and "session s4" in new.header
    assert new.header in packet.prompt_text().splitlines()
    times = [(item.qualifiers.session_date, item.qualifiers.occurred_at) for item in packet.items]
    assert times == sorted(times)  # reading order
    assert all(o.reason in ("over_budget", "redundant", "superseded", "session_cap") for o in packet.omitted)
    assert result.hits  # the hits still come back


def test_a_superseded_turn_is_visible_as_of_before_its_correction_and_filters_are_reported(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, _moves())
    service = factories.query_service(settings, redis_client, store)
    before = service.answer(RetrievalRequest("alice", "where do I live Lisbon", k=5, budget_tokens=200,
                                             as_of=factories.BASE_TIME + timedelta(minutes=100)))
    assert before.packet is not None
    assert "home-old" in [item.turn_id for item in before.packet.items]
    hidden = {o.turn_id: o.reason for o in before.packet.omitted}
    assert hidden.get("home-new") == "not_visible_at_as_of"
    only_s1 = service.answer(RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "live Porto Lisbon",
                                                     "k": 5, "budget_tokens": 200,
                                                     "filters": {"session_ids": ["s1"]}}))
    assert only_s1.packet is not None
    assert {o.turn_id: o.reason for o in only_s1.packet.omitted}.get("home-new") == "filtered"


def test_a_repeated_packet_request_is_answered_from_the_cache_until_memory_changes(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, factories.conversation_turns("alice", "a"))
    service = factories.query_service(settings, redis_client, store)
    inner = service.reranker.inner  # the fake model behind the rerank cache
    first = service.answer(RetrievalRequest("alice", "cello teacher", k=3, budget_tokens=30))
    calls = len(inner.calls)
    second = service.answer(RetrievalRequest("alice", "cello teacher", k=3, budget_tokens=30))
    assert second.packet == first.packet and second.hits == first.hits and second.request_id != first.request_id
    assert len(inner.calls) == calls
    assert service.metrics.query_packet_cache_hits._value.get() == 1
    assert service.metrics.query_packet_cache_misses._value.get() == 1
    other = service.answer(RetrievalRequest("alice", "cello teacher", k=3, budget_tokens=31))
    assert other.packet is not None and other.packet.budget_tokens == 31
    factories.ingest_turns(settings, redis_client, store,
                           [factories.turn("alice", "n1", "My cello teacher moved away", minutes=99)])
    third = service.answer(RetrievalRequest("alice", "cello teacher", k=3, budget_tokens=30))
    assert third.memory_version == 2 and service.metrics.query_packet_cache_hits._value.get() == 1
    plain = service.answer(RetrievalRequest("alice", "cello teacher", k=3))
    assert plain.packet is None


def test_bad_budgets_and_bad_supersedes_are_refused(settings: Settings, redis_client: redis.Redis) -> None:
    client = factories.client_for(settings, redis_client)
    for budget in (0, -5, 10**6, 2.5, True):
        with pytest.raises(InvalidInputError) as info:
            client.retrieve("alice", "anything", budget_tokens=budget)  # type: ignore[arg-type]
        assert info.value.reason is Reason.BUDGET_OUT_OF_RANGE
    for value in ("t1", [], [""], [7], ["ok"] * 65):
        bad = factories.turn("alice", "x", "hello")
        bad["metadata"] = {"supersedes": value}
        with pytest.raises(InvalidInputError) as info:
            client.publish_turn(bad)
        assert info.value.reason is Reason.BAD_METADATA and "metadata.supersedes" in info.value.field
    good = factories.turn("alice", "x", "hello")
    good["metadata"] = {"supersedes": ["a", "b", "a"]}
    assert client.make_turn(good).metadata["supersedes"] == ["a", "b"]
