"""The bench's post-rerank features run on the core (mnemos.features, mnemos.sessions) and give
the reorderings their rules define (AssoMem §4.2, §3.2.3), checked against an oracle."""

from __future__ import annotations

import dataclasses

import pytest

from bench.common.corpora import CorpusMode, rendered_texts
from bench.quality.arms import arm_by_name
from bench.quality.engine import Engine, FoldRerankers, RerankerFold, prepare_questions
from mnemos.encoder import HashingEncoder
from mnemos.features import Feature, FeatureSetting, parse_time_expressions, session_matches
from mnemos.rerank import CachedReranker, FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations
from tests.unit.test_sessions import _oracle_rank

SETTINGS = {
    "session": [FeatureSetting(Feature.SESSION, {"top": 3, "weight": 2.0})],
    "session1": [FeatureSetting(Feature.SESSION, {"top": 1, "weight": 0.5})],
    "temporal": [FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 2.0})],
    "importance": [FeatureSetting(Feature.IMPORTANCE, {"weight": 0.5})],
    "full": [FeatureSetting(Feature.SESSION, {"top": 3, "weight": 2.0}),
             FeatureSetting(Feature.TEMPORAL, {"slack_days": 7, "weight": 2.0})],
}


def _dated_conversations():
    """The synthetic dataset with time expressions in three of every four questions."""
    out = []
    for conv in synthetic_conversations():
        questions = [dataclasses.replace(q, text=q.text + ("", " in May 2023?", " on 5 March, 2023?", " in July?")[i % 4])
                     for i, q in enumerate(conv.questions)]
        out.append(dataclasses.replace(conv, questions=tuple(questions)))
    return out


@pytest.fixture(scope="module")
def engine() -> Engine:
    convs = _dated_conversations()
    folds = [RerankerFold("a", "a", frozenset({"conv-1"})), RerankerFold("b", "b", frozenset({"conv-2"}))]
    rerankers = FoldRerankers(folds, {f.name: CachedReranker(FakeReranker(), max_entries=None) for f in folds})
    return Engine(conversations=convs, questions=prepare_questions(convs), encoder=HashingEncoder(64),
                  rerankers=rerankers, modes=(CorpusMode.PER_TENANT, CorpusMode.POOLED))


@pytest.mark.parametrize("name", ["session", "session1", "temporal", "full"])
def test_reorderings_follow_the_feature_rules(engine: Engine, name: str) -> None:
    """Each bench reordering is what the feature's rule gives on that pool: the session feature
    boosts hits of the oracle's best sessions, the temporal one hits whose session starts in a
    span the question names (or up to slack days after). Compared as orders of entry ids, so the
    test holds on any CPU (no digest of floats)."""
    settings = SETTINGS[name]
    checked = moved = 0
    for mode in engine.modes:
        results = engine.run_plain(mode, arm_by_name("hybrid_rerank"))
        for q in engine.questions:
            pool = results[q.key]
            if not pool.entry_ids:
                continue
            tenant = engine.tenant_of(mode, q)
            sessions = [tenant.entry_session[e] for e in pool.entry_ids]
            total = [0.0] * len(sessions)
            for setting in settings:
                if setting.feature is Feature.SESSION:
                    ranking = _session_oracle(engine, tenant, q)
                    best = set(ranking[: int(setting.params["top"])])
                    hits = [s in best for s in sessions]
                else:
                    spans = parse_time_expressions(q.text, q.question_date)
                    hits = [session_matches(tenant.sessions.date(s), spans, setting.params["slack_days"])
                            for s in sessions]
                total = [t + (setting.params["weight"] if h else 0.0) for t, h in zip(total, hits, strict=True)]
            # a stable sort: ties keep the cross-encoder's order. FakeReranker scores are halves and
            # the weights 2 or 0.5, so these sums are exact on any CPU.
            expected = tuple(pool.entry_ids[i] for i in sorted(range(len(total)), key=lambda i: -(pool.scores[i] + total[i])))
            got = engine.reorder(mode, q, pool, settings)
            assert got == expected, (mode, q.key)
            checked += 1
            moved += got != pool.entry_ids
    assert checked > 0 and moved > 0  # the features did reorder some pools: the comparison is not vacuous


def _session_oracle(engine: Engine, tenant, q) -> list[str]:
    convs = [c for c in engine.conversations if c.conversation_id in tenant.conversations]
    sessions = [f"{c.conversation_id}/{t.session_id}" for c in convs for t in c.turns]
    texts = rendered_texts([t for c in convs for t in c.turns])
    rows = [i for i, (c, _) in enumerate((c, t) for c in engine.conversations for t in c.turns)
            if c.conversation_id in tenant.conversations]
    return list(_oracle_rank(sessions, texts, engine.turn_vectors[rows], q.text, engine.question_vectors[q.row]))


def test_session_index_matches_the_one_shot_build_and_session_dates(engine: Engine) -> None:
    for mode in engine.modes:
        for tenant in engine.tenants[mode].values():
            convs = [c for c in engine.conversations if c.conversation_id in tenant.conversations]
            sessions = [f"{c.conversation_id}/{t.session_id}" for c in convs for t in c.turns]
            texts = rendered_texts([t for c in convs for t in c.turns])
            rows = [i for i, (c, _) in enumerate((c, t) for c in engine.conversations for t in c.turns)
                    if c.conversation_id in tenant.conversations]
            vectors = engine.turn_vectors[rows]
            for q in engine.questions:
                if q.conversation_id in tenant.conversations:
                    vector = engine.question_vectors[q.row]
                    assert tenant.sessions.rank(q.text, vector) == _oracle_rank(sessions, texts, vectors, q.text, vector)
            for entry_id, session in tenant.entry_session.items():
                assert tenant.sessions.date(session) == tenant.entry_date[entry_id]


@pytest.mark.parametrize("feature", [Feature.BM25, Feature.BM25_SCORE, Feature.FIRST_STAGE])
def test_rank_evidence_features_reorder_the_bench_as_the_pipeline_does(engine: Engine, feature: Feature) -> None:
    """The bench adds the bm25, bm25_score and first_stage terms to cached pools after retrieval; the service
    adds them inside retrieve(). Both must give the same order (one code path for ranks and scores)."""
    settings = [FeatureSetting(feature, {"weight": 1.0})]
    arm = arm_by_name("hybrid_rerank")
    checked = moved = 0
    for mode in engine.modes:
        results = engine.run_plain(mode, arm)
        for q in engine.questions:
            pool = results[q.key]
            if len(pool.entry_ids) < 2:
                continue
            assert len(pool.bm25_ranks) == len(pool.bm25_scores) == len(pool.initial_ranks) == len(pool.entry_ids)
            in_service = engine._retrieve(engine.tenant_of(mode, q), q, dataclasses.replace(arm.config, features=tuple(settings)))
            got = engine.reorder(mode, q, pool, settings)
            assert got == tuple(h.entry_id for h in in_service.hits), (mode, q.key)
            checked += 1
            moved += got != pool.entry_ids
    assert checked > 0 and moved > 0
    plain = engine.run_plain(CorpusMode.PER_TENANT, arm_by_name("hybrid_rrf"))
    assert all(p.bm25_ranks == () == p.bm25_scores for p in plain.values())  # no rerank, no ranks to keep
