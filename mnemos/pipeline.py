"""The retrieval pipeline of one query against one tenant (Algorithm 1 of
*Clustered Retrieval-Induced Forgetting*; docs/architecture.md "Retrieval").

BM25 top-n and dense top-n are fused with RRF, or with a convex combination of their min-max
normalised scores (``config.fusion``, :mod:`mnemos.fusion`); the suppression penalty ``alpha * s(d)_c`` of the
query's cluster is subtracted from every fused score and the list re-sorted (ties by entry id);
the top ``pool_size`` entries are reranked by the cross-encoder. When the best rerank logit is
below ``deep_threshold`` the pool widens to ``deep_pool_size`` (the adaptive deep pass,
k_shallow 30 / k_deep 100; docs/architecture.md "Sources"): the retrievers' lists are read deeper, the first pool's scores are
reused and only the new entries are scored. Optionally, post-rerank features
(:mod:`mnemos.features`: session-then-turn and temporal match, *AssoMem* §4.2 / §3.2.3) then add
logit adjustments to the reranked pool and re-sort it. The result carries the hits, the
:class:`~mnemos.records.Outcome` (the suppression update as data), per-stage seconds from the
injected clock and diagnostics.

An optional :class:`~mnemos.filters.EntryFilter` (``allowed``: knowledge time ``as_of``,
sessions, roles, ``occurred_after``) restricts the candidates inside both retrievers, so every
later stage (fusion, suppression, pool, deep pass, rerank, features, outcome) only ever sees
allowed entries, and a selective filter still yields the best allowed ones. Asked to
(``unfiltered``), a filtered retrieval also keeps each retriever's unfiltered list, cut from the
same scores as the filtered one (one scoring pass per retriever), for an evidence packet's report
of what the filter hid (docs/architecture.md "Evidence packets").

Nothing here reads the environment, a clock it was not handed, or another tenant's data.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from mnemos.errors import DimensionMismatchError, EmptyQueryError, InvalidParameterError
from mnemos.features import (
    Feature,
    FeatureSetting,
    PoolView,
    QueryContext,
    feature_scores,
    parse_time_expressions,
    retriever_ranks,
    retriever_scores,
)
from mnemos.filters import EntryFilter
from mnemos.fusion import DEFAULT_CONVEX_WEIGHT, DEFAULT_RRF_K, Fusion, ScoredList, fuse
from mnemos.records import CandidateLists, Hit, Outcome, PoolEntry, RetrievalResult, StageTimings
from mnemos.rerank import Reranker
from mnemos.suppression import SuppressionTable
from mnemos.tenant_index import TenantIndex


@dataclass(frozen=True)
class RetrievalConfig:
    """Knobs of :func:`retrieve`; defaults from §4.3-§4.4 of *Clustered Retrieval-Induced Forgetting*
    (docs/architecture.md "Retrieval").

    Attributes:
        n_candidates: entries taken from each retriever for the shallow pool (30).
        pool_size: P, entries reranked in the shallow pass (30).
        deep_pool_size: entries reranked in the deep pass (100); also the depth each retriever
            is read to when a deep pass is possible.
        deep_threshold: deep pass when the top rerank logit is below this; None (the default)
            disables it; NaN is refused (it would compare false: on, but never taken). The
            paper's adaptive deep pass is kept as a setting, but with the shipped cross-encoder
            both training-source and never-seen dev splits drop it and the main job gains
            without it (docs/architecture.md "Retrieval", step 5).
        rrf_k: RRF constant (60).
        fusion: how the retrievers' lists are fused: :attr:`Fusion.RRF` (the default, ranks only)
            or :attr:`Fusion.CONVEX` (``convex_weight * bm25 + (1 - convex_weight) * dense`` of
            min-max normalised scores; docs/architecture.md "Retrieval").
        convex_weight: BM25's share of the convex fusion, in [0, 1]; ignored by RRF.
        use_bm25 / use_dense: retriever arms; at least one must be on.
        rerank: rerank the pool (needs a reranker); off gives the fused order and no outcome.
        alpha: suppression strength (0.3). The update rule and its learning rate belong to whoever
            applies the outcome (:data:`mnemos.suppression.DEFAULT_ETA`, ``DEFAULT_UPDATE_RULE``).
        suppression_threshold: evidence threshold tau; the penalty is ``alpha * max(0, s - tau)``,
            so a score starts to count only after demotions worth more than tau have accumulated
            (0 is the paper's rule; docs/architecture.md "Suppression").
        suppression: subtract the suppression penalty before the pool cut.
        features: post-rerank feature settings (:class:`~mnemos.features.FeatureSetting`),
            applied in order to the reranked pool; empty (the default) leaves the rerank order.
            Weights are logits of the configured cross-encoder. Ignored without reranking.
    """

    n_candidates: int = 30
    pool_size: int = 30
    deep_pool_size: int = 100
    deep_threshold: float | None = None
    rrf_k: int = DEFAULT_RRF_K
    fusion: Fusion = Fusion.RRF
    convex_weight: float = DEFAULT_CONVEX_WEIGHT
    use_bm25: bool = True
    use_dense: bool = True
    rerank: bool = True
    alpha: float = 0.3
    suppression: bool = True
    suppression_threshold: float = 0.5
    features: tuple[FeatureSetting, ...] = ()

    def __post_init__(self) -> None:
        for name in ("n_candidates", "pool_size", "deep_pool_size"):
            if getattr(self, name) < 1:
                raise InvalidParameterError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.rrf_k < 0:
            raise InvalidParameterError(f"rrf_k must be >= 0, got {self.rrf_k}")
        try:
            object.__setattr__(self, "fusion", Fusion(self.fusion))
        except ValueError:
            raise InvalidParameterError(f"fusion must be one of {', '.join(f.value for f in Fusion)}, "
                                        f"got {self.fusion!r}") from None
        if not 0.0 <= self.convex_weight <= 1.0:  # False for NaN too
            raise InvalidParameterError(f"convex_weight must be in [0, 1], got {self.convex_weight}")
        if not (self.use_bm25 or self.use_dense):
            raise InvalidParameterError("at least one of use_bm25 and use_dense must be on")
        if self.deep_threshold is not None and math.isnan(self.deep_threshold):
            raise InvalidParameterError("deep_threshold must be a number or None (no deep pass), got nan")
        if self.alpha < 0:
            raise InvalidParameterError(f"alpha must be >= 0, got {self.alpha}")
        if not self.suppression_threshold >= 0 or not math.isfinite(self.suppression_threshold):
            raise InvalidParameterError(f"suppression_threshold must be a finite number >= 0, got {self.suppression_threshold}")
        features = tuple(self.features)
        if not all(isinstance(f, FeatureSetting) for f in features):
            raise InvalidParameterError(f"features must be FeatureSetting values, got {features!r}")
        object.__setattr__(self, "features", features)

    @property
    def deep_enabled(self) -> bool:
        """True when a deep pass can happen (a threshold is set and the deep pool is wider)."""
        return self.deep_threshold is not None and self.deep_pool_size > self.pool_size

    def for_k(self, k: int) -> RetrievalConfig:
        """This configuration with its depths raised to serve ``k`` hits: each retriever read at
        least ``k`` deep, a pool of at least ``k`` and a deep pool at least as wide as the pool.

        :func:`retrieve` returns at most the pool's size in hits (all fused candidates without a
        reranker), so a service that promises ``min(k, allowed entries)`` hits retrieves with
        ``config.for_k(k)``. For ``k`` within ``n_candidates`` and ``pool_size`` (the default k = 10
        against 30 and 30) the configuration itself is returned: same candidates, same pool.

        Raises:
            InvalidParameterError: if ``k < 1``.
        """
        if k < 1:
            raise InvalidParameterError(f"k must be >= 1, got {k}")
        if k <= self.n_candidates and k <= self.pool_size:
            return self
        pool_size = max(self.pool_size, k)
        return dataclasses.replace(self, n_candidates=max(self.n_candidates, k), pool_size=pool_size,
                                   deep_pool_size=max(self.deep_pool_size, pool_size))


class _Stopwatch:
    """Accumulates seconds per stage with an injected clock; ``started`` is the clock at creation."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.seconds: dict[str, float] = {}
        self._stage: str | None = None
        self._started = 0.0
        self.started = clock()

    def start(self, stage: str) -> None:
        self.stop()
        self._stage, self._started = stage, self.clock()

    def stop(self) -> None:
        if self._stage is not None:
            elapsed = self.clock() - self._started
            self.seconds[self._stage] = self.seconds.get(self._stage, 0.0) + elapsed
            self._stage = None

    def timings(self) -> StageTimings:
        """Stop the running stage; seconds per stage so far and the total since creation."""
        self.stop()
        seconds = self.seconds
        return StageTimings(
            bm25=seconds.get("bm25", 0.0),
            dense=seconds.get("dense", 0.0),
            fusion=seconds.get("fusion", 0.0),
            suppression=seconds.get("suppression", 0.0),
            rerank=seconds.get("rerank", 0.0),
            features=seconds.get("features", 0.0),
            total=self.clock() - self.started,
        )


