"""Training data a company may use: the LongMemEval miner, question folds, licences in provenance."""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.common.datasets import load_longmemeval
from bench.training.cli import reranker
from bench.training.errors import TrainingDataError
from bench.training.pairs import (
    MiningConfig,
    PairSource,
    PositivePair,
    longmemeval_positives,
    mine_examples,
    question_folds,
)
from bench.training.sources import training_positives
from mnemos.rendering import Rendering, render_turn, rendered_speaker
from tests.unit.longmemeval_items import lme_item, lme_turn, write_items
from workers.runtime.model_licences import COMMERCIAL_USE_LICENCES, restricted_sources, training_sources
from workers.runtime.models import PROVENANCE_FILE, warn_restricted_licence

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "mnemos" / "shipped" / "reranker"


COMMUTE = [lme_turn("user", "My commute to the office takes 45 minutes by tram.", answer=True),
           lme_turn("assistant", "That is a long ride; podcasts can help pass the time.")]
GARDEN = [lme_turn("user", "I planted tomatoes and basil on the balcony."),
          lme_turn("assistant", "Basil likes sun; water the tomatoes every morning.")]
TRAIN_RIDE = [lme_turn("user", "The tram was late again this morning, twenty minutes."),
              lme_turn("assistant", "Delays are frustrating; check the live board before leaving.")]
DOG = [lme_turn("user", "My dog Biscuit learned to fetch the newspaper.", answer=True),
       lme_turn("assistant", "Biscuit sounds clever!")]



# q1: the commute session repeats (same id, same turns, later date): read once
TINY = [
    lme_item("q1", "How long is my commute?", "single-session-user",
          [("s-commute", COMMUTE), ("s-garden", GARDEN), ("s-tram", TRAIN_RIDE), ("s-commute", COMMUTE)]),
    lme_item("q2", "What did my dog learn?", "single-session-user", [("s-dog", DOG), ("s-garden", GARDEN)]),
    lme_item("q3_abs", "What is my cat called?", "single-session-user", [("s-dog", DOG), ("s-garden", GARDEN)]),
    lme_item("q4", "What is my favourite colour?", "multi-session", [("s-garden", GARDEN)]),  # no has_answer turn
]


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    return write_items(tmp_path / "longmemeval_tiny.json", TINY)


def test_miner_pairs_questions_with_their_evidence_and_skips_abstention_and_evidence_less(tiny_file: Path) -> None:
    positives, corpora = longmemeval_positives(load_longmemeval(tiny_file))
    assert [(p.group, p.query, p.turn_id) for p in positives] == [
        ("q1", "How long is my commute?", "s-commute:0"), ("q2", "What did my dog learn?", "s-dog:0")]
    assert all(p.source is PairSource.LONGMEMEVAL for p in positives)
    assert positives[0].passage.endswith("My commute to the office takes 45 minutes by tram.")
    assert set(corpora) == {"q1", "q2"}  # q3_abs and q4 give neither positive nor corpus
    assert len(corpora["q1"]) == 6  # the repeated commute session counted once: 3 sessions x 2 turns
    assert len(set(corpora["q1"])) == len(corpora["q1"])


def test_mined_negatives_come_from_the_same_haystack(tiny_file: Path) -> None:
    positives, corpora = longmemeval_positives(load_longmemeval(tiny_file))
    examples = mine_examples(positives, config=MiningConfig(hard_negatives=2, random_negatives=1), corpora=corpora)
    for example in examples:
        group = "q1" if "commute" in example.query else "q2"
        assert example.passage in corpora[group]
        assert (example.label == 1.0) == (example.passage in {p.passage for p in positives if p.group == group})
    commute_negatives = [e.passage for e in examples if e.label == 0.0 and "commute" in e.query]
    assert commute_negatives and "a long ride" in commute_negatives[0]  # BM25's hard one ("is", "long") first


