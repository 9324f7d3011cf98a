"""What a worker's /metrics holds before anything happened, and what an unknown lag does to its gauge."""

from __future__ import annotations

from prometheus_client import generate_latest

from api.errors import Reason
from workers.runtime.metrics import JOB_STATUSES, ServiceMetrics


def test_every_dead_letter_reason_and_job_status_is_exported_at_zero_from_the_start() -> None:
    for worker in ("ingest", "query", "suppression"):
        metrics = ServiceMetrics(worker=worker)
        for reason in Reason:
            assert metrics.registry.get_sample_value("mnemos_dead_letters_total", {"reason": reason.value}) == 0.0
    ingest = ServiceMetrics(worker="ingest")
    assert all(ingest.registry.get_sample_value("mnemos_ingest_turns_rejected_total", {"reason": r.value}) == 0.0
               for r in Reason)
    query = ServiceMetrics(worker="query")
    assert [query.registry.get_sample_value("mnemos_query_jobs_total", {"status": s}) for s in JOB_STATUSES] == [0, 0]
    assert query.registry.get_sample_value("mnemos_query_jobs_expired_total") == 0.0
    text = generate_latest(query.registry).decode()
    assert 'mnemos_dead_letters_total{reason="empty_text"} 0.0' in text


def test_an_unknown_lag_removes_the_gauge_instead_of_keeping_the_last_value() -> None:
    metrics = ServiceMetrics(worker="ingest")
    metrics.stream_state("mnemos:turns", "ingest", length=10, pending=2, lag=7)
    labels = {"stream": "mnemos:turns", "group": "ingest"}
    assert metrics.registry.get_sample_value("mnemos_stream_lag", labels) == 7
    metrics.stream_state("mnemos:turns", "ingest", length=10, pending=2, lag=None)
    assert metrics.registry.get_sample_value("mnemos_stream_lag", labels) is None
    assert metrics.registry.get_sample_value("mnemos_stream_pending", labels) == 2
    metrics.stream_state("mnemos:turns", "ingest", length=10, pending=2, lag=None)  # still unknown: no error
    metrics.stream_state("mnemos:turns", "ingest", length=10, pending=2, lag=3)
    assert metrics.registry.get_sample_value("mnemos_stream_lag", labels) == 3