@dataclass(frozen=True)
class _Suppression:
    """The suppression that applies to one request: the tenant's table and the query's cluster,
    both None when suppression is off, the table is missing or the query has no cluster yet."""

    table: SuppressionTable | None
    cluster: int | None

    @classmethod
    def of(cls, config: RetrievalConfig, table: SuppressionTable | None, cluster: int | None) -> _Suppression:
        active = cluster if (config.suppression and table is not None) else None
        return cls(table if active is not None else None, active)


@dataclass(frozen=True)
class _Reranked:
    """The reranked pool: entry ids in suppressed fused order (``initial_rank`` order), the
    cross-encoder logit of each, whether the deep pass ran and the best logit."""

    pool: list[int]
    scores: dict[int, float]
    deep: bool
    top: float


def retrieve(
    index: TenantIndex,
    query: str,
    query_embedding: np.ndarray | None,
    *,
    k: int,
    config: RetrievalConfig | None = None,
    reranker: Reranker | None = None,
    suppression: SuppressionTable | None = None,
    cluster: int | None = None,
    outcome_id: str | None = None,
    clock: Callable[[], float] = time.perf_counter,
    reference_time: datetime | None = None,
    allowed: EntryFilter | None = None,
    unfiltered: bool = False,
) -> RetrievalResult:
    """Retrieve the top ``k`` memories of ``index``'s tenant for ``query``.

    The stages are the functions below, in the order of docs/architecture.md "Retrieval":
    :func:`_candidates`, :func:`_fuse_and_suppress`, :func:`_pool`, :func:`_rerank`,
    :func:`_deep_pass`, :func:`_outcome` and :func:`_features`.

    Args:
        index: the tenant's index (only this tenant's entries can be returned).
        query: the query text; BM25 tokenizes it, the reranker reads it.
        query_embedding: ``(dim,)`` (or ``(1, dim)``) float32 unit vector of the query; may be
            None only when ``config.use_dense`` is False.
        k: number of hits wanted (>= 1; no default here: the service takes a request's, else
            ``MNEMOS_DEFAULT_K``). With reranking, hits come from the pool, so at most
            the pool's size; without, from the fused candidates. ``config.for_k(k)`` raises the
            depths so that ``min(k, allowed entries)`` hits come back (the query worker uses it).
        config: pipeline knobs (default :class:`RetrievalConfig`).
        reranker: cross-encoder; None (or ``config.rerank`` False) returns the fused order.
        suppression: the tenant's suppression scores; ignored when ``config.suppression`` is
            False or ``cluster`` is None.
        cluster: the query's cluster c(q) (None before bootstrap).
        outcome_id: id of the outcome (the service passes the request id); a random one if None.
        clock: monotonic seconds, used for :class:`~mnemos.records.StageTimings`.
        reference_time: tz-aware "now" of the question (e.g. a request's knowledge time) that
            anchors relative time expressions ("last week") for the temporal feature; None
            keeps absolute dates only. Never read from a clock here. The service passes the
            request's ``as_of``; it does not imply ``allowed``.
        allowed: which entries may be candidates (:meth:`TenantIndex.allowed_entries`): an entry
            passes when any of its turns, canonical or alias, is admitted. BM25 scores only the
            allowed documents (with the whole index's IDF and length statistics) and dense search
            runs under a faiss ID selector, so the restriction is exact, not a post-filter of a
            top-n. None, or a filter that restricts nothing, takes the unfiltered path unchanged.
            When no entry is allowed the result is empty (no reranker call, no outcome). The
            outcome of a filtered request covers the entries it pooled, so a filtered request
            still teaches suppression about them (in the query's cluster, as any request).
            Not restricted: the post-rerank session feature ranks sessions (and dates them) over
            the tenant's whole current memory, hidden turns included; it can reorder allowed
            hits, never add one.
        unfiltered: with a restricting ``allowed``, also keep each retriever's list as it would be
            without the filter, as deep as the filtered one, in ``RetrievalResult.unfiltered``.
            Each retriever scores the query once and cuts both lists from those scores
            (``search_split``), so this costs no second search; when no entry is allowed the
            retrievers still run for it. Ignored without a restricting filter.

    Post-rerank features (``config.features``) run after the rerank and the deep pass, on the
    whole reranked pool: ``rerank logit + adjustments``, stable re-sort (ties keep the
    cross-encoder's order), then the cut to ``k``. The first-stage feature reads each turn's
    suppressed fused rank; the bm25 feature its rank among BM25's first ``config.n_candidates``
    candidates as the fusion read them (the filtered list under ``allowed``; a turn not among them,
    one the deep pass or the dense retriever alone brought, ranks ``n_candidates + 1``;
    :meth:`RetrievalConfig.for_k` raises ``n_candidates`` for a large ``k``). The session feature ranks the tenant's
    sessions (``index.sessions``) for the query; the temporal feature compares the time spans
    the query names with each hit's session start (the earliest ``occurred_at`` of its session).
    The outcome is NOT affected: its ``initial_rank`` / ``final_rank`` are the fused and the
    cross-encoder's ranks, because the rank-gap rule (Eq. 2) learns from the reranker's
    promotion and demotion of fused candidates, not from the features' re-sort. Hit ranks and
    scores do follow the features.

    Returns:
        A :class:`~mnemos.records.RetrievalResult`. Hit scores are rerank logits (plus feature
        adjustments) when the pool was reranked, else suppression-adjusted fused scores (RRF or
        convex, ``config.fusion``). ``deep_pass`` is True when the top
        logit of the shallow pool fell below the threshold (the pool may not grow if the
        tenant has no further candidates). ``pool_size`` is the number of reranked entries
        (0 when nothing was reranked).

    Raises:
        EmptyQueryError: if ``query`` is empty or whitespace only.
        InvalidParameterError: if ``k < 1``.
        DimensionMismatchError: if the query embedding does not match the index dimension, or is
            None while the dense arm is on.
    """
    config = config or RetrievalConfig()
    watch = _Stopwatch(clock)
    q_vec = _query_vector(query, query_embedding, k, index.dim, config.use_dense)
    active = _Suppression.of(config, suppression, cluster)
    allowed_ids = None if allowed is None or allowed.is_open else index.allowed_entries(allowed)
    split = unfiltered and allowed_ids is not None
    if allowed_ids is not None and allowed_ids.size == 0 and not split:
        return _empty_result(cluster, watch.clock() - watch.started)

    reranks = config.rerank and reranker is not None
    depth = max(config.n_candidates, config.deep_pool_size) if reranks and config.deep_enabled else config.n_candidates
    lists, everything = _candidates(index, query, q_vec, config, depth, allowed_ids, watch, split=split)
    adjusted = _fuse_and_suppress(lists, config, active, watch, cut=config.n_candidates)
    watch.stop()
    if not config.rerank or reranker is None:
        return _result(watch, cluster, _hits(index, adjusted[:k], allowed), None, 0, False, None, adjusted, everything,
                       candidates=lists)

    pool = _pool(adjusted, config.pool_size)
    if not pool:
        return _result(watch, cluster, [], None, 0, False, None, unfiltered=everything, candidates=lists)

    watch.start("rerank")
    reranked = _rerank(reranker, query, index, pool)
    if config.deep_enabled and config.deep_threshold is not None and reranked.top < config.deep_threshold:
        reranked = _deep_pass(reranker, query, index, lists, reranked, config, active, watch)
    watch.stop()

    outcome, final_order = _outcome(index, reranked, cluster, outcome_id, q_vec)
    ranked = _features(index, query, q_vec, final_order, reranked.scores, config.features, reference_time, watch,
                       {entry.entry_id: entry.initial_rank for entry in outcome.pool}, rrf_k=config.rrf_k,
                       bm25=lists.bm25, depth=config.n_candidates, allowed=allowed)
    hits = _hits(index, ranked[:k], allowed)
    return _result(watch, cluster, hits, outcome, len(reranked.pool), reranked.deep, reranked.top, ranked, everything,
                   candidates=lists)


