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

from bench.corpora import global_id
from bench.datasets import Conversation

__all__ = ["DATASET_SPLIT", "BenchQuestion", "prepare_questions", "stable_seed"]


DATASET_SPLIT = "*dataset*"
"""The split tag of a dataset whose conversations hold one question each (:func:`prepare_questions`)."""


def stable_seed(*parts: object) -> list[int]:
    """A seed sequence from ints and strings that is stable across processes (CRC-32 of text)."""
    return [p if isinstance(p, int) else zlib.crc32(str(p).encode("utf-8")) for p in parts]


@dataclass(frozen=True)
class BenchQuestion:
    """One question as the benchmark uses it.

    ``relevant_turns`` are global turn ids (empty: not evaluated, still usable in burn-in);
    ``row`` indexes the question embedding matrix; ``half`` is the held-out half (0 = A, 1 = B);
    ``dev`` marks the development split used to select ``mnemos_full``'s features;
    ``category_name`` names ``category`` (the dataset's own table, :mod:`bench.datasets`).
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

    Each conversation's questions are split on their own (a seeded shuffle per conversation),
    except in a dataset where every conversation holds at most one question (LongMemEval: one
    haystack per question), whose questions are split over the whole dataset (tag
    :data:`DATASET_SPLIT`): a per-conversation split would put every question in half B and none
    in the dev split, leaving the pooled tenant's held-out burn-in empty. ``limit`` keeps about
    ``limit`` questions in total, spread evenly over conversations (a seeded sample per
    conversation); the corpus itself is never cut.
    """
    chosen: list[tuple[Conversation, list]] = []
    per_conv = None if limit is None else max(1, -(-limit // max(1, len(conversations))))
    for conv in conversations:
        questions = list(conv.questions)
        if per_conv is not None and len(questions) > per_conv:
            pick = np.random.default_rng(stable_seed(seed, "limit", conv.conversation_id)).permutation(len(questions))
            questions = [questions[i] for i in sorted(pick[:per_conv])]
        chosen.append((conv, questions))
    whole_dataset = all(len(questions) <= 1 for _, questions in chosen)
    groups = ([(DATASET_SPLIT, [q for _, questions in chosen for q in questions])] if whole_dataset
              else [(conv.conversation_id, questions) for conv, questions in chosen])
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
