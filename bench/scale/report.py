"""``scale.md``: the Markdown report of a ``mnemos bench scale`` result (:mod:`bench.scale.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _f(value: Any, digits: int = 3) -> str:
    """A number for a table cell (``-`` for None)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.{digits}f}" if abs(value) < 1e5 else f"{value:,.0f}"
    return str(value)


def bi_encoder_line(block: dict[str, Any]) -> str:
    """What embedded a phase's turns: the block's ``bi_encoder`` or, for blocks written before it
    was recorded, what its command says."""
    name = block.get("bi_encoder") or ("hashing" if "--bi-encoder hashing" in block["command"] else "settings")
    if name.startswith("hashing"):
        return ("Bi-encoder: the hashing fake at the bundled model's dimension (`--bi-encoder hashing`): the index, "
                "the dense search and the memory have the product's sizes, but ingest does not pay the transformer "
                "(docs/scaling.md \"Measured and not measured\").")
    return f"Bi-encoder: `{name}` (the settings')."


def _large_lines(large: dict[str, Any]) -> list[str]:
    cold, queries, refresh = large["cold_start"], large["queries"], large["refresh"]
    return [
        "## Large tenant", "", f"`{large['command']}` ({_f(large['wall_s'], 0)} s)", "", bi_encoder_line(large), "",
        "| figure | value |", "|---|---|",
        f"| stored turns: large / small tenant (of them aliases, both) | {_f(large['large_turns'])} / "
        f"{_f(large['small_turns'])} ({_f(large.get('aliases_stored'), 0)}) |",
        f"| distinct publishable haystack turns (refused) | {_f(large['distinct_pool_turns'])} "
        f"({_f(large['pool_turns_refused'])}) |",
        f"| ingest, turns/s (first XADD to last commit, one ingest worker) | {_f(large['ingest']['ingest_turns_per_s'], 1)} |",
        f"| query worker start (spawn to taking jobs), s | {_f(cold['worker_start_s'], 2)} |",
        f"| cold start: load of the large tenant (refresh + bm25 stages), s | {_f(cold['load_s'], 2)} |",
        f"| cold start: first request / the same request again, s | {_f(cold['first_request_s'], 2)} / "
        f"{_f(cold['second_request_s'], 2)} |",
        f"| index estimate (`mnemos_query_tenant_cache_bytes`), bytes per stored turn | {_f(cold['bytes_per_turn'], 0)} |",
        f"| query worker resident set growth while loading, bytes per stored turn | {_f(cold['rss_bytes_per_turn'], 0)} |",
        f"| query p50 / p95, large tenant, s | {_f(queries['large']['p50_s'])} / {_f(queries['large']['p95_s'])} |",
        f"| query p50 / p95, small tenant, s | {_f(queries['small']['p50_s'])} / {_f(queries['small']['p95_s'])} |",
        f"| p50 large / p50 small | {_f(queries['p50_ratio'], 2)} |",
        f"| {refresh['turns_per_probe']} new turns: XADD to commit, p50, s | {_f(refresh['committed_s_p50'])} |",
        f"| {refresh['turns_per_probe']} new turns: XADD to retrievable, p50 / p95, s | "
        f"{_f(refresh['retrievable_s_p50'])} / {_f(refresh['retrievable_s_p95'])} |",
        f"| index update in that request (refresh + bm25), p50, s | {_f(refresh['index_update_s_p50'])} |", ""]


def _many_lines(many: dict[str, Any]) -> list[str]:
    return [
        "## Many tenants", "", f"`{many['command']}` ({_f(many['wall_s'], 0)} s)", "", bi_encoder_line(many), "",
        "| figure | value |", "|---|---|",
        f"| tenants (distinct haystacks), turns | {_f(many['tenants'])} ({_f(many['distinct_haystacks'])}), "
        f"{_f(many['turns'])} |",
        f"| ingest, turns/s | {_f(many['ingest']['ingest_turns_per_s'], 1)} |",
        f"| `MNEMOS_INDEX_MEMORY_MB`; most bytes / tenants cached | {_f(many['memory_mb'])}; "
        f"{_f(many['max_cached_bytes'], 0)} / {_f(many['max_cached_tenants'], 0)} |",
        f"| requests (Zipf s = {many['zipf_s']}), tenants requested | {_f(many['requests'])}, "
        f"{_f(many['tenants_requested'])} |",
        f"| hit rate (all requests) | {_f(many['eviction_hit_rate'])} |",
        f"| hit rate without eviction (1 - tenants requested / requests) | {_f(many['hit_rate_without_eviction'])} |",
        f"| hit rate after each tenant's first request | {_f(many['hit_rate_after_first_request'])} |",
        f"| evictions | {_f(many['evictions'])} |",
        f"| reload after eviction (refresh + bm25), p50 / p95, s | {_f(many['reload_p50_s'])} / "
        f"{_f(many['reload_p95_s'])} |",
        f"| request p50 / p95, s (hits; misses) | {_f(many['request_p50_s'])} / {_f(many['request_p95_s'])} "
        f"({_f(many['hit_request_p50_s'])}; {_f(many['miss_request_p50_s'])}) |", ""]