def _query_vector(
    query: str, query_embedding: np.ndarray | None, k: int, dim: int, use_dense: bool
) -> np.ndarray | None:
    """Check the request; the query embedding as a ``(dim,)`` float32 vector, or None without one.

    Raises:
        EmptyQueryError: if ``query`` is empty or whitespace only.
        InvalidParameterError: if ``k < 1``.
        DimensionMismatchError: if the embedding is not ``(dim,)`` or ``(1, dim)``, or is None while
            ``use_dense`` is on.
    """
    if not query or not query.strip():
        raise EmptyQueryError(query)
    if k < 1:
        raise InvalidParameterError(f"k must be >= 1, got {k}")
    if query_embedding is None:
        if use_dense:
            raise DimensionMismatchError("query embedding", (dim,), ())
        return None
    vec = np.asarray(query_embedding, dtype=np.float32)
    if vec.ndim == 2 and vec.shape[0] == 1:
        vec = vec[0]
    if vec.shape != (dim,):
        raise DimensionMismatchError("query embedding", (dim,), tuple(vec.shape))
    return vec


def _candidates(
    index: TenantIndex,
    query: str,
    q_vec: np.ndarray | None,
    config: RetrievalConfig,
    depth: int,
    allowed_ids: np.ndarray | None,
    watch: _Stopwatch,
    *,
    split: bool = False,
) -> tuple[CandidateLists, CandidateLists | None]:
    """Stage 1, candidates: ``(entry_id, score)`` of each enabled retriever, best first, ``depth``
    deep, restricted to ``allowed_ids`` inside the retrievers (None: every entry), kept so that
    either fusion can run. With ``split`` (and ``allowed_ids``) each retriever's one scoring pass
    also yields its unfiltered list (the second value; else None)."""
    watch.start("bm25")
    bm25: tuple[ScoredList, ScoredList] = ([], [])
    if config.use_bm25:
        bm25 = (index.bm25.search_split(query, depth, allowed_ids) if split and allowed_ids is not None
                else (index.bm25.search(query, depth, allowed_ids), []))
    watch.start("dense")
    dense: tuple[ScoredList, ScoredList] = ([], [])
    if config.use_dense and q_vec is not None:
        dense = (index.dense.search_split(q_vec, depth, allowed_ids) if split and allowed_ids is not None
                 else (index.dense.search(q_vec, depth, allowed_ids)[0], []))
    everything = CandidateLists(tuple(bm25[1]), tuple(dense[1])) if split else None
    return CandidateLists(tuple(bm25[0]), tuple(dense[0])), everything


