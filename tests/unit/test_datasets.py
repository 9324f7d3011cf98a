"""bench.common.datasets: LoCoMo and LongMemEval loaders on small hand-written fixtures."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.common.datasets import (
    LOCOMO_CATEGORIES,
    LONGMEMEVAL_CATEGORIES,
    DatasetFormatError,
    load_locomo,
    load_longmemeval,
    longmemeval_category,
    parse_locomo_datetime,
    parse_longmemeval_datetime,
    repair_dia_ids,
)
from mnemos.rendering import render_turn

# The shared data folder lies beside the repository checkout, where the project's machines keep it.
REAL_LOCOMO = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "locomo" / "locomo10.json"

# Two sessions plus a dangling date key (like conv-26's), a captioned turn, and every kind of
# malformed evidence the LoCoMo README lists.
LOCOMO_FIXTURE = """
[
  {
    "sample_id": "conv-9",
    "conversation": {
      "speaker_a": "Ann",
      "speaker_b": "Bo",
      "session_1_date_time": "1:56 pm on 8 May, 2023",
      "session_1": [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat."},
        {"speaker": "Bo", "dia_id": "D1:2", "text": "Look at this!", "blip_caption": "a photo of a red kite",
         "img_url": ["http://example.invalid/x.jpg"], "query": "kite"}
      ],
      "session_2_date_time": "10:04 am on 19 December, 2023",
      "session_2": [
        {"speaker": "Ann", "dia_id": "D2:1", "text": "The cat is called Miso."},
        {"speaker": "Bo", "dia_id": "D2:2", "text": "Cute name."},
        {"speaker": "Ann", "dia_id": "D2:5", "text": "We moved to Oslo."}
      ],
      "session_3_date_time": "9:00 am on 1 January, 2024"
    },
    "qa": [
      {"question": "What pet did Ann adopt?", "answer": "a cat", "evidence": ["D1:1"], "category": 4},
      {"question": "Multi?", "answer": "x", "evidence": ["D1:1; D2:1"], "category": 1},
      {"question": "Spaces?", "answer": "x", "evidence": ["D2:1 D2:2  D1:2"], "category": 1},
      {"question": "Stray colon?", "answer": "x", "evidence": ["D:2:2"], "category": 2},
      {"question": "Leading zero?", "answer": "x", "evidence": ["D2:05"], "category": 2},
      {"question": "Bare D?", "answer": "x", "evidence": ["D"], "category": 3},
      {"question": "Missing turn?", "answer": "x", "evidence": ["D2:3", "D1:2"], "category": 4},
      {"question": "No evidence?", "answer": "x", "evidence": [], "category": 3},
      {"question": "Adversarial?", "adversarial_answer": "y", "evidence": ["D2:2"], "category": 5}
    ],
    "observation": {
      "session_1_observation": {
        "Ann": [["Ann adopted a cat.", "D1:1"]],
        "Bo": [["Bo likes kites.", "D1:2"], ["Bo says hi.", "D7:1"]]
      },
      "session_2_observation": {
        "Ann": [["The cat is Miso and Ann moved.", ["D2:1", "D2:5"]], ["Two ids in a string.", "D2:1, D2:2"]]
      }
    }
  }
]
"""

LONGMEMEVAL_FIXTURE = """
[
  {
    "question_id": "q1",
    "question_type": "single-session-user",
    "question": "Where did I park?",
    "answer": "Level 3",
    "question_date": "2023/05/30 (Tue) 23:40",
    "haystack_session_ids": ["sess_a", "answer_b"],
    "haystack_dates": ["2023/05/20 (Sat) 02:21", "2023/05/21 (Sun) 14:05"],
    "haystack_sessions": [
      [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}],
      [{"role": "user", "content": "I parked on level 3.", "has_answer": true},
       {"role": "assistant", "content": "Noted.", "has_answer": false}]
    ],
    "answer_session_ids": ["answer_b"]
  },
  {
    "question_id": "q2_abs",
    "question_type": "temporal-reasoning",
    "question": "When did I buy a boat?",
    "answer": "never mentioned",
    "question_date": "2023/06/01 (Thu) 08:00",
    "haystack_session_ids": ["sess_a"],
    "haystack_dates": ["2023/05/20 (Sat) 02:21"],
    "haystack_sessions": [[{"role": "user", "content": "hello"}]],
    "answer_session_ids": []
  }
]
"""


def _write(tmp_path: Path, text: str, name: str = "data.json") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture
def locomo(tmp_path):
    return load_locomo(_write(tmp_path, LOCOMO_FIXTURE))[0]


def test_locomo_turns_ids_sessions_and_times(locomo):
    assert locomo.conversation_id == "conv-9"
    assert [t.turn_id for t in locomo.turns] == ["D1:1", "D1:2", "D2:1", "D2:2", "D2:5"]
    assert [t.session_id for t in locomo.turns] == ["S1", "S1", "S2", "S2", "S2"]
    assert locomo.turns[0].role == "Ann"
    assert locomo.turns[0].occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert locomo.turns[2].occurred_at == datetime(2023, 12, 19, 10, 4, tzinfo=UTC)


def test_locomo_dangling_session_date_is_ignored(locomo):
    assert {t.session_id for t in locomo.turns} == {"S1", "S2"}


def test_locomo_caption_is_kept_apart_and_rendered(locomo):
    assert locomo.turns[1].text == "Look at this!"
    assert locomo.turns[1].image_caption == "a photo of a red kite"
    assert locomo.turns[0].image_caption is None
    turn = locomo.turns[1]
    assert render_turn(turn.role, turn.text, turn.image_caption) == "Bo: Look at this! [image: a photo of a red kite]"


def test_locomo_evidence_is_repaired(locomo):
    got = {q.text: q.relevant_turn_ids for q in locomo.questions}
    assert got["What pet did Ann adopt?"] == {"D1:1"}
    assert got["Multi?"] == {"D1:1", "D2:1"}
    assert got["Spaces?"] == {"D2:1", "D2:2", "D1:2"}
    assert got["Stray colon?"] == {"D2:2"}
    assert got["Leading zero?"] == {"D2:5"}
    assert got["Bare D?"] == frozenset()
    assert got["Missing turn?"] == {"D1:2"}
    assert got["No evidence?"] == frozenset()
    assert got["Adversarial?"] == {"D2:2"}


def test_locomo_question_ids_and_categories(locomo):
    assert [q.question_id for q in locomo.questions][:3] == ["conv-9:0", "conv-9:1", "conv-9:2"]
    assert [q.category for q in locomo.questions] == [4, 1, 1, 2, 2, 3, 4, 3, 5]
    assert all(q.conversation_id == "conv-9" and q.question_date is None for q in locomo.questions)


def test_locomo_observations_are_repaired_pairs(locomo):
    assert locomo.observations == (
        ("Ann adopted a cat.", "D1:1"),
        ("Bo likes kites.", "D1:2"),
        ("The cat is Miso and Ann moved.", "D2:1"),
        ("The cat is Miso and Ann moved.", "D2:5"),
        ("Two ids in a string.", "D2:1"),
        ("Two ids in a string.", "D2:2"),
    )


@pytest.mark.parametrize(
    ("raw", "valid", "expected"),
    [
        ("D8:6; D9:17", None, ("D8:6", "D9:17")),
        ("D9:1 D4:4 D4:6", None, ("D9:1", "D4:4", "D4:6")),
        ("D:11:26", None, ("D11:26",)),
        ("D30:05", None, ("D30:5",)),
        ("D", None, ()),
        (["D1:1", "D1:1", "D1:2"], None, ("D1:1", "D1:2")),
        (["D10:19", "D1:1"], {"D1:1"}, ("D1:1",)),
        ("D2:1, D2:2", {"D2:1", "D2:2"}, ("D2:1", "D2:2")),
        ("", None, ()),
    ],
)
def test_repair_dia_ids(raw, valid, expected):
    assert repair_dia_ids(raw, valid) == expected


def test_date_parsers():
    assert parse_locomo_datetime("12:09 am on 13 March, 2023") == datetime(2023, 3, 13, 0, 9, tzinfo=UTC)
    assert parse_longmemeval_datetime("2023/05/20 (Sat) 02:21") == datetime(2023, 5, 20, 2, 21, tzinfo=UTC)
    with pytest.raises(ValueError):
        parse_locomo_datetime("yesterday")
    with pytest.raises(ValueError):
        parse_longmemeval_datetime("2023-05-20")


def _locomo_variant(**changes) -> str:
    data = json.loads(LOCOMO_FIXTURE)
    for dotted, value in changes.items():
        target = data[0]
        *parents, leaf = dotted.split("__")
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is None:
            del target[leaf]
        else:
            target[leaf] = value
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[{", "line 1"),
        ('{"sample_id": "x"}', "top level"),
        (_locomo_variant(sample_id=None), "[0]"),
        (_locomo_variant(conversation__session_1_date_time="someday"), "session_1_date_time"),
        (_locomo_variant(conversation__session_2_date_time=None), "conv-9.conversation"),
        (_locomo_variant(qa=None), "conv-9"),
        (_locomo_variant(qa__0__evidence="D1:1"), "qa[0].evidence"),
        (_locomo_variant(qa__0__category="4"), "qa[0].category"),
        (_locomo_variant(conversation__session_2__1__dia_id="D2:1"), "session_2[1]"),
        (_locomo_variant(conversation__session_1__0__text=None), "session_1[0]"),
    ],
)
def test_locomo_malformed_files_raise_typed_errors(tmp_path, text, where):
    with pytest.raises(DatasetFormatError) as info:
        load_locomo(_write(tmp_path, text))
    assert where in str(info.value)
    assert isinstance(info.value, ValueError)


def test_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_locomo(tmp_path / "nope.json")
    with pytest.raises(FileNotFoundError):
        load_longmemeval(tmp_path / "nope.json")


def test_longmemeval_items_become_conversations(tmp_path):
    first, second = load_longmemeval(_write(tmp_path, LONGMEMEVAL_FIXTURE))
    assert first.conversation_id == "q1"
    assert [t.turn_id for t in first.turns] == ["sess_a:0", "sess_a:1", "answer_b:0", "answer_b:1"]
    assert [t.session_id for t in first.turns] == ["sess_a", "sess_a", "answer_b", "answer_b"]
    assert [t.role for t in first.turns] == ["user", "assistant", "user", "assistant"]
    assert first.turns[2].occurred_at == datetime(2023, 5, 21, 14, 5, tzinfo=UTC)
    (question,) = first.questions
    assert question.question_id == "q1" and question.conversation_id == "q1"
    assert question.relevant_turn_ids == {"answer_b:0"}
    assert question.question_date == datetime(2023, 5, 30, 23, 40, tzinfo=UTC)
    assert question.question_type == "single-session-user"
    assert (question.category, question.category_name) == (1, "single-session-user")
    assert second.questions[0].relevant_turn_ids == frozenset()
    # an abstention id is category 5 (kept out of the headline, as LoCoMo's adversarial), whatever its type
    assert (second.questions[0].category, second.questions[0].category_name) == (5, "abstention")
    assert first.shared_turn_ids and second.shared_turn_ids
    assert first.observations == ()


def test_longmemeval_categories_cover_every_type_and_keep_abstention_apart():
    for code, name in LONGMEMEVAL_CATEGORIES.items():
        if code != 5:
            assert longmemeval_category("x", name) == code
            assert longmemeval_category("x_abs", name) == 5
    assert longmemeval_category("x", "a-type-not-in-the-table") is None
    assert longmemeval_category("x", None) is None


def test_locomo_questions_are_named_by_their_category(tmp_path):
    (conversation,) = load_locomo(_write(tmp_path, _locomo_variant()))
    for question in conversation.questions:
        assert question.category_name == LOCOMO_CATEGORIES[question.category]
    assert not conversation.shared_turn_ids


@pytest.mark.parametrize("suffix", [".xz", ".gz"])
def test_longmemeval_compressed_files_load_like_plain_json(tmp_path, suffix):
    import gzip
    import lzma

    packed = (lzma if suffix == ".xz" else gzip).compress(LONGMEMEVAL_FIXTURE.encode("utf-8"))
    path = tmp_path / f"lme.json{suffix}"
    path.write_bytes(packed)
    plain = load_longmemeval(_write(tmp_path, LONGMEMEVAL_FIXTURE))
    assert load_longmemeval(path) == plain
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(DatasetFormatError, match="archive"):
        load_longmemeval(path)


def test_a_session_repeated_with_the_same_turns_is_read_once_at_its_first_date(tmp_path):
    data = json.loads(LONGMEMEVAL_FIXTURE)
    item = data[0]
    item["haystack_session_ids"].append(item["haystack_session_ids"][0])
    item["haystack_dates"].append("2024/01/01 (Mon) 09:00")
    item["haystack_sessions"].append(item["haystack_sessions"][0])
    first = load_longmemeval(_write(tmp_path, json.dumps(data)))[0]
    assert [t.turn_id for t in first.turns] == ["sess_a:0", "sess_a:1", "answer_b:0", "answer_b:1"]
    assert first.turns[0].occurred_at.year == 2023


def _lme_variant(**changes) -> str:
    data = json.loads(LONGMEMEVAL_FIXTURE)
    data[0].update(changes)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("not json", "invalid JSON"),
        ('{"a": 1}', "expected a list"),
        (_lme_variant(haystack_dates=["2023/05/20 (Sat) 02:21"]), "haystack lengths differ"),
        (_lme_variant(haystack_dates=["2023/05/20 (Sat) 02:21", "soon"]), "not a LongMemEval date"),
        (_lme_variant(haystack_session_ids=["same", "same"]), "duplicate turn id"),
        (_lme_variant(question=None), "expected str"),
        (_lme_variant(haystack_sessions=[[{"role": "user"}], []]), "missing key 'content'"),
        (_lme_variant(question_id="q2_abs"), "not unique"),
    ],
)
def test_longmemeval_malformed_files_raise_typed_errors(tmp_path, text, problem):
    with pytest.raises(DatasetFormatError, match=problem):
        load_longmemeval(_write(tmp_path, text))


@pytest.mark.skipif(not REAL_LOCOMO.exists(), reason="LoCoMo data file not on this machine")
def test_real_locomo_counts_match_the_data_readme():
    conversations = load_locomo(REAL_LOCOMO)
    questions = [q for c in conversations for q in c.questions]
    assert len(conversations) == 10
    assert sum(len(c.turns) for c in conversations) == 5882
    assert len(questions) == 1986
    assert sum(1 for q in questions if q.relevant_turn_ids) == 1982
    assert sorted(c.conversation_id for c in conversations)[:2] == ["conv-26", "conv-30"]
