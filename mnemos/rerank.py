"""Cross-encoder reranking behind a small protocol, with a cache and a fake.

Source: §2.2 of *Clustered Retrieval-Induced Forgetting* (a cross-encoder rescoring the fused
pool; docs/architecture.md "Reranker"). Scores
are raw logits: the suppression rules apply ``sigmoid(-s_xenc)`` themselves (Eq. 1, Eq. 2) and
the deep-pass threshold compares logits, so no activation is applied here.

``CrossEncoder.predict([])`` raises; every reranker here returns an empty array for no texts
without touching the model.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from mnemos.errors import ModelLoadError
from mnemos.tokenizer import tokenize

logger = logging.getLogger(__name__)


def shipped_reranker_path() -> Path:
    """Directory of the project's own cross-encoder, shipped inside the package: ``mnemos/shipped/reranker``.

    A ``sentence_transformers.CrossEncoder`` directory with ``mnemos_provenance.json`` beside the
    weights (``mnemos reranker train`` writes both; see ``bench/training/``). The path is
    returned whether or not the weights are present; :func:`shipped_reranker_present` tells.
    """
    return Path(__file__).resolve().parent / "shipped" / "reranker"


def shipped_reranker_present() -> bool:
    """True when the shipped cross-encoder's weights are in the package (its ``config.json`` exists)."""
    return (shipped_reranker_path() / "config.json").is_file()


@runtime_checkable
class Reranker(Protocol):
    """Scores (query, text) pairs; higher is more relevant."""

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 logits; an empty array for no texts (no model call)."""
        ...


class CrossEncoderReranker:
    """A ``sentence_transformers.CrossEncoder`` with one output logit.

    Args:
        model_name_or_path: a local directory, e.g. one written by ``mnemos reranker train`` or
            baked into the image (the service runs offline: nothing is fetched from a model hub).
        max_length: tokens per (query, text) pair; longer pairs are truncated.
        batch_size: pairs per forward pass.
        device: torch device string.

    Raises:
        ModelLoadError: if the model cannot be loaded.
    """

    def __init__(
        self, model_name_or_path: str | Path, max_length: int = 128, batch_size: int = 32, device: str = "cpu"
    ) -> None:
        try:
            import torch
            from sentence_transformers import CrossEncoder

            self._model = CrossEncoder(
                str(model_name_or_path),
                max_length=max_length,
                device=device,
                activation_fn=torch.nn.Identity(),  # logits, whatever the saved config says
            )
            if device == "cpu":  # weights may be stored as float16 (the shipped model): compute in float32
                self._model.model.float()
        except Exception as exc:  # the library raises many unrelated types
            raise ModelLoadError(str(model_name_or_path), f"{type(exc).__name__}: {exc}") from exc
        self.model_name_or_path = str(model_name_or_path)
        self.max_length = max_length
        self.batch_size = batch_size
        logger.info("loaded cross-encoder %s (max_length %d)", self.model_name_or_path, max_length)

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 logits; ``[]`` without calling the model."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.float32)
        logits = self._model.predict(
            [(query, text) for text in texts],
            batch_size=self.batch_size,
            show_progress_bar=False,
            convert_to_numpy=True,
        )
        return np.asarray(logits, dtype=np.float32).reshape(len(texts))


class CachedReranker:
    """Wraps a reranker and caches scores by ``(query, text)``.

    Only pairs missing from the cache reach the inner reranker, in one call per :meth:`score`
    (texts repeated within a call are scored once). Counters:

    * ``pairs_scored``: pairs sent to the inner reranker;
    * ``cache_hits``: pairs answered from the cache (including repeats within one call);
    * ``calls``: calls made to the inner reranker.

    Args:
        inner: the reranker to wrap.
        max_entries: evict the oldest cached pairs beyond this many (None = unbounded).
    """

    def __init__(self, inner: Reranker, max_entries: int | None = 100_000) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._cache: dict[tuple[str, str], float] = {}
        self.pairs_scored = 0
        self.cache_hits = 0
        self.calls = 0

    def __len__(self) -> int:
        return len(self._cache)

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 scores, from the cache where possible."""
        missing: list[str] = []
        pending: set[str] = set()
        for text in texts:
            if (query, text) not in self._cache and text not in pending:
                pending.add(text)
                missing.append(text)
        self.cache_hits += len(texts) - len(missing)
        fresh: dict[str, float] = {}
        if missing:
            self.calls += 1
            self.pairs_scored += len(missing)
            scores = np.asarray(self.inner.score(query, missing), dtype=np.float32)
            fresh = {text: float(s) for text, s in zip(missing, scores, strict=True)}
            for text, s in fresh.items():
                self._cache[(query, text)] = s
            self._evict()
        out = [fresh[t] if t in fresh else self._cache[(query, t)] for t in texts]
        return np.asarray(out, dtype=np.float32).reshape(len(texts))

    def _evict(self) -> None:
        if self.max_entries is None:
            return
        while len(self._cache) > self.max_entries:
            del self._cache[next(iter(self._cache))]


class FakeReranker:
    """Deterministic reranker for tests: token overlap between query and text, as a logit.

    ``score = |tokens(q) & tokens(t)| - 0.5``, so a text sharing no token scores -0.5 (below the
    default deep-pass threshold of 0.0) and one shared token gives 0.5. ``overrides`` maps a text
    to a fixed score, and ``fn(query, text)`` replaces the formula entirely.

    Records ``calls`` (one ``(query, texts)`` tuple per call that had texts) and ``pairs_scored``.
    """

    def __init__(
        self,
        overrides: Mapping[str, float] | None = None,
        fn: Callable[[str, str], float] | None = None,
    ) -> None:
        self.overrides = dict(overrides or {})
        self.fn = fn
        self.calls: list[tuple[str, tuple[str, ...]]] = []
        self.pairs_scored = 0

    def _one(self, query: str, text: str) -> float:
        if text in self.overrides:
            return self.overrides[text]
        if self.fn is not None:
            return self.fn(query, text)
        return len(set(tokenize(query)) & set(tokenize(text))) - 0.5

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 scores; ``[]`` without recording a call."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.float32)
        self.calls.append((query, tuple(texts)))
        self.pairs_scored += len(texts)
        return np.asarray([self._one(query, t) for t in texts], dtype=np.float32)
