"""Evidence packets: what an agent can put in its prompt within a token budget, and what was left out.

A retrieval's reranked pool (:attr:`mnemos.records.RetrievalResult.ranking`) becomes a
:class:`Packet` (docs/architecture.md "Evidence packets"; the framing is that of *Retrieval Is Not
Enough*: a list of hits is not yet context an agent can use):

1. :func:`screen` leaves out the candidates a later turn corrects (``metadata.supersedes``, read
   from a :class:`~mnemos.supersession.SupersessionTable`) when that correction is visible at the
   request's ``as_of``; :func:`hidden_candidates` names the entries the request's filter kept out
   of the pool (``filtered``, or ``not_visible_at_as_of`` when its knowledge time alone hides them),
   ranked by the unfiltered lists the retrieval's own scoring pass kept (no second search).
2. :func:`select` picks greedily by marginal value per token, MMR-style (*The Use of MMR,
   Diversity-Based Reranking for Reordering Documents and Producing Summaries*) under a budget
   (*Multi-document Summarization via Budgeted Maximization of Submodular Functions*): the value
   of a candidate is ``lambda * rel - (1 - lambda) * max cos(candidate, kept)``, ``rel`` the
   rerank score mapped into (0, 1] (:class:`Relevance`), and each step keeps the candidate with
   the best ``value / tokens ** token_exponent`` that still fits. A candidate at least
   ``redundancy_threshold`` similar to a kept item, or whose value fell to 0 or below, is
   ``redundant`` (the kept item is named); one that no longer fits is ``over_budget``; one that
   fits but would take its session's items past ``session_share`` of the budget is ``session_cap``.
3. The kept items are returned in a deterministic reading order (:func:`reading_order`): by
   session start, session id, turn time, entry id, i.e. the conversation's chronology, so the
   newest statement of a fact comes last. The omission report lists the pool's left-out
   candidates in pool order (best first), then the hidden ones in fused order.

A packet is pasted as session groups (:func:`prompt_text`): a session's header
(:func:`render_header`: session id and start) once, then its items' lines (:func:`render_line`:
speaker and text, the turn's time only where it differs from the session's start). An item costs
the tokens of its line, plus its header's the first time its session enters the packet, so the
qualifiers a flat list repeats on every line (:func:`render_item`, what a top-k list of hits costs)
are paid once per session. Tokens are counted under an injected ``count_tokens``: the service
passes the cross-encoder's tokenizer (:func:`token_counter`), tests :func:`whitespace_tokens`.
``used_tokens <= budget_tokens`` always, and ``used_tokens`` is the count of :func:`prompt_text`
(lines joined by newlines; both counters are additive over whitespace).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

import numpy as np

from mnemos.errors import DimensionMismatchError, InvalidParameterError
from mnemos.filters import EntryFilter
from mnemos.fusion import DEFAULT_RRF_K, reciprocal_rank_fusion
from mnemos.records import CandidateLists
from mnemos.rendering import render_turn
from mnemos.supersession import SupersessionTable
from mnemos.tenant_index import TenantIndex

__all__ = ["Candidate", "Omission", "Omitted", "Packet", "PacketConfig", "PacketItem", "Qualifiers", "Relevance",
           "build_packet", "candidates_from_index", "cost_in", "hidden_candidates", "packet_from_index", "prompt_text",
           "reading_order", "render_header", "render_item", "render_line", "screen", "select", "token_counter",
           "whitespace_tokens"]

TokenCounter = Callable[[str], int]


class Omission(StrEnum):
    """Why a candidate is not in the packet (the wire value is the string)."""

    OVER_BUDGET = "over_budget"
    REDUNDANT = "redundant"
    FILTERED = "filtered"
    NOT_VISIBLE = "not_visible_at_as_of"
    SUPERSEDED = "superseded"
    SESSION_CAP = "session_cap"


class Relevance(StrEnum):
    """How rerank scores become relevance in (0, 1] before they meet cosine redundancy."""

    SIGMOID = "sigmoid"  # cross-encoder logits (trained with a binary cross-entropy)
    MINMAX = "minmax"  # any other score (fused RRF scores when nothing was reranked)


def sigmoid_relevance(scores: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-s))`` of ``(n,)`` logits."""
    return np.asarray(1.0 / (1.0 + np.exp(-np.clip(scores, -50.0, 50.0))), dtype=np.float64)


