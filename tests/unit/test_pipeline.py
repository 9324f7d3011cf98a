"""retrieve(): fusion order, suppression before the pool cut, rerank + outcome, deep pass, guards."""

import itertools

import numpy as np
import pytest

from mnemos.errors import DimensionMismatchError, EmptyQueryError, InvalidParameterError
from mnemos.fusion import reciprocal_rank_fusion
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import CachedReranker, FakeReranker
from mnemos.suppression import DEFAULT_ETA, SuppressionTable, UpdateRule, outcome_deltas
from mnemos.tenant_index import TenantIndex

from .conftest import build_index, make_entries

TEXTS = [
    "my dog Rex sleeps in the garden",
    "Rex the dog loves the beach",
    "I booked a flight to Lisbon",
    "the Lisbon flight leaves on Friday",
    "my sister lives in Porto",
    "dentist appointment next Tuesday",
    "the garden needs new roses",
    "quarterly tax forms are due",
    "we adopted a cat named Miso",
    "Miso the cat hates the dog",
]
NO_DEEP = RetrievalConfig(deep_threshold=None)


def _q(encoder, text):
    return encoder.encode([text])[0]


def _run(index, encoder, query, **kwargs):
    kwargs.setdefault("outcome_id", "o1")
    kwargs.setdefault("k", 10)
    return retrieve(index, query, _q(encoder, query), **kwargs)


@pytest.fixture
def index(encoder):
    return build_index(TEXTS, encoder)


def test_without_reranker_hits_follow_rrf_of_both_retrievers(index, encoder):
    query = "where does the dog sleep"
    bm25 = [eid for eid, _ in index.bm25.search(query, 30)]
    dense = [eid for eid, _ in index.dense.search(_q(encoder, query), 30)[0]]
    expected = reciprocal_rank_fusion([bm25, dense], k=60)[:5]
    result = _run(index, encoder, query, k=5, reranker=None)
    assert [(h.entry_id, h.score) for h in result.hits] == [(e, pytest.approx(s)) for e, s in expected]
    assert [h.rank for h in result.hits] == [1, 2, 3, 4, 5]
    assert result.outcome is None and result.pool_size == 0 and result.top_rerank_score is None
    off = _run(index, encoder, query, k=5, reranker=FakeReranker(), config=RetrievalConfig(rerank=False))
    assert [h.entry_id for h in off.hits] == [h.entry_id for h in result.hits] and off.outcome is None


def test_rerank_orders_hits_and_outcome_records_both_ranks(index, encoder):
    query = "Rex dog garden"
    reranker = FakeReranker()
    result = _run(index, encoder, query, k=3, reranker=reranker, config=NO_DEEP)
    outcome = result.outcome
    fused = [eid for eid, _ in reciprocal_rank_fusion(
        [[e for e, _ in index.bm25.search(query, 30)], [e for e, _ in index.dense.search(_q(encoder, query), 30)[0]]])]
    assert [row.entry_id for row in outcome.pool] == fused[:30]
    assert [row.initial_rank for row in outcome.pool] == list(range(1, len(outcome.pool) + 1))
    assert sorted(row.final_rank for row in outcome.pool) == list(range(1, len(outcome.pool) + 1))
    by_final = sorted(outcome.pool, key=lambda r: r.final_rank)
    scores = [r.rerank_score for r in by_final]
    assert scores == sorted(scores, reverse=True)
    for a, b in itertools.pairwise(by_final):  # rerank ties keep the initial order
        if a.rerank_score == b.rerank_score:
            assert a.initial_rank < b.initial_rank
    assert [h.entry_id for h in result.hits] == [r.entry_id for r in by_final[:3]]
    assert [h.score for h in result.hits] == scores[:3]
    assert result.top_rerank_score == scores[0] == 2.5  # "rex", "dog", "garden" in entry 1
    assert outcome.pool_size == result.pool_size == len(outcome.pool)
    assert outcome.outcome_id == "o1" and outcome.tenant_id == "t1"
    assert len(outcome.query_embedding) == encoder.dim
    assert len(reranker.calls) == 1


