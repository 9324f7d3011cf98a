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

__all__ = ["EvidencePool", "evidence_candidates", "evidence_negatives"]


class _Positive(Protocol):
    """What is read of a :class:`bench.training.pairs.PositivePair` (not imported: pairs imports this module)."""

    @property
    def passage(self) -> str: ...

    @property
    def group(self) -> str: ...


class EvidencePool(NamedTuple):
    """The distinct positive passages of one mining run, in first-seen order: the groups each is a
    positive of, and its parsed speaker (None: no prefix)."""

    groups: dict[str, frozenset[str]]
    speaker_of: dict[str, str | None]


def evidence_candidates(positives: Sequence[_Positive]) -> EvidencePool:
    """Every distinct positive passage with its groups and speaker (built once per mining run: each
    draw then only filters)."""
    groups: dict[str, set[str]] = defaultdict(set)
    for p in positives:
        groups[p.passage].add(p.group)
    return EvidencePool({x: frozenset(g) for x, g in groups.items()}, {x: rendered_speaker(x) for x in groups})


def evidence_negatives(rng: random.Random, pool: EvidencePool, group: str,
                       exclude: Collection[str], speaker: str | None, k: int) -> list[str]:
    """``k`` distinct passages drawn from ``pool`` that are not a positive of ``group`` and not in
    ``exclude`` (the query's positives and the negatives already chosen); those of ``speaker`` first
    (None: any), topped up from the other speakers when they run out. Fewer when too few remain."""
    others = [x for x, groups in pool.groups.items() if group not in groups and x not in exclude]
    return speaker_first_sample(rng, others, speaker, pool.speaker_of, k)
