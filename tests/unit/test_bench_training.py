"""bench.training.pairs, bench.training.cross_encoder and ``reranker train``: data selection, mining, a tiny real run."""

from __future__ import annotations

import json
import zlib
from datetime import UTC, datetime

import numpy as np
import pytest
from click.testing import CliRunner

from bench.common.datasets import Conversation, Question, Turn
from bench.training.cli import reranker
from bench.training.cross_encoder import TrainConfig, train_cross_encoder
from bench.training.errors import TrainingDataError
from bench.training.jsonl_pairs import read_pairs_jsonl
from bench.training.pairs import (
    LabelledPair,
    MiningConfig,
    PairSource,
    PositivePair,
    fold_conversations,
    locomo_positives,
    mine_examples,
    turn_passages,
)
from mnemos.tokenizer import tokenize
from workers.runtime.models import PROVENANCE_FILE

T0 = datetime(2023, 5, 8, tzinfo=UTC)
TEXTS = [
    "I adopted a cat named Miso last week.",
    "My cat Miso sleeps on the keyboard.",
    "We moved to Oslo in March.",
    "Oslo is cold but beautiful.",
    "I started learning the violin.",
    "The violin teacher is strict.",
    "Pizza night with friends was fun.",
    "I ran a half marathon on Sunday.",
    "My sister visited from Lisbon.",
    "Work has been stressful lately.",
]
RENDERED = [f"A: {text}" for text in TEXTS]  # what the reranker is trained on: speaker "A" rendered in


def _conversation(conv_id: str = "conv-1") -> Conversation:
    turns = tuple(Turn(f"D1:{i + 1}", "S1", "A", text, T0) for i, text in enumerate(TEXTS))
    questions = (
        Question(f"{conv_id}:0", conv_id, "What is the cat called?", frozenset({"D1:1", "D1:2"}), 4, None),
        Question(f"{conv_id}:1", conv_id, "Where did they move?", frozenset({"D1:3"}), 2, None),
        Question(f"{conv_id}:2", conv_id, "What instrument?", frozenset({"D1:5"}), 5, None),
        Question(f"{conv_id}:3", conv_id, "Nothing to find", frozenset(), 3, None),
    )
    observations = (("A has a cat called Miso.", "D1:1"), ("A learns violin.", "D1:5"))
    return Conversation(conv_id, turns, questions, observations)


class FakeEncoder:
    """Hashed bag of tokens, L2-normalised: deterministic, no model."""

    dim = 32

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for token in tokenize(text):
                out[row, zlib.crc32(token.encode()) % self.dim] += 1.0
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(norms == 0, 1.0, norms)


# ---------------------------------------------------------------------------- selection


def test_fold_conversations_holds_out_one_contiguous_chunk():
    ids = [f"conv-{n}" for n in (50, 26, 30, 41, 42, 43, 44, 47, 48, 49)]
    train, held = fold_conversations(ids, 2, 2)
    assert train == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    assert held == ["conv-44", "conv-47", "conv-48", "conv-49", "conv-50"]
    train, held = fold_conversations(ids, 1, 2)
    assert held == ["conv-26", "conv-30", "conv-41", "conv-42", "conv-43"]
    train, held = fold_conversations(ids, 1, 3)
    assert len(held) == 4 and len(train) == 6 and not set(train) & set(held)


@pytest.mark.parametrize(("fold", "n_folds"), [(0, 2), (3, 2), (1, 11)])
def test_fold_conversations_rejects_impossible_folds(fold, n_folds):
    with pytest.raises(TrainingDataError):
        fold_conversations([f"c{i}" for i in range(10)], fold, n_folds)


def test_locomo_positives_pairs_facts_and_evidence_and_skips_category_5():
    pairs = locomo_positives([_conversation("conv-1"), _conversation("conv-2")], ["conv-2"])
    assert {p.group for p in pairs} == {"conv-2"}
    got = {(p.source, p.query, p.turn_id) for p in pairs}
    assert got == {
        (PairSource.OBSERVATION, "A has a cat called Miso.", "D1:1"),
        (PairSource.OBSERVATION, "A learns violin.", "D1:5"),
        (PairSource.QA, "What is the cat called?", "D1:1"),
        (PairSource.QA, "What is the cat called?", "D1:2"),
        (PairSource.QA, "Where did they move?", "D1:3"),
    }
    assert next(p for p in pairs if p.turn_id == "D1:3").passage == RENDERED[2]
    with_5 = locomo_positives([_conversation()], qa_categories=None, use_observations=False)
    assert {p.query for p in with_5} == {"What is the cat called?", "Where did they move?", "What instrument?"}


def test_locomo_positives_rejects_unknown_conversations():
    with pytest.raises(TrainingDataError, match="conv-404"):
        locomo_positives([_conversation()], ["conv-404"])


