"""Reranker folds: each question is reranked by a cross-encoder never trained on its conversation.

A fold's ``train_conversations`` are the items its provenance says it learned from: LoCoMo
conversation ids and LongMemEval question ids (one question per haystack, so a LongMemEval
"conversation" is its question: cross-fitting by question is the same selection)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from mnemos.rerank import Reranker

__all__ = ["FoldRerankers", "RerankerFold"]


@dataclass(frozen=True)
class RerankerFold:
    """One cross-encoder and the conversations it was trained on (never evaluated with it)."""

    name: str
    path: str
    train_conversations: frozenset[str]
    identity: str = ""
    provenance: Mapping[str, object] = field(default_factory=dict)


class FoldRerankers:
    """Per-question reranker selection: the first fold not trained on the question's conversation."""

    def __init__(self, folds: Sequence[RerankerFold], rerankers: Mapping[str, Reranker]) -> None:
        if not folds:
            raise ValueError("at least one reranker fold is needed")
        self.folds = tuple(folds)
        self.rerankers = dict(rerankers)

    def fold_for(self, conversation_id: str) -> RerankerFold:
        """The fold used for ``conversation_id``.

        Raises:
            LookupError: if every fold was trained on that conversation.
        """
        for fold in self.folds:
            if conversation_id not in fold.train_conversations:
                return fold
        names = ", ".join(f.name for f in self.folds)
        raise LookupError(f"{conversation_id} is in the training data of every reranker given ({names}): "
                          "refusing to grade a model on what it learned; add a fold that never saw it")

    def for_conversation(self, conversation_id: str) -> Reranker:
        """The reranker of :meth:`fold_for`."""
        return self.rerankers[self.fold_for(conversation_id).name]

    def deep_threshold_for(self, conversation_id: str, default: float) -> float:
        """The deep-pass threshold calibrated for the fold of ``conversation_id`` (its provenance's
        ``deep_threshold.value``, a percentile of training-pool top logits), else ``default``."""
        calibrated = self.fold_for(conversation_id).provenance.get("deep_threshold")
        if isinstance(calibrated, dict) and isinstance(calibrated.get("value"), int | float):
            return float(calibrated["value"])
        return default
