"""DenseIndex against a brute-force cosine oracle, plus incremental adds and empty-index guards."""

import numpy as np
import pytest

from mnemos.dense_index import DenseIndex
from mnemos.errors import DimensionMismatchError, DuplicateEntryError

from .conftest import unit_rows


def _oracle(vectors, ids, query, n):
    sims = vectors @ query
    order = sorted(range(len(ids)), key=lambda i: (-sims[i], ids[i]))[:n]
    return [ids[i] for i in order], [float(sims[i]) for i in order]


def test_search_matches_bruteforce_cosine(rng):
    vectors = unit_rows(rng, 200, 16)
    ids = [1000 + 3 * i for i in range(200)]
    index = DenseIndex(16)
    index.add(ids, vectors)
    queries = unit_rows(rng, 7, 16)
    results = index.search(queries, 10)
    assert len(results) == 7
    for query, got in zip(queries, results, strict=True):
        want_ids, want_scores = _oracle(vectors, ids, query, 10)
        assert [i for i, _ in got] == want_ids
        np.testing.assert_allclose([s for _, s in got], want_scores, atol=1e-5)


def test_incremental_adds_rank_like_a_fresh_build(rng):
    vectors = unit_rows(rng, 90, 8)
    ids = list(range(5, 95))
    grown = DenseIndex(8)
    for start in range(0, 90, 17):
        grown.add(ids[start : start + 17], vectors[start : start + 17])
        grown.search(vectors[:1], 3)
    fresh = DenseIndex(8)
    fresh.add(ids, vectors)
    queries = unit_rows(rng, 5, 8)
    assert grown.search(queries, 90) == fresh.search(queries, 90)


def test_empty_index_with_a_batch_of_20_queries_returns_empty_lists(rng):
    index = DenseIndex(8)
    results = index.search(unit_rows(rng, 20, 8), 10)
    assert results == [[] for _ in range(20)]


def test_n_larger_than_index_never_returns_padding_ids(rng):
    index = DenseIndex(8)
    index.add([42, 43], unit_rows(rng, 2, 8))
    results = index.search(unit_rows(rng, 20, 8), 10)
    for row in results:
        assert sorted(i for i, _ in row) == [42, 43]
        assert all(i not in (-1, 0) for i, _ in row)


def test_single_row_query_and_nonpositive_n(rng):
    index = DenseIndex(8)
    vectors = unit_rows(rng, 3, 8)
    index.add([1, 2, 3], vectors)
    assert index.search(vectors[1], 1)[0][0][0] == 2
    assert index.search(vectors[1], 0) == [[]]


def test_shape_and_duplicate_guards(rng):
    index = DenseIndex(8)
    with pytest.raises(DimensionMismatchError):
        index.add([1], unit_rows(rng, 1, 9))
    with pytest.raises(DimensionMismatchError):
        index.add([1, 2], unit_rows(rng, 1, 8))
    index.add([1], unit_rows(rng, 1, 8))
    with pytest.raises(DuplicateEntryError):
        index.add([1], unit_rows(rng, 1, 8))
    with pytest.raises(DuplicateEntryError):
        index.add([5, 5], unit_rows(rng, 2, 8))
    with pytest.raises(DimensionMismatchError):
        index.search(unit_rows(rng, 2, 4), 3)
    assert len(index) == 1


def test_reconstruct_returns_stored_vector(rng):
    index = DenseIndex(8)
    vectors = unit_rows(rng, 2, 8)
    index.add([7, 9], vectors)
    np.testing.assert_allclose(index.reconstruct(9), vectors[1])
    with pytest.raises(KeyError):
        index.reconstruct(8)


def test_ties_across_the_cut_resolve_to_lowest_ids(rng):
    base = unit_rows(rng, 3, 8)
    vectors = np.repeat(base, 20, axis=0)  # 20 identical copies of each of 3 vectors
    ids = rng.permutation(np.arange(100, 160)).tolist()
    index = DenseIndex(8)
    index.add(ids, vectors)
    full = index.search(base, 60)
    for n in (1, 5, 19, 20, 21, 33):
        got = index.search(base, n)
        assert got == [row[:n] for row in full]
    for q, row in enumerate(full):  # the 20 copies of base[q] come first, lowest ids first
        block = sorted(ids[q * 20 : (q + 1) * 20])
        assert [i for i, _ in row[:20]] == block
