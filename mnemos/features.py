"""Post-rerank features: small logit adjustments added to the cross-encoder's scores of a pool.

Each feature is a pure function named after it (:func:`session_adjustment`,
:func:`temporal_adjustment`, :func:`importance_adjustment`, chosen through
:data:`FEATURE_FUNCTIONS` keyed by :class:`Feature`) that returns ``(p,)`` float64 logits to add
to the reranked pool's scores: ``final = rerank_logit + sum(adjustments)``, then a stable
re-sort, so ties keep the cross-encoder's order (:func:`apply_features`). They never change what
the cross-encoder saw.

Sources: *AssoMem* §4.2 baselines ("session-utterance": session-then-turn retrieval) and §3.2.3
(explicit temporal match; Personalized-PageRank importance). ``mnemos bench quality`` selects
among them on a development split (``bench.quality.selection``); on LoCoMo it kept
``session(top=3,weight=2)`` and ``temporal(slack_days=7,weight=2)``. Weights are in logit units
of the cross-encoder that produced the scores, so a weight chosen for one reranker does not
transfer to another.

Nothing here reads a clock: relative time expressions ("yesterday") are resolved only against a
reference datetime the caller hands in.
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum

import numpy as np

from mnemos.errors import InvalidParameterError

__all__ = [
    "FEATURE_FUNCTIONS",
    "DateSpan",
    "Feature",
    "FeatureSetting",
    "PoolView",
    "QueryContext",
    "apply_features",
    "bm25_adjustment",
    "bm25_score_adjustment",
    "feature_scores",
    "first_stage_adjustment",
    "importance_adjustment",
    "parse_time_expressions",
    "retriever_ranks",
    "retriever_scores",
    "session_adjustment",
    "session_matches",
    "temporal_adjustment",
]


@dataclass(frozen=True)
class PoolView:
    """A reranked pool as the features see it; row ``i`` is the ``i``-th hit (rank ``i + 1``).

    Attributes:
        scores: ``(p,)`` float rerank logits.
        sessions: session id of each hit.
        session_dates: session start of each hit (tz-aware UTC): the earliest ``occurred_at``
            of the session's turns (:meth:`mnemos.sessions.SessionIndex.date`).
        embeddings: ``(p, dim)`` float32 unit bi-encoder vectors of the hits (only
            :func:`importance_adjustment` reads them; ``(p, 0)`` is fine without it).
        initial_ranks: ``(p,)`` 1-based rank of each hit in the suppressed fused (first-stage)
            order, the outcome's ``initial_rank`` (only :func:`first_stage_adjustment` reads
            them; empty is fine without it).
        bm25_ranks: ``(p,)`` 1-based rank of each hit in the BM25 retriever's own candidate list,
            ``n + 1`` for a hit outside its first ``n`` (:func:`retriever_ranks`; only
            :func:`bm25_adjustment` reads them; empty is fine without it).
        bm25_scores: ``(p,)`` BM25 score of each hit as the BM25 retriever's candidate list gives
            it, the list's lowest score for a hit outside its first ``n`` (:func:`retriever_scores`;
            only :func:`bm25_score_adjustment` reads them; empty is fine without it).
    """

    scores: np.ndarray
    sessions: tuple[str, ...]
    session_dates: tuple[datetime, ...]
    embeddings: np.ndarray
    initial_ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bm25_ranks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    bm25_scores: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float64))


@dataclass(frozen=True)
class DateSpan:
    """Inclusive span of calendar days a question refers to; ``month`` alone = that month, any year."""

    start: date | None
    end: date | None
    month: int | None = None


@dataclass(frozen=True)
class QueryContext:
    """What the features know about the query.

    ``session_ranking`` is the tenant's sessions ordered best first by a session-level retriever
    (:meth:`mnemos.sessions.SessionIndex.rank`: BM25 over session transcripts fused with the
    cosine to session centroids); ``time_spans`` are the date spans the question names
    (:func:`parse_time_expressions`).
    """

    session_ranking: tuple[str, ...] = ()
    time_spans: tuple[DateSpan, ...] = ()


class Feature(StrEnum):
    """Post-rerank features (candidates of the bench's ``mnemos_full``)."""

    SESSION = "session"
    """Session-then-turn (AssoMem §4.2 baselines, "session-utterance"): boost turns of top sessions."""
    TEMPORAL = "temporal"
    """Explicit temporal match (AssoMem §3.2.3): boost turns whose session date fits the question."""
    IMPORTANCE = "importance"
    """Personalized PageRank importance over the pool's similarity graph (AssoMem §3.2.3)."""
    FIRST_STAGE = "first_stage"
    """First-stage evidence kept in the final score: z-scored fused rank, scaled to the logits' spread."""
    BM25 = "bm25"
    """Lexical evidence kept in the final score: z-scored rank in BM25's own list, scaled likewise."""
    BM25_SCORE = "bm25_score"
    """Lexical evidence kept in the final score: z-scored BM25 score, scaled likewise."""


_REQUIRED: dict[Feature, frozenset[str]] = {
    Feature.SESSION: frozenset({"top", "weight"}),
    Feature.TEMPORAL: frozenset({"slack_days", "weight"}),
    Feature.IMPORTANCE: frozenset({"weight"}),
    Feature.FIRST_STAGE: frozenset({"weight"}),
    Feature.BM25: frozenset({"weight"}),
    Feature.BM25_SCORE: frozenset({"weight"}),
}
_OPTIONAL: dict[Feature, frozenset[str]] = {
    Feature.SESSION: frozenset(),
    Feature.TEMPORAL: frozenset(),
    Feature.IMPORTANCE: frozenset({"neighbours", "damping", "iterations"}),
    Feature.FIRST_STAGE: frozenset({"floor"}),
    Feature.BM25: frozenset({"floor"}),
    Feature.BM25_SCORE: frozenset({"floor"}),
}


@dataclass(frozen=True)
class FeatureSetting:
    """One feature with its parameters, e.g. ``FeatureSetting(Feature.SESSION, {"top": 3, "weight": 1.0})``.

    Parameters are the keyword arguments of the feature's function: ``session``: ``top``
    (sessions boosted, >= 1), ``weight``; ``temporal``: ``slack_days`` (>= 0), ``weight``;
    ``importance``: ``weight`` and optionally ``neighbours``, ``damping``, ``iterations``;
    ``first_stage``: ``weight`` (in standard deviations of the pool's logits per standard
    deviation of its fused ranks); ``bm25``: ``weight`` (the same, per standard deviation of its
    BM25 ranks); ``bm25_score``: ``weight`` (per standard deviation of its BM25 scores); each of these
    three optionally ``floor`` (>= 0, logits): the spread the evidence is scaled to is at least this,
    so a cross-encoder that cannot tell the pool apart yields to the evidence. Weights are
    rerank-logit units. Hashable, so a :class:`~mnemos.pipeline.RetrievalConfig`
    holding settings stays hashable.

    Raises:
        InvalidParameterError: for an unknown feature, a missing or unknown parameter, a
            non-finite value, ``top < 1`` or ``slack_days < 0``.
    """

    feature: Feature
    params: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            feature = Feature(self.feature)
        except ValueError:
            raise InvalidParameterError(
                f"unknown feature {self.feature!r}; known: {', '.join(f.value for f in Feature)}"
            ) from None
        params = dict(self.params)
        missing = _REQUIRED[feature] - set(params)
        unknown = set(params) - _REQUIRED[feature] - _OPTIONAL[feature]
        if missing or unknown:
            raise InvalidParameterError(
                f"{feature.value}: missing parameters {sorted(missing)}, unknown parameters {sorted(unknown)}"
            )
        for name, value in params.items():
            if not np.isfinite(float(value)):
                raise InvalidParameterError(f"{feature.value}: {name} must be finite, got {value}")
        if params.get("top", 1) < 1 or params.get("slack_days", 0) < 0 or params.get("floor", 0) < 0:
            raise InvalidParameterError(f"{feature.value}: top must be >= 1, slack_days and floor >= 0, got {params}")
        object.__setattr__(self, "feature", feature)
        object.__setattr__(self, "params", params)

    def __hash__(self) -> int:
        return hash((self.feature, tuple(sorted(self.params.items()))))

    def label(self) -> str:
        """Short text such as ``session(top=3,weight=1.0)``."""
        inner = ",".join(f"{k}={v:g}" for k, v in sorted(self.params.items()))
        return f"{self.feature.value}({inner})"


def session_adjustment(pool: PoolView, context: QueryContext, *, top: float, weight: float) -> np.ndarray:
    """``weight`` logits for every pool turn whose session is among the ``top`` best sessions.

    AssoMem §4.2 ("session-utterance"): rank sessions first, then prefer turns of the best ones.
    Returns a ``(p,)`` float64 array (zeros when no session ranking is known).
    """
    chosen = set(context.session_ranking[: int(top)])
    return np.asarray([weight if s in chosen else 0.0 for s in pool.sessions], dtype=np.float64)


# ---- time expressions --------------------------------------------------------------------

_MONTHS = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_MONTHS.update({name.lower(): i for i, name in enumerate(calendar.month_abbr) if name})
_MONTHS["sept"] = 9
_MONTH = r"(?P<month>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"(?P<year>(?:19|20)\d\d)"
_DAY = r"(?P<day>[0-3]?\d)(?:st|nd|rd|th)?"
_BEFORE = r"(?P<before>\b(?:the\s+)?(?:week|weekend|day|days|month)\s+before\s+|\bbefore\s+)?"
_PATTERNS = (
    re.compile(_BEFORE + r"\b" + _DAY + r"\s+(?:of\s+)?" + _MONTH + r",?\s+" + _YEAR + r"\b", re.I),
    re.compile(_BEFORE + r"\b" + _MONTH + r"\s+" + _DAY + r",?\s+" + _YEAR + r"\b", re.I),
    re.compile(_BEFORE + r"\b" + _MONTH + r",?\s+(?:of\s+)?" + _YEAR + r"\b", re.I),
    re.compile(r"\b(?:in|during|of|since)\s+" + _MONTH + r"(?!\s*\d)\b", re.I),
    re.compile(r"\b" + _YEAR + r"\b", re.I),
)
_RELATIVE = re.compile(
    r"\b(?P<what>yesterday|last\s+(?:week|weekend|month|year)|(?P<n>\d+|a|one|two|three|four|five)\s+"
    r"(?P<unit>day|week|month|year)s?\s+ago)\b",
    re.I,
)
_NUMBER_WORDS = {"a": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5}


def _span(year: int | None, month: int | None, day: int | None, before: bool) -> DateSpan | None:
    try:
        if year is not None and month is not None and day is not None:
            start = end = date(year, month, day)
        elif year is not None and month is not None:
            start = date(year, month, 1)
            end = date(year, month, calendar.monthrange(year, month)[1])
        elif year is not None:
            start, end = date(year, 1, 1), date(year, 12, 31)
        else:
            return DateSpan(None, None, month)
    except ValueError:  # "31 February" and the like
        return None
    if before:
        start = _plus_days(start, -14) or date.min
    return DateSpan(start, end)


def parse_time_expressions(text: str, reference: datetime | None = None) -> tuple[DateSpan, ...]:
    """Date spans named in ``text``: ``"on 7 May, 2023"``, ``"in July 2023"``, ``"in 2022"``, ``"in June"``.

    Absolute forms only, unless ``reference`` (the question's own date, as LongMemEval gives, or
    a request's knowledge time) anchors relative ones (``"yesterday"``, ``"last week"``, ``"3
    months ago"``; a week is 7 days, a month 30, a year 365, each widened by a quarter of its
    length either side). ``"the week before <date>"`` widens the span 14 days back. Each
    character is used by at most one expression, longest forms first. Returns ``()`` when
    nothing matches; never raises on odd text (an impossible date such as "31 February" is
    skipped). Source: AssoMem §3.2.3 (explicit temporal match).
    """
    spans: list[DateSpan] = []
    taken = [False] * len(text)
    for pattern in _PATTERNS:
        for m in pattern.finditer(text):
            if any(taken[m.start() : m.end()]):
                continue
            groups = m.groupdict()
            month = _MONTHS.get(groups["month"].lower()) if groups.get("month") else None
            year = int(groups["year"]) if groups.get("year") else None
            day = int(groups["day"]) if groups.get("day") else None
            span = _span(year, month, day, bool(groups.get("before")))
            if span is not None:
                spans.append(span)
                taken[m.start() : m.end()] = [True] * (m.end() - m.start())
    if reference is not None:
        today = reference.date()
        for m in _RELATIVE.finditer(text):
            what = m.group("what").lower()
            if what == "yesterday":
                yesterday = _plus_days(today, -1)
                if yesterday is not None:
                    spans.append(DateSpan(yesterday, yesterday))
                continue
            if what.startswith("last"):
                n, unit = 1, what.split()[-1]
            else:
                raw = m.group("n").lower()
                n = int(raw) if raw.isdigit() else _NUMBER_WORDS[raw]
                unit = m.group("unit").lower()
            days = {"week": 7, "weekend": 7, "month": 30, "year": 365, "day": 1}[unit] * n
            half = max(1, days // 4) if unit != "day" else 1
            start, centre, end = (_plus_days(today, -days - half), _plus_days(today, -days),
                                  _plus_days(today, half - days))
            if centre is not None:  # "2100 years ago" from a reference in 2025 is before year 1: no span
                spans.append(DateSpan(start or date.min, end or date.max))
    return tuple(spans)


def _plus_days(day: date, days: int | float) -> date | None:
    """``day`` moved by ``days`` (may be negative), or None when that leaves the calendar (years 1-9999)."""
    try:
        return day + timedelta(days=days)
    except OverflowError:
        return None


def session_matches(session_date: datetime, spans: Sequence[DateSpan], slack_days: float) -> bool:
    """True when ``session_date`` falls in a span or up to ``slack_days`` (days) after it.

    Conversations talk about events after they happen, so the window extends forward only. A
    month-only span matches the month of the session date or of ``slack_days`` earlier.
    """
    day = session_date.date()
    for span in spans:
        if span.start is not None and span.end is not None:
            if span.start <= day <= (_plus_days(span.end, slack_days) or date.max):
                return True
        elif span.month is not None and span.month in (day.month, (_plus_days(day, -slack_days) or date.min).month):
            return True
    return False


def temporal_adjustment(pool: PoolView, context: QueryContext, *, slack_days: float, weight: float) -> np.ndarray:
    """``weight`` logits for pool turns whose session date matches the question's time spans.

    AssoMem §3.2.3 (explicit temporal match). Returns a ``(p,)`` float64 array: zeros when the
    question names no time, or when every pool turn matches (no information).
    """
    if not context.time_spans:
        return np.zeros(len(pool.sessions), dtype=np.float64)
    hits = np.asarray([session_matches(d, context.time_spans, slack_days) for d in pool.session_dates])
    if hits.all():
        return np.zeros(len(pool.sessions), dtype=np.float64)
    return np.where(hits, weight, 0.0).astype(np.float64)


def importance_adjustment(
    pool: PoolView,
    context: QueryContext,
    *,
    weight: float,
    neighbours: float = 5,
    damping: float = 0.85,
    iterations: int = 30,
) -> np.ndarray:
    """``weight`` times the z-scored Personalized PageRank of each pool turn (``(p,)`` float64).

    Graph: each turn links to its ``neighbours`` most similar pool turns (cosine > 0, weights
    the cosines, rows normalised). Teleport: ``softmax(rerank logits)``, so importance is
    relevance-conditioned as AssoMem §3.2.3 requires (PPR, not global PageRank). Power
    iteration ``r <- (1 - d) t + d P^T r`` for ``iterations`` steps; dangling mass returns to t.
    Returns zeros for pools of fewer than 3 turns or a constant PageRank.
    """
    p = len(pool.sessions)
    if p < 3:
        return np.zeros(p, dtype=np.float64)
    emb = np.asarray(pool.embeddings, dtype=np.float64)
    sims = emb @ emb.T
    np.fill_diagonal(sims, -np.inf)
    keep = min(int(neighbours), p - 1)
    transition = np.zeros((p, p), dtype=np.float64)
    nearest = np.argsort(-sims, axis=1)[:, :keep]
    rows = np.repeat(np.arange(p), keep)
    cols = nearest.reshape(-1)
    transition[rows, cols] = np.clip(sims[rows, cols], 0.0, None)
    out_weight = transition.sum(axis=1, keepdims=True)
    dangling = out_weight[:, 0] == 0
    transition = np.divide(transition, out_weight, out=np.zeros_like(transition), where=out_weight > 0)
    logits = np.asarray(pool.scores, dtype=np.float64)
    teleport = np.exp(logits - logits.max())
    teleport /= teleport.sum()
    rank = teleport.copy()
    for _ in range(iterations):
        rank = (1 - damping) * teleport + damping * (transition.T @ rank + rank[dangling].sum() * teleport)
    spread = rank.std()
    if spread == 0:
        return np.zeros(p, dtype=np.float64)
    return np.asarray(weight * (rank - rank.mean()) / spread, dtype=np.float64)


def _rank_evidence(ranks: np.ndarray, scores: np.ndarray, weight: float, floor: float = 0.0) -> np.ndarray:
    """``weight * max(sd(scores), floor) * z(-ranks)`` over the pool; zeros when the ranks carry no order."""
    return _evidence(-np.asarray(ranks, dtype=np.float64), scores, weight, floor)


def _evidence(values: np.ndarray, scores: np.ndarray, weight: float, floor: float = 0.0) -> np.ndarray:
    """``weight * max(sd(scores), floor) * z(values)`` over the pool (higher value = better evidence);
    zeros when the values are missing, fewer than 2, or all equal.

    ``floor`` (logits) keeps evidence from vanishing with the cross-encoder's spread: with logits that
    differ by less than the model's noise (short chit-chat beside a short answer, all scored as
    unrelated), z-scoring would weigh those differences as fully as a confident ranking's."""
    evidence = np.asarray(values, dtype=np.float64)
    logits = np.asarray(scores, dtype=np.float64)
    if evidence.size != logits.size or evidence.size < 2 or evidence.std() == 0:
        return np.zeros(logits.size, dtype=np.float64)
    spread = max(float(logits.std()), floor)
    return np.asarray(weight * spread * (evidence - evidence.mean()) / evidence.std(), dtype=np.float64)


def first_stage_adjustment(pool: PoolView, context: QueryContext, *, weight: float,
                           floor: float = 0.0) -> np.ndarray:
    """``weight * max(sd(logits), floor) * z(-initial_rank)`` for each pool turn (``(p,)`` float64).

    Interpolating a cross-encoder with the first-stage ranking: the final score is then a
    monotone map of ``z(logit) + weight * z(first stage)``, z-scores taken over the pool (score
    fusion after Bruch, Gai and Ingber, "An Analysis of Fusion Functions for Hybrid Retrieval",
    2023, here with the fused rank as the first-stage score, which is what reciprocal rank
    fusion scores by), kept in logit units so the other features' weights keep their meaning.
    When the cross-encoder is unsure (logits close together) its spread is small and the term
    small with it, down to ``floor`` logits (:func:`_evidence`); ranks that carry no order (fewer than 2 turns, equal ranks, no ranks) give 0.
    ``context`` is unused (the signature every feature shares).
    """
    del context
    return _rank_evidence(pool.initial_ranks, pool.scores, weight, floor)


def bm25_adjustment(pool: PoolView, context: QueryContext, *, weight: float,
                    floor: float = 0.0) -> np.ndarray:
    """``weight * max(sd(logits), floor) * z(-bm25_rank)`` for each pool turn (``(p,)`` float64).

    The form of :func:`first_stage_adjustment` with the turn's rank in BM25's own candidate list
    (:func:`retriever_ranks`) instead of its fused rank: the lexical retriever's evidence alone,
    which fusion with the dense arm blurs. It helps where the cross-encoder misjudges long
    user-assistant turns that share the question's words (docs/reranker.md "BM25 evidence after
    the cross-encoder"). Zero when the ranks carry no order or are missing. ``context`` is unused.
    """
    del context
    return _rank_evidence(pool.bm25_ranks, pool.scores, weight, floor)


def bm25_score_adjustment(pool: PoolView, context: QueryContext, *, weight: float,
                          floor: float = 0.0) -> np.ndarray:
    """``weight * max(sd(logits), floor) * z(bm25_score)`` for each pool turn (``(p,)`` float64).

    :func:`bm25_adjustment` with the turn's BM25 score (:func:`retriever_scores`) in place of its
    rank: a turn that matches the question's words far better than the rest of the pool keeps that
    margin, where a rank gives the first place the same lead however large the gap (the z-scored
    score interpolation of Bruch, Gai and Ingber, "An Analysis of Fusion Functions for Hybrid
    Retrieval", 2023). Measured against the rank form in docs/reranker.md "BM25 scores after the
    cross-encoder". Zero when the scores carry no spread or are missing. ``context`` is unused.
    """
    del context
    return _evidence(pool.bm25_scores, pool.scores, weight, floor)


def retriever_scores(entry_ids: Sequence[int], candidates: Sequence[tuple[int, float]], depth: int) -> np.ndarray:
    """``(len(entry_ids),)`` float64: each entry's score among the first ``depth`` of a retriever's
    ``(entry_id, score)`` candidates (best first); an entry not there gets the lowest score among
    them, a bound its own score cannot exceed, and 0.0 when there is no candidate.

    Raises:
        InvalidParameterError: if ``depth < 1``.
    """
    if depth < 1:
        raise InvalidParameterError(f"depth must be >= 1, got {depth}")
    listed = {int(eid): float(score) for eid, score in candidates[:depth]}
    floor = min(listed.values()) if listed else 0.0
    return np.asarray([listed.get(int(eid), floor) for eid in entry_ids], dtype=np.float64)


def retriever_ranks(entry_ids: Sequence[int], candidates: Sequence[tuple[int, float]], depth: int) -> np.ndarray:
    """``(len(entry_ids),)`` int64: each entry's 1-based rank among the first ``depth`` of a
    retriever's ``(entry_id, score)`` candidates (best first), ``depth + 1`` when it is not there.

    Raises:
        InvalidParameterError: if ``depth < 1``.
    """
    if depth < 1:
        raise InvalidParameterError(f"depth must be >= 1, got {depth}")
    rank = {int(eid): r for r, (eid, _) in enumerate(candidates[:depth], start=1)}
    return np.asarray([rank.get(int(eid), depth + 1) for eid in entry_ids], dtype=np.int64)


FEATURE_FUNCTIONS: dict[Feature, Callable[..., np.ndarray]] = {
    Feature.SESSION: session_adjustment,
    Feature.TEMPORAL: temporal_adjustment,
    Feature.IMPORTANCE: importance_adjustment,
    Feature.FIRST_STAGE: first_stage_adjustment,
    Feature.BM25: bm25_adjustment,
    Feature.BM25_SCORE: bm25_score_adjustment,
}
"""The adjustment function of each :class:`Feature`; each returns ``(p,)`` logits to add."""


def feature_scores(pool: PoolView, context: QueryContext, settings: Sequence[FeatureSetting]) -> np.ndarray:
    """``(p,)`` float64: the rerank logits plus every feature's adjustment (rerank-logit units)."""
    total = np.asarray(pool.scores, dtype=np.float64).copy()
    for setting in settings:
        total += FEATURE_FUNCTIONS[setting.feature](pool, context, **dict(setting.params))
    return total


def apply_features(pool: PoolView, context: QueryContext, settings: Sequence[FeatureSetting]) -> np.ndarray:
    """New order of the pool rows after adding every feature's adjustment to the rerank logits.

    Returns ``(p,)`` int row indices, best first; ties keep the cross-encoder's order (stable
    sort). With no settings this is ``arange(p)`` when the pool is in rerank order.
    """
    return np.argsort(-feature_scores(pool, context, settings), kind="stable")
