"""retrieve() with post-rerank features (AssoMem §4.2 session-then-turn, §3.2.3 temporal match):
they reorder the final hits when on, change nothing when off, and never touch the outcome."""

from __future__ import annotations

import dataclasses
import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mnemos.errors import InvalidParameterError
from mnemos.features import Feature, FeatureSetting
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import FakeReranker
from mnemos.tenant_index import TenantIndex

from .conftest import make_entries

TEXTS = [
    "my dog Rex sleeps in the garden", "Rex the dog loves the beach", "we walked the dog at dawn",
    "I booked a flight to Lisbon", "the Lisbon flight leaves on Friday", "the dog stays with my sister",
    "my sister lives in Porto", "dentist appointment next Tuesday", "the dog barks at the dentist",
    "we adopted a cat named Miso", "Miso the cat hates the dog", "the garden needs new roses",
]
SESSION_DATES = {"S1": datetime(2024, 1, 10, tzinfo=UTC), "S2": datetime(2024, 3, 5, tzinfo=UTC),
                 "S3": datetime(2024, 5, 20, tzinfo=UTC), "S4": datetime(2024, 7, 1, tzinfo=UTC)}
BASE = RetrievalConfig(deep_threshold=None)


@pytest.fixture
def index(encoder) -> TenantIndex:
    entries = [dataclasses.replace(e, occurred_at=SESSION_DATES[e.session_id] + timedelta(minutes=i))
               for i, e in enumerate(make_entries(TEXTS))]
    index = TenantIndex("t1", encoder.dim)
    index.add(entries, encoder.encode(TEXTS))
    return index


def _run(index, encoder, query, config, **kwargs):
    kwargs.setdefault("outcome_id", "o1")
    return retrieve(index, query, encoder.encode([query])[0], k=12, reranker=FakeReranker(), config=config, **kwargs)


def _with(*settings: FeatureSetting) -> RetrievalConfig:
    return dataclasses.replace(BASE, features=settings)


def test_off_and_zero_weights_change_nothing(index, encoder) -> None:
    query = "the dog in March 2024"
    plain = _run(index, encoder, query, BASE)
    assert plain.timings.features == 0.0
    zero = _run(index, encoder, query, _with(FeatureSetting(Feature.SESSION, {"top": 3, "weight": 0.0}),
                                             FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 0.0})))
    assert zero.hits == plain.hits and zero.outcome == plain.outcome
    assert (zero.pool_size, zero.deep_pass, zero.top_rerank_score) == (plain.pool_size, plain.deep_pass,
                                                                       plain.top_rerank_score)


def test_session_feature_lifts_the_top_session_and_keeps_the_outcome(index, encoder) -> None:
    query = "the dog"
    plain = _run(index, encoder, query, BASE)
    best = index.sessions.rank(query, encoder.encode([query])[0])[0]
    on = _run(index, encoder, query, _with(FeatureSetting(Feature.SESSION, {"top": 1, "weight": 100.0})))
    sessions = [h.session_id for h in on.hits]
    n_best = sessions.count(best)
    assert n_best and sessions[:n_best] == [best] * n_best  # the best session's turns come first
    assert [h.entry_id for h in on.hits] != [h.entry_id for h in plain.hits]
    logits = {h.entry_id: h.score for h in plain.hits}
    for hit in on.hits:
        assert hit.score == pytest.approx(logits[hit.entry_id] + (100.0 if hit.session_id == best else 0.0))
    # within a session the cross-encoder's order is kept (stable re-sort)
    for session in set(sessions):
        assert [h.entry_id for h in on.hits if h.session_id == session] == \
               [h.entry_id for h in plain.hits if h.session_id == session]
    assert [h.rank for h in on.hits] == list(range(1, len(on.hits) + 1))
    assert on.outcome == plain.outcome  # rank gap learns from the reranker, not from the features
    assert on.top_rerank_score == plain.top_rerank_score


