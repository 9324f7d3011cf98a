"""On-disk caches that make benchmark reruns and resumes cheap: rerank scores and embeddings.

Both are ``diskcache`` directories under the benchmark's ``--cache-dir`` (``rerank_scores/`` and
``embeddings/``), one sub-directory per model identity. A key is a SHA-1 of the input text(s)
within the model's directory, so a retrained model (new weights, new identity) never reads old
scores. Models are loaded lazily: a rerun whose pairs are all cached never loads the
cross-encoder.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import diskcache
import numpy as np

from mnemos.encoder import Encoder
from mnemos.rerank import Reranker, model_digest

__all__ = ["DEFAULT_CACHE_DIR", "PersistentEncoder", "PersistentReranker", "cached_bi_encoder"]

logger = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = Path.home() / ".cache" / "mnemos" / "bench"
"""Where the benchmark commands keep these caches unless ``--cache-dir`` says otherwise."""

def _key(*parts: str) -> bytes:
    return hashlib.sha1("\x1f".join(parts).encode("utf-8")).digest()


class _Store:
    """The cached values of one model: a ``diskcache.Cache`` in ``root/<sha1 of the model identity>``.

    Nothing is ever evicted (a cache of a finished run must answer the rerun); ``diskcache`` is safe
    across threads and processes.
    """

    def __init__(self, root: Path, model: str) -> None:
        directory = root / hashlib.sha1(model.encode("utf-8")).hexdigest()[:20]
        self._cache = diskcache.Cache(str(directory), eviction_policy="none")

    def load(self) -> dict[bytes, bytes]:
        """Every cached ``key -> value`` of the model."""
        out: dict[bytes, bytes] = {}
        for key in self._cache:
            value = self._cache.get(key)
            if value is not None:
                out[bytes(key)] = bytes(value)
        return out

    def put(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not items:
            return
        with self._cache.transact():
            for key, value in items:
                self._cache.set(key, value)

    def close(self) -> None:
        self._cache.close()


class PersistentReranker:
    """A :class:`~mnemos.rerank.Reranker` whose scores persist in ``<cache_dir>/rerank_scores/``.

    Args:
        model_key: identity of the model (:func:`mnemos.rerank.model_digest` of its directory).
        cache_path: the cache directory (shared by every model; each has a sub-directory).
        load: builds the real reranker on the first cache miss.

    ``model_pairs_scored`` counts the pairs actually sent to the model by this process.
    """

    def __init__(self, model_key: str, cache_path: str | Path, load: Callable[[], Reranker]) -> None:
        self.model_key = model_key
        self._store = _Store(Path(cache_path), model_key)
        self._load = load
        self._inner: Reranker | None = None
        self._scores = {k: float(np.frombuffer(v, dtype=np.float32)[0]) for k, v in self._store.load().items()}
        self.model_pairs_scored = 0
        self.loaded_from_disk = len(self._scores)

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 logits; only uncached pairs reach the model (one call)."""
        keys = [_key(query, t) for t in texts]
        todo = [i for i, k in enumerate(keys) if k not in self._scores]
        if todo:
            if self._inner is None:
                self._inner = self._load()
            fresh = np.asarray(self._inner.score(query, [texts[i] for i in todo]), dtype=np.float32)
            rows = []
            for i, value in zip(todo, fresh, strict=True):
                self._scores[keys[i]] = float(value)
                rows.append((keys[i], np.float32(value).tobytes()))
            self._store.put(rows)
            self.model_pairs_scored += len(todo)
        return np.asarray([self._scores[k] for k in keys], dtype=np.float32)