def test_suppression_is_subtracted_before_the_pool_cut(index, encoder):
    query = "Rex dog garden"
    config = RetrievalConfig(pool_size=2, deep_threshold=None, alpha=0.3)
    plain = _run(index, encoder, query, reranker=FakeReranker(), config=config)
    top_entry = plain.outcome.pool[0].entry_id
    table = SuppressionTable({(top_entry, 4): 1.0})
    suppressed = _run(index, encoder, query, reranker=FakeReranker(), config=config, suppression=table, cluster=4)
    assert top_entry not in {row.entry_id for row in suppressed.outcome.pool}
    other_cluster = _run(index, encoder, query, reranker=FakeReranker(), config=config, suppression=table, cluster=5)
    assert top_entry in {row.entry_id for row in other_cluster.outcome.pool}
    switched_off = RetrievalConfig(pool_size=2, deep_threshold=None, suppression=False)
    ignored = _run(index, encoder, query, reranker=FakeReranker(), config=switched_off, suppression=table, cluster=4)
    assert top_entry in {row.entry_id for row in ignored.outcome.pool}
    assert suppressed.cluster == 4 and suppressed.outcome.cluster == 4


def test_penalty_arithmetic_on_fused_scores(index, encoder):
    query = "Lisbon flight"
    base = _run(index, encoder, query, k=10, reranker=None)
    first, second = base.hits[0], base.hits[1]
    # penalty 0.3 * s on the leader; choose s so it drops just below the runner-up
    gap = first.score - second.score
    table = SuppressionTable({(first.entry_id, 0): gap / 0.3 + 1e-6})
    paper_rule = RetrievalConfig(suppression_threshold=0.0)  # every bit of s counts
    adjusted = _run(index, encoder, query, k=10, reranker=None, suppression=table, cluster=0, config=paper_rule)
    assert adjusted.hits[0].entry_id == second.entry_id
    moved = next(h for h in adjusted.hits if h.entry_id == first.entry_id)
    assert moved.score == pytest.approx(first.score - 0.3 * (gap / 0.3 + 1e-6))


def test_suppression_threshold_counts_only_evidence_above_tau(index, encoder):
    query = "Lisbon flight"
    base = _run(index, encoder, query, k=10, reranker=None)
    first, second = base.hits[0], base.hits[1]
    gap = first.score - second.score
    score = gap / 0.3 + 0.5  # enough to drop the leader below the runner-up without a threshold
    table = SuppressionTable({(first.entry_id, 0): score})
    below = _run(index, encoder, query, k=10, reranker=None, suppression=table, cluster=0,
                 config=RetrievalConfig(suppression_threshold=score))
    assert [h.entry_id for h in below.hits] == [h.entry_id for h in base.hits]
    assert below.hits[0].score == pytest.approx(first.score)
    tau = 0.25
    above = _run(index, encoder, query, k=10, reranker=None, suppression=table, cluster=0,
                 config=RetrievalConfig(suppression_threshold=tau))
    moved = next(h for h in above.hits if h.entry_id == first.entry_id)
    assert moved.score == pytest.approx(first.score - 0.3 * (score - tau))
    assert above.hits[0].entry_id == second.entry_id


@pytest.mark.parametrize("tau", [-0.1, float("nan"), float("inf")])
def test_suppression_threshold_must_be_finite_and_non_negative(tau):
    with pytest.raises(InvalidParameterError, match="suppression_threshold"):
        RetrievalConfig(suppression_threshold=tau)


def test_a_nan_deep_threshold_is_refused_not_silently_never_taken():
    with pytest.raises(InvalidParameterError, match="deep_threshold"):
        RetrievalConfig(deep_threshold=float("nan"))
    assert not RetrievalConfig().deep_enabled  # the default: no deep pass


def test_closed_loop_outcome_feeds_the_next_retrieval(index, encoder):
    query = "the dog"
    config = RetrievalConfig(deep_threshold=None, suppression_threshold=0.0)
    leader = _run(index, encoder, query, reranker=None).hits[0]
    reranker = FakeReranker(overrides={index.rendered(leader.entry_id): -5.0}, fn=lambda q, t: 1.0)  # rejects it
    table = SuppressionTable()
    first = _run(index, encoder, query, reranker=reranker, config=config, suppression=table, cluster=0)
    row = next(r for r in first.outcome.pool if r.entry_id == leader.entry_id)
    assert (row.initial_rank, row.final_rank) == (1, first.pool_size)
    deltas = outcome_deltas(first.outcome, UpdateRule.RANK_GAP, eta=DEFAULT_ETA)
    assert set(deltas) == {(leader.entry_id, 0)}  # everyone else moved up by one
    table.apply(deltas)
    second = _run(index, encoder, query, reranker=None, suppression=table, cluster=0, config=config)
    penalised = next(h for h in second.hits if h.entry_id == leader.entry_id)
    assert penalised.score == pytest.approx(leader.score - 0.3 * deltas[(leader.entry_id, 0)])