def test_temporal_feature_uses_session_starts_and_the_reference_time(index, encoder) -> None:
    temporal = _with(FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 50.0}))
    march = _run(index, encoder, "the dog in March 2024", temporal)
    assert march.hits[0].session_id == "S2" and march.hits[0].score > 40
    # "last week" means nothing without a reference time, and May 20-ish with one
    plain = _run(index, encoder, "the dog last week", BASE)
    assert _run(index, encoder, "the dog last week", temporal).hits == plain.hits
    anchored = _run(index, encoder, "the dog last week", temporal,
                    reference_time=datetime(2024, 5, 26, tzinfo=UTC))
    assert anchored.hits[0].session_id == "S3"
    assert anchored.outcome == plain.outcome


def test_features_stage_is_timed_with_the_injected_clock(index, encoder) -> None:
    ticks = itertools.count()
    result = _run(index, encoder, "dog", _with(FeatureSetting(Feature.SESSION, {"top": 2, "weight": 1.0})),
                  clock=lambda: float(next(ticks)))
    assert result.timings.features >= 1.0
    assert result.timings.total >= result.timings.rerank + result.timings.features


def test_features_need_a_reranked_pool(index, encoder) -> None:
    config = _with(FeatureSetting(Feature.SESSION, {"top": 1, "weight": 100.0}))
    query = "dog"
    vector = encoder.encode([query])[0]
    fused = retrieve(index, query, vector, k=5, config=config, reranker=None)
    assert fused.hits == retrieve(index, query, vector, k=5, config=BASE, reranker=None).hits


def test_config_validates_and_stays_hashable() -> None:
    config = _with(FeatureSetting(Feature.SESSION, {"top": 3, "weight": 2.0}))
    assert hash(config) == hash(_with(FeatureSetting(Feature.SESSION, {"weight": 2.0, "top": 3})))
    assert RetrievalConfig(features=[FeatureSetting(Feature.IMPORTANCE, {"weight": 1.0})]).features[0].feature \
        is Feature.IMPORTANCE
    with pytest.raises(InvalidParameterError):
        RetrievalConfig(features=({"feature": "session"},))  # type: ignore[arg-type]


def test_importance_feature_reads_the_pool_embeddings(index, encoder) -> None:
    on = _run(index, encoder, "the dog", _with(FeatureSetting(Feature.IMPORTANCE, {"weight": 5.0})))
    plain = _run(index, encoder, "the dog", BASE)
    assert {h.entry_id for h in on.hits} == {h.entry_id for h in plain.hits}
    assert np.all(np.diff([h.score for h in on.hits]) <= 0)


def test_a_heavy_first_stage_weight_returns_the_fused_order_and_keeps_the_outcome(index, encoder) -> None:
    query = "the dog and the dentist"
    plain = _run(index, encoder, query, BASE)
    fused_order = [e.entry_id for e in sorted(plain.outcome.pool, key=lambda e: e.initial_rank)]
    assert [h.entry_id for h in plain.hits] != fused_order  # the fake reranker reorders this pool
    heavy = _run(index, encoder, query, _with(FeatureSetting(Feature.FIRST_STAGE, {"weight": 1000.0})))
    assert [h.entry_id for h in heavy.hits] == fused_order
    assert heavy.outcome == plain.outcome  # suppression still learns from the cross-encoder's own ranks
    light = _run(index, encoder, query, _with(FeatureSetting(Feature.FIRST_STAGE, {"weight": 1e-9})))
    assert [h.entry_id for h in light.hits] == [h.entry_id for h in plain.hits]


def test_a_heavy_bm25_weight_returns_bm25_order_and_keeps_the_outcome(index, encoder) -> None:
    query = "the dog and the dentist"
    plain = _run(index, encoder, query, BASE)
    depth = BASE.n_candidates
    bm25_rank = {eid: r for r, (eid, _) in enumerate(plain.candidates.bm25[:depth], start=1)}
    heavy = _run(index, encoder, query, _with(FeatureSetting(Feature.BM25, {"weight": 1000.0})))
    ranks = [bm25_rank.get(h.entry_id, depth + 1) for h in heavy.hits]
    assert ranks == sorted(ranks) and len(set(ranks)) > 2  # BM25's order, with the unranked last
    assert [h.entry_id for h in heavy.hits] != [h.entry_id for h in plain.hits]
    assert heavy.outcome == plain.outcome