class PersistentEncoder:
    """An :class:`~mnemos.encoder.Encoder` whose vectors persist in ``<cache_dir>/embeddings/``.

    Uncached texts are encoded by the lazily built inner encoder in chunks of ``chunk`` (so a
    long first run can be interrupted and resumed); ``progress(total)`` returns ``(advance,
    close)`` callables around the chunk loop (e.g. a tqdm bar). ``dim`` must be known up front so an all-cached run never loads the model.
    ``unread(texts)`` (``unread_of``, from the model's tokenizer alone) says what the model does not
    read of each text, for dedupe (:data:`bench.common.corpora.UnreadOf`); without it, everything is read.
    """

    def __init__(
        self,
        model_key: str,
        dim: int,
        cache_path: str | Path,
        load: Callable[[], Encoder],
        chunk: int = 256,
        progress: Callable[[int], tuple[Callable[[int], None], Callable[[], None]]] | None = None,
        unread_of: Callable[[Sequence[str]], list[str]] | None = None,
    ) -> None:
        self.model_key = model_key
        self._unread_of = unread_of
        self.dim = dim
        self._store = _Store(Path(cache_path), model_key)
        self._load = load
        self._inner: Encoder | None = None
        self._chunk = chunk
        self._progress = progress
        self._vectors = self._store.load()
        self.encoded = 0

    def unread(self, texts: Sequence[str]) -> list[str]:
        """Per text, the end the model does not read (``""`` when it reads all of it)."""
        return self._unread_of(texts) if self._unread_of is not None else [""] * len(texts)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """``(n, dim)`` float32 unit rows; ``(0, dim)`` for no texts."""
        keys = [_key(t) for t in texts]
        todo_keys: dict[bytes, str] = {}
        for k, t in zip(keys, texts, strict=True):
            if k not in self._vectors and k not in todo_keys:
                todo_keys[k] = t
        if todo_keys:
            if self._inner is None:
                self._inner = self._load()
            # Shortest first: each batch then pads to texts of about its own length. In fp32 a vector does
            # not depend on its batch (to 1e-7); in bf16 it does, by about 1e-3 per component, so a cache
            # filled by an earlier, smaller run holds vectors a fresh run would compute slightly otherwise.
            pending = sorted(todo_keys.items(), key=lambda item: len(item[1]))
            advance, close = self._progress(len(pending)) if self._progress else (None, None)
            for start in range(0, len(pending), self._chunk):
                batch = pending[start : start + self._chunk]
                vectors = np.asarray(self._inner.encode([t for _, t in batch]), dtype=np.float32)
                rows = [(k, np.ascontiguousarray(v).tobytes()) for (k, _), v in zip(batch, vectors, strict=True)]
                self._vectors.update(rows)
                self._store.put(rows)
                self.encoded += len(batch)
                if advance:
                    advance(len(batch))
            if close:
                close()
        if not keys:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([np.frombuffer(self._vectors[k], dtype=np.float32) for k in keys]).astype(np.float32)


def cached_bi_encoder(
    encoder_path: str | Path,
    cache_path: str | Path,
    precision: str = "auto",
    progress: Callable[[int], tuple[Callable[[int], None], Callable[[], None]]] | None = None,
    device: str = "cpu",
) -> PersistentEncoder:
    """The bi-encoder of ``encoder_path`` behind the disk embedding cache, computing on ``device``
    (``cpu`` or ``cuda``) in ``precision`` as the service's workers do (``auto`` resolved by
    :func:`mnemos.precision.resolve_precision`, like ``MNEMOS_ENCODER_PRECISION``).

    The cache key is ``"<model identity>|<resolved precision>"``, so vectors of one format never
    answer for another. The model loads only when an embedding is missing.

    Raises:
        ValueError: for an unknown precision, or fp16 (the CPU does not compute it).
        OSError: if ``encoder_path`` has no readable ``config.json``.
    """
    import json

    from mnemos.encoder import SentenceTransformerEncoder
    from mnemos.precision import Precision, resolve_precision
    from workers.runtime.models import TruncationCounter

    resolved = resolve_precision(precision, device)
    if resolved is Precision.FP16 and device.startswith("cpu"):
        raise ValueError("fp16 embedding needs a CUDA device; on the CPU use bf16 or fp32")
    config = json.loads((Path(encoder_path) / "config.json").read_text(encoding="utf-8"))
    return PersistentEncoder(
        f"{model_digest(Path(encoder_path).resolve())}|{resolved.value}", int(config["hidden_size"]), cache_path,
        lambda: SentenceTransformerEncoder(encoder_path, device=device, precision=resolved), progress=progress,
        unread_of=TruncationCounter.for_model_dir(Path(encoder_path)).unread,
    )