def test_deep_pass_widens_pool_and_scores_only_new_entries(encoder):
    texts = [f"note {i} about topic{i % 7} and thing{i % 5}" for i in range(40)]
    index = build_index(texts, encoder)
    reranker = CachedReranker(FakeReranker(fn=lambda q, t: -1.0))  # never confident
    config = RetrievalConfig(n_candidates=5, pool_size=5, deep_pool_size=12, deep_threshold=0.0)
    result = _run(index, encoder, "topic3 thing2 note", reranker=reranker, config=config)
    assert result.deep_pass and result.pool_size == 12 == len(result.outcome.pool)
    first_call, second_call = reranker.inner.calls
    assert len(first_call[1]) == 5 and len(second_call[1]) == 7
    assert not set(first_call[1]) & set(second_call[1])
    assert reranker.pairs_scored == 12 and reranker.cache_hits == 0
    assert result.top_rerank_score == -1.0


def test_no_deep_pass_when_confident_or_disabled(encoder):
    texts = [f"note {i} about topic{i % 7}" for i in range(40)]
    index = build_index(texts, encoder)
    confident = FakeReranker(fn=lambda q, t: 3.0)
    config = RetrievalConfig(n_candidates=5, pool_size=5, deep_pool_size=12, deep_threshold=0.0)
    result = _run(index, encoder, "topic3", reranker=confident, config=config)
    assert not result.deep_pass and result.pool_size == 5 and len(confident.calls) == 1
    unsure = FakeReranker(fn=lambda q, t: -3.0)
    disabled = RetrievalConfig(n_candidates=5, pool_size=5, deep_pool_size=12, deep_threshold=None)
    result = _run(index, encoder, "topic3", reranker=unsure, config=disabled)
    assert not result.deep_pass and result.pool_size == 5 and len(unsure.calls) == 1


def test_deep_pass_on_small_tenant_makes_no_empty_rerank_call(index, encoder):
    reranker = FakeReranker(fn=lambda q, t: -2.0)
    result = _run(index, encoder, "dog", reranker=reranker, config=RetrievalConfig(deep_threshold=0.0))
    assert result.deep_pass and result.pool_size == len(TEXTS) and len(reranker.calls) == 1


@pytest.mark.parametrize("query", ["", "   ", "\n\t"])
def test_empty_query_raises(index, encoder, query):
    with pytest.raises(EmptyQueryError):
        retrieve(index, query, _q(encoder, "x"), k=10, reranker=FakeReranker(), outcome_id="o")


def test_punctuation_query_uses_dense_only(index, encoder):
    assert index.bm25.search("?!?", 10) == []
    result = _run(index, encoder, "?!?", k=3, reranker=FakeReranker(), config=NO_DEEP)
    assert len(result.hits) == 3


def test_tenant_whose_turns_have_no_tokens(encoder):
    index = build_index(["?!", "...", "🙂🙂", "—"], encoder)
    reranker = FakeReranker()
    result = _run(index, encoder, "hello there", k=2, reranker=reranker, config=NO_DEEP)
    assert len(result.hits) == 2 and len(reranker.calls) == 1
    bm25_only = _run(index, encoder, "hello there", reranker=reranker, config=RetrievalConfig(use_dense=False))
    assert bm25_only.hits == () and bm25_only.outcome is None and len(reranker.calls) == 1


def test_pool_without_candidates_never_calls_the_reranker(index, encoder):
    reranker = FakeReranker()
    result = _run(index, encoder, "!!!", reranker=reranker, config=RetrievalConfig(use_dense=False))
    assert result.hits == () and result.outcome is None and result.pool_size == 0
    assert reranker.calls == []