def test_read_pairs_jsonl(tmp_path):
    path = tmp_path / "pairs.jsonl"
    rows = [{"query": "q1", "positive": "p1", "negatives": ["n1", "n2"]}, {"query": "q2", "positive": "p2"}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n", encoding="utf-8")
    pairs = read_pairs_jsonl(path)
    assert [(p.query, p.passage, p.negatives) for p in pairs] == [("q1", "p1", ("n1", "n2")), ("q2", "p2", ())]
    assert all(p.source is PairSource.JSONL and p.group == str(path) for p in pairs)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"query": "q"\n', "invalid JSON"),
        ('["q", "p"]\n', "JSON object"),
        ('{"query": "q", "positive": " "}\n', "non-empty strings"),
        ('{"query": "q", "positive": "p", "negatives": "n"}\n', "list of strings"),
        ("\n\n", "no pairs"),
    ],
)
def test_read_pairs_jsonl_rejects_malformed_lines(tmp_path, text, problem):
    path = tmp_path / "bad.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TrainingDataError, match=problem):
        read_pairs_jsonl(path)


# ---------------------------------------------------------------------------- mining


def _mine(config: MiningConfig | None = None, encoder=None):
    config = config or MiningConfig()
    conv = _conversation()
    return mine_examples(
        locomo_positives([conv]), config=config, encoder=encoder, corpora={"conv-1": list(turn_passages(conv).values())}
    )


@pytest.mark.parametrize("encoder", [None, FakeEncoder()])
def test_mining_shape_and_no_negative_is_a_positive(encoder):
    examples = _mine(encoder=encoder)
    positives = locomo_positives([_conversation()])
    assert sum(e.label == 1.0 for e in examples) == len(positives)
    if encoder is not None:  # the dense ranking always has candidates to spare
        assert len(examples) == len(positives) * (1 + 3 + 1)
    else:  # BM25 only offers passages sharing a token with the query
        assert len(positives) * 2 <= len(examples) <= len(positives) * 5
    gold = {(p.query, p.passage) for p in positives}
    for e in examples:
        assert ((e.query, e.passage) in gold) == (e.label == 1.0)
    assert all(e.passage in RENDERED for e in examples)


def test_mining_puts_lexical_neighbours_first():
    examples = _mine(MiningConfig(hard_negatives=1, random_negatives=0, use_dense=False))
    (neg,) = [e for e in examples if e.query == "A learns violin." and e.label == 0.0]
    assert neg.passage == "A: The violin teacher is strict."


def test_sibling_positives_get_different_hard_negatives():
    examples = _mine(MiningConfig(hard_negatives=1, random_negatives=0, use_dense=False))
    negatives = [e.passage for e in examples if e.query == "What is the cat called?" and e.label == 0.0]
    assert len(negatives) == 2 and len(set(negatives)) == 2


def test_mining_is_seeded():
    assert _mine(MiningConfig(seed=3)) == _mine(MiningConfig(seed=3))
    randoms = {tuple(e.passage for e in _mine(MiningConfig(seed=s, hard_negatives=0))) for s in range(8)}
    assert len(randoms) > 1


def test_max_pairs_keeps_whole_groups():
    def blocks(examples):
        out = []
        for e in examples:
            if e.label == 1.0:
                out.append([])
            out[-1].append(e)
        return out

    full = blocks(_mine(MiningConfig(seed=1)))
    capped = _mine(MiningConfig(seed=1, max_pairs=12))
    assert 0 < len(capped) <= 12 and capped[0].label == 1.0
    assert all(block in full for block in blocks(capped))


def test_given_negatives_are_kept_and_others_fill_up():
    positives = [
        PositivePair("q cat", "the cat sleeps", "g", PairSource.JSONL, negatives=("a dog barks",)),
        PositivePair("q oslo", "oslo is cold", "g", PairSource.JSONL),
        PositivePair("q run", "a half marathon", "g", PairSource.JSONL),
    ]
    examples = mine_examples(positives, config=MiningConfig(hard_negatives=1, random_negatives=1))
    cat = [e.passage for e in examples if e.query == "q cat" and e.label == 0.0]
    assert cat[0] == "a dog barks" and len(cat) == 2
    assert {e.passage for e in examples if e.query == "q oslo" and e.label == 0.0} <= {
        "the cat sleeps", "a half marathon"
    }


def test_mining_without_positives_raises():
    with pytest.raises(TrainingDataError):
        mine_examples([])


# ---------------------------------------------------------------------------- training


@pytest.mark.parametrize(
    "examples", [[], [LabelledPair("q", "p", 1.0)], [LabelledPair("q", "p", 0.0), LabelledPair("q", "x", 0.5)]]
)
def test_train_rejects_unusable_examples(tmp_path, examples):
    with pytest.raises(TrainingDataError):
        train_cross_encoder(examples, tmp_path / "m", config=TrainConfig(max_steps=1))


def test_cli_usage_errors(tmp_path):
    runner = CliRunner()
    pairs = tmp_path / "p.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    result = runner.invoke(reranker, ["train", "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "at least one source" in result.output
    result = runner.invoke(reranker, ["train", "--pairs", str(pairs), "--fold", "1/2", "--out", str(tmp_path / "m")])
    assert result.exit_code == 2


