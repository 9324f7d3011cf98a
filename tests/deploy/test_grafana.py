"""deploy/grafana: provisionable dashboards whose every panel reads a metric the code exports."""

from __future__ import annotations

import json

import pytest

from tests.deploy import manifests, promql
from tests.deploy.manifests import DEPLOY, WORKERS

GRAFANA = DEPLOY / "grafana"
DASHBOARD_FILES = sorted((GRAFANA / "dashboards").glob("*.json"))
DASHBOARDS = {path.stem: json.loads(path.read_text()) for path in DASHBOARD_FILES}
KNOWN = promql.spec_series() | promql.spec_series(promql.CODE_EXTRA_METRICS)
WORKER_METRIC_PREFIX = {"ingest": "mnemos_ingest_", "query": "mnemos_query_", "suppression": "mnemos_suppression_"}


def _panels(dashboard: dict) -> list[dict]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def _exprs(dashboard: dict) -> list[str]:
    return [promql.substitute_grafana(t["expr"]) for p in _panels(dashboard) for t in p["targets"]]


def _read(dashboard: dict) -> set[str]:
    return {s.name for expr in _exprs(dashboard) for s in promql.selectors(expr)}


ALL_TARGETS = [(name, panel["title"], target["expr"]) for name, d in DASHBOARDS.items()
               for panel in _panels(d) for target in panel["targets"]]


@pytest.fixture(scope="module")
def generator():
    yield from manifests.script_module(GRAFANA / "generate.py", "mnemos_grafana_generate")


def test_one_overview_and_one_dashboard_per_worker():
    assert set(DASHBOARDS) == {"mnemos-overview", *(f"mnemos-{w}" for w in WORKERS)}


def test_committed_json_is_what_the_generator_writes(generator, tmp_path):
    generator.main(tmp_path)
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == [p.name for p in DASHBOARD_FILES]
    for name in written:
        assert (tmp_path / name).read_text() == (GRAFANA / "dashboards" / name).read_text(), \
            f"{name} is stale: run python deploy/grafana/generate.py"


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_dashboard_is_a_provisionable_model(name):
    dashboard = DASHBOARDS[name]
    assert dashboard["uid"] == name and len(name) <= 40
    assert dashboard["title"].startswith("Mnemos / ")
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard, "a provisioned dashboard must not carry a database id"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in _panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"] and panel["title"] and panel["description"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))


@pytest.mark.parametrize("name", sorted(DASHBOARDS))
def test_panels_fit_the_grid_without_overlapping(name):
    cells: dict[tuple[int, int], str] = {}
    for panel in DASHBOARDS[name]["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24 and pos["h"] >= 1
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


@pytest.mark.parametrize(("name", "title", "expr"), ALL_TARGETS, ids=[f"{n}:{t}" for n, t, _ in ALL_TARGETS])
def test_target_parses_and_reads_exported_metrics(name, title, expr):
    query = promql.substitute_grafana(expr)
    assert not promql.unknown_series([query], KNOWN, set()), "dashboards read raw metrics, not recording rules"
    assert not promql.bad_matchers(query)


def test_every_target_reads_only_registered_metrics(registered_series):
    bad = {}
    for name, dashboard in DASHBOARDS.items():
        bad.update({f"{name}: {e}": n for e, n in promql.unknown_series(_exprs(dashboard), registered_series,
                                                                         set()).items()})
    assert not bad, f"panels on metrics workers/runtime/metrics.py does not register: {bad}"


def test_overview_shows_traffic_latency_backlog_and_errors():
    overview = DASHBOARDS["mnemos-overview"]
    read = _read(overview)
    assert {"mnemos_ingest_turns_read_total", "mnemos_query_jobs_total", "mnemos_stream_lag",
            "mnemos_dead_letters_total", "mnemos_query_stage_seconds_bucket"} <= read
    exprs = _exprs(overview)
    for q in ("0.5", "0.95"):
        assert any(e.startswith(f"histogram_quantile({q}, sum by (le, stage) (rate(mnemos_query_stage_seconds_bucket")
                   for e in exprs), f"no p{q} per stage"
    assert any('status="error"' in e for e in exprs), "no error panel"


@pytest.mark.parametrize("worker", WORKERS)
def test_worker_dashboard_shows_all_of_its_metrics(worker):
    read = {promql.family_of(s) for s in _read(DASHBOARDS[f"mnemos-{worker}"])}
    own = {m for m in [*promql.SPEC_METRICS, *promql.CODE_EXTRA_METRICS] if m.startswith(WORKER_METRIC_PREFIX[worker])}
    assert own <= read, f"{worker} dashboard misses {sorted(own - read)}"
    assert "mnemos_worker_up" in read


def test_every_exported_metric_is_on_some_dashboard():
    read = {promql.family_of(s) for d in DASHBOARDS.values() for s in _read(d)}
    missing = (set(promql.SPEC_METRICS) | set(promql.CODE_EXTRA_METRICS)) - read
    assert not missing, f"metrics no dashboard shows: {sorted(missing)}"


def test_stream_and_queue_gauges_are_combined_with_max():
    # every worker process samples every stream and the queue, so a sum would multiply the backlog
    for dashboard in DASHBOARDS.values():
        for expr in _exprs(dashboard):
            for gauge in ("mnemos_stream_lag", "mnemos_stream_pending", "mnemos_stream_length", "mnemos_queue_length"):
                if gauge in expr:
                    assert expr.startswith("max"), expr


def test_provisioning_files():
    (dashboards,) = manifests.load_docs(GRAFANA / "provisioning" / "dashboards" / "mnemos.yaml")
    assert dashboards["apiVersion"] == 1
    (provider,) = dashboards["providers"]
    assert provider["type"] == "file" and provider["options"]["path"].startswith("/")
    assert provider["folder"] == "Mnemos"
    (datasources,) = manifests.load_docs(GRAFANA / "provisioning" / "datasources" / "prometheus.yaml")
    assert datasources["apiVersion"] == 1
    assert datasources["datasources"][0]["type"] == "prometheus"


def test_sidecar_configmaps_carry_every_dashboard():
    spec = manifests.kustomization(GRAFANA)
    files = {f for g in spec["configMapGenerator"] for f in g["files"]}
    assert files == {f"dashboards/{p.name}" for p in DASHBOARD_FILES}
    assert spec["generatorOptions"]["labels"]["grafana_dashboard"] == "1"
    for path in DASHBOARD_FILES:
        assert path.stat().st_size < 900_000, "a ConfigMap holds at most 1 MiB"
