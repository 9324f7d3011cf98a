"""Mnemos core: hybrid retrieval with clustered retrieval-induced forgetting, as pure functions.

This module declares the public surface; everything not in ``__all__`` is internal.
Heavy model libraries (torch, sentence-transformers) are imported only when a real encoder or
reranker is constructed.
"""

from mnemos.bm25_index import BM25Index
from mnemos.dedupe import DEFAULT_THRESHOLD as DEDUPE_THRESHOLD
from mnemos.dedupe import (
    DedupeDecision,
    Signature,
    dedupe_batch,
    distinguishing_tokens,
    find_duplicates,
    turn_signature,
)
from mnemos.dense_index import DenseIndex
from mnemos.encoder import Encoder, HashingEncoder, SentenceTransformerEncoder, bundled_bi_encoder_path
from mnemos.errors import (
    DimensionMismatchError,
    DuplicateEntryError,
    EmptyQueryError,
    InvalidParameterError,
    MnemosError,
    ModelLoadError,
    TenantMismatchError,
    UnknownEntryError,
)
from mnemos.evaluation import (
    BehaviourRates,
    SessionMetrics,
    Top1Behaviour,
    abstains,
    behaviour_rates,
    ndcg_at_k,
    recall_at_k,
    remap_relevant,
    session_metrics,
    session_ranking,
    top1_behaviour,
)
from mnemos.features import Feature, FeatureSetting
from mnemos.filters import EntryFilter
from mnemos.fusion import Fusion, convex_fusion, reciprocal_rank_fusion
from mnemos.packets import Omission, Packet, PacketConfig, build_packet, packet_from_index
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry, Hit, Outcome, PoolEntry, RetrievalResult, StageTimings, TurnFacts
from mnemos.rerank import CachedReranker, CrossEncoderReranker, FakeReranker, Reranker, shipped_reranker_path
from mnemos.sessions import SessionIndex
from mnemos.supersession import SupersessionTable
from mnemos.suppression import (
    UPDATE_RULES,
    QueryClusters,
    SuppressionTable,
    UpdateRule,
    outcome_deltas,
    rank_gap_delta,
    uniform_delta,
)
from mnemos.tenant_index import TenantIndex
from mnemos.tokenizer import tokenize

__all__ = [
    # records
    "Entry",
    "Hit",
    "Outcome",
    "PoolEntry",
    "RetrievalResult",
    "StageTimings",
    "TurnFacts",
    # text and vectors
    "tokenize",
    "Encoder",
    "HashingEncoder",
    "SentenceTransformerEncoder",
    "bundled_bi_encoder_path",
    # indexes
    "BM25Index",
    "DenseIndex",
    "TenantIndex",
    "SessionIndex",
    # dedupe
    "DEDUPE_THRESHOLD",
    "DedupeDecision",
    "dedupe_batch",
    "find_duplicates",
    "Signature",
    "turn_signature",
    "distinguishing_tokens",
    # fusion, suppression, rerank
    "reciprocal_rank_fusion",
    "convex_fusion",
    "Fusion",
    "UpdateRule",
    "UPDATE_RULES",
    "uniform_delta",
    "rank_gap_delta",
    "outcome_deltas",
    "SuppressionTable",
    "QueryClusters",
    "Reranker",
    "CrossEncoderReranker",
    "CachedReranker",
    "FakeReranker",
    "shipped_reranker_path",
    # pipeline
    "RetrievalConfig",
    "retrieve",
    "Feature",
    "FeatureSetting",
    "EntryFilter",
    # evidence packets
    "Packet",
    "PacketConfig",
    "Omission",
    "build_packet",
    "packet_from_index",
    "SupersessionTable",
    # evaluation
    "ndcg_at_k",
    "recall_at_k",
    "remap_relevant",
    "SessionMetrics",
    "session_metrics",
    "session_ranking",
    "Top1Behaviour",
    "top1_behaviour",
    "abstains",
    "BehaviourRates",
    "behaviour_rates",
    # errors
    "MnemosError",
    "EmptyQueryError",
    "DimensionMismatchError",
    "DuplicateEntryError",
    "UnknownEntryError",
    "TenantMismatchError",
    "InvalidParameterError",
    "ModelLoadError",
]