def _fuse_and_suppress(
    lists: CandidateLists,
    config: RetrievalConfig,
    active: _Suppression,
    watch: _Stopwatch,
    cut: int | None,
) -> list[tuple[int, float]]:
    """Stages 2 and 3, fusion and suppression: ``config.fusion`` (RRF with ``config.rrf_k``, or
    convex with ``config.convex_weight``, normalised over the candidates fused) of the first ``cut``
    candidates of each list (all of them when ``cut`` is None), minus
    ``alpha * max(0, s(d)_c - tau)``, re-sorted best first (ties by entry id). ``(entry_id, score)`` pairs."""
    watch.start("fusion")
    fused = fuse(config.fusion, lists.bm25[:cut], lists.dense[:cut], rrf_k=config.rrf_k,
                 convex_weight=config.convex_weight)
    watch.start("suppression")
    return _suppress(fused, active, config.alpha, config.suppression_threshold)


def _suppress(
    fused: list[tuple[int, float]], active: _Suppression, alpha: float, threshold: float
) -> list[tuple[int, float]]:
    """Subtract ``alpha * max(0, s(d)_c - threshold)`` from fused scores and re-sort (ties by entry id)."""
    if active.table is None or active.cluster is None or alpha == 0.0:
        return fused
    table, cluster = active.table, active.cluster
    adjusted = [(eid, score - alpha * max(0.0, table.penalty(eid, cluster) - threshold)) for eid, score in fused]
    adjusted.sort(key=lambda item: (-item[1], item[0]))
    return adjusted


