"""Write the Grafana dashboards of Mnemos as provisionable JSON (deploy/grafana/dashboards/*.json).

The dashboards are data: this module describes each panel (title, PromQL, unit) and renders the
Grafana JSON model (schemaVersion 39, Grafana 10/11). Edit the panels here, then run

    python deploy/grafana/generate.py

and commit the JSON beside it; tests/deploy fails when the two drift apart, and checks that every
expression parses and names only metrics that workers/runtime/metrics.py registers.

Every panel queries the raw metrics (not the recording rules of deploy/prometheus), so the
dashboards work before the rules are loaded, and every query selects the dashboard's namespace
variable (one environment at a time: a dev and a prod namespace are never added together). Replicas of a worker export the same stream and queue
gauges, so those are combined with max; counters and histograms are summed across replicas.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the model module beside this script

from grafana_model import (  # noqa: E402 (after the path)
    COLUMNS,
    DATASOURCE,
    ERROR,
    NAMESPACE,
    NAMESPACE_QUERY,
    RATE,
    SCHEMA_VERSION,
    Dashboard,
    Panel,
    Query,
    Row,
    dumps,
    file_name,
    quantile,
    rate,
    render,
    sel,
)

__all__ = ["COLUMNS", "DASHBOARDS", "DATASOURCE", "ERROR", "NAMESPACE", "NAMESPACE_QUERY", "OUT_DIR", "RATE",
           "SCHEMA_VERSION", "Dashboard", "Panel", "Query", "Row", "dumps", "file_name", "main", "quantile",
           "rate", "render", "sel"]

OUT_DIR = Path(__file__).resolve().parent / "dashboards"

def _workers_up(worker: str) -> Panel:
    return _stat(f"{worker.capitalize()} workers up", f"Replicas of the {worker} worker reporting mnemos_worker_up.",
                 "sum(mnemos_worker_up" + sel(f'worker="{worker}"') + ")", "up")


def _stat(title: str, description: str, expr: str, legend: str, unit: str = "short") -> Panel:
    """A small stat panel of one query, as the first row of every dashboard shows them."""
    return Panel(title, description, (Query(expr, legend),), unit=unit, kind="stat", width=6, height=4)


def _p50_p95(metric: str) -> tuple[Query, Query]:
    """A histogram's median and 95th percentile, as the queries of one panel (legends p50, p95)."""
    return Query(quantile(0.5, metric), "p50"), Query(quantile(0.95, metric), "p95")


def _stream_panels(group: str, what: str) -> tuple[Panel, ...]:
    group_sel = sel(f'group="{group}"')
    return (
        Panel(
            f"{what} stream backlog",
            f"Consumer group {group}: lag = entries not yet delivered to any consumer, pending = "
            "delivered but not acknowledged, length = entries kept in the stream.",
            (Query(f"max by (stream) (mnemos_stream_lag{group_sel})", "lag {{stream}}"),
             Query(f"max by (stream) (mnemos_stream_pending{group_sel})", "pending {{stream}}"),
             Query(f"max by (stream) (mnemos_stream_length{group_sel})", "length {{stream}}")),
        ),
    )


