"""Promise 1 under faults: every accepted turn is in Postgres exactly once, entry or alias."""

from __future__ import annotations

import pytest

from bench.faults.phases import run_turns
from tests.faults.conftest import CI_PLAN, PhaseRunner

pytestmark = pytest.mark.faults


def test_no_turn_is_lost_or_duplicated_across_kills_pauses_and_restarts(run_phase: PhaseRunner) -> None:
    report = run_phase(run_turns)
    assert report.settled, "not every accepted turn reached Postgres within the settle timeout"
    assert (report.lost, report.duplicated) == (0, 0)
    assert (report.kills, report.pauses, report.redis_restarts, report.postgres_restarts) == (
        CI_PLAN.kills, CI_PLAN.pauses, CI_PLAN.redis_restarts, CI_PLAN.postgres_restarts)
    assert report.dead_letters_found == report.dead_letters_expected > 0  # malformed turns: letters, once
    assert report.dedupe_violations == 0 and report.aliases >= CI_PLAN.turns // 25 - CI_PLAN.tenants
    assert report.worker_exits == [], "a worker died on its own (see its log)"
    assert report.accepted == CI_PLAN.turns and report.resent > 0
