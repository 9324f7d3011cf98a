"""One contract, two stores: every test here runs against the Postgres store and the in-memory fake.

The worker-logic tests in tests/unit/ trust :class:`workers.store.FakeStore` to behave like
:class:`workers.store.PostgresStore` where the workers can tell; these tests hold both to it:
idempotent inserts, tenant scope, rollback, read-only snapshots, the ledger and the versions, the
bootstrap buffer and the reindex staging.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from workers.runtime.errors import StoreError
from workers.store import Store
from workers.store.rows import EntryRow, StagedEmbedding, TenantLock, vector_to_bytes
from workers.store.state import check_schema

pytestmark = pytest.mark.integration

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
DIM = 4


def _vector(n: int) -> np.ndarray:
    return np.eye(DIM, dtype=np.float32)[n % DIM]


def _entry(entry_id: int, turn_id: str, *, canonical: int | None = None, caption: str | None = None,
           session: str = "s1", occurred_at: datetime | None = None) -> EntryRow:
    return EntryRow(turn_id=turn_id, session_id=session, role="user", text=f"text of {turn_id}",
                    occurred_at=T0 + timedelta(minutes=entry_id) if occurred_at is None else occurred_at,
                    metadata={"image_caption": caption} if caption else {}, entry_id=entry_id,
                    embedding=vector_to_bytes(_vector(entry_id)), canonical_entry_id=canonical,
                    stream_id=f"{entry_id}-0")


def _seed(store: Store, tenant: str, turns: list[str]) -> list[int]:
    with store.tenant(tenant) as tx:
        tx.create_tenant(1, DIM)
        tx.lock(TenantLock.INGEST)
        ids = tx.allocate_entry_ids(len(turns))
        assert tx.insert_entries([_entry(i, t) for i, t in zip(ids, turns, strict=True)]) == set(ids)
        tx.bump_memory_version()
    return ids


def test_the_tenant_row_and_its_versions(any_store: Store) -> None:
    with any_store.tenant("alice") as tx:
        assert tx.tenant() is None
        tx.create_tenant(1, DIM)
        tx.create_tenant(0, 99)  # exists: nothing changes
        tx.bump_memory_version()
    with any_store.tenant("alice") as tx:
        row = tx.tenant()
        assert row is not None
        assert (row.memory_version, row.rendering_version, row.embedding_dim, row.suppression_version) == (1, 1, DIM, 0)
        tx.set_embedding_version(2, 8)
    assert [(r.tenant_id, r.rendering_version, r.embedding_dim) for r in any_store.tenant_versions()] == [
        ("alice", 2, 8)]
    check_schema(any_store)  # every migration of this code is applied


def test_inserts_are_idempotent_per_turn_and_read_back_by_column(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1", "t2"])
    assert ids == sorted(ids)
    with any_store.tenant("alice") as tx:
        (more,) = tx.allocate_entry_ids(1)
        assert more > max(ids)
        assert tx.insert_entries([_entry(more, "t1"), ]) == set()  # turn id known: skipped
        (alias,) = tx.allocate_entry_ids(1)
        assert tx.insert_entries([_entry(alias, "t3", canonical=ids[0], caption="a red bike")]) == {alias}
    with any_store.tenant("alice") as tx:
        rows = tx.entries_after(0)
        assert [(r.turn_id, r.canonical_entry_id, r.image_caption) for r in rows] == [
            ("t1", None, None), ("t2", None, None), ("t3", ids[0], "a red bike")]
        assert rows[0].occurred_at == T0 + timedelta(minutes=ids[0])
        assert np.frombuffer(rows[1].embedding, dtype="<f4").tolist() == _vector(ids[1]).tolist()
        assert [r.turn_id for r in tx.entries_after(ids[0])] == ["t2", "t3"]
        assert [r.entry_id for r in tx.canonical_entries(0)] == ids
        assert {t.turn_id for t in tx.stored_turns(["t1", "t3", "nope"])} == {"t1", "t3"}
        assert tx.count_entries() == 3


def test_a_session_sees_only_its_tenant(any_store: Store) -> None:
    alice = _seed(any_store, "alice", ["t1"])
    bob = _seed(any_store, "bob", ["t1", "t2"])
    with any_store.tenant("bob") as tx:
        assert [r.entry_id for r in tx.entries_after(0)] == bob
        assert tx.own_entry_ids(alice + bob) == set(bob)
        assert tx.stored_turns(["t1"])[0].turn_id == "t1" and tx.count_entries() == 2
    with pytest.raises(StoreError), any_store.tenant(""):
        pass


def test_an_error_rolls_the_transaction_back(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1"])
    with pytest.raises(RuntimeError), any_store.tenant("alice") as tx:
        (new,) = tx.allocate_entry_ids(1)
        tx.insert_entries([_entry(new, "t2")])
        tx.bump_memory_version()
        raise RuntimeError("the worker failed mid-way")
    with any_store.tenant("alice") as tx:
        assert [r.entry_id for r in tx.entries_after(0)] == ids
        row = tx.tenant()
        assert row is not None and row.memory_version == 1
        assert tx.allocate_entry_ids(1)[0] > new  # ids are never handed out twice


def test_a_snapshot_reads_and_refuses_writes(any_store: Store) -> None:
    _seed(any_store, "alice", ["t1"])
    with any_store.tenant("alice", snapshot=True) as tx:
        assert tx.count_entries() == 1
    with pytest.raises(StoreError) as caught, any_store.tenant("alice", snapshot=True) as tx:
        tx.bump_memory_version()
    assert not caught.value.transient


def test_the_ledger_applies_an_outcome_once_and_versions_follow_it(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1", "t2"])
    with any_store.tenant("alice") as tx:
        assert tx.record_outcome("o1", 0, {(ids[0], 0): 0.25, (ids[1], 0): 0.5}, "1-0") is True
        assert tx.bump_suppression_version("o1") == 1
        tx.add_suppression({(ids[0], 0): 0.25, (ids[1], 0): 0.5})
    with any_store.tenant("alice") as tx:
        assert tx.record_outcome("o1", 0, {(ids[0], 0): 9.0}, "1-0") is False
    with any_store.tenant("alice") as tx:
        assert tx.record_outcome("o2", 1, {(ids[0], 1): 1.0}, None) is True
        assert tx.bump_suppression_version("o2") == 2
        tx.add_suppression({(ids[0], 1): 1.0})
        tx.add_suppression({(ids[0], 0): 0.5})
    with any_store.tenant("alice") as tx:
        assert tx.suppression_scores() == {(ids[0], 0): 0.75, (ids[1], 0): 0.5, (ids[0], 1): 1.0}
        assert tx.suppression_scores(1) == {(ids[0], 1): 1.0}
        assert [(r.outcome_id, r.cluster, r.suppression_version, r.deltas) for r in tx.ledger()] == [
            ("o1", 0, 1, ((ids[0], 0, 0.25), (ids[1], 0, 0.5))), ("o2", 1, 2, ((ids[0], 1, 1.0),))]
        row = tx.tenant()
        assert row is not None and row.suppression_version == 2
    with any_store.tenant("nobody") as tx:
        assert tx.bump_suppression_version("o1") is None


def test_the_bootstrap_buffer_and_the_centroids(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1"])
    with any_store.tenant("alice") as tx:
        tx.lock(TenantLock.SUPPRESSION)
        for n in range(3):
            tx.buffer_query(f"o{n}", _vector(n))
        assert tx.buffered_count() == 3 and tx.centroids() is None
        assert [np.frombuffer(b, dtype="<f4").argmax() for b in tx.buffered_queries()] == [0, 1, 2]
        tx.save_centroids(np.eye(2, DIM, dtype=np.float32), n_queries=3)
        tx.add_suppression({(ids[0], 1): 1.0})
    with any_store.tenant("alice") as tx:
        centroids = tx.centroids()
        assert centroids is not None and centroids.tolist() == np.eye(2, DIM).tolist()
        tx.clear_suppression_state()
    with any_store.tenant("alice") as tx:
        assert (tx.centroids(), tx.buffered_count(), tx.suppression_scores()) == (None, 0, {})


def test_reindex_stages_then_swaps_every_embedding(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1", "t2", "t3"])
    with any_store.tenant("alice") as tx:
        assert tx.count_unstaged(2, 8) == (3, 3)
        first = tx.unstaged_entries(2, 8, after=0, limit=2)
        assert [r.entry_id for r in first] == ids[:2]
        tx.stage_embeddings(2, [StagedEmbedding(r.entry_id, np.ones(8, np.float32), False) for r in first])
        assert tx.count_unstaged(2, 8) == (3, 1)
        assert [r.entry_id for r in tx.unstaged_entries(2, 8, after=0, limit=5)] == ids[2:]
    with pytest.raises(StoreError), any_store.tenant("alice") as tx:
        tx.swap_staged()  # one turn is not staged: nothing may change
    with any_store.tenant("alice") as tx:
        assert {len(r.embedding) for r in tx.entries_after(0)} == {4 * DIM}
        tx.stage_embeddings(2, [StagedEmbedding(ids[2], np.ones(8, np.float32), True)])
        tx.swap_staged()
    with any_store.tenant("alice") as tx:
        assert {len(r.embedding) for r in tx.entries_after(0)} == {4 * 8}
        assert tx.count_unstaged(2, 8) == (3, 3)  # the staging was cleared by the swap


def test_session_summaries_count_every_stored_turn_of_the_tenant(any_store: Store) -> None:
    ids = _seed(any_store, "alice", ["t1", "t2"])
    _seed(any_store, "bob", ["b1"])
    with any_store.tenant("alice") as tx:
        (alias,) = tx.allocate_entry_ids(1)
        extra = _entry(alias, "t3", canonical=ids[0], session="s0", occurred_at=T0 - timedelta(hours=1))
        tx.insert_entries([extra])
    with any_store.tenant("alice", snapshot=True) as tx:
        rows = tx.session_summaries()
    assert [(r.session_id, r.turns) for r in rows] == [("s0", 1), ("s1", 2)]
    assert rows[1].first_at == T0 + timedelta(minutes=ids[0]) and rows[1].last_at == T0 + timedelta(minutes=ids[1])
    with any_store.tenant("nobody", snapshot=True) as tx:
        assert tx.session_summaries() == []
