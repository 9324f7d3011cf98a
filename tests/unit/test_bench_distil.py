"""bench.training.distil and ``reranker train --teacher``: soft labels, held-out provenance, usage errors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.training import cross_encoder as training
from bench.training.cli import reranker
from bench.training.distil import (
    DistilConfig,
    distilled_provenance,
    group_by_query,
    soft_label,
    soft_labels,
    teacher_logits,
    teacher_training_conversations,
)
from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from workers.runtime.models import PROVENANCE_FILE


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


EXAMPLES = [LabelledPair("q1", "a", 1.0), LabelledPair("q2", "b", 1.0), LabelledPair("q1", "c", 0.0),
            LabelledPair("q2", "d", 0.0), LabelledPair("q1", "e", 0.0)]


# ---------------------------------------------------------------------------- soft labels


def test_weight_one_is_the_teachers_sigmoid_and_weight_zero_the_hard_label():
    for logit in (-3.0, 0.0, 2.5):
        for hard in (0.0, 1.0):
            assert soft_label(logit, hard, DistilConfig(weight=1.0)) == pytest.approx(_sigmoid(logit))
            assert soft_label(logit, hard, DistilConfig(weight=0.0)) == hard


def test_temperature_divides_the_logit_and_weight_mixes():
    assert soft_label(4.0, 0.0, DistilConfig(temperature=2.0)) == pytest.approx(_sigmoid(2.0))
    assert soft_label(4.0, 0.0, DistilConfig(temperature=2.0)) < soft_label(4.0, 0.0, DistilConfig())
    mixed = soft_label(1.0, 1.0, DistilConfig(temperature=0.5, weight=0.25))
    assert mixed == pytest.approx(0.25 * _sigmoid(2.0) + 0.75)


@pytest.mark.parametrize("logit", [-1e6, -50.0, 0.0, 50.0, 1e6])
@pytest.mark.parametrize("weight", [0.0, 0.3, 1.0])
def test_soft_labels_stay_within_zero_and_one(logit, weight):
    for hard in (0.0, 1.0):
        assert 0.0 <= soft_label(logit, hard, DistilConfig(temperature=0.1, weight=weight)) <= 1.0


def test_soft_labels_follow_the_examples_and_reject_bad_input():
    logits = [0.0, 1.0, -1.0, 2.0, -2.0]
    labels = soft_labels(logits, EXAMPLES, DistilConfig(weight=0.5))
    assert labels == pytest.approx([0.5 * _sigmoid(z) + 0.5 * e.label for z, e in zip(logits, EXAMPLES, strict=True)])
    with pytest.raises(TrainingDataError):
        soft_labels(logits[:-1], EXAMPLES, DistilConfig())
    with pytest.raises(TrainingDataError):
        soft_label(float("nan"), 1.0, DistilConfig())


@pytest.mark.parametrize("kwargs", [{"temperature": 0.0}, {"temperature": -1.0}, {"temperature": float("inf")},
                                    {"weight": -0.1}, {"weight": 1.5}])
def test_distil_config_rejects_bad_settings(kwargs):
    with pytest.raises(TrainingDataError):
        DistilConfig(**kwargs)


def test_teacher_scores_each_query_once_and_logits_come_back_in_example_order():
    calls = []

    def score(query, passages):
        calls.append((query, list(passages)))
        return [float(ord(p)) for p in passages]

    assert group_by_query(EXAMPLES) == {"q1": [0, 2, 4], "q2": [1, 3]}
    assert teacher_logits(EXAMPLES, score) == [float(ord(e.passage)) for e in EXAMPLES]
    assert calls == [("q1", ["a", "c", "e"]), ("q2", ["b", "d"])]
    with pytest.raises(TrainingDataError):
        teacher_logits(EXAMPLES, lambda q, ps: [0.0])


# ---------------------------------------------------------------------------- provenance


def test_teacher_without_provenance_cannot_guarantee_held_out(tmp_path):
    with pytest.raises(TrainingDataError, match="held-out"):
        teacher_training_conversations(tmp_path)
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({"seed": 0}), encoding="utf-8")
    with pytest.raises(TrainingDataError, match="held-out"):
        teacher_training_conversations(tmp_path)
    (tmp_path / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": ["c3", "c1", "c3"]}),
                                            encoding="utf-8")
    assert teacher_training_conversations(tmp_path) == ["c1", "c3"]


def test_distilled_provenance_takes_the_union_and_shrinks_held_out():
    student = {"training_conversations": ["c2", "c1"], "held_out_conversations": ["c3", "c4", "c5"], "seed": 1}
    record = distilled_provenance(student, teacher_name="teacher-l6", teacher_digest="teacher-l6@abc",
                                  teacher_conversations=["c1", "c4"], config=DistilConfig(2.0, 0.5))
    assert record["training_conversations"] == ["c1", "c2", "c4"]
    assert record["held_out_conversations"] == ["c3", "c5"]
    assert record["seed"] == 1
    assert record["distillation"] == {
        "teacher": "teacher-l6", "teacher_digest": "teacher-l6@abc", "teacher_training_conversations": ["c1", "c4"],
        "temperature": 2.0, "weight": 0.5, "soft_label": "W * sigmoid(teacher_logit / T) + (1 - W) * hard_label",
    }
    assert student["training_conversations"] == ["c2", "c1"]  # the caller's record is not changed
    pairs_only = distilled_provenance({"pairs_file": "p.jsonl"}, teacher_name="t", teacher_digest="t@0",
                                      teacher_conversations=["c9"], config=DistilConfig())
    assert pairs_only["training_conversations"] == ["c9"] and "held_out_conversations" not in pairs_only


def test_label_column_is_the_hard_labels_without_soft_ones():
    assert training._label_column(EXAMPLES, None) == [1.0, 1.0, 0.0, 0.0, 0.0]
    assert training._label_column(EXAMPLES, [0.9, 0.8, 0.1, 0.2, 0.3]) == [0.9, 0.8, 0.1, 0.2, 0.3]
    with pytest.raises(TrainingDataError):
        training._label_column(EXAMPLES, [0.5])
    with pytest.raises(TrainingDataError):
        training._label_column(EXAMPLES, [0.5, 0.5, 0.5, 0.5, 1.5])


# ---------------------------------------------------------------------------- CLI


TEXTS = ["I adopted a cat named Miso.", "We moved to Oslo in March.", "I started learning the violin.",
         "Pizza night with friends was fun.", "My sister visited from Lisbon."]


@pytest.fixture()
def pairs_file(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps({"query": f"about {t.split()[-1]}", "positive": t}) for t in TEXTS) + "\n",
                    encoding="utf-8")
    return path


@pytest.fixture()
def captured(monkeypatch):
    """Replaces the fine-tune: records what ``run_train`` passes to it."""
    seen: dict[str, object] = {}

    def fake_train(examples, out_dir, *, config, provenance=None, calibration_pools=(), soft_labels=None, **_):
        seen.update(examples=list(examples), provenance=dict(provenance or {}), soft_labels=soft_labels, config=config)
        return training.TrainingReport(out_dir=Path(out_dir), base_model="fake", n_pairs=len(examples),
                                       n_positives=1, n_negatives=1, epochs=1.0, steps=1, training_loss=0.5,
                                       seconds=0.1, seed=0)

    monkeypatch.setattr(training, "train_cross_encoder", fake_train)
    return seen


def _train(tmp_path, pairs_file, *extra):
    args = ["train", "--pairs", str(pairs_file), "--out", str(tmp_path / "m"), "--no-dense", "--threads", "1", *extra]
    return CliRunner().invoke(reranker, args)


@pytest.mark.parametrize("option", [["--temperature", "2"], ["--distil-weight", "0.5"]])
def test_distillation_options_need_a_teacher(tmp_path, pairs_file, option):
    result = _train(tmp_path, pairs_file, *option)
    assert result.exit_code == 2 and "--teacher" in result.output


def test_without_a_teacher_labels_and_provenance_are_unchanged(tmp_path, pairs_file, captured):
    result = _train(tmp_path, pairs_file)
    assert result.exit_code == 0, result.output
    assert captured["soft_labels"] is None
    assert "distillation" not in captured["provenance"]  # type: ignore[operator]
    assert "training_conversations" not in captured["provenance"]  # type: ignore[operator]


def test_learning_rate_reaches_the_trainer_and_defaults_to_the_recipe(tmp_path, pairs_file, captured):
    assert _train(tmp_path, pairs_file).exit_code == 0
    assert captured["config"].learning_rate == 5e-5  # type: ignore[attr-defined]
    result = _train(tmp_path, pairs_file, "--learning-rate", "2e-4", "--layers", "3")
    assert result.exit_code == 0, result.output
    assert captured["config"].learning_rate == 2e-4 and captured["config"].layers == 3  # type: ignore[attr-defined]
    assert _train(tmp_path, pairs_file, "--learning-rate", "0").exit_code == 2


def test_a_teacher_without_provenance_is_refused(tmp_path, pairs_file, captured):
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    result = _train(tmp_path, pairs_file, "--teacher", str(teacher))
    assert result.exit_code == 2 and "held-out evaluation could not be guaranteed" in result.output
    assert captured == {}


def test_teacher_scores_become_soft_labels_and_its_conversations_count_as_seen(tmp_path, pairs_file, captured):
    from mnemos.rerank import CrossEncoderReranker, model_digest
    from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder

    teacher = build_tiny_cross_encoder(tmp_path / "teacher-l6")
    (teacher / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": ["conv-2", "conv-1"]}),
                                           encoding="utf-8")
    result = _train(tmp_path, pairs_file, "--teacher", str(teacher), "--temperature", "2", "--distil-weight", "0.75",
                    "--device", "cpu")
    assert result.exit_code == 0, result.output
    examples = captured["examples"]
    model = CrossEncoderReranker(teacher, max_length=128)
    expected = [0.75 * _sigmoid(float(model.score(e.query, [e.passage])[0]) / 2.0) + 0.25 * e.label
                for e in examples]  # type: ignore[attr-defined]
    assert captured["soft_labels"] == pytest.approx(expected, abs=1e-5)
    assert captured["soft_labels"] != [e.label for e in examples]  # type: ignore[attr-defined]
    provenance = captured["provenance"]
    assert provenance["training_conversations"] == ["conv-1", "conv-2"]  # type: ignore[index]
    block = provenance["distillation"]  # type: ignore[index]
    assert block["teacher"] == "teacher-l6" and block["teacher_digest"] == model_digest(teacher)
    assert block["teacher_training_conversations"] == ["conv-1", "conv-2"]
    assert block["temperature"] == 2.0 and block["weight"] == 0.75
    assert str(tmp_path) not in json.dumps(provenance, default=str)
