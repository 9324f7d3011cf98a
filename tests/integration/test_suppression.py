"""Suppression worker against the real Redis and Postgres."""

from __future__ import annotations

import numpy as np
import psycopg
import pytest
import redis

from api.schemas import Outcome, PoolRow, RetrievalRequest
from api.sharding import directory_key
from mnemos.suppression import UpdateRule, outcome_deltas
from tests.integration.factories import (
    conversation_turns,
    ingest_turns,
    query_service,
    suppression_worker,
)
from workers.runtime.models import load_encoder
from workers.runtime.streams import StreamMessage
from workers.runtime.wire import outcome_record
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def _entry_ids(settings: Settings, connection: redis.Redis, store: PostgresStore, tenant: str = "alice") -> list[int]:
    ingest_turns(settings, connection, store, conversation_turns(tenant, tenant[0]))
    with store.tenant_tx(tenant) as conn:
        return [int(r[0]) for r in conn.execute("SELECT entry_id FROM entries ORDER BY entry_id")]


def _scores(store: PostgresStore, tenant: str = "alice") -> dict[tuple[int, int], float]:
    with store.tenant_tx(tenant) as conn:
        rows = conn.execute("SELECT entry_id, cluster, score FROM suppression").fetchall()
    return {(int(e), int(c)): float(s) for e, c, s in rows}


def _outcome(outcome_id: str, ids: list[int], cluster: int | None, embedding=None) -> Outcome:
    pool = tuple(PoolRow(e, rank, len(ids) + 1 - rank, 2.0 - rank) for rank, e in enumerate(ids, start=1))
    return Outcome(outcome_id, "alice", cluster, len(ids), pool, embedding)


def _ledger_recomputation(store: PostgresStore) -> dict[tuple[int, int], float]:
    total: dict[tuple[int, int], float] = {}
    with store.tenant_tx("alice") as conn:
        for (deltas,) in conn.execute("SELECT deltas FROM applied_outcomes"):
            for e, c, d in deltas:
                total[(e, c)] = total.get((e, c), 0.0) + d
    return total


def test_outcome_applied_once_even_when_redelivered(settings: Settings, redis_client: redis.Redis,
                                                    store: PostgresStore) -> None:
    settings = settings.replace(clusters_k=1)
    ids = _entry_ids(settings, redis_client, store)
    worker = suppression_worker(settings, redis_client, store)
    message = _outcome("o1", ids[:5], 0)
    assert worker.apply(message) is True
    first = _scores(store)
    expected = outcome_deltas(outcome_record(message), UpdateRule.RANK_GAP, settings.eta)
    assert first == pytest.approx(expected) and first
    assert worker.apply(message) is False  # the redelivery changes nothing
    assert _scores(store) == first
    assert worker.metrics.suppression_duplicates._value.get() == 1
    assert _ledger_recomputation(store) == pytest.approx(first)


def test_batch_and_one_at_a_time_give_identical_scores(settings: Settings, redis_client: redis.Redis,
                                                       store: PostgresStore) -> None:
    settings = settings.replace(clusters_k=1)
    ids = _entry_ids(settings, redis_client, store)
    messages = [_outcome(f"o{i}", ids[i % 3: i % 3 + 4], 0) for i in range(6)]
    for message in messages:
        redis_client.xadd(settings.outcomes_stream, message.to_stream_fields())
    worker = suppression_worker(settings, redis_client, store)
    consumer = worker.consumer("c")
    consumer.ensure_group()
    batch = consumer.read()
    assert len(batch) == 6
    consumer.ack(worker.handle(batch))
    in_batch = _scores(store)
    sequential: dict[tuple[int, int], float] = {}
    for message in messages:
        for key, delta in outcome_deltas(outcome_record(message), UpdateRule.RANK_GAP, settings.eta).items():
            sequential[key] = sequential.get(key, 0.0) + delta
    assert in_batch == pytest.approx(sequential)
    consumer.ack(worker.handle(batch))  # the whole batch again
    assert _scores(store) == in_batch
    assert redis_client.xpending(settings.outcomes_stream, "suppression")["pending"] == 0


