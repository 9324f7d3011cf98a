"""The ``auto`` precision rule: bf16 only where the CPU computes it natively and measurably faster."""

from __future__ import annotations

import math

import pytest
import torch

from mnemos.precision import (
    BF16_MIN_SPEEDUP,
    Precision,
    bf16_faster_on_cpu,
    cpu_computes_bf16,
    measure_bf16_speedup,
    resolve_precision,
)


@pytest.mark.parametrize(("avx512_bf16", "amx", "onednn", "expected"), [
    (False, False, True, False),  # a plain AVX-512 core: oneDNN says yes, but it emulates bf16
    (True, False, True, True),
    (False, True, True, True),
    (True, True, False, False),
])
def test_native_bf16_needs_the_cpus_own_instructions(monkeypatch: pytest.MonkeyPatch, avx512_bf16: bool,
                                                     amx: bool, onednn: bool, expected: bool) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", lambda: 3.0)  # as with AMX
    assert cpu_computes_bf16() is expected
    assert resolve_precision("auto", "cpu") is (Precision.BF16 if expected else Precision.FP32)


def test_a_missing_check_answers_no(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert cpu_computes_bf16() is False
    assert resolve_precision("auto", "cuda") is Precision.FP32
    assert resolve_precision("bf16", "cpu") is Precision.BF16


@pytest.mark.parametrize(("native", "speedup", "expected"), [
    (True, 3.0, True),  # AMX, or AMD EPYC with AVX512-BF16
    (True, 0.7, False),  # Intel with AVX512-BF16 but no AMX: native, yet slower than fp32
    (True, BF16_MIN_SPEEDUP * 0.96, False),  # a little faster is not enough to pay for a noisy choice
    (True, BF16_MIN_SPEEDUP, True),
])
def test_auto_picks_bf16_only_where_it_is_measured_clearly_faster(monkeypatch: pytest.MonkeyPatch, native: bool,
                                                                  speedup: float, expected: bool) -> None:
    monkeypatch.setattr("mnemos.precision.cpu_computes_bf16", lambda: native)
    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", lambda: speedup)
    assert bf16_faster_on_cpu() is expected
    assert resolve_precision("auto", "cpu") is (Precision.BF16 if expected else Precision.FP32)
    assert resolve_precision("auto", "cuda") is Precision.FP32
    assert resolve_precision("fp32", "cpu") is Precision.FP32 and resolve_precision("bf16", "cpu") is Precision.BF16


def test_without_native_instructions_nothing_is_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    def measure() -> float:
        raise AssertionError("measured on a CPU without native bf16")

    monkeypatch.setattr("mnemos.precision.cpu_computes_bf16", lambda: False)
    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", measure)
    assert bf16_faster_on_cpu() is False
    assert resolve_precision("auto", "cpu") is Precision.FP32


def test_the_measurement_is_a_positive_ratio_taken_once_per_process() -> None:
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        speedup = measure_bf16_speedup(tokens=128, repeats=1)  # small: the ratio's value is the machine's
        assert torch.get_num_threads() == 2  # measured on one thread, the caller's count given back
    finally:
        torch.set_num_threads(threads)
    assert math.isfinite(speedup) and speedup > 0
    assert measure_bf16_speedup(tokens=128, repeats=1) == speedup  # cached, not measured again


def test_a_measurement_that_fails_falls_back_to_fp32(monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def measure() -> float:
        raise RuntimeError("no bf16 kernel for this operation")

    monkeypatch.setattr("mnemos.precision.cpu_computes_bf16", lambda: True)
    monkeypatch.setattr("mnemos.precision.measure_bf16_speedup", measure)
    assert resolve_precision("auto", "cpu") is Precision.FP32
    assert "bf16 measurement failed (RuntimeError: no bf16 kernel" in caplog.text
