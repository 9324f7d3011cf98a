"""Rank agreement of a cross-encoder's reduced-precision scores with its fp32 scores, on real pools.

The query worker may rerank in fp16 or bf16 on a GPU (``MNEMOS_RERANK_PRECISION``) where the
order it gives a pool stays that of fp32: Spearman's rank correlation >= 0.99 per pool (issue
"Rerank in half the time at the same quality"). This script builds the pools the service would
rerank (BM25 + dense fusion, no suppression, ``pool_size`` entries, each LoCoMo conversation its
own tenant, turns rendered as the service renders them), scores each pool with the reference
precision and with every other precision, and prints (or writes) per precision: the mean,
minimum and 5th percentile of the per-pool Spearman rho (``scipy.stats.spearmanr``), the share
of pools at or above the bar, how often the top entry agrees, the largest absolute logit
difference and the seconds per pool. Usage (a GPU for fp16)::

    mnemos bench precision --reranker mnemos/shipped/reranker --locomo PATH \\
        --device cuda --precisions fp16,bf16 --questions 300 --out bench/results/precision.json
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.datasets import Conversation, load_locomo
from bench.quality.engine import Engine, prepare_questions
from mnemos.encoder import Encoder
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import Reranker

__all__ = ["AGREEMENT_BAR", "Pool", "PrecisionAgreement", "agreement", "precision", "real_pools"]

AGREEMENT_BAR = 0.99
"""Per-pool Spearman rho a reduced precision must reach against fp32 (the issue's bar)."""


@dataclass(frozen=True)
class Pool:
    """One question and the rendered texts of its pool, in fused order."""

    question_key: str
    query: str
    texts: tuple[str, ...]


@dataclass(frozen=True)
class PrecisionAgreement:
    """How one precision's scores agree with the reference's over ``pools`` pools of 2+ texts.

    ``constant_pools`` counts pools where either side gave every text the same score (rho is
    undefined there; they are left out of the rho statistics).
    """

    precision: str
    pools: int
    constant_pools: int
    mean_rho: float
    min_rho: float
    p05_rho: float
    share_at_bar: float
    top1_agreement: float
    max_abs_diff: float
    seconds_per_pool: float


def real_pools(conversations: Sequence[Conversation], encoder: Encoder, *, questions: int | None = 300,
               pool_size: int = 30, seed: int = 0) -> list[Pool]:
    """The fused pools (no rerank, no suppression) of about ``questions`` questions spread over the
    conversations (all of them for None), each conversation its own tenant."""
    chosen = prepare_questions(conversations, seed=seed, limit=questions)
    engine = Engine(conversations, chosen, encoder, rerankers=None, modes=[CorpusMode.PER_TENANT])
    config = RetrievalConfig(pool_size=pool_size, rerank=False, suppression=False, deep_threshold=None)
    pools = []
    for q in chosen:
        tenant = engine.tenant_of(CorpusMode.PER_TENANT, q)
        result = retrieve(tenant.index, q.text, engine.question_vectors[q.row], k=pool_size, config=config)
        pools.append(Pool(q.key, q.text, tuple(tenant.index.rendered(h.entry_id) for h in result.hits)))
    return pools


def _score_all(reranker: Reranker, pools: Sequence[Pool]) -> tuple[list[np.ndarray], float]:
    started = time.perf_counter()
    scores = [np.asarray(reranker.score(p.query, list(p.texts)), dtype=np.float32) for p in pools]
    return scores, (time.perf_counter() - started) / max(1, len(pools))


def agreement(pools: Sequence[Pool], reference: Reranker,
              candidates: Mapping[str, Reranker]) -> tuple[float, list[PrecisionAgreement]]:
    """Score every pool of two or more texts with ``reference`` and each candidate: the reference's
    seconds per pool, and one record per candidate."""
    from scipy.stats import spearmanr

    usable = [p for p in pools if len(p.texts) >= 2]
    ref_scores, ref_seconds = _score_all(reference, usable)
    out = []
    for name, reranker in candidates.items():
        scores, seconds = _score_all(reranker, usable)
        rhos, constant, top1, max_diff = [], 0, 0, 0.0
        for ref, got in zip(ref_scores, scores, strict=True):
            max_diff = max(max_diff, float(np.abs(ref - got).max()))
            top1 += int(np.argmax(ref) == np.argmax(got))
            if np.ptp(ref) == 0 or np.ptp(got) == 0:
                constant += 1
                continue
            rhos.append(float(spearmanr(ref, got).statistic))
        values = np.asarray(rhos) if rhos else np.asarray([np.nan])
        out.append(PrecisionAgreement(
            precision=name, pools=len(usable), constant_pools=constant, mean_rho=float(values.mean()),
            min_rho=float(values.min()), p05_rho=float(np.percentile(values, 5)),
            share_at_bar=float(np.mean(values >= AGREEMENT_BAR)) if rhos else float("nan"),
            top1_agreement=top1 / max(1, len(usable)), max_abs_diff=max_diff, seconds_per_pool=seconds))
    return ref_seconds, out


def run(reranker_dir: Path, pools: Sequence[Pool], *, precisions: Sequence[str], device: str, max_length: int,
        batch_size: int, load: Callable[..., Reranker] | None = None) -> dict:
    """The report as a JSON-ready dict: settings, the reference's seconds per pool, one record per precision."""
    from mnemos.rerank import CrossEncoderReranker, model_digest

    loader = load or CrossEncoderReranker

    def make(precision: str) -> Reranker:
        return loader(reranker_dir, max_length=max_length, batch_size=batch_size, device=device, precision=precision)

    reference_seconds, records = agreement(pools, make("fp32"), {p: make(p) for p in precisions})
    return {"model": model_digest(reranker_dir), "device": device, "max_length": max_length, "batch_size": batch_size,
            "bar": AGREEMENT_BAR, "fp32_seconds_per_pool": reference_seconds,
            "precisions": [dataclasses.asdict(r) for r in records]}


@click.command("precision")
@click.option("--reranker", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
              help="A cross-encoder directory.")
@click.option("--locomo", type=click.Path(exists=True, dir_okay=False, path_type=Path), required=True,
              help="LoCoMo's locomo10.json.")
@click.option("--precisions", default="fp16,bf16", show_default=True, help="Comma-separated, compared with fp32.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cuda", show_default=True)
@click.option("--questions", type=click.IntRange(min=0), default=300, show_default=True,
              help="About this many pools (0: every question).")
@click.option("--pool-size", type=click.IntRange(min=1), default=30, show_default=True)
@click.option("--max-length", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Also write the JSON report here.")
def precision(reranker: Path, locomo: Path, precisions: str, device: str, questions: int, pool_size: int,
              max_length: int, batch_size: int, out: Path | None) -> None:
    """Rank agreement of reduced-precision cross-encoder scores with fp32 on real LoCoMo pools.

    Prints the JSON report; exits 1 when some precision misses the bar on a pool (module docstring)."""
    from mnemos.encoder import SentenceTransformerEncoder, bundled_bi_encoder_path

    encoder = SentenceTransformerEncoder(bundled_bi_encoder_path(), device=device)
    pools = real_pools(load_locomo(locomo), encoder, questions=questions or None, pool_size=pool_size)
    report = run(reranker, pools, precisions=[p for p in precisions.split(",") if p], device=device,
                 max_length=max_length, batch_size=batch_size)
    report = {"command": " ".join(["mnemos bench precision", *map(shlex.quote, sys.argv[sys.argv.index("precision") + 1:]
                                                                   if "precision" in sys.argv else [])]),
              **report}
    text = json.dumps(report, indent=2)
    click.echo(text)
    if out is not None:
        out.write_text(text + "\n", encoding="utf-8")
    sys.exit(0 if all(r["min_rho"] >= AGREEMENT_BAR for r in report["precisions"]) else 1)


if __name__ == "__main__":
    precision()
