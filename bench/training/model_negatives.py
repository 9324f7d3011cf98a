"""Negatives a trained cross-encoder ranks highest: its own confusions, mined again.

A cross-encoder trained on BM25, random and other questions' evidence negatives still puts a
personal statement on another topic above the evidence (docs/reranker.md "Style over content"). The
passages it ranks highest among a question's first-stage candidates, evidence excluded, are the
ones it confuses with an answer; labelled 0 and trained on from scratch, they show the next model
exactly those. This is self-mined hard-negative training, after Xiong et al., "Approximate Nearest
Neighbor Negative Contrastive Learning for Dense Text Retrieval" (2021) and Qu et al., "RocketQA"
(2021), applied to a cross-encoder's own candidates instead of a dense index.

The mining model must have been trained on the same questions (or fewer): what it learned from them
reaches the new model through the negatives it picks, so the new model's provenance counts the
mining model's training items as its own (:mod:`bench.training.cli`).

Pure functions; the scorer is passed in (:func:`bench.training.negative_miner.load_negative_miner`
loads one as the service reads it).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

import numpy as np

from bench.training.speaker_sampling import speaker_first

__all__ = ["Scorer", "model_negatives", "model_order"]

Scorer = Callable[[str, Sequence[str]], np.ndarray]
"""``scorer(query, passages)`` -> ``(len(passages),)`` float logits, higher = more relevant."""


def model_order(scorer: Scorer, query: str, candidates: Sequence[str]) -> list[str]:
    """``candidates`` sorted by ``scorer``'s logit for ``query``, highest first (ties keep the input
    order). One scorer call per query; an empty list for no candidates.

    Raises:
        ValueError: if the scorer returns a number of logits other than ``len(candidates)``.
    """
    if not candidates:
        return []
    logits = np.asarray(scorer(query, list(candidates)), dtype=np.float64)
    if logits.shape != (len(candidates),):
        raise ValueError(f"the scorer returned {logits.shape} logits for {len(candidates)} passages")
    return [candidates[i] for i in np.argsort(-logits, kind="stable")]


def model_negatives(ranked: Sequence[str], exclude: Collection[str], speaker: str | None,
                    speaker_of: Mapping[str, str | None], k: int) -> list[str]:
    """The first ``k`` passages of ``ranked`` (a :func:`model_order`) not in ``exclude`` (the
    question's positives and the negatives already chosen); those of ``speaker`` first (None: any
    speaker, in model order), topped up from the other speakers when they run out. Fewer when too
    few remain; none for ``k`` 0."""
    if k <= 0:
        return []
    return speaker_first([x for x in ranked if x not in exclude], speaker, speaker_of)[:k]