def minmax_relevance(scores: np.ndarray) -> np.ndarray:
    """``(n,)`` scores mapped linearly onto [0.05, 1] (all 1 when they are equal)."""
    if scores.size == 0 or float(scores.max() - scores.min()) == 0.0:
        return np.ones_like(scores)
    return np.asarray(0.05 + 0.95 * (scores - scores.min()) / (scores.max() - scores.min()), dtype=np.float64)


RELEVANCE: dict[Relevance, Callable[[np.ndarray], np.ndarray]] = {
    Relevance.SIGMOID: sigmoid_relevance, Relevance.MINMAX: minmax_relevance}


@dataclass(frozen=True)
class PacketConfig:
    """Knobs of :func:`select` (module docstring).

    Attributes:
        mmr_lambda: weight of relevance against redundancy, in (0, 1] (1: no redundancy penalty).
        redundancy_threshold: cosine at or above which a candidate repeats a kept item, in (0, 1].
        session_share: most of the budget one session's items may use, in (0, 1].
        token_exponent: ``r`` of ``value / tokens ** r`` (1: value per token; 0: value alone), >= 0.
        relevance: how scores become relevance (:class:`Relevance`).
        hidden_reported: at most this many filtered or not-visible candidates are reported.

    The defaults are those the dev half of LoCoMo chose in ``mnemos bench packets``'s knob study
    (docs/architecture.md "Evidence packets"): no MMR penalty below the redundancy threshold, a
    session may use three quarters of the budget, relevance alone (not per token) orders the picks.

    Raises:
        InvalidParameterError: for a value outside its range.
    """

    mmr_lambda: float = 1.0
    redundancy_threshold: float = 0.9
    session_share: float = 0.75
    token_exponent: float = 0.0
    relevance: Relevance = Relevance.SIGMOID
    hidden_reported: int = 10

    def __post_init__(self) -> None:
        for name in ("mmr_lambda", "redundancy_threshold", "session_share"):
            value = getattr(self, name)
            if not (0.0 < value <= 1.0):
                raise InvalidParameterError(f"{name} must be in (0, 1], got {value}")
        if not (self.token_exponent >= 0 and math.isfinite(self.token_exponent)):
            raise InvalidParameterError(f"token_exponent must be a finite number >= 0, got {self.token_exponent}")
        if self.hidden_reported < 0:
            raise InvalidParameterError(f"hidden_reported must be >= 0, got {self.hidden_reported}")
        object.__setattr__(self, "relevance", Relevance(self.relevance))


@dataclass(frozen=True)
class Qualifiers:
    """What an item says about itself: speaker, session, when, the turns folded into it, and the
    session's start (the earliest ``occurred_at`` of its turns). Times are tz-aware UTC."""

    session_id: str
    role: str
    occurred_at: datetime
    aliases: tuple[str, ...] = ()
    session_date: datetime | None = None


@dataclass(frozen=True)
class Candidate:
    """One pool entry offered to :func:`select`: its rerank ``score``, its text (as published, with
    an image caption appended), the ``tokens`` of its :func:`render_line`, its qualifiers, and the
    ``header`` it is pasted under (:func:`render_header`; ``""``: none) with that header's
    ``header_tokens``, paid once per packet by the first item kept under it."""

    entry_id: int
    turn_id: str
    text: str
    score: float
    tokens: int
    qualifiers: Qualifiers
    header: str = ""
    header_tokens: int = 0


PacketItem = Candidate
"""A kept item is the candidate itself (``tokens`` counts :func:`render_line` of it)."""


@dataclass(frozen=True)
class Omitted:
    """One left-out candidate: why, and ``because_of`` the turn id it is redundant with (a kept
    item) or superseded by; ``tokens`` is what it would have cost when it was left out (its line,
    plus its header when its session was not yet in the packet); ``score`` and ``tokens`` are None
    for a candidate the filter hid."""

    entry_id: int
    turn_id: str
    reason: Omission
    score: float | None = None
    tokens: int | None = None
    because_of: str | None = None


@dataclass(frozen=True)
class Packet:
    """Kept items in reading order, the omission report, the budget and the tokens used (<= budget):
    the kept items' lines plus the headers of their sessions, i.e. the count of :func:`prompt_text`."""

    items: tuple[PacketItem, ...]
    omitted: tuple[Omitted, ...]
    budget_tokens: int
    used_tokens: int


def whitespace_tokens(text: str) -> int:
    """Whitespace-separated words of ``text``: the token counter of tests and of a reranker without a tokenizer."""
    return len(text.split())