def _pool(adjusted: Sequence[tuple[int, float]], pool_size: int) -> list[int]:
    """Stage 4a, the pool: the first ``pool_size`` entry ids of the suppressed fused order."""
    return [eid for eid, _ in adjusted[:pool_size]]


def _rerank(reranker: Reranker, query: str, index: TenantIndex, pool: list[int]) -> _Reranked:
    """Stage 4b, rerank: cross-encoder logits of the (non-empty) shallow pool."""
    scores = _score_new(reranker, query, index, pool, {})
    return _Reranked(pool=pool, scores=scores, deep=False, top=max(scores.values()))


def _deep_pass(
    reranker: Reranker,
    query: str,
    index: TenantIndex,
    lists: CandidateLists,
    shallow: _Reranked,
    config: RetrievalConfig,
    active: _Suppression,
    watch: _Stopwatch,
) -> _Reranked:
    """Stage 5, the adaptive deep pass: fuse and suppress the retrievers' whole lists, widen the pool
    to ``config.deep_pool_size`` with the best new entries (the pool keeps the deep fused order) and
    score only those; the shallow pool's logits are reused."""
    deep_adjusted = _fuse_and_suppress(lists, config, active, watch, cut=None)
    watch.start("rerank")
    in_pool = set(shallow.pool)
    room = config.deep_pool_size - len(shallow.pool)
    extra = [eid for eid, _ in deep_adjusted if eid not in in_pool][:room]
    members = in_pool | set(extra)
    pool = [eid for eid, _ in deep_adjusted if eid in members]
    scores = _score_new(reranker, query, index, extra, shallow.scores)
    return _Reranked(pool=pool, scores=scores, deep=True, top=max(scores.values()))


