"""The ingest worker's logic against the in-memory store (tests/unit/worker_fakes.py).

The same behaviours run against the real Redis and Postgres in tests/integration/test_ingest.py;
here they run without servers: idempotency, dedupe into aliases, conflicts and malformed turns as
dead letters, the tenant lock, version refusals and a failed commit.
"""

from __future__ import annotations

import numpy as np
import pytest

from api.errors import Reason
from tests.unit.worker_fakes import (
    DIM,
    RecordingRedis,
    conversation,
    forget_message,
    ingest_worker,
    turn_message,
    unit_settings,
)
from workers.ingest.worker import IngestWorker
from workers.runtime.errors import StoreError
from workers.store import FakeStore
from workers.store.rows import TenantLock, vectors_from_bytes


def _turns(store: FakeStore, tenant: str) -> list[tuple[int, str, int | None]]:
    with store.tenant(tenant) as tx:
        return [(r.entry_id, r.turn_id, r.canonical_entry_id) for r in tx.entries_after(0)]


def _memory_version(store: FakeStore, tenant: str) -> int | None:
    with store.tenant(tenant) as tx:
        row = tx.tenant()
    return None if row is None else row.memory_version


def test_a_batch_is_stored_under_the_tenant_lock_and_acknowledged() -> None:
    store, redis = FakeStore(), RecordingRedis()
    batch = conversation("alice")
    assert ingest_worker(store, redis).handle(batch) == [m.stream_id for m in batch]
    assert [t for _, t, _ in _turns(store, "alice")] == [f"alice-t{i}" for i in range(len(batch))]
    assert _memory_version(store, "alice") == 1
    assert ("alice", TenantLock.INGEST) in store.locks_taken
    with store.tenant("alice") as tx:
        row = tx.tenant()
    assert row is not None and (row.rendering_version, row.embedding_dim) == (1, DIM)


def test_a_redelivered_batch_changes_nothing() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle(conversation("alice"))
    before = _turns(store, "alice")
    assert worker.handle(conversation("alice")) == [m.stream_id for m in conversation("alice")]
    assert _turns(store, "alice") == before
    assert _memory_version(store, "alice") == 1  # nothing written: no new memory version
    assert not store.tables.dead_letters


def test_a_near_duplicate_becomes_an_alias_of_its_canonical_entry() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message("1-0", "alice", "a", "I moved to Lisbon in March")])
    worker.handle([turn_message("2-0", "alice", "b", "I moved to Lisbon in March", session="s2")])
    (first, _, none), (_, _, canonical) = _turns(store, "alice")
    assert none is None and canonical == first
    assert worker.metrics.ingest_duplicates._value.get() == 1


def test_a_changed_turn_id_is_a_conflict_and_the_first_write_wins() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message("1-0", "alice", "t1", "first words")])
    acked = worker.handle([turn_message("2-0", "alice", "t1", "other words")])
    assert acked == ["2-0"]  # a conflict is final: acknowledged as a dead letter
    with store.tenant("alice") as tx:
        assert [t.text for t in tx.stored_turns(["t1"])] == ["first words"]
    (letter,) = store.tables.dead_letters.values()
    assert (letter.reason, letter.stream_id, letter.tenant_id) == (Reason.TURN_ID_CONFLICT.value, "2-0", "alice")
    assert [e["reason"] for e in redis.streams["unit:turns:dead"]] == [Reason.TURN_ID_CONFLICT.value]


def test_a_malformed_message_is_a_dead_letter_and_the_rest_is_stored() -> None:
    store, redis = FakeStore(), RecordingRedis()
    bad = turn_message("9-0", "alice", "t9", "x")
    bad.fields[b"text"] = b"   "
    acked = ingest_worker(store, redis).handle([bad, *conversation("alice")])
    assert "9-0" in acked and len(_turns(store, "alice")) == len(conversation("alice"))
    assert [letter.reason for letter in store.tables.dead_letters.values()] == [Reason.EMPTY_TEXT.value]


def test_tenants_never_see_each_other() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle(conversation("alice") + conversation("bob", first_id=100))
    assert {t for _, t, _ in _turns(store, "bob")} == {f"bob-t{i}" for i in range(len(conversation("bob")))}
    worker.handle([turn_message("200-0", "bob", "dup", "I adopted a grey cat named Pixel last spring")])
    assert all(canonical is None for _, _, canonical in _turns(store, "bob")[:-1])
    (*_, (_, _, canonical)) = _turns(store, "bob")
    alice_ids = {e for e, _, _ in _turns(store, "alice")}
    assert canonical not in alice_ids  # dedupe only ever looks inside the tenant


def test_a_tenant_of_another_embedding_version_is_left_pending() -> None:
    store, redis = FakeStore(), RecordingRedis()
    with store.tenant("old") as tx:
        tx.create_tenant(0, DIM)
    acked = ingest_worker(store, redis).handle([turn_message("1-0", "old", "t", "hello"),
                                                turn_message("2-0", "new", "t", "hello")])
    assert acked == ["2-0"]
    assert _turns(store, "old") == [] and len(_turns(store, "new")) == 1


def test_a_failed_commit_stores_nothing_and_the_retry_stores_everything_once() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis, unit_settings())
    store.fail_next_commit = StoreError("connection lost", transient=True)
    with pytest.raises(StoreError):
        worker.handle(conversation("alice"))
    assert _turns(store, "alice") == [] and _memory_version(store, "alice") is None
    worker.handle(conversation("alice"))  # the redelivery after the failure
    turns = _turns(store, "alice")
    assert len(turns) == len(conversation("alice")) and all(c is None for _, _, c in turns)
    assert _memory_version(store, "alice") == 1


def _cache_matches_the_store(worker: IngestWorker, store: FakeStore, tenant: str) -> None:
    canon = worker._canonicals[tenant]
    with store.tenant(tenant) as tx:
        rows = tx.canonical_entries(after=0)
    assert canon.entry_ids == [r.entry_id for r in rows] and canon.last_entry_id == rows[-1].entry_id
    assert np.array_equal(canon.entries.vectors, vectors_from_bytes([r.embedding for r in rows], DIM))


def test_the_canonical_cache_grows_in_place_and_is_rebuilt_after_a_forget_elsewhere() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker, other = ingest_worker(store, redis), ingest_worker(store, redis)
    worker.handle(conversation("alice"))
    canon = worker._canonicals["alice"]
    other.handle([turn_message("20-0", "alice", "o1", "My sister Lena lives in Oslo", session="s7")])
    worker.handle([turn_message("21-0", "alice", "w1", "I moved to Lisbon in March", session="s8"),
                   turn_message("22-0", "alice", "w2", "I adopted a grey cat named Pixel last spring", session="s8")])
    assert worker._canonicals["alice"] is canon  # extended, not copied: the other worker's row, then its own
    assert _turns(store, "alice")[-1][2] is not None  # the repeated turn is an alias
    _cache_matches_the_store(worker, store, "alice")
    other.handle([forget_message("30-0", "alice", turn_ids=("alice-t0", "w1"))])  # another forget version
    worker.handle([turn_message("31-0", "alice", "w3", "I adopted a grey cat named Pixel last spring", session="s9")])
    assert worker._canonicals["alice"] is not canon  # reloaded from the store
    _cache_matches_the_store(worker, store, "alice")
    entry_of = {turn: entry_id for entry_id, turn, _ in _turns(store, "alice")}
    (*_, (_, _, canonical)) = _turns(store, "alice")
    assert canonical == entry_of["w2"]  # the alias promoted by the forget is the canonical now
