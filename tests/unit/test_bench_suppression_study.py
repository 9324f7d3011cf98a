"""The dev-split suppression study: grid rows, eviction counts and the dev-only guarantee."""

from __future__ import annotations

import faiss

from bench.common.corpora import CorpusMode
from bench.quality.engine import Engine, FoldRerankers, RerankerFold, prepare_questions
from bench.quality.run import QualityOptions, run_quality
from bench.quality.suppression_study import study_markdown, suppression_study
from mnemos.encoder import HashingEncoder
from mnemos.pipeline import RetrievalConfig
from mnemos.rerank import CachedReranker, FakeReranker
from tests.unit.test_bench_synthetic import synthetic_conversations

faiss.omp_set_num_threads(1)


def _engine() -> Engine:
    folds = [RerankerFold("fold-a", "fake-a", frozenset({"conv-1"})), RerankerFold("fold-b", "fake-b", frozenset({"conv-2"}))]
    rerankers = FoldRerankers(folds, {f.name: CachedReranker(FakeReranker(), max_entries=None) for f in folds})
    convs = synthetic_conversations()
    return Engine(conversations=convs, questions=prepare_questions(convs), encoder=HashingEncoder(64),
                  rerankers=rerankers, modes=(CorpusMode.PER_TENANT,), burnin_factor=2.0)


def test_study_reports_every_setting_on_dev_questions_only() -> None:
    engine = _engine()
    grid = ((0.3, 0.0), (0.3, 1e9))
    study = suppression_study(engine, (CorpusMode.PER_TENANT,), grid, n_resamples=100)
    dev = [q for q in engine.questions if q.dev and q.labelled and q.category != 5]
    assert [(r["alpha"], r["tau"]) for r in study["grid"]] == list(grid)
    for row in study["grid"]:
        assert row["n"] == len(dev) > 0
        assert 0 <= row["questions_evicted"] <= row["n"] and 0 <= row["questions_admitted"] <= row["n"]
    off = study["grid"][1]  # a threshold no score reaches: suppression changes nothing
    assert off["delta"] == 0.0 and off["questions_evicted"] == off["questions_admitted"] == 0
    assert off["ndcg@10"] == off["hybrid_rerank"]
    on = study["grid"][0]
    assert on["hybrid_rerank"] == off["hybrid_rerank"]
    assert sum(v["n"] for v in study["categories"]["per_tenant alpha=0.3 tau=0"].values()) == len(dev)
    lines = study_markdown(study)
    assert any("| per_tenant | 0.3 | 1e+09 |" in line for line in lines)


def test_quality_report_carries_the_study_when_asked() -> None:
    folds = [RerankerFold("fold-a", "fake-a", frozenset({"conv-1"})), RerankerFold("fold-b", "fake-b", frozenset({"conv-2"}))]
    rerankers = FoldRerankers(folds, {f.name: CachedReranker(FakeReranker(), max_entries=None) for f in folds})
    options = QualityOptions(arms=("hybrid_rrf", "hybrid_rerank"), modes=(CorpusMode.PER_TENANT,), burnin_factor=2.0,
                             n_resamples=100, suppression_study=True)
    report = run_quality(synthetic_conversations(), encoder=HashingEncoder(64), rerankers=rerankers, options=options,
                         dataset={"name": "synthetic", "path": "-"})
    assert len(report.document["suppression_study"]["grid"]) == 4
    assert report.document["settings"]["suppression_threshold"] == RetrievalConfig().suppression_threshold == 0.5
    assert "Suppression study on the dev" in report.markdown
