"""The suppression worker's logic against the in-memory store (tests/unit/worker_fakes.py).

The same behaviours run against the real Redis and Postgres in
tests/integration/test_suppression.py; here: exactly-once application through the ledger, the
suppression version, other tenants' entries ignored, the bootstrap buffer freezing centroids,
malformed outcomes as dead letters, and a failed commit leaving no trace.
"""

from __future__ import annotations

import logging
import sys

import numpy as np
import pytest

from api.errors import Reason
from mnemos.suppression import UpdateRule, outcome_deltas
from tests.unit.worker_fakes import (
    DIM,
    RecordingRedis,
    conversation,
    ingest_worker,
    outcome,
    suppression_worker,
)
from workers.runtime.errors import StoreError
from workers.runtime.streams import StreamMessage
from workers.runtime.wire import outcome_record
from workers.store import FakeStore
from workers.store.rows import TenantLock


def _stored(tenant: str = "alice") -> tuple[FakeStore, list[int]]:
    store = FakeStore()
    ingest_worker(store, RecordingRedis()).handle(conversation(tenant))
    with store.tenant(tenant) as tx:
        return store, [r.entry_id for r in tx.entries_after(0)]


def _state(store: FakeStore, tenant: str = "alice") -> tuple[dict[tuple[int, int], float], list[tuple[str, int | None]]]:
    with store.tenant(tenant) as tx:
        return tx.suppression_scores(), [(r.outcome_id, r.suppression_version) for r in tx.ledger()]


def test_an_outcome_is_applied_once_and_counted_in_the_suppression_version() -> None:
    store, ids = _stored()
    worker = suppression_worker(store, RecordingRedis())
    message = outcome("o1", "alice", ids[:4], 0)
    assert worker.apply(message) is True
    scores, ledger = _state(store)
    assert scores == pytest.approx(outcome_deltas(outcome_record(message), UpdateRule.RANK_GAP, worker.settings.eta))
    assert ledger == [("o1", 1)]
    assert worker.apply(message) is False  # the redelivery changes nothing
    assert _state(store) == (scores, ledger)
    assert worker.apply(outcome("o2", "alice", ids[1:5], 0)) is True
    assert [version for _, version in _state(store)[1]] == [1, 2]


def test_the_ledger_replays_to_the_scores() -> None:
    store, ids = _stored()
    worker = suppression_worker(store, RecordingRedis())
    for n in range(5):
        worker.apply(outcome(f"o{n}", "alice", ids[n % 3:n % 3 + 3], n % 2))
    with store.tenant("alice") as tx:
        replayed: dict[tuple[int, int], float] = {}
        for row in tx.ledger():
            for entry, cluster, delta in row.deltas:
                replayed[(entry, cluster)] = replayed.get((entry, cluster), 0.0) + delta
        assert replayed == pytest.approx(tx.suppression_scores())


def test_entries_of_another_tenant_are_ignored() -> None:
    store, alice = _stored("alice")
    ingest_worker(store, RecordingRedis()).handle(conversation("bob", first_id=100))
    with store.tenant("bob") as tx:
        bob = [r.entry_id for r in tx.entries_after(0)]
    worker = suppression_worker(store, RecordingRedis())
    assert worker.apply(outcome("o1", "alice", [alice[0], bob[0], alice[1]], 0)) is True
    scores, _ = _state(store, "alice")
    assert {entry for entry, _ in scores} <= set(alice)
    assert _state(store, "bob") == ({}, [])


def test_the_bootstrap_buffer_freezes_centroids_once_full() -> None:
    store, ids = _stored()
    worker = suppression_worker(store, RecordingRedis())  # K = 2, factor 2: four queries
    vectors = np.eye(DIM, dtype=np.float32)
    for n in range(3):
        worker.apply(outcome(f"o{n}", "alice", ids[:3], None, tuple(float(x) for x in vectors[n % 2])))
    with store.tenant("alice") as tx:
        assert tx.buffered_count() == 3 and tx.centroids() is None
    worker.apply(outcome("o3", "alice", ids[:3], None, tuple(float(x) for x in vectors[1])))
    with store.tenant("alice") as tx:
        centroids = tx.centroids()
    assert centroids is not None and centroids.shape == (2, DIM)
    assert ("alice", TenantLock.SUPPRESSION) in store.locks_taken
    worker.apply(outcome("o4", "alice", ids[:3], None, tuple(float(x) for x in vectors[0])))
    with store.tenant("alice") as tx:
        assert tx.buffered_count() == 4  # frozen: a late bootstrap outcome is not buffered any more


def test_the_warm_up_on_an_empty_database_says_no_clusters_were_frozen(caplog: pytest.LogCaptureFixture) -> None:
    """The start-up k-means fit is not a tenant's bootstrap: it must not log "clusters frozen"."""
    store = FakeStore()
    worker = suppression_worker(store, RecordingRedis())
    assert worker.settings.clusters_k > 1
    with caplog.at_level(logging.DEBUG):
        worker.warm_up()
    assert "sklearn.cluster" in sys.modules  # the import it exists for happened
    assert not [r.getMessage() for r in caplog.records if "froze" in r.getMessage() or "frozen" in r.getMessage()]
    assert worker.metrics.suppression_bootstrapped._value.get() == 0


def test_a_malformed_outcome_is_a_dead_letter() -> None:
    store, _ = _stored()
    worker = suppression_worker(store, RecordingRedis())
    bad = StreamMessage("5-0", {b"v": b"1", b"tenant_id": b"alice", b"outcome": b"{not json"})
    assert worker.handle([bad]) == ["5-0"]
    (letter,) = store.tables.dead_letters.values()
    assert (letter.stream_id, letter.reason) == ("5-0", Reason.MALFORMED_MESSAGE.value)


def test_a_failed_commit_leaves_no_ledger_row_and_the_retry_applies() -> None:
    store, ids = _stored()
    worker = suppression_worker(store, RecordingRedis())
    store.fail_next_commit = StoreError("connection lost", transient=True)
    with pytest.raises(StoreError):
        worker.apply(outcome("o1", "alice", ids[:4], 0))
    assert _state(store) == ({}, [])
    assert worker.apply(outcome("o1", "alice", ids[:4], 0)) is True
    assert _state(store)[1] == [("o1", 1)]
