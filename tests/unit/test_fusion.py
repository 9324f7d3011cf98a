"""Reciprocal rank fusion (k = 60, ranks 1-based) and convex fusion of min-max normalised scores on
hand-worked examples."""

import pytest

from mnemos.errors import InvalidParameterError
from mnemos.fusion import Fusion, convex_fusion, fuse, min_max_normalise, reciprocal_rank_fusion


def test_hand_example():
    # bm25 = [1, 2, 3], dense = [3, 1, 4], k = 60
    # id 1: 1/61 + 1/62 = 0.0163934 + 0.0161290 = 0.0325225
    # id 3: 1/63 + 1/61 = 0.0158730 + 0.0163934 = 0.0322665
    # id 2: 1/62 = 0.0161290 ; id 4: 1/63 = 0.0158730
    fused = reciprocal_rank_fusion([[1, 2, 3], [3, 1, 4]])
    assert [eid for eid, _ in fused] == [1, 3, 2, 4]
    expected = [1 / 61 + 1 / 62, 1 / 63 + 1 / 61, 1 / 62, 1 / 63]
    assert [s for _, s in fused] == pytest.approx(expected, abs=1e-12)


def test_ranks_are_one_based():
    # with k = 0 a 1-based rank gives 1/1; a 0-based rank would divide by zero
    assert reciprocal_rank_fusion([[8, 9]], k=0) == [(8, 1.0), (9, 0.5)]


def test_ties_break_by_entry_id():
    assert [e for e, _ in reciprocal_rank_fusion([[9, 5], [5, 9]])] == [5, 9]
    assert [e for e, _ in reciprocal_rank_fusion([[7], [2]])] == [2, 7]


def test_repeats_within_a_list_count_once():
    assert reciprocal_rank_fusion([[4, 4, 6]], k=60) == [(4, 1 / 61), (6, 1 / 62)]


def test_empty_inputs_and_bad_k():
    assert reciprocal_rank_fusion([]) == []
    assert reciprocal_rank_fusion([[], []]) == []
    with pytest.raises(InvalidParameterError):
        reciprocal_rank_fusion([[1]], k=-1)


# ---- convex fusion of min-max normalised scores --------------------------------------------------

def test_convex_hand_example():
    # bm25 = {1: 10, 2: 6, 3: 2} -> (s - 2) / 8 = {1: 1.0, 2: 0.5, 3: 0.0}
    # dense = {3: 0.9, 1: 0.7, 4: 0.5} -> (s - 0.5) / 0.4 = {3: 1.0, 1: 0.5, 4: 0.0}
    # w = 0.25: id 1: 0.25 * 1.0 + 0.75 * 0.5 = 0.625; id 3: 0.25 * 0 + 0.75 * 1 = 0.75
    #           id 2: 0.25 * 0.5 + 0 = 0.125;           id 4: 0 + 0.75 * 0 = 0.0
    fused = convex_fusion([(1, 10.0), (2, 6.0), (3, 2.0)], [(3, 0.9), (1, 0.7), (4, 0.5)], weight=0.25)
    assert [eid for eid, _ in fused] == [3, 1, 2, 4]
    assert [s for _, s in fused] == pytest.approx([0.75, 0.625, 0.125, 0.0], abs=1e-12)


def test_convex_normalises_over_the_candidates_given_not_absolute_scores():
    # the same order at another scale fuses to the same scores
    small = convex_fusion([(1, 3.0), (2, 2.0)], [(2, 0.3), (1, 0.1)], weight=0.5)
    large = convex_fusion([(1, 300.0), (2, 200.0)], [(2, 0.9), (1, 0.5)], weight=0.5)
    assert small == large == [(1, 0.5), (2, 0.5)]  # tie broken by id


