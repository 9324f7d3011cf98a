"""The ``many`` and ``shards`` phases of ``mnemos bench scale`` (:mod:`bench.scale.run`).

* ``many``: ``--tenants`` LongMemEval questions, each its own tenant holding its haystack
  (:func:`bench.scale.data.question_tenants`), are ingested; then one fresh query worker with
  ``MNEMOS_INDEX_MEMORY_MB`` = ``--memory-mb`` answers ``--requests`` requests, each tenant's own
  question, whose tenants are drawn from a Zipf law of exponent ``--zipf-s`` over a seeded ranking
  (:func:`bench.scale.data.zipf_draws`). After each request the worker's
  ``mnemos_query_tenant_cache_hits_total`` / ``_misses_total`` say whether the tenant's index was
  still cached (the worker answers one job at a time). ``eviction_hit_rate`` is the share of all
  requests that hit; a tenant's first request cannot, so the hit rate of a cache that never evicts
  (``1 - tenants requested / requests``) and the hit rate over the other requests are given beside
  it. A reload is a miss of a tenant asked before (its index was evicted); its time is the request's
  ``refresh`` plus ``bm25`` stages (:func:`bench.scale.run.load_seconds`).
* ``shards``: ``--shard-tenants`` such tenants on ``--shards`` shards (``MNEMOS_SHARDS``), an
  ingest and a query worker per shard, each with ``MNEMOS_SHARD`` set, as deployed
  (docs/scaling.md). ``--shard-requests`` requests go round the tenants; the shard that served each
  one is read from its rq job (the worker that ran it, among each shard queue's workers) and
  compared with :func:`api.sharding.shard_of`; each shard's workers also count what they did
  (``mnemos_query_jobs_total``; ``mnemos_ingest_turns_indexed_total`` plus ``_duplicates_total``,
  the turns stored as canonical entries and as aliases).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import click
import numpy as np
from tqdm import tqdm

from api.validation import limits_of
from bench.common.datasets import Conversation
from bench.common.harness import ServiceRun, percentile, running_service
from bench.scale.data import question_tenants, zipf_draws
from bench.scale.probe import (
    ALIASES,
    CACHE_BYTES,
    CACHE_EVICTIONS,
    CACHE_HITS,
    CACHE_MISSES,
    CACHE_TENANTS,
    JOBS_OK,
    TURNS_INDEXED,
    QueryProcess,
    query_worker_shards,
    scrape,
    served_by,
    start_query_worker,
    with_free_ports,
)
from bench.scale.run import ScaleOptions, load_seconds, phase_stamp, publish, scale_settings
from workers.settings import Settings


def _question(tenant: Conversation) -> str:
    return tenant.questions[0].text if tenant.questions else "What did we talk about?"


def zipf_requests(run: ServiceRun, worker: QueryProcess, tenants: Sequence[Conversation], draws: np.ndarray,
                  k: int) -> list[dict[str, Any]]:
    """One row per request: tenant index, first request of its tenant, cache hit or miss, evictions,
    client seconds, load seconds, cached bytes and tenants after it."""
    rows, asked = [], set()
    for index in tqdm(draws, desc="zipf requests", unit="req", disable=None):
        tenant = tenants[int(index)]
        started = time.perf_counter()
        result = run.client.retrieve(tenant.conversation_id, _question(tenant), k=k)
        seconds = time.perf_counter() - started
        changes, now = worker.metrics.delta()
        rows.append({"tenant": int(index), "first": int(index) not in asked, "hit": changes.get(CACHE_HITS, 0.0) > 0,
                     "miss": changes.get(CACHE_MISSES, 0.0) > 0, "evictions": int(changes.get(CACHE_EVICTIONS, 0.0)),
                     "seconds": seconds, "load_s": load_seconds(result.stage_seconds),
                     "cached_bytes": now.get(CACHE_BYTES, 0.0), "cached_tenants": now.get(CACHE_TENANTS, 0.0)})
        asked.add(int(index))
    return rows


def _p50_p95(values: Sequence[float], name: str) -> dict[str, Any]:
    return {f"{name}_n": len(values), f"{name}_p50_s": percentile(values, 50) if values else None,
            f"{name}_p95_s": percentile(values, 95) if values else None}


def summarise_requests(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Hit rates, reload and request percentiles of :func:`zipf_requests` rows (module docstring)."""
    n = len(rows)
    hits = sum(r["hit"] for r in rows)
    first = sum(r["first"] for r in rows)
    later = [r for r in rows if not r["first"]]
    return {"requests": n, "hits": hits, "misses": sum(r["miss"] for r in rows),
            "unclassified": sum(not r["hit"] and not r["miss"] for r in rows), "tenants_requested": first,
            "evictions": sum(r["evictions"] for r in rows),
            "eviction_hit_rate": hits / n if n else None,
            "hit_rate_without_eviction": (n - first) / n if n else None,
            "hit_rate_after_first_request": sum(r["hit"] for r in later) / len(later) if later else None,
            **_p50_p95([r["load_s"] for r in later if r["miss"]], "reload"),
            **_p50_p95([r["load_s"] for r in rows if r["first"]], "first_load"),
            **_p50_p95([r["load_s"] for r in rows if r["hit"]], "hit_load"),
            **_p50_p95([r["seconds"] for r in rows], "request"),
            **_p50_p95([r["seconds"] for r in rows if r["hit"]], "hit_request"),
            **_p50_p95([r["seconds"] for r in rows if r["miss"]], "miss_request"),
            "max_cached_bytes": max((r["cached_bytes"] for r in rows), default=0.0),
            "max_cached_tenants": max((r["cached_tenants"] for r in rows), default=0.0)}


