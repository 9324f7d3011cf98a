"""Training pairs read as the reranker reads them: one window of a long turn, not its cut start.

The service scores a turn longer than the room beside the query in up to N windows and keeps the
best one (:class:`mnemos.rerank.CrossEncoderReranker`, docs/reranker.md "Long turns"). A model
trained on the first ``max_length`` word pieces of every turn learns two wrong things from long
turns: a positive whose evidence sits past the cut teaches it to reward text that does not answer,
and a long negative is only ever seen by its start, while at query time its most question-like
window competes. :func:`window_examples` replaces each pair whose turn does not fit by one window of
it, cut by the same spans the reranker reads (:func:`mnemos.rerank_pairs.window_spans`): the window
that holds the most distinct query terms (the service's BM25 tokenizer, :func:`mnemos.tokenizer.tokenize`),
the first of equals. For a positive that is the window most likely to hold the evidence; for a
negative, the window most likely to outscore the evidence at query time. Pairs that fit are kept
as they are, so the pair count does not change.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from mnemos.rerank_pairs import cut_lengths, window_spans
from mnemos.tokenizer import tokenize

__all__ = ["WindowedCounts", "base_pair_tokenizer", "window_examples"]


@dataclass(frozen=True)
class WindowedCounts:
    """How many pairs :func:`window_examples` read as a window: positives and negatives whose turn did
    not fit, and of those how many took a window other than the first."""

    positives_long: int
    negatives_long: int
    positives_moved: int
    negatives_moved: int


def base_pair_tokenizer() -> Any:
    """The bundled MiniLM's ``tokenizers.Tokenizer`` (what every model trained here tokenizes
    with), without truncation or padding, as :class:`mnemos.rerank.CrossEncoderReranker` holds it."""
    from tokenizers import Tokenizer

    from mnemos.encoder import bundled_bi_encoder_path

    tokenizer = Tokenizer.from_file(str(Path(bundled_bi_encoder_path()) / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


def window_examples(examples: Sequence[LabelledPair], tokenizer: Any, *, max_length: int,
                    windows: int) -> tuple[list[LabelledPair], WindowedCounts]:
    """``examples`` with each long turn replaced by its window richest in query terms.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` without truncation (the reranker's pair tokenizer);
    ``max_length`` the pair length in word pieces, special tokens included; ``windows`` the most
    windows a turn is read in (the service's ``MNEMOS_RERANK_WINDOWS``). The room beside a query is
    :func:`mnemos.rerank_pairs.cut_lengths`'s, as at query time. With ``windows`` 1 the examples come
    back unchanged (the trainer's own truncation cuts them).

    Returns:
        ``(examples, counts)``: the same number of pairs in the same order, labels unchanged.

    Raises:
        TrainingDataError: if ``windows`` < 1 or ``max_length`` leaves fewer than 2 content tokens.
    """
    if windows < 1:
        raise TrainingDataError("windows", f"must be >= 1, got {windows}")
    budget = max_length - tokenizer.num_special_tokens_to_add(True)
    if budget < 2:
        raise TrainingDataError("max_length", f"{max_length} leaves no room beside the special tokens")
    if windows == 1:
        return list(examples), WindowedCounts(0, 0, 0, 0)
    query_len: dict[str, int] = {}
    query_terms: dict[str, frozenset[str]] = {}
    out: list[LabelledPair] = []
    long = {1.0: 0, 0.0: 0}
    moved = {1.0: 0, 0.0: 0}
    for example in examples:
        if example.query not in query_len:
            query_len[example.query] = len(tokenizer.encode(example.query, add_special_tokens=False).ids)
            query_terms[example.query] = frozenset(tokenize(example.query))
        encoding = tokenizer.encode(example.passage, add_special_tokens=False)
        cut = cut_lengths(query_len[example.query], len(encoding.ids), budget)
        if not cut.turn_cut:
            out.append(example)
            continue
        spans = window_spans(encoding.offsets, cut.turn_kept, windows)
        texts = [example.passage[first:last] for first, last in spans]
        terms = query_terms[example.query]
        best = max(range(len(texts)), key=lambda i: (len(terms.intersection(tokenize(texts[i]))), -i))
        label = 1.0 if example.label >= 0.5 else 0.0
        long[label] += 1
        moved[label] += int(best > 0)
        out.append(LabelledPair(example.query, texts[best], example.label))
    return out, WindowedCounts(long[1.0], long[0.0], moved[1.0], moved[0.0])