def _outcome(
    index: TenantIndex, reranked: _Reranked, cluster: int | None, outcome_id: str | None, q_vec: np.ndarray | None
) -> tuple[Outcome, list[int]]:
    """Stage 7, the outcome: every pooled entry's ``initial_rank`` (suppressed fused order),
    ``final_rank`` (cross-encoder order, ties by initial rank) and logit; also the pool in final
    order. ``outcome_id`` None draws a random one."""
    pool, scores = reranked.pool, reranked.scores
    initial = {eid: rank for rank, eid in enumerate(pool, start=1)}
    final_order = sorted(pool, key=lambda eid: (-scores[eid], initial[eid]))
    final = {eid: rank for rank, eid in enumerate(final_order, start=1)}
    outcome = Outcome(
        outcome_id=outcome_id if outcome_id is not None else uuid.uuid4().hex,
        tenant_id=index.tenant_id,
        cluster=cluster,
        pool_size=len(pool),
        pool=tuple(PoolEntry(eid, initial[eid], final[eid], scores[eid]) for eid in pool),
        query_embedding=tuple(float(x) for x in q_vec) if q_vec is not None else None,
    )
    return outcome, final_order


def _features(
    index: TenantIndex,
    query: str,
    q_vec: np.ndarray | None,
    order: Sequence[int],
    scores: dict[int, float],
    settings: Sequence[FeatureSetting],
    reference_time: datetime | None,
    watch: _Stopwatch,
    initial_ranks: dict[int, int] | None = None,
    *,
    rrf_k: int,
    bm25: Sequence[tuple[int, float]],
    depth: int,
    allowed: EntryFilter | None = None,
) -> list[tuple[int, float]]:
    """Stage 6, features: ``(entry_id, score)`` of the reranked pool ``order``, best first: the
    logits as they are without ``settings``, else adjusted by them and stably re-sorted.
    ``initial_ranks`` (entry id -> 1-based suppressed fused rank, the outcome's ``initial_rank``)
    feed the first-stage feature; each turn's rank and score in the first ``depth`` of the BM25 list
    ``bm25`` (the shallow pool's candidates, also after a deep pass) feed the bm25 features; the
    session ranking fuses with the retrieval's ``rrf_k``. Each turn's session is the one the hit will
    show under ``allowed`` (:meth:`TenantIndex.shown`), so the session and temporal features score
    the turn the request admitted, not a refused canonical turn."""
    initial_ranks = initial_ranks or {}
    if not settings:
        return [(eid, scores[eid]) for eid in order]
    watch.start("features")
    wanted = {s.feature for s in settings}
    sessions = tuple(index.shown(eid, allowed).session_id for eid in order)
    context = QueryContext(
        session_ranking=index.sessions.rank(query, q_vec, rrf_k=rrf_k) if Feature.SESSION in wanted else (),
        time_spans=parse_time_expressions(query, reference_time) if Feature.TEMPORAL in wanted else (),
    )
    view = PoolView(
        scores=np.asarray([scores[eid] for eid in order], dtype=np.float64),
        sessions=sessions,
        session_dates=tuple(index.sessions.date(s) for s in sessions),
        embeddings=index.embeddings_of(order) if Feature.IMPORTANCE in wanted else np.zeros((len(order), 0)),
        initial_ranks=np.asarray([initial_ranks.get(eid, 0) for eid in order], dtype=np.int64),
        bm25_ranks=retriever_ranks(order, bm25, depth) if Feature.BM25 in wanted else np.zeros(0, dtype=np.int64),
        bm25_scores=retriever_scores(order, bm25, depth) if Feature.BM25_SCORE in wanted else np.zeros(0),
    )
    total = feature_scores(view, context, settings)
    ranked = [(order[i], float(total[i])) for i in np.argsort(-total, kind="stable")]
    watch.stop()
    return ranked


