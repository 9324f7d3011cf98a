"""Benchmark tenants dedupe like the service: the guard, alias facts, alias text in BM25, the ablation."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from bench.common.corpora import CorpusMode, build_tenants, rendered_texts
from bench.common.datasets import Conversation, Question, Turn
from bench.quality.engine import Engine, prepare_questions
from mnemos.encoder import HashingEncoder
from mnemos.filters import EntryFilter

T0 = datetime(2024, 3, 1, 9, tzinfo=UTC)
TURNS = (  # (turn id, session, speaker, text); pairs that an embedding cannot tell apart share a vector
    ("t1", "S1", "Ana", "My new phone number is 0612 345 678."),
    ("t2", "S2", "Ana", "My new phone number is 0699 812 003."),
    ("t3", "S1", "Ana", "I really like coffee."),
    ("t4", "S2", "Ana", "I really like coffee, honestly."),
    ("t5", "S2", "Ben", "I really like coffee."),
)
SAME_VECTOR = {"t2": "t1", "t4": "t3", "t5": "t3"}


def _conversation() -> Conversation:
    turns = tuple(Turn(tid, session, role, text, T0 + timedelta(days=int(session[1:]), minutes=i))
                  for i, (tid, session, role, text) in enumerate(TURNS))
    questions = (Question("q1", "c", "What is Ana's new phone number?", frozenset({"t2"}), 4, None),
                 Question("q2", "c", "Does Ana like coffee?", frozenset({"t4"}), 4, None))
    return Conversation("c", turns, questions)


class _TableEncoder:
    """Hashing encoder, except that turns listed in SAME_VECTOR get the vector of their twin:
    what a sentence encoder does with digits and small additions (cosine >= 0.95)."""

    dim = 64

    def __init__(self) -> None:
        self._hashing = HashingEncoder(self.dim)
        rendered = rendered_texts(_conversation().turns)
        ids = [t[0] for t in TURNS]
        self._alias = {rendered[ids.index(a)]: rendered[ids.index(b)] for a, b in SAME_VECTOR.items()}

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        return self._hashing.encode([self._alias.get(t, t) for t in texts])


def _tenant(guard: bool):
    conv = _conversation()
    vectors = _TableEncoder().encode(rendered_texts(conv.turns))
    return build_tenants([conv], vectors, CorpusMode.PER_TENANT, dim=64, dedupe_guard=guard)["c"]


def test_guard_keeps_distinct_facts_and_speakers_apart_and_folds_true_duplicates():
    tenant = _tenant(guard=True)
    assert tenant.canonical == {"c/t1": 0, "c/t2": 1, "c/t3": 2, "c/t4": 2, "c/t5": 4}
    assert tenant.n_aliases == 1 and len(tenant.index) == 4
    assert tenant.index.entry(2).aliases == ("c/t4",)
    assert tenant.relevant_entries(frozenset({"c/t2"})) == frozenset({1})


def test_alias_text_is_searchable_and_the_alias_keeps_its_own_facts():
    tenant = _tenant(guard=True)
    assert [eid for eid, _ in tenant.index.bm25.search("honestly", 5)] == [2]  # only the alias says it
    assert [eid for eid, _ in tenant.index.bm25.search("0699", 5)] == [1]
    only_s2 = EntryFilter(session_ids=frozenset({"c/S2"}))
    assert tenant.index.allowed_entries(only_s2).tolist() == [1, 2, 4]  # entry 2 through its alias t4


def test_guard_off_is_cosine_alone_and_the_absorbed_number_stays_findable():
    tenant = _tenant(guard=False)
    assert tenant.canonical == {"c/t1": 0, "c/t2": 0, "c/t3": 2, "c/t4": 2, "c/t5": 2}
    assert tenant.n_aliases == 3 and tenant.index.entry(0).aliases == ("c/t2",)
    assert [eid for eid, _ in tenant.index.bm25.search("0699", 5)] == [0]


def test_words_past_the_encoder_window_keep_a_turn_canonical_as_in_the_service():
    """t4 embeds like t3 (SAME_VECTOR); when the encoder's window cut t4 before "honestly", the
    unread words differ and t4 stays its own entry (the ingest worker's rule)."""
    conv = _conversation()
    rendered = rendered_texts(conv.turns)
    vectors = _TableEncoder().encode(rendered)

    def window(texts: Sequence[str]) -> list[str]:
        assert list(texts) == rendered  # what the models see of each turn
        return [", honestly." if t.endswith("honestly.") else "" for t in texts]

    tenant = build_tenants([conv], vectors, CorpusMode.PER_TENANT, dim=64, unread_of=window)["c"]
    assert tenant.canonical["c/t4"] == 3 and tenant.n_aliases == 0
    assert _tenant(guard=True).canonical["c/t4"] == 2  # without a window: aliased as before


def test_dedupe_off_keeps_every_turn():
    conv = _conversation()
    vectors = _TableEncoder().encode(rendered_texts(conv.turns))
    tenant = build_tenants([conv], vectors, CorpusMode.PER_TENANT, dim=64, dedupe_threshold=None)["c"]
    assert tenant.n_aliases == 0 and len(tenant.index) == len(TURNS)


@pytest.mark.parametrize(("guard", "aliases"), [(True, 1), (False, 3)])
def test_engine_threads_the_guard_to_every_mode(guard: bool, aliases: int):
    convs = [_conversation()]
    engine = Engine(conversations=convs, questions=prepare_questions(convs), encoder=_TableEncoder(), rerankers=None,
                    modes=(CorpusMode.PER_TENANT, CorpusMode.POOLED), dedupe_guard=guard)
    for mode in (CorpusMode.PER_TENANT, CorpusMode.POOLED):
        assert sum(t.n_aliases for t in engine.tenants[mode].values()) == aliases
