"""Typed records shared by the indexes, the pipeline and the service.

All records are frozen dataclasses. Ranks are 1-based everywhere. Times are tz-aware UTC.
Source: docs/architecture.md "Contracts"; the outcome is Algorithm 1 of *Clustered Retrieval-Induced Forgetting* turned
into data.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class Entry:
    """One canonical memory entry of a tenant.

    ``entry_id`` is unique across the deployment (the Postgres key); ``turn_id`` is unique within
    the tenant. ``aliases`` holds the turn ids that dedupe folded into this entry (cosine >= 0.95
    and the same speaker and distinguishing tokens, docs/architecture.md "Dedupe"), so nothing
    said is lost: results map back to every alias, and an alias's text is searchable (BM25).
    ``text`` is the raw text as published; ``image_caption`` an optional caption of an image
    shared with the turn. What the models see is :func:`mnemos.rendering.render_turn` of these.
    """

    entry_id: int
    tenant_id: str
    turn_id: str
    session_id: str
    role: str
    text: str
    occurred_at: datetime
    aliases: tuple[str, ...] = ()
    image_caption: str | None = None

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """The canonical turn id followed by every alias."""
        return (self.turn_id, *self.aliases)

    @property
    def facts(self) -> TurnFacts:
        """The canonical turn's session, role and time."""
        return TurnFacts(self.session_id, self.role, self.occurred_at)


@dataclass(frozen=True)
class TurnFacts:
    """The filterable fields of one turn, canonical or alias (:mod:`mnemos.filters` reads them).

    An alias keeps its own facts: dedupe folds its text into a canonical entry, but its session,
    speaker and time stay its own, so a filter can still find what it said.
    ``occurred_at`` is tz-aware.
    """

    session_id: str
    role: str
    occurred_at: datetime


@dataclass(frozen=True)
class Hit:
    """One retrieved memory, as returned to the agent.

    ``rank`` is 1-based. ``score`` is the cross-encoder logit when the pool was reranked (plus
    the post-rerank feature adjustments, in the same logit units, when features are on),
    otherwise the fused (RRF, suppression-adjusted) score. Scores fall with rank.
    """

    entry_id: int
    turn_id: str
    session_id: str
    role: str
    text: str
    occurred_at: datetime
    score: float
    rank: int
    aliases: tuple[str, ...] = ()

    @property
    def turn_ids(self) -> tuple[str, ...]:
        """The canonical turn id followed by every alias."""
        return (self.turn_id, *self.aliases)


@dataclass(frozen=True)
class PoolEntry:
    """One row of an :class:`Outcome`: how a pool entry fared in one retrieval.

    ``initial_rank`` is the rank after the suppression re-sort (r_init in the paper's §3.1 notation),
    ``final_rank`` the rank after cross-encoder reranking (r_final); both 1-based.
    ``rerank_score`` is the cross-encoder logit s_xenc.
    """

    entry_id: int
    initial_rank: int
    final_rank: int
    rerank_score: float


@dataclass(frozen=True)
class Outcome:
    """The suppression update of one retrieval, as data (Algorithm 1 of the paper, lines 9-12; docs/architecture.md "Suppression").

    ``cluster`` is the query cluster c(q) used at retrieval time (None before bootstrap);
    ``pool_size`` is P, the number of reranked pool entries (equal to ``len(pool)``).
    ``query_embedding`` lets the suppression worker feed the cluster bootstrap buffer.
    """

    outcome_id: str
    tenant_id: str
    cluster: int | None
    pool_size: int
    pool: tuple[PoolEntry, ...]
    query_embedding: tuple[float, ...] | None = None


@dataclass(frozen=True)
class StageTimings:
    """Seconds spent per retrieval stage, measured with the clock handed to the pipeline.

    ``features`` is the post-rerank feature step (session ranking, time expressions, re-sort).
    The service times the index refresh itself (it happens outside the pure core).
    """

    bm25: float = 0.0
    dense: float = 0.0
    fusion: float = 0.0
    suppression: float = 0.0
    rerank: float = 0.0
    features: float = 0.0
    total: float = 0.0


@dataclass(frozen=True)
class CandidateLists:
    """The first stage's candidates: each retriever's ``(entry_id, score)`` list, best first (BM25
    scores, dense inner products); a retriever that did not run has an empty list."""

    bm25: tuple[tuple[int, float], ...] = ()
    dense: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RetrievalResult:
    """What :func:`mnemos.pipeline.retrieve` returns.

    ``outcome`` is None when nothing was reranked (reranking off, no reranker, or an empty pool).
    ``pool_size`` is the number of entries handed to the reranker (after a deep pass, the widened
    pool); 0 when nothing was reranked. ``deep_pass`` is True when the shallow pool's top logit
    fell below the threshold. ``cluster`` is the query cluster the caller passed in.
    ``top_rerank_score`` is the best cross-encoder logit of the final pool, or None.
    ``ranking`` is every candidate the hits were cut from, best first, as ``(entry_id, score)``
    with the hits' scores: the whole reranked pool (after features), or the fused candidates
    when nothing was reranked. Evidence packets (:mod:`mnemos.packets`) select from it.
    ``unfiltered`` is, when the caller asked for it and a filter restricted the candidates, each
    retriever's list as it would have been without the filter, from the same scoring pass as the
    filtered one (an evidence packet names the best of what the filter hid from it); else None.
    ``candidates`` is each retriever's list as the fusion read it (restricted by the request's
    filter, as deep as the retrievers searched); None when no retriever ran (no entry allowed).
    """

    hits: tuple[Hit, ...]
    outcome: Outcome | None
    timings: StageTimings
    pool_size: int
    deep_pass: bool
    cluster: int | None
    top_rerank_score: float | None
    ranking: tuple[tuple[int, float], ...] = ()
    unfiltered: CandidateLists | None = None
    candidates: CandidateLists | None = None