def _hits(index: TenantIndex, ranked: Sequence[tuple[int, float]], allowed: EntryFilter | None) -> list[Hit]:
    """Hits of ``(entry_id, score)`` pairs, best first, each shown as ``allowed`` admits it
    (:meth:`TenantIndex.shown`); ranks are 1-based."""
    hits = []
    for rank, (entry_id, score) in enumerate(ranked, start=1):
        entry = index.shown(entry_id, allowed)
        hits.append(Hit(entry_id=entry.entry_id, turn_id=entry.turn_id, session_id=entry.session_id,
                        role=entry.role, text=entry.text, occurred_at=entry.occurred_at, score=score,
                        rank=rank, aliases=entry.aliases))
    return hits


def _result(
    watch: _Stopwatch,
    cluster: int | None,
    hits: Sequence[Hit],
    outcome: Outcome | None,
    pool_size: int,
    deep: bool,
    top: float | None,
    ranking: Sequence[tuple[int, float]] = (),
    unfiltered: CandidateLists | None = None,
    *,
    candidates: CandidateLists | None = None,
) -> RetrievalResult:
    """The request's result, with the stage timings of ``watch`` (its running stage stopped), the
    ``(entry_id, score)`` ranking the hits were cut from, the retrievers' lists the fusion read
    and their unfiltered lists."""
    return RetrievalResult(hits=tuple(hits), outcome=outcome, timings=watch.timings(), pool_size=pool_size,
                           deep_pass=deep, cluster=cluster, top_rerank_score=top,
                           ranking=tuple((int(eid), float(score)) for eid, score in ranking), unfiltered=unfiltered,
                           candidates=candidates)


def _empty_result(cluster: int | None, total_seconds: float) -> RetrievalResult:
    """The result of a request whose filter allows no entry: no hits, nothing reranked, no outcome."""
    return RetrievalResult(hits=(), outcome=None, timings=StageTimings(total=total_seconds), pool_size=0,
                           deep_pass=False, cluster=cluster, top_rerank_score=None)


def _score_new(
    reranker: Reranker, query: str, index: TenantIndex, entry_ids: Sequence[int], known: dict[int, float]
) -> dict[int, float]:
    """Scores of ``known`` plus rerank logits of ``entry_ids`` not yet scored (no call if none)."""
    out = dict(known)
    todo = [eid for eid in entry_ids if eid not in out]
    if todo:
        logits = np.asarray(reranker.score(query, [index.rendered(eid) for eid in todo]), dtype=np.float32)
        if logits.shape != (len(todo),):
            raise DimensionMismatchError("rerank scores", (len(todo),), tuple(logits.shape))
        out.update((eid, float(s)) for eid, s in zip(todo, logits, strict=True))
    return out