def test_single_retriever_arms(index, encoder):
    query = "Miso the cat"
    bm25_only = _run(index, encoder, query, k=4, config=RetrievalConfig(use_dense=False))
    assert [h.entry_id for h in bm25_only.hits] == [e for e, _ in index.bm25.search(query, 4)]
    dense_only = _run(index, encoder, query, k=4, config=RetrievalConfig(use_bm25=False))
    assert [h.entry_id for h in dense_only.hits] == [e for e, _ in index.dense.search(_q(encoder, query), 4)[0]]
    no_vec = retrieve(index, query, None, k=2, config=RetrievalConfig(use_dense=False), outcome_id="o")
    assert len(no_vec.hits) == 2
    with pytest.raises(InvalidParameterError):
        RetrievalConfig(use_bm25=False, use_dense=False)


def test_hits_carry_aliases(index, encoder):
    index.add_aliases(1, ["dup-1"])
    result = _run(index, encoder, "Rex sleeps in the garden", k=1, reranker=FakeReranker(), config=NO_DEEP)
    assert result.hits[0].entry_id == 1 and result.hits[0].aliases == ("dup-1",)


def test_timings_come_from_the_injected_clock(index, encoder):
    ticks = itertools.count()
    clock = lambda: float(next(ticks))  # noqa: E731 - every call advances one "second"
    result = _run(index, encoder, "dog", reranker=FakeReranker(), config=NO_DEEP, clock=clock)
    t = result.timings
    for stage in (t.bm25, t.dense, t.fusion, t.suppression, t.rerank):
        assert stage >= 1.0 and stage == int(stage)
    assert t.total >= t.bm25 + t.dense + t.fusion + t.suppression + t.rerank


def test_bad_arguments(index, encoder):
    with pytest.raises(InvalidParameterError):
        _run(index, encoder, "dog", k=0)
    with pytest.raises(DimensionMismatchError):
        retrieve(index, "dog", np.ones(3, np.float32), k=10, outcome_id="o")
    with pytest.raises(DimensionMismatchError):
        retrieve(index, "dog", None, k=10, outcome_id="o")
    with pytest.raises(InvalidParameterError):
        RetrievalConfig(pool_size=0)


def test_results_are_deterministic(index, encoder):
    a = _run(index, encoder, "the flight", reranker=FakeReranker())
    b = _run(index, encoder, "the flight", reranker=FakeReranker())
    assert a.hits == b.hits and a.outcome == b.outcome


def test_entries_added_later_are_retrievable(encoder):
    index = TenantIndex("t1", encoder.dim)
    index.add(make_entries(TEXTS[:5]), encoder.encode(TEXTS[:5]))
    _run(index, encoder, "cat", reranker=FakeReranker())
    later = make_entries(TEXTS[8:], start_id=100)
    index.add(later, encoder.encode(TEXTS[8:]))
    result = _run(index, encoder, "Miso the cat", k=2, reranker=FakeReranker(), config=NO_DEEP)
    assert {h.entry_id for h in result.hits} == {100, 101}


def test_shallow_pool_uses_only_the_top_n_candidates_even_when_lists_are_read_deeper(encoder):
    texts = [f"note {i} about topic{i % 7} and thing{i % 5}" for i in range(40)]
    index = build_index(texts, encoder)
    confident = FakeReranker(fn=lambda q, t: 5.0)  # no deep pass is ever taken
    deep_ready = RetrievalConfig(n_candidates=5, pool_size=5, deep_pool_size=30, deep_threshold=0.0)
    shallow_only = RetrievalConfig(n_candidates=5, pool_size=5, deep_threshold=None)
    for query in ["topic3 thing2", "note 17", "thing4 topic1 about"]:
        a = _run(index, encoder, query, reranker=confident, config=deep_ready)
        b = _run(index, encoder, query, reranker=confident, config=shallow_only)
        assert not a.deep_pass and a.outcome.pool == b.outcome.pool


def test_reranker_returning_wrong_shape_is_reported(index, encoder):
    class Broken:
        def score(self, query, texts):
            return np.zeros(len(texts) + 1, np.float32)

    with pytest.raises(DimensionMismatchError):
        _run(index, encoder, "dog", reranker=Broken())
