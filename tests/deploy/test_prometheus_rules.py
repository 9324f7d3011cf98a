"""deploy/prometheus: every rule parses as PromQL and reads only metrics the workers register."""

from __future__ import annotations

import re

import pytest

from tests.deploy import manifests, promql
from tests.deploy.manifests import DEPLOY, K8S_VERSIONS, REPO, WORKERS

RULE_FILE = DEPLOY / "prometheus" / "prometheusrule.yaml"
(RULE_DOC,) = manifests.load_docs(RULE_FILE)
GROUPS = RULE_DOC["spec"]["groups"]
RULES = [rule for group in GROUPS for rule in group["rules"]]
ALERTS = [r for r in RULES if "alert" in r]
RECORDS = [r for r in RULES if "record" in r]
RECORDED = {r["record"] for r in RECORDS}
REQUIRED_ALERTS = {
    "MnemosStreamLagGrowing",  # stream lag growing
    "MnemosDeadLetters",  # dead letters appearing
    "MnemosRetrievalP95High",  # retrieval p95 over target
    "MnemosSuppressionFallingBehind",  # suppression falling behind
    "MnemosWorkerDown",  # a worker down
}


def _id(rule: dict) -> str:
    return rule.get("alert") or rule["record"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_rule_object_validates(version):
    assert not manifests.validation_errors(RULE_DOC, version)


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_expression_parses(rule):
    assert promql.selectors(str(rule["expr"])), f"{_id(rule)} reads no series"


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_expression_reads_only_known_metrics(rule):
    known = promql.spec_series() | promql.spec_series(promql.CODE_EXTRA_METRICS)
    bad = promql.unknown_series([str(rule["expr"])], known, RECORDED)
    assert not bad, f"{_id(rule)} reads series outside the metric contract and CODE_EXTRA_METRICS: {bad}"


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_expression_reads_only_registered_metrics(rule, registered_series):
    bad = promql.unknown_series([str(rule["expr"])], registered_series, RECORDED)
    assert not bad, f"{_id(rule)} reads series workers/runtime/metrics.py does not register: {bad}"


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_matchers_use_real_labels_and_values(rule):
    assert not promql.bad_matchers(str(rule["expr"]), {**promql.SPEC_METRICS, **promql.CODE_EXTRA_METRICS})


def test_required_alerts_exist():
    assert {r["alert"] for r in ALERTS} >= REQUIRED_ALERTS


def test_worker_down_and_stale_heartbeat_cover_every_worker_without_absent():
    """absent() sees no namespace: with prod's pods gone and dev's up it stays silent. Both alerts look
    back a day per (namespace, job, worker) instead, so they fire while nothing is scraped any more."""
    for name, metric in (("MnemosWorkerDown", "mnemos_worker_up"),
                         ("MnemosWorkerHeartbeatStale", "mnemos:worker_heartbeat_timestamp_seconds:max1d")):
        covered = set()
        for rule in [r for r in ALERTS if r["alert"] == name]:
            assert "absent(" not in rule["expr"]
            for selector in promql.selectors(rule["expr"]):
                assert selector.name == metric
                for label, op, value in selector.matchers:
                    if label == "worker":
                        covered |= set(value.split("|")) if op == "=~" else {value}
        assert covered == set(WORKERS), name
    (record,) = [r for r in RECORDS if r["record"] == "mnemos:worker_heartbeat_timestamp_seconds:max1d"]
    assert "max_over_time(mnemos_worker_heartbeat_timestamp_seconds[1d])" in record["expr"]


def test_retrieval_p95_alert_is_on_what_users_wait():
    (rule,) = [r for r in ALERTS if r["alert"] == "MnemosRetrievalP95High"]
    (selector,) = promql.selectors(rule["expr"])
    record = next(r for r in RECORDS if r["record"] == selector.name)
    assert "histogram_quantile(0.95" in record["expr"]
    assert {s.name for s in promql.selectors(record["expr"])} == {"mnemos_query_end_to_end_seconds_bucket"}


def test_retrieval_errors_count_jobs_that_expired_in_the_queue():
    (rule,) = [r for r in ALERTS if r["alert"] == "MnemosRetrievalErrors"]
    (selector,) = promql.selectors(rule["expr"])
    record = next(r for r in RECORDS if r["record"] == selector.name)
    assert {s.name for s in promql.selectors(record["expr"])} == {"mnemos_query_jobs_total",
                                                                  "mnemos_query_jobs_expired_total"}


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_every_aggregation_keeps_the_namespace(rule):
    """One Prometheus may watch several environments: no rule may add one namespace's series to another's."""
    expr = " ".join(str(rule["expr"]).split())
    for match in re.finditer(r"\b(sum|max|min|avg|count)\s*(by\s*\(([^)]*)\))?\s*\(", expr):
        assert match.group(2), f"{_id(rule)}: {match.group(1)} without by (namespace, ...)"
        assert "namespace" in [label.strip() for label in match.group(3).split(",")], _id(rule)
    for match in re.finditer(r"\bon\s*\(([^)]*)\)", expr):
        assert "namespace" in [label.strip() for label in match.group(1).split(",")], _id(rule)


@pytest.mark.parametrize("rule", RECORDS, ids=_id)
def test_worker_series_are_summed_per_job(rule):
    if rule["record"].startswith(("mnemos:stream_", "mnemos:queue_", "mnemos:tenants_frozen")):
        return  # every worker samples the same backlog (or directory): combined per namespace with max
    assert re.search(r"by \([^)]*\bjob\b", " ".join(str(rule["expr"]).split())), _id(rule)


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of the markdown headings (lower case, spaces to dashes, punctuation dropped)."""
    return {re.sub(r"[^a-z0-9 -]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
            for line in markdown.splitlines() if line.startswith("#")}


def test_every_alert_links_a_section_of_the_runbook():
    runbook = REPO / "docs" / "runbook.md"
    anchors = _anchors(runbook.read_text())
    sections = {line[3:].strip().lower() for line in runbook.read_text().splitlines() if line.startswith("## ")}
    for rule in ALERTS:
        url = rule["annotations"]["runbook_url"]
        path, _, anchor = url.partition("#")
        assert path == "docs/runbook.md" and anchor == rule["alert"].lower(), url
        assert anchor in anchors, f"docs/runbook.md has no section for {rule['alert']}"
    assert sections == {r["alert"].lower() for r in ALERTS}, "one runbook section per alert"


@pytest.mark.parametrize("rule", ALERTS, ids=_id)
def test_alert_is_actionable(rule):
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    assert rule["annotations"]["summary"].strip()
    assert len(rule["annotations"]["description"].split()) >= 8, "say what it means and where to look"
    if rule["alert"] != "MnemosDeadLetters":  # a single dead letter is already worth a look
        assert "for" in rule, f"{rule['alert']} would fire on one bad scrape"


@pytest.mark.parametrize("rule", RECORDS, ids=_id)
def test_recording_rules_follow_the_naming_convention(rule):
    assert promql.is_recorded_name(rule["record"]), "level:metric:operations"
    assert rule["record"].startswith("mnemos:")


def test_every_recording_rule_is_used_or_summarises_a_worker():
    used = {s.name for r in RULES for s in promql.selectors(str(r["expr"]))}
    unused = RECORDED - used
    # rates of the main flows are recorded for ad-hoc queries and federation even if no alert reads them
    allowed_unused = {"mnemos:ingest_turns_indexed:rate5m", "mnemos:query_jobs:rate5m",
                      "mnemos:query_stage_seconds:p50_5m", "mnemos:query_stage_seconds:p95_5m",
                      "mnemos:query_queue_wait_seconds:p95_5m", "mnemos:query_jobs_expired:rate5m"}
    assert unused <= allowed_unused, f"recording rules nothing reads: {unused - allowed_unused}"


def test_stream_and_queue_gauges_are_never_summed_across_replicas():
    # every worker process samples every stream and the queue: a sum counts each backlog once per pod
    for rule in RULES:
        expr = " ".join(str(rule["expr"]).split())
        for gauge in ("mnemos_stream_lag", "mnemos_stream_pending", "mnemos_stream_length", "mnemos_queue_length",
                      "mnemos_tenants_frozen"):
            assert f"sum({gauge}" not in expr and not (gauge in expr and expr.startswith("sum")), _id(rule)


def test_no_two_rules_share_a_name_and_labels():
    """promtool's duplicate-rules lint: the same name with the same labels evaluates twice."""
    seen = set()
    for rule in RULES:
        key = (_id(rule), tuple(sorted(rule.get("labels", {}).items())))
        assert key not in seen, f"duplicate rule {key}"
        seen.add(key)
    assert len({g["name"] for g in GROUPS}) == len(GROUPS)
