"""``mnemos reranker pools``: how a trained cross-encoder reorders BM25's pools (:mod:`bench.training.pool_check`).

A click command that :mod:`bench.commands` adds to the ``reranker`` group (:mod:`bench.training.cli`
is full). Thin: parse options, call :func:`run_pools`, which returns an exit code.

Example (the held-out questions of a model trained on one LongMemEval question fold)::

    mnemos reranker pools --model models/lme-fold-1 --longmemeval longmemeval_s.json.xz \\
        --json pools.json --markdown pools.md
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bench.training.errors import TrainingDataError
from workers.runtime.models import PROVENANCE_FILE, reranker_provenance

if TYPE_CHECKING:
    from bench.common.stats import PairedComparison

__all__ = ["pools", "run_pools", "training_conversations"]

PROGRESS_EVERY = 25
"""Questions between two progress lines on stderr."""


def training_conversations(model_dir: Path) -> frozenset[str]:
    """The ``training_conversations`` of ``model_dir``'s ``mnemos_provenance.json``.

    Raises:
        TrainingDataError: if the file is missing or unreadable, or has no such list: which questions
            the model saw would be unknown, so no held-out number could be guaranteed.
    """
    try:
        record = reranker_provenance(str(model_dir))
    except (OSError, ValueError) as exc:
        raise TrainingDataError(str(model_dir.name), f"cannot read its {PROVENANCE_FILE} ({exc.__class__.__name__}): "
                                "the questions it was trained on are unknown") from exc
    if record is None:
        raise TrainingDataError(str(model_dir.name), f"no {PROVENANCE_FILE} in the model directory: the questions "
                                "it was trained on are unknown, so held-out questions cannot be chosen")
    conversations = record.get("training_conversations") if isinstance(record, dict) else None
    if not isinstance(conversations, list):
        raise TrainingDataError(str(model_dir.name), f"its {PROVENANCE_FILE} has no training_conversations list")
    return frozenset(str(c) for c in conversations)


def run_pools(
    *, model_dir: Path, longmemeval: Path, pool_size: int = 30, windows: int = 1, max_length: int = 128,
    precision: str = "fp32", on_training: bool = False, limit: int | None = None, threads: int = 2,
    json_out: Path | None = None, markdown_out: Path | None = None, chitchat: int = 0,
) -> int:
    """Check ``model_dir``'s reranking of BM25 pools on ``longmemeval``'s held-out (or trained-on) questions.

    Reads the provenance first (a model without one is refused before anything loads), then the
    data, then the model (:class:`mnemos.rerank.CrossEncoderReranker` on the CPU with ``threads``
    torch threads). ``chitchat`` held-out chit-chat turns join each pool
    (:mod:`bench.training.pool_check`). Prints the markdown table of :func:`bench.training.pool_check.markdown_table`
    and writes it to ``markdown_out``; ``json_out`` gets the arguments (files by name only, never a
    path), the model digest, the groups, the paired comparisons and one row per question.

    Returns 0, or 2 on unusable input (no provenance, an output file whose directory does not exist,
    a malformed data file, a model that does not load, no question selected), checked before the
    model loads where it can be; the message goes to stderr.
    """
    try:
        trained = training_conversations(model_dir)
    except TrainingDataError as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    for option, out in (("--json", json_out), ("--markdown", markdown_out)):
        if out is not None and not out.parent.is_dir():
            click.echo(f"error: {option} {out}: no directory {out.parent} to write it in", err=True)
            return 2
    import torch

    from bench.common.datasets import DatasetError, load_longmemeval
    from bench.training.pool_check import check_pools, markdown_table
    from mnemos.errors import ModelLoadError
    from mnemos.rerank import CrossEncoderReranker, model_digest

    torch.set_num_threads(threads)
    started = time.perf_counter()
    try:
        conversations = load_longmemeval(longmemeval)
        model = CrossEncoderReranker(model_dir, max_length=max_length, precision=precision, windows=windows)

        def progress(done: int, total: int) -> None:
            if done % PROGRESS_EVERY == 0 or done == total:
                click.echo(f"{done}/{total} questions, {time.perf_counter() - started:.0f} s", err=True)

        check = check_pools(conversations, model, trained=trained, on_training=on_training, pool_size=pool_size,
                            limit=limit, progress=progress, chitchat=chitchat)
    except (DatasetError, ModelLoadError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    seconds = time.perf_counter() - started
    table = markdown_table(check, pool_size)
    which = "trained-on" if on_training else "held-out"
    click.echo(f"model {model_dir.resolve().name} ({model.model_version}); {len(check.rows)} {which} questions "
               f"of {longmemeval.name}; pool {pool_size}"
               + (f" + {chitchat} chit-chat turns" if chitchat else "") + f"; {seconds:.0f} s")
    click.echo(table, nl=False)
    if markdown_out is not None:
        markdown_out.write_text(table, encoding="utf-8")
    if json_out is not None:
        report = {
            "command": "mnemos reranker pools",
            "arguments": {"model": model_dir.resolve().name, "longmemeval": longmemeval.name, "pool_size": pool_size,
                          "windows": windows, "max_length": max_length, "precision": model.precision.value,
                          "on_training": on_training, "limit": limit, "threads": threads, "chitchat": chitchat},
            "model_digest": model_digest(model_dir.resolve()),
            "model_version": model.model_version,
            "seconds": round(seconds, 1),
            "groups": [{"name": g.name, "n": g.n,
                        **{m: {"mean": s.mean, "ci95": list(s.ci95)} for m, s in g.metrics.items()}}
                       for g in check.groups],
            "rerank_vs_bm25": _comparison(check.rerank_vs_bm25),
            "interp_vs_bm25": _comparison(check.interp_vs_bm25),
            "rows": [asdict(row) for row in check.rows],
        }
        json_out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


def _comparison(comparison: PairedComparison) -> dict[str, object]:
    return {"delta": comparison.delta, "delta_ci95": list(comparison.delta_ci95), "p_value": comparison.p_value,
            "n": comparison.n}


@click.command("pools")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="A trained cross-encoder directory with its mnemos_provenance.json.")
@click.option("--longmemeval", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LongMemEval JSON (.json or .json.xz).")
@click.option("--pool-size", type=click.IntRange(min=1), default=30, show_default=True,
              help="BM25 candidates the reranker reorders per question.")
@click.option("--windows", type=click.IntRange(min=1), default=1, show_default=True,
              help="Windows a long turn is read in (1: its first tokens only).")
@click.option("--max-length", type=click.IntRange(min=3), default=128, show_default=True,
              help="Tokens per (question, turn) pair.")
@click.option("--precision", type=click.Choice(["fp32", "bf16", "auto"]), default="fp32", show_default=True)
@click.option("--chitchat", type=click.IntRange(min=0), default=0, show_default=True,
              help="Held-out chit-chat user turns ('thx', 'yep') added to each pool, as in a small tenant.")
@click.option("--on-training", is_flag=True, help="Check the questions the model was trained on (a check of fit).")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Only the first N selected questions.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, help="torch CPU threads.")
@click.option("--json", "json_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the arguments, model digest, summary and per-question rows here.")
@click.option("--markdown", "markdown_out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the table here.")
def pools(model_dir: Path, longmemeval: Path, pool_size: int, windows: int, max_length: int, precision: str,
          chitchat: int, on_training: bool, limit: int | None, threads: int, json_out: Path | None,
          markdown_out: Path | None) -> None:
    """NDCG@10 of BM25's top-N pools as BM25, the reranker and their z-score sum order them.

    Held-out LongMemEval questions only (those whose conversation is not in the model's provenance),
    abstention apart; with --on-training, only the trained-on ones.
    """
    sys.exit(run_pools(model_dir=model_dir, longmemeval=longmemeval, pool_size=pool_size, windows=windows,
                       max_length=max_length, precision=precision, on_training=on_training, limit=limit,
                       threads=threads, json_out=json_out, markdown_out=markdown_out, chitchat=chitchat))
