"""Cross-encoder reranking behind a small protocol, with a cache and a fake.

Source: §2.2 of *Clustered Retrieval-Induced Forgetting* (a cross-encoder rescoring the fused
pool; docs/architecture.md "Reranker"). Scores
are raw logits: the suppression rules apply ``sigmoid(-s_xenc)`` themselves (Eq. 1, Eq. 2) and
the deep-pass threshold compares logits, so no activation is applied here.

The cross-encoder adapter tokenizes and batches pairs itself (:mod:`mnemos.rerank_pairs`:
truncation by tokens of the turn, never the query; length-sorted batches) and calls the model's
forward pass, rather than ``CrossEncoder.predict`` (whose ``longest_first`` truncation also cuts
queries). Every reranker here returns an empty array for no texts without touching the model.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from mnemos.errors import ModelLoadError
from mnemos.precision import Precision, resolve_precision, torch_dtype
from mnemos.rerank_pairs import (
    PaddedBatch,
    cut_lengths,
    length_sorted_batches,
    pad_batch,
    window_spans,
)
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


RerankPrecision = Precision
"""The cross-encoder's format (``MNEMOS_RERANK_PRECISION``): :class:`mnemos.precision.Precision`.
Scores are returned as float32 whatever the precision; ``auto`` is resolved per device by
:func:`mnemos.precision.resolve_precision`, where the 6-layer cross-encoder scored LoCoMo as in fp32
at about a third of its time on a CPU with native bfloat16 (docs/architecture.md "Precision")."""


TRUNCATION_SCHEME = "turn-only-v1"
"""Names the pair truncation rule of :mod:`mnemos.rerank_pairs`; part of a reranker's ``model_version``."""

_DIGEST_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "vocab.txt")


def model_digest(model_name_or_path: str | Path) -> str:
    """``"<directory name>@<first 16 hex of a sha1 over its config, weight and tokenizer files>"``.

    The file contents decide the digest, not where the directory lies. A name that is not a
    local directory (or a directory with none of those files) is returned unchanged.
    """
    path = Path(model_name_or_path)
    digest = hashlib.sha1()
    found = False
    for name in _DIGEST_FILES:
        file = path / name
        if file.is_file():
            found = True
            digest.update(name.encode("utf-8"))
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return f"{path.name}@{digest.hexdigest()[:16]}" if found else str(model_name_or_path)


