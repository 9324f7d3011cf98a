"""``mnemos reranker pools-compare``: two rerankers' pools reports paired per question, on hand-written reports."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bench.training.pools_compare import (
    PoolsCompareError,
    compare_pools,
    load_side,
    markdown_table,
    pools_compare,
)


def _row(qid: str, qtype: str, bm25: float, rerank: float, interp: float) -> dict[str, object]:
    return {"question_id": qid, "question_type": qtype, "pool": 30, "bm25": bm25, "rerank": rerank,
            "interp": interp, "recall_pool": 1.0, "assistant_bm25": 0.0, "assistant_rerank": 0.0}


def _report(rows: list[dict[str, object]], *, data: str = "longmemeval_s.json.xz", pool: int = 30,
            chitchat: int | None = None) -> dict[str, object]:
    arguments: dict[str, object] = {"longmemeval": data, "pool_size": pool}
    if chitchat is not None:  # reports written before --chitchat have no such argument
        arguments["chitchat"] = chitchat
    return {"command": "mnemos reranker pools", "arguments": arguments, "rows": rows}


# Treatment: one report per fold (q1, q2 | q3). Control: a single report of the same three questions.
FOLD_1 = _report([_row("q1", "a-type", 0.2, 1.0, 0.9), _row("q2", "a-type", 0.4, 0.8, 0.7)])
FOLD_2 = _report([_row("q3", "b-type", 0.6, 0.3, 0.6)])
CONTROL = _report([_row("q1", "a-type", 0.2, 0.5, 0.5), _row("q2", "a-type", 0.4, 0.5, 0.5),
                   _row("q3", "b-type", 0.6, 0.6, 0.6)])


def test_two_fold_reports_join_and_pair_per_question_and_type() -> None:
    treatment, source = load_side([("fold1.json", FOLD_1), ("fold2.json", FOLD_2)])
    control, _ = load_side([("control.json", CONTROL)])
    assert sorted(treatment) == ["q1", "q2", "q3"]
    assert source == {"longmemeval": "longmemeval_s.json.xz", "pool_size": 30, "chitchat": 0}
    groups = {g.name: g for g in compare_pools(treatment, control, order="rerank")}
    assert list(groups) == ["all", "a-type", "b-type"]
    everything = groups["all"]
    assert everything.n == 3
    assert everything.bm25 == pytest.approx(0.4)
    assert everything.treatment == pytest.approx(0.7)
    assert everything.control == pytest.approx(1.6 / 3)
    assert everything.vs_control.delta == pytest.approx(0.5 / 3)  # (0.5 + 0.3 - 0.3) / 3
    assert everything.control_vs_bm25.delta == pytest.approx(0.4 / 3)
    assert everything.vs_bm25.delta == pytest.approx(0.3)
    a_type = groups["a-type"]
    assert (a_type.n, a_type.vs_control.delta) == (2, pytest.approx(0.4))
    # Differences 0.5 and 0.3: of the four sign patterns, two are as extreme as the observed mean.
    assert a_type.vs_control.p_value == pytest.approx(0.5)
    assert groups["b-type"].vs_control.p_value == 1.0  # a single pair cannot be told from chance


def test_the_interp_order_reads_the_interp_column() -> None:
    treatment, _ = load_side([("fold1.json", FOLD_1), ("fold2.json", FOLD_2)])
    control, _ = load_side([("control.json", CONTROL)])
    everything = compare_pools(treatment, control, order="interp")[0]
    assert everything.treatment == pytest.approx(2.2 / 3)
    with pytest.raises(ValueError, match="order must be one of"):
        compare_pools(treatment, control, order="bm25")


def test_a_question_in_two_reports_of_one_side_is_refused() -> None:
    with pytest.raises(PoolsCompareError, match="q3 is already in another report"):
        load_side([("fold2.json", FOLD_2), ("fold2.json", FOLD_2)])


@pytest.mark.parametrize("other", [_report(FOLD_2["rows"], data="longmemeval_m.json"), _report(FOLD_2["rows"], pool=20),
                                   _report(FOLD_2["rows"], chitchat=5)])
def test_reports_of_other_data_pool_sizes_or_chitchat_are_refused(other: dict[str, object]) -> None:
    with pytest.raises(PoolsCompareError, match="where the other reports have"):
        load_side([("fold1.json", FOLD_1), ("other.json", other)])


def test_a_report_from_before_chitchat_pairs_with_one_without_chitchat() -> None:
    _, source = load_side([("fold1.json", FOLD_1), ("fold2.json", _report(FOLD_2["rows"], chitchat=0))])
    assert source["chitchat"] == 0


@pytest.mark.parametrize("report", [{"command": "mnemos bench quality", "rows": []}, [1, 2],
                                    _report([]), _report([{"question_id": "q1"}])])
def test_what_is_not_a_pools_report_is_refused(report: object) -> None:
    with pytest.raises(PoolsCompareError, match=r"odd\.json: "):
        load_side([("odd.json", report)])


@pytest.mark.parametrize(("field", "value", "message"), [
    ("rerank", "0.5", "rerank is '0.5', not an NDCG@10"), ("bm25", None, "bm25 is None"),
    ("interp", True, "interp is True"), ("rerank", 1.5, "rerank is 1.5"), ("bm25", float("nan"), "bm25 is nan"),
    ("question_type", None, "must be non-empty strings"), ("question_type", "all", "must be non-empty strings"),
    ("question_id", "", "must be non-empty strings"),
])
def test_rows_with_values_that_are_no_ndcg_or_no_name_are_refused(field: str, value: object, message: str) -> None:
    row = _row("q1", "a-type", 0.2, 1.0, 0.9)
    row[field] = value
    with pytest.raises(PoolsCompareError, match=rf"^odd\.json: question .*{message}"):
        load_side([("odd.json", _report([row]))])


def test_a_check_of_fit_is_refused() -> None:
    fit = _report(FOLD_1["rows"])
    fit["arguments"]["on_training"] = True
    with pytest.raises(PoolsCompareError, match="a check of fit"):
        load_side([("fit.json", fit)])


def test_sides_with_other_questions_or_other_pools_are_refused() -> None:
    treatment, _ = load_side([("fold1.json", FOLD_1)])
    control, _ = load_side([("control.json", CONTROL)])
    with pytest.raises(PoolsCompareError, match=r"0 only in the treatment .*1 only in the control \(e\.g\. \['q3'\]\)"):
        compare_pools(treatment, control)
    shifted, _ = load_side([("control.json", _report([_row("q1", "a-type", 0.25, 0.5, 0.5),
                                                     _row("q2", "a-type", 0.4, 0.5, 0.5)]))])
    with pytest.raises(PoolsCompareError, match="question q1: BM25's NDCG@10 is 0.2 in the treatment and 0.25"):
        compare_pools(treatment, shifted)
    retyped, _ = load_side([("control.json", _report([_row("q1", "b-type", 0.2, 0.5, 0.5),
                                                     _row("q2", "a-type", 0.4, 0.5, 0.5)]))])
    with pytest.raises(PoolsCompareError, match="question q1: type a-type in the treatment and b-type in the control"):
        compare_pools(treatment, retyped)


def test_the_table_names_both_sides_and_formats_small_p() -> None:
    treatment, _ = load_side([("fold1.json", FOLD_1), ("fold2.json", FOLD_2)])
    control, _ = load_side([("control.json", CONTROL)])
    table = markdown_table(compare_pools(treatment, control), treatment="new", control="old", order="rerank")
    lines = table.splitlines()
    assert lines[0] == "## new vs old, rerank order"
    assert "| new − old [95% CI] | p | old − bm25 | p | new − bm25 | p |" in lines[2]
    assert lines[4].startswith("| all | 3 | 0.400 | 0.533 | 0.700 | +0.167 [")
    piped = markdown_table(compare_pools(treatment, control), treatment="a|b", control="old", order="rerank")
    assert all(line.count("|") - line.count("\\|") == 12 for line in piped.splitlines()[2:])
    assert lines[6] == "| b-type | 1 | 0.600 | 0.600 | 0.300 | -0.300 [-0.300, -0.300] | 1.000 | +0.000 | 1.000 | -0.300 | 1.000 |"


def _write(tmp_path: Path, name: str, report: object) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(report), encoding="utf-8")
    return str(path)


def test_cli_appends_both_orders_to_the_markdown(tmp_path: Path) -> None:
    out = tmp_path / "crossfit.md"
    out.write_text("# Heading\n", encoding="utf-8")
    args = ["--treatment", _write(tmp_path, "fold1.json", FOLD_1), "--treatment", _write(tmp_path, "fold2.json", FOLD_2),
            "--control", _write(tmp_path, "control.json", CONTROL), "--treatment-label", "new", "--markdown", str(out)]
    result = CliRunner().invoke(pools_compare, args)
    assert result.exit_code == 0, result.output
    assert "3 questions of longmemeval_s.json.xz, BM25 top-30 pools; treatment fold1.json, fold2.json" in result.output
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Heading\n\n## new vs control, rerank order\n")
    assert "\n## new vs control, interp order (z(logit) + z(BM25 score))\n" in text
    assert str(tmp_path) not in text


def test_cli_keeps_two_reports_of_one_name_from_two_directories_apart(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = ["--treatment", _write(tmp_path / "a", "pools.json", FOLD_1), "--treatment", _write(tmp_path / "b", "pools.json", FOLD_2),
            "--control", _write(tmp_path, "control.json", CONTROL), "--order", "rerank"]
    result = CliRunner().invoke(pools_compare, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("3 questions of")
    same_twice = ["--treatment", args[1], "--treatment", args[1], "--control", args[5]]
    result = CliRunner().invoke(pools_compare, same_twice)
    assert result.exit_code == 2
    assert "is already in another report of the same side" in result.output


def test_cli_exits_2_with_the_reason_when_the_sides_do_not_pair(tmp_path: Path) -> None:
    out = tmp_path / "crossfit.md"
    args = ["--treatment", _write(tmp_path, "fold1.json", FOLD_1), "--control", _write(tmp_path, "control.json", CONTROL),
            "--markdown", str(out)]
    result = CliRunner().invoke(pools_compare, args)
    assert result.exit_code == 2
    assert "error: the sides hold different questions" in result.output
    assert not out.exists()
    broken = tmp_path / "broken.json"
    broken.write_text("{", encoding="utf-8")
    result = CliRunner().invoke(pools_compare, ["--treatment", str(broken), "--control", str(broken)])
    assert result.exit_code == 2
    assert "error: broken.json: unreadable (JSONDecodeError" in result.output