def token_counter(reranker: object) -> TokenCounter:
    """The ``count_tokens`` of ``reranker`` or of the first reranker it wraps (``inner``) that has one;
    :func:`whitespace_tokens` when none does (a fake reranker, or no reranker)."""
    node = reranker
    while node is not None:
        count = getattr(node, "count_tokens", None)
        if callable(count):
            return count  # type: ignore[no-any-return]
        node = getattr(node, "inner", None)
    return whitespace_tokens


def render_item(text: str, qualifiers: Qualifiers) -> str:
    """One self-contained line of a flat list (every qualifier repeated on it, as a top-k list of
    hits is pasted): ``"[<YYYY-MM-DD HH:MM> UTC, session <id>] <role>: <text>"``."""
    when = qualifiers.occurred_at.strftime("%Y-%m-%d %H:%M")
    return f"[{when} UTC, session {qualifiers.session_id}] {render_turn(qualifiers.role, text)}"


def render_header(qualifiers: Qualifiers) -> str:
    """The line a packet's session group starts with: ``"[session <id>, <YYYY-MM-DD HH:MM> UTC]"``,
    the time being the session's start; ``"[session <id>]"`` when the start is unknown."""
    if qualifiers.session_date is None:
        return f"[session {qualifiers.session_id}]"
    return f"[session {qualifiers.session_id}, {qualifiers.session_date.strftime('%Y-%m-%d %H:%M')} UTC]"


def render_line(text: str, qualifiers: Qualifiers) -> str:
    """An item's line under its :func:`render_header`: ``"<role>: <text>"`` when the turn happened at
    its session's start, ``"[<HH:MM>] <role>: <text>"`` later that day, else with the full
    ``"[<YYYY-MM-DD HH:MM> UTC]"`` (also when the session's start is unknown)."""
    turn, start, when = render_turn(qualifiers.role, text), qualifiers.session_date, qualifiers.occurred_at
    if start is not None and when == start:
        return turn
    if start is not None and when.date() == start.date():
        return f"[{when.strftime('%H:%M')}] {turn}"
    return f"[{when.strftime('%Y-%m-%d %H:%M')} UTC] {turn}"


def prompt_text(items: Sequence[PacketItem]) -> str:
    """What an agent pastes: the items grouped under their headers (groups in order of their first
    item, items in the given order: a packet's reading order), one line each, newline-separated."""
    groups: dict[str, list[str]] = {}
    for item in items:
        groups.setdefault(item.header, []).append(render_line(item.text, item.qualifiers))
    return "\n".join(line for header, lines in groups.items() for line in ([header] if header else []) + lines)


def cost_in(candidate: Candidate, headers: Collection[str]) -> int:
    """Tokens ``candidate`` adds to a packet whose session ``headers`` are already pasted: its line,
    plus its header's when the header is not among them yet."""
    pays_header = candidate.header and candidate.header not in headers
    return candidate.tokens + (candidate.header_tokens if pays_header else 0)


def reading_order(item: PacketItem) -> tuple[datetime, str, datetime, int]:
    """Sort key of the packet: session start (its own time when unknown), session id, turn time, entry id."""
    q = item.qualifiers
    return (q.session_date or q.occurred_at, q.session_id, q.occurred_at, item.entry_id)


def screen(candidates: Sequence[Candidate], supersessions: SupersessionTable | None,
           as_of: datetime | None = None) -> tuple[list[Candidate], list[Omitted]]:
    """Split ``candidates`` into those still current at ``as_of`` and those a visible correction
    supersedes (``because_of`` names the newest such correction). An entry is superseded when any
    of its turns (canonical or alias) is named by a turn that is not one of its own and occurred
    after the entry's turn (a correction of a newer turn, or a cycle, hides nothing)."""
    if supersessions is None or len(supersessions) == 0:
        return list(candidates), []
    current, superseded = [], []
    for c in candidates:
        turns = (c.turn_id, *c.qualifiers.aliases)
        correction = supersessions.superseding(turns, as_of, exclude=turns, after=c.qualifiers.occurred_at)
        if correction is None:
            current.append(c)
        else:
            superseded.append(Omitted(c.entry_id, c.turn_id, Omission.SUPERSEDED, c.score, c.tokens,
                                      correction.turn_id))
    return current, superseded


