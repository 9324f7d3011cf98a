"""``mnemos bench pair``: one arm of two quality runs paired per question, on hand-written files."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.common.datasets import load_longmemeval
from bench.common.questions import prepare_questions
from bench.quality.pair import PairError, check_same, markdown_table, pair, pair_runs
from tests.unit.longmemeval_items import lme_item, lme_turn, write_items

TYPES = ["single-session-user", "single-session-user", "multi-session", "multi-session", "single-session-user"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    items = [lme_item(f"q{i}", "Which cat?", qtype, [(f"s{i}", [lme_turn("user", "cat one", answer=True)])])
             for i, qtype in enumerate(TYPES)]
    items.append(lme_item("q9_abs", "Which dog?", "multi-session", [("s9", [lme_turn("user", "cat nine")])]))
    return write_items(tmp_path / "longmemeval_tiny.json", items)


@pytest.fixture
def questions(data: Path) -> dict:
    return {q.key: q for q in prepare_questions(load_longmemeval(data))}


def _values(questions: dict, by_id: dict[str, float]) -> dict[str, float]:
    return {key: by_id[q.conversation_id] for key, q in questions.items()}


CONTROL = {"q0": 0.5, "q1": 0.5, "q2": 0.2, "q3": 0.4, "q4": 0.0, "q9_abs": 0.0}
TREATMENT = {"q0": 1.0, "q1": 0.5, "q2": 0.3, "q3": 0.4, "q4": 0.3, "q9_abs": 1.0}


def test_the_headline_questions_pair_per_split_and_type(questions: dict) -> None:
    groups = {g.name: g for g in pair_runs(_values(questions, TREATMENT), _values(questions, CONTROL), questions,
                                           n_resamples=100)}
    everything = groups["all"]
    assert everything.n == 5  # the abstention question is out of the headline
    assert everything.treatment == pytest.approx(2.5 / 5)
    assert everything.control == pytest.approx(1.6 / 5)
    assert everything.comparison.delta == pytest.approx(0.9 / 5)
    assert groups["dev split"].n + groups["test split"].n == 5
    assert groups["multi-session"].n == 2
    assert groups["multi-session"].comparison.delta == pytest.approx(0.05)
    assert groups["single-session-user"].comparison.delta == pytest.approx(0.8 / 3)
    table = markdown_table(list(groups.values()), treatment="score|form", control="rank form")
    assert table.splitlines()[0] == "| questions | n | rank form | score\\|form | score\\|form − rank form [95% CI] | p |"
    assert table.splitlines()[2].startswith("| all | 5 | 0.320 | 0.500 | +0.180 [")


def test_runs_of_other_questions_or_data_are_refused(questions: dict) -> None:
    treatment = _values(questions, TREATMENT)
    fewer = dict(list(treatment.items())[1:])
    with pytest.raises(PairError, match=r"1 only in the treatment"):
        pair_runs(treatment, fewer, questions)
    foreign = {"conv-26:0": 1.0}
    with pytest.raises(PairError, match=r"1 keys are no question of the data \(e\.g\. \['conv-26:0'\]\)"):
        pair_runs(foreign, foreign, questions)


def test_a_same_run_that_differs_or_is_missing_is_refused() -> None:
    treatment = {"per_tenant/heldout/hybrid_rerank": {"a:0": [0.5, 1.0, 1.0], "a:1": [0.0, 0.0, 0.0]}}
    control = {"per_tenant/heldout/hybrid_rerank": {"a:0": [0.5, 1.0, 1.0], "a:1": [0.25, 0.0, 0.0]}}
    check_same(treatment, treatment, ["per_tenant/heldout/hybrid_rerank"])
    with pytest.raises(PairError, match="question a:1 has NDCG@10 0.0 in the treatment and 0.25 in the control"):
        check_same(treatment, control, ["per_tenant/heldout/hybrid_rerank"])
    with pytest.raises(PairError, match="treatment: no run pooled/heldout/bm25"):
        check_same(treatment, control, ["pooled/heldout/bm25"])


def _per_question(path: Path, questions: dict, runs: dict[str, dict[str, float]]) -> str:
    body = {"metrics": ["ndcg@10", "recall@10", "recall@30"],
            "runs": {run: {k: [v, 1.0, 1.0] for k, v in _values(questions, by_id).items()} for run, by_id in runs.items()}}
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        json.dump(body, handle)
    return str(path)


def test_cli_pairs_two_files_and_refuses_other_pools(tmp_path: Path, data: Path, questions: dict) -> None:
    run, same = "per_tenant/heldout/service_defaults", "per_tenant/heldout/hybrid_rerank"
    control = _per_question(tmp_path / "rank_pq.jsonl", questions, {run: CONTROL, same: CONTROL})
    treatment = _per_question(tmp_path / "score_pq.jsonl", questions, {run: TREATMENT, same: CONTROL})
    args = ["--data", str(data), "--format", "longmemeval", "--treatment", treatment, "--control", control,
            "--run", run, "--same", same]
    result = CliRunner().invoke(pair, args)
    assert result.exit_code == 0, result.output
    assert "identical in both: per_tenant/heldout/hybrid_rerank" in result.output
    assert "| all | 5 | 0.320 | 0.500 | +0.180 [" in result.output
    other = _per_question(tmp_path / "other_pq.jsonl", questions, {run: TREATMENT, same: TREATMENT})
    result = CliRunner().invoke(pair, [*args[:5], other, *args[6:]])
    assert result.exit_code == 2
    assert "did not rank the same pools" in result.output
    plain = tmp_path / "plain.json"
    plain.write_text("{}", encoding="utf-8")
    result = CliRunner().invoke(pair, [*args[:5], str(plain), *args[6:]])
    assert result.exit_code == 2
    assert "error: plain.json: not a --per-question file" in result.output


def test_cli_appends_the_heading_and_table_to_the_markdown(tmp_path: Path, data: Path, questions: dict) -> None:
    run = "per_tenant/heldout/service_defaults"
    control = _per_question(tmp_path / "rank_pq.jsonl", questions, {run: CONTROL})
    treatment = _per_question(tmp_path / "score_pq.jsonl", questions, {run: TREATMENT})
    out = tmp_path / "pair.md"
    out.write_text("# earlier\n", encoding="utf-8")
    args = ["--data", str(data), "--format", "longmemeval", "--treatment", treatment, "--control", control,
            "--run", run, "--treatment-label", "score|form", "--markdown", str(out)]
    result = CliRunner().invoke(pair, args)
    assert result.exit_code == 0, result.output
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# earlier\n\nper_tenant/heldout/service_defaults of score_pq.jsonl against")
    assert "| score\\|form − control [95% CI] | p |" in text
    assert "| all | 5 | 0.320 | 0.500 | +0.180 [" in text
    missing = tmp_path / "nowhere" / "pair.md"
    result = CliRunner().invoke(pair, [*args[:-1], str(missing)])
    assert result.exit_code == 2
    assert f"no directory {missing.parent}" in result.output
    assert not missing.parent.exists()
