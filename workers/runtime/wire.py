"""The one place where wire records and core records meet: every conversion between them, once.

The client package (:mod:`api`) never imports the core (a client needs redis and rq, not numpy,
faiss or a model), so each record that crosses the wire has a wire form in :mod:`api.schemas`
(validated, versioned, JSON or stream fields) and a core form in :mod:`mnemos.records` (what the
pipeline computes with). They are kept in step by ``tests/unit/test_wire.py``:

* ``Hit`` (both modules): :func:`hit_message`;
* ``RetrievalResult`` (both): :func:`result_message`, which adds what only the service knows;
* ``Outcome`` with ``PoolRow`` (wire) and ``Outcome`` with ``PoolEntry`` (core):
  :func:`outcome_message` in the query worker, :func:`outcome_record` in the suppression worker;
* a request's ``as_of`` and ``filters`` (:class:`api.schemas.RetrievalFilters`) and the core's
  :class:`mnemos.filters.EntryFilter`: :func:`entry_filter`;
* ``Packet`` with its items, qualifiers and omissions (:mod:`api.packets` and
  :mod:`mnemos.packets`): :func:`packet_message`.

A request's restrictions change form once on the way in: the client's ``filters`` object is
validated into :class:`api.schemas.RetrievalFilters` (the client checks before sending, the query
worker again on receipt) and :func:`entry_filter` turns it, with ``as_of``, into the core's filter.
See docs/architecture.md "Contracts".
"""

from __future__ import annotations

from collections.abc import Mapping

from api import packets as wire_packets
from api import schemas
from mnemos.filters import EntryFilter
from mnemos.packets import Packet, Qualifiers, render_line
from mnemos.records import Hit, Outcome, PoolEntry, RetrievalResult

__all__ = ["entry_filter", "hit_message", "outcome_message", "outcome_record", "packet_message", "result_message"]


def entry_filter(request: schemas.RetrievalRequest) -> EntryFilter | None:
    """The core filter of a request's ``as_of`` and ``filters``; None when it restricts nothing.

    The request was validated when it was parsed (times zone-aware UTC, lists non-empty,
    ``occurred_after`` not after ``as_of``), so this cannot fail.
    """
    f = request.filters
    if request.as_of is None and f is None:
        return None
    return EntryFilter(as_of=request.as_of, occurred_after=None if f is None else f.occurred_after,
                       session_ids=None if f is None or f.session_ids is None else frozenset(f.session_ids),
                       roles=None if f is None or f.roles is None else frozenset(f.roles))


def hit_message(hit: Hit) -> schemas.Hit:
    """The wire form of one core hit (same fields; the score as a Python float)."""
    return schemas.Hit(entry_id=hit.entry_id, turn_id=hit.turn_id, session_id=hit.session_id, role=hit.role,
                       text=hit.text, occurred_at=hit.occurred_at, score=float(hit.score), rank=hit.rank,
                       aliases=tuple(hit.aliases))


def result_message(result: RetrievalResult, request: schemas.RetrievalRequest, *,
                   stage_seconds: Mapping[str, float], memory_version: int,
                   suppression_version: int | None, rerank_pairs_scored: int | None = None,
                   rerank_pairs_cached: int | None = None,
                   packet: wire_packets.Packet | None = None) -> schemas.RetrievalResult:
    """The job result of one answered request: the core result's hits and diagnostics, plus what
    only the service knows (the request and tenant ids, seconds per stage, the memory and
    suppression versions the answer read, the pool pairs the cross-encoder scored and those its cache
    answered, the evidence ``packet`` already in wire form, :func:`packet_message`). The core result's
    ``outcome`` travels apart, on the outcomes stream (:func:`outcome_message`), its ``timings`` as
    ``stage_seconds``; its ``ranking`` and ``unfiltered`` lists stay in the worker (a packet's input)."""
    return schemas.RetrievalResult(
        request_id=request.request_id, tenant_id=request.tenant_id,
        hits=tuple(hit_message(h) for h in result.hits), pool_size=result.pool_size,
        deep_pass=result.deep_pass, cluster=result.cluster,
        top_rerank_score=None if result.top_rerank_score is None else float(result.top_rerank_score),
        stage_seconds=dict(stage_seconds), memory_version=memory_version, suppression_version=suppression_version,
        rerank_pairs_scored=rerank_pairs_scored, rerank_pairs_cached=rerank_pairs_cached, packet=packet)


def outcome_message(outcome: Outcome, *, with_embedding: bool, forget_version: int | None = None
                    ) -> schemas.Outcome:
    """The stream form of a core outcome; the query embedding only ``with_embedding`` (while the
    tenant has no frozen centroids, so the suppression worker can feed its bootstrap buffer), and
    the tenant's ``forget_version`` the retrieval read."""
    return schemas.Outcome(
        outcome_id=outcome.outcome_id, tenant_id=outcome.tenant_id, cluster=outcome.cluster,
        pool_size=outcome.pool_size,
        pool=tuple(schemas.PoolRow(p.entry_id, p.initial_rank, p.final_rank, p.rerank_score) for p in outcome.pool),
        query_embedding=outcome.query_embedding if with_embedding else None, forget_version=forget_version)


def outcome_record(message: schemas.Outcome) -> Outcome:
    """The core outcome of a validated stream message (what :func:`mnemos.suppression.outcome_deltas` reads)."""
    return Outcome(outcome_id=message.outcome_id, tenant_id=message.tenant_id, cluster=message.cluster,
                   pool_size=message.pool_size,
                   pool=tuple(PoolEntry(p.entry_id, p.initial_rank, p.final_rank, p.rerank_score)
                              for p in message.pool),
                   query_embedding=message.query_embedding)


def _qualifiers(q: Qualifiers) -> wire_packets.Qualifiers:
    return wire_packets.Qualifiers(session_id=q.session_id, role=q.role, occurred_at=q.occurred_at,
                                   aliases=tuple(q.aliases), session_date=q.session_date)


def packet_message(packet: Packet) -> wire_packets.Packet:
    """The wire form of a core packet: every item with its qualifiers, the ``line`` its tokens were
    counted on (:func:`mnemos.packets.render_line`) and the ``header`` of its session group, every
    omission with its reason's value."""
    items = tuple(wire_packets.PacketItem(entry_id=i.entry_id, turn_id=i.turn_id, text=i.text, score=float(i.score),
                                          tokens=i.tokens, qualifiers=_qualifiers(i.qualifiers),
                                          line=render_line(i.text, i.qualifiers), header=i.header)
                  for i in packet.items)
    omitted = tuple(wire_packets.OmittedItem(entry_id=o.entry_id, turn_id=o.turn_id, reason=o.reason.value,
                                             score=None if o.score is None else float(o.score), tokens=o.tokens,
                                             because_of=o.because_of) for o in packet.omitted)
    return wire_packets.Packet(items=items, omitted=omitted, budget_tokens=packet.budget_tokens,
                               used_tokens=packet.used_tokens)
