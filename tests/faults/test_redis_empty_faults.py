"""Redis restarted empty in the middle of ingest: the workers go on, and what Redis lost is told apart.

Real ``mnemos worker ingest`` processes against the suite's private Redis, which restarts once
without its data (:mod:`bench.faults.redis_empty`). No worker may exit, every turn published after the
restart must be stored exactly once, and the turns lost upstream must be among those the ingest group
had not acknowledged when Redis went.
"""

from __future__ import annotations

import pytest

from bench.faults.redis_empty import run_redis_empty
from tests.faults.conftest import CI_PLAN, PhaseRunner

pytestmark = pytest.mark.faults


def test_after_redis_comes_back_empty_every_new_turn_is_stored_once(run_phase: PhaseRunner) -> None:
    report = run_phase(run_redis_empty)
    assert report.redis_restarts == 1 and report.kills == report.pauses == report.postgres_restarts == 0
    assert report.published_before > 0 and report.published_after > 0
    assert report.published_before + report.published_after == report.accepted == CI_PLAN.turns
    assert report.settled, "not every turn published after the restart reached Postgres in time"
    assert (report.lost, report.duplicated) == (0, 0)
    assert report.upstream_lost <= report.unacked_at_restart  # only what Redis held unacknowledged
    assert report.dedupe_violations == 0
    assert report.worker_exits == [], "a worker exited instead of recreating its consumer group"
    assert report.ok
