"""The demo's printout and a worker whose metrics port is taken (no servers needed)."""

from __future__ import annotations

import logging
import socket
from datetime import UTC, datetime

import pytest

from api.schemas import Hit, RetrievalResult
from workers.demo import format_result
from workers.metrics import ServiceMetrics, serve

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
        with caplog.at_level(logging.WARNING, logger="workers.metrics"):
            assert serve(metrics, port, "suppression") is False
    assert f"port {port}" in caplog.text and "MNEMOS_SUPPRESSION_METRICS_PORT" in caplog.text
    assert metrics.worker_up.labels(worker="suppression")._value.get() == 1
