"""LongMemEval in the quality bench: the pooled corpus holds a repeated session once, one-question
conversations are split over the dataset, large tenants dedupe in batches, unscored questions."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest

import bench.common.corpora as corpora
from bench.common.corpora import CorpusMode, build_tenants, rendered_texts
from bench.common.datasets import LONGMEMEVAL_CATEGORIES, Conversation, Question, Turn
from bench.quality.document import no_evidence_json
from bench.quality.engine import PoolResult, Protocol, prepare_questions
from bench.quality.question_metrics import QuestionMetrics
from bench.quality.report import run_row
from mnemos.dedupe import dedupe_batch, turn_signature
from mnemos.encoder import HashingEncoder

T0 = datetime(2024, 3, 1, 9, tzinfo=UTC)


def _haystack(qid: str, sessions: dict[str, list[str]], answer: str | None, shared: bool = True,
              category: int = 1) -> Conversation:
    """One LongMemEval-like item: ``sessions`` maps a session id to its texts; ``answer`` a turn id."""
    turns = tuple(Turn(f"{sid}:{i}", sid, "user", text, T0)
                  for sid, texts in sessions.items() for i, text in enumerate(texts))
    relevant = frozenset({answer}) if answer else frozenset()
    question = Question(qid, qid, f"question {qid}?", relevant, category, None, "single-session-user",
                        LONGMEMEVAL_CATEGORIES[category])
    return Conversation(qid, turns, (question,), shared_turn_ids=shared)


def _vectors(conversations: list[Conversation], dim: int = 64) -> np.ndarray:
    return HashingEncoder(dim).encode(rendered_texts([t for c in conversations for t in c.turns]))


SHARED = ["the shared session talks about gardening tomatoes", "and about watering them twice a week"]


def _dataset(shared: bool = True) -> list[Conversation]:
    return [
        _haystack("q1", {"s_common": SHARED, "s_a": ["I parked my car on level three"]}, "s_a:0", shared),
        _haystack("q2", {"s_b": ["my sister lives in Lisbon now"], "s_common": SHARED}, "s_common:1", shared),
    ]


def test_pooled_corpus_holds_a_repeated_session_once_and_every_question_reaches_it():
    conversations = _dataset()
    tenant = build_tenants(conversations, _vectors(conversations), CorpusMode.POOLED, dim=64)["pooled"]
    assert len(tenant.index) == 4  # s_common:0, s_common:1, s_a:0, s_b:0: each (session, position) once
    assert tenant.n_repeats == 2 and tenant.n_aliases == 0
    assert tenant.conversations == ("q1", "q2")
    # q2's evidence turn is the copy q1 brought in, under q1's global id
    assert tenant.canonical["q2/s_common:1"] == tenant.canonical["q1/s_common:1"]
    questions = prepare_questions(conversations)
    relevant = tenant.relevant_entries(questions[1].relevant_turns)
    assert relevant == {tenant.canonical["q1/s_common:1"]}
    assert tenant.entry_session[next(iter(relevant))] == "q1/s_common"  # one session, not one per question


def test_without_shared_turn_ids_each_conversation_keeps_its_own_turns():
    # LoCoMo's "D1:3" names another turn in every conversation; identical texts are then dedupe's business
    conversations = _dataset(shared=False)
    tenant = build_tenants(conversations, _vectors(conversations), CorpusMode.POOLED, dim=64)["pooled"]
    assert tenant.n_repeats == 0
    assert tenant.n_aliases == 2  # the repeated session's turns are cosine-1 duplicates of the first copy
    assert tenant.canonical["q2/s_common:1"] == tenant.canonical["q1/s_common:1"]


def test_per_tenant_corpus_is_untouched_by_shared_turn_ids():
    conversations = _dataset()
    tenants = build_tenants(conversations, _vectors(conversations), CorpusMode.PER_TENANT, dim=64)
    assert {t: len(v.index) for t, v in tenants.items()} == {"q1": 3, "q2": 3}
    assert all(v.n_repeats == 0 for v in tenants.values())


def _one_question_conversations(n: int) -> list[Conversation]:
    return [_haystack(f"q{i}", {f"s{i}": [f"turn {i}"]}, f"s{i}:0") for i in range(n)]


def test_one_question_conversations_are_split_over_the_dataset():
    questions = prepare_questions(_one_question_conversations(40), seed=3)
    halves = [q.half for q in questions]
    assert halves.count(0) == 20 and halves.count(1) == 20  # a per-conversation split puts all 40 in half B
    assert sum(q.dev for q in questions) == 20
    again = prepare_questions(_one_question_conversations(40), seed=3)
    assert [q.half for q in again] == halves
    other = prepare_questions(_one_question_conversations(40), seed=4)
    assert [q.half for q in other] != halves


def _multi(conversation_id: str, n: int) -> Conversation:
    turns = (Turn("t0", "S1", "Ana", "hello", T0),)
    return Conversation(conversation_id, turns, tuple(
        Question(f"{conversation_id}-{i}", conversation_id, f"q {i}?", frozenset({"t0"}), 1, None) for i in range(n)))


def test_conversations_with_several_questions_are_still_split_each_on_its_own():
    questions = prepare_questions([_multi("a", 6), _multi("b", 6)])
    for c in ("a", "b"):
        assert [q.half for q in questions if q.conversation_id == c].count(0) == 3


def test_in_a_mixed_dataset_the_single_question_conversations_are_split_together():
    questions = prepare_questions([_multi("a", 6), *_one_question_conversations(20)])
    assert [q.half for q in questions if q.conversation_id == "a"].count(0) == 3
    singles = [q for q in questions if q.conversation_id != "a"]
    assert sum(q.half == 0 for q in singles) == 10 and sum(q.dev for q in singles) == 10


def test_a_small_limit_keeps_each_conversations_own_split():
    # cut to one question each, LoCoMo-like conversations must not switch to the dataset-wide split
    full = {q.key: q.half for q in prepare_questions([_multi("a", 8), _multi("b", 8)])}
    limited = prepare_questions([_multi("a", 8), _multi("b", 8)], limit=2)
    assert len(limited) == 2
    assert all(q.half == 1 for q in limited)  # one question per conversation: half A holds len // 2 = 0
    assert set(full) >= {q.key for q in limited}


def test_limit_samples_a_one_question_dataset():
    questions = prepare_questions(_one_question_conversations(40), limit=10, seed=1)
    assert len(questions) == 10
    assert [q.half for q in questions].count(0) == 5
    again = prepare_questions(_one_question_conversations(40), limit=10, seed=1)
    assert [q.key for q in again] == [q.key for q in questions]


def test_shared_turn_ids_must_name_one_turn_per_conversation():
    turns = (Turn("s:0", "s", "user", "one", T0), Turn("s:0", "s", "user", "two", T0))
    broken = Conversation("q1", turns, (), shared_turn_ids=True)
    with pytest.raises(ValueError, match="repeats a turn id"):
        build_tenants([broken], _vectors([broken]), CorpusMode.POOLED, dim=64)


@pytest.mark.parametrize("guard", [True, False])
def test_a_large_tenant_dedupes_in_batches_with_the_same_canonical_rows(monkeypatch, guard):
    rng = np.random.default_rng(0)
    base = rng.normal(size=(60, 32)).astype(np.float32)
    rows = np.concatenate([base, base[:30] + 0.01 * rng.normal(size=(30, 32)).astype(np.float32), base[10:40]])
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    texts = [f"fact {i}" for i in [*range(60), *range(30), *range(10, 40)]]  # a copy has its original's text
    signatures = [turn_signature("user", t) for t in texts]
    whole = corpora._dedupe_rows(rows, signatures, 32, 0.95, guard)
    monkeypatch.setattr(corpora, "DEDUPE_BATCH_ROWS", 16)
    monkeypatch.setattr(corpora, "DEDUPE_CHUNK_ROWS", 7)
    batched = corpora._dedupe_rows(rows, signatures, 32, 0.95, guard)
    assert [d is None for d in batched] == [d is None for d in whole]
    assert sum(d is None for d in whole) == 60  # the noisy and exact copies were all folded
    for i, target in enumerate(batched):
        if target is not None:  # an alias points at an earlier canonical row above the threshold
            assert target < i and whole[target] is None and float(rows[i] @ rows[target]) >= 0.95
            assert not guard or signatures[i] == signatures[target]
    oracle = dedupe_batch(rows, np.zeros((0, 32)), 0.95, new_signatures=signatures, existing_signatures=[],
                          guard=guard)
    assert [d.is_duplicate for d in oracle] == [d is not None for d in whole]


def _metrics(ndcg: float) -> QuestionMetrics:
    return QuestionMetrics(ndcg10=ndcg, recall10=ndcg, recall30=ndcg, exact_episode=0.0, wrong_family=0.0,
                           sibling_confusion=0.0, abstain=None, deep_pass=False)


def test_unscored_questions_get_their_abstention_rate_and_categories_their_names():
    conversations = [_haystack("q1", {"s1": ["a"]}, "s1:0"), _haystack("q2", {"s2": ["b"]}, None, category=5),
                     _haystack("q3", {"s3": ["c"]}, None, category=5), _haystack("q4", {"s4": ["d"]}, None)]
    by_key = {q.key: q for q in prepare_questions(conversations)}
    pools = {"q1": PoolResult((0,), (2.0,), False, 2.0), "q2": PoolResult((1,), (-1.5,), False, -1.5),
             "q3": PoolResult((2,), (0.5,), False, 0.5), "q4": PoolResult((3,), (-3.0,), False, -3.0)}
    runs = [{"corpus": "pooled", "protocol": "heldout", "arm": "hybrid_rerank"},
            {"corpus": "pooled", "protocol": "heldout", "arm": "hybrid_rrf"}]
    results = {(CorpusMode.POOLED, Protocol.HELDOUT, "hybrid_rerank"): pools,
               (CorpusMode.POOLED, Protocol.HELDOUT, "hybrid_rrf"): pools}
    no_evidence_json(runs, results, by_key, 0.0)
    # q2 below 0 logits, q3 above; q4 has an answer whose evidence is missing (not an abstention question)
    assert runs[0]["no_evidence"] == {"n_questions": 2, "abstain@0": 0.5}
    assert "no_evidence" not in runs[1]  # no cross-encoder score to abstain on
    row = run_row(corpus="pooled", protocol="heldout", arm="hybrid_rerank", metrics={"q1": _metrics(1.0)},
                  baseline=None, questions=by_key, abstain_threshold=0.0, n_resamples=100, seed=0)
    assert row["categories"]["1"]["name"] == "single-session-user"
