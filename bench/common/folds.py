"""Reranker folds: each question is reranked by a cross-encoder never trained on its conversation.

A fold's ``train_conversations`` are the items its provenance says it learned from: LoCoMo
conversation ids and LongMemEval question ids (one question per haystack, so a LongMemEval
"conversation" is its question: cross-fitting by question is the same selection)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from bench.common.paths import display_path
from mnemos.rerank import Reranker
from workers.runtime.models import PROVENANCE_FILE, reranker_provenance

__all__ = ["FoldRerankers", "RerankerFold", "load_folds", "parse_fold_spec"]


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


def parse_fold_spec(spec: str) -> tuple[Path, list[str] | None]:
    """``"DIR"`` or ``"DIR=conv-a,conv-b"`` (the conversations DIR's model was trained on).

    Without ``=``, the training conversations are read from ``DIR/mnemos_provenance.json``.
    """
    path, sep, convs = spec.partition("=")
    if not sep:
        return Path(path), None
    return Path(path), [c.strip() for c in convs.split(",") if c.strip()]


def load_folds(specs: list[str], *, cache_dir: Path, max_length: int, batch_size: int,
               precision: str = "auto", device: str = "cpu", windows: int = 1):
    """Reranker folds from ``DIR[=CONV,...]`` specs: a :class:`FoldRerankers` (None for
    no spec) whose rerankers read and fill the disk score cache, and an uncached loader per fold (for
    timing). The cross-encoders run on ``device`` (a torch device string, ``cpu`` or ``cuda``) in
    ``precision`` (``auto`` resolved as the query worker resolves ``MNEMOS_RERANK_PRECISION``:
    :func:`mnemos.precision.resolve_precision`). Scores are cached per model identity, ``max_length``
    and resolved precision (not per device: fp32 logits agree across devices to rounding), and
    ``windows`` above 1 (a long turn read in windows, its best kept).

    Raises:
        ValueError: if a directory does not exist or names no training conversations.
    """
    from bench.common.caches import PersistentReranker
    from mnemos.precision import resolve_precision
    from mnemos.rerank import CachedReranker, CrossEncoderReranker, model_digest

    computes_in = resolve_precision(precision, device)
    records, rerankers, loaders = [], {}, {}
    for i, spec in enumerate(specs):
        path, explicit = parse_fold_spec(spec)
        if not path.is_dir():
            raise ValueError(f"reranker directory {path} does not exist")
        provenance = reranker_provenance(str(path)) or {}
        trained = explicit if explicit is not None else provenance.get("training_conversations")
        if trained is None:
            raise ValueError(f"{path} has no {PROVENANCE_FILE}; give DIR=conv-a,conv-b")
        name = path.name or f"fold-{i}"
        identity = model_digest(path.resolve())
        records.append(RerankerFold(name, display_path(path), frozenset(trained), identity, provenance))

        def load(p: Path = path) -> CrossEncoderReranker:
            return CrossEncoderReranker(p, max_length=max_length, batch_size=batch_size, device=device,
                                        precision=computes_in, windows=windows)

        window_key = f"|windows={windows}" if windows > 1 else ""
        persistent = PersistentReranker(f"{identity}|max_length={max_length}|{computes_in.value}{window_key}",
                                        cache_dir / "rerank_scores", load)
        rerankers[name] = CachedReranker(persistent, max_entries=None)
        loaders[name] = load
    return (FoldRerankers(records, rerankers) if records else None), loaders