def _shard_lines(shards: dict[str, Any]) -> list[str]:
    lines = ["## Shards", "", f"`{shards['command']}`: {shards['setting']}, {_f(shards['tenants'])} tenants, "
             f"{_f(shards['requests'])} requests; every tenant served by its shard: "
             f"{_f(shards['every_tenant_served_by_its_shard'])}", "",
             "| shard | tenants | turns routed / stored | requests routed / served | query jobs ok | cached tenants |",
             "|---|---|---|---|---|---|"]
    for row in shards["per_shard"]:
        lines.append(f"| {row['shard']} | {_f(row['tenants'])} | {_f(row['turns_routed'])} / "
                     f"{_f(row['turns_stored'], 0)} | {_f(row['requests_routed'])} / {_f(row['requests_served'])} | "
                     f"{_f(row['query_jobs_ok'], 0)} | {_f(row['cached_tenants'], 0)} |")
    return [*lines, ""]


def _reshard_lines(grown: dict[str, Any]) -> list[str]:
    moved = grown["moved_tenants"]
    lines = ["## Adding a shard with turns in flight", "",
             f"`{grown['command']}`: {grown['shards_before']} to {grown['shards_after']} shards, "
             f"{_f(grown['tenants'])} tenants, {_f(grown['turns'])} turns ({_f(grown['turns_published_before_change'])} "
             f"published before the change while the old shards' ingest workers were paused, so "
             f"{_f(grown['turns_waiting_in_old_streams_at_change'])} still waited in their streams when the new "
             f"shard's workers started, {_f(grown['moved_tenants_turns_in_old_streams_at_change'])} of them of moved "
             f"tenants; {_f(grown['turns_published_after_change'])} published after).", "",
             "| figure | value |", "|---|---|",
             f"| tenants moved (share; expected about 1 / {grown['shards_after']}) | {len(moved)} "
             f"({_f(grown['moved_share'])}; {_f(grown['expected_share'])}) |",
             f"| every moved tenant went to the new shard | {_f(grown['every_moved_tenant_went_to_the_new_shard'])} |",
             f"| the new shard's stream holds moved tenants only | "
             f"{_f(grown['new_shard_stream_holds_only_moved_tenants'])} |",
             f"| turns lost / unexpected / dead letters | {_f(grown['turns_lost'])} / {_f(grown['turns_unexpected'])} / "
             f"{_f(grown['dead_letters'])} |",
             f"| requests after the change served by the ring's shard (by an unknown worker) | "
             f"{_f(grown['requests'] - len(grown['misrouted_tenants']) - grown['requests_served_by_unknown_worker'])}"
             f" / {_f(grown['requests'])} ({_f(grown['requests_served_by_unknown_worker'])}) |",
             f"| new shard's workers ready, s; caught up after the change, s | {_f(grown['new_shard_workers_ready_s'], 1)}; "
             f"{_f(grown['caught_up_after_change_s'], 1)} |", "",
             "| shard | tenants before | tenants after | turns stored by its ingest worker |", "|---|---|---|---|"]
    for row in grown["per_shard"]:
        lines.append(f"| {row['shard']} | {_f(row['tenants_before'])} | {_f(row['tenants_after'])} | "
                     f"{_f(row['turns_stored_by_its_ingest_worker'], 0)} |")
    return [*lines, ""]


def scale_markdown(payload: dict[str, Any]) -> str:
    """The report: headline figures, then one section per phase held by ``payload``."""
    phases = payload["phases"]
    machine = payload["machine"]
    lines = ["# Scale of the service (`mnemos bench scale`)", "",
             f"Data `{payload['data']}`, reranker `{payload['reranker']}`; {machine['cores']} cores, {machine['cpu']}, "
             f"Python {machine['python']}. How each figure is measured: docs/scaling.md \"Measured and not measured\".",
             "", "| headline | value |", "|---|---|",
             f"| p50 at {_f(payload['sizes']['large_turns'])} turns / p50 at {_f(payload['sizes']['small_turns'])} "
             f"turns | {_f(payload['p50_ratio_200k_vs_6k'], 2)} |",
             f"| cold start of {_f(payload['cold_start_turns'])} turns, s | {_f(payload['cold_start_s_200k'], 2)} |",
             f"| bytes per stored turn (estimate; resident set growth) | {_f(payload['bytes_per_turn'], 0)}; "
             f"{_f(payload['bytes_per_turn_rss'], 0)} |",
             f"| tenant cache hit rate under Zipf | {_f(payload['eviction_hit_rate'])} |", ""]
    if phases.get("large"):
        lines += _large_lines(phases["large"])
    if phases.get("many"):
        lines += _many_lines(phases["many"])
    if phases.get("shards"):
        lines += _shard_lines(phases["shards"])
    if phases.get("reshard"):
        lines += _reshard_lines(phases["reshard"])
    return "\n".join(lines)


def write_scale_markdown(payload: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(scale_markdown(payload), encoding="utf-8")
