"""The rerank sweep reads reranker variants (quality and time) out of a bench quality document."""

from __future__ import annotations

import json
from pathlib import Path

from bench.speed.report import rerank_sweep, speed_markdown, write_speed_report


def _block(name: str, *, layers: int | None, ms: float | None, ndcg: float, delta: float,
           learning_rate: float | None = None, precision: str | None = None) -> dict:
    block = {"name": name, "description": name, "modes": {"per_tenant": {
        "hybrid_rrf": {"ndcg@10": 0.4},
        "hybrid_rerank": {"ndcg@10": ndcg, "vs_main": {"n": 10, "delta": delta, "ci95": [delta - 0.01, delta + 0.01],
                                                       "p": 0.5}},
        "mnemos_full": {"ndcg@10": ndcg + 0.01}}}}
    if layers is not None:
        block["reranker"] = {"layers": layers, "max_length": 64, "epochs": 3.0, "max_pairs": None}
        if learning_rate is not None:
            block["reranker"]["learning_rate"] = learning_rate
        if precision is not None:
            block["reranker"]["precision"] = precision
    if ms is not None:
        block["rerank_time"] = {"p50_ms": ms, "p95_ms": 2 * ms, "pools": 100}
    return block


DOCUMENT = {"dataset": {"path": "locomo10.json"}, "variants": [
    _block("dedupe_guard_off", layers=None, ms=None, ndcg=0.5, delta=0.0),
    _block("main_reranker", layers=6, ms=300.0, ndcg=0.54, delta=0.0),
    _block("l3", layers=3, ms=150.0, ndcg=0.52, delta=-0.02, learning_rate=2e-4, precision="bf16"),
    _block("untimed", layers=2, ms=None, ndcg=0.5, delta=-0.04),
]}


def test_only_timed_reranker_variants_become_rows_with_their_quality() -> None:
    rows = rerank_sweep(DOCUMENT)
    assert [row["name"] for row in rows] == ["main_reranker", "l3"]
    l3 = rows[1]
    assert (l3["layers"], l3["max_length"], l3["p50_ms"], l3["dataset"]) == (3, 64, 150.0, "locomo10.json")
    assert l3["modes"]["per_tenant"]["hybrid_rerank"]["delta"] == -0.02
    assert l3["modes"]["per_tenant"]["mnemos_full"]["ndcg@10"] == 0.53
    assert l3["modes"]["per_tenant"]["mnemos_full"]["delta"] is None


def test_markdown_has_one_line_per_row_with_time_and_delta() -> None:
    text = speed_markdown({"command": "mnemos bench speed", "query_p50_s": 0.2}, rerank_sweep(DOCUMENT))
    assert "## rerank_sweep" in text
    line = next(x for x in text.splitlines() if x.startswith("| – | locomo10.json | l3 |"))
    assert "0.520 (-0.020 [-0.030, -0.010])" in line and "150 (300)" in line and "| 0.0002 |" in line
    assert "| 64 | bf16 | 3.0 |" in line
    main = next(x for x in text.splitlines() if x.startswith("| – | locomo10.json | main_reranker |"))
    assert "| all | – |" in main  # a run that did not record the learning rate
    assert "| 64 | fp32 | 3.0 |" in main  # nor the precision: such runs computed in fp32
    assert "| query_p50_s | 0.200 |" in text
    stated = speed_markdown({"settings": {"rerank_precision": "bf16"}}, [])
    assert "computing in bf16" in stated and "computing in fp32" in speed_markdown({}, [])


def test_report_updates_the_speed_json_in_place(tmp_path: Path) -> None:
    speed, quality, md = tmp_path / "speed.json", tmp_path / "locomo.json", tmp_path / "speed.md"
    speed.write_text(json.dumps({"query_p50_s": 0.3}))
    quality.write_text(json.dumps(DOCUMENT))
    rows = write_speed_report(speed, [quality], md)
    stored = json.loads(speed.read_text())
    assert stored["query_p50_s"] == 0.3 and stored["rerank_sweep"] == rows and len(rows) == 2
    assert [row["run"] for row in rows] == ["locomo.json", "locomo.json"]  # which run each row is from
    assert md.read_text().count("| locomo.json | locomo10.json |") == 2


def test_reranker_details_come_from_the_first_folds_provenance() -> None:
    from bench.common.folds import FoldRerankers, RerankerFold
    from bench.quality.variants import reranker_details

    folds = [RerankerFold("a", "a", frozenset({"conv-1"}), "id-a", {"layers": 3, "epochs": 1.0, "max_pairs": 10000,
                                                                    "train_config": {"learning_rate": 2e-4}}),
             RerankerFold("b", "b", frozenset({"conv-2"}), "id-b", {"layers": 6})]
    router = FoldRerankers(folds, {"a": object(), "b": object()})
    assert reranker_details(router, 64, "fp32") == {"layers": 3, "max_length": 64, "precision": "fp32", "epochs": 1.0,
                                                    "max_pairs": 10000, "learning_rate": 2e-4}
    assert reranker_details(router, 64, "bf16")["precision"] == "bf16"
    assert reranker_details(None, 64) is None
    unlabelled = FoldRerankers([RerankerFold("c", "c", frozenset({"conv-1"}))], {"c": object()})
    assert reranker_details(unlabelled, 128)["layers"] == 6


def test_reranker_specs_name_dirs_max_length_and_precision() -> None:
    import pytest

    from bench.quality.variants import parse_reranker_spec

    def parse(spec: str) -> tuple:
        return parse_reranker_spec(spec, max_length=128, precision="auto")

    assert parse("l6=models/a,models/b") == ("l6", ["models/a", "models/b"], 128, "auto")
    assert parse("short=models/a@64") == ("short", ["models/a"], 64, "auto")
    assert parse("l6_fp32=models/a,models/b:fp32") == ("l6_fp32", ["models/a", "models/b"], 128, "fp32")
    assert parse("both=../models/a@64:bf16") == ("both", ["../models/a"], 64, "bf16")
    for bad in ("nodirs", "=models/a", "x=models/a:int8", "x=models/a@long"):
        with pytest.raises(ValueError):
            parse(bad)