def _evidence_fixture() -> tuple[list[PositivePair], dict[str, list[str]]]:
    """Four questions: three with user evidence, one with assistant evidence; g1's haystack holds g2's
    evidence, which BM25 ranks first for g1's question, so it is already g1's hard negative."""
    evidence = {"g1": render_turn("user", "I adopted a cat named Miso last spring."),
                "g2": render_turn("user", "My sister's cat Miso sleeps on the piano all spring."),
                "g3": render_turn("assistant", "Your flight to Lisbon leaves at 7 am."),
                "g4": render_turn("user", "I run five kilometres every Sunday morning.")}
    filler = [render_turn(speaker, f"{topic} is on my mind today") for speaker in ("user", "assistant")
              for topic in ("gardening", "taxes", "chess", "soup", "trains", "paint")]
    questions = {"g1": "What is the name of the cat I adopted in spring?", "g2": "Where does my sister's cat sleep?",
                 "g3": "When does my flight to Lisbon leave?", "g4": "How far do I run on Sundays?"}
    corpora = {g: [evidence[g], *filler] for g in evidence}
    corpora["g1"].append(evidence["g2"])
    positives = [PositivePair(questions[g], evidence[g], g, PairSource.LONGMEMEVAL) for g in evidence]
    return positives, corpora


def _blocks(examples: list) -> list[list]:
    blocks: list[list] = []
    for e in examples:
        if e.label == 1.0:
            blocks.append([])
        blocks[-1].append(e)
    return blocks


def test_evidence_negatives_are_other_questions_evidence_and_leave_the_other_negatives_as_they_were() -> None:
    positives, corpora = _evidence_fixture()
    base = MiningConfig(hard_negatives=1, random_negatives=2, use_dense=False, same_speaker=True)
    plain = _blocks(mine_examples(positives, config=base, corpora=corpora))
    extra = _blocks(mine_examples(positives, config=replace(base, evidence_negatives=1), corpora=corpora))
    evidence = {p.group: p.passage for p in positives}
    assert plain[0][1].passage == evidence["g2"]  # g2's evidence is already g1's hard negative
    for before, after, positive in zip(plain, extra, positives, strict=True):
        assert after[:-1] == before  # same positive, hard and random negatives, in the same order
        added = after[-1]
        others = {g: x for g, x in evidence.items() if g != positive.group}
        assert added.label == 0.0 and added.passage in others.values()
        assert added.passage not in {e.passage for e in before}  # never a repeat
        if positive.group == "g1":  # g2's is taken: the only other user evidence left is g4's
            assert added.passage == evidence["g4"]
        elif positive.group == "g3":  # no other assistant evidence: topped up from the user turns
            assert added.passage.startswith("user: ")
        else:
            assert added.passage.startswith("user: ") and added.passage != evidence["g3"]


RIDE = [lme_turn("user", "The tram ride this morning took forty minutes.", answer=True),
        lme_turn("assistant", "A long tram ride this morning? A ride that long is a good time for podcasts."),
        lme_turn("user", "The tram was late."),
        lme_turn("assistant", "Basil likes sun."),
        lme_turn("user", "I planted basil.")]


def _ride_negatives(tmp_path: Path, same_speaker: bool, hard: int) -> list[str]:
    path = write_items(tmp_path / "ride.json", [lme_item("r1", "How long was the tram ride this morning?",
                                                           "single-session-user", [("s-ride", RIDE)])])
    positives, corpora = longmemeval_positives(load_longmemeval(path))
    config = MiningConfig(hard_negatives=hard, random_negatives=1, use_dense=False, same_speaker=same_speaker)
    return [e.passage for e in mine_examples(positives, config=config, corpora=corpora) if e.label == 0.0]


def test_same_speaker_mining_gives_a_positive_hard_and_random_negatives_of_its_own_speaker(tmp_path: Path) -> None:
    plain = _ride_negatives(tmp_path, same_speaker=False, hard=1)
    assert plain[0].startswith("assistant: A long tram ride")  # BM25's hardest candidate, the other speaker
    matched = _ride_negatives(tmp_path, same_speaker=True, hard=1)
    assert matched == ["user: The tram was late.", "user: I planted basil."]  # hard, then random, both the user's


