"""bench.quality.arms: arm definitions (the candidate features are mnemos.features, tested in
tests/unit/test_features.py)."""

from __future__ import annotations

import pytest

from bench.quality.arms import ARM_NAMES, BASELINE_ARM, arm_by_name
from mnemos.fusion import Fusion
from mnemos.suppression import UpdateRule


def test_all_issue_arms_exist_in_report_order() -> None:
    assert ARM_NAMES == (
        "bm25", "dense", "hybrid_rrf", "hybrid_convex", "dense_rerank", "hybrid_rerank",
        "+global_rif", "+clustered_rif_uniform", "+clustered_rif_gap", "mnemos_full",
    )
    assert BASELINE_ARM == "hybrid_rerank"


def test_arm_configs_match_their_names() -> None:
    assert not arm_by_name("bm25").config.use_dense and not arm_by_name("bm25").reranks
    assert not arm_by_name("dense").config.use_bm25
    assert arm_by_name("hybrid_rrf").config.fusion is Fusion.RRF
    convex = arm_by_name("hybrid_convex")
    assert convex.config.fusion is Fusion.CONVEX and not convex.reranks and convex.suppression is None
    assert arm_by_name("dense_rerank").reranks and not arm_by_name("dense_rerank").config.use_bm25
    baseline = arm_by_name("hybrid_rerank")
    assert baseline.suppression is None and not baseline.config.deep_enabled
    assert arm_by_name("+global_rif").suppression.clustered is False
    assert arm_by_name("+clustered_rif_uniform").suppression.rule is UpdateRule.UNIFORM
    assert arm_by_name("+clustered_rif_gap").suppression.rule is UpdateRule.RANK_GAP
    assert arm_by_name("mnemos_full", deep_pass=True).config.deep_enabled
    with pytest.raises(KeyError, match="known"):
        arm_by_name("nope")
