"""The ``hybrid_convex`` arm: its weight is chosen on dev questions only, it runs without rerankers,
and the report compares it with ``hybrid_rrf`` on the test split (bench/quality/fusion_choice.py)."""

from __future__ import annotations

import json

import faiss
import numpy as np
import pytest

from bench.common.corpora import CorpusMode
from bench.common.questions import overall_question
from bench.quality.engine import Engine, Protocol, prepare_questions
from bench.quality.fusion_choice import CONVEX_GRID, choose_convex_weight, convex_arm
from bench.quality.run import QualityOptions, run_quality
from mnemos.encoder import HashingEncoder
from mnemos.fusion import Fusion
from tests.unit.test_bench_synthetic import synthetic_conversations

faiss.omp_set_num_threads(1)
MODES = (CorpusMode.PER_TENANT, CorpusMode.POOLED)


def _engine() -> Engine:
    convs = synthetic_conversations()
    return Engine(conversations=convs, questions=prepare_questions(convs), encoder=HashingEncoder(64),
                  rerankers=None, modes=MODES)


def test_convex_arm_carries_its_weight_in_its_name_and_config() -> None:
    arm = convex_arm(0.3)
    assert arm.name == "hybrid_convex(w=0.3)" and arm.config.fusion is Fusion.CONVEX
    assert arm.config.convex_weight == 0.3 and not arm.reranks and arm.suppression is None


def test_the_weight_is_the_best_mean_over_modes_on_dev_questions_only() -> None:
    engine = _engine()
    read: set[str] = set()
    evaluate = engine.evaluate

    def recording(mode, results, **kwargs):
        read.update(kwargs["keys"])
        return evaluate(mode, results, **kwargs)

    engine.evaluate = recording  # type: ignore[method-assign]
    choice = choose_convex_weight(engine, MODES)
    dev = {q.key for q in engine.questions if q.dev and q.labelled and overall_question(q.category)}
    assert read == dev and choice.dev_questions == len(dev)
    assert [row["weight"] for row in choice.grid] == list(CONVEX_GRID)
    means = [row["mean"] for row in choice.grid]
    assert choice.weight == CONVEX_GRID[int(np.argmax(means))]  # the first (smallest) weight on a tie
    for row in choice.grid:
        assert row["mean"] == pytest.approx(np.mean(list(row["dev_ndcg@10"].values())))
    assert choice.arm.config.convex_weight == choice.weight


def test_grid_and_modes_must_not_be_empty() -> None:
    with pytest.raises(ValueError):
        choose_convex_weight(_engine(), MODES, grid=())


@pytest.fixture(scope="module")
def report():
    options = QualityOptions(arms=("bm25", "dense", "hybrid_rrf", "hybrid_convex"), protocols=(Protocol.HELDOUT,),
                             n_resamples=200)
    return run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=None, options=options,
                       dataset={"name": "synthetic", "path": "-"})


def test_first_stage_arms_run_without_rerankers_and_report_the_choice(report) -> None:
    doc = json.loads(json.dumps(report.document))
    fusion = doc["fusion"]
    assert fusion["arm"] == "hybrid_convex" and fusion["weight"] in CONVEX_GRID
    assert len(fusion["grid"]) == len(CONVEX_GRID) and fusion["dev_questions"] > 0
    assert [item["corpus"] for item in fusion["test_split"]] == ["per_tenant", "pooled"]
    questions = prepare_questions(synthetic_conversations())
    test = [q for q in questions if not q.dev and q.labelled and overall_question(q.category)]
    for item in fusion["test_split"]:
        assert item["n"] == len(test)
        for metric in ("ndcg@10", "recall@10", "recall@30"):
            compared = item[metric]
            convex, rrf = compared["hybrid_convex"]["mean"], compared["hybrid_rrf"]["mean"]
            assert compared["delta"] == pytest.approx(convex - rrf) and 0.0 <= compared["p"] <= 1.0
            lo, hi = compared["hybrid_convex"]["ci95"]
            assert lo <= convex <= hi
    runs = {(r["corpus"], r["arm"]) for r in doc["runs"]}
    assert {("per_tenant", "hybrid_convex"), ("pooled", "hybrid_convex")} <= runs
    assert doc["cost"]["reranker_pairs"] == 0
    assert "`hybrid_convex` = BM25 and dense scores min-max normalised" in report.markdown
    assert "Test split (per_tenant" in report.markdown and "| hybrid_convex |" in report.markdown
    assert "| recall@30 |" in report.markdown


def test_the_convex_row_is_the_run_at_the_chosen_weight(report) -> None:
    weight = report.document["fusion"]["weight"]
    engine = _engine()
    for mode in MODES:
        metrics = engine.evaluate(mode, engine.run_plain(mode, convex_arm(weight)), reranked=False)
        keys = [k for k, m in metrics.items() if overall_question(engine.question(k).category)]
        row = next(r for r in report.document["runs"] if r["corpus"] == mode.value and r["arm"] == "hybrid_convex")
        assert row["ndcg@10"] == pytest.approx(np.mean([metrics[k].ndcg10 for k in keys]))
