"""Chit-chat turns: training negatives of the positive's own speaker, and held-out ones added to pools."""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

import pytest

from bench.common.datasets import load_longmemeval
from bench.training.chitchat import HELD_OUT_PHRASES, TRAINING_PHRASES, chitchat_negatives, chitchat_turns
from bench.training.pairs import MiningConfig, PairSource, PositivePair, mine_examples
from bench.training.pool_check import check_pools
from mnemos.rendering import render_turn
from mnemos.rerank import FakeReranker
from tests.unit.longmemeval_items import lme_item, lme_turn, write_items


def test_held_out_phrases_are_never_training_phrases() -> None:
    training = {p.casefold() for p in TRAINING_PHRASES}
    assert not training & {p.casefold() for p in HELD_OUT_PHRASES}
    assert len(set(TRAINING_PHRASES)) == len(TRAINING_PHRASES) and len(set(HELD_OUT_PHRASES)) == len(HELD_OUT_PHRASES)


def test_chitchat_turns_are_rendered_as_the_index_renders_a_turn() -> None:
    assert chitchat_turns(["ok"], "assistant") == [render_turn("assistant", "ok")] == ["assistant: ok"]
    assert chitchat_turns(["ok"], None) == [render_turn("", "ok")] == ["ok"]


def test_chitchat_negatives_are_distinct_seeded_and_skip_what_is_excluded() -> None:
    taken = {render_turn("user", p) for p in TRAINING_PHRASES[:-3]}
    drawn = chitchat_negatives(random.Random(0), "user", taken, 10)
    assert sorted(drawn) == sorted(render_turn("user", p) for p in TRAINING_PHRASES[-3:])  # only 3 remain
    assert chitchat_negatives(random.Random(4), "user", (), 5) == chitchat_negatives(random.Random(4), "user", (), 5)
    with pytest.raises(ValueError, match=">= 0"):
        chitchat_negatives(random.Random(0), "user", (), -1)


def _positives() -> tuple[list[PositivePair], dict[str, list[str]]]:
    evidence = {"g1": render_turn("user", "I adopted a cat named Miso last spring."),
                "g2": render_turn("assistant", "Your flight to Lisbon leaves at 7 am.")}
    questions = {"g1": "What is the name of the cat I adopted?", "g2": "When does my flight to Lisbon leave?"}
    filler = [render_turn(speaker, f"{topic} is on my mind today") for speaker in ("user", "assistant")
              for topic in ("gardening", "taxes", "chess", "soup")]
    corpora = {g: [evidence[g], *filler] for g in evidence}
    return [PositivePair(questions[g], evidence[g], g, PairSource.LONGMEMEVAL) for g in evidence], corpora


@pytest.mark.parametrize("same_speaker", [True, False])
def test_the_miner_adds_chitchat_of_the_positive_speaker_and_leaves_the_other_negatives(same_speaker: bool) -> None:
    positives, corpora = _positives()
    base = MiningConfig(hard_negatives=2, random_negatives=1, use_dense=False, same_speaker=same_speaker)
    plain = mine_examples(positives, config=base, corpora=corpora)
    extra = mine_examples(positives, config=replace(base, chitchat_negatives=2), corpora=corpora)
    per_block = 1 + 2 + 1
    for b, positive in enumerate(positives):
        before = plain[b * per_block:(b + 1) * per_block]
        after = extra[b * (per_block + 2):(b + 1) * (per_block + 2)]
        assert after[:per_block] == before  # positive, hard and random negatives unchanged, in order
        speaker = positive.passage.split(": ", 1)[0]
        for pair in after[per_block:]:  # even without same_speaker: the prefix must not be a label
            assert pair.label == 0.0 and pair.query == positive.query
            assert pair.passage in {render_turn(speaker, p) for p in TRAINING_PHRASES}
        assert len({p.passage for p in after[per_block:]}) == 2


def test_chitchat_in_pools_shows_a_reranker_that_favours_it(tmp_path: Path) -> None:
    turns = [lme_turn("user", f"the cat {word} naps", answer=i == 0)
             for i, word in enumerate(["Miso", "Tom", "Rex", "Bo"])]
    path = write_items(tmp_path / "lme.json", [lme_item("q1", "Which cat naps?", "single-session-user",
                                                        [("s1", turns)])])
    conversations = load_longmemeval(path)
    short_first = FakeReranker(fn=lambda query, text: -len(text))  # chit-chat is the shortest: ranked first
    long_first = FakeReranker(fn=lambda query, text: len(text) + (1 if "Miso" in text else 0))
    plain = check_pools(conversations, short_first, trained=set(), n_resamples=50).rows[0]
    fooled = check_pools(conversations, short_first, trained=set(), n_resamples=50, chitchat=3).rows[0]
    immune = check_pools(conversations, long_first, trained=set(), n_resamples=50, chitchat=3).rows[0]
    assert (plain.pool, fooled.pool) == (4, 7)
    assert fooled.bm25 == plain.bm25 and fooled.recall_pool == plain.recall_pool == 1.0  # BM25's own order unchanged
    assert fooled.chitchat_rerank == pytest.approx(3 / 7) and plain.chitchat_rerank == 0.0
    assert fooled.rerank < plain.rerank
    assert immune.chitchat_rerank == pytest.approx(3 / 7)  # 7 turns: all in the top 10 however ranked
    assert immune.rerank == pytest.approx(1.0)
    added = short_first.calls[-1][1][-3:]  # appended after BM25's pool, as the user's held-out phrases
    assert all(t.startswith("user: ") and t[len("user: "):] in HELD_OUT_PHRASES for t in added)
    assert len(set(added)) == 3
    with pytest.raises(ValueError, match="chitchat must be >= 0"):
        check_pools(conversations, short_first, trained=set(), chitchat=-1)
