"""Retrieval quality metrics: NDCG@k, Recall@k and the behaviour metrics of *Clustered Retrieval-Induced Forgetting* §5.3.

All functions are pure and take ids (turn ids in the benchmarks). When dedupe folded turns
into a canonical entry, map the relevant ids to canonical ids first (:func:`remap_relevant`),
as the lethe research journal's dedupe checkpoint does with its alias table, so an absorbed gold turn still counts.

Definitions (§5.3 of that paper, "Behavior-level decomposition"; docs/architecture.md "Evaluation"), all about the top-1 hit:

* ``exact_episode``: the top-1 hit is a relevant turn.
* ``wrong_family``: the top-1 hit comes from a session holding no relevant turn (cross-topic
  error).
* ``sibling_confusion``: the top-1 hit comes from a session holding a relevant turn, but is not
  itself relevant (within-session error).
* ``abstain@T``: the top-1 cross-encoder score is below the confidence threshold T (the paper
  reports abstain@2).

With no hit at all, exact_episode, wrong_family and sibling_confusion are all False and the
query abstains. ``stale_fact`` needs knowledge-update labels and is not implemented here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

Id = TypeVar("Id", str, int)


def _first_k_unique(ranked_ids: Sequence[Id], k: int) -> list[Id]:
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    seen: set[Id] = set()
    out: list[Id] = []
    for item in ranked_ids:
        if len(out) == k:
            break
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


def ndcg_at_k(ranked_ids: Sequence[Id], relevant_ids: Collection[Id], k: int = 10) -> float:
    """NDCG@k with binary gains and a log2 discount.

    ``DCG = sum_{i=1..k} rel_i / log2(i + 1)`` over the first k distinct ranked ids (rank i is
    1-based); ``IDCG`` is the DCG of ``min(k, |relevant|)`` relevant ids at the top. A repeated
    id counts once, at its first rank. Returns 0.0 when ``relevant_ids`` is empty.

    Raises:
        ValueError: if ``k < 1``.
    """
    top = _first_k_unique(ranked_ids, k)
    relevant = set(relevant_ids)
    if not relevant:
        return 0.0
    dcg = sum(1.0 / math.log2(rank + 1) for rank, item in enumerate(top, start=1) if item in relevant)
    idcg = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(relevant)) + 1))
    return dcg / idcg


def recall_at_k(ranked_ids: Sequence[Id], relevant_ids: Collection[Id], k: int) -> float:
    """Fraction of relevant ids found among the first k distinct ranked ids (0.0 if none relevant).

    Raises:
        ValueError: if ``k < 1``.
    """
    relevant = set(relevant_ids)
    if not relevant:
        return 0.0
    found = relevant.intersection(_first_k_unique(ranked_ids, k))
    return len(found) / len(relevant)


@dataclass(frozen=True)
class SessionMetrics:
    """Session-level quality of one ranking: ``hit1`` (the best session holds evidence),
    ``ndcg5`` and ``recall5`` over the session ranking (binary gains)."""

    hit1: float
    ndcg5: float
    recall5: float


def session_ranking(ranked_ids: Sequence[Id], session_of: Mapping[Id, str]) -> list[str]:
    """Sessions in the order of their best-ranked turn (each session once, at its first turn).

    ``session_of`` maps every ranked id to its session id.

    Raises:
        KeyError: if a ranked id has no session.
    """
    return list(dict.fromkeys(session_of[item] for item in ranked_ids))


def session_metrics(ranked_ids: Sequence[Id], relevant_ids: Collection[Id], session_of: Mapping[Id, str]
                    ) -> SessionMetrics:
    """Session Hit@1, NDCG@5 and Recall@5 of a turn ranking, as published LoCoMo results report them.

    A session is relevant when it holds a relevant turn; sessions are ranked by their best turn
    (:func:`session_ranking`). With no relevant id every metric is 0.0.

    Raises:
        KeyError: if a ranked or relevant id has no session.
    """
    relevant = {session_of[item] for item in relevant_ids}
    ranking = session_ranking(ranked_ids, session_of)
    if not relevant:
        return SessionMetrics(0.0, 0.0, 0.0)
    hit1 = 1.0 if ranking and ranking[0] in relevant else 0.0
    return SessionMetrics(hit1, ndcg_at_k(ranking, relevant, 5), recall_at_k(ranking, relevant, 5))


def remap_relevant(relevant_ids: Iterable[str], alias_to_canonical: Mapping[str, str]) -> frozenset[str]:
    """Map relevant turn ids to their canonical turn ids (ids missing from the map stay as they are)."""
    return frozenset(alias_to_canonical.get(turn_id, turn_id) for turn_id in relevant_ids)


@dataclass(frozen=True)
class Top1Behaviour:
    """Behaviour flags of one query's top-1 hit (the paper's §5.3; see module docstring)."""

    exact_episode: bool
    wrong_family: bool
    sibling_confusion: bool
    abstain: bool


def top1_behaviour(
    top_turn_ids: Collection[str] | None,
    top_session_id: str | None,
    relevant_turn_ids: Collection[str],
    relevant_session_ids: Collection[str],
    top_rerank_score: float | None = None,
    abstain_threshold: float | None = None,
) -> Top1Behaviour:
    """Classify the top-1 hit of one query.

    Args:
        top_turn_ids: turn ids the top-1 hit stands for (its turn id plus dedupe aliases); None
            or empty when there is no hit.
        top_session_id: session of the top-1 hit (None when there is no hit).
        relevant_turn_ids: the query's relevant turns.
        relevant_session_ids: sessions that hold at least one relevant turn.
        top_rerank_score: the top-1 cross-encoder logit (None: no reranked hit).
        abstain_threshold: T of abstain@T; None means "never abstain" unless there is no hit.

    exact_episode, wrong_family and sibling_confusion are mutually exclusive; with a hit whose
    session is relevant but which is itself relevant, only exact_episode is True.
    """
    has_hit = bool(top_turn_ids)
    if not has_hit:
        return Top1Behaviour(False, False, False, True)
    exact = bool(set(top_turn_ids or ()) & set(relevant_turn_ids))
    in_relevant_session = top_session_id in set(relevant_session_ids)
    if top_rerank_score is None:
        abstain = abstain_threshold is not None
    else:
        abstain = abstain_threshold is not None and top_rerank_score < abstain_threshold
    return Top1Behaviour(
        exact_episode=exact,
        wrong_family=not exact and not in_relevant_session,
        sibling_confusion=not exact and in_relevant_session,
        abstain=abstain,
    )


def abstains(top_rerank_score: float | None, threshold: float) -> bool:
    """abstain@T for one query: the top-1 rerank score is below T (or there is none)."""
    return top_rerank_score is None or top_rerank_score < threshold


@dataclass(frozen=True)
class BehaviourRates:
    """Mean of each :class:`Top1Behaviour` flag over queries (fractions in [0, 1])."""

    n_queries: int
    exact_episode: float
    wrong_family: float
    sibling_confusion: float
    abstain: float


def behaviour_rates(flags: Sequence[Top1Behaviour]) -> BehaviourRates:
    """Aggregate per-query flags into rates (all 0.0 for no queries)."""
    n = len(flags)
    if n == 0:
        return BehaviourRates(0, 0.0, 0.0, 0.0, 0.0)
    return BehaviourRates(
        n_queries=n,
        exact_episode=sum(f.exact_episode for f in flags) / n,
        wrong_family=sum(f.wrong_family for f in flags) / n,
        sibling_confusion=sum(f.sibling_confusion for f in flags) / n,
        abstain=sum(f.abstain for f in flags) / n,
    )
