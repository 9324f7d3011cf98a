"""Negatives that look like answers: other questions' evidence turns (docs/reranker.md "Style over content").

A LongMemEval evidence turn is a user telling something about their life. A cross-encoder trained
only on BM25 and random negatives learns that style as relevance and ranks a personal statement on
another topic above the evidence. Pairing a question with another question's evidence turn, labelled
0, shows it a passage with the style of an answer and the content of another topic.
:func:`bench.training.pairs.mine_examples` adds ``MiningConfig.evidence_negatives`` of them per positive.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Collection, Sequence
from typing import NamedTuple, Protocol

from bench.training.speaker_sampling import speaker_first_sample
from mnemos.rendering import rendered_speaker

__all__ = ["EvidenceCandidate", "EvidencePool", "evidence_candidates", "evidence_negatives"]


class _Positive(Protocol):
    """What is read of a :class:`bench.training.pairs.PositivePair` (not imported: pairs imports this module)."""

    @property
    def passage(self) -> str: ...

    @property
    def group(self) -> str: ...


class EvidenceCandidate(NamedTuple):
    """A distinct positive passage, the groups it is a positive of, and its speaker (None: no prefix)."""

    passage: str
    groups: frozenset[str]
    speaker: str | None


class EvidencePool(NamedTuple):
    """The candidates of one mining run, in first-seen order, and each passage's speaker."""

    candidates: list[EvidenceCandidate]
    speaker_of: dict[str, str | None]


def evidence_candidates(positives: Sequence[_Positive]) -> EvidencePool:
    """Every distinct positive passage, in first-seen order, with its groups and parsed speaker
    (built once per mining run: each draw then only filters)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for p in positives:
        groups[p.passage].add(p.group)
    candidates = [EvidenceCandidate(x, frozenset(g), rendered_speaker(x)) for x, g in groups.items()]
    return EvidencePool(candidates, {c.passage: c.speaker for c in candidates})


def evidence_negatives(rng: random.Random, pool: EvidencePool, group: str,
                       exclude: Collection[str], speaker: str | None, k: int) -> list[str]:
    """``k`` distinct passages drawn from ``pool`` that are not a positive of ``group`` and not in
    ``exclude`` (the query's positives and the negatives already chosen); those of ``speaker`` first
    (None: any), topped up from the other speakers when they run out. Fewer when too few remain."""
    others = [c.passage for c in pool.candidates if group not in c.groups and c.passage not in exclude]
    return speaker_first_sample(rng, others, speaker, pool.speaker_of, k)