def test_same_speaker_mining_takes_other_speakers_when_its_own_run_out(tmp_path: Path) -> None:
    matched = _ride_negatives(tmp_path, same_speaker=True, hard=2)
    assert matched[:2] == ["user: The tram was late.", "assistant: A long tram ride this morning? A ride that long "
                           "is a good time for podcasts."]
    assert matched[2] == "user: I planted basil."  # the random one still from the user's own turns


def test_rendered_speaker_reads_the_prefix_that_render_turn_writes() -> None:
    assert rendered_speaker(render_turn("Caroline", "I went: it was fun")) == "Caroline"
    assert rendered_speaker(render_turn("assistant", "Sure.")) == "assistant"
    assert rendered_speaker(render_turn("", "no speaker")) is None
    assert rendered_speaker("no prefix at all") is None


def test_miner_refuses_unknown_question_ids(tiny_file: Path) -> None:
    with pytest.raises(TrainingDataError, match="nope"):
        longmemeval_positives(load_longmemeval(tiny_file), ["q1", "nope"])


def test_question_folds_are_stratified_seeded_and_partition_the_questions() -> None:
    questions = [(f"u{i}", "single-session-user") for i in range(7)] + [(f"m{i}", "multi-session") for i in range(5)]
    folds = question_folds(questions, 2, seed=0)
    assert sorted(q for f in folds for q in f) == sorted(q for q, _ in questions)
    assert [len(f) for f in folds] == [6, 6]
    for fold in folds:
        types = Counter(q[0] for q in fold)
        assert types["u"] in (3, 4) and types["m"] in (2, 3)
    assert question_folds(questions, 2, seed=0) == folds
    assert question_folds(questions, 2, seed=1) != folds
    with pytest.raises(TrainingDataError):
        question_folds(questions, 1, seed=0)


def test_a_question_fold_holds_the_same_questions_out_of_every_file(tiny_file: Path, tmp_path: Path) -> None:
    oracle = write_items(tmp_path / "longmemeval_oracle_tiny.json",
                         [lme_item("q1", "How long is my commute?", "single-session-user", [("s-commute", COMMUTE)]),
                          lme_item("q2", "What did my dog learn?", "single-session-user", [("s-dog", DOG)])])
    provenance: dict[str, object] = {}
    positives, corpora = training_positives(None, None, None, None, provenance, longmemeval=[tiny_file, oracle],
                                    question_fold=(1, 2), fold_seed=0)
    held = set(provenance["held_out_questions"])  # type: ignore[arg-type]
    assert held and not held & {p.group for p in positives}
    assert [s["licence"] for s in provenance["sources"]] == ["MIT", "MIT"]  # type: ignore[union-attr]
    assert set(provenance["training_conversations"]) == {p.group for p in positives}  # type: ignore[arg-type]
    assert corpora is not None and all(len(v) == len(set(v)) for v in corpora.values())


def test_sources_combine_and_every_one_is_recorded_with_its_licence(tiny_file: Path, tmp_path: Path) -> None:
    from tests.unit.test_datasets import LOCOMO_FIXTURE

    locomo = tmp_path / "locomo.json"
    locomo.write_text(LOCOMO_FIXTURE, encoding="utf-8")
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    provenance: dict[str, object] = {}
    positives, _ = training_positives(locomo, pairs, None, (1, 1), provenance, longmemeval=[tiny_file], pairs_licence="CC0-1.0")
    sources = provenance["sources"]
    assert [(s["name"], s["licence"]) for s in sources] == [  # type: ignore[union-attr]
        ("LoCoMo", "CC-BY-NC-4.0"), ("LongMemEval", "MIT"), ("pairs file pairs.jsonl", "CC0-1.0")]
    assert {p.source for p in positives} >= {PairSource.LONGMEMEVAL, PairSource.JSONL}
    assert [s.name for s in restricted_sources(provenance)] == ["LoCoMo"]


