"""Knowledge distillation for the cross-encoder trainer: soft labels from a trained teacher.

A small student (e.g. the first 3 layers of MiniLM) learns from a trained 6-layer teacher's
scores as well as from the mined 0/1 labels, after Hinton, Vinyals and Dean, "Distilling the
Knowledge in a Neural Network" (2015): the teacher's logit, softened by a temperature, becomes the
target. Our models have one logit (a relevance score), so the softened target is
``sigmoid(teacher_logit / T)``; it is mixed with the hard label with weight ``W``, and the student
still trains with binary cross-entropy on its own raw logit:

    soft_label = W * sigmoid(teacher_logit / T) + (1 - W) * hard_label

Held-out rule: the teacher saw its own training conversations, and what it learnt there reaches
the student through the soft labels, so the student's provenance names the union of both sets as
its training conversations (``held_out_conversations`` shrinks accordingly) and no number is
reported on any of them.

Pure functions (no torch), except :func:`teacher_training_conversations`, which reads a file.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy.special import expit

from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from workers.runtime.models import PROVENANCE_FILE, reranker_provenance

__all__ = [
    "DistilConfig",
    "distilled_provenance",
    "group_by_query",
    "soft_label",
    "soft_labels",
    "teacher_logits",
    "teacher_training_conversations",
    "with_training_items",
]


@dataclass(frozen=True)
class DistilConfig:
    """Distillation settings: ``temperature`` T > 0 divides the teacher's logit before the sigmoid
    (T > 1 softens the target towards 0.5); ``weight`` W in [0, 1] is the teacher's share of the
    target (1: the teacher alone, 0: the hard labels alone).

    Raises:
        TrainingDataError: if T is not a finite number > 0 or W is not within [0, 1].
    """

    temperature: float = 1.0
    weight: float = 1.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise TrainingDataError("temperature", f"must be a finite number > 0, got {self.temperature}")
        if not 0.0 <= self.weight <= 1.0:
            raise TrainingDataError("distil-weight", f"must be within [0, 1], got {self.weight}")


def soft_label(teacher_logit: float, hard_label: float, config: DistilConfig) -> float:
    """``W * sigmoid(teacher_logit / T) + (1 - W) * hard_label``: a probability in [0, 1].

    ``teacher_logit`` is a raw (pre-sigmoid) score, ``hard_label`` 0.0 or 1.0.

    Raises:
        TrainingDataError: if ``teacher_logit`` is not finite.
    """
    if not math.isfinite(teacher_logit):
        raise TrainingDataError("teacher", f"non-finite teacher logit {teacher_logit}")
    w = config.weight
    return w * float(expit(teacher_logit / config.temperature)) + (1.0 - w) * float(hard_label)


def soft_labels(logits: Sequence[float], examples: Sequence[LabelledPair], config: DistilConfig) -> list[float]:
    """One soft label per example (same order): :func:`soft_label` of ``logits[i]`` and
    ``examples[i].label``.

    Raises:
        TrainingDataError: if the lengths differ or a logit is not finite.
    """
    if len(logits) != len(examples):
        raise TrainingDataError("teacher", f"{len(logits)} teacher logits for {len(examples)} examples")
    return [soft_label(float(z), e.label, config) for z, e in zip(logits, examples, strict=True)]


def group_by_query(examples: Sequence[LabelledPair]) -> dict[str, list[int]]:
    """``{query: indices into examples}``, queries in first-seen order, indices ascending."""
    groups: dict[str, list[int]] = {}
    for i, e in enumerate(examples):
        groups.setdefault(e.query, []).append(i)
    return groups


def teacher_logits(examples: Sequence[LabelledPair],
                   score: Callable[[str, Sequence[str]], Iterable[float]]) -> list[float]:
    """The teacher's raw logit for every example, in the examples' order, with one ``score(query,
    passages)`` call per distinct query (e.g. ``mnemos.rerank.CrossEncoderReranker.score``, which
    batches a query's passages itself).

    Raises:
        TrainingDataError: if ``score`` returns a different number of logits than passages.
    """
    out = [0.0] * len(examples)
    for query, indices in group_by_query(examples).items():
        scores = [float(s) for s in score(query, [examples[i].passage for i in indices])]
        if len(scores) != len(indices):
            raise TrainingDataError("teacher", f"{len(scores)} scores for {len(indices)} passages")
        for i, s in zip(indices, scores, strict=True):
            out[i] = s
    return out


def teacher_training_conversations(teacher_dir: Path, *, role: str = "teacher", source: str | None = None) -> list[str]:
    """The ``training_conversations`` of the teacher's ``mnemos_provenance.json`` (sorted, unique;
    ``[]`` for a teacher trained on a pairs file). ``role`` names the model in the errors ("the
    teacher"; "the miner" for :mod:`bench.training.negative_miner`), ``source`` their source
    (default ``role``).

    Raises:
        TrainingDataError: if the file is missing or unreadable, or the key is absent: without it,
            held-out evaluation of the student could not be guaranteed.
    """
    source = source or role
    try:
        record = reranker_provenance(str(teacher_dir))
    except (OSError, json.JSONDecodeError) as exc:
        raise TrainingDataError(
            source, f"cannot read the {role}'s {PROVENANCE_FILE} ({exc.__class__.__name__}): its training "
            "conversations are unknown, so held-out evaluation could not be guaranteed") from exc
    if record is None:
        raise TrainingDataError(
            source, f"the {role} has no {PROVENANCE_FILE}: its training conversations are unknown, so "
            "held-out evaluation could not be guaranteed")
    conversations = record.get("training_conversations") if isinstance(record, dict) else None
    if not isinstance(conversations, list):
        raise TrainingDataError(
            source, f"the {role}'s {PROVENANCE_FILE} has no training_conversations list, so held-out "
            "evaluation could not be guaranteed")
    return sorted({str(c) for c in conversations})


def with_training_items(provenance: Mapping[str, Any], items: Iterable[str]) -> dict[str, Any]:
    """A copy of ``provenance`` whose ``training_conversations`` is the sorted union of its own and
    ``items`` (another model's, whose learning reaches this one), and whose
    ``held_out_conversations`` (only when present) loses every item of that union."""
    record = dict(provenance)
    union = sorted({*map(str, record.get("training_conversations", ())), *items})
    record["training_conversations"] = union
    if "held_out_conversations" in record:
        record["held_out_conversations"] = sorted(set(map(str, record["held_out_conversations"])) - set(union))
    return record


def distilled_provenance(provenance: Mapping[str, Any], *, teacher_name: str, teacher_digest: str,
                         teacher_conversations: Sequence[str], config: DistilConfig) -> dict[str, Any]:
    """A copy of the student's ``provenance`` for a distilled model.

    ``training_conversations`` becomes the sorted union of the student's and the teacher's;
    ``held_out_conversations`` (only when present) loses every conversation of that union; a
    ``distillation`` block records the teacher's directory name (never a path), model digest and
    training conversations, the temperature and the weight.
    """
    record = with_training_items(provenance, teacher_conversations)
    record["distillation"] = {
        "teacher": teacher_name,
        "teacher_digest": teacher_digest,
        "teacher_training_conversations": sorted(set(teacher_conversations)),
        "temperature": config.temperature,
        "weight": config.weight,
        "soft_label": "W * sigmoid(teacher_logit / T) + (1 - W) * hard_label",
    }
    return record
