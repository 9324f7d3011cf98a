"""``mnemos bench scale``: a large tenant, many tenants and shards, measured through the service.

Every phase runs the real service on a database and stream prefix of its own (:mod:`bench.common.harness`):
ingest workers and query workers as processes, turns published through the turns stream, questions
asked through rq. The data is a LongMemEval file (the S file's haystacks; :mod:`bench.scale.data`).

* ``large`` (this module): one tenant of ``--large-turns`` turns and one of ``--small-turns``,
  published together (ingest turns/s, first XADD to last commit). Then a fresh query worker is
  started and asked one question of the large tenant: the cold start is the first request's
  ``refresh`` stage (reading the tenant's rows from Postgres and building the index) plus its
  ``bm25`` stage (the BM25 matrix is built lazily, by the first search); the request's wall time
  and a second, warm request of the same question are reported beside it. The memory per stored
  turn is the query worker's estimate of the loaded index (the gauge
  ``mnemos_query_tenant_cache_bytes``, the figure ``MNEMOS_INDEX_MEMORY_MB`` budgets) divided by
  the stored turns, and, beside it, the growth of the process's resident set across that request.
  Next, ``--queries`` questions alternate between the two tenants (p50/p95 of each, and the ratio
  of the p50s), and ``--probes`` times ``--probe-turns`` new turns arrive at the large tenant: the
  time from their XADD until a retrieval (filtered to their session) returns every one of them.
* ``many`` and ``shards``: :mod:`bench.scale.tenants`; ``reshard`` (N to N + 1 shards with turns
  in flight): :mod:`bench.scale.reshard`; the command and the result file: :mod:`bench.scale.cli`.

Every phase uses the ``hybrid_rerank`` knobs of ``bench speed`` (no suppression, no deep pass) and
switches the reranker's score cache off (``MNEMOS_RERANK_CACHE_PAIRS=0``), so that every request pays
the cross-encoder and latencies compare index sizes, not cache luck. Job and client timeouts are
raised to 30 minutes and the workers' statement timeout is off, so a slow cold load is measured, not
killed. ``--json`` keeps the blocks of phases not run this time from an existing file, so phases
can be run one at a time into one result. Numbers, not assertions: run it alone on the machine.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from tqdm import tqdm

from api.validation import limits_of
from bench.common.datasets import Conversation
from bench.common.harness import ServiceRun, isolated_settings, percentile, publish_tenants, running_service
from bench.scale.data import cycled, haystack_pool, question_texts
from bench.scale.probe import (
    ALIASES,
    CACHE_BYTES,
    CACHE_MISSES,
    QueryProcess,
    memory_of,
    scrape,
    start_query_worker,
    with_free_ports,
)
from workers.settings import Settings

log = logging.getLogger(__name__)

LARGE, SMALL = "scale-large", "scale-small"
PHASES = ("large", "many", "shards", "reshard")
LONG_WAIT_S = 1800
LARGE_PHASE_MEMORY_MB = 32_768
"""``MNEMOS_INDEX_MEMORY_MB`` of the large phase's query worker: both tenants' indexes stay cached,
so the phase times an index, not eviction (the ``many`` phase measures eviction). Under a budget
smaller than the large index, every request of the small tenant evicts it and the next one of the
large tenant reloads it from Postgres."""


@dataclass(frozen=True)
class ScaleOptions:
    """What ``mnemos bench scale`` measures and on how much (the command's options)."""

    data: Path
    phases: tuple[str, ...] = PHASES
    reranker: str | None = None
    large_turns: int = 200_000
    small_turns: int = 6_000
    queries: int = 100
    probes: int = 3
    probe_turns: int = 5
    tenants: int = 500
    memory_mb: int | None = None  # None: the settings' MNEMOS_INDEX_MEMORY_MB
    requests: int = 2_000
    zipf_s: float = 1.1
    shards: int = 2
    shard_tenants: int = 40
    shard_requests: int = 200
    k: int = 10
    seed: int = 0


def scale_settings(base: Settings, *, reranker: str | None, stamp: str) -> Settings:
    """Settings of one phase: its own database and prefix, the ``hybrid_rerank`` knobs, no rerank
    cache, long timeouts, metrics on free ports (module docstring)."""
    settings = isolated_settings(base, stamp=stamp, cross_encoder=reranker, suppression=False, deep_threshold=None)
    return with_free_ports(settings.replace(rerank_cache_pairs=0, job_timeout_s=max(base.job_timeout_s, LONG_WAIT_S),
                                            retrieve_timeout_s=max(base.retrieve_timeout_s, float(LONG_WAIT_S)),
                                            db_statement_timeout_s=None))


def phase_stamp() -> str:
    """A phase's name part (the time and a random token): two phases never share a database."""
    return f"{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:6]}"


def latency_summary(seconds: Sequence[float], stages: Sequence[Mapping[str, float]]) -> dict[str, Any]:
    """n, p50 and p95 of client wall ``seconds`` and the p50 of every worker stage."""
    return {"n": len(seconds), "p50_s": percentile(seconds, 50), "p95_s": percentile(seconds, 95),
            "stage_p50_s": {key: percentile([s.get(key, 0.0) for s in stages], 50)
                            for key in sorted({k for s in stages for k in s})}}


def load_seconds(stages: Mapping[str, float]) -> float:
    """Seconds a request spent bringing its tenant's index up to date: the ``refresh`` stage (rows
    read from Postgres, index extended or built) plus the ``bm25`` stage (the lazy BM25 build after
    any change, and one BM25 search)."""
    return stages.get("refresh", 0.0) + stages.get("bm25", 0.0)


def publish(run: ServiceRun, tenants: Sequence[tuple[str, Conversation]], what: str) -> dict[str, float]:
    """:func:`bench.common.harness.publish_tenants` with a progress bar of acknowledged turns."""
    total = sum(len(c.turns) for _, c in tenants)
    click.echo(f"{what}: publishing {total} turns of {len(tenants)} tenants")
    with tqdm(total=total, desc=f"ingest ({what})", unit="turn", disable=None) as bar:
        return publish_tenants(run, tenants, timeout_s=86_400.0, progress=bar.update)


def cold_start(run: ServiceRun, worker: QueryProcess, query: str, stored: int, k: int) -> dict[str, Any]:
    """A fresh query worker's first request of the large tenant (it loads the index), then a second one."""
    before = memory_of(worker.process.pid)
    started = time.perf_counter()
    first = run.client.retrieve(LARGE, query, k=k)
    first_s = time.perf_counter() - started
    after = memory_of(worker.process.pid)
    changes, now = worker.metrics.delta()
    started = time.perf_counter()
    run.client.retrieve(LARGE, query, k=k)
    second_s = time.perf_counter() - started
    estimate = now.get(CACHE_BYTES)
    rss_growth = None if before is None or after is None else after["rss_bytes"] - before["rss_bytes"]
    return {"turns": stored, "worker_start_s": worker.start_s, "load_s": load_seconds(first.stage_seconds),
            "first_request_s": first_s, "second_request_s": second_s, "first_request_stages_s": first.stage_seconds,
            "loaded_from_postgres": changes.get(CACHE_MISSES, 0.0) == 1.0, "index_estimate_bytes": estimate,
            "bytes_per_turn": estimate / stored if estimate is not None and stored else None,
            "memory_before": before, "memory_after": after, "rss_growth_bytes": rss_growth,
            "rss_bytes_per_turn": rss_growth / stored if rss_growth is not None and stored else None}


def compare_latency(run: ServiceRun, queries: Sequence[str], k: int) -> dict[str, Any]:
    """The same questions asked of the large and the small tenant in turn (the small one loaded first)."""
    started = time.perf_counter()
    run.client.retrieve(SMALL, queries[0], k=k)
    small_load_s = time.perf_counter() - started
    seconds: dict[str, list[float]] = {LARGE: [], SMALL: []}
    stages: dict[str, list[Mapping[str, float]]] = {LARGE: [], SMALL: []}
    for query in tqdm(queries, desc="queries large/small", unit="q", disable=None):
        for tenant in (LARGE, SMALL):
            started = time.perf_counter()
            result = run.client.retrieve(tenant, query, k=k)
            seconds[tenant].append(time.perf_counter() - started)
            stages[tenant].append(result.stage_seconds)
    large, small = latency_summary(seconds[LARGE], stages[LARGE]), latency_summary(seconds[SMALL], stages[SMALL])
    return {"large": large, "small": small, "small_first_request_s": small_load_s,
            "p50_ratio": large["p50_s"] / small["p50_s"] if small["p50_s"] > 0 else None}


def refresh_probe(run: ServiceRun, number: int, turns: int, k: int, timeout_s: float = LONG_WAIT_S) -> dict[str, Any]:
    """``turns`` new turns (one new session) at the large tenant: seconds from their XADD to their
    commit, and to the first retrieval, filtered to their session, that returns all of them."""
    session = f"refresh-probe-{number}-{uuid.uuid4().hex[:8]}"
    now = datetime.now(UTC).isoformat()
    messages = [{"tenant_id": LARGE, "session_id": session, "turn_id": f"{session}:{i}", "role": "user",
                 "text": f"Refresh probe {number}.{i}: the locker code is {uuid.uuid4().hex[:6]}.", "occurred_at": now}
                for i in range(turns)]
    wanted = {str(m["turn_id"]) for m in messages}
    started = time.perf_counter()
    run.client.publish_turns(messages)
    while True:
        with run.store.tenant(LARGE) as tx:
            if len(tx.stored_turns(sorted(wanted))) == len(wanted):
                break
        if time.perf_counter() - started > timeout_s:
            raise click.ClickException(f"probe {session} was not stored within {timeout_s}s")
        time.sleep(0.005)
    committed_s = time.perf_counter() - started
    while True:
        result = run.client.retrieve(LARGE, str(messages[0]["text"]), k=max(k, turns),
                                     filters={"session_ids": [session]})
        if wanted <= {t for h in result.hits for t in (h.turn_id, *h.aliases)}:
            break
        if time.perf_counter() - started > timeout_s:
            raise click.ClickException(f"probe {session} was stored but not returned within {timeout_s}s")
    return {"committed_s": committed_s, "retrievable_s": time.perf_counter() - started,
            "index_update_s": load_seconds(result.stage_seconds), "request_stages_s": result.stage_seconds}


def refresh_probes(run: ServiceRun, probes: int, turns: int, k: int) -> dict[str, Any]:
    rows = [refresh_probe(run, number, turns, k) for number in tqdm(range(probes), desc="refresh probes",
                                                                     disable=None)]
    return {"probes": probes, "turns_per_probe": turns,
            **{f"{key}_{q}": percentile([r[key] for r in rows], n) for key in ("committed_s", "retrievable_s",
                                                                               "index_update_s")
               for q, n in (("p50", 50), ("p95", 95))},
            "rows": rows}


def large_phase(base: Settings, options: ScaleOptions, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """The ``large`` phase (module docstring)."""
    settings = scale_settings(base, reranker=options.reranker, stamp=phase_stamp()).replace(
        index_memory_mb=max(base.index_memory_mb, LARGE_PHASE_MEMORY_MB))
    pool = haystack_pool(conversations, limits_of(settings))
    large = Conversation(LARGE, tuple(cycled(pool.turns, options.large_turns)), ())
    small = Conversation(SMALL, tuple(cycled(pool.turns, options.small_turns)), ())
    queries = question_texts(conversations, max(options.queries, 1), options.seed)
    with running_service(settings, ("ingest",)) as run:
        ingest = publish(run, [(LARGE, large), (SMALL, small)], "large and small tenant")
        stored = {tenant: run.stored(tenant) for tenant in (LARGE, SMALL)}
        aliases = scrape(settings.ingest_metrics_port).get(ALIASES)
        click.echo(f"ingested {ingest['ingest_turns_per_s']:.1f} turns/s; stored {stored}")
        worker = start_query_worker(run, settings)
        cold = cold_start(run, worker, queries[0], stored[LARGE], options.k)
        click.echo(f"cold start of {stored[LARGE]} turns: {cold['load_s']:.2f}s; "
                   f"{cold['bytes_per_turn']} bytes per turn (estimate)")
        latency = compare_latency(run, queries[:options.queries] or queries, options.k)
        refresh = refresh_probes(run, options.probes, options.probe_turns, options.k)
    return {"large_turns": stored[LARGE], "small_turns": stored[SMALL], "aliases_stored": aliases,
            "distinct_pool_turns": len(pool.turns),
            "pool_turns_refused": pool.refused, "large_turns_requested": options.large_turns,
            "small_turns_requested": options.small_turns, "index_memory_mb": settings.index_memory_mb,
            "ingest": ingest, "cold_start": cold, "queries": latency,
            "refresh": refresh}


def headline(phases: dict[str, Any]) -> dict[str, Any]:
    """The top-level figures from the phase blocks (None for a phase never run)."""
    large, many = phases.get("large"), phases.get("many")
    cold = large["cold_start"] if large else {}
    return {"p50_ratio_200k_vs_6k": large["queries"]["p50_ratio"] if large else None,
            "cold_start_s_200k": cold.get("load_s"), "cold_start_turns": cold.get("turns"),
            "bytes_per_turn": cold.get("bytes_per_turn"), "bytes_per_turn_rss": cold.get("rss_bytes_per_turn"),
            "ingest_turns_per_s": large["ingest"]["ingest_turns_per_s"] if large else None,
            "refresh_retrievable_p50_s": large["refresh"]["retrievable_s_p50"] if large else None,
            "eviction_hit_rate": many["eviction_hit_rate"] if many else None,
            "shards": phases.get("shards"), "reshard": phases.get("reshard")}

