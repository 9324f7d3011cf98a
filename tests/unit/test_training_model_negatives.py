"""Self-mined negatives: the hard candidates a trained cross-encoder ranks highest become negatives,
and the mining model's training items count as the new model's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from bench.training.errors import TrainingDataError
from bench.training.model_negatives import model_negatives, model_order
from bench.training.negative_miner import load_negative_miner
from bench.training.pairs import MiningConfig, PairSource, PositivePair, mine_examples
from mnemos.rendering import render_turn, rendered_speaker
from tests.unit.tiny_cross_encoder import build_tiny_cross_encoder
from workers.runtime.models import PROVENANCE_FILE


def _by_keyword(keyword: str):
    """A scorer that prefers passages with ``keyword``, then shorter ones (a stand-in for a model)."""
    calls: list[tuple[str, list[str]]] = []

    def score(query: str, passages):
        calls.append((query, list(passages)))
        return np.array([(10.0 if keyword in p else 0.0) - len(p) / 1000 for p in passages], dtype=np.float32)

    score.calls = calls  # type: ignore[attr-defined]
    return score


def test_model_order_sorts_by_logit_and_keeps_ties_in_input_order() -> None:
    passages = ["b long passage", "cat", "a", "cat too"]
    assert model_order(_by_keyword("cat"), "q", passages) == ["cat", "cat too", "a", "b long passage"]
    flat = model_order(lambda q, ps: np.zeros(len(ps)), "q", passages)
    assert flat == passages
    assert model_order(_by_keyword("cat"), "q", []) == []


def test_model_order_refuses_a_scorer_that_returns_the_wrong_number_of_logits() -> None:
    with pytest.raises(ValueError, match="2 logits|\\(2,\\)"):
        model_order(lambda q, ps: np.zeros(2), "q", ["a", "b", "c"])


def test_model_negatives_skip_excluded_put_the_speaker_first_and_top_up() -> None:
    ranked = [render_turn("assistant", "a1"), render_turn("user", "u1"), render_turn("user", "u2"),
              render_turn("assistant", "a2")]
    speaker_of = {x: rendered_speaker(x) for x in ranked}
    user = rendered_speaker(ranked[1])
    assert model_negatives(ranked, {ranked[1]}, user, speaker_of, 2) == [ranked[2], ranked[0]]
    assert model_negatives(ranked, set(), None, {}, 2) == ranked[:2]
    assert model_negatives(ranked, set(), user, speaker_of, 0) == []
    assert model_negatives(ranked, set(ranked), user, speaker_of, 3) == []


def _fixture() -> tuple[list[PositivePair], dict[str, list[str]]]:
    evidence = {"g1": render_turn("user", "I adopted a cat named Miso last spring."),
                "g2": render_turn("user", "My flight to Lisbon leaves at seven in the morning.")}
    filler = [render_turn(speaker, f"{topic} {word} is on my mind this spring")
              for speaker in ("user", "assistant") for topic in ("gardening", "taxes", "chess", "soup")
              for word in ("cat", "flight")]
    questions = {"g1": "What is the name of the cat I adopted in spring?", "g2": "When does my flight leave?"}
    corpora = {g: [evidence[g], *filler] for g in evidence}
    positives = [PositivePair(questions[g], evidence[g], g, PairSource.LONGMEMEVAL) for g in evidence]
    return positives, corpora


def test_mining_adds_the_models_top_non_evidence_candidates_and_leaves_the_rest_as_it_was() -> None:
    positives, corpora = _fixture()
    base = MiningConfig(hard_negatives=2, random_negatives=1, use_dense=False, same_speaker=True, depth=30)
    plain = mine_examples(positives, config=base, corpora=corpora)
    scorer = _by_keyword("soup")
    extra = mine_examples(positives, config=replace(base, model_negatives=2), corpora=corpora, scorer=scorer)
    assert len(extra) == len(plain) + 2 * len(positives)
    assert len(scorer.calls) == len(positives)  # one call per question
    for positive in positives:
        before = [e for e in plain if e.query == positive.query]
        after = [e for e in extra if e.query == positive.query]
        assert after[: len(before)] == before  # positive, hard and random negatives unchanged
        added = after[len(before):]
        assert all(e.label == 0.0 for e in added)
        assert all(e.passage != positive.passage and e.passage not in {b.passage for b in before} for e in added)
        # the scorer's favourites among the rest: user turns about soup (the positive's speaker first)
        assert all("soup" in e.passage and rendered_speaker(e.passage) == "user" for e in added)
        query, candidates = next(c for c in scorer.calls if c[0] == positive.query)
        assert positive.passage not in candidates  # evidence is never ranked as a candidate negative


def test_model_negatives_without_a_scorer_are_refused() -> None:
    positives, corpora = _fixture()
    with pytest.raises(TrainingDataError, match="model_negatives"):
        mine_examples(positives, config=MiningConfig(use_dense=False, model_negatives=1), corpora=corpora)


def test_a_miner_without_provenance_is_refused(tmp_path: Path) -> None:
    (tmp_path / "ce").mkdir()
    with pytest.raises(TrainingDataError, match="^negative miner: the miner has no .*held-out evaluation could not"):
        load_negative_miner(tmp_path / "ce", "cpu", {})


def test_the_miners_training_items_and_sources_become_the_new_models(tmp_path: Path) -> None:
    import torch

    torch.set_num_threads(1)
    miner = build_tiny_cross_encoder(tmp_path / "miner")
    (miner / PROVENANCE_FILE).write_text(json.dumps({
        "training_conversations": ["q9", "q1"],
        "sources": [{"name": "longmemeval", "licence": "MIT", "n_items": 2}]}), encoding="utf-8")
    provenance: dict[str, object] = {"training_conversations": ["q1", "q2"], "held_out_conversations": ["q3", "q9"],
                                     "sources": [{"name": "longmemeval", "licence": "MIT", "n_items": 2}]}
    scorer = load_negative_miner(miner, "cpu", provenance)
    assert provenance["training_conversations"] == ["q1", "q2", "q9"]
    assert provenance["held_out_conversations"] == ["q3"]
    sources = provenance["sources"]
    assert isinstance(sources, list) and sources[-1]["via"] == "negative miner miner"
    block = provenance["negative_miner"]
    assert isinstance(block, dict) and block["model"] == "miner" and block["training_items"] == ["q1", "q9"]
    assert str(tmp_path) not in json.dumps(provenance)  # names, never paths
    logits = scorer("where is the cat", ["the cat", "taxes"])
    assert logits.shape == (2,) and np.isfinite(logits).all()


def test_model_negatives_never_come_from_an_evidence_turns_session(tmp_path: Path) -> None:
    from bench.common.datasets import load_longmemeval
    from bench.training.pairs import longmemeval_positives
    from tests.unit.longmemeval_items import lme_item, lme_turn, write_items

    coupon = [lme_turn("user", "I redeemed a coupon on coffee creamer last Sunday.", answer=True),
              lme_turn("assistant", "A coupon on coffee creamer is a nice surprise!"),
              lme_turn("user", "The coffee creamer coupon came by email.")]
    other = [lme_turn("user", f"I bought coffee beans and a {thing} at the market.") for thing in ("mug", "kettle")]
    path = write_items(tmp_path / "lme.json", [lme_item("q1", "Where did I redeem a coupon on coffee creamer?",
                                                        "single-session-user", [("s-coupon", coupon), ("s-market", other)])])
    positives, corpora = longmemeval_positives(load_longmemeval(path))
    (positive,) = positives
    assert len(positive.session) == 3 and positive.passage in positive.session  # the evidence's whole session
    scorer = _by_keyword("coupon")  # the model's favourites are the evidence session's other turns
    config = MiningConfig(hard_negatives=0, random_negatives=0, use_dense=False, same_speaker=True, model_negatives=2)
    examples = mine_examples(positives, config=config, corpora=corpora, scorer=scorer)
    negatives = [e.passage for e in examples if e.label == 0.0]
    assert len(negatives) == 2 and all("market" in n for n in negatives)
