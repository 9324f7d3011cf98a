"""The bench's post-rerank features run on the core (mnemos.features, mnemos.sessions) and give
the bench exactly the reorderings it gave before the move (seed 003 §4, §3.2.3)."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest

from bench.arms import arm_by_name
from bench.corpora import CorpusMode
from bench.engine import Engine, FoldRerankers, RerankerFold, prepare_questions
from mnemos.encoder import HashingEncoder
from mnemos.features import Feature, FeatureSetting
from mnemos.rerank import CachedReranker, FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations
from tests.unit.test_sessions import _oracle_rank

# sha256 of the reorderings below, computed with bench/arms.py, bench/corpora.py (SessionRanker)
# and bench/engine.py as they were before the features moved to the core (commit d92c90e)
BEFORE_THE_MOVE = "e3b5722cb85f31a2fcdfbca1df7c5ace76fb9a7b685f1bd3e8a46b7ad668df21"

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


def test_reorderings_are_those_of_the_bench_before_the_move(engine: Engine) -> None:
    out = {}
    for mode in engine.modes:
        results = engine.run_plain(mode, arm_by_name("hybrid_rerank"))
        for name, settings in SETTINGS.items():
            for q in engine.questions:
                out[f"{mode.value}|{name}|{q.key}"] = list(engine.reorder(mode, q, results[q.key], settings))
        for q in engine.questions:
            ranking = engine.tenant_of(mode, q).sessions.rank(q.text, engine.question_vectors[q.row])
            out[f"{mode.value}|ranking|{q.key}"] = list(ranking)
    assert hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest() == BEFORE_THE_MOVE


def test_session_index_matches_the_one_shot_build_and_session_dates(engine: Engine) -> None:
    for mode in engine.modes:
        for tenant in engine.tenants[mode].values():
            convs = [c for c in engine.conversations if c.conversation_id in tenant.conversations]
            sessions = [f"{c.conversation_id}/{t.session_id}" for c in convs for t in c.turns]
            texts = [t.text for c in convs for t in c.turns]
            rows = [i for i, (c, _) in enumerate((c, t) for c in engine.conversations for t in c.turns)
                    if c.conversation_id in tenant.conversations]
            vectors = engine.turn_vectors[rows]
            for q in engine.questions:
                if q.conversation_id in tenant.conversations:
                    vector = engine.question_vectors[q.row]
                    assert tenant.sessions.rank(q.text, vector) == _oracle_rank(sessions, texts, vectors, q.text, vector)
            for entry_id, session in tenant.entry_session.items():
                assert tenant.sessions.date(session) == tenant.entry_date[entry_id]
