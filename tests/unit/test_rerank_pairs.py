"""Turn-only truncation, length-sorted batches and padding over token ids (no model)."""

import numpy as np
import pytest

from mnemos.rerank_pairs import PairCut, cut_lengths, length_sorted_batches, pad_batch


def test_a_pair_that_fits_is_not_cut():
    assert cut_lengths(10, 20, 30) == PairCut(10, 20, False, False)
    assert not cut_lengths(0, 0, 2).truncated


def test_the_turn_absorbs_the_cut():
    cut = cut_lengths(10, 200, 125)
    assert cut == PairCut(10, 115, True, False)
    assert cut.truncated


def test_a_long_query_keeps_all_its_tokens_while_the_turn_keeps_a_quarter_of_the_budget():
    assert cut_lengths(60, 200, 125) == PairCut(60, 65, True, False)  # longest_first would cut the query
    assert cut_lengths(94, 200, 125) == PairCut(94, 31, True, False)  # 31 == 125 // 4: still intact


def test_the_query_is_cut_only_as_a_last_resort():
    cut = cut_lengths(100, 200, 125)
    assert cut == PairCut(94, 31, True, True)  # the turn keeps budget // 4
    short_turn = cut_lengths(120, 20, 125)
    assert short_turn == PairCut(105, 20, False, True)  # a short turn is never cut below its length


@pytest.mark.parametrize("q,t,budget", [(0, 500, 10), (500, 0, 10), (7, 7, 13), (1000, 1000, 2), (3, 400, 61)])
def test_kept_tokens_fill_the_budget_and_never_exceed_the_lengths(q, t, budget):
    cut = cut_lengths(q, t, budget)
    assert cut.query_kept <= q and cut.turn_kept <= t
    assert cut.query_kept + cut.turn_kept == min(q + t, budget)
    assert cut.query_cut == (cut.query_kept < q) and cut.turn_cut == (cut.turn_kept < t)


def test_cut_refuses_a_budget_without_room():
    with pytest.raises(ValueError):
        cut_lengths(1, 1, 1)


def test_batches_group_similar_lengths_stably():
    assert length_sorted_batches([5, 1, 3, 1, 9], 2) == [[1, 3], [2, 0], [4]]
    assert length_sorted_batches([], 4) == []
    with pytest.raises(ValueError):
        length_sorted_batches([1], 0)


def test_pad_batch_pads_right_with_a_mask():
    batch = pad_batch([[101, 7, 102], [101, 102]], [[0, 0, 1], [0, 0]], pad_id=0)
    np.testing.assert_array_equal(batch.input_ids, [[101, 7, 102], [101, 102, 0]])
    np.testing.assert_array_equal(batch.attention_mask, [[1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(batch.token_type_ids, [[0, 0, 1], [0, 0, 0]])
    assert batch.input_ids.dtype == np.int64
    with pytest.raises(ValueError):
        pad_batch([[1, 2]], [[0]], pad_id=0)
    with pytest.raises(ValueError):
        pad_batch([], [], pad_id=0)


def test_window_starts_cover_a_long_turn_from_its_start_to_its_end() -> None:
    from mnemos.rerank_pairs import window_starts

    assert window_starts(40, 50, 3) == [0]  # fits: one window
    assert window_starts(300, 100, 1) == [0]  # one window: today's cut
    assert window_starts(300, 100, 3) == [0, 100, 200]  # no overlap needed
    assert window_starts(100, 50, 3) == [0, 25, 50]  # overlapping, the last ends at the turn's end
    assert window_starts(101, 100, 4) == [0, 1]  # never more windows than distinct starts
    with pytest.raises(ValueError):
        window_starts(10, 0, 2)


def test_window_spans_are_the_character_spans_of_the_window_tokens() -> None:
    from mnemos.rerank_pairs import window_spans

    # ten 3-character tokens separated by one space: token i covers [4i, 4i + 3)
    offsets = [(4 * i, 4 * i + 3) for i in range(10)]
    assert window_spans(offsets, 4, 3) == [(0, 15), (12, 27), (24, 39)]  # starts 0, 3, 6
    assert window_spans(offsets, 4, 1) == [(0, 15)]  # one window: the first 4 tokens
    assert window_spans(offsets, 20, 3) == [(0, 39)]  # fits: the whole text
    with pytest.raises(ValueError):
        window_spans([], 4, 2)
