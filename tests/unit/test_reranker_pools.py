"""``mnemos reranker pools``: BM25 pools reordered by a reranker, on a hand-written LongMemEval file."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from bench.common.datasets import load_longmemeval
from bench.training.pool_check import (
    check_pools,
    interpolated_order,
    markdown_table,
    select_questions,
)
from bench.training.pools_cli import pools
from mnemos.precision import Precision
from mnemos.rerank import FakeReranker
from tests.unit.longmemeval_items import lme_item, lme_turn, write_items
from workers.runtime.models import PROVENANCE_FILE

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima"]


def _session(evidence: int | None) -> list[dict[str, object]]:
    """Ten user turns then two assistant turns, all ``"cat <word>"``: for "Which cat?" every one has the
    same BM25 score, so BM25's order is the position order (ties by ascending id); plus a turn
    that does not match at all."""
    turns = [lme_turn("user" if i < 10 else "assistant", f"cat {word}", answer=i == evidence)
             for i, word in enumerate(WORDS)]
    return [*turns, lme_turn("user", "the weather is mild")]


def _item(qid: str, qtype: str, evidence: int | None) -> dict[str, object]:
    return lme_item(qid, "Which cat?", qtype, [(f"s-{qid}", _session(evidence))])


TINY = [
    _item("q-user", "single-session-user", evidence=0),  # evidence: BM25's first turn, a user's
    _item("q-asst", "single-session-assistant", evidence=10),  # evidence: the first assistant turn, BM25's 11th
    _item("q-none_abs", "single-session-user", evidence=0),  # abstention: skipped
    _item("q-empty", "multi-session", evidence=None),  # no evidence: skipped
]


def _prefers_assistant() -> FakeReranker:
    return FakeReranker(fn=lambda query, text: 1.0 if text.startswith("assistant: ") else 0.0)


@pytest.fixture
def tiny_file(tmp_path: Path) -> Path:
    return write_items(tmp_path / "longmemeval_tiny.json", TINY)


def test_held_out_filter_skips_trained_abstention_and_evidence_less(tiny_file: Path) -> None:
    conversations = load_longmemeval(tiny_file)
    held_out = select_questions(conversations, {"q-asst"})
    assert [q.question_id for _, q in held_out] == ["q-user"]
    on_training = select_questions(conversations, {"q-asst"}, on_training=True)
    assert [q.question_id for _, q in on_training] == ["q-asst"]
    assert [q.question_id for _, q in select_questions(conversations, set())] == ["q-user", "q-asst"]
    assert [q.question_id for _, q in select_questions(conversations, set(), limit=1)] == ["q-user"]
    with pytest.raises(ValueError, match="no trained-on question"):
        check_pools(conversations, _prefers_assistant(), trained={"q-none_abs"}, on_training=True)


def test_ndcg_recall_and_assistant_share_by_hand(tiny_file: Path) -> None:
    reranker = _prefers_assistant()
    check = check_pools(load_longmemeval(tiny_file), reranker, trained=set(), n_resamples=200)
    user, asst = check.rows
    # BM25: positions 0..11 in order (the weather turn shares no token). The reranker lifts the two
    # assistant turns (10, 11) to the top, stably: 10, 11, 0, 1, ..., 9.
    assert (user.pool, asst.pool) == (12, 12)
    assert user.bm25 == pytest.approx(1.0)  # evidence at rank 1
    assert user.rerank == pytest.approx(1 / math.log2(4))  # evidence at rank 3
    assert asst.bm25 == 0.0  # evidence at rank 11, out of the top 10
    assert asst.rerank == pytest.approx(1.0)
    # equal BM25 scores: z(bm25) is 0 everywhere, so the sum orders as the reranker does
    assert user.interp == pytest.approx(user.rerank) and asst.interp == pytest.approx(1.0)
    assert user.recall_pool == asst.recall_pool == 1.0
    assert user.assistant_bm25 == 0.0  # positions 0..9: users
    assert user.assistant_rerank == pytest.approx(0.2)  # two assistants among the first 10
    assert len(reranker.calls) == 2 and len(reranker.calls[0][1]) == 12  # one call per question, the pool
    assert reranker.calls[0][1][0] == "user: cat alpha"  # scored as the service renders turns
    overall = check.groups[0]
    assert (overall.name, overall.n) == ("all", 2)
    assert overall.metrics["bm25"].mean == pytest.approx(0.5)
    assert overall.metrics["rerank"].mean == pytest.approx((0.5 + 1.0) / 2)
    low, high = overall.metrics["rerank"].ci95
    assert low <= overall.metrics["rerank"].mean <= high
    assert [g.name for g in check.groups] == ["all", "single-session-assistant", "single-session-user"]
    assert check.rerank_vs_bm25.delta == pytest.approx(0.25) and check.rerank_vs_bm25.n == 2
    assert 0.0 <= check.rerank_vs_bm25.p_value <= 1.0
    table = markdown_table(check, 30)
    assert "| all | 2 | 0.500" in table and "rerank - bm25: +0.250" in table


def test_a_small_pool_misses_the_evidence(tiny_file: Path) -> None:
    check = check_pools(load_longmemeval(tiny_file), _prefers_assistant(), trained={"q-user"}, pool_size=5,
                        n_resamples=100)
    (row,) = check.rows
    assert row.question_id == "q-asst" and row.pool == 5
    assert (row.bm25, row.rerank, row.interp, row.recall_pool) == (0.0, 0.0, 0.0, 0.0)
    assert row.assistant_bm25 == row.assistant_rerank == 0.0


def test_interpolation_sums_z_scores_within_the_pool() -> None:
    # z(logits) = [-0.707, -0.707, 1.414], z(bm25) = [1.225, 0, -1.225]; sums [0.517, -0.707, 0.189]
    order = interpolated_order(np.array([0.0, 0.0, 5.0]), np.array([3.0, 2.0, 1.0]))
    assert order.tolist() == [0, 2, 1]


def test_cli_refuses_a_model_without_provenance(tmp_path: Path, tiny_file: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file)])
    assert result.exit_code == 2
    assert f"no {PROVENANCE_FILE} in the model directory" in result.output
    (model / PROVENANCE_FILE).write_text(json.dumps({"sources": []}), encoding="utf-8")
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file)])
    assert result.exit_code == 2 and "no training_conversations list" in result.output


class _FakeCrossEncoder(FakeReranker):
    """Stands in for :class:`mnemos.rerank.CrossEncoderReranker`: prefers assistant turns, loads nothing."""

    def __init__(self, model_name_or_path: object, max_length: int = 128, precision: str = "fp32",
                 windows: int = 1) -> None:
        super().__init__(fn=lambda query, text: 1.0 if text.startswith("assistant: ") else 0.0)
        self.precision = Precision(precision)
        self.model_version = f"fake|max_length={max_length}|windows={windows}"


def test_cli_writes_json_without_paths(tmp_path: Path, tiny_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "lme-fold-1"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    (model / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": ["q-user"]}), encoding="utf-8")
    monkeypatch.setattr("mnemos.rerank.CrossEncoderReranker", _FakeCrossEncoder)
    out, md = tmp_path / "pools.json", tmp_path / "pools.md"
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file), "--threads", "1",
                                        "--json", str(out), "--markdown", str(md)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text(encoding="utf-8"))
    assert report["arguments"]["model"] == "lme-fold-1"
    assert report["arguments"]["longmemeval"] == "longmemeval_tiny.json"
    assert report["model_digest"].startswith("lme-fold-1@")
    assert [row["question_id"] for row in report["rows"]] == ["q-asst"]
    assert report["rows"][0]["rerank"] == pytest.approx(1.0)
    assert str(tmp_path) not in out.read_text(encoding="utf-8")
    assert md.read_text(encoding="utf-8") in result.output


def test_every_question_trained_on_says_nothing_is_held_out(tiny_file: Path) -> None:
    conversations = load_longmemeval(tiny_file)
    with pytest.raises(ValueError, match="nothing is held out: all 2 questions"):
        check_pools(conversations, _prefers_assistant(), trained={"q-user", "q-asst", "q-none_abs", "q-empty"})
    with pytest.raises(ValueError, match="no trained-on question: none of the 2 questions"):
        check_pools(conversations, _prefers_assistant(), trained=set(), on_training=True)
    with pytest.raises(ValueError, match="^no question with evidence"):
        check_pools(conversations[2:], _prefers_assistant(), trained=set())  # abstention and evidence-less only


def test_cli_refuses_an_output_in_a_missing_directory_before_loading_the_model(
        tmp_path: Path, tiny_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": []}), encoding="utf-8")

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the model must not load")

    monkeypatch.setattr("mnemos.rerank.CrossEncoderReranker", no_model)
    for option in ("--json", "--markdown"):
        result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file),
                                            option, str(tmp_path / "missing" / "out")])
        assert result.exit_code == 2, result.output
        assert f"error: {option} " in result.output and "no directory" in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(("provenance", "message"), [
    ("{not json", "cannot read its mnemos_provenance.json (JSONDecodeError)"),
    ("[1, 2]", "no training_conversations list"),
    ('{"training_conversations": "q-user"}', "no training_conversations list"),
])
def test_cli_refuses_an_unreadable_provenance(tmp_path: Path, tiny_file: Path, provenance: str, message: str) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / PROVENANCE_FILE).write_text(provenance, encoding="utf-8")
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file)])
    assert result.exit_code == 2 and message in result.output


@pytest.mark.parametrize(("content", "message"), [
    ("{not json", "invalid JSON"),
    ("{}", "expected a list of items"),
    ("[]", "no question with evidence"),
])
def test_cli_refuses_unusable_data_in_one_line(tmp_path: Path, content: str, message: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": []}), encoding="utf-8")
    monkeypatch.setattr("mnemos.rerank.CrossEncoderReranker", _FakeCrossEncoder)
    data = tmp_path / "lme.json"
    data.write_text(content, encoding="utf-8")
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(data), "--threads", "1"])
    assert result.exit_code == 2 and message in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_cli_pool_of_one_and_a_limit_beyond_the_questions(tmp_path: Path, tiny_file: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    (model / PROVENANCE_FILE).write_text(json.dumps({"training_conversations": []}), encoding="utf-8")
    monkeypatch.setattr("mnemos.rerank.CrossEncoderReranker", _FakeCrossEncoder)
    out = tmp_path / "pools.json"
    result = CliRunner().invoke(pools, ["--model", str(model), "--longmemeval", str(tiny_file), "--threads", "1",
                                        "--pool-size", "1", "--limit", "99", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "nan" not in result.output.lower()
    rows = json.loads(out.read_text(encoding="utf-8"))["rows"]
    assert [(row["question_id"], row["pool"]) for row in rows] == [("q-user", 1), ("q-asst", 1)]