OVERVIEW = Dashboard(
    uid="mnemos-overview",
    title="Mnemos / Overview",
    description="Turns in, retrievals, per-stage latency, backlogs and errors of the whole service.",
    rows=(
        Row("Now", (
            _stat("Turns in", "Turns read from the turns stream per second.",
                  rate("mnemos_ingest_turns_read_total"), "turns/s", unit="reqps"),
            _stat("Retrievals", "Retrieval jobs finished per second (ok and error).",
                  rate("mnemos_query_jobs_total"), "jobs/s", unit="reqps"),
            _stat("Retrieval p95", "95th percentile of a retrieval job's total time.",
                  quantile(0.95, "mnemos_query_stage_seconds", selector='stage="total"'), "p95", unit="s"),
            _stat("Workers up", "Replicas reporting mnemos_worker_up, per worker.",
                  f"sum by (worker) (mnemos_worker_up{sel()})", "{{worker}}"),
        )),
        Row("Traffic", (
            Panel("Turns", "Turns read, indexed as new entries, and folded into an existing entry as duplicates.",
                  (Query(rate("mnemos_ingest_turns_read_total"), "read"),
                   Query(rate("mnemos_ingest_turns_indexed_total"), "indexed"),
                   Query(rate("mnemos_ingest_duplicates_total"), "duplicates")), unit="reqps"),
            Panel("Retrievals by status", "Retrieval jobs per second, by outcome.",
                  (Query(rate("mnemos_query_jobs_total", by="status"), "{{status}}"),), unit="reqps"),
        )),
        Row("What clients wait", (
            Panel("Retrieval end to end", "Seconds from a retrieval's enqueue to its end (queue wait plus work), "
                  "p50 and p95: what a client waits. The p95 alert reads this.",
                  _p50_p95("mnemos_query_end_to_end_seconds"), unit="s", width=8),
            Panel("Heartbeat age", "Seconds since each worker kind last renewed its heartbeat: it grows when "
                  "every loop of that kind is stuck (their /livez fails) or its pods are gone.",
                  (Query(f"time() - max by (worker) (mnemos_worker_heartbeat_timestamp_seconds{sel()})",
                         "{{worker}}"),), unit="s", width=8),
            Panel("Expired retrievals", "Retrieval jobs per second that left the queue unanswered (expired, or "
                  "given up by their client); they count as errors in the error alert.",
                  (Query(rate("mnemos_query_jobs_expired_total"), "expired"),), unit="reqps", width=8),
        )),
        Row("Latency per stage", (
            Panel("p50 per stage", "Median seconds spent in each retrieval stage.",
                  (Query(quantile(0.5, "mnemos_query_stage_seconds", by="stage"), "{{stage}}"),), unit="s"),
            Panel("p95 per stage", "95th percentile seconds spent in each retrieval stage.",
                  (Query(quantile(0.95, "mnemos_query_stage_seconds", by="stage"), "{{stage}}"),), unit="s"),
        )),
        Row("Backlog", (
            Panel("Stream lag", "Entries not yet delivered, per stream and consumer group.",
                  (Query(f"max by (stream, group) (mnemos_stream_lag{sel()})", "{{stream}} / {{group}}"),), width=6),
            Panel("Pending entries", "Entries delivered but not acknowledged, per stream and consumer group.",
                  (Query(f"max by (stream, group) (mnemos_stream_pending{sel()})", "{{stream}} / {{group}}"),), width=6),
            Panel("Retrieval queue", "rq jobs waiting for a query worker.",
                  (Query(f"max by (queue) (mnemos_queue_length{sel()})", "{{queue}}"),), width=6),
            Panel("Frozen tenants", "Tenants frozen by a tenant move (mnemos reshard move), per shard's directory; "
                  "one held for long is a stopped move (runbook MnemosTenantFrozen). Shards only.",
                  (Query(f"max by (directory) (mnemos_tenants_frozen{sel()})", "{{directory}}"),), width=6),
        )),
        Row("Agents (mnemos mcp)", (
            Panel("MCP tool calls", "Tool calls per second of the MCP servers, by tool and outcome (ok, or a tool "
                  "error the model reads: bad arguments, a timeout, Redis down, no memories).",
                  (Query(rate("mnemos_mcp_tool_calls_total", by="tool, outcome"), "{{tool}} {{outcome}}"),),
                  unit="reqps"),
            Panel("MCP tool time", "Seconds per MCP tool call as the server handled it (p50, p95, per tool).",
                  (Query(quantile(0.5, "mnemos_mcp_tool_seconds", by="tool"), "{{tool}} p50"),
                   Query(quantile(0.95, "mnemos_mcp_tool_seconds", by="tool"), "{{tool}} p95")), unit="s"),
        )),
        Row("Errors", (
            Panel("Failed retrievals", "Retrieval jobs per second that ended with status error.",
                  (Query(rate("mnemos_query_jobs_total", selector=ERROR), "errors"),), unit="reqps",
                  width=8),
            Panel("Dead letters", "Messages moved to a dead-letter stream per interval, by reason.",
                  (Query(f"sum by (reason) (increase(mnemos_dead_letters_total{sel()}[{RATE}]))", "{{reason}}"),), width=8),
            Panel("Rejected turns", "Published turns that failed validation, per second, by reason.",
                  (Query(rate("mnemos_ingest_turns_rejected_total", by="reason"), "{{reason}}"),), unit="reqps",
                  width=8),
        )),
    ),
)