def _unit_rows(embeddings: np.ndarray, n: int) -> np.ndarray:
    matrix = np.asarray(embeddings, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != n:
        raise DimensionMismatchError("candidate embeddings", f"({n}, dim)", tuple(matrix.shape))
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(np.divide(matrix, norms, out=np.zeros_like(matrix), where=norms > 0), dtype=np.float64)


def select(candidates: Sequence[Candidate], embeddings: np.ndarray, budget_tokens: int,
           config: PacketConfig | None = None) -> tuple[list[Candidate], list[Omitted]]:
    """Greedy budgeted MMR (module docstring): the kept candidates in the order they were chosen,
    and the others with their reason, in input order.

    Args:
        candidates: the pool, best first (input order breaks ties of value per token, then of relevance).
        embeddings: ``(len(candidates), dim)`` embeddings of the candidates (normalised here).
        budget_tokens: total tokens the kept items may use (>= 1).
        config: knobs (default :class:`PacketConfig`).

    Raises:
        InvalidParameterError: if ``budget_tokens < 1`` or a candidate has fewer than 1 token.
        DimensionMismatchError: if ``embeddings`` has not one row per candidate.
    """
    config = config or PacketConfig()
    if budget_tokens < 1:
        raise InvalidParameterError(f"budget_tokens must be >= 1, got {budget_tokens}")
    if any(c.tokens < 1 or c.header_tokens < 0 for c in candidates):
        raise InvalidParameterError("every candidate must count at least 1 token (and a header at least 0)")
    n = len(candidates)
    unit = _unit_rows(embeddings, n)
    rel = RELEVANCE[config.relevance](np.asarray([c.score for c in candidates], dtype=np.float64))
    cost = np.asarray([c.tokens for c in candidates], dtype=np.float64) ** config.token_exponent
    max_sim, nearest = np.zeros(n), np.full(n, -1)
    session_cap = config.session_share * budget_tokens
    session_used: dict[str, int] = {}
    headers: set[str] = set()  # headers already in the packet: their items pay only their line
    is_open = np.ones(n, dtype=bool)
    kept: list[int] = []
    reasons: dict[int, Omitted] = {}

    def cost_of(i: int) -> int:
        return cost_in(candidates[i], headers)

    def omit(i: int, reason: Omission) -> None:
        c = candidates[i]
        named = candidates[nearest[i]].turn_id if reason is Omission.REDUNDANT and nearest[i] >= 0 else None
        reasons[i] = Omitted(c.entry_id, c.turn_id, reason, c.score, cost_of(i), named)
        is_open[i] = False

    used = 0
    while is_open.any():
        for i in map(int, np.flatnonzero(is_open)):
            c = candidates[i]
            if max_sim[i] >= config.redundancy_threshold:
                omit(i, Omission.REDUNDANT)
            elif used + cost_of(i) > budget_tokens:
                omit(i, Omission.OVER_BUDGET)
            elif session_used.get(c.qualifiers.session_id, 0) + cost_of(i) > session_cap:
                omit(i, Omission.SESSION_CAP)
        choices = [int(i) for i in np.flatnonzero(is_open)]
        if not choices:
            break
        value = config.mmr_lambda * rel - (1.0 - config.mmr_lambda) * max_sim
        # best value per token; ties by relevance, then by input (pool) order
        best = min(choices, key=lambda i: (-value[i] / cost[i], -rel[i], i))  # cost >= 1
        if value[best] <= 0:
            for i in choices:
                omit(i, Omission.REDUNDANT)
            break
        kept.append(best)
        is_open[best] = False
        spent = cost_of(best)
        used += spent
        headers.add(candidates[best].header)
        session = candidates[best].qualifiers.session_id
        session_used[session] = session_used.get(session, 0) + spent
        sims = unit @ unit[best]
        closer = sims > max_sim
        max_sim[closer], nearest[closer] = sims[closer], best
    return [candidates[i] for i in kept], [reasons[i] for i in sorted(reasons)]


def build_packet(candidates: Sequence[Candidate], embeddings: np.ndarray, budget_tokens: int,
                 config: PacketConfig | None = None, *, supersessions: SupersessionTable | None = None,
                 as_of: datetime | None = None, hidden: Sequence[Omitted] = ()) -> Packet:
    """:func:`screen`, then :func:`select` on what is current, kept items in :func:`reading_order`.

    ``embeddings`` has one row per candidate (in ``candidates`` order); ``hidden`` (from
    :func:`hidden_candidates`) is appended to the omission report. Raises as :func:`select`.
    """
    rows = {c.entry_id: row for row, c in enumerate(candidates)}
    current, superseded = screen(candidates, supersessions, as_of)
    matrix = np.asarray(embeddings)
    if matrix.ndim != 2 or matrix.shape[0] != len(candidates):
        raise DimensionMismatchError("candidate embeddings", f"({len(candidates)}, dim)", tuple(matrix.shape))
    kept, left_out = select(current, matrix[[rows[c.entry_id] for c in current]], budget_tokens, config)
    items = sorted(kept,
                   key=reading_order)
    position = {c.entry_id: row for row, c in enumerate(candidates)}
    omitted = sorted([*superseded, *left_out], key=lambda o: position[o.entry_id])
    header_tokens = {item.header: item.header_tokens for item in items if item.header}
    return Packet(items=tuple(items), omitted=(*omitted, *hidden), budget_tokens=budget_tokens,
                  used_tokens=sum(item.tokens for item in items) + sum(header_tokens.values()))


def candidates_from_index(index: TenantIndex, ranking: Sequence[tuple[int, float]],
                          count_tokens: TokenCounter, allowed: EntryFilter | None = None) -> list[Candidate]:
    """Candidates of ``(entry_id, score)`` pairs of ``index``'s tenant, in the given order, their
    tokens counted on :func:`render_line` (at least 1) and their header's on :func:`render_header`.
    Each is shown as the retrieval's filter ``allowed`` admits it (:meth:`TenantIndex.shown`: an entry
    that passed through an alias carries that alias's session, role and time).

    Raises:
        UnknownEntryError: if an entry id is not in the index.
    """
    out = []
    for entry_id, score in ranking:
        entry = index.shown(entry_id, allowed)
        text = entry.text if not entry.image_caption else f"{entry.text} [image: {entry.image_caption.strip()}]"
        try:
            session_date: datetime | None = index.sessions.date(entry.session_id)
        except KeyError:
            session_date = None
        qualifiers = Qualifiers(entry.session_id, entry.role, entry.occurred_at, entry.aliases, session_date)
        tokens = max(1, int(count_tokens(render_line(text, qualifiers))))
        header = render_header(qualifiers)
        out.append(Candidate(entry.entry_id, entry.turn_id, text, float(score), tokens, qualifiers, header,
                             max(0, int(count_tokens(header)))))
    return out


def hidden_candidates(index: TenantIndex, unfiltered: CandidateLists | None, entry_filter: EntryFilter | None, *,
                      depth: int, limit: int, rrf_k: int = DEFAULT_RRF_K) -> list[Omitted]:
    """The best ``limit`` entries that ``entry_filter`` kept out of a retrieval, ranked by its
    retrievers' ``unfiltered`` lists (:attr:`~mnemos.records.RetrievalResult.unfiltered`: BM25 and
    dense as they ranked without the filter, from the same scoring pass as the filtered lists; no
    second search), each cut to ``depth`` and fused by RRF with ``rrf_k`` (the retrieval's own):
    ``not_visible_at_as_of`` when its ``as_of`` alone hides every turn of the entry, else
    ``filtered``. ``[]`` without a restricting filter or without the lists. No score: they were
    never reranked."""
    if unfiltered is None or entry_filter is None or entry_filter.is_open or limit <= 0:
        return []
    lists = [[eid for eid, _ in unfiltered.bm25[:depth]], [eid for eid, _ in unfiltered.dense[:depth]]]
    allowed = set(index.allowed_entries(entry_filter).tolist())
    visible = (None if entry_filter.as_of is None
               else set(index.allowed_entries(EntryFilter(as_of=entry_filter.as_of)).tolist()))
    out = []
    for entry_id, _ in reciprocal_rank_fusion(lists, k=rrf_k):
        if entry_id in allowed:
            continue
        reason = Omission.NOT_VISIBLE if visible is not None and entry_id not in visible else Omission.FILTERED
        out.append(Omitted(entry_id, index.entry(entry_id).turn_id, reason))
        if len(out) == limit:
            break
    return out


def packet_from_index(index: TenantIndex, ranking: Sequence[tuple[int, float]], budget_tokens: int,
                      count_tokens: TokenCounter, config: PacketConfig | None = None, *,
                      as_of: datetime | None = None, hidden: Sequence[Omitted] = (),
                      allowed: EntryFilter | None = None) -> Packet:
    """The packet of a retrieval's ranked pool (``(entry_id, score)``, best first) in ``index``,
    with the index's stored embeddings and its :attr:`~mnemos.tenant_index.TenantIndex.supersessions`;
    ``allowed`` is the retrieval's filter (how each entry is shown, :func:`candidates_from_index`)."""
    candidates = candidates_from_index(index, ranking, count_tokens, allowed)
    embeddings = index.embeddings_of([c.entry_id for c in candidates])
    return build_packet(candidates, embeddings, budget_tokens, config, supersessions=index.supersessions,
                        as_of=as_of, hidden=hidden)
