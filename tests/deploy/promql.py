"""The metric names of the service's contract and a PromQL walker that lists the series an expression reads.

``SPEC_METRICS`` is the metric contract (docs/architecture.md "Metrics"): the names, types and
labels deploy/ relies on. :func:`series_of_registry` derives the series names a prometheus_client
registry exposes (counters gain ``_total``, histograms ``_bucket``/``_sum``/``_count``), so the
expressions in rules and dashboards can be checked against what workers/runtime/metrics.py registers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import promql_parser

# name -> (type, labels), as docs/architecture.md "Metrics" lists them; counters are named with their _total suffix.
SPEC_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mnemos_ingest_turns_read_total": ("counter", ()),
    "mnemos_ingest_turns_indexed_total": ("counter", ()),
    "mnemos_ingest_duplicates_total": ("counter", ()),
    "mnemos_ingest_turns_rejected_total": ("counter", ("reason",)),
    "mnemos_ingest_embed_seconds": ("histogram", ()),
    "mnemos_ingest_batch_size": ("histogram", ()),
    "mnemos_ingest_commit_seconds": ("histogram", ()),
    "mnemos_ingest_claimed_total": ("counter", ()),
    "mnemos_query_jobs_total": ("counter", ("status",)),
    "mnemos_query_stage_seconds": ("histogram", ("stage",)),
    "mnemos_query_deep_passes_total": ("counter", ()),
    "mnemos_query_pool_size": ("histogram", ()),
    "mnemos_query_index_refreshes_total": ("counter", ()),
    "mnemos_suppression_outcomes_applied_total": ("counter", ()),
    "mnemos_suppression_duplicates_skipped_total": ("counter", ()),
    "mnemos_suppression_outcomes_outdated_total": ("counter", ()),
    "mnemos_suppression_entries_updated_total": ("counter", ()),
    "mnemos_suppression_bootstrapped_tenants": ("gauge", ()),
    "mnemos_suppression_apply_seconds": ("histogram", ()),
    "mnemos_stream_length": ("gauge", ("stream", "group")),
    "mnemos_stream_pending": ("gauge", ("stream", "group")),
    "mnemos_stream_lag": ("gauge", ("stream", "group")),
    "mnemos_queue_length": ("gauge", ("queue",)),
    "mnemos_worker_up": ("gauge", ("worker",)),
    "mnemos_dead_letters_total": ("counter", ("reason",)),
}
# Exported by workers/runtime/metrics.py beyond the contract's list (checked against the registry when it imports).
CODE_EXTRA_METRICS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mnemos_ingest_encoder_truncated_total": ("counter", ()),
    "mnemos_query_rerank_cache_hits_total": ("counter", ()),
    "mnemos_query_rerank_cache_misses_total": ("counter", ()),
    "mnemos_query_rerank_pairs_truncated_total": ("counter", ()),
    "mnemos_query_rerank_queries_truncated_total": ("counter", ()),
    "mnemos_worker_heartbeat_timestamp_seconds": ("gauge", ("worker",)),
    "mnemos_query_queue_wait_seconds": ("histogram", ()),
    "mnemos_query_end_to_end_seconds": ("histogram", ()),
    "mnemos_query_jobs_expired_total": ("counter", ()),
    "mnemos_query_jobs_recovered_total": ("counter", ()),
    "mnemos_query_catalog_jobs_total": ("counter", ("status",)),
    "mnemos_mcp_tool_calls_total": ("counter", ("tool", "outcome")),
    "mnemos_mcp_tool_seconds": ("histogram", ("tool",)),
    "mnemos_ingest_forget_events_total": ("counter", ()),
    "mnemos_ingest_forgotten_turns_total": ("counter", ()),
    "mnemos_ingest_turns_tombstoned_total": ("counter", ()),
    "mnemos_query_tenant_cache_hits_total": ("counter", ()),
    "mnemos_query_tenant_cache_misses_total": ("counter", ()),
    "mnemos_query_tenant_cache_evictions_total": ("counter", ()),
    "mnemos_query_tenant_cache_bytes": ("gauge", ()),
    "mnemos_query_tenant_cache_tenants": ("gauge", ()),
    "mnemos_tenants_frozen": ("gauge", ("directory",)),
}
# Label values the code uses (docs/architecture.md "Contracts"); a matcher on another value selects nothing.
LABEL_VALUES: dict[str, frozenset[str]] = {
    "status": frozenset({"ok", "error"}),
    "stage": frozenset({"refresh", "bm25", "dense", "fusion", "suppression", "rerank", "features", "total"}),
    "worker": frozenset({"ingest", "query", "suppression"}),
    "group": frozenset({"ingest", "suppression"}),
}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus attaches to every scraped series, and the histogram bucket label.
TARGET_LABELS = frozenset({"job", "instance", "pod", "namespace", "container", "service", "endpoint",
                           "component", "le"})
# Grafana's built-in variables, replaced by plain values before parsing.
GRAFANA_VARIABLES = {
    "$namespace": "mnemos",  # the dashboards' namespace selector
    "$__rate_interval": "5m",
    "${__rate_interval}": "5m",
    "$__interval": "1m",
    "${__interval}": "1m",
    "$__range": "1h",
}
_RECORDED = re.compile(r"^[a-zA-Z_]+:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+$")


def series_of(name: str, kind: str) -> set[str]:
    """Series names of one metric family as Prometheus scrapes it (``name`` as in the contract)."""
    if kind == "histogram":
        return {name + suffix for suffix in HISTOGRAM_SUFFIXES}
    if kind == "summary":
        return {name, name + "_sum", name + "_count"}
    return {name}


def spec_series(metrics: Mapping[str, tuple[str, tuple[str, ...]]] = SPEC_METRICS) -> set[str]:
    return {s for name, (kind, _) in metrics.items() for s in series_of(name, kind)}


def series_of_registry(registry) -> set[str]:
    """Series names a prometheus_client registry exposes, derived from each family's type.

    A labelled metric with no children yet has no samples, so names come from the family's
    name and type, not from ``collect()``'s samples alone.
    """
    names: set[str] = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type in ("histogram", "gaugehistogram"):
            names.update(family.name + s for s in HISTOGRAM_SUFFIXES)
        elif family.type == "summary":
            names.update({family.name, family.name + "_sum", family.name + "_count"})
        elif family.type == "info":
            names.add(family.name + "_info")
        else:
            names.add(family.name)
        names.update(sample.name for sample in family.samples)
    return {n for n in names if not n.endswith("_created")}


def family_of(series: str) -> str:
    """The contract metric (or a CODE_EXTRA_METRICS one) a series belongs to (``x_bucket`` -> ``x``); the series
    itself otherwise."""
    known = {**SPEC_METRICS, **CODE_EXTRA_METRICS}
    if series in known:
        return series
    for suffix in HISTOGRAM_SUFFIXES:
        base = series.removesuffix(suffix)
        if base != series and known.get(base, ("",))[0] == "histogram":
            return base
    return series


def substitute_grafana(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    if "$" in expr:
        raise ValueError(f"unknown Grafana variable in {expr!r}")
    return expr


@dataclass(frozen=True)
class Selector:
    """One instant/range vector selector of an expression: metric name and its label matchers."""

    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, op, value), op one of = != =~ !~


_OPS = {"Equal": "=", "NotEqual": "!=", "Re": "=~", "NotRe": "!~"}


def selectors(expr: str) -> list[Selector]:
    """Every vector selector in ``expr``; raises ValueError when it does not parse or has no fixed name."""
    try:
        tree = promql_parser.parse(expr)
    except Exception as exc:  # promql_parser raises a bare ValueError/RuntimeError subclass
        raise ValueError(f"does not parse: {expr!r}: {exc}") from exc
    found: list[Selector] = []

    def visit(node) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = tuple((m.name, _OPS[str(m.op).rsplit(".", 1)[-1]], m.value) for m in node.matchers.matchers)
            name = node.name or next((v for label, op, v in matchers if label == "__name__" and op == "="), None)
            if not name:
                raise ValueError(f"selector without a fixed metric name in {expr!r}")
            found.append(Selector(name, tuple(m for m in matchers if m[0] != "__name__")))

    promql_parser.walk(tree, visit)
    return found


def is_recorded_name(name: str) -> bool:
    """True for recording-rule names of the level:metric:operations convention."""
    return bool(_RECORDED.match(name))


def unknown_series(exprs: Iterable[str], known: set[str], recorded: set[str]) -> dict[str, set[str]]:
    """{expression: names it reads that are neither ``known`` series nor ``recorded`` rules}."""
    bad: dict[str, set[str]] = {}
    for expr in exprs:
        names = {s.name for s in selectors(expr)} - known - recorded
        if names:
            bad[expr] = names
    return bad


def bad_matchers(expr: str, metrics: Mapping[str, tuple[str, tuple[str, ...]]] = SPEC_METRICS) -> list[str]:
    """Matchers of ``expr`` on labels a SPEC metric lacks, or on values the code never sets."""
    problems = []
    for sel in selectors(expr):
        family = family_of(sel.name)
        if family not in metrics:
            continue  # recording rules: their labels come from the rule, checked through its own expr
        allowed = set(metrics[family][1]) | TARGET_LABELS
        for label, op, value in sel.matchers:
            if label not in allowed:
                problems.append(f"{sel.name} has no label {label!r}")
            elif op == "=" and label in LABEL_VALUES and value not in LABEL_VALUES[label]:
                problems.append(f"{sel.name}{{{label}={value!r}}}: the code never sets that value")
    return problems