INGEST = Dashboard(
    uid="mnemos-ingest",
    title="Mnemos / Ingest worker",
    description="The turns stream consumer: throughput, dedupe, batch timings and backlog.",
    rows=(
        Row("Throughput", (
            _workers_up("ingest"),
            _stat("Duplicate share", "Share of read turns folded into an existing entry (cosine >= 0.95).",
                  f"{rate('mnemos_ingest_duplicates_total')} / {rate('mnemos_ingest_turns_read_total')}",
                  "duplicates", unit="percentunit"),
            _stat("Claimed", "Entries claimed per second from consumers that stopped mid-batch (XAUTOCLAIM).",
                  rate("mnemos_ingest_claimed_total"), "claimed/s", unit="reqps"),
            _stat("Rejected", "Turns rejected per second.",
                  rate("mnemos_ingest_turns_rejected_total"), "rejected/s", unit="reqps"),
            Panel("Turns", "Turns read, indexed, duplicates and claimed per second.",
                  (Query(rate("mnemos_ingest_turns_read_total"), "read"),
                   Query(rate("mnemos_ingest_turns_indexed_total"), "indexed"),
                   Query(rate("mnemos_ingest_duplicates_total"), "duplicates"),
                   Query(rate("mnemos_ingest_claimed_total"), "claimed")), unit="reqps"),
            Panel("Rejected by reason", "Turns that failed validation, per second.",
                  (Query(rate("mnemos_ingest_turns_rejected_total", by="reason"), "{{reason}}"),), unit="reqps"),
        )),
        Row("Batches", (
            Panel("Embedding time", "Seconds to embed one batch with the bi-encoder.",
                  _p50_p95("mnemos_ingest_embed_seconds"), unit="s", width=8),
            Panel("Commit time", "Seconds to commit one batch to Postgres.",
                  _p50_p95("mnemos_ingest_commit_seconds"), unit="s", width=8),
            Panel("Batch size", "Turns per batch read from the stream (mean and p95).",
                  (Query(f"{rate('mnemos_ingest_batch_size_sum')} / {rate('mnemos_ingest_batch_size_count')}",
                         "mean"),
                   Query(quantile(0.95, "mnemos_ingest_batch_size"), "p95")), width=8),
            Panel("Truncated turns", "Turns longer than the bi-encoder's 256-token window, per second: the "
                  "embedding sees their start only (full text stays in Postgres and BM25).",
                  (Query(rate("mnemos_ingest_encoder_truncated_total"), "truncated"),), unit="reqps"),
            Panel("Indexed share", "Share of read turns written as new canonical entries.",
                  (Query(f"{rate('mnemos_ingest_turns_indexed_total')} / {rate('mnemos_ingest_turns_read_total')}",
                         "indexed"),), unit="percentunit"),
        )),
        Row("Backlog and failures", (
            *_stream_panels("ingest", "Turns"),
            Panel("Dead letters", "Messages moved to the dead-letter stream per interval, by reason.",
                  (Query(f"sum by (reason) (increase(mnemos_dead_letters_total{sel()}[{RATE}]))", "{{reason}}"),)),
        )),
        Row("Forget", (
            Panel("Forgets", "Forget events applied per second, turns they erased, and re-published turns "
                  "dropped by a tombstone (no tenant label: erasure leaves no per-tenant trace here).",
                  (Query(rate("mnemos_ingest_forget_events_total"), "events"),
                   Query(rate("mnemos_ingest_forgotten_turns_total"), "turns forgotten"),
                   Query(rate("mnemos_ingest_turns_tombstoned_total"), "tombstoned")), unit="ops", width=24),
        )),
    ),
)