def test_bootstrap_buffers_then_freezes_centroids(settings: Settings, redis_client: redis.Redis,
                                                  store: PostgresStore) -> None:
    ids = _entry_ids(settings, redis_client, store)  # K = 2, factor 2: freeze after 4 queries
    worker = suppression_worker(settings, redis_client, store)
    rng = np.random.default_rng(0)
    for i in range(5):
        vector = rng.normal(size=64).astype(np.float32)
        vector /= np.linalg.norm(vector)
        worker.apply(_outcome(f"b{i}", ids[:3], None, tuple(float(x) for x in vector)))
        if i == 0:
            worker.apply(_outcome("b0", ids[:3], None, tuple(float(x) for x in vector)))  # redelivered
    assert _scores(store) == {}  # no cluster yet: nothing to suppress under
    with store.tenant_tx("alice") as conn:
        k, dim, n = conn.execute("SELECT k, dim, n_queries FROM centroids").fetchone()
        buffered = conn.execute("SELECT count(*) FROM query_buffer").fetchone()[0]
    assert (k, dim, n) == (2, 64, 4) and buffered == 4
    assert worker.metrics.suppression_bootstrapped._value.get() == 1


def test_an_outcome_whose_embedding_misfits_the_tenant_is_dead_lettered(settings: Settings,
                                                                         redis_client: redis.Redis,
                                                                         store: PostgresStore) -> None:
    # found by a break-it session: one 3-float embedding in the bootstrap buffer made every later fit
    # of the tenant's clusters fail, and each of its outcomes went to the dead letters
    ids = _entry_ids(settings, redis_client, store)  # K = 2, factor 2: freeze after 4 queries
    rng = np.random.default_rng(1)
    good = [tuple(float(x) for x in v / np.linalg.norm(v)) for v in rng.normal(size=(4, 64)).astype(np.float32)]
    messages = [_outcome("short", ids[:3], None, (1.0, 0.0, 0.0))]
    messages += [_outcome(f"g{i}", ids[:3], None, vector) for i, vector in enumerate(good)]
    for message in messages:
        redis_client.xadd(settings.outcomes_stream, message.to_stream_fields())
    worker = suppression_worker(settings, redis_client, store)
    consumer = worker.consumer("c")
    consumer.ensure_group()
    consumer.ack(worker.handle(consumer.read()))
    with store.tenant_tx("alice") as conn:
        applied = [r[0] for r in conn.execute("SELECT outcome_id FROM applied_outcomes ORDER BY outcome_id")]
        k, dim, n = conn.execute("SELECT k, dim, n_queries FROM centroids").fetchone()
    assert applied == ["g0", "g1", "g2", "g3"]  # the bad one applied nothing, the rest went on
    assert (k, dim, n) == (2, 64, 4)
    with psycopg.connect(store.database_url) as conn:  # as the owner: the app role sees one tenant's letters
        letters = conn.execute("SELECT reason, detail FROM dead_letters WHERE stream = %s",
                               (settings.outcomes_stream,)).fetchall()
    assert letters == [("malformed_message", "query_embedding: has 3 floats; the tenant's embeddings have 64 "
                                             "(malformed_message)")]
    assert redis_client.xpending(settings.outcomes_stream, "suppression")["pending"] == 0


def test_outcomes_never_touch_another_tenants_entries(settings: Settings, redis_client: redis.Redis,
                                                      store: PostgresStore) -> None:
    settings = settings.replace(clusters_k=1)
    ids = _entry_ids(settings, redis_client, store)
    bob_ids = _entry_ids(settings, redis_client, store, "bob")
    worker = suppression_worker(settings, redis_client, store)
    worker.apply(_outcome("mixed", ids[:2] + bob_ids[:2], 0))
    assert {e for e, _ in _scores(store)} <= set(ids[:2])
    assert _scores(store, "bob") == {}


def test_an_outcome_of_a_tenant_with_no_stored_turns_writes_nothing(settings: Settings, redis_client: redis.Redis,
                                                                    store: PostgresStore) -> None:
    worker = suppression_worker(settings, redis_client, store)  # clusters_k > 1: the embedding would be buffered
    message = _outcome("ghost", [1, 2, 3], None, tuple(np.ones(load_encoder(settings).dim).tolist()))
    assert worker.apply(message) is False
    with psycopg.connect(store.database_url) as conn:
        counts = [conn.execute(f"SELECT count(*) FROM {t} WHERE tenant_id = 'alice'").fetchone()
                  for t in ("applied_outcomes", "query_buffer", "suppression", "tenants")]
    assert counts == [(0,), (0,), (0,), (0,)]
    assert worker.metrics.suppression_outdated._value.get() == 1


def test_an_outcome_of_a_tenant_moved_away_is_left_pending_not_skipped(settings: Settings, redis_client: redis.Redis,
                                                                       store: PostgresStore) -> None:
    """After a move the source shard has no tenants row of the tenant, but its directory marks it:
    the outcome is left pending for the move to carry, never acknowledged as having no turns."""
    settings = settings.replace(shards=2, shard=0)
    redis_client.hset(directory_key(settings.stream_prefix, 0, 2), "alice", "1")
    worker = suppression_worker(settings, redis_client, store)
    fields = _outcome("moved", [1, 2], 0).to_stream_fields()
    sid = redis_client.xadd(settings.outcomes_stream, fields).decode()
    assert worker.handle([StreamMessage(sid, {k.encode(): v.encode() for k, v in fields.items()})]) == []
    assert worker.metrics.suppression_outdated._value.get() == 0


