"""The configured RRF constant reaches every fusion a retrieval runs: the turn candidates, the session
ranking of the session feature, and the hidden candidates an evidence packet reports (``MNEMOS_RRF_K``).

One constructed tenant, one turn per session, where k decides the order: BM25 ranks A then B (only
they hold "zebra"), the dense list ranks C, B, D, A, E. With k = 1, A (ranks 1 and 4: 1/2 + 1/5)
beats B (ranks 2 and 2: 2/3); with k = 60, B (2/62) beats A (1/61 + 1/64).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from api import schemas
from mnemos.features import Feature, FeatureSetting
from mnemos.filters import EntryFilter
from mnemos.packets import Omission, hidden_candidates, whitespace_tokens
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry
from mnemos.rerank import FakeReranker
from mnemos.tenant_index import TenantIndex
from workers.query.packets import build_packet
from workers.settings import Settings

T0 = datetime(2024, 1, 1, tzinfo=UTC)
QUERY = "zebra"
QUERY_VECTOR = np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32)
# name -> (text, cosine to the query); every vector is a unit row
TURNS = {"A": ("zebra zebra", 0.3), "B": ("zebra seen near the river bank today", 0.8),
         "C": ("apples and pears", 1.0), "D": ("a quiet afternoon", 0.6), "E": ("the allowed turn", -1.0)}
ORDER_K1 = ("A", "B", "C", "D")
ORDER_K60 = ("B", "A", "C", "D")


def _vector(cosine: float, axis: int) -> np.ndarray:
    vector = np.zeros(4, dtype=np.float32)
    vector[0] = cosine
    vector[axis] = np.sqrt(max(0.0, 1.0 - cosine * cosine))
    return vector


@pytest.fixture
def index() -> TenantIndex:
    index = TenantIndex("t1", 4)
    entries, vectors = [], []
    for number, (name, (text, cosine)) in enumerate(TURNS.items(), start=1):
        entries.append(Entry(entry_id=number, tenant_id="t1", turn_id=name, session_id=f"s{name}", role="user",
                             text=text, occurred_at=T0 + timedelta(minutes=number)))
        vectors.append(_vector(cosine, 1 + number % 3))
    index.add(entries, np.stack(vectors))
    return index


def _names(index: TenantIndex, entry_ids) -> tuple[str, ...]:
    return tuple(index.entry(eid).turn_id for eid in entry_ids)


def test_the_session_ranking_fuses_with_the_k_it_is_given(index: TenantIndex) -> None:
    k1 = index.sessions.rank(QUERY, QUERY_VECTOR, rrf_k=1)
    k60 = index.sessions.rank(QUERY, QUERY_VECTOR, rrf_k=60)
    assert k1[:4] == tuple(f"s{n}" for n in ORDER_K1)
    assert k60[:4] == tuple(f"s{n}" for n in ORDER_K60)
    assert index.sessions.rank(QUERY, QUERY_VECTOR) == k60  # the default is the one RRF constant


def test_the_session_feature_ranks_sessions_with_the_configured_k(index: TenantIndex) -> None:
    """The best session gets a boost that outweighs everything else: which one it is follows ``config.rrf_k``."""
    session = FeatureSetting(Feature.SESSION, {"top": 1, "weight": 10.0})
    tops = {}
    for rrf_k in (1, 60):
        config = RetrievalConfig(rrf_k=rrf_k, deep_threshold=None, suppression=False, features=(session,))
        result = retrieve(index, QUERY, QUERY_VECTOR, k=1, config=config, reranker=FakeReranker(fn=lambda q, t: 0.0),
                          outcome_id="o")
        tops[rrf_k] = result.hits[0].turn_id
    assert tops == {1: "A", 60: "B"}


def test_hidden_candidates_fuse_with_the_k_they_are_given(index: TenantIndex) -> None:
    only_e = EntryFilter(session_ids=frozenset({"sE"}))
    core = retrieve(index, QUERY, QUERY_VECTOR, k=1, config=RetrievalConfig(rerank=False), allowed=only_e,
                    unfiltered=True)
    orders = {rrf_k: _names(index, [o.entry_id for o in hidden_candidates(
        index, core.unfiltered, only_e, depth=10, limit=4, rrf_k=rrf_k)]) for rrf_k in (1, 60)}
    assert orders == {1: ORDER_K1, 60: ORDER_K60}


def test_the_query_workers_packet_reports_hidden_turns_in_the_order_of_its_rrf_k(index: TenantIndex) -> None:
    request = schemas.RetrievalRequest("t1", QUERY, k=1, budget_tokens=100,
                                       filters=schemas.RetrievalFilters(session_ids=("sE",)))
    only_e = EntryFilter(session_ids=frozenset({"sE"}))
    core = retrieve(index, QUERY, QUERY_VECTOR, k=1, config=RetrievalConfig(rerank=False), allowed=only_e,
                    unfiltered=True)
    orders = {}
    for rrf_k in (1, 60):
        packet = build_packet(index, request, only_e, core, Settings(rrf_k=rrf_k), whitespace_tokens)
        orders[rrf_k] = tuple(o.turn_id for o in packet.omitted if o.reason == Omission.FILTERED.value)
    assert orders == {1: ORDER_K1, 60: ORDER_K60}
