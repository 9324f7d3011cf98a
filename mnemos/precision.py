"""The floating-point format a model computes in, and the ``auto`` rule that picks one per device.

Both models take such a setting: the cross-encoder (``MNEMOS_RERANK_PRECISION``) and the
bi-encoder (``MNEMOS_ENCODER_PRECISION``). ``auto`` computes in bfloat16 on a CPU with native
bfloat16 matmul instructions where a short measurement shows bf16 to be clearly faster than fp32
there (it ranks as fp32 does at a fraction of the time), and in fp32 everywhere else
(docs/architecture.md "Precision"). Outputs are float32 whatever the format.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)

# bf16 is chosen by ``auto`` only when the probe runs at least this many times as fast as in fp32: a
# clear margin, so that a noisy measurement cannot flip the choice between processes on one machine
# (measured speed-ups: about 3 with AMX, about 2.8 on AMD EPYC with AVX512-BF16, about 0.7 on Intel
# with AVX512-BF16 but no AMX; docs/architecture.md "Precision").
BF16_MIN_SPEEDUP = 1.25


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
    fp32 (2026-12-07), so the CPU's own instruction flags decide. They are the CPU's, not what
    oneDNN is allowed to use: under ``ONEDNN_MAX_CPU_ISA`` set below them this still answers True,
    and :func:`measure_bf16_speedup` then finds bf16 slower.
    """
    try:
        import torch

        available = torch.backends.mkldnn.is_available()  # type: ignore[no-untyped-call]
        native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        return bool(available and native and torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # private checks: absent or changed in another PyTorch, answer "no"
        return False


@functools.cache
def measure_bf16_speedup(tokens: int = 1024, repeats: int = 5) -> float:
    """How many times as fast one encoder layer of the project's models runs in bf16 as in fp32 on
    this CPU: fp32 seconds / bf16 seconds, each the fastest of ``repeats`` timed forwards (the two
    formats interleaved) after one warm-up each, on one thread (the caller's thread count is restored).
    Measured once per process (cached); takes about 0.6 s on an idle core, up to 1.4 s on a busy one.

    One thread, because with two a busy machine pulls the ratio towards 1: on 2 shared cores the
    forwards waited on each other's threads (about 100 ms in fp32, 80 in bf16, against 33 and 12 on
    one thread), and ten processes chose differently (break-it round 15). On one thread the ratio
    stayed 2.9-3.4 with AMX and 0.70-0.83 with oneDNN capped below AMX, a core busy or not.

    The layer has the shape of the bundled MiniLM's (hidden size 384, 12 heads, feed-forward 1536,
    GELU, layer norms, scaled dot-product attention) over ``tokens`` tokens in sequences of 128, with
    seeded random weights: the models' cost is such layers, so their ratio is the models' ratio.
    Instruction flags alone do not predict it: on an Intel Xeon with AVX512-BF16 but no AMX the
    cross-encoder was 1.5 times slower in bf16 than in fp32 (2026-12-07).
    """
    import torch

    hidden, heads, sequence = 384, 12, 128
    generator = torch.Generator().manual_seed(0)
    shapes = {"qkv": (3 * hidden, hidden), "out": (hidden, hidden), "up": (4 * hidden, hidden),
              "down": (hidden, 4 * hidden)}
    fp32 = {name: torch.randn(shape, generator=generator) * 0.05 for name, shape in shapes.items()}
    x32 = torch.randn(max(1, tokens // sequence), sequence, hidden, generator=generator)

    def layer(x: Any, w: dict[str, Any]) -> Any:
        batch = x.shape[0]
        q, k, v = torch.nn.functional.linear(x, w["qkv"]).view(batch, sequence, 3, heads, -1).unbind(2)
        attended = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2).reshape(x.shape)
        x = torch.nn.functional.layer_norm(x + torch.nn.functional.linear(attended, w["out"]), (hidden,))
        up = torch.nn.functional.gelu(torch.nn.functional.linear(x, w["up"]))
        return torch.nn.functional.layer_norm(x + torch.nn.functional.linear(up, w["down"]), (hidden,))

    bf16 = {name: weight.to(torch.bfloat16) for name, weight in fp32.items()}
    runs = [(x32, fp32), (x32.to(torch.bfloat16), bf16)]
    best = [float("inf"), float("inf")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: waits between threads on a shared machine would set the ratio
    try:
        with torch.inference_mode():
            for x, w in runs:
                layer(x, w)  # warm-up: kernels chosen, buffers allocated
            for _ in range(repeats):  # interleaved, so that a busy machine slows both formats alike
                for i, (x, w) in enumerate(runs):
                    start = time.perf_counter()
                    layer(x, w)
                    best[i] = min(best[i], time.perf_counter() - start)
    finally:
        torch.set_num_threads(threads)
    return best[0] / best[1]


def bf16_speedup() -> float | None:
    """:func:`measure_bf16_speedup` on a CPU with native bfloat16 instructions (:func:`cpu_computes_bf16`);
    None without them (nothing is measured) or when the measurement fails (an operation missing in
    another PyTorch; logged as a warning), never an exception: ``auto`` and the reports read it."""
    if not cpu_computes_bf16():
        return None
    try:
        return measure_bf16_speedup()
    except Exception as exc:  # the safe format, rather than a worker that cannot start
        log.warning("precision auto: the bf16 measurement failed (%s: %s); computing in fp32", type(exc).__name__, exc)
        return None


def bf16_faster_on_cpu() -> bool:
    """True when ``auto`` should compute in bf16 on this CPU: :func:`bf16_speedup` is at least
    ``BF16_MIN_SPEEDUP`` (so False without native instructions or when the measurement failed).
    The measurement and the choice are logged once.
    """
    speedup = bf16_speedup()
    return speedup is not None and _bf16_choice(speedup)


@functools.cache
def _bf16_choice(speedup: float) -> bool:
    chosen = speedup >= BF16_MIN_SPEEDUP
    log.info("precision auto: one encoder layer runs %.2f times as fast in bf16 as in fp32 on this CPU; "
             "auto computes in %s (bf16 needs %.2f)", speedup, "bf16" if chosen else "fp32", BF16_MIN_SPEEDUP)
    return chosen


def resolve_precision(precision: Precision | str, device: str,
                      cpu_bf16: Callable[[], bool] | None = None) -> Precision:
    """The format a model computes in on ``device`` (a torch device string).

    An explicit format is returned as it is. ``auto`` is ``bf16`` on a CPU where bfloat16 is native
    and measured faster (``cpu_bf16()``, by default :func:`bf16_faster_on_cpu`); ``fp32`` on any other CPU and
    on CUDA (reduced precision on a GPU is chosen explicitly, after ``bench/quality/precision_check.py``).

    Raises:
        ValueError: for a value that is not a :class:`Precision`.
    """
    precision = Precision(precision)
    if precision is not Precision.AUTO:
        return precision
    if device.startswith("cpu") and (cpu_bf16 or bf16_faster_on_cpu)():
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


__all__ = ["BF16_MIN_SPEEDUP", "Precision", "bf16_faster_on_cpu", "bf16_speedup", "cpu_computes_bf16",
           "measure_bf16_speedup", "resolve_precision", "torch_dtype"]
