"""What the query worker's settings mean for retrieval: the pipeline configuration and the
post-rerank features they switch on.

Kept apart from :mod:`workers.query.worker` (which needs rq and Redis) so that the quality bench
and the main job's replay learn the service's defaults from the same code the worker uses,
without importing the worker.
"""

from __future__ import annotations

from mnemos.features import Feature, FeatureSetting
from mnemos.fusion import Fusion
from mnemos.pipeline import RetrievalConfig
from workers.settings import Settings

__all__ = ["FEATURE_FIELDS", "feature_settings", "retrieval_config"]


FEATURE_FIELDS = ("session_top", "session_weight", "temporal_slack_days", "temporal_weight", "first_stage_weight",
                  "bm25_weight", "bm25_score_weight", "evidence_floor")
"""The :class:`Settings` fields :func:`feature_settings` reads."""


def feature_settings(settings: Settings) -> tuple[FeatureSetting, ...]:
    """The post-rerank features switched on in ``settings`` (a weight of 0 leaves a feature out)."""
    features = []
    if settings.session_weight != 0:
        features.append(FeatureSetting(Feature.SESSION, {"top": settings.session_top,
                                                         "weight": settings.session_weight}))
    if settings.temporal_weight != 0:
        features.append(FeatureSetting(Feature.TEMPORAL, {"slack_days": settings.temporal_slack_days,
                                                          "weight": settings.temporal_weight}))
    floor = {"floor": settings.evidence_floor} if settings.evidence_floor else {}  # labels unchanged without one
    if settings.first_stage_weight != 0:
        features.append(FeatureSetting(Feature.FIRST_STAGE, {"weight": settings.first_stage_weight, **floor}))
    if settings.bm25_weight != 0:
        features.append(FeatureSetting(Feature.BM25, {"weight": settings.bm25_weight, **floor}))
    if settings.bm25_score_weight != 0:
        features.append(FeatureSetting(Feature.BM25_SCORE, {"weight": settings.bm25_score_weight, **floor}))
    return tuple(features)


def retrieval_config(settings: Settings, *, rerank: bool) -> RetrievalConfig:
    """The :class:`mnemos.pipeline.RetrievalConfig` a query worker with ``settings`` retrieves with;
    ``rerank`` False when it runs without a cross-encoder."""
    return RetrievalConfig(
        n_candidates=settings.n_candidates, pool_size=settings.pool_size, deep_pool_size=settings.deep_pool_size,
        deep_threshold=settings.deep_threshold, rrf_k=settings.rrf_k, fusion=Fusion(settings.fusion),
        convex_weight=settings.convex_weight, rerank=rerank, alpha=settings.alpha, suppression=settings.suppression,
        suppression_threshold=settings.suppression_threshold,
        features=feature_settings(settings))
