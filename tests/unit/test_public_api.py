"""The public surface of mnemos is declared once, in mnemos.__all__, and pinned here."""

import mnemos

EXPECTED = {
    "Entry", "Hit", "Outcome", "PoolEntry", "RetrievalResult", "StageTimings", "TurnFacts",
    "tokenize", "Encoder", "HashingEncoder", "SentenceTransformerEncoder", "bundled_bi_encoder_path",
    "BM25Index", "DenseIndex", "TenantIndex", "SessionIndex",
    "DEDUPE_THRESHOLD", "DedupeDecision", "dedupe_batch", "find_duplicates", "Signature", "turn_signature",
    "distinguishing_tokens",
    "reciprocal_rank_fusion", "convex_fusion", "Fusion", "UpdateRule", "UPDATE_RULES", "uniform_delta", "rank_gap_delta",
    "outcome_deltas", "SuppressionTable", "QueryClusters",
    "Reranker", "CrossEncoderReranker", "CachedReranker", "FakeReranker", "shipped_reranker_path",
    "RetrievalConfig", "retrieve", "Feature", "FeatureSetting", "EntryFilter",
    "Packet", "PacketConfig", "Omission", "build_packet", "packet_from_index", "SupersessionTable",
    "ndcg_at_k", "recall_at_k", "remap_relevant", "SessionMetrics", "session_metrics", "session_ranking", "Top1Behaviour", "top1_behaviour", "abstains",
    "BehaviourRates", "behaviour_rates",
    "MnemosError", "EmptyQueryError", "DimensionMismatchError", "DuplicateEntryError",
    "UnknownEntryError", "TenantMismatchError", "InvalidParameterError", "ModelLoadError",
}


def test_all_is_pinned():
    assert set(mnemos.__all__) == EXPECTED
    assert len(mnemos.__all__) == len(set(mnemos.__all__)), "duplicate names in __all__"


def test_every_public_name_resolves():
    for name in mnemos.__all__:
        assert getattr(mnemos, name) is not None, name


def test_import_does_not_load_torch():
    import subprocess
    import sys

    code = "import sys, mnemos; print('torch' in sys.modules, 'sentence_transformers' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