def test_cli_reports_bad_pairs_file(tmp_path):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text("nope\n", encoding="utf-8")
    result = CliRunner().invoke(reranker, ["train", "--pairs", str(pairs), "--out", str(tmp_path / "m"), "--no-dense"])
    assert result.exit_code == 2 and "invalid JSON" in result.output


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A real (tiny) fine-tune through the CLI: two optimiser steps on synthetic pairs."""
    tmp_path = tmp_path_factory.mktemp("tiny")
    pairs = tmp_path / "pairs.jsonl"
    rows = [{"query": f"fact about {t.split()[2]}", "positive": t} for t in TEXTS]
    pairs.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    out = tmp_path / "model"
    result = CliRunner().invoke(
        reranker,
        ["train", "--pairs", str(pairs), "--out", str(out), "--max-steps", "2", "--no-dense", "--threads", "1",
         "--seed", "7", "--hard-negatives", "1", "--mining-depth", "5"],
    )
    return out, result, pairs


@pytest.mark.slow
def test_tiny_training_run_writes_model_and_provenance(tiny_model):
    out, result, pairs = tiny_model
    assert result.exit_code == 0, result.output
    assert "training time:" in result.output
    provenance = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8"))
    # at most one hard (--hard-negatives 1) and one random negative per positive
    assert provenance["n_positives"] == 10 and 10 <= provenance["n_negatives"] <= 20
    assert provenance["mining"]["hard_negatives"] == 1 and provenance["mining"]["depth"] == 5
    assert provenance["n_pairs"] == provenance["n_positives"] + provenance["n_negatives"]
    assert provenance["seed"] == 7 and provenance["steps"] == 2 and provenance["seconds"] > 0
    assert provenance["training_conversations"] == [] and provenance["pairs_file"] == pairs.name
    assert "all-MiniLM-L6-v2" in provenance["base_model"] and provenance["created_at"]
    config = json.loads((out / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert config["activation_fn"].endswith("Identity")  # predict() gives logits
    from sentence_transformers.cross_encoder import CrossEncoder

    scores = CrossEncoder(str(out)).predict([("fact about cat", TEXTS[0]), ("fact about cat", TEXTS[6])])
    assert np.asarray(scores).shape == (2,)


@pytest.mark.slow
def test_check_scores_held_out_conversations_only(tiny_model, tmp_path):
    from tests.unit.test_datasets import LOCOMO_FIXTURE

    out, result, _ = tiny_model
    assert result.exit_code == 0, result.output
    data = tmp_path / "locomo.json"
    data.write_text(LOCOMO_FIXTURE, encoding="utf-8")
    provenance_path = out / PROVENANCE_FILE
    provenance = json.loads(provenance_path.read_text(encoding="utf-8"))
    args = ["check", "--model", str(out), "--data", str(data), "--speed-pairs", "40", "--threads", "1"]

    provenance.update(training_conversations=["conv-9"], held_out_conversations=["conv-9"])
    provenance_path.write_text(json.dumps(provenance), encoding="utf-8")
    refused = CliRunner().invoke(reranker, args)
    assert refused.exit_code == 2 and "no held-out conversation" in refused.output

    provenance.update(training_conversations=[], held_out_conversations=["conv-9"])
    provenance_path.write_text(json.dumps(provenance), encoding="utf-8")
    checked = CliRunner().invoke(reranker, args)
    assert checked.exit_code == 0, checked.output
    assert "mean logit (question, evidence turn)" in checked.output and "pairs/s" in checked.output


@pytest.mark.slow
def test_dense_mining_uses_the_service_encoder_behind_the_bench_cache(tmp_path):
    """--dense embeds every passage through the bench's embedding cache (so a later bench run, or a
    second training run, reads the vectors instead of computing them) and records the encoder."""
    from bench.common.caches import cached_bi_encoder
    from mnemos.encoder import bundled_bi_encoder_path

    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"query": f"fact about {t.split()[2]}", "positive": t}) for t in TEXTS)
                     + "\n", encoding="utf-8")
    cache = tmp_path / "cache"
    result = CliRunner().invoke(
        reranker, ["train", "--pairs", str(pairs), "--out", str(tmp_path / "m"), "--max-steps", "1", "--dense",
                   "--cache-dir", str(cache), "--threads", "1", "--calibration-queries", "0"])
    assert result.exit_code == 0, result.output
    provenance = json.loads((tmp_path / "m" / PROVENANCE_FILE).read_text(encoding="utf-8"))
    assert provenance["mining"]["dense"] is True and provenance["dense_mining"] is True
    reread = cached_bi_encoder(bundled_bi_encoder_path(), cache / "embeddings", "auto")
    assert provenance["mining_encoder"] == reread.model_key
    vectors = reread.encode(TEXTS)
    assert reread.encoded == 0 and vectors.shape == (len(TEXTS), 384)  # every passage came from the cache
