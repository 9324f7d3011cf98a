"""The listwise (LCE) training objective: how mined pairs become groups, and a tiny run."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from bench.training.cli import reranker
from bench.training.cross_encoder import TrainConfig, lce_groups, train_cross_encoder
from bench.training.errors import TrainingDataError
from bench.training.pairs import LabelledPair
from tests.unit.test_bench_training import TEXTS
from workers.runtime.models import PROVENANCE_FILE


def _block(query: str, positive: str, negatives: list[str]) -> list[LabelledPair]:
    return [LabelledPair(query, positive, 1.0)] + [LabelledPair(query, n, 0.0) for n in negatives]


def test_groups_follow_the_mined_order_and_pad_with_their_own_negatives():
    examples = _block("q1", "p1", ["a", "b", "c"]) + _block("q2", "p2", ["d"]) + _block("q1", "p1b", ["e", "f"])
    assert lce_groups(examples) == [
        ("q1", "p1", ["a", "b", "c"]),
        ("q2", "p2", ["d", "d", "d"]),
        ("q1", "p1b", ["e", "f", "e"]),  # a sibling positive keeps its own negatives, not p1's
    ]


@pytest.mark.parametrize(
    ("examples", "problem"),
    [
        ([LabelledPair("q", "n", 0.0), LabelledPair("q", "p", 1.0)], "follows no positive"),
        (_block("q1", "p1", ["a"]) + [LabelledPair("q2", "b", 0.0)], "follows no positive"),
        (_block("q1", "p1", ["a"]) + _block("q2", "p2", []), "at least one negative"),
    ],
)
def test_groups_refuse_pairs_that_are_not_groups(examples, problem):
    with pytest.raises(TrainingDataError, match=problem):
        lce_groups(examples)


def test_unknown_loss_and_lce_with_soft_labels_are_refused(tmp_path):
    examples = _block("q", "p", ["n"])
    with pytest.raises(TrainingDataError, match="unknown loss"):
        train_cross_encoder(examples, tmp_path / "m", config=TrainConfig(max_steps=1, loss="hinge"))
    with pytest.raises(TrainingDataError, match="hard labels only"):
        train_cross_encoder(examples, tmp_path / "m", config=TrainConfig(max_steps=1, loss="lce"),
                            soft_labels=[0.9, 0.1])
    assert not (tmp_path / "m").exists()


def test_cli_refuses_distillation_with_lce_and_in_batch_negatives_without_it(tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    result = CliRunner().invoke(reranker, ["train", "--pairs", str(pairs), "--out", str(tmp_path / "m"),
                                           "--loss", "lce", "--teacher", str(tmp_path)])
    assert result.exit_code == 2 and "--loss bce only" in result.output
    result = CliRunner().invoke(reranker, ["train", "--pairs", str(pairs), "--out", str(tmp_path / "m"),
                                           "--in-batch-negatives", "3"])
    assert result.exit_code == 2 and "applies to --loss lce only" in result.output
    assert not (tmp_path / "m").exists()


@pytest.mark.slow
def test_a_tiny_lce_run_trains_by_groups_and_records_its_objective(tmp_path):
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"query": f"fact about {t.split()[2]}", "positive": t}) for t in TEXTS) + "\n",
                     encoding="utf-8")
    out = tmp_path / "model"
    result = CliRunner().invoke(reranker, [
        "train", "--pairs", str(pairs), "--out", str(out), "--max-steps", "2", "--no-dense", "--threads", "1",
        "--hard-negatives", "1", "--mining-depth", "5", "--loss", "lce", "--batch-size", "4",
        "--in-batch-negatives", "1"])
    assert result.exit_code == 0, result.output
    provenance = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8"))
    assert provenance["train_config"]["loss"] == "lce" and provenance["train_config"]["batch_size"] == 4
    assert provenance["train_config"]["in_batch_negatives"] == 1 and "MultipleNegativesRankingLoss" in provenance["recipe"]
    assert provenance["steps"] == 2 and provenance["n_positives"] == 10
    # a softmax over 1 positive, 2 own negatives (1 hard, 1 random) and 1 in-batch one starts near ln 4
    assert 0.5 < provenance["training_loss"] < 3.0