def many_phase(base: Settings, options: ScaleOptions, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """The ``many`` phase (module docstring)"""
    settings = scale_settings(base, reranker=options.reranker, stamp=phase_stamp())
    settings = settings.replace(index_memory_mb=options.memory_mb or base.index_memory_mb)
    tenants = question_tenants(conversations, options.tenants, limits_of(settings))
    draws = zipf_draws(len(tenants), options.requests, options.zipf_s, options.seed)
    with running_service(settings, ("ingest",)) as run:
        ingest = publish(run, [(t.conversation_id, t) for t in tenants], "many tenants")
        worker = start_query_worker(run, settings)
        rows = zipf_requests(run, worker, tenants, draws, options.k)
    summary = summarise_requests(rows)
    click.echo(f"{len(tenants)} tenants, {options.requests} requests (zipf s={options.zipf_s}): hit rate "
               f"{summary['eviction_hit_rate']}, reload p50 {summary['reload_p50_s']}")
    return {"tenants": len(tenants), "distinct_haystacks": min(len(conversations), len(tenants)),
            "turns": ingest["turns"], "ingest": ingest, "memory_mb": settings.index_memory_mb,
            "max_cached_tenants_setting": settings.max_cached_tenants, "zipf_s": options.zipf_s, "seed": options.seed,
            **summary, "requests_per_tenant_rank": _per_rank(draws, len(tenants))}


def _per_rank(draws: np.ndarray, n_tenants: int) -> list[int]:
    """Requests per tenant, most requested first (the realised Zipf curve)."""
    counts = [0] * n_tenants
    for index in draws:
        counts[int(index)] += 1
    return sorted(counts, reverse=True)


def shard_requests(run: ServiceRun, tenants: Sequence[Conversation], n: int, k: int) -> list[dict[str, Any]]:
    """``n`` requests round the tenants through ``run.client``: per request the tenant, the shard the
    client's ring routes it to and the shard whose query worker ran it (None: unknown, job expired)."""
    names = query_worker_shards(run)
    rows = []
    for number in tqdm(range(n), desc="sharded requests", unit="req", disable=None):
        tenant = tenants[number % len(tenants)]
        result = run.client.retrieve(tenant.conversation_id, _question(tenant), k=k)
        rows.append({"tenant": tenant.conversation_id, "shard": run.client.shard_of(tenant.conversation_id),
                     "served_by": served_by(run, tenant.conversation_id, result.request_id, names)})
    return rows


def shards_phase(base: Settings, options: ScaleOptions, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """The ``shards`` phase (module docstring)"""
    settings = scale_settings(base, reranker=options.reranker, stamp=phase_stamp()).replace(shards=options.shards)
    own = [with_free_ports(settings.replace(shard=shard)) for shard in range(options.shards)]
    tenants = question_tenants(conversations, options.shard_tenants, limits_of(settings))
    with running_service(settings, ("ingest", "query"), workers_of=own) as run:
        ingest = publish(run, [(t.conversation_id, t) for t in tenants], f"{options.shards} shards")
        rows = shard_requests(run, tenants, options.shard_requests, options.k)
        query = [scrape(s.query_metrics_port) for s in own]
        indexed = [scrape(s.ingest_metrics_port) for s in own]
        shard_of = {t.conversation_id: run.client.shard_of(t.conversation_id) for t in tenants}
    per_shard = []
    for shard in range(options.shards):
        mine = [t for t in tenants if shard_of[t.conversation_id] == shard]
        per_shard.append({"shard": shard, "tenants": len(mine), "turns_routed": sum(len(t.turns) for t in mine),
                          "turns_stored": indexed[shard].get(TURNS_INDEXED, 0.0) + indexed[shard].get(ALIASES, 0.0),
                          "aliases": indexed[shard].get(ALIASES),
                          "requests_routed": sum(r["shard"] == shard for r in rows),
                          "requests_served": sum(r["served_by"] == shard for r in rows),
                          "query_jobs_ok": query[shard].get(JOBS_OK),
                          "cached_tenants": query[shard].get(CACHE_TENANTS)})
    misrouted = sorted({r["tenant"] for r in rows if r["served_by"] is not None and r["served_by"] != r["shard"]})
    unknown = sum(r["served_by"] is None for r in rows)
    return {"shards": options.shards, "setting": f"MNEMOS_SHARDS={options.shards}", "tenants": len(tenants),
            "requests": len(rows), "ingest": ingest, "per_shard": per_shard, "misrouted_tenants": misrouted,
            "requests_served_by_unknown_worker": unknown,
            "every_tenant_served_by_its_shard": not misrouted and unknown == 0,
            "other_phases_shards": 1}
