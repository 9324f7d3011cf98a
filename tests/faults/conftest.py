"""The fault-injection suite (marker ``faults``): private Redis and Postgres, real worker processes.

One private Redis (append-only file, fsync always) and one private Postgres cluster (``initdb``)
per session, on spare loopback ports in a temporary directory; the machine's shared servers are
never restarted. Skipped when ``redis-server`` or ``initdb`` is not installed. The longer run is
``mnemos bench faults`` (see bench/results/faults.md).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from bench.faults.run import FaultPlan, FaultRun, PhaseReport
from bench.faults.servers import ServerError, redis_binaries

# CI size: both phases together stay well under two minutes on 2 shared cores
CI_PLAN = FaultPlan(turns=1000, outcomes=500, tenants=4, workers=3, kills=4, pauses=1, redis_restarts=1,
                    postgres_restarts=1, publish_seconds=18.0, settle_timeout_s=90.0, claim_idle_ms=1500, seed=0)


@pytest.fixture(scope="session")
def fault_run() -> Iterator[FaultRun]:
    if not redis_binaries():
        pytest.skip("redis-server is not installed")
    workdir = Path(tempfile.mkdtemp(prefix="mnemos-faults-"))
    workdir.chmod(0o755)  # the postgres user (initdb refuses root) must reach its data directory
    run = FaultRun(workdir)
    try:
        run.__enter__()
    except (ServerError, FileNotFoundError) as exc:
        run.__exit__(None, None, None)
        shutil.rmtree(workdir, ignore_errors=True)
        pytest.skip(f"cannot start private servers: {exc}")
    try:
        yield run
    finally:
        run.__exit__(None, None, None)
        shutil.rmtree(workdir, ignore_errors=True)


Phase = Callable[[FaultRun, FaultPlan], PhaseReport]
PhaseRunner = Callable[..., PhaseReport]  # what the run_phase fixture gives: phase, optional plan -> report


@pytest.fixture
def run_phase(fault_run: FaultRun, capsys: pytest.CaptureFixture[str]) -> PhaseRunner:
    """Runs one phase (``bench.fault_*.run_*``) on the session's fault run, with :data:`CI_PLAN` unless
    another plan is given, and prints its report line past pytest's capture."""

    def run(phase: Phase, plan: FaultPlan = CI_PLAN) -> PhaseReport:
        report = phase(fault_run, plan)
        with capsys.disabled():
            print("\n" + report.line())
        return report

    return run
