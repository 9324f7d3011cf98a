"""deploy/prometheus with Prometheus' own tool: `promtool check rules --lint-fatal` on the rules and
`promtool test rules` on the scenarios in deploy/prometheus/tests/, plus one scenario built from what
a freshly started worker's registry really exports (the first dead letter of a reason must alert).

promtool comes from the Debian package `prometheus` (.ci/run installs it when missing); without it
these tests skip with that message.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.manifests import DEPLOY
from workers.runtime.metrics import ServiceMetrics

RULE_FILE = DEPLOY / "prometheus" / "prometheusrule.yaml"
SCENARIOS = sorted((DEPLOY / "prometheus" / "tests").glob("*.yml"))
RULES_NAME = "mnemos.rules.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian package `prometheus`; .ci/run installs it): "
                    "the rules are only checked by the Python tests")
    return path


def _spec(*, annotations: bool) -> dict:
    spec = yaml.safe_load(RULE_FILE.read_text())["spec"]
    if not annotations:
        for group in spec["groups"]:
            for rule in group["rules"]:
                rule.pop("annotations", None)
    return spec


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=120)


def test_the_rules_pass_promtools_lint(promtool: str, tmp_path: Path) -> None:
    (tmp_path / RULES_NAME).write_text(yaml.safe_dump(_spec(annotations=True)))
    out = _run([promtool, "check", "rules", "--lint-fatal", RULES_NAME], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_scenarios_cover_the_operators_cases() -> None:
    names = {p.stem for p in SCENARIOS}
    assert {"worker_down_per_namespace", "heartbeat_stale_loop_stuck", "dead_letters", "retrieval_slo"} <= names
    for path in SCENARIOS:
        assert yaml.safe_load(path.read_text())["rule_files"] == [RULES_NAME], path.name


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda p: p.stem)
def test_scenario(promtool: str, tmp_path: Path, scenario: Path) -> None:
    (tmp_path / RULES_NAME).write_text(yaml.safe_dump(_spec(annotations=False)))
    shutil.copy(scenario, tmp_path / scenario.name)
    out = _run([promtool, "test", "rules", scenario.name], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr


def _scrape(metrics: ServiceMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """{(series name, labels): value} of one scrape of ``metrics`` (what Prometheus would store)."""
    samples = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            if sample.name.startswith("mnemos_dead_letters_total"):
                samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_the_first_dead_letter_of_a_reason_alerts_from_a_real_workers_scrapes(promtool: str, tmp_path: Path) -> None:
    """Five scrapes of a fresh ingest worker, one dead letter of reason bad_id, then ten more scrapes."""
    metrics = ServiceMetrics(worker="ingest")
    before = _scrape(metrics)
    metrics.rejected("bad_id")
    after = _scrape(metrics)
    target = {"namespace": "prod", "job": "mnemos-ingest-metrics", "pod": "ingest-a"}
    series = []
    for key in sorted(set(before) | set(after)):
        name, labels = key
        values = [("_" if key not in before else repr(before[key]))] * 5 + [repr(after[key])] * 10
        selector = ", ".join(f'{k}="{v}"' for k, v in sorted({**target, **dict(labels)}.items()))
        series.append({"series": f"{name}{{{selector}}}", "values": " ".join(values)})
    scenario = {
        "rule_files": [RULES_NAME],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": [{
            "eval_time": "7m", "alertname": "MnemosDeadLetters",
            "exp_alerts": [{"exp_labels": {"severity": "warning", "namespace": "prod", "job": "mnemos-ingest-metrics",
                                           "reason": "bad_id"}}]}]}],
    }
    (tmp_path / RULES_NAME).write_text(yaml.safe_dump(_spec(annotations=False)))
    (tmp_path / "first_dead_letter.yml").write_text(yaml.safe_dump(scenario))
    out = _run([promtool, "test", "rules", "first_dead_letter.yml"], tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
