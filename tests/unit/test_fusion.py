"""Reciprocal rank fusion on a hand-worked example (k = 60, ranks 1-based)."""

import pytest

from mnemos.errors import InvalidParameterError
from mnemos.fusion import reciprocal_rank_fusion


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