QUERY = Dashboard(
    uid="mnemos-query",
    title="Mnemos / Query worker",
    description="Retrieval jobs: rate, errors, latency per stage, deep passes, pool size, index refreshes.",
    rows=(
        Row("Jobs", (
            _workers_up("query"),
            _stat("Error share", "Share of retrieval jobs that ended with status error.",
                  f"{rate('mnemos_query_jobs_total', selector=ERROR)} / {rate('mnemos_query_jobs_total')}",
                  "errors", unit="percentunit"),
            _stat("Deep-pass share", "Share of retrievals that reranked the deep pool (top rerank score below threshold).",
                  f"{rate('mnemos_query_deep_passes_total')} / {rate('mnemos_query_jobs_total')}",
                  "deep passes", unit="percentunit"),
            _stat("Queue", "rq jobs waiting for a query worker.",
                  f"max by (queue) (mnemos_queue_length{sel()})", "{{queue}}"),
            Panel("Jobs by status", "Retrieval jobs finished per second.",
                  (Query(rate("mnemos_query_jobs_total", by="status"), "{{status}}"),), unit="reqps"),
            Panel("Queue length", "rq jobs waiting for a query worker (KEDA scales on this list).",
                  (Query(f"max by (queue) (mnemos_queue_length{sel()})", "{{queue}}"),)),
        )),
        Row("Queueing", (
            Panel("Queue wait", "Seconds from enqueue to the job's start (p50, p95): long waits mean too few "
                  "query workers.",
                  _p50_p95("mnemos_query_queue_wait_seconds"), unit="s", width=8),
            Panel("End to end", "Seconds from enqueue to the job's end (p50, p95): queue wait plus work.",
                  _p50_p95("mnemos_query_end_to_end_seconds"), unit="s", width=8),
            Panel("Expired and recovered jobs", "Jobs per second that expired in the queue or were given up by "
                  "their client, and jobs put back in the queue after a worker stopped between dequeuing and "
                  "starting them.",
                  (Query(rate("mnemos_query_jobs_expired_total"), "expired"),
                   Query(rate("mnemos_query_jobs_recovered_total"), "recovered")), unit="reqps", width=8),
        )),
        Row("Latency", (
            Panel("p50 per stage", "Median seconds per retrieval stage.",
                  (Query(quantile(0.5, "mnemos_query_stage_seconds", by="stage"), "{{stage}}"),), unit="s", width=8),
            Panel("p95 per stage", "95th percentile seconds per retrieval stage.",
                  (Query(quantile(0.95, "mnemos_query_stage_seconds", by="stage"), "{{stage}}"),), unit="s", width=8),
            Panel("Mean per stage", "Mean seconds per retrieval stage (sum over count).",
                  (Query(f"sum by (stage) (rate(mnemos_query_stage_seconds_sum{sel()}[{RATE}])) / "
                         f"sum by (stage) (rate(mnemos_query_stage_seconds_count{sel()}[{RATE}]))", "{{stage}}"),),
                  unit="s", width=8),
        )),
        Row("Work per job", (
            Panel("Pool size", "Candidates reranked per retrieval (p50, p95).",
                  _p50_p95("mnemos_query_pool_size"), width=8),
            Panel("Deep passes", "Retrievals per second that took the deep pass.",
                  (Query(rate("mnemos_query_deep_passes_total"), "deep passes"),), unit="reqps", width=8),
            Panel("Index refreshes", "Tenant indexes rebuilt or extended from Postgres per second.",
                  (Query(rate("mnemos_query_index_refreshes_total"), "refreshes"),), unit="reqps", width=8),
        )),
        Row("Catalog reads", (
            Panel("Catalog jobs", "Catalog jobs per second (a tenant's sessions, or its turns by id: the MCP "
                  "server's list_sessions and forget, the LangGraph store's get and search), by status.",
                  (Query(rate("mnemos_query_catalog_jobs_total", by="status"), "{{status}}"),), unit="reqps",
                  width=24),
        )),
        Row("Reranker", (
            Panel("Rerank cache", "(query, turn) pairs per second scored from the query worker's cache (hits) "
                  "or sent to the cross-encoder (misses).",
                  (Query(rate("mnemos_query_rerank_cache_hits_total"), "hits"),
                   Query(rate("mnemos_query_rerank_cache_misses_total"), "misses")), unit="ops", width=12),
            Panel("Truncated pairs", "(query, turn) pairs per second longer than the cross-encoder's max length: "
                  "the turn lost tokens; queries: the query lost tokens too (last resort).",
                  (Query(rate("mnemos_query_rerank_pairs_truncated_total"), "pairs"),
                   Query(rate("mnemos_query_rerank_queries_truncated_total"), "queries")), unit="ops", width=12),
        )),
        Row("Tenant index cache", (
            Panel("Tenant cache", "Retrievals per second answered from a cached tenant index (hits) or after "
                  "building it from Postgres (misses: first request, reload after an eviction, a forget), and "
                  "indexes evicted per second to keep MNEMOS_INDEX_MEMORY_MB and MNEMOS_MAX_CACHED_TENANTS.",
                  (Query(rate("mnemos_query_tenant_cache_hits_total"), "hits"),
                   Query(rate("mnemos_query_tenant_cache_misses_total"), "misses"),
                   Query(rate("mnemos_query_tenant_cache_evictions_total"), "evictions")), unit="ops", width=8),
            Panel("Tenant cache bytes", "Estimated bytes of the cached tenant indexes of the fullest query worker "
                  "(each replica has its own cache; compare with MNEMOS_INDEX_MEMORY_MB).",
                  (Query(f"max(mnemos_query_tenant_cache_bytes{sel()})", "largest worker"),), unit="bytes", width=8),
            Panel("Cached tenants", "Tenant indexes cached by the query worker holding the most.",
                  (Query(f"max(mnemos_query_tenant_cache_tenants{sel()})", "largest worker"),), width=8),
        )),
    ),
)

