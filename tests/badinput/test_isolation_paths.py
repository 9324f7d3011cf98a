"""Promise 3 through the service: tenants A and B store identical text; A asks through every path.

Paths: hybrid + rerank (the default), BM25 only, dense only, hybrid without rerank, a forced deep
pass, the cached index (unchanged, after B writes, after A writes), suppression after A's
centroids froze, and the rq job path. Every hit and every outcome pool row must be A's; B's
suppression rows, bootstrap buffer, centroids and memory version must not move.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.errors import RequestIdReused
from api.schemas import Outcome, RetrievalRequest
from mnemos.rerank import FakeReranker
from tests.badinput import harness
from tests.support import JOB_TTLS, spawn_logged, wait_for
from workers.query.worker import QueryService, build_worker
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


SHARED = ["I really like coffee in the morning", "my sister Ana lives in Lisbon", "the spare key is under the mat",
          "we adopted a grey cat named Pixel", "the dentist appointment is on Tuesday", "quick brown fox notes",
          "my password hint is the first dog", "the bakery on Elm Street closes at six"]
B_ONLY = ["beta keeps a secret diary about volcanoes", "beta flew a zeppelin over Reykjavik"]
QUERIES = ["coffee", "Ana Lisbon", "spare key", "grey cat Pixel", "dentist", "volcanoes secret diary",
           "zeppelin Reykjavik", "first dog password", "bakery", "?!"]


def ingest(settings: Settings, connection: redis.Redis, store: PostgresStore, tenant: str, texts: list[str],
           start: int = 0) -> None:
    harness.publish(settings, connection,
                    [harness.turn(tenant, f"u{start + i}", t, minutes=start + i) for i, t in enumerate(texts)])
    worker = harness.ingest_worker(settings, connection, store)
    assert harness.run_loop_until(worker, lambda: len(harness.turn_ids(store, tenant)) >= start + len(texts))


def entry_ids(store: PostgresStore, tenant: str) -> set[int]:
    return {int(r[0]) for r in harness.entries(store, tenant)}


def outcomes(connection: redis.Redis, settings: Settings) -> list[Outcome]:
    return [Outcome.from_stream_fields(fields) for _, fields in connection.xrange(settings.outcomes_stream)]


def b_state(store: PostgresStore) -> tuple:
    with store.tenant_tx("beta") as conn:
        return (conn.execute("SELECT memory_version FROM tenants").fetchall(),
                conn.execute("SELECT count(*) FROM suppression").fetchone(),
                conn.execute("SELECT count(*) FROM query_buffer").fetchone(),
                conn.execute("SELECT count(*) FROM centroids").fetchone(),
                conn.execute("SELECT count(*) FROM applied_outcomes").fetchone())


def ask_all(service: QueryService, **config_changes) -> list:
    if config_changes:
        service.config = dataclasses.replace(service.config, **config_changes)
    return [service.answer(RetrievalRequest("alpha", q, k=10)) for q in QUERIES]


def _shuffling_logit(query: str, text: str) -> float:
    return float(sum(map(ord, text)) % 11) - 5.0


def test_alpha_never_sees_beta_on_any_path(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "alpha", SHARED)
    ingest(settings, redis_client, store, "beta", SHARED + B_ONLY)
    alpha, beta = entry_ids(store, "alpha"), entry_ids(store, "beta")
    assert len(alpha) == len(SHARED) and len(beta) == len(SHARED) + len(B_ONLY) and not alpha & beta
    b_before = b_state(store)

    def check(results, label: str) -> None:
        for result in results:
            got = {h.entry_id for h in result.hits}
            assert got <= alpha, f"{label}: {got - alpha} are beta's entries"
            assert result.pool_size <= len(alpha)
        for outcome in outcomes(redis_client, settings):
            assert outcome.tenant_id == "alpha", label
            assert {p.entry_id for p in outcome.pool} <= alpha, label

    fake = FakeReranker(fn=_shuffling_logit)  # reorders pools, so rank-gap deltas are not all zero
    service = harness.query_service(settings, redis_client, store, fake)
    check(ask_all(service), "hybrid + rerank")
    assert any(r.hits for r in ask_all(service))
    check(ask_all(harness.query_service(settings, redis_client, store, fake), use_dense=False), "bm25 only")
    check(ask_all(harness.query_service(settings, redis_client, store, fake), use_bm25=False), "dense only")
    check(ask_all(harness.query_service(settings, redis_client, store, None), rerank=False), "hybrid, no rerank")
    deep = ask_all(harness.query_service(settings, redis_client, store, fake), deep_threshold=1e9)
    assert deep and all(r.deep_pass for r in deep if r.pool_size)
    check(deep, "deep pass")
    # bm25-only never answers a beta-only query for alpha
    bm25 = harness.query_service(settings, redis_client, store, fake)
    bm25.config = dataclasses.replace(bm25.config, use_dense=False)
    assert bm25.answer(RetrievalRequest("alpha", "zeppelin Reykjavik volcanoes", k=10)).hits == ()

    # cached index: unchanged, then beta writes (alpha's version must not move), then alpha writes
    check(ask_all(service), "cached")
    version = service.cache.get("alpha").index.version
    ingest(settings, redis_client, store, "beta", ["beta's brand new memory about coffee beans"], start=len(SHARED) + 2)
    cached = ask_all(service)
    check(cached, "cached after beta wrote")
    assert {r.memory_version for r in cached} == {version}
    ingest(settings, redis_client, store, "alpha", ["alpha now also likes green tea"], start=len(SHARED))
    alpha = entry_ids(store, "alpha")
    refreshed = ask_all(service)
    check(refreshed, "cached after alpha wrote")
    assert {r.memory_version for r in refreshed} == {version + 1}

    # suppression: fold alpha's outcomes; centroids freeze (K=2 after 4 queries); ask and fold again
    worker = harness.suppression_worker(settings, redis_client, store)

    def fold_all() -> None:
        n_outcomes = redis_client.xlen(settings.outcomes_stream)
        assert harness.run_loop_until(worker, lambda: worker.metrics.suppression_applied._value.get()
                                      + worker.metrics.suppression_duplicates._value.get()
                                      + worker.metrics.dead_letters.labels(reason="processing_error")._value.get()
                                      >= n_outcomes)

    fold_all()
    with store.tenant_tx("alpha") as conn:
        assert conn.execute("SELECT count(*) FROM centroids").fetchone()[0] == 1
    clustered = ask_all(harness.query_service(settings, redis_client, store, fake))
    assert all(r.cluster is not None for r in clustered)
    check(clustered, "clustered")
    fold_all()
    rows = harness.suppression_rows(store, "alpha")
    assert rows and {e for e, _ in rows} <= alpha
    suppressed = ask_all(harness.query_service(settings, redis_client, store, fake))
    check(suppressed, "with suppression")
    assert b_state(store)[1:] == b_before[1:]  # beta: no score, buffer, centroid or ledger row
    assert harness.suppression_rows(store, "beta") == {}


def test_rq_jobs_of_two_tenants_share_one_worker_without_mixing(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "alpha", SHARED)
    ingest(settings, redis_client, store, "beta", SHARED + B_ONLY)
    alpha, beta = entry_ids(store, "alpha"), entry_ids(store, "beta")
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    jobs = []
    for round_ in range(3):
        for tenant in ("alpha", "beta"):
            for q in QUERIES[:5]:
                request = RetrievalRequest(tenant, q, k=10, request_id=f"{tenant}-{round_}-{len(jobs)}")
                jobs.append((tenant, queue.enqueue("workers.query.worker.retrieval_job", request.to_payload(),
                                                   job_id=request.request_id, **JOB_TTLS)))
    service = harness.query_service(settings, redis_client, store, FakeReranker())
    build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-iso").work(burst=True)
    for tenant, job in jobs:
        result = job.latest_result()
        assert result is not None and result.type == result.Type.SUCCESSFUL, job.id
        got = {h["entry_id"] for h in result.return_value["hits"]}
        assert got and got <= (alpha if tenant == "alpha" else beta)
        assert result.return_value["tenant_id"] == tenant
    assert len(service.cache) == 2


@pytest.mark.e2e
def test_the_same_request_id_from_two_tenants_never_returns_the_other_tenants_result(
        settings, redis_client, store, tmp_path: Path) -> None:
    """Request ids are chosen by clients; rq job ids are one global namespace per Redis."""
    ingest(settings, redis_client, store, "alpha", SHARED)
    ingest(settings, redis_client, store, "beta", SHARED + B_ONLY)
    alpha, beta = entry_ids(store, "alpha"), entry_ids(store, "beta")
    request_id = f"req-{uuid.uuid4().hex[:8]}"
    worker = spawn_logged([sys.executable, "-m", "workers", "worker", "query"], settings, tmp_path / "query.log")
    try:
        client = harness.client_for(settings, redis_client)
        assert wait_for(lambda: bool(client.query_workers()), 60.0), (tmp_path / "query.log").read_text()[-3000:]
        first = client.retrieve("alpha", "grey cat Pixel", k=5, request_id=request_id, timeout_s=30.0)
        assert first.tenant_id == "alpha" and {h.entry_id for h in first.hits} <= alpha
        second = client.retrieve("beta", "zeppelin Reykjavik", k=5, request_id=request_id, timeout_s=30.0)
        assert second.tenant_id == "beta" and second.hits and {h.entry_id for h in second.hits} <= beta
        with pytest.raises(RequestIdReused):  # alpha's id names its first request: never another's answer
            client.retrieve("alpha", "dentist appointment", k=5, request_id=request_id, timeout_s=30.0)
        again = client.retrieve("alpha", "grey cat Pixel", k=5, request_id=request_id, timeout_s=30.0)
        assert again.tenant_id == "alpha" and {h.entry_id for h in again.hits} <= alpha  # a retry, answered afresh
    finally:
        worker.terminate()
        try:
            worker.wait(15)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait(5)