class CrossEncoderReranker:
    """A ``sentence_transformers.CrossEncoder`` with one output logit, fed length-sorted batches.

    Each pool is tokenized with the model's own tokenizer: the query once, every text without
    special tokens. Pairs longer than ``max_length`` lose tokens of the text, never of the query,
    unless the query alone would crowd the text out (:func:`mnemos.rerank_pairs.cut_lengths`).
    With ``windows`` > 1 a text that does not fit is read in up to that many windows of the room
    left beside the query (:func:`mnemos.rerank_pairs.window_starts`), each window is scored as a
    pair, and the text's score is its best window's (docs/reranker.md "Long turns").
    Pairs are sorted by token length and batched so a batch pads little; scores come back in the
    caller's order. Counters: ``pairs_truncated`` (pairs that lost any token) and
    ``queries_truncated`` (pairs whose query lost tokens, the last resort).

    Args:
        model_name_or_path: a local directory, e.g. one written by ``mnemos reranker train`` or
            baked into the image (the service runs offline: nothing is fetched from a model hub).
        max_length: tokens per (query, text) pair, special tokens included (at least special + 2).
        batch_size: pairs per forward pass.
        device: torch device string.
        precision: :class:`RerankPrecision` (or its value) the model computes in; ``auto`` is
            resolved for ``device`` by :func:`resolve_precision` (the attribute holds the result).
        windows: windows a long text is read in (1: its first tokens only).

    Attributes:
        model_version: ``"<model digest>|max_length=<n>|<precision>|<truncation scheme>"`` (and
            ``|windows=<n>`` when above 1): every input that changes a score; :class:`CachedReranker`
            keys its entries with it.

    Raises:
        ModelLoadError: if the model cannot be loaded, or its tokenizer is not a fast (``tokenizers``) one.
        ValueError: for an unknown precision, ``fp16`` on a CPU device, a ``max_length`` too small or
            ``windows`` < 1.
    """

    def __init__(self, model_name_or_path: str | Path, max_length: int = 128, batch_size: int = 32,
                 device: str = "cpu", precision: RerankPrecision | str = RerankPrecision.FP32,
                 windows: int = 1) -> None:
        if windows < 1:
            raise ValueError(f"windows must be >= 1, got {windows}")
        precision = resolve_precision(precision, device)
        if precision is RerankPrecision.FP16 and device.startswith("cpu"):
            raise ValueError("fp16 reranking needs a CUDA device; use bf16 or fp32 on a CPU")
        self._model = _load_cross_encoder(model_name_or_path, max_length, device, precision)
        self._tokenizer = _pair_tokenizer(self._model, model_name_or_path)
        self._special = self._tokenizer.num_special_tokens_to_add(True)
        if max_length - self._special < 2:
            raise ValueError(f"max_length {max_length} leaves no room beside {self._special} special tokens")
        self._pad_id = int(getattr(self._model.tokenizer, "pad_token_id", None) or 0)
        self.model_name_or_path = str(model_name_or_path)
        self.max_length = max_length
        self.batch_size = batch_size
        self.precision = precision
        self.device = device
        self.windows = windows
        self.model_version = (f"{model_digest(model_name_or_path)}|max_length={max_length}|{precision.value}"
                              f"|{TRUNCATION_SCHEME}" + (f"|windows={windows}" if windows > 1 else ""))
        self.pairs_truncated = 0
        self.queries_truncated = 0
        logger.info("loaded cross-encoder %s (max_length %d, %s on %s)", self.model_name_or_path, max_length,
                    precision.value, device)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under the cross-encoder's own tokenizer, special tokens excluded: what an
        evidence packet's budget counts (:func:`mnemos.packets.token_counter` finds this method)."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 logits in the order of ``texts``; ``[]`` without calling the model."""
        if len(texts) == 0:
            return np.zeros(0, dtype=np.float32)
        sequences, type_ids, owners = self._encode_pairs(query, texts)
        logits = np.zeros(len(sequences), dtype=np.float32)
        for rows in length_sorted_batches([len(s) for s in sequences], self.batch_size):
            batch = pad_batch([sequences[i] for i in rows], [type_ids[i] for i in rows], self._pad_id)
            logits[rows] = self._forward(batch)
        out = np.full(len(texts), -np.inf, dtype=np.float32)
        np.maximum.at(out, np.asarray(owners, dtype=np.int64), logits)  # a text's best window
        return out

    def _encode_pairs(self, query: str, texts: Sequence[str]) -> tuple[list[list[int]], list[list[int]], list[int]]:
        """Each pair's token ids with special tokens, its token type ids and the index of its text
        (several pairs per text when a long text is read in windows), cut to ``max_length``."""
        tokenizer = self._tokenizer
        query_enc = tokenizer.encode(query, add_special_tokens=False)
        budget = self.max_length - self._special
        sequences, type_ids, owners = [], [], []
        for owner, (text, text_enc) in enumerate(zip(texts, tokenizer.encode_batch(list(texts), add_special_tokens=False),
                                                     strict=True)):
            cut = cut_lengths(len(query_enc.ids), len(text_enc.ids), budget)
            q = query_enc
            if cut.query_cut:
                q = tokenizer.encode(query, add_special_tokens=False)
                q.truncate(cut.query_kept)
                self.queries_truncated += 1
            self.pairs_truncated += int(cut.truncated)
            for t in self._windows_of(text, text_enc, cut.turn_kept):
                pair = tokenizer.post_process(q, t, add_special_tokens=True)
                sequences.append(pair.ids)
                type_ids.append(pair.type_ids)
                owners.append(owner)
        return sequences, type_ids, owners

    def _windows_of(self, text: str, encoding: Any, kept: int) -> list[Any]:
        """The encodings a text is read in: itself cut to ``kept`` tokens, or with ``windows`` > 1
        one per window start, each re-encoded from its character span and cut to ``kept``."""
        spans = window_spans(encoding.offsets, kept, self.windows) if kept < len(encoding.ids) else []
        if len(spans) <= 1:  # the text fits, or one window: its first ``kept`` tokens
            encoding.truncate(kept)
            return [encoding]
        out = []
        for first, last in spans:
            window = self._tokenizer.encode(text[first:last], add_special_tokens=False)
            window.truncate(kept)
            out.append(window)
        return out

    def _forward(self, batch: PaddedBatch) -> np.ndarray:
        """``(n_pairs,)`` float32 logits of one padded batch."""
        import torch

        features = {"input_ids": torch.from_numpy(batch.input_ids), "attention_mask": torch.from_numpy(batch.attention_mask)}
        if "token_type_ids" in getattr(self._model.tokenizer, "model_input_names", ()):
            features["token_type_ids"] = torch.from_numpy(batch.token_type_ids)
        features = {k: v.to(self._model.device) for k, v in features.items()}
        with torch.inference_mode():
            scores = self._model(features)["scores"]
        return np.asarray(scores.float().reshape(-1).cpu().numpy(), dtype=np.float32)


