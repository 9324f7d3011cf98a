"""The query service's logic against the in-memory store (tests/unit/worker_fakes.py).

The same behaviours run against the real Redis and Postgres in tests/integration/test_query.py;
here: answers from the stored entries with the versions they read, the outcome on its stream, the
index extended by memory version, unknown tenants, version refusals and the suppression penalty.
"""

from __future__ import annotations

import json

import pytest

from api.packets import Packet
from api.schemas import RetrievalRequest, RetrievalResult
from mnemos.encoder import HashingEncoder
from mnemos.rerank import CachedReranker, FakeReranker
from tests.unit.worker_fakes import (
    DIM,
    RecordingRedis,
    conversation,
    ingest_worker,
    query_service,
    turn_message,
    unit_settings,
)
from workers.query.worker import QueryService, RerankCounts
from workers.runtime.errors import EmbeddingVersionError
from workers.runtime.metrics import ServiceMetrics
from workers.store import FakeStore


def _stored(tenant: str = "alice") -> tuple[FakeStore, RecordingRedis]:
    store, redis = FakeStore(), RecordingRedis()
    ingest_worker(store, redis).handle(conversation(tenant))
    return store, redis


def test_an_answer_reads_the_stored_entries_and_sends_its_outcome() -> None:
    store, redis = _stored()
    service = query_service(store, redis)
    result = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=3, request_id="r1"))
    assert result.hits[0].turn_id == "alice-t0"
    assert (result.memory_version, result.suppression_version, result.cluster) == (1, 0, None)
    (message,) = redis.streams["unit:outcomes"]
    body = json.loads(message["outcome"])
    assert message["tenant_id"] == "alice" and body["outcome_id"] == "r1"
    assert len(body["query_embedding"]) == DIM  # no frozen clusters yet: the bootstrap needs it


def test_an_unknown_tenant_gets_an_empty_answer_and_sends_nothing() -> None:
    store, redis = _stored()
    result = query_service(store, redis).answer(RetrievalRequest("nobody", "grey cat"))
    assert result.hits == () and result.memory_version == 0
    assert "unit:outcomes" not in redis.streams


def test_an_unknown_tenant_with_a_budget_gets_an_empty_packet() -> None:
    store, redis = _stored()
    result = query_service(store, redis).answer(RetrievalRequest("nobody", "grey cat", budget_tokens=64))
    assert result.packet == Packet(items=(), omitted=(), budget_tokens=64, used_tokens=0)
    assert result.packet.prompt_text() == ""
    assert RetrievalResult.from_payload(result.to_payload()).packet == result.packet  # also on the wire


def test_the_index_is_extended_when_the_memory_version_moves() -> None:
    store, redis = _stored()
    service = query_service(store, redis)
    service.answer(RetrievalRequest("alice", "cello teacher"))
    ingest_worker(store, redis).handle([turn_message("50-0", "alice", "late", "My violin teacher is Marta",
                                                     session="s9", minutes=90)])
    result = service.answer(RetrievalRequest("alice", "violin teacher Marta", k=1))
    assert result.memory_version == 2 and result.hits[0].turn_id == "late"
    state = service.cache.get("alice")
    assert state is not None and state.index.version == 2


def test_a_tenant_of_another_embedding_version_is_refused_and_forgotten() -> None:
    store, redis = _stored()
    service = query_service(store, redis)
    service.answer(RetrievalRequest("alice", "grey cat"))
    with store.tenant("alice") as tx:
        tx.set_embedding_version(1, DIM * 2)  # as `mnemos reindex` with another encoder would leave it
    with pytest.raises(EmbeddingVersionError):
        service.answer(RetrievalRequest("alice", "grey cat"))
    assert service.cache.get("alice") is None


def test_the_suppression_of_the_query_cluster_pushes_an_entry_down() -> None:
    store, redis = _stored()
    service = query_service(store, redis, unit_settings(clusters_k=1), rerank=False)  # K = 1: cluster 0 always
    first = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=1)).hits[0]
    with store.tenant("alice") as tx:
        tx.add_suppression({(first.entry_id, 0): 100.0})
    again = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=1))
    assert again.cluster == 0 and again.hits[0].entry_id != first.entry_id


