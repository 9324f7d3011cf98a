"""Forgets, replacements and re-adds read out of stream order by consumers of one group, against
the real Redis and Postgres (docs/architecture.md "Forget", "Reading order"). Break-it round 8
(2026-12-07) found each of these on the first version of migration 0009's rules; every test
asserts what stream order stores.
"""

from __future__ import annotations

import pytest
import redis

from tests.integration.factories import client_for, ingest_worker, turn
from tests.integration.test_forget import _stored_texts
from workers.runtime.streams import StreamMessage
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _read(settings: Settings, redis_client: redis.Redis, store: PostgresStore, order: list[list[int]]) -> None:
    """The stream's messages, each batch of ``order`` (message indexes) read by its own consumer."""
    messages = [StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)]
    for batch in order:
        ingest_worker(settings, redis_client, store).handle([messages[i] for i in batch])


def test_a_re_add_repeating_the_old_value_read_before_a_replacement_does_not_beat_it(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A")])
    client.replace_turn(turn("alice", "k", "value B"))
    client.publish_turns([turn("alice", "k", "value A")], readd=True)  # no forget before it: a conflict
    _read(settings, redis_client, store, [[0], [2], [1]])
    assert _stored_texts(store, "alice") == [("k", "value B")]


def test_a_conflict_in_another_session_read_after_a_forget_of_the_first_session_stays_out(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A", session="s1"),
                          turn("alice", "k", "value B", session="s2")])  # plain: a conflict
    client.forget("alice", session_id="s1")
    _read(settings, redis_client, store, [[0], [2], [1]])
    assert _stored_texts(store, "alice") == []


def test_a_batch_redelivered_after_its_commit_changes_nothing(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A", session="s1"),
                          turn("alice", "k", "value B", session="s2")])
    client.forget("alice", session_id="s1")
    batch = [StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)]
    ingest_worker(settings, redis_client, store).handle(batch)
    assert _stored_texts(store, "alice") == []
    ingest_worker(settings, redis_client, store).handle(batch)  # the worker died before its ack: claimed again
    assert _stored_texts(store, "alice") == []
