"""Promise 5 under faults: every retrieval ends within its timeout, with a result or a typed error."""

from __future__ import annotations

import signal
import threading
import time

import pytest
import redis

from api.client import MnemosClient
from api.errors import MnemosClientError
from bench.faults.phases import run_queries, seed_entries
from bench.faults.run import FaultRun
from tests.faults.conftest import CI_PLAN, PhaseRunner

pytestmark = pytest.mark.faults


def test_every_request_ends_in_time_while_query_workers_and_servers_fail(run_phase: PhaseRunner) -> None:
    report = run_phase(run_queries)
    assert report.untyped_failures == [], "a request ended with an error that is not a MnemosClientError"
    assert report.overtime == 0, f"a request took {report.max_wait_s:.1f}s with a {CI_PLAN.query_timeout_s}s timeout"
    assert report.isolation_violations == 0
    assert report.retry_ok, "after the faults, asking again did not succeed"
    assert report.answered > CI_PLAN.queries // 2  # most requests are answered despite the faults
    assert sum(report.typed_failures.values()) + report.answered == CI_PLAN.queries
    assert (report.kills, report.redis_restarts, report.postgres_restarts) == (
        CI_PLAN.kills, CI_PLAN.redis_restarts, CI_PLAN.postgres_restarts)
    assert report.worker_exits == [], "a query worker died on its own (see its log)"


def test_a_query_worker_survives_a_redis_restart_during_a_job(fault_run: FaultRun) -> None:
    """The stream workers back off and reconnect; the query worker must too, keeping its models and
    indexes, instead of exiting (which under ``mnemos up`` stops the whole service)."""
    settings = fault_run.settings("survive", CI_PLAN).replace(retrieve_timeout_s=10.0)
    seed_entries(fault_run, settings, ["solo"], per_tenant=6)
    worker = fault_run.workers("query", settings, 1)[0]
    worker.start()
    fault_run.wait_for_query_worker(settings)
    client = fault_run.client(settings)
    try:
        assert client.retrieve("solo", "w1x1", k=3, timeout_s=30.0).hits
        for _ in range(3):
            fault_run.redis.restart(down_s=1.5)  # the worker is blocked on the queue or finishing a job
            time.sleep(0.5)
            assert worker.exited() is None, f"the query worker exited:\n{worker.tail(3000)}"
        result = client.retrieve("solo", "w2x2", k=3, timeout_s=30.0)
        assert result.hits and all(h.turn_id.startswith("solo-") for h in result.hits)
        assert worker.exited() is None and worker.starts == 1
    finally:
        worker.terminate()
    assert worker.exited() == 0  # SIGTERM still ends it cleanly


def test_a_retrieval_ends_in_time_when_redis_hangs(fault_run: FaultRun) -> None:
    """A stopped (not dead) Redis accepts the connection and never answers: the client's own
    timeout must still end the request with a typed error, whatever connection it was given."""
    settings = fault_run.settings("hang", CI_PLAN)
    seed_entries(fault_run, settings, ["solo"], per_tenant=3)
    worker = fault_run.workers("query", settings, 1)[0]
    worker.start()
    fault_run.wait_for_query_worker(settings)
    plain = redis.Redis.from_url(settings.redis_url)  # no socket timeout, as a caller may well build it
    client = MnemosClient(plain, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name)
    ended: dict[str, object] = {}
    try:
        assert client.retrieve("solo", "w1x1", k=3, timeout_s=30.0).hits  # warm: connected, worker up

        def ask() -> None:
            began = time.monotonic()
            try:
                client.retrieve("solo", "w2x2", k=3, timeout_s=2.0)
                ended["how"] = "answered"
            except MnemosClientError as exc:
                ended["how"] = type(exc).__name__
            except Exception as exc:
                ended["how"] = f"untyped {exc!r}"
            ended["seconds"] = time.monotonic() - began

        fault_run.redis.process.send_signal(signal.SIGSTOP)
        asker = threading.Thread(target=ask, daemon=True)
        asker.start()
        asker.join(20.0)
        fault_run.redis.process.send_signal(signal.SIGCONT)
        assert not asker.is_alive(), "the request never ended while Redis hung"
        assert ended["how"] in ("RetrievalTimeout", "ServiceUnavailable"), ended
        assert float(ended["seconds"]) < 2.0 + 6.0
    finally:
        fault_run.redis.process.send_signal(signal.SIGCONT)
        worker.terminate()