class _TruncatingFake(FakeReranker):
    """Counts texts over 30 characters as truncated pairs, as the cross-encoder adapter does by tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.pairs_truncated = 0
        self.queries_truncated = 0

    def score(self, query, texts):
        self.pairs_truncated += sum(len(t) > 30 for t in texts)
        return super().score(query, texts)


def _counter(metric) -> float:
    return metric._value.get()


def test_rerank_cache_and_truncation_counts_reach_the_metrics() -> None:
    store, redis = _stored()
    inner = _TruncatingFake()
    service = QueryService(unit_settings(), redis, store, HashingEncoder(DIM), inner,  # type: ignore[arg-type]
                           ServiceMetrics())
    m = service.metrics
    first = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=3))
    truncated = inner.pairs_truncated
    assert first.pool_size > 0 and truncated > 0
    assert (_counter(m.query_rerank_cache_hits), _counter(m.query_rerank_cache_misses)) == (0, inner.pairs_scored)
    assert _counter(m.query_rerank_pairs_truncated) == truncated
    service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=3))  # every pair from the cache
    assert _counter(m.query_rerank_cache_hits) == first.pool_size
    assert _counter(m.query_rerank_pairs_truncated) == truncated  # the model saw nothing, cut nothing
    assert _counter(m.query_rerank_queries_truncated) == 0


def test_rerank_counts_sum_along_the_chain() -> None:
    cached = CachedReranker(_TruncatingFake())
    cached.score("q", ["a" * 40, "b"])
    cached.score("q", ["b"])
    assert RerankCounts.of(cached) == RerankCounts(cache_hits=1, cache_misses=2, pairs_truncated=1, has_cache=True)
    assert RerankCounts.of(None) == RerankCounts()
    assert RerankCounts.of(cached).since(RerankCounts(cache_hits=1)) == RerankCounts(0, 2, 1, 0, True)


def test_the_fusion_settings_reach_the_retrieval_config() -> None:
    from mnemos.fusion import Fusion
    from workers.query.config import retrieval_config
    from workers.settings import Settings

    default = retrieval_config(Settings(), rerank=True)
    assert default.fusion is Fusion.RRF and default.rrf_k == 60
    convex = retrieval_config(Settings(fusion="convex", convex_weight=0.2), rerank=True)
    assert convex.fusion is Fusion.CONVEX and convex.convex_weight == 0.2


def _count_searches(monkeypatch: pytest.MonkeyPatch, retriever: object) -> list[str]:
    """Record every call of ``retriever``'s search methods and of its scoring pass (``scores``, BM25's)."""
    calls: list[str] = []
    for name in ("search", "search_split", "scores"):
        method = getattr(retriever, name, None)
        if method is None:
            continue

        def counted(*args, _name=name, _method=method, **kwargs):
            calls.append(_name)
            return _method(*args, **kwargs)

        monkeypatch.setattr(retriever, name, counted)
    return calls


@pytest.mark.parametrize("filters", [{"filters": {"session_ids": ["s1"]}},
                                     {"filters": {"roles": ["assistant"]}},
                                     {"as_of": "2024-03-01T09:02:30+00:00"},
                                     {"filters": {"session_ids": ["nowhere"]}}])
def test_a_filtered_packet_request_searches_each_retriever_once(monkeypatch: pytest.MonkeyPatch,
                                                                filters: dict[str, object]) -> None:
    """The packet's hidden candidates are ranked from the retrieval's own scoring pass: BM25 scores the
    query once and the dense index is searched once, however many lists the request needs."""
    store, redis = _stored()
    service = query_service(store, redis)
    service.answer(RetrievalRequest("alice", "warm up"))  # builds the tenant's index
    state = service.cache.get("alice")
    assert state is not None
    bm25, dense = _count_searches(monkeypatch, state.index.bm25), _count_searches(monkeypatch, state.index.dense)
    request = RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "grey cat cello teacher Porto",
                                      "k": 3, "budget_tokens": 200, **filters})
    result = service.answer(request)
    assert result.packet is not None
    assert {o.reason for o in result.packet.omitted} & {"filtered", "not_visible_at_as_of"}  # it did report hidden turns
    assert service.cache.get("alice") is state  # the same index answered (no rebuild)
    assert bm25.count("scores") == 1 and len(bm25) - bm25.count("scores") == 1, bm25
    assert len(dense) == 1, dense
