"""BM25Index: lucene scoring, positive-only results, lazy incremental indexing, guards."""

import math

import numpy as np
import pytest

from mnemos.bm25_index import BM25Index
from mnemos.errors import DuplicateEntryError
from mnemos.tokenizer import tokenize

BUG_CORPUS = ["foo", "dog", "baz", "quick god", "quick fox"]


def _lucene_oracle(docs: list[list[str]], query: list[str], k1=1.5, b=0.75) -> list[float]:
    """Brute-force Lucene BM25 (Kamphuis et al. 2020): sum idf * tf / (tf + k1 (1 - b + b dl/avgdl))."""
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    out = []
    for doc in docs:
        score = 0.0
        for term in query:
            df = sum(term in d for d in docs)
            if df == 0:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = doc.count(term)
            score += idf * tf / (tf + k1 * (1 - b + b * len(doc) / avgdl))
        out.append(score)
    return out


def test_bug_report_small_corpus_quick_scores_equal_and_positive():
    index = BM25Index()
    index.add([10, 11, 12, 13, 14], BUG_CORPUS)
    results = index.search("quick", 10)
    assert [eid for eid, _ in results] == [13, 14]  # equal scores: ties by entry id
    (_, s1), (_, s2) = results
    assert s1 == s2 > 0
    # by hand: N=5, df=2 -> idf = ln(1 + 3.5/2.5) = ln 2.4 = 0.875469
    # avgdl = (1+1+1+2+2)/5 = 1.4; dl = 2 -> 1.5 * (0.25 + 0.75 * 2/1.4) = 1.982143
    # tf=1 -> 1 / (1 + 1.982143) = 0.335329 ; score = 0.875469 * 0.335329 = 0.293570
    assert s1 == pytest.approx(0.293570, abs=1e-5)


def test_only_positive_scores_are_returned():
    index = BM25Index()
    index.add(range(5), BUG_CORPUS)
    assert {eid for eid, _ in index.search("foo dog", 10)} == {0, 1}
    assert all(score > 0 for _, score in index.search("quick fox", 10))


def test_scores_match_bruteforce_oracle(rng):
    vocab = [f"w{i}" for i in range(15)]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(1, 9))) for _ in range(40)]
    index = BM25Index()
    index.add(range(40), texts)
    docs = [tokenize(t) for t in texts]
    for query in ["w1", "w2 w3", "w4 w4 w9", "w14 w0 w7"]:
        expected = _lucene_oracle(docs, tokenize(query))
        np.testing.assert_allclose(index.scores(query), expected, rtol=1e-5, atol=1e-6)
        best = sorted(((i, s) for i, s in enumerate(expected) if s > 0), key=lambda p: (-p[1], p[0]))[:5]
        got = index.search(query, 5)
        assert [i for i, _ in got] == [i for i, _ in best]


def test_incremental_adds_rank_like_a_fresh_build(rng):
    vocab = [f"t{i}" for i in range(20)]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(1, 7))) for _ in range(60)]
    queries = ["t1 t2", "t3", "t5 t6 t7", "t19 t0"]
    incremental = BM25Index()
    for start in range(0, 60, 13):  # chunks of 13, searching in between
        chunk = range(start, min(start + 13, 60))
        incremental.add(list(chunk), [texts[i] for i in chunk])
        incremental.search("t1", 3)
    fresh = BM25Index()
    fresh.add(range(60), texts)
    for query in queries:
        assert incremental.search(query, 60) == fresh.search(query, 60)


def test_reindex_is_lazy_and_happens_once_per_batch_of_adds():
    index = BM25Index()
    index.add([1], ["alpha beta"])
    index.add([2], ["beta gamma"])
    index.add([3], ["gamma delta"])
    assert index.builds == 0
    assert [eid for eid, _ in index.search("gamma", 5)] == [2, 3]
    index.search("beta", 5)
    assert index.builds == 1
    index.add([4], ["gamma gamma"])
    assert index.search("gamma", 1)[0][0] == 4
    assert index.builds == 2


@pytest.mark.parametrize("query", ["", "   ", "?!...", "🙂", "unknownword"])
def test_queries_without_known_tokens_return_nothing(query):
    index = BM25Index()
    index.add(range(5), BUG_CORPUS)
    assert index.search(query, 5) == []


