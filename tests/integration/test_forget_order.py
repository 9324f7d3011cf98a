"""Forgets, replacements and re-adds read out of stream order by consumers of one group, against
the real Redis and Postgres (docs/architecture.md "Forget", "Reading order"). Break-it rounds 8
and 9 (2026-12-07) found each of these on earlier versions of migration 0009's rules; every test
asserts what stream order stores, and ``_delivered`` reads the stream through the consumer group,
as workers do, so the forget sees what was delivered.
"""

from __future__ import annotations

import pytest
import redis

import workers.ingest.worker as worker_module
from tests.integration.factories import client_for, ingest_worker, turn
from tests.integration.test_forget import SECRET, _stored_texts, _streams_holding, _tables_holding
from workers.ingest.worker import GROUP
from workers.runtime.streams import StreamMessage
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _messages(settings: Settings, redis_client: redis.Redis) -> list[StreamMessage]:
    """Every message of the turns stream, in stream order (not delivered to the group)."""
    return [StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)]


def _read(settings: Settings, redis_client: redis.Redis, store: PostgresStore, order: list[list[int]]) -> None:
    """The stream's messages, each batch of ``order`` (message indexes) read by its own consumer."""
    messages = _messages(settings, redis_client)
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
    assert _stored_after_each_of_two_passes(settings, redis_client, store) == ([], [])


def _stored_after_each_of_two_passes(settings: Settings, redis_client: redis.Redis, store: PostgresStore
                                     ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The whole stream handled as one batch by one consumer, in stream order, then once more (the
    worker died after its commit and before its ack, and the batch was claimed again): alice's
    stored ``(turn id, text)`` after each pass."""
    batch = _messages(settings, redis_client)
    ingest_worker(settings, redis_client, store).handle(batch)
    first = _stored_texts(store, "alice")
    ingest_worker(settings, redis_client, store).handle(batch)
    return first, _stored_texts(store, "alice")


def _delivered(settings: Settings, redis_client: redis.Redis) -> list[StreamMessage]:
    """Every message of the stream, delivered to the ingest group (pending until a worker acks)."""
    redis_client.xgroup_create(settings.turns_stream, GROUP, id="0")
    return [StreamMessage(sid.decode(), f) for sid, f in redis_client.xreadgroup(
        GROUP, "reader", {settings.turns_stream: ">"})[0][1]]


def _handle(settings: Settings, redis_client: redis.Redis, store: PostgresStore, batch: list[StreamMessage]) -> None:
    worker = ingest_worker(settings, redis_client, store)
    acked = worker.handle(batch)
    if acked:
        redis_client.xack(settings.turns_stream, GROUP, *acked)


def test_a_sweep_deletes_the_copies_of_every_delivered_retry(settings: Settings, redis_client: redis.Redis,
                                                             store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", SECRET)])
    client.forget("alice", session_id="s1")
    client.publish_turns([turn("alice", "k", SECRET)])  # two retries of the client's
    client.publish_turns([turn("alice", "k", SECRET)])
    first, forget, retry, again = _delivered(settings, redis_client)
    for message in (forget, retry, again, first):  # the first read last: its sweep erases the retry
        _handle(settings, redis_client, store, [message])
    assert _stored_texts(store, "alice") == [] and _tables_holding(store, SECRET) == []
    assert _streams_holding(redis_client, settings, SECRET) == []


def test_a_sweep_after_a_replacement_still_deletes_the_retry_s_copy(settings: Settings, redis_client: redis.Redis,
                                                                   store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", SECRET)])
    client.forget("alice")
    client.publish_turns([turn("alice", "k", SECRET)])  # a retry
    client.replace_turn(turn("alice", "k", "a new value"))
    first, forget, retry, replacement = _delivered(settings, redis_client)
    for message in (retry, forget, replacement, first):
        _handle(settings, redis_client, store, [message])
    assert _stored_texts(store, "alice") == [("k", "a new value")]
    assert _tables_holding(store, SECRET) == [] and _streams_holding(redis_client, settings, SECRET) == []


def test_a_redelivered_batch_of_re_adds_and_forgets_changes_nothing(settings: Settings, redis_client: redis.Redis,
                                                                    store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.forget("alice", turn_ids=["k"])
    client.publish_turns([turn("alice", "k", "value A", session="s2")], readd=True)
    client.publish_turns([turn("alice", "k", "value B", session="s1")], readd=True)  # the second: a conflict
    client.forget("alice", session_id="s2")
    assert _stored_after_each_of_two_passes(settings, redis_client, store) == ([], [])


def test_a_forget_is_applied_when_the_stream_vanished_under_it(settings: Settings, redis_client: redis.Redis,
                                                               store: PostgresStore) -> None:
    """Redis restarted without persistence while a worker held the batch: the forget is still applied
    and the worker returns (the retries' scan found no stream and raised)."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A")])
    client.forget("alice", turn_ids=["k"])
    stored, forget = _delivered(settings, redis_client)
    _handle(settings, redis_client, store, [stored])
    redis_client.delete(settings.turns_stream)
    assert ingest_worker(settings, redis_client, store).handle([forget]) == [forget.stream_id]
    assert _stored_texts(store, "alice") == []


def test_a_malformed_re_add_ends_no_retries(settings: Settings, redis_client: redis.Redis,
                                             store: PostgresStore) -> None:
    # break-it round 10: a re-add refused as malformed (its time has no zone) stores nothing, so the
    # plain message after it is still a retry; the retry scan took it for the end of the retries and
    # kept the retry's turns-stream entry. (Its conflict letter stays, docs/architecture.md
    # "Reading order".) The malformed re-add's own letter stays too: it is refused in any order
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A")])
    client.forget("alice", turn_ids=["k"])
    redis_client.xadd(settings.turns_stream, {**turn("alice", "k", "a malformed re-add"), "v": "1", "readd": "1",
                                              "occurred_at": "2024-03-01T09:00:00"})
    client.publish_turns([turn("alice", "k", SECRET)])
    stored, forget, malformed, retry = _delivered(settings, redis_client)
    for message in (stored, retry, forget, malformed):
        _handle(settings, redis_client, store, [message])
    assert _stored_texts(store, "alice") == []
    assert _tables_holding(store, "a malformed re-add") == ["dead_letters"]
    assert settings.turns_stream not in _streams_holding(redis_client, settings, SECRET)


def test_a_session_forget_claimed_again_after_its_commit_still_deletes_the_retry_s_copies(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it round 10: the worker committed the forget and died before deleting the copies; applied
    # again, the forget erased nothing and named no turn id, so the retry's turns-stream entry kept
    # the text. Its swept tombstones name the turn id now
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "value A")])
    client.forget("alice", session_id="s1")
    client.publish_turns([turn("alice", "k", SECRET)])
    stored, forget, retry = _delivered(settings, redis_client)
    _handle(settings, redis_client, store, [stored])
    _handle(settings, redis_client, store, [retry])  # a conflict: refused
    assert settings.turns_stream in _streams_holding(redis_client, settings, SECRET)

    def killed(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("killed after the commit")
    monkeypatch.setattr(worker_module, "erase_copies", killed)
    with pytest.raises(RuntimeError):
        ingest_worker(settings, redis_client, store).handle([forget])
    monkeypatch.undo()
    _handle(settings, redis_client, store, [forget])  # claimed again
    assert _stored_texts(store, "alice") == []
    assert settings.turns_stream not in _streams_holding(redis_client, settings, SECRET)

