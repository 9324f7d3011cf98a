"""The main job's query latency: new questions (the cross-encoder scored their pool) apart from
questions answered wholly from the query worker's score cache."""

from __future__ import annotations

from types import SimpleNamespace

from api.schemas import RetrievalResult
from bench.service.report import cache_split


def _asked(latency_s: float, scored: int | None, cached: int | None) -> SimpleNamespace:
    result = RetrievalResult("r", "t", (), 30, False, None, None, {}, 1, rerank_pairs_scored=scored,
                             rerank_pairs_cached=cached)
    return SimpleNamespace(latency_s=latency_s, result=result, phase="evaluation")


def test_new_and_cached_questions_are_reported_apart():
    asked = [_asked(0.6, 30, 0), _asked(0.7, 2, 28), _asked(0.02, 0, 30), _asked(0.03, 0, 30),
             _asked(0.04, 0, 30), _asked(9.9, None, None)]
    split = cache_split(asked)
    # one pair scored by the model makes a question new; an answer without counts is in neither group
    assert split["pairs_scored"] == {"n": 2, "p50_s": 0.65, "p95_s": 0.695}
    assert split["all_pairs_cached"]["n"] == 3 and split["all_pairs_cached"]["p50_s"] == 0.03
    assert split["cached_share"] == 0.6


def test_no_counts_no_split():
    split = cache_split([_asked(0.5, None, None)])
    assert split["pairs_scored"] == {"n": 0, "p50_s": None, "p95_s": None} and split["cached_share"] is None


def test_result_payload_round_trips_the_counts():
    result = _asked(0.1, 3, 27).result
    again = RetrievalResult.from_payload(result.to_payload())
    assert (again.rerank_pairs_scored, again.rerank_pairs_cached) == (3, 27)
    older = {k: v for k, v in result.to_payload().items() if not k.startswith("rerank_pairs")}
    assert RetrievalResult.from_payload(older).rerank_pairs_scored is None


def test_the_report_records_the_formats_and_the_measurement_behind_auto(monkeypatch) -> None:
    from bench.service.report import _precisions
    from workers.settings import Settings

    monkeypatch.setattr("mnemos.precision.cpu_computes_bf16", lambda: False)
    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: False)
    assert _precisions(Settings(device="cpu")) == {"encoder": "fp32", "cross_encoder": "fp32", "bf16_speedup": None}
    monkeypatch.setattr("mnemos.precision.cpu_computes_bf16", lambda: True)
    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", lambda: 2.876)
    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: True)
    assert _precisions(Settings(device="cpu", rerank_precision="fp32")) == {
        "encoder": "bf16", "cross_encoder": "fp32", "bf16_speedup": 2.88}

    def fails() -> float:
        raise RuntimeError("no bf16 kernel")

    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", fails)  # the report after a whole run: no raise
    monkeypatch.setattr("mnemos.precision.bf16_faster_on_cpu", lambda: False)
    assert _precisions(Settings(device="cpu"))["bf16_speedup"] is None