def test_empty_index_and_tokenless_corpus():
    assert BM25Index().search("quick", 5) == []
    index = BM25Index()
    index.add([1, 2], ["?!", "..."])
    assert len(index) == 2
    assert index.search("quick", 5) == []
    index.add([3], ["quick"])  # first real token later: the index builds then
    assert [eid for eid, _ in index.search("quick", 5)] == [3]


def test_n_limits_results_and_nonpositive_n_gives_nothing():
    index = BM25Index()
    index.add(range(6), ["a b", "a", "a c", "a d", "a e", "b"])
    assert len(index.search("a", 3)) == 3
    assert index.search("a", 0) == []


def test_duplicate_ids_are_refused_and_length_mismatch_raises():
    index = BM25Index()
    index.add([1], ["x"])
    with pytest.raises(DuplicateEntryError):
        index.add([1], ["y"])
    with pytest.raises(DuplicateEntryError):
        index.add([2, 2], ["y", "z"])
    with pytest.raises(ValueError):
        index.add([3], ["a", "b"])
    assert len(index) == 1


def test_extend_grows_a_document_like_adding_the_joined_text():
    grown, joined = BM25Index(), BM25Index()
    grown.add([1, 2], ["quick brown", "lazy dog"])
    grown.search("dog", 5)
    grown.extend(1, "jumps over the café!")
    grown.extend(2, "")
    joined.add([1, 2], ["quick brown jumps over the café!", "lazy dog"])
    for query in ("dog", "café jumps", "quick", "brown lazy"):
        assert grown.search(query, 5) == joined.search(query, 5)
    with pytest.raises(KeyError):
        grown.extend(3, "x")


def test_scores_equal_bm25s_lucene_on_a_grown_corpus(rng):
    """bm25s (method="lucene") is the reference: the same documents, grown by adds and transcript
    extensions here and built at once there, score alike."""
    import bm25s

    vocab = [f"v{i}" for i in range(40)]
    texts = [" ".join(rng.choice(vocab, size=rng.integers(0, 12))) for _ in range(80)]
    tails = {i: " ".join(rng.choice(vocab, size=rng.integers(1, 6))) for i in range(0, 80, 7)}
    index = BM25Index()
    for start in range(0, 80, 17):
        index.add(range(start, min(start + 17, 80)), texts[start:start + 17])
        index.search("v1", 3)
    for i, tail in tails.items():
        index.extend(i, tail)
    docs = [tokenize(t + (" " + tails[i] if i in tails else "")) for i, t in enumerate(texts)]
    reference = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    reference.index(docs, show_progress=False)
    for query in ["v1", "v2 v3 v3", "v39 v0 v7 v8", "v5"]:
        np.testing.assert_allclose(index.scores(query), reference.get_scores(tokenize(query)), rtol=1e-5, atol=1e-6)


def test_counted_texts_index_like_texts_and_another_vocabulary_is_refused():
    shared: dict[str, int] = {}
    turns, transcripts, plain = BM25Index(vocabulary=shared), BM25Index(vocabulary=shared), BM25Index()
    texts = ["quick brown fox", "lazy dog", "the quick dog"]
    counted = [turns.count(t) for t in texts]
    turns.add_counted([1, 2, 3], counted)
    transcripts.add_counted([7], [counted[0]])
    transcripts.extend_counted(7, counted[2])
    plain.add([1, 2, 3], texts)
    assert turns.search("quick dog", 5) == plain.search("quick dog", 5)
    joined = BM25Index()
    joined.add([7], ["quick brown fox the quick dog"])
    assert transcripts.scores("quick") == pytest.approx(joined.scores("quick"))
    with pytest.raises(ValueError, match="another vocabulary"):
        BM25Index().add_counted([1], [counted[0]])


def test_a_term_another_index_added_to_the_shared_vocabulary_matches_nothing_here():
    shared: dict[str, int] = {}
    turns, sessions = BM25Index(vocabulary=shared), BM25Index(vocabulary=shared)
    turns.add([1], ["quick fox"])
    sessions.add([1], ["quick fox"])
    assert sessions.search("quick", 5) == [(1, pytest.approx(sessions.scores("quick")[0]))]
    turns.extend(1, "zebra crossing")  # an alias text: the turn index only
    assert sessions.search("zebra quick", 5) == sessions.search("quick", 5)
    assert [eid for eid, _ in turns.search("zebra", 5)] == [1]
