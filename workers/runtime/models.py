"""Model loading for the workers, from settings: real models, or the fakes for tests.

Models are loaded once at process start, before the worker takes any message or job, and passed
in; nothing here is a module-level singleton. ``"fake"`` selects :class:`mnemos.encoder.HashingEncoder`
/ :class:`mnemos.rerank.FakeReranker` (fast plumbing tests, never quality numbers).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

from mnemos.encoder import Encoder, HashingEncoder, SentenceTransformerEncoder, bundled_bi_encoder_path
from mnemos.errors import ModelLoadError
from mnemos.precision import resolve_precision
from mnemos.rerank import CrossEncoderReranker, FakeReranker, Reranker, shipped_reranker_path
from workers.runtime.errors import ModelSetupError, SettingsError
from workers.runtime.model_licences import restricted_sources
from workers.settings import (
    BUNDLED_BI_ENCODER,
    ENCODER_FP16_ON_CPU,
    FAKE_MODEL,
    FP16_ON_CPU,
    SHIPPED_RERANKER,
    Settings,
)

log = logging.getLogger(__name__)

PROVENANCE_FILE = "mnemos_provenance.json"
"""The record beside a cross-encoder directory of how it was trained (``training_conversations``,
``held_out_conversations``, ``deep_threshold``, ...), written by :mod:`bench.training.cross_encoder`."""


class TruncationCounter:
    """Tells which texts exceed the bi-encoder's window (``max_seq_length`` word pieces), and what
    of them the encoder did not read.

    The encoder only sees the first ``max_tokens`` pieces of such a text (special tokens included);
    the full text is still stored in Postgres and indexed by BM25, the worker counts these turns in
    a metric, and dedupe compares the unread ends (:func:`mnemos.dedupe.turn_signature`).
    ``tokenizer_json`` None (the fake encoder) means no window: nothing is ever truncated.
    """

    def __init__(self, tokenizer_json: Path | None = None, max_tokens: int = 256) -> None:
        self.max_tokens = max_tokens
        self._tokenizer = None
        if tokenizer_json is not None:
            from tokenizers import Tokenizer

            self._tokenizer = Tokenizer.from_file(str(tokenizer_json))
            self._tokenizer.no_truncation()
            self._tokenizer.no_padding()

    def truncated(self, texts: Sequence[str]) -> list[bool]:
        """Per text: True when it has more than ``max_tokens`` word pieces (the encoder cuts it)."""
        return [cut is not None for cut in self.cuts(texts)]

    def unread(self, texts: Sequence[str]) -> list[str]:
        """Per text: the suffix the encoder does not read, ``""`` when it reads the whole text.

        The encoder reads the first ``max_tokens`` pieces, special tokens (``[CLS]``, ``[SEP]``)
        included; the suffix starts right after the last piece it reads (character offsets of the
        tokenizer), so embedding ``text[:len(text) - len(suffix)]`` gives the vector of ``text``.
        """
        return [cut or "" for cut in self.cuts(texts)]

    def cuts(self, texts: Sequence[str]) -> list[str | None]:
        """Per text: None when the encoder reads all of it, else the suffix it does not read (as
        :meth:`unread`; one tokenizer pass gives both the truncation flag and the unread end)."""
        if self._tokenizer is None or not texts:
            return [None] * len(texts)
        out: list[str | None] = []
        for text, encoding in zip(texts, self._tokenizer.encode_batch(list(texts)), strict=True):
            if len(encoding.ids) <= self.max_tokens:
                out.append(None)
                continue
            content = [i for i, special in enumerate(encoding.special_tokens_mask) if not special]
            read = self.max_tokens - (len(encoding.ids) - len(content))  # content pieces inside the window
            end = encoding.offsets[content[read - 1]][1] if read > 0 else 0
            out.append(text[end:])
        return out

    @classmethod
    def for_model_dir(cls, model_dir: Path) -> TruncationCounter:
        tokenizer_json = model_dir / "tokenizer.json"
        if not tokenizer_json.exists():
            log.warning("no tokenizer.json in %s: encoder truncation is not counted, and dedupe cannot compare "
                        "the ends of long turns the encoder cuts", model_dir)
            return cls(None)
        max_tokens = 256
        config = model_dir / "sentence_bert_config.json"
        if config.exists():
            max_tokens = int(json.loads(config.read_text()).get("max_seq_length", max_tokens))
        return cls(tokenizer_json, max_tokens)


def bi_encoder_dir(settings: Settings) -> Path | None:
    """Directory of the configured bi-encoder, or None for the fake."""
    if settings.bi_encoder == FAKE_MODEL:
        return None
    try:
        return bundled_bi_encoder_path() if settings.bi_encoder == BUNDLED_BI_ENCODER else Path(settings.bi_encoder)
    except ModelLoadError as exc:
        raise ModelSetupError(str(exc)) from exc


def limit_blas_threads(settings: Settings) -> None:
    """Cap every BLAS library loaded in this process (numpy's, faiss's) at ``settings.blas_threads``
    threads (None: leave them alone).

    Called once at a worker's start. Idle OpenBLAS threads spin after each matmul (the ingest
    dedupe, the query worker's dense search and suppression) and take cores from the next torch
    call; torch's own intra-op pool is not affected. A BLAS loaded later (scipy's, when the
    suppression worker first runs k-means) keeps its own default.
    """
    if settings.blas_threads is None:
        return
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=settings.blas_threads, user_api="blas")
    log.info("numpy BLAS threads capped at %d", settings.blas_threads)


def resolve_device(spec: str) -> str:
    """``"cuda"`` or ``"cpu"`` for a device setting: ``auto`` picks a GPU when torch sees one."""
    if spec != "auto":
        return spec
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_encoder(settings: Settings) -> Encoder:
    """The bi-encoder of ``settings.bi_encoder`` computing in ``settings.encoder_precision`` (``auto``:
    bf16 on a CPU with native bfloat16 instructions where it is measured faster, else fp32;
    :func:`mnemos.precision.resolve_precision`).

    Raises ModelSetupError when it cannot load, and SettingsError for fp16 when the device resolves
    to the CPU. The fake ignores the precision.
    """
    path = bi_encoder_dir(settings)
    if path is None:
        return HashingEncoder(settings.fake_encoder_dim)
    device = resolve_device(settings.device)
    if settings.encoder_precision == "fp16" and device == "cpu":  # MNEMOS_DEVICE=auto found no GPU
        raise SettingsError(ENCODER_FP16_ON_CPU)
    try:
        return SentenceTransformerEncoder(path, batch_size=settings.encoder_batch_size, device=device,
                                          precision=resolve_precision(settings.encoder_precision, device))
    except ModelLoadError as exc:
        raise ModelSetupError(str(exc)) from exc


def load_truncation_counter(settings: Settings) -> TruncationCounter:
    path = bi_encoder_dir(settings)
    return TruncationCounter() if path is None else TruncationCounter.for_model_dir(path)


def cross_encoder_location(settings: Settings) -> str | None:
    """Where the configured cross-encoder loads from: ``"fake"``, a directory or name, or None (no rerank).

    ``"shipped"`` (the default) is the project's own model inside the package
    (:func:`mnemos.rerank.shipped_reranker_path`). Raises ModelSetupError when the shipped model was
    asked for and its weights are not in this installation.
    """
    name = settings.cross_encoder
    if name != SHIPPED_RERANKER:
        return name
    path = shipped_reranker_path()
    if not (path / "config.json").is_file():
        raise ModelSetupError(f"the shipped cross-encoder is not in this installation ({path} has no config.json); "
                              "set MNEMOS_CROSS_ENCODER to a model directory, or to none to run without a reranker")
    return str(path)


def reranker_provenance(location: str | None) -> dict | None:
    """The ``mnemos_provenance.json`` beside a cross-encoder directory (``training_conversations``, ...);
    None for the fake, a hub name or a directory without one."""
    if location is None or location == FAKE_MODEL:
        return None
    file = Path(location) / PROVENANCE_FILE
    if not file.is_file():
        return None
    return json.loads(file.read_text(encoding="utf-8"))


def load_reranker(settings: Settings) -> Reranker | None:
    """The cross-encoder of ``settings.cross_encoder``; None (with a warning) when set to none.

    The query worker, the health check with models and the service benchmarks load their reranker
    here, so this is where a missing one is warned about (not when settings are read). Raises
    ModelSetupError when the model cannot be loaded (the shipped one included, when absent), and
    SettingsError for ``rerank_precision`` fp16 when the device resolves to the CPU (refused rather
    than silently computed in another precision than the one configured). ``auto`` becomes bf16 on
    a CPU with native bfloat16 instructions where it is measured faster, else fp32
    (:func:`mnemos.precision.resolve_precision`).
    """
    location = cross_encoder_location(settings)
    if location is None:
        log.warning("MNEMOS_CROSS_ENCODER is none: retrieval runs without a reranker (results are the fused order)")
        return None
    if location == FAKE_MODEL:
        return FakeReranker()
    device = resolve_device(settings.device)
    if settings.rerank_precision == "fp16" and device == "cpu":  # MNEMOS_DEVICE=auto found no GPU
        raise SettingsError(FP16_ON_CPU)
    try:
        model = CrossEncoderReranker(location, max_length=settings.rerank_max_length,
                                     batch_size=settings.rerank_batch_size, device=device,
                                     precision=resolve_precision(settings.rerank_precision, device),
                                     windows=settings.rerank_windows)
    except ModelLoadError as exc:
        raise ModelSetupError(str(exc)) from exc
    warn_restricted_licence(location)
    return model


def warn_restricted_licence(location: str) -> list[str]:
    """Log one WARNING when the cross-encoder at ``location`` was trained on data whose licence does
    not permit commercial use (:mod:`workers.runtime.model_licences`); returns the ``name (licence)`` of
    each such source (empty for a model without provenance: nothing is known to warn about)."""
    try:
        provenance = reranker_provenance(location)
    except (OSError, ValueError) as exc:
        log.warning("cross-encoder %s: unreadable %s (%s): its training data's licence is unknown",
                    location, PROVENANCE_FILE, exc)
        return []
    restricted = [f"{s.name} ({s.licence})" for s in restricted_sources(provenance or {})]
    if restricted:
        log.warning("cross-encoder %s was trained on %s: that licence does not permit commercial use of the "
                    "model; use it for research only", Path(location).name, ", ".join(restricted))
    return restricted
