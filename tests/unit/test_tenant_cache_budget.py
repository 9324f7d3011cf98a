"""The query worker's tenant cache under a memory budget (workers/query/tenant_cache.py), against the
in-memory store (tests/unit/worker_fakes.py).

Least recently used tenant indexes are evicted once the estimated bytes of all of them exceed the
budget (``MNEMOS_INDEX_MEMORY_MB``), in the order an LRU oracle gives for a seeded access pattern;
the count cap still holds; an evicted tenant is reloaded on its next request and answers exactly as
before; hits, misses, evictions and the cached bytes reach the metrics.
"""

from __future__ import annotations

import random
from collections import OrderedDict

import pytest

from api.schemas import RetrievalRequest
from tests.unit.worker_fakes import RecordingRedis, conversation, ingest_worker, query_service, unit_settings
from workers.query.worker import QueryService
from workers.store import FakeStore

TENANTS = [f"t{i}" for i in range(6)]  # equal lengths: equal index sizes


def _service(max_bytes: int | None = None, **settings: object) -> QueryService:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    for number, tenant in enumerate(TENANTS):
        worker.handle(conversation(tenant, first_id=100 * number + 1))
    service = query_service(store, redis, unit_settings(**settings))
    if max_bytes is not None:
        service.cache.max_bytes = max_bytes  # the setting is in MiB; these tenants take tens of KiB
    return service


def _ask(service: QueryService, tenant: str, query: str = "cello teacher") -> tuple[tuple[str, float], ...]:
    result = service.answer(RetrievalRequest(tenant, query, k=3, request_id="same"))
    return tuple((h.turn_id, h.score) for h in result.hits)


def _size_of_one() -> int:
    service = _service()
    _ask(service, TENANTS[0])
    return service.cache.total_bytes


def test_least_recently_used_indexes_go_first_to_keep_the_budget() -> None:
    size = _size_of_one()
    service = _service(max_bytes=int(3.5 * size))  # room for three
    for tenant in ("t0", "t1", "t2", "t0", "t3"):
        _ask(service, tenant)
    assert service.cache.tenants() == ["t2", "t0", "t3"]  # t1 was the least recently used
    _ask(service, "t4")
    assert service.cache.tenants() == ["t0", "t3", "t4"]
    _ask(service, "t1")  # reloaded
    assert service.cache.tenants() == ["t3", "t4", "t1"]
    stats = service.cache.stats
    assert (stats.hits, stats.misses, stats.evictions) == (1, 6, 3)
    assert service.cache.total_bytes <= service.cache.max_bytes


def test_a_seeded_access_pattern_evicts_as_an_lru_oracle_and_never_exceeds_the_budget() -> None:
    size = _size_of_one()
    budget = int(2.5 * size)
    service = _service(max_bytes=budget)
    rng = random.Random(7)
    oracle: OrderedDict[str, None] = OrderedDict()
    hits = evictions = 0
    for tenant in (rng.choice(TENANTS[:4]) for _ in range(40)):
        hits += tenant in oracle
        oracle[tenant] = None
        oracle.move_to_end(tenant)
        while len(oracle) > 2:  # two fit in 2.5 tenants' bytes
            oracle.popitem(last=False)
            evictions += 1
        _ask(service, tenant)
        assert service.cache.tenants() == list(oracle)
        assert service.cache.total_bytes <= budget
    assert (service.cache.stats.hits, service.cache.stats.evictions) == (hits, evictions)


def test_the_count_cap_still_holds_under_a_large_budget() -> None:
    service = _service(max_cached_tenants=2)
    for tenant in TENANTS[:4]:
        _ask(service, tenant)
    assert service.cache.tenants() == ["t2", "t3"] and service.cache.stats.evictions == 2


def test_an_evicted_tenant_is_reloaded_and_answers_identically() -> None:
    service = _service(max_bytes=1)  # every other tenant is evicted: one index at a time
    queries = ("cello teacher", "grey cat named Pixel", "bread in Porto")
    first = [_ask(service, "t0", q) for q in queries]
    assert all(first)
    _ask(service, "t1")
    assert service.cache.tenants() == ["t1"]
    assert [_ask(service, "t0", q) for q in queries] == first
    assert (service.cache.stats.misses, service.cache.stats.evictions) == (3, 2)


def test_one_tenant_larger_than_the_budget_is_still_served() -> None:
    service = _service(max_bytes=1)
    assert _ask(service, "t5")
    assert service.cache.tenants() == ["t5"] and service.cache.total_bytes > 1


def test_the_cache_counts_and_size_reach_the_metrics() -> None:
    size = _size_of_one()
    service = _service(max_bytes=int(1.5 * size))
    for tenant in ("t0", "t0", "t1"):
        _ask(service, tenant)
    m = service.metrics
    assert (m.tenant_cache_hits._value.get(), m.tenant_cache_misses._value.get(),
            m.tenant_cache_evictions._value.get()) == (1, 2, 1)
    assert m.tenant_cache_bytes._value.get() == service.cache.total_bytes == pytest.approx(size, rel=0.05)
    assert m.tenant_cache_tenants._value.get() == 1
    service.answer(RetrievalRequest("nobody", "cello"))  # an unknown tenant: neither a hit nor a miss
    assert (m.tenant_cache_hits._value.get(), m.tenant_cache_misses._value.get()) == (1, 2)
