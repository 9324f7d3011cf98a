"""The Grafana model behind deploy/grafana/generate.py: panels as data, rendered to Grafana's
JSON (schemaVersion 39, Grafana 10/11), and the PromQL helpers every panel uses (each query selects
the dashboard's namespace variable)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
COLUMNS = 24
ERROR = 'status="error"'


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel; legend uses Grafana's {{label}} templating."""

    expr: str
    legend: str = ""


@dataclass(frozen=True)
class Panel:
    """A time series (default) or stat panel; width in grid columns (24 per row), height in rows."""

    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    kind: str = "timeseries"
    width: int = 12
    height: int = 8
    min_zero: bool = True


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    rows: tuple[Row, ...]
    tags: tuple[str, ...] = field(default=("mnemos",))


NAMESPACE = 'namespace="$namespace"'
NAMESPACE_QUERY = "label_values(mnemos_worker_up, namespace)"


def sel(matchers: str = "") -> str:
    """A label selector that always holds the dashboard's namespace (plus ``matchers``, e.g. 'stage="total"')."""
    return "{" + ", ".join(m for m in (NAMESPACE, matchers) if m) + "}"


def quantile(q: float, metric: str, by: str = "", selector: str = "") -> str:
    """histogram_quantile over a Prometheus histogram's _bucket series, summed across replicas."""
    group = f"le, {by}" if by else "le"
    return f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{sel(selector)}[{RATE}])))"


def rate(metric: str, by: str = "", selector: str = "") -> str:
    """Per-second rate of a counter, summed across replicas (optionally kept per label)."""
    head = f"sum by ({by}) " if by else "sum"
    return f"{head}(rate({metric}{sel(selector)}[{RATE}]))"



def _panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": panel.unit}
    if panel.min_zero:
        defaults["min"] = 0
    body: dict = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "targets": [
            {"datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend or "__auto",
             "range": True, "refId": chr(ord("A") + i)}
            for i, q in enumerate(panel.queries)
        ],
    }
    if panel.kind == "stat":
        body["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                           "colorMode": "value", "graphMode": "area", "textMode": "auto"}
    else:
        defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never"}
        body["options"] = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                           "tooltip": {"mode": "multi", "sort": "desc"}}
    return body


def render(dashboard: Dashboard) -> dict:
    """The Grafana JSON model of ``dashboard``: rows laid out top to bottom, panels left to right."""
    panels: list[dict] = []
    panel_id = 1
    y = 0
    for row in dashboard.rows:
        panels.append({"id": panel_id, "type": "row", "title": row.title, "collapsed": False, "panels": [],
                       "gridPos": {"h": 1, "w": COLUMNS, "x": 0, "y": y}})
        panel_id += 1
        y += 1
        x = 0
        line_height = 0
        for panel in row.panels:
            if x + panel.width > COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel_json(panel, panel_id, x, y))
            panel_id += 1
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return {
        "uid": dashboard.uid,
        "title": dashboard.title,
        "description": dashboard.description,
        "tags": list(dashboard.tags),
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "time": {"from": "now-6h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        "links": [{"title": "Mnemos", "type": "dashboards", "tags": ["mnemos"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "includeAll": False, "multi": False, "options": [], "regex": ""},
            # one environment at a time: every query of every panel selects namespace="$namespace"
            {"name": "namespace", "label": "Namespace", "type": "query", "datasource": DATASOURCE,
             "definition": NAMESPACE_QUERY, "query": {"query": NAMESPACE_QUERY, "refId": "namespace"},
             "current": {}, "hide": 0, "refresh": 2, "sort": 1, "includeAll": False, "multi": False,
             "options": [], "regex": ""},
        ]},
        "panels": panels,
    }


def file_name(dashboard: Dashboard) -> str:
    return f"{dashboard.uid}.json"


def dumps(model: dict) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"
