"""Cases from public reports on similar memory systems, each with the right value asserted.

1. Two ingest workers get "I really like coffee" / "I really like coffee." at the same instant.
2. The same stream entry is delivered twice (turns and outcomes).
3. Tenants A and B store identical text; A asks through every retrieval path (tests/badinput/
   test_isolation_paths.py).
4. A query worker refreshes a tenant's index while the ingest worker commits.
5. Outcomes folded one at a time and in one batch.
6. A query worker SIGKILLed in the middle of a rerank.
7. BM25 over "foo", "dog", "baz", "quick god", "quick fox" with the query "quick".
8. A pool with no candidates.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from api.errors import RetrievalTimeout
from api.schemas import Outcome, PoolRow, RetrievalRequest
from mnemos.bm25_index import BM25Index
from mnemos.encoder import HashingEncoder
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry
from mnemos.rerank import FakeReranker
from mnemos.suppression import SuppressionTable, UpdateRule, outcome_deltas
from mnemos.tenant_index import TenantIndex
from tests.badinput.harness import (
    client_for,
    entries,
    ingest_worker,
    pending,
    publish,
    query_service,
    run_loop_until,
    suppression_rows,
    suppression_worker,
    turn,
    turn_ids,
)
from tests.support import spawn_logged, stop_process, wait_for
from workers.ingest.worker import GROUP as INGEST_GROUP
from workers.runtime.streams import StreamMessage
from workers.runtime.wire import outcome_record
from workers.store import PostgresStore


def version(store: PostgresStore, tenant: str) -> int | None:
    with store.tenant(tenant) as tx:
        row = tx.tenant()
    return None if row is None else row.memory_version


# 1 -----------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_two_ingest_workers_dedupe_coffee_at_the_same_instant(settings, redis_client, store) -> None:
    tenants = [f"cafe-{i}" for i in range(8)]
    turns = [turn(t, "plain", "I really like coffee") for t in tenants]
    turns += [turn(t, "dotted", "I really like coffee.") for t in tenants]
    publish(settings, redis_client, turns)
    reader = ingest_worker(settings, redis_client, store).consumer("reader")
    reader.ensure_group()
    messages = reader.read()
    assert len(messages) == 16
    plain = [m for m in messages if m.fields[b"turn_id"] == b"plain"]
    dotted = [m for m in messages if m.fields[b"turn_id"] == b"dotted"]
    workers = [ingest_worker(settings, redis_client, store) for _ in range(2)]
    barrier = threading.Barrier(2)
    failures: list[BaseException] = []

    def work(worker, batch) -> None:
        try:
            barrier.wait(5)
            worker.handle(batch)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(w, b)) for w, b in zip(workers, [plain, dotted], strict=True)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures and not any(t.is_alive() for t in threads)
    reader.ack([m.stream_id for m in messages])
    for tenant in tenants:
        rows = entries(store, tenant)
        assert sorted(r[1] for r in rows) == ["dotted", "plain"]
        canonical = [r for r in rows if r[3] is None]
        aliases = [r for r in rows if r[3] is not None]
        assert len(canonical) == 1 and len(aliases) == 1, rows  # one canonical entry, one alias
        assert aliases[0][3] == canonical[0][0]
        assert version(store, tenant) == 2
    hits = query_service(settings, redis_client, store).answer(RetrievalRequest("cafe-3", "coffee", k=5)).hits
    assert len(hits) == 1 and len(hits[0].aliases) == 1  # asked for, it is one memory with its alias


# 2 -----------------------------------------------------------------------------------------------

def snapshot(store: PostgresStore, tenant: str) -> tuple:
    with store.tenant_tx(tenant) as conn:
        rows = conn.execute("SELECT entry_id, turn_id, canonical_entry_id, text FROM entries ORDER BY entry_id").fetchall()
        sup = conn.execute("SELECT entry_id, cluster, score FROM suppression ORDER BY 1, 2").fetchall()
        ledger = conn.execute("SELECT outcome_id, deltas FROM applied_outcomes ORDER BY 1").fetchall()
        buffer = conn.execute("SELECT outcome_id FROM query_buffer ORDER BY seq").fetchall()
        tenant_row = conn.execute("SELECT memory_version FROM tenants").fetchall()
    return rows, sup, ledger, buffer, tenant_row


@pytest.mark.integration
def test_the_same_turn_entry_delivered_twice_changes_nothing(settings, redis_client, store) -> None:
    settings = settings.replace(claim_idle_ms=0, claim_interval_s=0.0)
    publish(settings, redis_client, [turn("t", f"u{i}", f"fact {i}: the {w} is blue", minutes=i)
                                     for i, w in enumerate(["kettle", "door", "kite", "car"])])
    first = ingest_worker(settings, redis_client, store)
    consumer = first.consumer("first")
    consumer.ensure_group()
    batch = consumer.read()
    first.handle(batch)  # committed, then the process "dies" before XACK
    before = snapshot(store, "t")
    second = ingest_worker(settings, redis_client, store)
    assert run_loop_until(second, lambda: True, name="second")  # claims the idle entries and handles them again
    assert second.metrics.ingest_claimed._value.get() == 4
    assert snapshot(store, "t") == before
    assert second.metrics.ingest_turns_indexed._value.get() == 0
    assert pending(redis_client, settings.turns_stream, INGEST_GROUP) == 0


@pytest.mark.integration
def test_the_same_outcome_entry_delivered_twice_changes_nothing(settings, redis_client, store) -> None:
    publish(settings, redis_client, [turn("t", f"u{i}", f"fact {i} about {w}") for i, w in
                                     enumerate(["owls", "bees", "pears"])])
    assert run_loop_until(ingest_worker(settings, redis_client, store), lambda: len(turn_ids(store, "t")) == 3)
    ids = [r[0] for r in entries(store, "t")]
    embedding = tuple(float(x) for x in HashingEncoder(64).encode(["owls"])[0])
    outcome = Outcome("o1", "t", 1, 3, (PoolRow(ids[0], 1, 3, -0.7), PoolRow(ids[1], 2, 1, 1.2),
                                         PoolRow(ids[2], 3, 2, 0.1)), query_embedding=embedding)
    redis_client.xadd(settings.outcomes_stream, outcome.to_stream_fields())
    worker = suppression_worker(settings, redis_client, store)
    consumer = worker.consumer("s1")
    consumer.ensure_group()
    batch = consumer.read()
    worker.handle(batch)
    before = snapshot(store, "t")
    assert before[1] and before[2] and before[3]  # a score, a ledger row, a buffered embedding
    consumer.ack(worker.handle(batch))  # delivered again
    assert snapshot(store, "t") == before
    assert worker.metrics.suppression_duplicates._value.get() == 1
    assert worker.metrics.suppression_applied._value.get() == 1


# 4 -----------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_index_refresh_during_ingest_commits_sees_whole_versions_only(settings, redis_client, store) -> None:
    per_commit, commits = 4, 25
    writer = ingest_worker(settings, redis_client, store)
    consumer = writer.consumer("writer")
    consumer.ensure_group()
    words = [f"w{i}" for i in range(400)]
    rng = random.Random(7)
    stop = threading.Event()
    failures: list[BaseException] = []

    def ingest() -> None:
        try:
            for c in range(1, commits + 1):
                texts = [" ".join(rng.sample(words, 6)) for _ in range(per_commit - 1)]
                texts.append(texts[0] + "." if c % 3 else " ".join(rng.sample(words, 6)))  # some aliases
                publish(settings, redis_client, [
                    turn("live", f"c{c:03d}-{j}", text, minutes=c) for j, text in enumerate(texts)])
                batch = consumer.read()
                assert len(batch) == per_commit  # one batch, one tenant transaction, one version
                consumer.ack(writer.handle(batch))
        except BaseException as exc:
            failures.append(exc)
        finally:
            stop.set()

    thread = threading.Thread(target=ingest)
    service = query_service(settings, redis_client, store)
    thread.start()
    observed: list[int] = []
    while not stop.is_set() or not observed:
        result = service.answer(RetrievalRequest("live", " ".join(rng.sample(words, 3)), k=50))
        state = service.cache.get("live")
        if result.memory_version == 0:
            continue
        observed.append(result.memory_version)
        # the index holds exactly the turns of versions 1..v (entries + aliases), never a part of a commit
        assert sum(len(e.turn_ids) for e in state.index.entries()) == per_commit * result.memory_version
        assert state.index.version == result.memory_version
        assert all(int(h.turn_id[1:4]) <= result.memory_version for h in result.hits)
    thread.join(30)
    assert not failures, failures
    final = service.answer(RetrievalRequest("live", "w1 w2", k=5))
    cached = service.cache.get("live").index
    assert final.memory_version == commits and sum(len(e.turn_ids) for e in cached.entries()) == per_commit * commits
    assert len(set(observed)) > 1  # refreshes really interleaved with commits
    # the incrementally refreshed index answers exactly as one rebuilt from Postgres in one go
    rebuilt = query_service(settings, redis_client, store)
    for query in [" ".join(rng.sample(words, 3)) for _ in range(15)]:
        got, ref = (s.answer(RetrievalRequest("live", query, k=10)) for s in (service, rebuilt))
        assert [(h.entry_id, h.aliases, h.score) for h in got.hits] == [(h.entry_id, h.aliases, h.score)
                                                                        for h in ref.hits]
    assert sum(len(e.aliases) for e in cached.entries()) > 0


# 5 -----------------------------------------------------------------------------------------------

@pytest.mark.integration
def test_outcomes_folded_one_at_a_time_or_in_one_batch_give_identical_scores(settings, redis_client, store) -> None:
    texts = [f"memory {i} of the {w}" for i, w in enumerate(["fjord", "harbour", "lantern", "orchard", "quarry",
                                                              "summit", "tundra", "valley"])]
    for tenant in ("one-by-one", "batched"):
        publish(settings, redis_client, [turn(tenant, f"u{i}", t, minutes=i) for i, t in enumerate(texts)])
    assert run_loop_until(ingest_worker(settings, redis_client, store),
                          lambda: len(turn_ids(store, "batched")) == len(texts) == len(turn_ids(store, "one-by-one")))
    ids = {t: {r[1]: r[0] for r in entries(store, t)} for t in ("one-by-one", "batched")}
    rng = random.Random(11)
    plans = []
    for n in range(40):
        pool_turns = rng.sample(sorted(ids["batched"]), rng.randint(1, len(texts)))
        finals = list(range(1, len(pool_turns) + 1))
        rng.shuffle(finals)
        rows = [(t, i + 1, f, rng.uniform(-4, 4)) for i, (t, f) in enumerate(zip(pool_turns, finals, strict=True))]
        plans.append((f"o{n}", rng.randint(0, 2), rows))

    def message(tenant: str, plan) -> Outcome:
        oid, cluster, rows = plan
        return Outcome(oid, tenant, cluster, len(rows), tuple(PoolRow(ids[tenant][t], i, f, s) for t, i, f, s in rows))

    worker = suppression_worker(settings, redis_client, store)
    one_by_one = [message("one-by-one", p) for p in plans]
    for outcome in one_by_one:
        worker.handle([_as_stream_message(outcome)])
    worker.handle([_as_stream_message(message("batched", p)) for p in plans])

    def by_turn(tenant: str) -> dict[tuple[str, int], float]:
        turn_of = {e: t for t, e in ids[tenant].items()}
        return {(turn_of[e], c): s for (e, c), s in suppression_rows(store, tenant).items()}

    assert by_turn("one-by-one") == by_turn("batched")  # bit for bit
    table = SuppressionTable()
    for outcome in one_by_one:
        table.apply(outcome_deltas(outcome_record(outcome), UpdateRule.RANK_GAP, settings.eta))
    assert suppression_rows(store, "one-by-one") == pytest.approx(table.scores(), rel=1e-12, abs=1e-15)
    assert len(table.scores()) > 5


_STREAM_SEQ = itertools.count(1)


def _as_stream_message(outcome: Outcome) -> StreamMessage:
    fields = {k.encode(): v.encode() for k, v in outcome.to_stream_fields().items()}
    return StreamMessage(f"0-{next(_STREAM_SEQ)}", fields)


# 6 -----------------------------------------------------------------------------------------------

@pytest.mark.integration
@pytest.mark.e2e
def test_query_worker_killed_mid_rerank_ends_in_a_typed_timeout_and_a_retry_succeeds(
        settings, redis_client, store, tmp_path: Path) -> None:
    publish(settings, redis_client, [turn("t", f"u{i}", text, minutes=i) for i, text in enumerate(
        ["the spare key is under the blue flowerpot", "the bakery opens at seven", "Ines teaches the cello"])])
    assert run_loop_until(ingest_worker(settings, redis_client, store), lambda: len(turn_ids(store, "t")) == 3)
    marker = tmp_path / "rerank-started"
    slow = spawn_logged([sys.executable, "-m", "tests.badinput.slow_query_worker", "--marker", str(marker),
                   "--sleep-s", "120"], settings, tmp_path / "slow.log")
    client = client_for(settings, redis_client)
    outcome: dict[str, object] = {}

    def ask() -> None:
        started = time.monotonic()
        try:
            outcome["result"] = client.retrieve("t", "where is the spare key", k=3, timeout_s=20.0,
                                                request_id="ask-1")
        except BaseException as exc:
            outcome["error"] = exc
        outcome["seconds"] = time.monotonic() - started

    asker = threading.Thread(target=ask)
    try:
        assert wait_for(lambda: bool(client.query_workers()), 60.0), (tmp_path / "slow.log").read_text()[-3000:]
        asker.start()
        assert wait_for(marker.exists, 30.0), (tmp_path / "slow.log").read_text()[-3000:]
        os.kill(slow.pid, signal.SIGKILL)  # in the middle of the rerank
        asker.join(30.0)
        assert not asker.is_alive(), "the client never returned"
    finally:
        stop_process(slow)
    error = outcome.get("error")
    assert isinstance(error, RetrievalTimeout), outcome
    assert error.status == "started" and float(outcome["seconds"]) < 20.0 + 5.0
    assert redis_client.exists(settings.outcomes_stream) == 0  # the killed job emitted no outcome

    healthy = spawn_logged([sys.executable, "-m", "workers", "worker", "query"], settings, tmp_path / "healthy.log")
    try:
        retry = client.retrieve("t", "where is the spare key", k=3, timeout_s=30.0)
        assert retry.hits and retry.hits[0].turn_id == "u0"
        same_id = client.retrieve("t", "where is the spare key", k=3, timeout_s=30.0, request_id="ask-1")
        assert same_id.request_id == "ask-1" and same_id.hits[0].turn_id == "u0"
    finally:
        healthy.send_signal(signal.SIGTERM)
        try:
            healthy.wait(15)
        except subprocess.TimeoutExpired:
            stop_process(healthy)


# 7 -----------------------------------------------------------------------------------------------

def test_bm25_gives_both_quick_entries_the_same_positive_score() -> None:
    index = BM25Index()
    index.add([1, 2, 3, 4, 5], ["foo", "dog", "baz", "quick god", "quick fox"])
    scores = index.scores("quick")
    assert scores[3] == scores[4] and scores[3] > 0
    assert list(scores[:3]) == [0.0, 0.0, 0.0]
    assert index.search("quick", 10) == [(4, pytest.approx(float(scores[3]))), (5, pytest.approx(float(scores[4])))]


@pytest.mark.integration
def test_bm25_only_service_path_returns_both_quick_entries_first(settings, redis_client, store) -> None:
    publish(settings, redis_client, [turn("t", f"u{i}", text, minutes=i) for i, text in
                                     enumerate(["foo", "dog", "baz", "quick god", "quick fox"])])
    assert run_loop_until(ingest_worker(settings, redis_client, store), lambda: len(turn_ids(store, "t")) == 5)
    service = query_service(settings, redis_client, store, reranker=None)
    service.config = dataclasses.replace(service.config, use_dense=False, rerank=False)
    hits = service.answer(RetrievalRequest("t", "quick", k=5)).hits
    assert [h.turn_id for h in hits] == ["u3", "u4"]


# 8 -----------------------------------------------------------------------------------------------

def test_empty_pool_gives_an_empty_result_without_a_reranker_call() -> None:
    encoder = HashingEncoder(32)
    empty = TenantIndex("t", 32)
    fake = FakeReranker()
    query = encoder.encode(["anything at all"])[0]
    for config in (RetrievalConfig(), RetrievalConfig(use_dense=False), RetrievalConfig(deep_threshold=1e9)):
        result = retrieve(empty, "anything at all", query, k=10, config=config, reranker=fake)
        assert (result.hits, result.outcome, result.pool_size, result.deep_pass) == ((), None, 0, False)
    index = TenantIndex("t", 32)
    index.add([_entry(1, "alpha beta"), _entry(2, "gamma delta")], encoder.encode(["alpha beta", "gamma delta"]))
    result = retrieve(index, "zeta", encoder.encode(["zeta"])[0], k=10, config=RetrievalConfig(use_dense=False),
                      reranker=fake)
    assert result.hits == () and result.outcome is None
    assert fake.calls == [] and fake.pairs_scored == 0


def _entry(entry_id: int, text: str) -> Entry:
    return Entry(entry_id, "t", f"u{entry_id}", "s1", "user", text, datetime(2024, 1, 1, tzinfo=UTC))


def test_many_queries_against_an_empty_dense_index_return_no_phantom_ids() -> None:
    index = TenantIndex("t", 16)
    queries = HashingEncoder(16).encode([f"q{i}" for i in range(40)])
    assert all(row == [] for row in index.dense.search(queries, 10))
    assert np.asarray(queries).shape == (40, 16)
