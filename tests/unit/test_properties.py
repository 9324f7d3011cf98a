"""Property tests (hypothesis) for fusion, dedupe, BM25 incrementality and NDCG bounds."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mnemos.bm25_index import BM25Index
from mnemos.dedupe import Signature, dedupe_batch
from mnemos.evaluation import ndcg_at_k
from mnemos.fusion import reciprocal_rank_fusion

FAST = settings(max_examples=40, deadline=None)
EPS = 1e-5  # float32 matmul in the library vs row products here
id_lists = st.lists(st.lists(st.integers(0, 30), max_size=12, unique=True), max_size=3)


@FAST
@given(id_lists, st.integers(0, 100))
def test_rrf_matches_formula_and_is_sorted(lists, k):
    fused = reciprocal_rank_fusion(lists, k=k)
    assert {e for e, _ in fused} == {e for ids in lists for e in ids}
    for entry_id, score in fused:
        expected = sum(1 / (k + ids.index(entry_id) + 1) for ids in lists if entry_id in ids)
        assert abs(score - expected) < 1e-12
    keys = [(-s, e) for e, s in fused]
    assert keys == sorted(keys)


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.integers(0, 8), st.floats(0.5, 0.99), st.integers(0, 3))
def test_dedupe_invariants(seed, n_new, n_existing, threshold, n_signatures):
    """``n_signatures`` 0: the guard is off; else signatures drawn from that many values (1: all equal)."""
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 6)).astype(np.float32)  # few directions: duplicates are common
    pick = lambda n: base[rng.integers(0, 4, n)] + 0.2 * rng.standard_normal((n, 6)).astype(np.float32)  # noqa: E731
    new, existing = pick(n_new), pick(n_existing)
    new /= np.linalg.norm(new, axis=1, keepdims=True)
    existing /= np.linalg.norm(existing, axis=1, keepdims=True) if n_existing else 1
    kinds = [Signature(f"speaker{k}", ()) for k in range(max(n_signatures, 1))]
    new_sigs = [kinds[k] for k in rng.integers(0, len(kinds), n_new)]
    existing_sigs = [kinds[k] for k in rng.integers(0, len(kinds), n_existing)]
    decisions = dedupe_batch(new, existing, threshold, new_signatures=new_sigs, existing_signatures=existing_sigs,
                             guard=n_signatures > 0)
    if n_signatures == 0:
        new_sigs, existing_sigs = [kinds[0]] * n_new, [kinds[0]] * n_existing  # every pair may match
    assert [d.row for d in decisions] == list(range(n_new))  # nothing dropped
    canonical: list[int] = []
    for d in decisions:
        may_existing = np.array([s == new_sigs[d.row] for s in existing_sigs], dtype=bool)
        to_existing = np.where(may_existing, new[d.row] @ existing.T, -np.inf) if n_existing else np.zeros(0)
        if d.existing is not None:
            assert may_existing[d.existing]
            assert to_existing[d.existing] >= threshold - EPS and to_existing[d.existing] >= to_existing.max() - EPS
        else:
            assert (to_existing < threshold + EPS).all()
            to_batch = np.array([new[d.row] @ new[j] if new_sigs[j] == new_sigs[d.row] else -np.inf
                                 for j in canonical])
            if d.batch is not None:
                assert d.batch in canonical and new_sigs[d.batch] == new_sigs[d.row]
                assert new[d.row] @ new[d.batch] >= threshold - EPS
            else:
                assert (to_batch < threshold + EPS).all()
                canonical.append(d.row)


@FAST
@given(st.lists(st.lists(st.sampled_from("abcdefgh"), max_size=6), min_size=1, max_size=20), st.data())
def test_bm25_incremental_equals_fresh(docs, data):
    texts = [" ".join(d) for d in docs]
    cut = data.draw(st.integers(0, len(texts)))
    grown = BM25Index()
    grown.add(range(cut), texts[:cut])
    grown.search("a", 3)
    grown.add(range(cut, len(texts)), texts[cut:])
    fresh = BM25Index()
    fresh.add(range(len(texts)), texts)
    for query in ["a", "b c", "h h g", "z"]:
        assert grown.search(query, 20) == fresh.search(query, 20)
        assert all(score > 0 for _, score in fresh.search(query, 20))


@FAST
@given(st.lists(st.integers(0, 20), max_size=15), st.sets(st.integers(0, 20), max_size=6), st.integers(1, 12))
def test_ndcg_is_bounded_and_perfect_ranking_scores_one(ranked, relevant, k):
    assert 0.0 <= ndcg_at_k(ranked, relevant, k) <= 1.0 + 1e-12
    if relevant:
        assert abs(ndcg_at_k(sorted(relevant), relevant, k) - 1.0) < 1e-12
