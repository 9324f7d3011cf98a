"""The published figures of the method's source appear beside the run's own for LongMemEval-S only."""

from bench.quality.markdown import quality_header
from bench.quality.published import published_for, published_lines, reranker_sources


def _run(protocol: str, arm: str, ndcg: float, recall30: float, corpus: str = "pooled") -> dict:
    return {"corpus": corpus, "protocol": protocol, "arm": arm, "ndcg@10": ndcg, "recall@30": recall30}


def test_published_rows_only_for_longmemeval_s() -> None:
    assert published_for({"format": "longmemeval", "path": "longmemeval_s_498.json.xz"})
    assert published_for({"format": "longmemeval", "path": "longmemeval_oracle.json.xz"}) == ()
    assert published_for({"format": "locomo", "path": "locomo10.json"}) == ()


def test_published_lines_put_the_pooled_runs_beside_the_paper() -> None:
    document = {
        "dataset": {"format": "longmemeval", "path": "longmemeval_s_498.json.xz"},
        "runs": [_run("transductive", "+clustered_rif_gap", 0.41234, 0.55),
                 _run("heldout", "+clustered_rif_gap", 0.40111, 0.54),
                 _run("transductive", "hybrid_rerank", 0.4, 0.5, corpus="per_tenant")],
    }
    lines = published_lines(document)
    row = next(line for line in lines if line.startswith("| +clustered_rif_gap |"))
    assert row.startswith("| +clustered_rif_gap | 0.3422 | 0.4972 | 0.4123 | 0.5500 | 0.4011 | 0.5400 |")
    baseline = next(line for line in lines if line.startswith("| hybrid_rerank |"))
    assert "| 0.3311 | 0.4739 | – | – | – | – |" in baseline  # the per-tenant run is not pooled
    assert published_lines({**document, "runs": [document["runs"][2]]}) == []  # no pooled run, no table
    assert published_lines({**document, "dataset": {"format": "locomo", "path": "locomo10.json"}}) == []


def test_the_quality_header_carries_them() -> None:
    document = {
        "dataset": {"name": "LongMemEval", "format": "longmemeval", "path": "longmemeval_s_498.json.xz",
                    "conversations": 1, "turns": 10, "questions": 2, "labelled": 2, "overall_questions": 2},
        "cost": {"seconds": 1.0, "reranker_pairs": 0, "reranker_pairs_scored_by_model": 0, "retrievals": 2},
        "reranker": {"folds": []},
        "settings": {"alpha": 0.3, "eta": 0.1, "burnin_factor": 5.0, "k_rule": "30", "heldout_split": "halves"},
        "runs": [_run("transductive", "bm25", 0.3, 0.4)],
    }
    header = "\n".join(quality_header(document))
    assert "Beside the published figures" in header and "| bm25 | 0.3171 | – | 0.3000 | 0.4000 |" in header


def test_the_note_names_the_folds_training_sources_from_their_provenance() -> None:
    """The sentence under the table names what the cross-encoders learnt from (their provenance),
    not a fixed source: a LongMemEval-trained fold is not described as trained on LoCoMo."""
    lme = {"provenance": {"sources": [{"name": "LongMemEval", "licence": "MIT"}]}}
    old = {"provenance": {"positive_sources": "LoCoMo (CC BY-NC 4.0)"}}
    assert reranker_sources({"folds": [lme, lme]}) == "LongMemEval (MIT)"
    assert reranker_sources({"folds": [lme, old]}) == "LongMemEval (MIT), LoCoMo (CC BY-NC 4.0)"
    assert reranker_sources({"folds": [{"provenance": {}}]}) == "sources not recorded"
    document = {"dataset": {"format": "longmemeval", "path": "longmemeval_s_498.json.xz"},
                "runs": [_run("heldout", "bm25", 0.3, 0.4)], "reranker": {"folds": [lme]}}
    note = published_lines(document)[-1]
    assert "trained on LongMemEval (MIT)" in note and "LoCoMo" not in note
