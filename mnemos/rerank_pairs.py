"""Token-level (query, turn) pairs for the cross-encoder: turn-only truncation and length-sorted batches.

Pure functions over token ids, so they are tested without a model (docs/architecture.md
"Reranker"). The adapter (:class:`mnemos.rerank.CrossEncoderReranker`) tokenizes the query once
and every rendered turn without special tokens, cuts each pair with :func:`cut_lengths`, groups
pairs of similar length with :func:`length_sorted_batches` so a batch pads little, and pads each
batch with :func:`pad_batch`.

Truncation rule: a pair holds ``budget = max_length - special tokens`` content tokens. The turn
absorbs the cut; the query is cut only when, even with the turn cut to ``min(len(turn),
budget // 4)`` tokens, the query alone would not fit (a last resort, counted separately: a turn
needs some tokens to be scored at all, and a query that long is rare, about three quarters of
the pair). A cut keeps the first tokens of each sequence, as the tokenizer's own truncation does.
Unlike the tokenizer's ``longest_first`` rule, which cuts a query longer than half the budget,
this keeps every query token the turn can make room for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = [
    "PairCut",
    "PaddedBatch",
    "cut_lengths",
    "length_sorted_batches",
    "pad_batch",
    "window_spans",
    "window_starts",
]


@dataclass(frozen=True)
class PairCut:
    """How many tokens of a pair's query and turn are kept (``query_kept + turn_kept <= budget``)."""

    query_kept: int
    turn_kept: int
    turn_cut: bool
    query_cut: bool

    @property
    def truncated(self) -> bool:
        """True when any token of the pair was dropped."""
        return self.turn_cut or self.query_cut


def cut_lengths(query_len: int, turn_len: int, budget: int) -> PairCut:
    """Tokens kept of a ``query_len``-token query and a ``turn_len``-token turn within ``budget``.

    ``budget`` is the pair's content tokens (``max_length`` minus the special tokens). The turn is
    cut first; the query keeps all its tokens unless it would leave the turn fewer than
    ``min(turn_len, budget // 4)`` of them (module docstring).

    Raises:
        ValueError: if ``budget`` < 2 or a length is negative.
    """
    if budget < 2 or query_len < 0 or turn_len < 0:
        raise ValueError(f"need budget >= 2 and lengths >= 0, got budget {budget}, query {query_len}, turn {turn_len}")
    if query_len + turn_len <= budget:
        return PairCut(query_len, turn_len, False, False)
    turn_floor = min(turn_len, budget // 4)
    turn_kept = max(budget - query_len, turn_floor)
    query_kept = min(query_len, budget - turn_kept)
    return PairCut(query_kept, turn_kept, turn_kept < turn_len, query_kept < query_len)


def window_starts(turn_len: int, kept: int, windows: int) -> list[int]:
    """First token of each window of ``kept`` tokens that together read a ``turn_len``-token turn
    with at most ``windows`` windows, evenly spaced from the turn's start to its end (the last ends
    at the turn's last token), overlapping where ``windows * kept`` exceeds the turn. ``[0]`` when
    the turn fits (or ``windows`` is 1: today's cut, the first ``kept`` tokens). The reranker
    scores every window and keeps the best (docs/reranker.md "Long turns").

    Raises:
        ValueError: if ``kept`` < 1, ``windows`` < 1 or ``turn_len`` < 0.
    """
    if kept < 1 or windows < 1 or turn_len < 0:
        raise ValueError(f"need kept >= 1, windows >= 1 and turn_len >= 0, got {kept}, {windows}, {turn_len}")
    if turn_len <= kept or windows == 1:
        return [0]
    last = turn_len - kept
    count = min(windows, last + 1)  # never more windows than distinct starts
    return sorted({round(i * last / (count - 1)) for i in range(count)})


def window_spans(offsets: Sequence[tuple[int, int]], kept: int, windows: int) -> list[tuple[int, int]]:
    """Character spans ``(start, end)`` of the windows a turn is read in, from its tokens' character
    ``offsets`` (one ``(start, end)`` per token, as a fast tokenizer reports them, special tokens
    excluded): window ``i`` runs from the start of its first token to the end of its last, its
    tokens being those :func:`window_starts` gives for ``kept`` tokens and at most ``windows``
    windows. One span over the text's first ``kept`` tokens when the turn fits or ``windows`` is 1.
    The reranker re-encodes each span as its own pair (docs/reranker.md "Long turns").

    Raises:
        ValueError: as :func:`window_starts`, or if ``offsets`` is empty.
    """
    if not offsets:
        raise ValueError("window_spans needs the offsets of at least one token")
    spans = []
    for start in window_starts(len(offsets), kept, windows):
        end = min(start + kept, len(offsets)) - 1
        spans.append((offsets[start][0], offsets[end][1]))
    return spans


def length_sorted_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices of ``lengths`` sorted by length (stable, shortest first), in chunks of ``batch_size``.

    Raises:
        ValueError: if ``batch_size`` < 1.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


@dataclass(frozen=True)
class PaddedBatch:
    """One padded batch: ``input_ids``, ``attention_mask`` and ``token_type_ids``, each
    ``(n_pairs, longest)`` int64, padded on the right."""

    input_ids: np.ndarray
    attention_mask: np.ndarray
    token_type_ids: np.ndarray


def pad_batch(sequences: Sequence[Sequence[int]], type_ids: Sequence[Sequence[int]], pad_id: int) -> PaddedBatch:
    """Right-pad token id sequences (and their token type ids) to the longest of the batch.

    Raises:
        ValueError: if ``sequences`` is empty or a sequence and its type ids differ in length.
    """
    if not sequences:
        raise ValueError("pad_batch needs at least one sequence")
    longest = max(len(s) for s in sequences)
    ids = np.full((len(sequences), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(sequences), longest), dtype=np.int64)
    types = np.zeros((len(sequences), longest), dtype=np.int64)
    for row, (seq, typ) in enumerate(zip(sequences, type_ids, strict=True)):
        if len(seq) != len(typ):
            raise ValueError(f"sequence {row} has {len(seq)} ids but {len(typ)} token type ids")
        ids[row, :len(seq)] = seq
        mask[row, :len(seq)] = 1
        types[row, :len(typ)] = typ
    return PaddedBatch(ids, mask, types)
