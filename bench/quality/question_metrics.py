"""Metrics of one question's final ranking: NDCG and Recall, session metrics, top-1 behaviour.

The measures are those of §5.1 and §5.3 of *Clustered Retrieval-Induced Forgetting*
(docs/architecture.md "Evaluation"); :mod:`mnemos.evaluation` computes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from bench.common.corpora import Tenant
from mnemos.evaluation import ndcg_at_k, recall_at_k, session_metrics, top1_behaviour

__all__ = ["PER_QUESTION_METRICS", "RECALL_DEPTH", "QuestionMetrics", "question_metrics"]

RECALL_DEPTH = 30
"""Hits kept per question for the metrics (Recall@30 is the deepest)."""

PER_QUESTION_METRICS = ("ndcg@10", "recall@10", "recall@30")
"""The values of a question in a ``--per-question`` file, in order (``ndcg10``, ``recall10``, ``recall30``)."""


@dataclass(frozen=True)
class QuestionMetrics:
    """Per-question metrics; behaviour flags as 0/1 floats, ``abstain`` None without a reranker.

    Session metrics (:func:`mnemos.evaluation.session_metrics`) rank sessions by their best hit
    among the top ``RECALL_DEPTH``; a session is relevant when it holds an evidence turn."""

    ndcg10: float
    recall10: float
    recall30: float
    exact_episode: float
    wrong_family: float
    sibling_confusion: float
    abstain: float | None
    deep_pass: bool
    session_hit1: float = 0.0
    session_ndcg5: float = 0.0
    session_recall5: float = 0.0


def question_metrics(tenant: Tenant, relevant_turns: frozenset[str], ranking: Sequence[int], *,
                     top_score: float | None, deep_pass: bool, abstain_threshold: float | None,
                     reranked: bool) -> QuestionMetrics:
    """Metrics of one labelled question's final ``ranking`` (entry ids of ``tenant``, best first).

    ``relevant_turns`` are global turn ids; ``top_score`` is the rerank logit of the top hit
    (None without one); ``abstain`` is measured only when ``reranked``.
    """
    relevant = tenant.relevant_entries(relevant_turns)
    relevant_sessions = {tenant.entry_session[e] for e in relevant}
    top = ranking[0] if ranking else None
    behaviour = top1_behaviour(
        top_turn_ids=None if top is None else (str(top),),
        top_session_id=None if top is None else tenant.entry_session[top],
        relevant_turn_ids={str(e) for e in relevant},
        relevant_session_ids=relevant_sessions,
        top_rerank_score=top_score,
        abstain_threshold=abstain_threshold if reranked else None,
    )
    ranked = list(ranking[:RECALL_DEPTH])
    sessions = session_metrics(ranked, relevant, tenant.entry_session)
    return QuestionMetrics(
        ndcg10=ndcg_at_k(ranked, relevant, 10),
        recall10=recall_at_k(ranked, relevant, 10),
        recall30=recall_at_k(ranked, relevant, 30),
        exact_episode=float(behaviour.exact_episode),
        wrong_family=float(behaviour.wrong_family),
        sibling_confusion=float(behaviour.sibling_confusion),
        abstain=float(behaviour.abstain) if reranked else None,
        deep_pass=deep_pass,
        session_hit1=sessions.hit1,
        session_ndcg5=sessions.ndcg5,
        session_recall5=sessions.recall5,
    )