def _load_cross_encoder(model_name_or_path: str | Path, max_length: int, device: str,
                        precision: RerankPrecision) -> Any:
    """The ``CrossEncoder`` in ``precision`` on ``device``, returning raw logits; raises ModelLoadError."""
    try:
        import torch
        from sentence_transformers import CrossEncoder

        dtype = torch_dtype(precision)
        model = CrossEncoder(
            str(model_name_or_path),
            max_length=max_length,
            device=device,
            activation_fn=torch.nn.Identity(),  # logits, whatever the saved config says
            model_kwargs={"dtype": dtype},  # loaded in this format, whatever the stored one (shipped: float16)
        )
        model.to(dtype)
        model.eval()
    except Exception as exc:  # the library raises many unrelated types
        raise ModelLoadError(str(model_name_or_path), f"{type(exc).__name__}: {exc}") from exc
    return model


def _pair_tokenizer(model: Any, model_name_or_path: str | Path) -> Any:
    """A private copy of the model's ``tokenizers.Tokenizer``, without truncation or padding."""
    backend = getattr(model.tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ModelLoadError(str(model_name_or_path), "the cross-encoder needs a fast (tokenizers) tokenizer")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(backend.to_str())
    tokenizer.no_truncation()
    tokenizer.no_padding()
    return tokenizer


_DIGEST_BYTES = 16


def _text_digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8"), digest_size=_DIGEST_BYTES).digest()


def _scope_digest(scope: str) -> bytes:
    return hashlib.blake2b(scope.encode("utf-8"), digest_size=_DIGEST_BYTES, person=b"mnemos-scope").digest()


class CachedReranker:
    """Wraps a reranker and caches its scores in a size-bounded LRU keyed by
    ``(scope hash, model version and query hash, text hash)``.

    The model version is the inner reranker's ``model_version`` attribute, read on every call
    (``""`` when it has none, e.g. a fake): a cache never answers for another model, ``max_length``
    or precision. Keys are three 16-byte BLAKE2b digests, of the scope (:meth:`scoped`; ``""``
    unscoped), of (model version, query) and of the text, so an entry costs the same whatever the
    lengths, and the pairs of one text can be dropped, in one scope or all (:meth:`discard`). Only pairs missing from the cache reach the inner
    reranker, in one call per :meth:`score` (texts repeated within a call are scored once).
    Counters:

    * ``pairs_scored`` (also :attr:`cache_misses`): pairs sent to the inner reranker;
    * ``cache_hits``: pairs answered from the cache (including repeats within one call);
    * ``calls``: calls made to the inner reranker.

    Args:
        inner: the reranker to wrap.
        max_entries: evict the least recently used pairs beyond this many (None = unbounded).
    """

    def __init__(self, inner: Reranker, max_entries: int | None = 100_000) -> None:
        self.inner = inner
        self.max_entries = max_entries
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self.pairs_scored = 0
        self.cache_hits = 0
        self.calls = 0

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def cache_misses(self) -> int:
        """Pairs the cache could not answer (sent to the inner reranker): ``pairs_scored``."""
        return self.pairs_scored

    @property
    def model_version(self) -> str:
        """The inner reranker's ``model_version`` (``""`` when it has none)."""
        return str(getattr(self.inner, "model_version", ""))

    def _keys(self, query: str, texts: Sequence[str], scope: str) -> list[bytes]:
        """One key per text: the scope's digest, the digest of (model version, query), the text's digest."""
        prefix = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        for part in (self.model_version.encode("utf-8"), query.encode("utf-8")):  # length-prefixed
            prefix.update(len(part).to_bytes(8, "little"))
            prefix.update(part)
        head = _scope_digest(scope) + prefix.digest()
        return [head + _text_digest(text) for text in texts]

    def score(self, query: str, texts: Sequence[str], scope: str = "") -> np.ndarray:
        """``(len(texts),)`` float32 scores, from the cache where possible.

        ``scope`` partitions the cache: a pair cached under one scope never answers for another
        (:meth:`scoped` gives a reranker bound to one scope; the query worker's scope is the tenant).
        """
        keys = self._keys(query, texts, scope)
        missing: dict[bytes, str] = {}
        for key, text in zip(keys, texts, strict=True):
            if key in self._cache:
                self._cache.move_to_end(key)
            elif key not in missing:
                missing[key] = text
        self.cache_hits += len(texts) - len(missing)
        fresh: dict[bytes, float] = {}
        if missing:
            self.calls += 1
            self.pairs_scored += len(missing)
            scores = np.asarray(self.inner.score(query, list(missing.values())), dtype=np.float32)
            fresh = {key: float(s) for key, s in zip(missing, scores, strict=True)}
            self._cache.update(fresh)
        out = [fresh[k] if k in fresh else self._cache[k] for k in keys]
        self._evict()
        return np.asarray(out, dtype=np.float32).reshape(len(texts))

    def scoped(self, scope: str) -> ScopedReranker:
        """A reranker whose pairs live under ``scope`` in this cache (shared LRU, separate keys)."""
        return ScopedReranker(self, scope)

    def discard(self, texts: Iterable[str], scope: str | None = None) -> int:
        """Drop every cached pair of ``scope`` (None: of every scope) whose text is one of ``texts``
        (a forgotten turn's score must not outlive it, docs/architecture.md "Forget"); returns how
        many pairs were dropped. One pass over the cache.

        The query worker discards in the dropped tenant's scope only: dropping the same text from
        another tenant's scope would show that tenant, through its next cache counts and latency,
        that someone else held the text and was forgotten or evicted."""
        doomed = {_text_digest(text) for text in texts}
        if not doomed:
            return 0
        wanted = None if scope is None else _scope_digest(scope)
        keys = [key for key in self._cache
                if key[-_DIGEST_BYTES:] in doomed and (wanted is None or key[:_DIGEST_BYTES] == wanted)]
        for key in keys:
            del self._cache[key]
        return len(keys)

    def pairs_of(self, text: str) -> int:
        """How many cached pairs (of any query) score ``text``."""
        digest = _text_digest(text)
        return sum(1 for key in self._cache if key[-_DIGEST_BYTES:] == digest)

    def _evict(self) -> None:
        if self.max_entries is None:
            return
        while len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)


class ScopedReranker:
    """One scope of a :class:`CachedReranker`: :meth:`score` reads and fills only that scope's pairs.

    The query worker scores each request through its tenant's scope, so whether a pair was cached
    (visible in the result's counts and in its latency) never tells one tenant what another asked
    or stored: the same rule as prompt caches scoped per organisation (docs/architecture.md
    "Score cache"). ``inner`` is the shared cache, so counters summed along ``inner`` still work.
    """

    def __init__(self, cache: CachedReranker, scope: str) -> None:
        self.inner = cache
        self.scope = scope

    @property
    def model_version(self) -> str:
        """The cache's model version."""
        return self.inner.model_version

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts),)`` float32 scores, cached under this scope."""
        return self.inner.score(query, texts, scope=self.scope)


class FakeReranker:
    """Deterministic reranker for tests: token overlap between query and text, as a logit.

    ``score = |tokens(q) & tokens(t)| - 0.5``, so a text sharing no token scores -0.5 (below a
    deep-pass threshold of 0.0, as tests set it; the default is no deep pass) and one shared token
    gives 0.5. ``overrides`` maps a text to a fixed score, and ``fn(query, text)`` replaces the
    formula entirely.

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
