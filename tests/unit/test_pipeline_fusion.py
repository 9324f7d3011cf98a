"""retrieve() with ``fusion="convex"``: the fused order is the convex fusion of the retrievers' own
scores over the candidates read (shallow: the top ``n_candidates``; deep pass: the whole lists),
suppression subtracts the same penalty, and RRF stays the default."""

from __future__ import annotations

import pytest

from mnemos.errors import InvalidParameterError
from mnemos.fusion import Fusion, convex_fusion, reciprocal_rank_fusion
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import CachedReranker, FakeReranker
from mnemos.suppression import SuppressionTable

from .conftest import build_index

CONVEX = RetrievalConfig(fusion=Fusion.CONVEX, convex_weight=0.3, deep_threshold=None)


def _texts(n: int) -> list[str]:
    return [f"note {i} about topic{i % 7} and thing{i % 5}" for i in range(n)]


def _lists(index, encoder, query, depth):
    return index.bm25.search(query, depth), index.dense.search(encoder.encode([query])[0], depth)[0]


def _run(index, encoder, query, **kwargs):
    kwargs.setdefault("k", 10)
    return retrieve(index, query, encoder.encode([query])[0], outcome_id="o", **kwargs)


def test_rrf_is_the_default_and_convex_is_chosen_by_name():
    assert RetrievalConfig().fusion is Fusion.RRF
    config = RetrievalConfig(fusion="convex", convex_weight=1.0)  # type: ignore[arg-type]
    assert config.fusion is Fusion.CONVEX and config.convex_weight == 1.0


@pytest.mark.parametrize("changes", [{"fusion": "borda"}, {"convex_weight": -0.01}, {"convex_weight": 1.5},
                                     {"convex_weight": float("nan")}])
def test_bad_fusion_settings_are_refused(changes):
    with pytest.raises(InvalidParameterError, match="fusion|convex_weight"):
        RetrievalConfig(**changes)


def test_without_reranker_hits_follow_the_convex_fusion_of_the_top_candidates(encoder):
    index = build_index(_texts(40), encoder)
    query = "topic3 thing2 note"
    config = RetrievalConfig(fusion=Fusion.CONVEX, convex_weight=0.3, n_candidates=8, deep_threshold=None)
    bm25, dense = _lists(index, encoder, query, 8)
    expected = convex_fusion(bm25, dense, weight=0.3)
    result = _run(index, encoder, query, k=10, config=config)
    assert [(h.entry_id, h.score) for h in result.hits] == [(e, pytest.approx(s)) for e, s in expected[:10]]
    rrf = _run(index, encoder, query, k=10, config=RetrievalConfig(n_candidates=8, deep_threshold=None))
    by_rank = reciprocal_rank_fusion([[e for e, _ in bm25], [e for e, _ in dense]])
    assert [h.entry_id for h in rrf.hits] == [e for e, _ in by_rank[:10]]


def test_convex_weight_one_ranks_by_bm25(encoder):
    index = build_index(_texts(40), encoder)
    query = "topic3 thing2"
    bm25, _ = _lists(index, encoder, query, 30)
    result = _run(index, encoder, query, k=5, config=RetrievalConfig(fusion=Fusion.CONVEX, convex_weight=1.0))
    assert [h.entry_id for h in result.hits] == [e for e, _ in bm25[:5]]


def test_suppression_subtracts_the_same_penalty_from_convex_scores(encoder):
    index = build_index(_texts(40), encoder)
    query = "topic3 thing2 note"
    config = RetrievalConfig(fusion=Fusion.CONVEX, convex_weight=0.5, suppression_threshold=0.0, deep_threshold=None)
    base = _run(index, encoder, query, k=10, config=config)
    leader, runner_up = base.hits[0], base.hits[1]
    evidence = (leader.score - runner_up.score) / 0.3 + 1e-6  # just enough to drop the leader to second
    table = SuppressionTable({(leader.entry_id, 2): evidence})
    adjusted = _run(index, encoder, query, k=10, config=config, suppression=table, cluster=2)
    assert [h.entry_id for h in adjusted.hits[:2]] == [runner_up.entry_id, leader.entry_id]
    assert adjusted.hits[1].score == pytest.approx(leader.score - 0.3 * evidence)


def test_convex_pool_is_normalised_over_the_shallow_candidates_even_when_lists_are_read_deeper(encoder):
    index = build_index(_texts(40), encoder)
    confident = FakeReranker(fn=lambda q, t: 5.0)  # no deep pass is ever taken
    deep_ready = RetrievalConfig(fusion=Fusion.CONVEX, n_candidates=5, pool_size=5, deep_pool_size=30,
                                 deep_threshold=0.0)
    shallow_only = RetrievalConfig(fusion=Fusion.CONVEX, n_candidates=5, pool_size=5, deep_threshold=None)
    for query in ["topic3 thing2", "note 17", "thing4 topic1 about"]:
        a = _run(index, encoder, query, reranker=confident, config=deep_ready)
        b = _run(index, encoder, query, reranker=confident, config=shallow_only)
        assert not a.deep_pass and a.outcome.pool == b.outcome.pool
        bm25, dense = _lists(index, encoder, query, 5)
        assert [row.entry_id for row in a.outcome.pool] == [e for e, _ in convex_fusion(bm25, dense)[:5]]


def test_convex_deep_pass_fuses_the_whole_lists(encoder):
    index = build_index(_texts(40), encoder)
    reranker = CachedReranker(FakeReranker(fn=lambda q, t: -1.0))  # never confident
    config = RetrievalConfig(fusion=Fusion.CONVEX, convex_weight=0.7, n_candidates=5, pool_size=5,
                             deep_pool_size=12, deep_threshold=0.0)
    query = "topic3 thing2 note"
    result = _run(index, encoder, query, reranker=reranker, config=config)
    assert result.deep_pass and result.pool_size == 12
    bm25, dense = _lists(index, encoder, query, 12)
    deep_order = [e for e, _ in convex_fusion(bm25, dense, weight=0.7)]
    shallow = {e for e, _ in convex_fusion(bm25[:5], dense[:5], weight=0.7)[:5]}
    pooled = [row.entry_id for row in result.outcome.pool]
    assert shallow <= set(pooled) and reranker.pairs_scored == 12
    assert pooled == [e for e in deep_order if e in set(pooled)]  # the pool keeps the deep fused order