def test_a_heavy_bm25_score_weight_returns_bm25_order_and_keeps_the_outcome(index, encoder) -> None:
    query = "the dog and the dentist"
    plain = _run(index, encoder, query, BASE)
    listed = dict(plain.candidates.bm25[:BASE.n_candidates])
    floor = min(listed.values())
    heavy = _run(index, encoder, query, _with(FeatureSetting(Feature.BM25_SCORE, {"weight": 1000.0})))
    scores = [listed.get(h.entry_id, floor) for h in heavy.hits]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) > 2  # BM25's order, unlisted last
    assert [h.entry_id for h in heavy.hits] != [h.entry_id for h in plain.hits]
    assert heavy.outcome == plain.outcome


def test_the_bm25_feature_ranks_within_the_filtered_candidates(index, encoder) -> None:
    from mnemos.features import retriever_ranks
    from mnemos.filters import EntryFilter

    query = "the dog and the dentist"
    allowed = EntryFilter(session_ids=frozenset({"S3", "S4"}))
    allowed_ids = index.allowed_entries(allowed)
    result = _run(index, encoder, query, _with(FeatureSetting(Feature.BM25, {"weight": 1000.0})), allowed=allowed)
    assert result.hits and {h.session_id for h in result.hits} <= {"S3", "S4"}
    filtered = index.bm25.search(query, BASE.n_candidates, allowed_ids)
    assert list(result.candidates.bm25) == list(filtered)  # the lists the fusion read, filtered inside BM25
    whole = index.bm25.search(query, BASE.n_candidates)
    assert [eid for eid, _ in whole] != [eid for eid, _ in filtered]
    ranks = retriever_ranks([h.entry_id for h in result.hits], filtered, BASE.n_candidates)
    assert list(ranks) == sorted(ranks)


def test_bm25_ranks_stop_at_the_shallow_depth_after_a_deep_pass(index, encoder) -> None:
    from mnemos.features import retriever_ranks

    query = "the dog and the dentist"
    shallow = dataclasses.replace(BASE, n_candidates=3, pool_size=3, deep_pool_size=12, deep_threshold=1e9)
    deep = _run(index, encoder, query, dataclasses.replace(
        shallow, features=(FeatureSetting(Feature.BM25, {"weight": 1000.0}),)))
    assert deep.deep_pass and deep.pool_size > 3 and len(deep.candidates.bm25) > 3  # read deeper than 3
    ranks = retriever_ranks([h.entry_id for h in deep.hits], deep.candidates.bm25, 3)
    assert list(ranks) == sorted(ranks) and ranks.max() == 4  # turns past BM25's first 3 share rank 4
    assert [h.entry_id for h in deep.hits][:3] == [eid for eid, _ in deep.candidates.bm25[:3]]
    final = {e.entry_id: e.final_rank for e in deep.outcome.pool}
    rest = [final[h.entry_id] for h in deep.hits[3:]]
    assert len(rest) > 2 and rest == sorted(rest)  # tied at rank 4, so in the cross-encoder's order


def test_candidates_are_reported_on_every_path(index, encoder) -> None:
    from mnemos.filters import EntryFilter

    query = "the dog"
    vector = encoder.encode([query])[0]
    fused = retrieve(index, query, vector, k=5, config=BASE, reranker=None)
    assert fused.candidates is not None and fused.candidates.bm25 and fused.candidates.dense
    nothing = EntryFilter(session_ids=frozenset({"no-such-session"}))
    assert retrieve(index, query, vector, k=5, config=BASE, reranker=FakeReranker(), allowed=nothing).candidates is None
