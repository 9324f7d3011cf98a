"""TenantIndex: one tenant per index, entry map, embeddings, aliases, atomic refusals."""

import numpy as np
import pytest

from mnemos.bm25_index import BM25Index
from mnemos.errors import (
    DimensionMismatchError,
    DuplicateEntryError,
    InvalidParameterError,
    TenantMismatchError,
    UnknownEntryError,
)
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import FakeReranker
from mnemos.tenant_index import TenantIndex

from .conftest import build_index, make_entries

TEXTS = ["my dog is called Rex", "I moved to Lisbon in May", "the dentist is on Friday"]


def test_two_tenants_with_identical_text_never_mix(encoder):
    a = build_index(TEXTS, encoder, tenant_id="A", start_id=1)
    b = build_index(TEXTS, encoder, tenant_id="B", start_id=101)
    query = "what is my dog called"
    q = encoder.encode([query])[0]
    for index, ids in ((a, {1, 2, 3}), (b, {101, 102, 103})):
        assert {eid for eid, _ in index.bm25.search(query, 10)} <= ids
        assert {eid for eid, _ in index.dense.search(q, 10)[0]} <= ids
        result = retrieve(index, query, q, k=10, reranker=FakeReranker(), outcome_id="o")
        assert result.hits and {h.entry_id for h in result.hits} <= ids
        assert result.outcome.tenant_id == index.tenant_id
        assert {row.entry_id for row in result.outcome.pool} <= ids


def test_foreign_entry_is_refused_and_nothing_changes(encoder):
    index = build_index(TEXTS[:1], encoder, tenant_id="A")
    mixed = make_entries(TEXTS[1:], tenant_id="A", start_id=10) + make_entries(["x"], tenant_id="B", start_id=20)
    with pytest.raises(TenantMismatchError):
        index.add(mixed, encoder.encode([e.text for e in mixed]))
    assert len(index) == 1 and len(index.bm25) == 1 and len(index.dense) == 1


def test_shape_and_duplicate_refusals_leave_index_unchanged(encoder):
    index = build_index(TEXTS, encoder)
    again = make_entries(["new text"], start_id=1)
    with pytest.raises(DuplicateEntryError):
        index.add(again, encoder.encode(["new text"]))
    fresh = make_entries(["a", "b"], start_id=50)
    with pytest.raises(DimensionMismatchError):
        index.add(fresh, encoder.encode(["a"]))
    assert len(index) == 3 and len(index.bm25) == 3 and len(index.dense) == 3


def test_entry_lookup_embeddings_and_version(encoder):
    index = TenantIndex("t1", encoder.dim)
    assert len(index) == 0 and index.version == 0
    entries = make_entries(TEXTS)
    vectors = encoder.encode(TEXTS)
    index.add(entries[:2], vectors[:2], version=4)
    index.add(entries[2:], vectors[2:], version=5)
    assert index.version == 5 and len(index) == 3
    assert index.entry(2) == entries[1]
    np.testing.assert_allclose(index.embeddings_of([3, 1]), vectors[[2, 0]])
    ids, matrix = index.all_embeddings()
    assert ids == [1, 2, 3]
    np.testing.assert_allclose(matrix, vectors)
    assert index.embeddings_of([]).shape == (0, encoder.dim)
    with pytest.raises(UnknownEntryError):
        index.entry(99)
    with pytest.raises(UnknownEntryError):
        index.embeddings_of([1, 99])


def test_aliases_fold_into_entry_and_alias_map(encoder):
    index = build_index(TEXTS, encoder)
    updated = index.add_aliases(1, ["dup-a", "dup-b", "u1", "dup-a"])
    assert updated.aliases == ("dup-a", "dup-b")
    assert index.entry(1).turn_ids == ("u1", "dup-a", "dup-b")
    assert index.alias_map()["dup-b"] == "u1"
    assert index.alias_map()["u2"] == "u2"


def test_alias_text_counts_for_bm25_on_its_canonical_entry(encoder):
    index = build_index(TEXTS, encoder)
    alias_text = "user: my dog is called Rex, a beagle"
    assert index.bm25.search("beagle", 5) == []
    index.add_aliases(1, ["dup-a"], texts=[alias_text])
    assert [eid for eid, _ in index.bm25.search("beagle", 5)] == [1]
    result = retrieve(index, "beagle", encoder.encode(["beagle"])[0], k=3, reranker=FakeReranker(), outcome_id="o")
    assert result.hits[0].entry_id == 1 and result.hits[0].aliases == ("dup-a",)
    assert index.rendered(1) == "user: my dog is called Rex"  # the reranker still reads the canonical text
    # a fresh BM25 over the canonical rendering plus the alias text ranks the same
    fresh = BM25Index()
    fresh.add([1, 2, 3], [index.rendered(1) + " " + alias_text, index.rendered(2), index.rendered(3)])
    for query in ("beagle", "dog Rex", "Lisbon", "called"):
        np.testing.assert_allclose(index.bm25.scores(query), fresh.scores(query), rtol=1e-6)
    # a known alias is skipped, text included: folding the same alias again changes nothing
    before = index.bm25.scores("beagle")
    index.add_aliases(1, ["dup-a", "u1"], texts=[alias_text, "user: beagle beagle"])
    np.testing.assert_array_equal(index.bm25.scores("beagle"), before)


def test_alias_texts_must_match_turn_ids_and_a_refusal_changes_nothing(encoder):
    index = build_index(TEXTS, encoder)
    with pytest.raises(InvalidParameterError):
        index.add_aliases(1, ["dup-a", "dup-b"], texts=["user: a beagle"])
    assert index.entry(1).aliases == () and index.bm25.search("beagle", 5) == []
    with pytest.raises(UnknownEntryError):
        index.add_aliases(99, ["dup-a"], texts=["user: a beagle"])
    assert index.bm25.search("beagle", 5) == []


def test_empty_tenant_retrieval_has_no_hits_and_no_rerank_call(encoder):
    index = TenantIndex("empty", encoder.dim)
    reranker = FakeReranker()
    result = retrieve(index, "anything", encoder.encode(["anything"])[0], k=10, config=RetrievalConfig(),
                      reranker=reranker, outcome_id="o")
    assert result.hits == () and result.outcome is None and reranker.calls == []


def test_sessions_grow_with_entries_and_alias_turns(encoder):
    texts = TEXTS + ["my dog Rex is a beagle", "Lisbon in May was warm"]
    index = TenantIndex("t1", encoder.dim)
    entries = make_entries(texts, session_of=lambda i: ("S1", "S2", "S1", "S3", "S2")[i])
    index.add(entries[:2], encoder.encode(texts[:2]))
    index.add(entries[2:], encoder.encode(texts[2:]))
    assert index.sessions.session_ids == ("S1", "S2", "S3") and index.sessions.n_turns == 5
    assert index.sessions.date("S2") == entries[1].occurred_at
    earlier = entries[0].occurred_at.replace(year=2020)
    index.add_session_turns(["S2"], ["my dog Rex is called Rex"], encoder.encode(["my dog Rex is called Rex"]), [earlier])
    assert index.sessions.date("S2") == earlier and index.sessions.n_turns == 6 and len(index) == 5
    q = encoder.encode(["dog Rex"])[0]
    assert set(index.sessions.rank("dog Rex", q)) == {"S1", "S2", "S3"}