def test_query_outcomes_become_suppression_rows(settings: Settings, redis_client: redis.Redis,
                                                store: PostgresStore) -> None:
    settings = settings.replace(clusters_k=1, update_rule="uniform")  # uniform: every pooled entry moves
    _entry_ids(settings, redis_client, store)
    service = query_service(settings, redis_client, store)
    for _ in range(3):
        service.answer(RetrievalRequest("alice", "grey cat Pixel balcony", k=3))
    worker = suppression_worker(settings, redis_client, store)
    consumer = worker.consumer("c")
    consumer.ensure_group()
    consumer.ack(worker.handle(consumer.read()))
    scores = _scores(store)
    assert scores and all(c == 0 for _, c in scores)
    with store.tenant_tx("alice") as conn:
        assert conn.execute("SELECT count(*) FROM applied_outcomes").fetchone() == (3,)


def test_each_applied_outcome_bumps_the_suppression_version_once(settings: Settings, redis_client: redis.Redis,
                                                                 store: PostgresStore) -> None:
    ids = _entry_ids(settings, redis_client, store)  # clusters_k=2, bootstrap_factor=2: 4 embeddings bootstrap
    worker = suppression_worker(settings, redis_client, store)
    service = query_service(settings, redis_client, store)
    assert service.answer(RetrievalRequest("alice", "grey cat")).suppression_version == 0
    embedding = tuple(float(x) for x in np.eye(settings.fake_encoder_dim)[0])
    assert worker.apply(_outcome("o1", ids[:5], None, embedding)) is True  # buffered only: still a new state
    assert worker.apply(_outcome("o2", ids[:5], None, embedding)) is True
    assert worker.apply(_outcome("o1", ids[:5], None, embedding)) is False  # a redelivery: no new version
    assert worker.apply(_outcome("o3", ids[1:6], 0)) is True
    with store.tenant("alice") as tx:
        row = tx.tenant()
        assert row is not None and (row.memory_version, row.suppression_version) == (1, 3)
        ledger = [(r.outcome_id, r.suppression_version) for r in tx.ledger()]
    assert ledger == [("o1", 1), ("o2", 2), ("o3", 3)]
    # the query worker reads the version in the snapshot it reads the scores from
    assert service.answer(RetrievalRequest("alice", "grey cat")).suppression_version == 3


def test_an_outcome_read_before_a_forget_never_buffers_its_query(settings: Settings, redis_client: redis.Redis,
                                                                store: PostgresStore) -> None:
    """A break-it session (round 2): a tenant forget, a turn published after it that another consumer
    stored first, a retrieval pooling it: one surviving entry let the forgotten tenant's query back
    into the bootstrap buffer. Now a stale outcome updates the survivors and buffers nothing."""
    settings = settings.replace(clusters_k=4)
    ids = _entry_ids(settings, redis_client, store)
    worker = suppression_worker(settings, redis_client, store)
    with store.tenant("alice") as tx:
        dim = tx.tenant().embedding_dim
    embedding = tuple(float(x) for x in np.linspace(-1.0, 1.0, dim))
    with store.tenant("alice") as tx:
        tx.bump_forget_version()  # a forget committed after both retrievals below read version 0
        tx.delete_entries(ids[:3])
    survivor = Outcome("o-stale", "alice", None, 4, _outcome("x", ids[:4], None).pool, embedding, forget_version=0)
    assert worker.apply(survivor) is True  # ids[3] survives: its delta is learnt ...
    gone = Outcome("o-gone", "alice", None, 3, _outcome("x", ids[:3], None).pool, embedding, forget_version=0)
    assert worker.apply(gone) is False and worker.metrics.suppression_outdated._value.get() == 1
    fresh = Outcome("o-fresh", "alice", None, 2, _outcome("x", ids[3:5], None).pool, embedding, forget_version=1)
    assert worker.apply(fresh) is True
    with store.tenant_tx("alice") as conn:
        ledger = [r[0] for r in conn.execute("SELECT outcome_id FROM applied_outcomes ORDER BY outcome_id")]
        buffered = [r[0] for r in conn.execute("SELECT outcome_id FROM query_buffer")]
    assert ledger == ["o-fresh", "o-stale"]
    assert buffered == ["o-fresh"]  # ... but only a question asked after the forget is buffered
