"""The negative miner: a trained cross-encoder that ranks candidates for self-mined negatives.

:func:`load_negative_miner` loads it as the service reads a reranker and records in the new
model's provenance that what the miner learned reaches the new model through the negatives it picks
(:mod:`bench.training.model_negatives`; docs/reranker.md "Self-mined negatives").
"""

from __future__ import annotations

from pathlib import Path

from bench.training.model_negatives import Scorer

__all__ = ["load_negative_miner"]


def load_negative_miner(model_dir: Path, device: str, provenance: dict[str, object]) -> Scorer:
    """The scorer of the cross-encoder in ``model_dir``, read as the service reads it (the default
    max length, windows and precision of :class:`workers.settings.Settings`), on ``device``.

    ``provenance`` (the new model's) takes the mining model's training items into
    ``training_conversations`` (and out of ``held_out_conversations``), its sources marked ``via``
    it, and a ``negative_miner`` block (directory name, never a path; digest; items; reading).

    Raises:
        TrainingDataError: if the model has no readable provenance with its training items.
        ModelLoadError: if the model cannot be loaded.
    """
    from bench.training.distil import teacher_training_conversations, with_training_items
    from bench.training.sources import teacher_sources
    from mnemos.rerank import CrossEncoderReranker, model_digest
    from workers.settings import Settings

    items = teacher_training_conversations(model_dir, role="miner", source="negative miner")
    provenance.update(with_training_items(provenance, items))
    name = model_dir.resolve().name
    sources = provenance.get("sources")
    provenance["sources"] = [*(sources if isinstance(sources, list) else []),
                             *teacher_sources(model_dir, via=f"negative miner {name}")]
    model = CrossEncoderReranker(model_dir, max_length=Settings.rerank_max_length, device=device,
                                 precision=Settings.rerank_precision, windows=Settings.rerank_windows)
    provenance["negative_miner"] = {"model": name, "digest": model_digest(model_dir.resolve()),
                                    "training_items": items, "max_length": Settings.rerank_max_length,
                                    "windows": Settings.rerank_windows, "precision": model.precision.value}
    return model.score
