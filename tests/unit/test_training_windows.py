"""Training pairs read in windows (bench.training.windows): the window a long turn trains on is
one the reranker reads at query time, chosen by query terms; short pairs and labels are untouched."""

from __future__ import annotations

import pytest

from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from bench.training.windows import base_pair_tokenizer, window_examples

LONG = "and " * 100 + "the lighthouse keeper painted it blue " + "so " * 40  # about 150 word pieces
QUERY = "what colour did the lighthouse keeper paint"


@pytest.fixture(scope="module")
def tokenizer():
    return base_pair_tokenizer()


def test_a_long_positive_trains_on_the_window_that_holds_its_query_terms(tokenizer) -> None:
    short = LabelledPair(QUERY, "user: a short turn about boats", 0.0)
    examples = [LabelledPair(QUERY, LONG, 1.0), short]
    out, counts = window_examples(examples, tokenizer, max_length=64, windows=4)
    assert len(out) == 2 and [e.label for e in out] == [1.0, 0.0]
    assert out[1] == short  # fits beside the query: unchanged
    window = out[0].passage
    assert "lighthouse keeper" in window and window in LONG and not LONG.startswith(window)
    query_len = len(tokenizer.encode(QUERY, add_special_tokens=False).ids)
    assert len(tokenizer.encode(window, add_special_tokens=False).ids) <= 64 - 3 - query_len
    assert counts.positives_long == 1 and counts.positives_moved == 1
    assert counts.negatives_long == 0 and counts.negatives_moved == 0


def test_the_training_window_is_one_the_reranker_scores(tokenizer, tmp_path) -> None:
    from mnemos.rerank import CrossEncoderReranker
    from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder

    reranker = CrossEncoderReranker(build_tiny_cross_encoder(tmp_path / "ce"), max_length=64, windows=4)
    out, _ = window_examples([LabelledPair(QUERY, LONG, 0.0)], tokenizer, max_length=64, windows=4)
    query_len = len(reranker._tokenizer.encode(QUERY, add_special_tokens=False).ids)
    encoding = reranker._tokenizer.encode(LONG, add_special_tokens=False)
    read = [w.ids for w in reranker._windows_of(LONG, encoding, 64 - reranker._special - query_len)]
    assert len(read) == 4
    assert tokenizer.encode(out[0].passage, add_special_tokens=False).ids in read


def test_without_query_terms_a_long_turn_keeps_its_first_window(tokenizer) -> None:
    out, counts = window_examples([LabelledPair("zebra", LONG, 0.0)], tokenizer, max_length=64, windows=4)
    assert LONG.startswith(out[0].passage) and counts.negatives_long == 1 and counts.negatives_moved == 0


def test_one_window_changes_nothing_and_bad_settings_are_refused(tokenizer) -> None:
    examples = [LabelledPair(QUERY, LONG, 1.0)]
    assert window_examples(examples, tokenizer, max_length=64, windows=1)[0] == examples
    with pytest.raises(TrainingDataError, match="windows"):
        window_examples(examples, tokenizer, max_length=64, windows=0)
    with pytest.raises(TrainingDataError, match="max_length"):
        window_examples(examples, tokenizer, max_length=4, windows=2)
