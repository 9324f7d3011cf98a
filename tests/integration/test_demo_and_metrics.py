"""The demo's printout, a worker whose metrics port is taken, per-worker metric families (no servers needed)."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime

import pytest

from api.schemas import Hit, RetrievalResult
from workers.ops.demo import format_result
from workers.runtime.metrics import MCP, WORKERS, ServiceMetrics, serve, start_server

WHEN = datetime(2024, 4, 2, 18, 0, tzinfo=UTC)


def _result(pool_size: int, scores: list[float]) -> RetrievalResult:
    hits = tuple(Hit(i, f"t{i}", "s", "user", f"text {i}", WHEN, score, i) for i, score in enumerate(scores, 1))
    return RetrievalResult("r", "maya", hits, pool_size, False, None, None, {"total": 0.012}, 1)


def test_fused_scores_print_apart_and_say_no_reranker_ran() -> None:
    text = format_result("maya", "q?", _result(0, [1 / 61 + 1 / 62, 1 / 61 + 1 / 63]))
    assert "(no reranker: fused order, 12 ms in the worker)" in text and "pool 0" not in text
    assert "+0.0325" in text and "+0.0323" in text


def test_reranked_results_show_the_pool_and_logits() -> None:
    text = format_result("maya", "q?", _result(30, [4.25, -1.5]))
    assert "(pool 30, deep pass False, 12 ms" in text and "+4.2500" in text and "-1.5000" in text
    assert "(no hits," in format_result("maya", "q?", _result(0, []))


def test_a_taken_metrics_port_is_a_warning_and_the_worker_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("", 0))
        taken.listen()
        port = taken.getsockname()[1]
        metrics = ServiceMetrics()
        with caplog.at_level(logging.WARNING, logger="workers.runtime.metrics"):
            assert serve(metrics, port, "suppression") is False
    assert f"port {port}" in caplog.text and "MNEMOS_SUPPRESSION_METRICS_PORT" in caplog.text
    assert metrics.worker_up.labels(worker="suppression")._value.get() == 1


def test_the_metrics_listen_on_the_configured_host() -> None:
    server = start_server(ServiceMetrics(), 0, host="127.0.0.1")  # MNEMOS_METRICS_HOST=127.0.0.1
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
    server = start_server(ServiceMetrics(), 0)  # the default: every interface (Prometheus scrapes the pod IP)
    try:
        assert server.server_address[0] == "0.0.0.0"
    finally:
        server.shutdown()
        server.server_close()


def _families(metrics: ServiceMetrics) -> set[str]:
    return {family.name for family in metrics.registry.collect()}


def test_each_worker_registers_its_own_families_and_the_shared_ones() -> None:
    everything = _families(ServiceMetrics())
    per_worker = {kind: _families(ServiceMetrics(worker=kind)) for kind in (*WORKERS, MCP)}
    shared = {"mnemos_stream_length", "mnemos_stream_pending", "mnemos_stream_lag", "mnemos_queue_length",
              "mnemos_worker_up", "mnemos_dead_letters", "mnemos_worker_heartbeat_timestamp_seconds",
              "mnemos_embedding_version_refusals", "mnemos_tenants_frozen"}
    for kind, names in per_worker.items():
        others = {n for n in names if n.startswith("mnemos_") and not n.startswith(f"mnemos_{kind}_")}
        assert others == shared, kind
    assert set().union(*per_worker.values()) == everything
    query = ServiceMetrics(worker="query")  # observers of other workers' families still work, unexposed
    query.ingest_batch(read=1, claimed=0, embed_s=0.1, commit_s=0.1, indexed=1, duplicates=0, truncated=0)
    query.rejected("bad_json")
    assert query.ingest_turns_read._value.get() == 1
    with pytest.raises(ValueError, match="worker must be one of"):
        ServiceMetrics(worker="reranker")
