"""A forget racing with another ingest consumer's refused message of the same turn
(docs/architecture.md "Forget"): no copy of the forgotten text survives, whichever commits first.

A break-it session forced the interleaving: consumer 1 read a malformed message published before
the forget and checked the tombstones; consumer 2 applied the forget and scanned the dead stream;
then consumer 1 wrote the letter (table and stream), which kept the text. The check and the writes
now happen under the tenant's ingest lock, so the forget waits for them.
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest
import redis

import workers.ingest.forget as forget_module
from api.sharding import directory_key
from tests.integration.factories import client_for, ingest_worker, turn
from workers.runtime.errors import StoreError
from workers.runtime.streams import StreamMessage
from workers.settings import Settings
from workers.store import PostgresStore
from workers.store.rows import Tombstone

pytestmark = pytest.mark.integration

SECRET = "my door code is 4471"
FORGET_WAIT_S = 2.0  # how long consumer 1 gives the forget to finish first (it cannot, under the lock)


def test_a_forget_applied_while_another_consumer_letters_the_turn_leaves_no_copy(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    client = client_for(settings, redis_client)
    bad = {**turn("alice", "a1", SECRET), "v": "1", "occurred_at": "2024-03-01T09:00:00"}
    refused = redis_client.xadd(settings.turns_stream, bad).decode()
    forget = client.forget("alice", turn_ids=["a1"])
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    first, second = ingest_worker(settings, redis_client, store), ingest_worker(settings, redis_client, store)
    errors: list[BaseException] = []

    def apply_forget() -> None:
        try:
            second.handle([messages[forget]])
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    racer = threading.Thread(target=apply_forget)
    checked = forget_module.letter_forgotten

    def forget_in_between(*args: Any) -> bool:
        if not racer.is_alive() and racer.ident is None:  # once: after consumer 1 read the tombstones
            racer.start()
            racer.join(FORGET_WAIT_S)
        return checked(*args)

    monkeypatch.setattr(forget_module, "letter_forgotten", forget_in_between)
    first.handle([messages[refused]])
    racer.join(60)
    assert not racer.is_alive() and errors == []
    with psycopg.connect(store.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM dead_letters WHERE tenant_id = 'alice'").fetchone() == (0,)
    assert not any(SECRET.encode() in value for _id, fields in redis_client.xrange(settings.dead_letter_stream)
                   for value in fields.values())


def test_messages_published_before_a_forget_stay_dropped_after_a_re_add(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Break-it sessions (2026-12-07): a re-add deleted the turn id's tombstone, so a message of the
    turn published before the forget, or a retry published between the forget and the re-add, read
    after the re-add (a dead consumer left it pending) came back as a conflict or dead letter holding
    the forgotten text."""
    client = client_for(settings, redis_client)
    stale = [redis_client.xadd(settings.turns_stream, {**turn("alice", "t1", SECRET), "v": "1",
                                                       "occurred_at": "2024-03-01T09:00:00"}).decode(),
             client.publish_turns([turn("alice", "t2", SECRET + " and more")])[0]]
    forget = client.forget("alice", turn_ids=["t1", "t2"])
    retry = client.publish_turns([turn("alice", "t2", SECRET + " and more")])[0]  # a plain retry (round 3)
    readds = client.publish_turns([turn("alice", "t1", "a fresh one"), turn("alice", "t2", "a fresh two")],
                                  readd=True)
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    worker = ingest_worker(settings, redis_client, store)
    worker.handle([messages[forget]])
    worker.handle([messages[sid] for sid in readds])
    worker.handle([messages[sid] for sid in [*stale, retry]])  # claimed from dead consumers afterwards
    worker.handle([StreamMessage("9999999999999-0", messages[stale[1]].fields)])  # one published after all
    with store.tenant("alice") as tx:
        assert sorted((r.turn_id, r.text) for r in tx.entries_after(0)) == [("t1", "a fresh one"),
                                                                            ("t2", "a fresh two")]
    with psycopg.connect(store.database_url) as conn:
        letters = conn.execute("SELECT stream_id, reason FROM dead_letters WHERE tenant_id = 'alice'").fetchall()
    assert letters == [("9999999999999-0", "turn_id_conflict")]  # published after the re-add: kept as usual
    assert worker.metrics.ingest_tombstoned._value.get() == 3


