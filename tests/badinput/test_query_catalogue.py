"""Bad-input catalogue, query side: odd requests and odd tenants through the query worker.

Requests run through :class:`workers.query.worker.QueryService` (and, for raw payloads that bypass the
client, through an rq ``QueryWorker`` in burst mode). The reranker is a counting
:class:`mnemos.rerank.FakeReranker`, so "no reranker call" is observable.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.errors import InvalidInputError, Reason
from api.schemas import RetrievalRequest
from mnemos.rerank import FakeReranker
from tests.badinput.harness import (
    ingest_worker,
    publish,
    query_service,
    run_loop_until,
    turn,
    turn_ids,
)
from tests.support import JOB_TTLS
from workers.query.worker import build_worker
from workers.runtime.models import TruncationCounter, bi_encoder_dir
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

FACTS = ["I adopted a grey cat named Pixel last spring", "my sister Ana lives in Lisbon near the river",
         "the wifi password at the cabin is on the fridge", "we planted tomatoes and basil in May",
         "the car is booked for a service on Friday"]


def ingest(settings: Settings, connection: redis.Redis, store: PostgresStore, tenant: str, texts: list[str],
           truncation: TruncationCounter | None = None) -> None:
    publish(settings, connection, [turn(tenant, f"{tenant}-{i}", t, minutes=i) for i, t in enumerate(texts)])
    worker = ingest_worker(settings, connection, store, truncation)
    assert run_loop_until(worker, lambda: len(turn_ids(store, tenant)) == len(texts))


def outcomes_published(settings: Settings, connection: redis.Redis) -> int:
    return int(connection.xlen(settings.outcomes_stream))


def run_raw_job(settings: Settings, connection: redis.Redis, store: PostgresStore, payload: Any):
    queue = Queue(settings.queue_name, connection=connection, serializer=JSONSerializer)
    job = queue.enqueue("workers.query.worker.retrieval_job", payload, **JOB_TTLS)
    service = query_service(settings, connection, store)
    build_worker(settings, connection, service, name=f"{settings.stream_prefix}-{job.id[:8]}").work(burst=True)
    return job, service


@pytest.mark.parametrize(("payload", "reason"), [
    ({"v": 1, "tenant_id": "t", "query": "cat", "k": 0}, Reason.K_OUT_OF_RANGE),
    ({"v": 1, "tenant_id": "t", "query": "cat", "k": 10**6}, Reason.K_OUT_OF_RANGE),
    ({"v": 1, "tenant_id": "t", "query": "cat", "k": "ten"}, Reason.K_OUT_OF_RANGE),
    ({"v": 1, "tenant_id": "t", "query": "   "}, Reason.EMPTY_QUERY),
    ({"v": 1, "tenant_id": "t"}, Reason.MISSING_FIELD),
    ({"v": 1, "query": "cat"}, Reason.MISSING_FIELD),
    ({"v": 7, "tenant_id": "t", "query": "cat"}, Reason.UNSUPPORTED_VERSION),
    (["t", "cat"], Reason.MALFORMED_MESSAGE),
    ("just a string", Reason.MALFORMED_MESSAGE),
])
def test_raw_job_payloads_fail_with_their_reason(settings, redis_client, store, payload, reason) -> None:
    job, service = run_raw_job(settings, redis_client, store, payload)
    assert job.get_status(refresh=True) == "failed"
    result = job.latest_result()
    assert result is not None and reason.value in (result.exc_string or "")
    assert service.metrics.query_jobs.labels(status="error")._value.get() == 1
    assert outcomes_published(settings, redis_client) == 0


@pytest.mark.parametrize(("payload", "reason"), [
    ({"v": 1, "tenant_id": "t", "query": "cat", "k": 0}, Reason.K_OUT_OF_RANGE),
    ("just a string", Reason.MALFORMED_MESSAGE),
])
def test_an_invalid_raw_job_is_one_log_line_with_its_reason(settings, redis_client, store, caplog, payload,
                                                            reason) -> None:
    """Not rq's 24-line traceback per job: one line naming the job and the reason; the job still
    records the failure (asserted above) for its caller."""
    with caplog.at_level(logging.DEBUG):
        job, _ = run_raw_job(settings, redis_client, store, payload)
    assert job.get_status(refresh=True) == "failed"
    assert reason.value in (job.latest_result().exc_string or "")
    shown = [r for r in caplog.records if r.levelno >= logging.INFO]  # rq's DEBUG lines may hold the traceback
    assert not [r for r in shown if "Traceback" in r.getMessage() or r.exc_info or r.exc_text]
    about_job = [r for r in shown if job.id in r.getMessage() and r.levelno >= logging.WARNING]
    assert len(about_job) == 1, [r.getMessage() for r in about_job]
    line = about_job[0].getMessage()
    assert "\n" not in line and reason.value in line


def test_query_of_only_stopwords(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "t", FACTS)
    fake = FakeReranker()
    result = query_service(settings, redis_client, store, fake).answer(RetrievalRequest("t", "the in a of on", k=5))
    assert 0 < len(result.hits) <= 5  # no stopword removal: these are ordinary tokens
    assert all(h.turn_id.startswith("t-") for h in result.hits)


@pytest.mark.parametrize("query", ["?!?...", "🎉🙂", "— …"])
def test_query_that_tokenizes_to_nothing(settings, redis_client, store, query: str) -> None:
    ingest(settings, redis_client, store, "t", FACTS)
    service = query_service(settings, redis_client, store, FakeReranker())
    result = service.answer(RetrievalRequest("t", query, k=3))
    assert len(result.hits) == 3  # the dense arm still answers; BM25 contributes nothing
    assert [h.rank for h in result.hits] == [1, 2, 3]
    assert service.cache.get("t").index.bm25.search(query, 10) == []


def test_tenant_with_no_entries_answers_a_burst_of_queries_with_nothing(settings, redis_client, store) -> None:
    with store.tenant_tx("hollow") as conn:  # the tenant exists, but it has no entries
        conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES ('hollow', 1)")
    fake = FakeReranker()
    service = query_service(settings, redis_client, store, fake)
    for i in range(25):
        result = service.answer(RetrievalRequest("hollow", f"question number {i} about anything", k=10))
        assert (result.hits, result.pool_size, result.deep_pass) == ((), 0, False)
    assert fake.calls == []  # no pool, no reranker call
    assert outcomes_published(settings, redis_client) == 0
    assert service.metrics.query_jobs.labels(status="ok")._value.get() == 25


def test_unknown_tenant_gets_an_empty_result_and_is_not_created(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "known", FACTS)
    fake = FakeReranker()
    service = query_service(settings, redis_client, store, fake)
    for query in ("Pixel", "grey cat", "Lisbon"):
        result = service.answer(RetrievalRequest("nobody-here", query, k=10))
        assert result.hits == () and result.memory_version == 0
    assert fake.calls == [] and outcomes_published(settings, redis_client) == 0
    with store.tenant_tx("nobody-here") as conn:
        assert conn.execute("SELECT count(*) FROM tenants").fetchone()[0] == 0
    assert len(service.cache) == 0  # nothing cached for a tenant that does not exist


def test_tenant_whose_entries_all_tokenize_to_nothing(settings, redis_client, store) -> None:
    symbols = ["🎉🎉", "?!", "🙂🙂🙂", "…", "☕️"]
    ingest(settings, redis_client, store, "symbols", symbols)
    ingest(settings, redis_client, store, "words", FACTS)
    service = query_service(settings, redis_client, store, FakeReranker())
    seen: set[str] = set()
    for i in range(20):
        query = ["coffee", "🎉🎉", "where is Pixel", "?!"][i % 4]
        result = service.answer(RetrievalRequest("symbols", query, k=5))
        assert result.hits and all(h.turn_id.startswith("symbols-") for h in result.hits)
        seen.update(h.turn_id for h in result.hits)
    assert service.cache.get("symbols").index.bm25.search("coffee", 10) == []
    assert "symbols-0" in seen  # the exact emoji query finds its entry through the dense arm


def test_k_at_the_maximum_with_fewer_entries(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "t", FACTS)
    result = query_service(settings, redis_client, store).answer(RetrievalRequest("t", "cat", k=settings.max_k))
    ids = [h.entry_id for h in result.hits]
    assert 0 < len(ids) <= len(FACTS) and len(set(ids)) == len(ids)
    assert [h.rank for h in result.hits] == list(range(1, len(ids) + 1))


def test_k_beyond_the_maximum_is_refused_by_the_worker(settings, redis_client, store) -> None:
    service = query_service(settings, redis_client, store)
    with pytest.raises(InvalidInputError) as info:
        service.handle_payload({"v": 1, "tenant_id": "t", "query": "cat", "k": settings.max_k + 1})
    assert info.value.reason is Reason.K_OUT_OF_RANGE


def test_long_turn_keeps_its_fact_at_the_end(settings, redis_client, store) -> None:
    """A 600+ word-piece turn: the encoder sees a prefix (counted), BM25 and the store see it all."""
    path = bi_encoder_dir(settings.replace(bi_encoder="bundled"))
    assert path is not None
    filler = " ".join(f"meadow{i % 50} river stone cloud" for i in range(160))  # 640 words
    long_text = f"{filler}. The storage unit code is 8841 zebra."
    truncation = TruncationCounter.for_model_dir(path)
    assert truncation.truncated([long_text]) == [True]
    worker_texts = [*FACTS, long_text]
    publish(settings, redis_client, [turn("t", f"t-{i}", x, minutes=i) for i, x in enumerate(worker_texts)])
    worker = ingest_worker(settings, redis_client, store, truncation)
    assert run_loop_until(worker, lambda: len(turn_ids(store, "t")) == len(worker_texts))
    assert worker.metrics.ingest_truncated._value.get() == 1
    with store.tenant_tx("t") as conn:
        stored, cut = conn.execute("SELECT text, encoder_truncated FROM entries WHERE turn_id = 't-5'").fetchone()
    assert stored == long_text and cut is True
    hits = query_service(settings, redis_client, store).answer(RetrievalRequest("t", "storage unit code zebra", k=3)).hits
    assert hits and hits[0].turn_id == "t-5" and hits[0].text.endswith("8841 zebra.")
