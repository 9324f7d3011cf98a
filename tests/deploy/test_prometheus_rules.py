"""deploy/prometheus: every rule parses as PromQL and reads only metrics the workers register."""

from __future__ import annotations

import pytest

from tests.deploy import manifests, promql
from tests.deploy.manifests import DEPLOY, K8S_VERSIONS, WORKERS

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
def test_expression_reads_only_spec_metrics(rule):
    bad = promql.unknown_series([str(rule["expr"])], promql.spec_series(), RECORDED)
    assert not bad, f"{_id(rule)} reads series outside the metric contract: {bad}"


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_expression_reads_only_registered_metrics(rule, registered_series):
    bad = promql.unknown_series([str(rule["expr"])], registered_series, RECORDED)
    assert not bad, f"{_id(rule)} reads series workers/metrics.py does not register: {bad}"


@pytest.mark.parametrize("rule", RULES, ids=_id)
def test_matchers_use_real_labels_and_values(rule):
    assert not promql.bad_matchers(str(rule["expr"]), promql.SPEC_METRICS)


def test_required_alerts_exist():
    assert {r["alert"] for r in ALERTS} >= REQUIRED_ALERTS


def test_worker_down_covers_every_worker():
    covered = set()
    for rule in ALERTS:
        if rule["alert"] != "MnemosWorkerDown":
            continue
        (selector,) = promql.selectors(rule["expr"])
        assert rule["expr"].startswith("absent(") and selector.name == "mnemos_worker_up"
        covered |= {value for label, op, value in selector.matchers if label == "worker" and op == "="}
    assert covered == set(WORKERS)


def test_retrieval_p95_alert_is_on_the_total_stage_histogram():
    (rule,) = [r for r in ALERTS if r["alert"] == "MnemosRetrievalP95High"]
    (selector,) = promql.selectors(rule["expr"])
    record = next(r for r in RECORDS if r["record"] == selector.name)
    assert "histogram_quantile(0.95" in record["expr"]
    assert {s.name for s in promql.selectors(record["expr"])} == {"mnemos_query_stage_seconds_bucket"}
    assert ("stage", "=", "total") in selector.matchers


@pytest.mark.parametrize("rule", ALERTS, ids=_id)
def test_alert_is_actionable(rule):
    assert rule["labels"]["severity"] in ("warning", "critical")
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
                      "mnemos:query_stage_seconds:p50_5m"}
    assert unused <= allowed_unused, f"recording rules nothing reads: {unused - allowed_unused}"


def test_stream_and_queue_gauges_are_never_summed_across_replicas():
    # every worker process samples every stream and the queue: a sum counts each backlog once per pod
    for rule in RULES:
        expr = " ".join(str(rule["expr"]).split())
        for gauge in ("mnemos_stream_lag", "mnemos_stream_pending", "mnemos_stream_length", "mnemos_queue_length"):
            assert f"sum({gauge}" not in expr and not (gauge in expr and expr.startswith("sum")), _id(rule)


def test_alert_and_record_names_are_unique_per_expression():
    seen = set()
    for rule in RULES:
        key = (_id(rule), str(rule["expr"]))
        assert key not in seen, f"duplicate rule {key}"
        seen.add(key)
    assert len({g["name"] for g in GROUPS}) == len(GROUPS)