@pytest.mark.parametrize("order", ["q1 bad q2", "q1 q2 bad"])
def test_a_refused_message_between_two_replacements_keeps_its_letter_in_any_order(
        order: str, settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Break-it session, round 3: a replacement's forget half left a tombstone, and a refused message
    published before it but read after it lost its letter (a replacement updates, it erases no letter)."""
    client = client_for(settings, redis_client)
    sids = {"q1": client.replace_turn(turn("alice", "k1", "v1")),
            "bad": redis_client.xadd(settings.turns_stream, {**turn("alice", "k1", "refused body"), "v": "1",
                                                             "occurred_at": "yesterday"}).decode(),
            "q2": client.replace_turn(turn("alice", "k1", "v2"))}
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    worker = ingest_worker(settings, redis_client, store)
    for name in order.split():
        worker.handle([messages[sids[name]]])
    with store.tenant("alice") as tx:
        assert [(r.turn_id, r.text) for r in tx.entries_after(0)] == [("k1", "v2")]
    with psycopg.connect(store.database_url) as conn:
        rows = conn.execute("SELECT stream_id FROM dead_letters WHERE tenant_id = 'alice'").fetchall()
    assert rows == [(sids["bad"],)]


def test_a_retried_batch_copies_each_dead_letter_to_the_dead_stream_once(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Break-it session, round 3: letters are copied inside their tenant's transaction, so a batch
    retried after another tenant's failure copied the committed ones again."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "a1", "the stored value")])
    worker = ingest_worker(settings, redis_client, store)
    worker.handle([StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)])
    conflict = client.publish_turns([turn("alice", "a1", "another value")])[0]
    bad = redis_client.xadd(settings.turns_stream, {**turn("alice", "a2", "x"), "v": "1",
                                                    "occurred_at": "2024-03-01T09:00:00"}).decode()
    other = client.publish_turns([turn("bob", "b1", "bob's turn")])[0]
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    write, failures = worker._write_tenant, [StoreError("connection lost", transient=True)]

    def flaky(tenant_id: str, pending: Any) -> Any:
        if tenant_id == "bob" and failures:
            raise failures.pop()
        return write(tenant_id, pending)

    monkeypatch.setattr(worker, "_write_tenant", flaky)
    batch = [messages[conflict], messages[bad], messages[other]]
    with pytest.raises(StoreError):
        worker.handle(batch)
    worker.handle(batch)  # as run_consumer retries a batch after a transient error
    copies = [f[b"stream_id"].decode() for _id, f in redis_client.xrange(settings.dead_letter_stream)]
    assert sorted(copies) == sorted([conflict, bad])


def test_a_refused_message_of_a_tenant_being_moved_stays_pending(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Break-it session, round 3: the letters of a tenant a move froze were written on the source
    shard and acknowledged, where its turns stay pending for the move to carry."""
    settings = settings.replace(shards=2, shard=0)
    redis_client.hset(directory_key(settings.stream_prefix, 0, 2), "alice", "frozen")
    bad = {**turn("alice", "a1", "x"), "v": "1", "occurred_at": "2024-03-01T09:00:00"}
    sid = redis_client.xadd(settings.turns_stream, bad).decode()
    other = redis_client.xadd(settings.turns_stream, {**bad, "tenant_id": "bob"}).decode()
    forgotten = redis_client.xadd(settings.turns_stream, {**bad, "turn_id": "a0"}).decode()
    with store.tenant("alice") as tx:  # a forget of a0 applied after that message, before the freeze
        tx.add_tombstones([Tombstone("turn", "a0", 9_999_999_999_999, 0)])
    messages = {s.decode(): StreamMessage(s.decode(), f) for s, f in redis_client.xrange(settings.turns_stream)}
    worker = ingest_worker(settings, redis_client, store)
    # alice's stays pending for the move; the forgotten one is dropped here (break-it round 4: moved,
    # it became a letter holding the erased text on the target)
    assert worker.handle([messages[sid], messages[other], messages[forgotten]]) == [other, forgotten]
    with psycopg.connect(store.database_url) as conn:
        assert conn.execute("SELECT tenant_id FROM dead_letters").fetchall() == [("bob",)]
