"""Ingest worker against the real Redis and Postgres (fake encoder)."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
import redis

from tests.integration.factories import client_for, drain, ingest_worker, turn
from tests.support import run_loop_until
from workers.ingest.worker import IngestWorker
from workers.runtime.errors import StoreError
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.models import TruncationCounter, bi_encoder_dir
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _entries(store: PostgresStore, tenant: str) -> list[tuple]:
    with store.tenant_tx(tenant) as conn:
        return conn.execute(
            "SELECT entry_id, turn_id, text, canonical_entry_id FROM entries ORDER BY entry_id").fetchall()


def _version(store: PostgresStore, tenant: str) -> int | None:
    with store.tenant(tenant) as tx:
        row = tx.tenant()
    return None if row is None else row.memory_version


def _dead(store: PostgresStore) -> list[tuple]:
    with psycopg.connect(store.database_url) as conn:  # as the owner: the app role sees one tenant's letters
        return conn.execute("SELECT reason, tenant_id, turn_id FROM dead_letters ORDER BY dead_letter_id").fetchall()


def test_turns_become_entries_with_aliases_per_tenant(settings: Settings, redis_client: redis.Redis,
                                                      store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([
        turn("alice", "a1", "I really like coffee"),
        turn("alice", "a2", "I really like coffee."),
        turn("alice", "a3", "My sister lives in Lisbon", minutes=1),
        turn("bob", "b1", "I really like coffee"),
    ])
    worker = ingest_worker(settings, redis_client, store)
    assert drain(worker) == 4
    alice = _entries(store, "alice")
    assert [(r[1], r[3]) for r in alice] == [("a1", None), ("a2", alice[0][0]), ("a3", None)]
    assert alice[1][2] == "I really like coffee."  # the alias keeps its own turn
    bob = _entries(store, "bob")
    assert [(r[1], r[3]) for r in bob] == [("b1", None)]  # dedupe never crosses tenants
    assert _version(store, "alice") == 1 and _version(store, "bob") == 1
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0
    assert worker.metrics.ingest_duplicates._value.get() == 1
    assert worker.metrics.ingest_turns_indexed._value.get() == 3


def _caption(item: dict[str, object], caption: str) -> dict[str, object]:
    return {**item, "metadata": {"image_caption": caption}}


@pytest.mark.slow
def test_the_dedupe_guard_keeps_facts_the_encoder_cannot_see(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    """Real bi-encoder: each blocked pair has cosine >= 0.95 (tests/unit/test_dedupe_real.py); the
    second batch meets the first as stored canonical entries, with a warm cache and a cold one."""
    settings = settings.replace(bi_encoder="bundled")
    client = client_for(settings, redis_client)
    first = [turn("T", "p-old", "My new phone number is 0699 812 003."),
             turn("T", "c1", "My sister lives in Lisbon."),
             _caption(turn("T", "img1", "Look at this!"), "a photo of 2 dogs on a beach"),
             turn("T", "flight-early", "I booked the earlier flight to Lisbon for us.")]
    second = [turn("T", "p-new", "My new phone number is 0612 345 678.", minutes=5),
              turn("T", "c2", "My sister lives in Lisbon too.", minutes=5),
              _caption(turn("T", "img2", "Look at this!", minutes=5), "a photo of 3 dogs on a beach"),
              turn("T", "p-new-again", "My new phone number is 0612 345 678!", minutes=6),
              turn("T", "flight-late", "I booked the later flight to Lisbon for us.", minutes=7)]
    warm = ingest_worker(settings, redis_client, store)
    cold = IngestWorker(settings, redis_client, store, warm.encoder, TruncationCounter(), ServiceMetrics())
    for tenant, second_worker in (("warm", warm), ("cold", cold)):
        client.publish_turns([{**t, "tenant_id": tenant} for t in first])
        drain(warm)
        client.publish_turns([{**t, "tenant_id": tenant} for t in second])
        drain(second_worker, "second")  # "cold": a fresh worker loads the canonicals from Postgres
        rows = {r[1]: r for r in _entries(store, tenant)}
        canonical_of = {turn_id: r[3] for turn_id, r in rows.items()}
        assert canonical_of["p-old"] is None and canonical_of["p-new"] is None, tenant  # both numbers kept
        assert canonical_of["img1"] is None and canonical_of["img2"] is None, tenant  # the caption counts
        assert canonical_of["flight-late"] is None, tenant  # an opposite adjective is another fact
        assert canonical_of["c2"] == rows["c1"][0], tenant  # a true near-duplicate still aliases
        assert canonical_of["p-new-again"] == rows["p-new"][0], tenant  # ... the stored copy of itself


def test_redelivered_batch_changes_nothing(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client_for(settings, redis_client).publish_turns([turn("t", f"x{i}", f"fact number {i} about cats") for i in range(3)])
    worker = ingest_worker(settings, redis_client, store)
    consumer = worker.consumer("c1")
    consumer.ensure_group()
    batch = consumer.read()
    worker.handle(batch)  # committed, but the ack is "lost"
    before = (_entries(store, "t"), _version(store, "t"))
    consumer.ack(worker.handle(batch))  # the same entries delivered again
    assert (_entries(store, "t"), _version(store, "t")) == before


def test_malformed_turns_are_dead_lettered_and_the_worker_goes_on(settings: Settings, redis_client: redis.Redis,
                                                                  store: PostgresStore) -> None:
    good = client_for(settings, redis_client).make_turn(turn("t", "ok1", "valid turn")).to_stream_fields()
    stream = settings.turns_stream
    redis_client.xadd(stream, {**good, "text": "   "})
    redis_client.xadd(stream, {**good, "turn_id": "tz", "occurred_at": "2024-03-01T09:00:00"})
    redis_client.xadd(stream, {**good, "turn_id": "nul", "text": "a\x00b"})
    redis_client.xadd(stream, {"garbage": b"\xff\xfe"})
    redis_client.xadd(stream, {**good, "v": "7"})
    redis_client.xadd(stream, good)
    worker = ingest_worker(settings, redis_client, store)
    assert drain(worker) == 6
    reasons = sorted(r[0] for r in _dead(store))
    assert reasons == sorted(["empty_text", "timestamp_without_zone", "control_characters", "invalid_utf8",
                              "unsupported_version"])
    assert [r[1] for r in _entries(store, "t")] == ["ok1"]
    assert redis_client.xlen(settings.dead_letter_stream) == 5
    assert redis_client.xpending(stream, "ingest")["pending"] == 0


def test_turn_id_conflict_first_write_wins(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turn(turn("t", "same", "the first version"))
    client.publish_turn(turn("t", "same", "a different second version"))
    drain(ingest_worker(settings, redis_client, store))
    assert [r[2] for r in _entries(store, "t")] == ["the first version"]
    assert _dead(store) == [("turn_id_conflict", "t", "same")]


@pytest.mark.parametrize("metadata", [{"supersedes": ["older"]}, {"image_caption": "a red bicycle"}])
def test_a_metadata_only_edit_is_dead_lettered_not_dropped(settings: Settings, redis_client: redis.Redis,
                                                           store: PostgresStore, metadata: dict) -> None:
    client = client_for(settings, redis_client)
    client.publish_turn(turn("t", "older", "the meeting is on Monday"))
    client.publish_turn(turn("t", "same", "the meeting moved"))
    worker = ingest_worker(settings, redis_client, store)
    drain(worker)
    client.publish_turn({**turn("t", "same", "the meeting moved"), "metadata": metadata})  # same text, new metadata
    client.publish_turn(turn("t", "same", "the meeting moved"))  # a plain retry stays silent
    drain(worker, rounds=10)
    assert _dead(store) == [("turn_id_conflict", "t", "same")]
    with psycopg.connect(store.database_url) as conn:
        (detail,) = conn.execute("SELECT detail FROM dead_letters").fetchone()
    assert "metadata" in detail and next(iter(metadata)) in detail and "readd" in detail
    with store.tenant_tx("t") as conn:  # first write wins: the stored turn is unchanged
        assert conn.execute("SELECT metadata FROM entries WHERE turn_id = 'same'").fetchone() == ({},)
    assert redis_client.xlen(settings.dead_letter_stream) == 1


def test_nothing_is_acked_before_the_commit(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client_for(settings, redis_client).publish_turns([turn("t", f"k{i}", f"turn {i} of a flaky day") for i in range(4)])
    worker = ingest_worker(settings, redis_client, store)
    real = worker._write_tenant
    failures = {"left": 2}
    seen_pending: list[int] = []

    def flaky(tenant_id, pending):
        if failures["left"]:
            failures["left"] -= 1
            seen_pending.append(redis_client.xpending(settings.turns_stream, "ingest")["pending"])
            raise StoreError("connection lost", transient=True)
        return real(tenant_id, pending)

    worker._write_tenant = flaky  # type: ignore[method-assign]
    assert run_loop_until(worker, lambda: len(_entries(store, "t")) >= 4, timeout_s=10.0)
    assert seen_pending == [4, 4]  # still pending while the commit failed
    assert len(_entries(store, "t")) == 4
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0


def test_idle_entries_of_a_dead_consumer_are_claimed(settings: Settings, redis_client: redis.Redis,
                                                     store: PostgresStore) -> None:
    settings = settings.replace(claim_idle_ms=200, claim_interval_s=0.0)
    client_for(settings, redis_client).publish_turns([turn("t", f"d{i}", f"orphaned turn {i}") for i in range(3)])
    dead = ingest_worker(settings, redis_client, store).consumer("dead")
    dead.ensure_group()
    assert len(dead.read()) == 3  # read, then "killed" before the commit
    time.sleep(0.3)
    worker = ingest_worker(settings, redis_client, store)
    assert drain(worker, "alive") == 3
    assert len(_entries(store, "t")) == 3
    assert worker.metrics.ingest_claimed._value.get() == 3
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0


def test_long_turn_keeps_its_full_text_and_counts_the_truncation(settings: Settings, redis_client: redis.Redis,
                                                                 store: PostgresStore) -> None:
    path = bi_encoder_dir(settings.replace(bi_encoder="bundled"))
    assert path is not None
    text = "filler words about nothing in particular " * 110 + "The locker code is 4721."
    client_for(settings, redis_client).publish_turn(turn("t", "long", text))
    worker = ingest_worker(settings, redis_client, store, TruncationCounter.for_model_dir(path))
    drain(worker)
    with store.tenant_tx("t") as conn:
        stored, cut = conn.execute("SELECT text, encoder_truncated FROM entries").fetchone()
    assert stored == text and cut is True
    assert worker.metrics.ingest_truncated._value.get() == 1


def test_two_workers_dedupe_the_same_instant(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    workers = [ingest_worker(settings, redis_client, store) for _ in range(2)]
    consumers = [w.consumer(f"w{i}") for i, w in enumerate(workers)]
    consumers[0].ensure_group()
    client.publish_turn(turn("t", "c1", "I really like coffee"))
    batch_a = consumers[0].read()
    client.publish_turn(turn("t", "c2", "I really like coffee."))
    batch_b = consumers[1].read()
    barrier = threading.Barrier(2)

    def run(worker, consumer, batch):
        barrier.wait()
        consumer.ack(worker.handle(batch))

    threads = [threading.Thread(target=run, args=(w, c, b))
               for w, c, b in zip(workers, consumers, [batch_a, batch_b], strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    rows = _entries(store, "t")
    assert len(rows) == 2
    assert sum(r[3] is None for r in rows) == 1  # one canonical, one alias
    assert _version(store, "t") == 2


def test_a_message_the_worker_fails_on_is_dead_lettered_and_the_rest_goes_on(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    client_for(settings, redis_client).publish_turns(
        [turn("good", "g1", "first good turn"), turn("bad", "b1", "this one trips a bug"),
         turn("good", "g2", "second good turn")])
    worker = ingest_worker(settings, redis_client, store)
    real = worker._write_tenant

    def buggy(tenant_id, pending):
        if tenant_id == "bad":
            raise ValueError("a bug, not an outage")
        return real(tenant_id, pending)

    worker._write_tenant = buggy  # type: ignore[method-assign]
    assert run_loop_until(worker, lambda: bool(_dead(store)), timeout_s=10.0)
    assert [r[1] for r in _entries(store, "good")] == ["g1", "g2"]
    assert _dead(store) == [("processing_error", "bad", "b1")]
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0


def test_a_failed_message_a_forget_covers_leaves_no_dead_letter(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    # the poison path recorded its letter without the tombstone check that refused messages get: a
    # turn left pending by a dead consumer while another applied its forget, then failing, kept the
    # erased text as a dead letter
    client = client_for(settings, redis_client)
    client.publish_turn(turn("bad", "b1", "my pin is 4321"))
    client.forget("bad", session_id="s1")
    client.publish_turn(turn("bad", "b2", "my pin is now 9876"))
    worker = ingest_worker(settings, redis_client, store)
    consumer = worker.consumer("c1")
    consumer.ensure_group()
    first, forget, later = consumer.read()
    consumer.ack(worker.handle([forget]))
    assert worker.poison(first, ValueError("a bug")) and worker.poison(later, ValueError("a bug"))
    assert _dead(store) == [("processing_error", "bad", "b2")]
    assert [f[b"turn_id"] for _, f in redis_client.xrange(settings.dead_letter_stream)] == [b"b2"]
