"""bench/packets/run.py on the synthetic data (hashing encoder, fake reranker, word counts): the document's
shape, budgets never exceeded, the knowledge-update part and the written files."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from bench.common.datasets import Conversation, Question, Turn
from bench.packets.run import PacketBenchOptions, run_packets_bench, topk_within_budget, write_outputs
from mnemos.encoder import HashingEncoder
from mnemos.packets import Candidate, Qualifiers, whitespace_tokens
from mnemos.rerank import FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations

T0 = datetime(2023, 1, 1, tzinfo=UTC)


def _update_item() -> Conversation:
    """A LongMemEval-like item: the user's gym changes; the question asks for the current one."""
    turns = [Turn("a:0", "a", "user", "I go to the Riverside gym every morning", T0),
             Turn("a:1", "a", "assistant", "Riverside gym sounds nice", T0),
             Turn("b:0", "b", "user", "I bake bread on weekends", T0 + timedelta(days=5)),
             Turn("c:0", "c", "user", "I switched to the Hilltop gym now", T0 + timedelta(days=9)),
             Turn("c:1", "c", "assistant", "Hilltop gym is close to you", T0 + timedelta(days=9))]
    question = Question("ku-1", "ku-1", "Which gym do I go to?", frozenset({"a:0", "c:0"}), None,
                        T0 + timedelta(days=10), question_type="knowledge-update")
    return Conversation("ku-1", tuple(turns), (question,))


def test_topk_within_budget_skips_what_does_not_fit() -> None:
    q = Qualifiers("s", "user", T0)
    pool = [Candidate(1, "t1", "x", 3.0, 30, q), Candidate(2, "t2", "y", 2.0, 80, q), Candidate(3, "t3", "z", 1.0, 20, q)]
    assert topk_within_budget(pool, 60) == [1, 3]
    assert topk_within_budget(pool, 60, flat_tokens=(30, 20, 40)) == [1, 2]


def test_topk_grouped_pays_a_session_header_once() -> None:
    """Priced like a packet, a second item of a session costs its line only; a flat list pays the
    qualifiers on every line, so it fits fewer items in the same budget."""
    q, r = Qualifiers("s", "user", T0), Qualifiers("r", "user", T0)
    pool = [Candidate(1, "t1", "x", 3.0, 10, q, "[session s]", 5), Candidate(2, "t2", "y", 2.0, 10, q, "[session s]", 5),
            Candidate(3, "t3", "z", 1.0, 10, r, "[session r]", 5)]
    assert topk_within_budget(pool, 25) == [1, 2]  # 5 + 10 + 10
    assert topk_within_budget(pool, 25, flat_tokens=(15, 15, 15)) == [1]


def test_the_bench_runs_on_synthetic_data_and_writes_its_files(tmp_path: Path) -> None:
    options = PacketBenchOptions(budgets=(20, 60), resamples=200)
    document = run_packets_bench(synthetic_conversations(), [_update_item()], HashingEncoder(dim=64),
                                 lambda conversation_id: FakeReranker(), whitespace_tokens, options)
    recall = document["locomo_evidence_recall"]
    assert set(recall) == {"20", "60"}
    for row in recall.values():
        for arm in ("packet", "topk", "topk_grouped", "difference", "difference_vs_grouped"):
            lo, hi = row[arm]["ci95"]
            assert lo <= row[arm]["mean"] <= hi
        assert 0.0 <= row["packet"]["mean"] <= 1.0 and row["packet"]["n"] == 88
    assert recall["60"]["packet"]["mean"] >= recall["20"]["packet"]["mean"] - 1e-9
    updates = document["longmemeval_knowledge_update"]
    assert updates["60"]["packet_newest"]["n"] == 1
    assert updates["60"]["packet_newest"]["mean"] in (0.0, 1.0)
    paths = write_outputs(document, tmp_path)
    assert [p.name for p in paths] == ["packets.json", "packets.md", "packets.png"]
    assert json.loads(paths[0].read_text())["benchmark"] == "packets"
    assert "| 60 |" in paths[1].read_text()


def test_either_data_set_may_be_missing(tmp_path: Path) -> None:
    document = run_packets_bench([], [_update_item()], HashingEncoder(dim=64), lambda c: FakeReranker(),
                                 whitespace_tokens, PacketBenchOptions(budgets=(30,), resamples=100))
    assert document["locomo_evidence_recall"] == {}
    assert [p.name for p in write_outputs(document, tmp_path)] == ["packets.json", "packets.md"]


def test_the_command_is_registered() -> None:
    pytest.importorskip("matplotlib")
    from bench.commands import bench

    assert "packets" in bench.commands


def test_the_knob_study_chooses_on_the_dev_half_only() -> None:
    """Every grid point is measured on both halves; the choice maximises the dev mean over budgets,
    whatever the test half says; no questions, no study."""
    from bench.packets.knobs import KNOB_GRID, StudyQuestion, knob_study
    from bench.packets.selection import RankedPool
    from mnemos.packets import PacketConfig

    long_hit = Candidate(1, "t1", "hit", 3.0, 60, Qualifiers("s1", "user", T0))
    misses = [Candidate(i, f"t{i}", "miss", 2.0, 20, Qualifiers(f"s{i}", "user", T0)) for i in (2, 3, 4)]
    pool = RankedPool([long_hit, *misses], np.eye(4, 8), PacketConfig(), (60, 20, 20, 20))
    dev = StudyQuestion(True, frozenset({1}), pool)
    test = StudyQuestion(False, frozenset({2}), pool)
    study = knob_study([dev, test], (100,), PacketConfig())
    assert len(study["grid"]) == int(np.prod([len(v) for v in KNOB_GRID.values()]))
    assert (study["n_dev"], study["n_test"]) == (1, 1)
    best = max(row["dev_mean"] for row in study["grid"])
    chosen = next(row for row in study["grid"] if row["knobs"] == study["chosen"])
    assert chosen["dev_mean"] == best
    # value per token fills 100 tokens with the short misses first; value alone keeps the long hit
    by_exponent = {row["knobs"]["token_exponent"]: row["dev"]["100"] for row in study["grid"]
                   if row["knobs"]["mmr_lambda"] == 1.0 and row["knobs"]["session_share"] == 0.75}
    assert by_exponent[0.0] == 0.0 and by_exponent[1.0] == -1.0
    assert study["chosen"]["token_exponent"] != 1.0
    assert knob_study([], (100,), PacketConfig()) == {}
