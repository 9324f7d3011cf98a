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
from tests.integration.factories import client_for, ingest_worker, turn
from workers.runtime.streams import StreamMessage
from workers.settings import Settings
from workers.store import PostgresStore

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
    """Break-it session (2026-12-07): a re-add deleted the turn id's tombstone, so a message of the
    turn published before the forget and read after the re-add (a dead consumer left it pending)
    came back as a conflict or dead letter holding the forgotten text."""
    client = client_for(settings, redis_client)
    stale = [redis_client.xadd(settings.turns_stream, {**turn("alice", "t1", SECRET), "v": "1",
                                                       "occurred_at": "2024-03-01T09:00:00"}).decode(),
             client.publish_turns([turn("alice", "t2", SECRET + " and more")])[0]]
    client.forget("alice", turn_ids=["t1", "t2"])
    client.publish_turns([turn("alice", "t1", "a fresh one"), turn("alice", "t2", "a fresh two")], readd=True)
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    worker = ingest_worker(settings, redis_client, store)
    worker.handle([m for sid, m in messages.items() if sid not in stale])  # the forget, then the re-adds
    worker.handle([messages[sid] for sid in stale])  # claimed from the dead consumer afterwards
    worker.handle([StreamMessage("9999999999999-0", messages[stale[1]].fields)])  # one published after all
    with store.tenant("alice") as tx:
        assert sorted((r.turn_id, r.text) for r in tx.entries_after(0)) == [("t1", "a fresh one"),
                                                                            ("t2", "a fresh two")]
    with psycopg.connect(store.database_url) as conn:
        letters = conn.execute("SELECT stream_id, reason FROM dead_letters WHERE tenant_id = 'alice'").fetchall()
    assert letters == [("9999999999999-0", "turn_id_conflict")]  # published after the re-add: kept as usual
    assert worker.metrics.ingest_tombstoned._value.get() == 2
