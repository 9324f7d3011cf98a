"""The metric names deploy/ relies on, against workers/runtime/metrics.py; and the PromQL checker itself."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tests.deploy import promql


def test_registry_exports_every_spec_metric(registered_series):
    missing = promql.spec_series() - registered_series
    assert not missing, f"contract names (docs/architecture.md \"Metrics\") that workers/runtime/metrics.py does not register: {sorted(missing)}"


def test_registry_exports_the_extra_metrics_the_dashboards_use(registered_series):
    assert promql.spec_series(promql.CODE_EXTRA_METRICS) <= registered_series


def test_series_of_registry_derives_suffixes_without_samples():
    registry = CollectorRegistry()
    Counter("demo_jobs_total", "jobs", ["status"], registry=registry)  # labelled: no sample yet
    Histogram("demo_stage_seconds", "stage", ["stage"], registry=registry)
    Gauge("demo_up", "up", registry=registry)
    assert promql.series_of_registry(registry) == {
        "demo_jobs_total", "demo_stage_seconds_bucket", "demo_stage_seconds_sum", "demo_stage_seconds_count",
        "demo_up",
    }


def test_selectors_find_every_series_with_its_matchers():
    expr = ('histogram_quantile(0.95, sum by (le) (rate(mnemos_query_stage_seconds_bucket{stage="total"}[5m])))'
            ' / on () group_left sum(mnemos:query_jobs:rate5m) or absent({__name__="mnemos_worker_up"})')
    found = {(s.name, s.matchers) for s in promql.selectors(expr)}
    assert found == {
        ("mnemos_query_stage_seconds_bucket", (("stage", "=", "total"),)),
        ("mnemos:query_jobs:rate5m", ()),
        ("mnemos_worker_up", ()),
    }


@pytest.mark.parametrize("expr", ["sum(rate(x[5m]", 'x{a="b"', "rate(x[$__rate_interval])",
                                  '{__name__=~"mnemos_.*"}'])
def test_selectors_reject_unparsable_or_unnamed(expr):
    with pytest.raises(ValueError):
        promql.selectors(expr)


def test_unknown_series_flags_typos_and_missing_suffixes():
    known = promql.spec_series()
    exprs = ["rate(mnemos_ingest_turns_read[5m])",  # counter without _total
             "histogram_quantile(0.5, rate(mnemos_query_stage_seconds[5m]))",  # histogram without _bucket
             "mnemos:stream_lag:max", "up"]
    assert promql.unknown_series(exprs, known, {"mnemos:stream_lag:max"}) == {
        exprs[0]: {"mnemos_ingest_turns_read"}, exprs[1]: {"mnemos_query_stage_seconds"}, exprs[3]: {"up"}}


def test_bad_matchers_flags_wrong_labels_and_values():
    assert promql.bad_matchers('mnemos_query_stage_seconds_bucket{stage="totl"}')
    assert promql.bad_matchers('mnemos_stream_lag{consumer_group="ingest"}')
    assert promql.bad_matchers('mnemos_worker_up{worker="ingester"}')
    assert not promql.bad_matchers('mnemos_stream_lag{group="suppression", job="x", stream=~".*"}')


def test_grafana_variables_are_substituted_or_refused():
    assert promql.substitute_grafana("rate(x[$__rate_interval])") == "rate(x[5m])"
    with pytest.raises(ValueError):
        promql.substitute_grafana('x{worker="$worker"}')
