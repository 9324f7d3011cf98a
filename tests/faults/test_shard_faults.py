"""One shard's Redis down among three: its tenants fail fast by name, the others keep being served.

Real ``mnemos worker ingest`` and ``query`` processes per shard, each shard on its own private
``redis-server`` and database (:mod:`bench.faults.shards`); shard 1's Redis is SIGKILLed for a few
seconds and restarted with its append-only file. Every accepted turn must be stored once on its own
shard, the healthy shards must answer during the outage without a failure, and every failure of
the down shard must be typed.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.faults.shards import DOWN, Ask, isolation_violations, percentile, run_shards, shard_figures
from tests.faults.conftest import CI_PLAN, PhaseRunner

pytestmark = pytest.mark.faults

TINY = replace(CI_PLAN, turns=300, tenants=2, queries=50, publish_seconds=12.0, shard_outage_s=3.0)


def test_figures_split_at_the_outage_and_catch_a_healthy_shard_that_failed() -> None:
    window = (10.0, 13.0)
    asks = [Ask(0, "t", 1.0, 0.9, "answered", first=True), Ask(0, "t", 2.0, 0.1, "answered"),
            Ask(0, "t", 11.0, 0.2, "answered"), Ask(0, "t", 14.0, 0.3, "answered"),
            Ask(DOWN, "u", 11.0, 4.7, "ShardUnavailable", named_shard=DOWN), Ask(DOWN, "u", 12.0, 4.0, "RetrievalTimeout"),
            Ask(2, "v", 11.5, 0.1, "answered")]
    zero = shard_figures(0, asks, window)
    assert (zero.answered, zero.answered_during, zero.failed) == (4, 1, {})
    assert (zero.p50_before_s, zero.p50_during_s, zero.p50_after_s) == (0.1, 0.2, 0.3)  # the cold first ask left out
    down = shard_figures(DOWN, asks, window)
    assert (down.unavailable_named, down.failed_during, down.max_fail_s) == (1, 2, 4.7)
    figures = [zero, down, shard_figures(2, asks, window)]
    assert isolation_violations(figures, asks) == 0
    failed = [*asks, Ask(2, "v", 12.0, 4.0, "RetrievalTimeout"), Ask(0, "t", 3.0, 0.1, "ShardUnavailable", named_shard=1)]
    assert isolation_violations([zero, down, shard_figures(2, failed, window)], failed) == 2
    quiet = [a for a in asks if a.shard != 2]  # shard 2 answered nothing during the outage
    assert isolation_violations([zero, down, shard_figures(2, quiet, window)], quiet) == 1
    assert percentile([3.0, 1.0, 2.0], 0.5) == 2.0 and percentile([], 0.95) is None


def test_one_shard_s_redis_down_fails_only_its_tenants_and_loses_nothing(run_phase: PhaseRunner) -> None:
    report = run_phase(run_shards, TINY)
    assert report.redis_restarts == 1 and report.settled, "the outage did not end or the shards did not settle"
    assert [f.shard for f in report.per_shard] == [0, 1, 2] and all(f.turns > 0 for f in report.per_shard)
    assert report.accepted == TINY.turns
    assert [(f.lost, f.duplicated) for f in report.per_shard] == [(0, 0)] * 3
    healthy = [f for f in report.per_shard if f.shard != DOWN]
    assert all(f.answered_during > 0 and not f.failed for f in healthy), "a healthy shard stopped answering"
    down = report.per_shard[DOWN]
    assert down.unavailable_named > 0, "the down shard's tenants did not get ShardUnavailable naming it"
    assert down.max_fail_s < TINY.query_timeout_s + 2.0
    assert not report.untyped_failures and report.isolation_violations == 0
    assert report.retry_ok and report.worker_exits == []
    assert report.ok
