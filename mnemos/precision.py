"""The floating-point format a model computes in, and the ``auto`` rule that picks one per device.

Both models take such a setting: the cross-encoder (``MNEMOS_RERANK_PRECISION``) and the
bi-encoder (``MNEMOS_ENCODER_PRECISION``). ``auto`` computes in bfloat16 on a CPU with native
bfloat16 matmul instructions, where it ranks as fp32 does at a fraction of the time, and in fp32
everywhere else (docs/architecture.md "Precision"). Outputs are float32 whatever the format.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any


class Precision(StrEnum):
    """Floating-point format a model computes in.

    ``fp16`` runs on CUDA only (CPU half-precision matmuls are slow and lose accuracy); ``bf16``
    runs on either device. ``auto`` is not a format: :func:`resolve_precision` turns it into one
    for a device.
    """

    AUTO = "auto"
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"


def cpu_computes_bf16() -> bool:
    """True when this CPU has native bfloat16 matmul instructions (AVX512-BF16 or AMX) that
    PyTorch's oneDNN kernels use; False without them (bf16 would then be emulated, slower than
    fp32), or when the checks themselves are unavailable in the installed PyTorch.

    oneDNN's own answer (``torch.ops.mkldnn._is_mkldnn_bf16_supported``) is not enough: it is
    also True on a plain AVX-512 core, where bf16 is emulated. On such an Intel Xeon (AVX-512 and
    VNNI, no AVX512-BF16, no AMX) the bundled bi-encoder read 98 turns/s in bf16 against 257 in
    fp32 (2026-12-07), so the CPU's own instruction flags decide.
    """
    try:
        import torch

        available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return bool(available and native and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # private checks: absent or changed in another PyTorch, answer "no"
        return False


def resolve_precision(precision: Precision | str, device: str,
                      cpu_bf16: Callable[[], bool] | None = None) -> Precision:
    """The format a model computes in on ``device`` (a torch device string).

    An explicit format is returned as it is. ``auto`` is ``bf16`` on a CPU that computes bfloat16
    natively (``cpu_bf16()``, by default :func:`cpu_computes_bf16`); ``fp32`` on any other CPU and
    on CUDA (reduced precision on a GPU is chosen explicitly, after ``bench/quality/precision_check.py``).

    Raises:
        ValueError: for a value that is not a :class:`Precision`.
    """
    precision = Precision(precision)
    if precision is not Precision.AUTO:
        return precision
    if device.startswith("cpu") and (cpu_bf16 or cpu_computes_bf16)():
        return Precision.BF16
    return Precision.FP32


def torch_dtype(precision: Precision) -> Any:
    """The ``torch.dtype`` of a resolved format.

    Raises:
        ValueError: for ``auto`` (resolve it first).
    """
    import torch

    dtypes = {Precision.FP32: torch.float32, Precision.FP16: torch.float16, Precision.BF16: torch.bfloat16}
    if precision not in dtypes:
        raise ValueError(f"{precision!r} is not a format: resolve it with resolve_precision first")
    return dtypes[precision]


__all__ = ["Precision", "cpu_computes_bf16", "resolve_precision", "torch_dtype"]