def test_convex_missing_ids_count_zero_in_the_other_list():
    # id 7 only in bm25 (its top: 1.0), id 8 only in dense (its top: 1.0); each list's last is 0
    fused = dict(convex_fusion([(7, 5.0), (9, 1.0)], [(8, 0.8), (9, 0.2)], weight=0.6))
    assert fused == pytest.approx({7: 0.6, 8: 0.4, 9: 0.0})


def test_convex_with_one_list_empty_follows_the_other():
    bm25 = [(4, 9.0), (2, 5.0), (6, 1.0)]
    fused = convex_fusion(bm25, [], weight=0.3)
    assert [eid for eid, _ in fused] == [4, 2, 6]
    assert [s for _, s in fused] == pytest.approx([0.3, 0.15, 0.0])
    assert [eid for eid, _ in convex_fusion([], [(5, 0.4), (1, 0.2)], weight=0.3)] == [5, 1]
    assert convex_fusion([], [], weight=0.5) == []


def test_convex_constant_scores_count_as_fully_retrieved():
    # a flat list (or a single candidate) has no spread: every id maps to 1, not 0 (missing counts 0)
    assert min_max_normalise([(3, 2.0), (1, 2.0)]) == {3: 1.0, 1: 1.0}
    assert min_max_normalise([(5, -0.3)]) == {5: 1.0}
    fused = convex_fusion([(3, 2.0), (1, 2.0)], [(1, 0.9), (8, 0.1)], weight=0.5)
    assert fused == [(1, 1.0), (3, 0.5), (8, 0.0)]


def test_convex_weights_one_and_zero_reduce_to_one_retriever():
    bm25 = [(4, 9.0), (2, 5.0), (6, 3.0), (9, 1.0)]
    dense = [(6, 0.9), (1, 0.8), (2, 0.7), (5, 0.1)]
    only_bm25 = convex_fusion(bm25, dense, weight=1.0)
    assert [eid for eid, _ in only_bm25][:3] == [4, 2, 6]  # bm25's order; its last scores 0 like dense-only ids
    assert dict(only_bm25) == pytest.approx({4: 1.0, 2: 0.5, 6: 0.25, 9: 0.0, 1: 0.0, 5: 0.0})
    only_dense = convex_fusion(bm25, dense, weight=0.0)
    assert [eid for eid, _ in only_dense][:3] == [6, 1, 2]
    assert dict(only_dense) == pytest.approx({6: 1.0, 1: 0.875, 2: 0.75, 5: 0.0, 4: 0.0, 9: 0.0})


def test_convex_repeats_keep_the_first_score_and_ties_break_by_id():
    assert min_max_normalise([(4, 3.0), (4, 1.0), (6, 1.0)]) == {4: 1.0, 6: 0.0}
    assert [e for e, _ in convex_fusion([(9, 1.0), (5, 0.0)], [(5, 1.0), (9, 0.0)], weight=0.5)] == [5, 9]


@pytest.mark.parametrize("weight", [-0.1, 1.1, float("nan")])
def test_convex_weight_must_be_within_zero_and_one(weight):
    with pytest.raises(InvalidParameterError):
        convex_fusion([(1, 1.0)], [(1, 1.0)], weight=weight)


def test_convex_refuses_non_finite_scores():
    with pytest.raises(InvalidParameterError):
        convex_fusion([(1, float("inf"))], [], weight=0.5)


def test_fuse_dispatches_by_method():
    bm25, dense = [(1, 10.0), (2, 6.0), (3, 2.0)], [(3, 0.9), (1, 0.7), (4, 0.5)]
    assert fuse(Fusion.RRF, bm25, dense, rrf_k=60) == reciprocal_rank_fusion([[1, 2, 3], [3, 1, 4]], k=60)
    assert fuse("convex", bm25, dense, convex_weight=0.25) == convex_fusion(bm25, dense, weight=0.25)
    with pytest.raises(InvalidParameterError, match="rrf, convex"):
        fuse("borda", bm25, dense)  # type: ignore[arg-type]
