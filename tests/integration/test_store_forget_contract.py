"""The forget statements of the store contract (docs/architecture.md "Forget"), run against the
Postgres store and the in-memory fake alike, as tests/integration/test_store_contract.py does for
the rest: links, promotion, deletion with suppression scores, dead letters, tenant state and
tombstones (the later stream position wins), each scoped to one tenant."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from workers.runtime.dead_letters import DeadLetter
from workers.runtime.errors import StoreError
from workers.store import Store
from workers.store.rows import EntryRow, TenantLock, Tombstone, vector_to_bytes

pytestmark = pytest.mark.integration

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
DIM = 4


def _seed(store: Store, tenant: str) -> dict[str, int]:
    """t1 (s1) with aliases t3 (s1) and t4 (s2); t2 (s2) canonical."""
    with store.tenant(tenant) as tx:
        tx.create_tenant(1, DIM)
        tx.lock(TenantLock.INGEST)
        ids = dict(zip(("t1", "t2", "t3", "t4"), tx.allocate_entry_ids(4), strict=True))
        rows = [(turn, session, None if turn in ("t1", "t2") else ids["t1"])
                for turn, session in (("t1", "s1"), ("t2", "s2"), ("t3", "s1"), ("t4", "s2"))]
        tx.insert_entries([EntryRow(turn_id=turn, session_id=session, role="user", text=f"text of {turn}",
                                    occurred_at=T0 + timedelta(minutes=n), entry_id=ids[turn],
                                    embedding=vector_to_bytes(np.eye(DIM, dtype=np.float32)[n]),
                                    canonical_entry_id=canonical, stream_id=f"{n + 1}-0")
                           for n, (turn, session, canonical) in enumerate(rows)])
        tx.add_suppression({(ids["t1"], 0): 1.0, (ids["t2"], 0): 2.0})
    return ids


def test_links_promotion_and_deletion(any_store: Store) -> None:
    ids = _seed(any_store, "alice")
    _seed(any_store, "bob")
    with any_store.tenant("alice") as tx:
        assert [link.turn_id for link in tx.entry_links(turn_ids=["t1", "t4", "zz"])] == ["t1", "t4"]
        assert [link.turn_id for link in tx.entry_links(session_id="s2")] == ["t2", "t4"]
        assert [(link.turn_id, link.stream_id) for link in tx.entry_links()][:2] == [("t1", "1-0"), ("t2", "2-0")]
        assert [link.turn_id for link in tx.aliases_of([ids["t1"]])] == ["t3", "t4"]
    with pytest.raises(StoreError), any_store.tenant("alice") as tx:  # t3 and t4 still name t1
        tx.delete_entries([ids["t1"]])
    with any_store.tenant("alice") as tx:
        tx.bump_forget_version()
        tx.set_canonical({ids["t3"]: None, ids["t4"]: ids["t3"]})
        tx.delete_entries([ids["t1"]])
    with any_store.tenant("alice") as tx:
        assert [(r.turn_id, r.canonical_entry_id) for r in tx.entries_after(0)] == [
            ("t2", None), ("t3", None), ("t4", ids["t3"])]
        tx.add_suppression({(ids["t1"], 1): 1.0, (ids["t2"], 0): 0.5})  # an outcome read before the forget
        assert tx.suppression_scores() == {(ids["t2"], 0): 2.5}
        row = tx.tenant()
        assert row is not None and (row.memory_version, row.forget_version) == (1, 1)
    with any_store.tenant("bob") as tx:
        assert len(tx.entries_after(0)) == 4 and len(tx.suppression_scores()) == 2


def _letter(stream_id: str, tenant: str, turn_id: str, session: str) -> DeadLetter:
    return DeadLetter("unit:turns", stream_id, "turn_id_conflict", "conflict", tenant, turn_id,
                      {"tenant_id": tenant, "turn_id": turn_id, "session_id": session, "text": "secret"})


def test_dead_letters_and_tenant_state(any_store: Store) -> None:
    ids = _seed(any_store, "alice")
    any_store.record_dead_letters([_letter("1-0", "alice", "t1", "s1"), _letter("2-0", "alice", "t2", "s2"),
                                   _letter("3-0", "alice", "t5", "s3"), _letter("4-0", "bob", "t1", "s1")])
    with any_store.tenant("alice") as tx:
        tx.buffer_query("o1", np.ones(DIM, dtype=np.float32))
        tx.save_centroids(np.eye(2, DIM, dtype=np.float32), 1)
        tx.record_outcome("o1", 0, {(ids["t2"], 0): 0.5}, None)
        assert tx.delete_dead_letters(turn_ids=["t1"]) == 1
        assert tx.delete_dead_letters(session_id="s2") == 1
        assert tx.delete_dead_letters(turn_ids=["t1"]) == 0
        tx.delete_tenant_state()
        assert tx.suppression_scores() == {} and tx.centroids() is None and tx.buffered_count() == 0
        assert tx.ledger() == []
        assert tx.delete_dead_letters() == 1  # t5's letter: dead letters are not tenant state
        assert len(tx.entries_after(0)) == 4  # entries are deleted by delete_entries only
    with any_store.tenant("bob") as tx:
        assert tx.delete_dead_letters() == 1


def test_dead_letters_of_messages_after_the_forget_are_kept(any_store: Store) -> None:
    """A forget at 10-5 deletes the letters of its stream's messages up to it (and every letter of
    another stream), never those published after it."""
    any_store.record_dead_letters([
        _letter("10-4", "alice", "t1", "s1"), _letter("10-5", "alice", "t1", "s1"),
        _letter("10-6", "alice", "t1", "s1"), _letter("9-0", "alice", "t1", "s2"),
        _letter("11-0", "alice", "t2", "s1"), _letter("12-0", "alice", "t3", "s3")])
    any_store.record_dead_letters([DeadLetter("other:turns", "99-0", "turn_id_conflict", "conflict", "alice",
                                              "t1", {"tenant_id": "alice", "turn_id": "t1", "session_id": "s1"})])
    with any_store.tenant("alice") as tx:
        assert tx.delete_dead_letters(turn_ids=["t1"], through=("unit:turns", "10-5")) == 4  # 10-4, 10-5, 9-0, other
        assert tx.delete_dead_letters(turn_ids=["t1"], through=("unit:turns", "10-5")) == 0  # 10-6 stays
        assert tx.delete_dead_letters(session_id="s1", through=("unit:turns", "10-9")) == 1  # 10-6; 11-0 is later
        assert tx.delete_dead_letters(session_id="s1", through=("unit:turns", "11-0")) == 1
        assert tx.delete_dead_letters(through=("unit:turns", "11-9")) == 0  # 12-0 came after a tenant forget
        assert tx.delete_dead_letters(through=("unit:turns", "12-0")) == 1


def test_swept_turn_ids_at_one_position(any_store: Store) -> None:
    with any_store.tenant("alice") as tx:
        tx.add_tombstones([Tombstone("swept", "b", 5, 0), Tombstone("swept", "a", 5, 0), Tombstone("swept", "c", 5, 1),
                           Tombstone("turn", "d", 5, 0), Tombstone("session", "s1", 5, 0)])
        tx.add_tombstones([Tombstone("swept", "b", 7, 0)])  # a later sweep moved it on
    with any_store.tenant("bob") as tx:
        tx.add_tombstones([Tombstone("swept", "z", 5, 0)])
        assert tx.swept_at(5, 0) == ["z"]
    with any_store.tenant("alice") as tx:
        assert tx.swept_at(5, 0) == ["a"]
        assert tx.swept_at(7, 0) == ["b"] and tx.swept_at(6, 0) == []


def test_tombstones_keep_the_later_position(any_store: Store) -> None:
    with any_store.tenant("alice") as tx:
        tx.add_tombstones([Tombstone("turn", "t1", 5, 0), Tombstone("session", "s1", 5, 0),
                           Tombstone("tenant", "", 3, 1)])
        tx.add_tombstones([Tombstone("turn", "t1", 9, 2), Tombstone("session", "s1", 4, 0)])
    with any_store.tenant("bob") as tx:
        assert tx.tombstones(session_ids=["s1"], turn_ids=["t1"]) == []
        tx.add_tombstones([Tombstone("turn", "t1", 1, 0)])
    with any_store.tenant("alice") as tx:
        assert tx.tombstones(session_ids=["s1", "s9"], turn_ids=["t1", "t2"]) == [
            Tombstone("session", "s1", 5, 0), Tombstone("tenant", "", 3, 1), Tombstone("turn", "t1", 9, 2)]
        assert tx.tombstones(session_ids=[], turn_ids=[]) == [Tombstone("tenant", "", 3, 1)]
        tx.mark_readded(["t1", "never-forgotten"], (12, 0))  # a re-add keeps the tombstone, with its position
        assert tx.tombstones(session_ids=[], turn_ids=["t1", "never-forgotten"]) == [
            Tombstone("tenant", "", 3, 1), Tombstone("turn", "t1", 9, 2, 12, 0)]
        tx.mark_readded(["t1"], (15, 0))  # a later re-add: the earliest one counts
        tx.mark_readded(["t1"], (9, 1))  # one before the forget is no re-add of it
        assert tx.tombstones(session_ids=[], turn_ids=["t1"])[-1] == Tombstone("turn", "t1", 9, 2, 12, 0)
        tx.mark_readded(["t1"], (11, 0))  # an earlier re-add applied late
        tx.add_tombstones([Tombstone("turn", "t1", 8, 0)])  # an earlier forget redelivered: nothing changes
        assert tx.tombstones(session_ids=[], turn_ids=["t1"])[-1] == Tombstone("turn", "t1", 9, 2, 11, 0)
        tx.add_tombstones([Tombstone("turn", "t1", 10, 0)])  # a later forget before the re-add: it stays
        assert tx.tombstones(session_ids=[], turn_ids=["t1"])[-1] == Tombstone("turn", "t1", 10, 0, 11, 0)
        tx.add_tombstones([Tombstone("turn", "t1", 13, 0)])  # a forget after it: forgotten again
        assert tx.tombstones(session_ids=[], turn_ids=["t1"])[-1] == Tombstone("turn", "t1", 13, 0)
    with any_store.tenant("bob") as tx:
        assert tx.tombstones(session_ids=[], turn_ids=["t1"]) == [Tombstone("turn", "t1", 1, 0)]
