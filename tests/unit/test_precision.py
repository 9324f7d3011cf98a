"""The ``auto`` precision rule: bf16 only where the CPU computes it natively."""

from __future__ import annotations

import pytest
import torch

from mnemos.precision import Precision, cpu_computes_bf16, resolve_precision


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
    assert cpu_computes_bf16() is expected
    assert resolve_precision("auto", "cpu") is (Precision.BF16 if expected else Precision.FP32)


def test_a_missing_check_answers_no(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert cpu_computes_bf16() is False
    assert resolve_precision("auto", "cuda") is Precision.FP32
    assert resolve_precision("bf16", "cpu") is Precision.BF16