def test_cli_needs_a_source_and_keeps_fold_options_to_their_source(tiny_file: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    out = str(tmp_path / "m")
    result = runner.invoke(reranker, ["train", "--out", out])
    assert result.exit_code == 2 and "at least one source" in result.output
    result = runner.invoke(reranker, ["train", "--longmemeval", str(tiny_file), "--fold", "1/2", "--out", out])
    assert result.exit_code == 2 and "--data only" in result.output
    result = runner.invoke(reranker, ["train", "--longmemeval", str(tiny_file), "--pairs-licence", "MIT", "--out", out])
    assert result.exit_code == 2 and "--pairs only" in result.output
    result = runner.invoke(reranker, ["train", "--longmemeval", str(tiny_file), "--fold-seed", "0", "--out", out])
    assert result.exit_code == 2 and "--question-fold only" in result.output


@pytest.mark.slow
def test_fold_seed_keeps_the_held_out_questions_while_the_training_seed_changes(tiny_file: Path,
                                                                               tmp_path: Path) -> None:
    expected: dict[str, object] = {}
    training_positives(None, None, None, None, expected, longmemeval=[tiny_file], question_fold=(1, 2), fold_seed=0)
    out = tmp_path / "m"
    result = CliRunner().invoke(reranker, [
        "train", "--longmemeval", str(tiny_file), "--question-fold", "1/2", "--seed", "5", "--fold-seed", "0",
        "--no-dense", "--max-steps", "1", "--threads", "1", "--calibration-queries", "0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    provenance = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8"))
    assert provenance["seed"] == 5 and provenance["question_fold_seed"] == 0
    assert provenance["held_out_questions"] == expected["held_out_questions"]


# ---------------------------------------------------------------------------- the licence rule


def test_the_committed_default_is_trained_only_on_data_that_permits_commercial_use() -> None:
    provenance = json.loads((SHIPPED / PROVENANCE_FILE).read_text(encoding="utf-8"))
    sources = training_sources(provenance)
    assert sources, "the shipped model's provenance names no training source"
    for source in sources:
        assert source.licence in COMMERCIAL_USE_LICENCES, f"the shipped model was trained on {source}"
    assert all(s.get("items") or s.get("n_items") for s in provenance["sources"])  # the items used are listed


@pytest.mark.parametrize(("record", "restricted"), [
    ({"sources": [{"name": "LongMemEval", "licence": "MIT", "items": ["q1"]}]}, []),
    ({"sources": [{"name": "LoCoMo", "licence": "CC-BY-NC-4.0", "items": ["conv-26"]},
                  {"name": "LongMemEval", "licence": "MIT", "items": ["q1"]}]}, ["LoCoMo"]),
    ({"data": "LoCoMo (Maharana et al., ACL 2024), CC BY-NC 4.0", "training_conversations": ["conv-26"]},
     ["LoCoMo"]),  # a provenance written before "sources"
    ({"pairs_file": "mine.jsonl", "training_conversations": []}, ["mine.jsonl"]),  # licence never stated
    ({"sources": [{"name": "pairs file x.jsonl", "licence": "unknown", "n_items": 3}]}, ["pairs file x.jsonl"]),
])
def test_restricted_sources(record: dict, restricted: list[str]) -> None:
    assert [s.name for s in restricted_sources(record)] == restricted


def test_loading_a_non_commercial_model_warns_once_naming_its_licence(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    model = tmp_path / "locomo-model"
    model.mkdir()
    (model / PROVENANCE_FILE).write_text(json.dumps(
        {"sources": [{"name": "LoCoMo", "licence": "CC-BY-NC-4.0", "items": ["conv-26"]}]}), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="workers.runtime.models"):
        assert warn_restricted_licence(str(model)) == ["LoCoMo (CC-BY-NC-4.0)"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "CC-BY-NC-4.0" in warnings[0].getMessage()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="workers.runtime.models"):
        assert warn_restricted_licence(str(SHIPPED)) == []
    assert not caplog.records


def test_the_bench_refuses_a_question_every_model_trained_on_naming_both() -> None:
    from bench.common.folds import FoldRerankers, RerankerFold
    from mnemos.rerank import FakeReranker

    folds = [RerankerFold("lme-fold-1", "a", frozenset({"q1", "q2"})), RerankerFold("lme-fold-2", "b", frozenset({"q2"}))]
    router = FoldRerankers(folds, {"lme-fold-1": FakeReranker(), "lme-fold-2": FakeReranker()})
    assert router.fold_for("q1").name == "lme-fold-2"  # cross-fitting: the model that never saw q1
    with pytest.raises(LookupError) as refused:
        router.fold_for("q2")
    message = str(refused.value)
    assert "\n" not in message and "q2" in message and "lme-fold-1" in message and "lme-fold-2" in message


def _speaker_negatives(corpus: list[str], positive: int, hard: int, random_: int) -> list[str]:
    pair = PositivePair("tram ride", corpus[positive], "g", PairSource.QA)
    config = MiningConfig(hard_negatives=hard, random_negatives=random_, use_dense=False, same_speaker=True)
    examples = mine_examples([pair], config=config, corpora={"g": corpus})
    assert [e.passage for e in examples if e.label == 1.0] == [corpus[positive]]
    negatives = [e.passage for e in examples if e.label == 0.0]
    assert corpus[positive] not in negatives  # a positive is never its own negative
    return negatives


def test_same_speaker_random_negatives_top_up_from_other_speakers_when_the_speaker_runs_out() -> None:
    corpus = [render_turn("Zed", "tram ride long"), render_turn("user", "tram late"),
              render_turn("Zed", "basil"), render_turn("assistant", "podcasts")]
    negatives = _speaker_negatives(corpus, 0, hard=0, random_=2)
    assert negatives[0] == "Zed: basil" and negatives[1] in corpus[1::2]  # own speaker first, then any
    alone = [render_turn("Zed", "tram ride long"), render_turn("user", "tram late"), render_turn("assistant", "basil")]
    assert sorted(_speaker_negatives(alone, 0, hard=1, random_=1)) == sorted(alone[1:])  # nobody else is Zed


def test_same_speaker_mining_of_a_turn_without_a_speaker_draws_from_every_turn() -> None:
    corpus = [render_turn("", "tram ride long"), render_turn("user", "tram late"), render_turn("", "basil"),
              render_turn("assistant", "podcasts")]
    negatives = _speaker_negatives(corpus, 0, hard=1, random_=2)
    assert negatives[0] == "user: tram late"  # hard: BM25 order, no speaker to prefer
    assert len(negatives) == 3 and set(negatives[1:]) <= set(corpus[1:])  # was one: only the speakerless turns


def test_same_speaker_reads_names_with_a_colon_and_text_renderings_by_their_first_colon() -> None:
    # Known limits, pinned: a name with ": " reads as its first part (LoCoMo's names have none), and a
    # TEXT rendering starting with "word: " reads as that speaker. Mining stays sane either way.
    corpus = [render_turn("Dr: Who", "tram ride long"), render_turn("Dr: No", "tram late"),
              render_turn("Amy", "tram ride")]
    assert rendered_speaker(corpus[0]) == rendered_speaker(corpus[1]) == "Dr"
    assert _speaker_negatives(corpus, 0, hard=1, random_=1) == corpus[1:]
    text = [render_turn("user", "Note: tram ride long", version=Rendering.TEXT),
            render_turn("assistant", "tram late", version=Rendering.TEXT)]
    assert rendered_speaker(text[0]) == "Note"
    assert _speaker_negatives(text, 0, hard=1, random_=1) == [text[1]]
