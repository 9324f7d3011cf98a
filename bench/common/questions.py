"""The benchmark's questions: labelled evidence, held-out halves and the development split.

Splits are seeded per conversation (:func:`stable_seed`), so the same questions fall in the same
half in every process and in every corpus mode (docs/architecture.md "Evaluation").
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from bench.common.corpora import global_id
from bench.common.datasets import Conversation

__all__ = ["DATASET_SPLIT", "BenchQuestion", "overall_question", "prepare_questions", "stable_seed"]


DATASET_SPLIT = "*dataset*"
"""The split tag of a dataset whose conversations hold one question each (:func:`prepare_questions`)."""


def overall_question(category: int | None) -> bool:
    """True for questions in the headline set: LoCoMo categories 1-4, or uncategorised datasets."""
    return category is None or category != 5


def stable_seed(*parts: object) -> list[int]:
    """A seed sequence from ints and strings that is stable across processes (CRC-32 of text)."""
    return [p if isinstance(p, int) else zlib.crc32(str(p).encode("utf-8")) for p in parts]


@dataclass(frozen=True)
class BenchQuestion:
    """One question as the benchmark uses it.

    ``relevant_turns`` are global turn ids (empty: not evaluated, still usable in burn-in);
    ``row`` indexes the question embedding matrix; ``half`` is the held-out half (0 = A, 1 = B);
    ``dev`` marks the development split used to select ``mnemos_full``'s features;
    ``category_name`` names ``category`` (the dataset's own table, :mod:`bench.common.datasets`).
    """

    key: str
    conversation_id: str
    text: str
    category: int | None
    question_date: datetime | None
    relevant_turns: frozenset[str]
    row: int
    half: int
    dev: bool
    category_name: str | None = None

    @property
    def labelled(self) -> bool:
        """True when the question has at least one valid evidence turn."""
        return bool(self.relevant_turns)


def _split(keys: Sequence[str], seed: int, *tag: object) -> set[str]:
    """The first half (rounded down) of ``keys`` after a seeded shuffle."""
    order = np.random.default_rng(stable_seed(seed, *tag)).permutation(len(keys))
    return {keys[i] for i in order[: len(keys) // 2]}


def prepare_questions(
    conversations: Sequence[Conversation], *, seed: int = 0, limit: int | None = None
) -> list[BenchQuestion]:
    """Benchmark questions in dataset order, with held-out halves and the dev split.

    A conversation with several questions has them split on their own (a seeded shuffle per
    conversation). The conversations holding one question each (LongMemEval: one haystack per
    question) have theirs split together, as one group (tag :data:`DATASET_SPLIT`): split one by
    one, every such question would fall in half B and none in the dev split, and a pooled tenant's
    held-out burn-in would be empty. Which conversations are single is read before ``limit``
    applies, so a small ``limit`` does not change how a conversation is split.

    ``limit`` keeps about ``limit`` questions in total (the corpus itself is never cut): spread
    evenly over the conversations with several questions (a seeded sample in each), and a seeded
    sample of the single-question conversations' questions, in proportion to their share.
    """
    singles = [conv for conv in conversations if len(conv.questions) <= 1]
    single_ids = {conv.conversation_id for conv in singles}
    n_questions = sum(len(conv.questions) for conv in conversations)
    kept_singles: set[str] | None = None
    if limit is not None and singles:
        n_single = sum(len(conv.questions) for conv in singles)
        share = max(1, round(limit * n_single / max(1, n_questions)))
        ids = [conv.conversation_id for conv in singles if conv.questions]
        order = np.random.default_rng(stable_seed(seed, "limit", DATASET_SPLIT)).permutation(len(ids))
        kept_singles = {ids[i] for i in order[:share]}
    chosen: list[tuple[Conversation, list]] = []
    n_multi = len(conversations) - len(singles)
    per_conv = None if limit is None else max(1, -(-limit // max(1, n_multi if n_multi else len(conversations))))
    for conv in conversations:
        questions = list(conv.questions)
        if conv.conversation_id in single_ids:
            if kept_singles is not None and conv.conversation_id not in kept_singles:
                questions = []
        elif per_conv is not None and len(questions) > per_conv:
            pick = np.random.default_rng(stable_seed(seed, "limit", conv.conversation_id)).permutation(len(questions))
            questions = [questions[i] for i in sorted(pick[:per_conv])]
        chosen.append((conv, questions))
    groups = [(conv.conversation_id, questions) for conv, questions in chosen if conv.conversation_id not in single_ids]
    groups.append((DATASET_SPLIT, [q for conv, questions in chosen if conv.conversation_id in single_ids
                                   for q in questions]))
    half_a: set[str] = set()
    dev: set[str] = set()
    for tag, members in groups:
        keys = [q.question_id for q in members]
        half_a |= _split(keys, seed, "heldout", tag)
        dev |= _split(keys, seed, "dev", tag)
    out: list[BenchQuestion] = []
    for conv, questions in chosen:
        for q in questions:
            out.append(
                BenchQuestion(
                    key=q.question_id,
                    conversation_id=conv.conversation_id,
                    text=q.text,
                    category=q.category,
                    question_date=q.question_date,
                    relevant_turns=frozenset(global_id(conv.conversation_id, t) for t in q.relevant_turn_ids),
                    row=len(out),
                    half=0 if q.question_id in half_a else 1,
                    dev=q.question_id in dev,
                    category_name=q.category_name,
                )
            )
    return out
