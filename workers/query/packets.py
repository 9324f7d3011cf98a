"""Evidence packets in the query worker: building one after a retrieval, and the packet cache.

A request with ``budget_tokens`` is answered as any other (:func:`mnemos.pipeline.retrieve`, asked
to keep its retrievers' unfiltered lists when a filter restricts it), then :func:`build_packet`
turns the retrieval's reranked pool into an evidence packet
(:func:`mnemos.packets.packet_from_index`, tokens counted by the cross-encoder's tokenizer) with
the candidates the request's filter hid (:func:`mnemos.packets.hidden_candidates`, ranked from
those lists: the packet never searches again) in its omission report (docs/architecture.md
"Evidence packets").

The whole answer (hits and packet) is cached in a :class:`PacketCache`, an LRU keyed by
:class:`PacketKey`: tenant, query, k, filters, ``as_of``, budget, the tenant's memory and forget
versions, and the model versions (bi-encoder, rendering and dimension, cross-encoder). A repeated
request at an unchanged memory is answered from it: the query is still embedded (the cache is read
inside the snapshot that reads the versions, after the embedding), but nothing is retrieved,
reranked or selected again, and no outcome is sent (no new retrieval for suppression to learn from). The suppression version is not in the key: a cached
answer is the one built under the suppression state of its first request. When a tenant's index
is dropped (a forget, LRU, another embedding version) its cached packets go too, so a forgotten
turn's text does not outlive it here either.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from api import schemas
from api.packets import Packet
from mnemos.filters import EntryFilter
from mnemos.packets import PacketConfig, Relevance, TokenCounter, hidden_candidates, packet_from_index
from mnemos.records import RetrievalResult
from mnemos.tenant_index import TenantIndex
from workers.runtime.wire import packet_message
from workers.settings import Settings

__all__ = ["PacketCache", "PacketKey", "build_packet", "packet_config"]


def packet_config(settings: Settings, *, reranked: bool) -> PacketConfig:
    """The packet knobs of ``settings``; relevance from logits when the pool was reranked, else min-max."""
    return PacketConfig(mmr_lambda=settings.packet_mmr_lambda,
                        redundancy_threshold=settings.packet_redundancy_threshold,
                        session_share=settings.packet_session_share,
                        token_exponent=settings.packet_token_exponent,
                        relevance=Relevance.SIGMOID if reranked else Relevance.MINMAX)


@dataclass(frozen=True)
class PacketKey:
    """What a cached answer depends on (module docstring); ``filters`` is the canonical JSON of the
    request's filters and ``models`` names every model version involved."""

    tenant_id: str
    query: str
    k: int
    filters: str
    as_of: datetime | None
    budget_tokens: int
    memory_version: int
    forget_version: int
    models: str

    @classmethod
    def of(cls, request: schemas.RetrievalRequest, memory_version: int, forget_version: int,
           models: str) -> PacketKey | None:
        """The key of a packet request (None for a request without ``budget_tokens``)."""
        if request.budget_tokens is None:
            return None
        filters = "" if request.filters is None else json.dumps(request.filters.to_payload(), sort_keys=True)
        return cls(request.tenant_id, request.query, request.k, filters, request.as_of, request.budget_tokens,
                   memory_version, forget_version, models)


class PacketCache:
    """LRU of answered packet requests (:class:`~api.schemas.RetrievalResult` with a packet), at most
    ``max_entries`` (0: nothing is kept)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._answers: OrderedDict[PacketKey, schemas.RetrievalResult] = OrderedDict()

    def __len__(self) -> int:
        return len(self._answers)

    def get(self, key: PacketKey) -> schemas.RetrievalResult | None:
        answer = self._answers.get(key)
        if answer is not None:
            self._answers.move_to_end(key)
        return answer

    def put(self, key: PacketKey, answer: schemas.RetrievalResult) -> None:
        if self.max_entries <= 0:
            return
        self._answers[key] = answer
        self._answers.move_to_end(key)
        while len(self._answers) > self.max_entries:
            self._answers.popitem(last=False)

    def discard_tenant(self, tenant_id: str) -> int:
        """Drop every cached answer of ``tenant_id``; returns how many."""
        keys = [key for key in self._answers if key.tenant_id == tenant_id]
        for key in keys:
            del self._answers[key]
        return len(keys)


def build_packet(index: TenantIndex, request: schemas.RetrievalRequest, allowed: EntryFilter | None,
                 core: RetrievalResult, settings: Settings, count_tokens: TokenCounter) -> Packet:
    """The wire packet of one answered request (``request.budget_tokens`` set) from its core result,
    ``allowed`` being the core filter the retrieval ran under (:func:`workers.runtime.wire.entry_filter` of
    the request, converted once by the caller). The hidden candidates come from the retrieval's
    ``core.unfiltered`` lists (retrieved with ``unfiltered=True``); nothing is searched here."""
    assert request.budget_tokens is not None
    config = packet_config(settings, reranked=core.pool_size > 0)
    hidden = hidden_candidates(index, core.unfiltered, allowed, depth=settings.n_candidates,
                               limit=config.hidden_reported, rrf_k=settings.rrf_k)
    packet = packet_from_index(index, core.ranking, request.budget_tokens, count_tokens, config,
                               as_of=request.as_of, hidden=hidden, allowed=allowed)
    return packet_message(packet)
