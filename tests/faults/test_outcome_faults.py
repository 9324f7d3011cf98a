"""Promise 2 under faults: every outcome changes the scores exactly once (ledger and recomputation agree)."""

from __future__ import annotations

import pytest

from bench.faults.phases import run_outcomes
from tests.faults.conftest import CI_PLAN, PhaseRunner

pytestmark = pytest.mark.faults


def test_every_outcome_is_applied_exactly_once_across_kills_pauses_and_restarts(run_phase: PhaseRunner) -> None:
    report = run_phase(run_outcomes)
    assert report.settled, "not every accepted outcome reached the ledger within the settle timeout"
    assert (report.lost, report.duplicated) == (0, 0)
    assert report.score_mismatches == 0, "scores differ from a recomputation from the published outcomes"
    assert report.ledger_mismatches == 0, "scores differ from a recomputation from the ledger"
    assert report.buffer_violations == 0, "bootstrap buffer holds a query twice or froze at the wrong size"
    assert (report.kills, report.pauses, report.redis_restarts, report.postgres_restarts) == (
        CI_PLAN.kills, CI_PLAN.pauses, CI_PLAN.redis_restarts, CI_PLAN.postgres_restarts)
    assert report.worker_exits == [], "a worker died on its own (see its log)"
    assert report.resent > 0
