"""Property (hypothesis): over random multi-tenant corpora and queries, no request of tenant A
returns, scores, counts or suppresses anything of another tenant, on every retrieval path.

Core level with fakes (HashingEncoder, FakeReranker behind a CachedReranker shared by all
tenants), fast and bounded. Entry ids are global, as Postgres hands them out, and tenants share
a small vocabulary, so identical texts across tenants are common. A's result in the shared world
(indexes grown incrementally in arrival order, the cached-index path) must equal its result in a
world where only A exists (one fresh build): nothing about B may change what A sees or how it is
scored.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mnemos.encoder import HashingEncoder
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Entry
from mnemos.rerank import CachedReranker, FakeReranker
from mnemos.suppression import SuppressionTable, UpdateRule, outcome_deltas
from mnemos.tenant_index import TenantIndex

VOCAB = ["coffee", "cat", "pixel", "lisbon", "key", "mat", "quick", "fox", "dog", "the", "a", "blue", "river",
         "tuesday", "🎉", "?!"]
DIM = 32
ENCODER = HashingEncoder(DIM)
T0 = datetime(2024, 1, 1, tzinfo=UTC)

PATHS = {
    "hybrid+rerank": RetrievalConfig(n_candidates=6, pool_size=4, deep_pool_size=8, deep_threshold=None),
    "bm25 only": RetrievalConfig(n_candidates=6, pool_size=4, use_dense=False, deep_threshold=None),
    "dense only": RetrievalConfig(n_candidates=6, pool_size=4, use_bm25=False, deep_threshold=None),
    "no rerank": RetrievalConfig(n_candidates=6, pool_size=4, rerank=False),
    "deep pass": RetrievalConfig(n_candidates=3, pool_size=2, deep_pool_size=9, deep_threshold=1e9),
}


@dataclass(frozen=True)
class World:
    order: tuple[tuple[str, str], ...]  # (tenant, text) in arrival order; entry id = position + 1


text_st = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=4).map(" ".join)
world_st = st.lists(st.tuples(st.sampled_from(["A", "B", "C"]), text_st), min_size=1, max_size=30).map(
    lambda rows: World(tuple(rows)))
query_st = st.lists(st.sampled_from([*VOCAB, "zzz"]), min_size=1, max_size=3).map(" ".join).filter(str.strip)


def entries_of(world: World, tenant: str) -> list[Entry]:
    return [Entry(i + 1, t, f"turn-{i + 1}", "s1", "user", text, T0) for i, (t, text) in enumerate(world.order)
            if t == tenant]


def grown_indexes(world: World, chunk: int) -> dict[str, TenantIndex]:
    """Every tenant's index, extended in arrival order ``chunk`` turns at a time (the cached path)."""
    indexes = {t: TenantIndex(t, DIM) for t in ("A", "B", "C")}
    for start in range(0, len(world.order), chunk):
        for tenant, index in indexes.items():
            new = [e for e in entries_of(world, tenant) if start < e.entry_id <= start + chunk]
            if new:
                index.add(new, ENCODER.encode([e.text for e in new]), version=index.version + 1)
    return indexes


def fresh_index(world: World, tenant: str) -> TenantIndex:
    own = entries_of(world, tenant)
    index = TenantIndex(tenant, DIM)
    if own:
        index.add(own, ENCODER.encode([e.text for e in own]))
    return index


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(world=world_st, queries=st.lists(query_st, min_size=1, max_size=3), chunk=st.integers(1, 7),
       path=st.sampled_from(sorted(PATHS)), k=st.integers(1, 12), with_suppression=st.booleans())
def test_no_request_of_a_tenant_touches_another(world: World, queries: list[str], chunk: int, path: str, k: int,
                                                with_suppression: bool) -> None:
    config = PATHS[path]
    shared = grown_indexes(world, chunk)
    shared_reranker = CachedReranker(FakeReranker())  # one cache for every tenant
    all_ids = {t: {e.entry_id for e in entries_of(world, t)} for t in ("A", "B", "C")}
    # a suppression table that also (wrongly) holds other tenants' ids: they must never matter
    poisoned = {(eid, 0): 5.0 for eid in range(1, len(world.order) + 1)}
    for tenant in ("A", "B", "C"):
        own, others = all_ids[tenant], set().union(*(v for t, v in all_ids.items() if t != tenant))
        alone = fresh_index(world, tenant)
        table = SuppressionTable(poisoned) if with_suppression else None
        for query in queries:
            q = ENCODER.encode([query])[0]
            got = retrieve(shared[tenant], query, q, k=k, config=config, reranker=shared_reranker,
                           suppression=table, cluster=0 if with_suppression else None, outcome_id="o")
            ref = retrieve(alone, query, q, k=k, config=config, reranker=FakeReranker(),
                           suppression=SuppressionTable({key: s for key, s in poisoned.items() if key[0] in own})
                           if with_suppression else None, cluster=0 if with_suppression else None, outcome_id="o")
            hit_ids = [h.entry_id for h in got.hits]
            assert set(hit_ids) <= own and not set(hit_ids) & others
            assert hit_ids == [h.entry_id for h in ref.hits]  # B cannot change what A sees ...
            assert [h.score for h in got.hits] == pytest.approx([h.score for h in ref.hits], rel=1e-6, abs=1e-9)
            assert (got.pool_size, got.deep_pass) == (ref.pool_size, ref.deep_pass)  # ... or counts
            assert len(got.hits) <= min(k, len(own))
            if got.outcome is not None:
                assert got.outcome.tenant_id == tenant
                assert {p.entry_id for p in got.outcome.pool} <= own
                deltas = outcome_deltas(got.outcome, UpdateRule.RANK_GAP, 0.1, cluster=0)
                assert {eid for eid, _ in deltas} <= own  # ... or what A's outcome suppresses


def test_the_property_can_fail_when_indexes_are_shared() -> None:
    """The oracle is not vacuous: a single index holding two tenants' entries is caught."""
    world = World((("A", "quick fox"), ("B", "quick fox"), ("B", "quick dog")))
    mixed = TenantIndex("A", DIM)
    entries = [Entry(i + 1, "A", f"turn-{i + 1}", "s1", "user", text, T0) for i, (_, text) in enumerate(world.order)]
    mixed.add(entries, ENCODER.encode([e.text for e in entries]))
    q = ENCODER.encode(["quick"])[0]
    got = retrieve(mixed, "quick", q, k=5, config=PATHS["bm25 only"], reranker=FakeReranker())
    ref = retrieve(fresh_index(world, "A"), "quick", q, k=5, config=PATHS["bm25 only"], reranker=FakeReranker())
    assert {h.entry_id for h in got.hits} - {1} and [h.entry_id for h in ref.hits] == [1]
    assert np.isfinite([h.score for h in got.hits]).all()
