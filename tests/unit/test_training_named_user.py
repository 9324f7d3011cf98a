"""Named-user rendering of LongMemEval training questions: the rewrite, the draw, the miner."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.common.datasets import load_longmemeval
from bench.training.cli import reranker
from bench.training.named_user import FIRST_NAMES, assign_names, name_question
from bench.training.pairs import MiningConfig, longmemeval_positives, mine_examples
from bench.training.sources import training_positives
from mnemos.rendering import rendered_speaker
from tests.unit.longmemeval_items import lme_item, lme_turn, write_items

LOCOMO_SPEAKERS = {"Caroline", "Melanie", "Jon", "Gina", "John", "Maria", "Joanna", "Nate", "Tim", "Audrey",
                   "Andrew", "James", "Deborah", "Jolene", "Evan", "Sam", "Calvin", "Dave"}


@pytest.mark.parametrize(("question", "named"), [
    ("How many different doctors did I visit?", "How many different doctors did Lena visit?"),
    ("What is the name of my cat?", "What is the name of Lena's cat?"),
    ("Where do I take yoga classes?", "Where does Lena take yoga classes?"),
    ("Am I still on the waiting list?", "Is Lena still on the waiting list?"),
    ("I'm checking our chat. Can you remind me what you said?",
     "Lena is checking our chat. Can you remind Lena what you said?"),
    ("Have I ever told you I’ve moved?", "Has Lena ever told you Lena has moved?"),
    ("Is the blue one mine?", "Is the blue one Lena's?"),
    ("Which is option i in my list?", "Which is option i in Lena's list?"),  # lower-case i is not the speaker
    ("What did the Imam mean by that?", "What did the Imam mean by that?"),  # words containing I/me/my stay
])
def test_name_question_rewrites_the_first_person_and_nothing_else(question: str, named: str) -> None:
    assert name_question(question, "Lena") == named


def test_name_question_refuses_a_blank_name() -> None:
    with pytest.raises(ValueError, match="non-blank"):
        name_question("Where do I live?", " ")


def test_assign_names_is_seeded_per_question_and_respects_the_share() -> None:
    ids = [f"q{i}" for i in range(400)]
    half = assign_names(ids, 0.5, seed=0)
    assert 150 < len(half) < 250 and set(half.values()) <= set(FIRST_NAMES)
    assert assign_names(ids, 0.5, seed=0) == half
    assert {q: n for q, n in assign_names(ids[:50], 0.5, seed=0).items()} == {q: half[q] for q in ids[:50] if q in half}
    assert assign_names(ids, 0.5, seed=1) != half
    assert assign_names(ids, 0.0, seed=0) == {} and len(assign_names(ids, 1.0, seed=0)) == len(ids)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        assign_names(ids, 1.5, seed=0)


def test_a_name_already_in_the_question_is_never_drawn_for_it() -> None:
    ids = [f"q{i}" for i in range(50)]
    plain = assign_names(ids, 1.0, seed=0)
    asked = {qid: f"Where did {name} move to?" for qid, name in plain.items()}
    avoiding = assign_names(ids, 1.0, seed=0, questions=asked)
    assert all(avoiding[q] != plain[q] and avoiding[q] not in asked[q] for q in ids)
    unrelated = assign_names(ids, 1.0, seed=0, questions={q: "Where do I live?" for q in ids})
    assert unrelated == plain  # the draw only changes where a name is taken


def test_no_training_name_is_a_locomo_speaker() -> None:
    assert not set(FIRST_NAMES) & LOCOMO_SPEAKERS and len(set(FIRST_NAMES)) == len(FIRST_NAMES)


COMMUTE = [lme_turn("user", "My commute to the office takes 45 minutes by tram.", answer=True),
           lme_turn("assistant", "That is a long ride; podcasts can help pass the time."),
           lme_turn("user", "I also cycle on Fridays.")]
GARDEN = [lme_turn("user", "I planted tomatoes and basil on the balcony."),
          lme_turn("assistant", "Basil likes sun; water the tomatoes every morning.")]


@pytest.fixture
def two_questions(tmp_path: Path) -> Path:
    return write_items(tmp_path / "named.json", [
        lme_item("q1", "How long is my commute?", "single-session-user", [("s-commute", COMMUTE), ("s-garden", GARDEN)]),
        lme_item("q2", "How long is my commute?", "single-session-user", [("s-commute", COMMUTE)]),
    ])


def test_a_named_question_renders_its_user_turns_and_its_text_under_the_name(two_questions: Path) -> None:
    positives, corpora = longmemeval_positives(load_longmemeval(two_questions), user_names={"q1": "Oscar"})
    by_group = {p.group: p for p in positives}
    assert by_group["q1"].query == "How long is Oscar's commute?"
    assert by_group["q1"].passage == "Oscar: My commute to the office takes 45 minutes by tram."
    assert {rendered_speaker(t) for t in corpora["q1"]} == {"Oscar", "assistant"}
    assert by_group["q2"].query == "How long is my commute?"  # not named: as before
    assert {rendered_speaker(t) for t in corpora["q2"]} == {"user", "assistant"}
    config = MiningConfig(hard_negatives=1, random_negatives=1, use_dense=False, same_speaker=True)
    negatives = [e.passage for e in mine_examples(positives, config=config, corpora=corpora)
                 if e.label == 0.0 and e.query.startswith("How long is Oscar")]
    assert negatives and all(n in corpora["q1"] for n in negatives)
    assert rendered_speaker(negatives[0]) == "Oscar"  # same-speaker mining matches the name


def test_the_named_share_is_recorded_in_the_source(two_questions: Path) -> None:
    provenance: dict[str, object] = {}
    positives, _ = training_positives(None, None, None, None, provenance, longmemeval=[two_questions],
                                      named_user_share=1.0)
    (source,) = provenance["sources"]  # type: ignore[misc]
    assert source["named_user_share"] == 1.0 and source["named_user_questions"] == 2
    assert all("my commute" not in p.query for p in positives)


def test_cli_keeps_the_named_share_to_longmemeval(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"query": "q", "positive": "p"}\n', encoding="utf-8")
    result = CliRunner().invoke(reranker, ["train", "--pairs", str(pairs), "--named-user-share", "0.5",
                                           "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "--longmemeval only" in result.output
    result = CliRunner().invoke(reranker, ["train", "--pairs", str(pairs), "--named-user-share", "nan",
                                           "--out", str(tmp_path / "m")])
    assert result.exit_code == 2 and "got nan" in result.output