SUPPRESSION = Dashboard(
    uid="mnemos-suppression",
    title="Mnemos / Suppression worker",
    description="Outcomes applied to suppression scores: throughput, ledger duplicates, timing, bootstrap, backlog.",
    rows=(
        Row("Outcomes", (
            _workers_up("suppression"),
            _stat("Bootstrapped tenants", "Tenants whose query clusters are fitted and frozen.",
                  f"max(mnemos_suppression_bootstrapped_tenants{sel()})", "tenants"),
            _stat("Applied", "Outcomes applied per second.",
                  rate("mnemos_suppression_outcomes_applied_total"), "applied/s", unit="reqps"),
            _stat("Redelivered", "Outcomes skipped per second because the ledger already had them.",
                  rate("mnemos_suppression_duplicates_skipped_total"), "skipped/s", unit="reqps"),
            Panel("Outcomes", "Outcomes applied, duplicates skipped and outcomes a later forget made moot, per second.",
                  (Query(rate("mnemos_suppression_outcomes_applied_total"), "applied"),
                   Query(rate("mnemos_suppression_duplicates_skipped_total"), "duplicates skipped"),
                   Query(rate("mnemos_suppression_outcomes_outdated_total"), "outdated by a forget")), unit="reqps"),
            Panel("Suppression rows updated", "(entry, cluster) suppression scores changed per second.",
                  (Query(rate("mnemos_suppression_entries_updated_total"), "entries"),), unit="reqps"),
        )),
        Row("Timing and backlog", (
            Panel("Apply time", "Seconds to apply one batch of outcomes in one transaction.",
                  _p50_p95("mnemos_suppression_apply_seconds"), unit="s"),
            *_stream_panels("suppression", "Outcomes"),
        )),
    ),
)

DASHBOARDS = (OVERVIEW, INGEST, QUERY, SUPPRESSION)


def main(out_dir: Path = OUT_DIR) -> int:
    out_dir.mkdir(parents=True, exist_ok=True)
    for dashboard in DASHBOARDS:
        (out_dir / file_name(dashboard)).write_text(dumps(render(dashboard)))
        print(f"wrote {out_dir / file_name(dashboard)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR))
