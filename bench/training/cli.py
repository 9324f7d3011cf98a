"""``mnemos reranker``: train the project's own cross-encoder (:mod:`bench.training`).

Exposes one click group, ``reranker``, which :mod:`bench.commands` offers to the root CLI as an
entry-point plugin. Commands
are thin: parse options, call a ``run_*`` function that returns an exit code.

Example (LoCoMo fold "a": train on the first five conversations by sample_id)::

    mnemos reranker train --data locomo10.json \\
        --conversations conv-26,conv-30,conv-41,conv-42,conv-43 \\
        --out models/locomo-fold-a
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import click

from bench.common.caches import DEFAULT_CACHE_DIR
from bench.common.extras import require_extra
from bench.training.cross_encoder import LOSSES, TrainConfig
from bench.training.sources import teacher_sources, training_positives
from workers.runtime.models import resolve_device

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from bench.common.caches import PersistentEncoder
    from bench.training.distil import DistilConfig
    from bench.training.pairs import LabelledPair, MiningConfig, PositivePair

__all__ = ["reranker", "run_train"]

logger = logging.getLogger(__name__)


def _parse_fold(spec: str, option: str = "--fold") -> tuple[int, int]:
    try:
        fold, n_folds = (int(x) for x in spec.split("/"))
    except ValueError as exc:
        raise click.BadParameter(f"expected i/k such as 2/2, got {spec!r}", param_hint=option) from exc
    return fold, n_folds


def _mining_record(mining: MiningConfig, n_positives: int, seconds: float) -> dict[str, object]:
    """The provenance's ``mining`` entry: the :class:`MiningConfig` that made the pairs, and its cost."""
    return {"hard_negatives": mining.hard_negatives, "random_negatives": mining.random_negatives,
            "depth": mining.depth, "bm25": mining.use_bm25, "dense": mining.use_dense,
            "same_speaker": mining.same_speaker, "evidence_negatives": mining.evidence_negatives,
            "model_negatives": mining.model_negatives, "chitchat_negatives": mining.chitchat_negatives,
            "n_positive_candidates": n_positives, "seconds": round(seconds, 3)}


def run_train(
    *,
    data: Path | None,
    pairs: Path | None,
    conversations: list[str] | None,
    fold: tuple[int, int] | None,
    out: Path,
    longmemeval: Sequence[Path] = (),
    question_fold: tuple[int, int] | None = None,
    pairs_licence: str | None = None,
    max_pairs: int | None,
    train_config: TrainConfig,
    dense: bool = True,
    same_speaker: bool = False,
    named_user_share: float = 0.0,
    threads: int | None = 2,
    calibration_queries: int = 200,
    fp16: bool = False,
    teacher: Path | None = None,
    temperature: float = 1.0,
    distil_weight: float = 1.0,
    hard_negatives: int = 3,
    mining_depth: int = 30,
    cache_dir: Path = DEFAULT_CACHE_DIR,
    fold_seed: int | None = None,
    evidence_negatives: int = 0,
    model_negatives: int = 0,
    negative_miner: Path | None = None,
    chitchat_negatives: int = 0,
) -> int:
    """Load data, mine negatives, train, calibrate the deep pass, save; print counts and times.

    Sources combine in one run: LoCoMo ``data`` (``conversations`` or ``fold``), LongMemEval files
    ``longmemeval`` (all questions, or ``question_fold`` ``(i, k)``: stratified by question type,
    seeded by ``fold_seed``, or ``seed`` when None, fold i held out) and a JSONL ``pairs`` file (with its SPDX
    ``pairs_licence``). The provenance lists each source with its licence and the items used.
    ``named_user_share`` of the LongMemEval questions are rendered under a first name
    (:mod:`bench.training.named_user`).

    Every turn is rendered as the service renders it (:mod:`mnemos.rendering`). The provenance
    names the data by file name and sha256 (never a machine path), the recipe, the seed and the
    commit of this checkout. ``fp16`` stores the weights as float16 safetensors (half the size;
    the service loads them back as float32 on a CPU).

    With ``dense`` the bi-encoder's hard negatives come from the service's encoder behind the
    bench's embedding cache under ``cache_dir`` (:func:`_mining_encoder`); the provenance records the
    encoder's digest and precision as ``mining_encoder``.

    ``teacher`` (a trained cross-encoder directory with its provenance) turns on knowledge
    distillation (:mod:`bench.training.distil`): the student trains on
    ``distil_weight * sigmoid(teacher_logit / temperature) + (1 - distil_weight) * hard_label``,
    and its provenance counts the teacher's training conversations as its own.

    ``model_negatives`` adds that many negatives per positive ranked highest by ``negative_miner``
    (a trained cross-encoder directory with its provenance; :mod:`bench.training.model_negatives`),
    whose training items and sources the provenance counts as its own (``negative_miner`` block).

    ``train_config`` holds the fine-tune's hyper-parameters; its ``seed`` also seeds the mining
    (and the question folds unless ``fold_seed`` is given) and its ``device`` runs the mining's
    bi-encoder and the teacher.

    Returns 0 on success, 2 on unusable input (the message goes to stderr).
    """
    import torch

    from bench.common.datasets import DatasetError
    from bench.training import cross_encoder as training
    from bench.training import pairs as training_pairs
    from bench.training.errors import TrainingDataError
    from mnemos.errors import ModelLoadError
    from mnemos.rendering import RENDERING_VERSION

    seed, device = train_config.seed, train_config.device
    if threads:
        torch.set_num_threads(threads)
    started = time.perf_counter()
    provenance: dict[str, object] = {"max_pairs": max_pairs, "dense_mining": dense,
                                     "rendering_version": int(RENDERING_VERSION), "commit": _git_commit()}
    try:
        teacher_setup = _teacher_setup(teacher, temperature, distil_weight)
        positives, corpora = training_positives(
            data, pairs, conversations, fold, provenance, longmemeval=longmemeval, question_fold=question_fold,
            fold_seed=seed if fold_seed is None else fold_seed, pairs_licence=pairs_licence,
            named_user_share=named_user_share)
        mining = training_pairs.MiningConfig(max_pairs=max_pairs, seed=seed, use_dense=dense,
                                             same_speaker=same_speaker, hard_negatives=hard_negatives,
                                             depth=mining_depth, evidence_negatives=evidence_negatives,
                                             model_negatives=model_negatives,
                                             chitchat_negatives=chitchat_negatives)
        examples, calibration = _mine(positives, corpora, mining, provenance, device=device, cache_dir=cache_dir,
                                      calibration_queries=calibration_queries, negative_miner=negative_miner)
        mined_at = time.perf_counter()
        provenance["mining"] = _mining_record(mining, len(positives), mined_at - started)
        click.echo(f"mined {len(examples)} pairs from {len(positives)} positives in {mined_at - started:.1f} s")
        soft = None
        if teacher is not None and teacher_setup is not None:
            soft, provenance = _distil(teacher, teacher_setup, examples, provenance, device)
        report = training.train_cross_encoder(examples, out, config=train_config, provenance=provenance,
                                              calibration_pools=calibration, soft_labels=soft)
        if fp16:
            _store_fp16(out)
    except (TrainingDataError, DatasetError, ModelLoadError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    click.echo(
        f"trained {report.n_pairs} pairs ({report.n_positives} positive, {report.n_negatives} negative), "
        f"{report.steps} steps, loss {report.training_loss:.4f}"
    )
    click.echo(f"training time: {report.seconds:.1f} s on {device}; model saved to {report.out_dir}")
    return 0


def _teacher_setup(teacher: Path | None, temperature: float,
                   distil_weight: float) -> tuple[DistilConfig, list[str]] | None:
    """The distillation settings and the teacher's training conversations (None without a teacher),
    read before any mining so that a teacher without provenance fails fast.

    Raises:
        TrainingDataError: for a bad temperature or weight, or a teacher without a readable
            provenance (held-out evaluation could not be guaranteed).
    """
    from bench.training import distil

    if teacher is None:
        return None
    return distil.DistilConfig(temperature=temperature, weight=distil_weight), \
        distil.teacher_training_conversations(teacher)


def _distil(teacher: Path, setup: tuple[DistilConfig, list[str]], examples: Sequence[LabelledPair],
            provenance: dict[str, object], device: str) -> tuple[list[float], dict[str, object]]:
    """Score every example once with the teacher (max length 128, on ``device``; one batched call
    per query, on the rendered text the student trains on) and return the soft labels and the
    student's provenance with the teacher's conversations and a ``distillation`` block."""
    from bench.training import distil
    from mnemos.rerank import CrossEncoderReranker, model_digest

    config, conversations = setup
    started = time.perf_counter()
    model = CrossEncoderReranker(teacher, max_length=128, device=device)
    logits = distil.teacher_logits(examples, model.score)
    del model
    soft = distil.soft_labels(logits, examples, config)
    click.echo(f"teacher {teacher.resolve().name} scored {len(examples)} pairs in {time.perf_counter() - started:.1f} s")
    record = distil.distilled_provenance(provenance, teacher_name=teacher.resolve().name,
                                         teacher_digest=model_digest(teacher.resolve()),
                                         teacher_conversations=conversations, config=config)
    record["sources"] = [*record.get("sources", []), *teacher_sources(teacher)]  # its data's licence is ours too
    return soft, record


def _git_commit() -> str | None:
    """The commit of the checkout this runs from (None outside a git checkout)."""
    import subprocess

    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _store_fp16(model_dir: Path) -> None:
    """Rewrite ``model_dir``'s weights as float16 safetensors (the provenance records it)."""
    import json

    import torch
    from sentence_transformers.cross_encoder import CrossEncoder

    from workers.runtime.models import PROVENANCE_FILE

    model = CrossEncoder(str(model_dir), device="cpu", activation_fn=torch.nn.Identity())
    model.model.half()
    model.save_pretrained(str(model_dir))
    record_path = model_dir / PROVENANCE_FILE
    record = json.loads(record_path.read_text(encoding="utf-8"))
    record["stored_dtype"] = "float16"
    record_path.write_text(json.dumps(record, indent=2, default=str) + "\n", encoding="utf-8")


def _mine(positives: Sequence[PositivePair], corpora: dict[str, list[str]] | None, mining: MiningConfig,
          provenance: dict[str, object], *, device: str, cache_dir: Path, calibration_queries: int,
          negative_miner: Path | None = None) -> tuple[list[LabelledPair], list[tuple[str, list[str]]]]:
    """Labelled pairs mined from ``positives`` by ``mining``, and the deep-pass calibration pools (none
    without ``corpora`` or with ``calibration_queries`` 0). With ``mining.use_dense`` the bi-encoder is
    :func:`_mining_encoder`'s, and ``provenance`` gets its digest and precision as ``mining_encoder``.
    With ``mining.model_negatives`` the ``negative_miner`` ranks the candidates
    (:func:`bench.training.negative_miner.load_negative_miner`, which updates ``provenance``)."""
    from bench.training import pairs as training_pairs
    from bench.training.negative_miner import load_negative_miner

    encoder = None
    if mining.use_dense:
        passages = [text for texts in (corpora or {}).values() for text in texts] + [p.passage for p in positives]
        encoder = _mining_encoder(device, cache_dir, passages)
        provenance["mining_encoder"] = encoder.model_key
    scorer = None
    if mining.model_negatives and negative_miner is not None:
        scorer = load_negative_miner(negative_miner, device, provenance)
    examples = training_pairs.mine_examples(positives, config=mining, encoder=encoder, corpora=corpora,
                                            scorer=scorer)
    calibration: list[tuple[str, list[str]]] = []
    if corpora and calibration_queries > 0:
        calibration = training_pairs.calibration_pools(positives, corpora, encoder=encoder,
                                                       n_queries=calibration_queries, seed=mining.seed)
    return examples, calibration


def _mining_encoder(device: str, cache_dir: Path, passages: Sequence[str]) -> PersistentEncoder:
    """The service's bi-encoder (:class:`mnemos.encoder.SentenceTransformerEncoder`, bundled MiniLM, the
    precision ``auto`` picks for ``device``) behind the quality bench's disk embedding cache
    (``<cache_dir>/embeddings``), with every distinct one of ``passages`` embedded up front in one
    length-sorted pass: a haystack turn shared by many questions is embedded once, and a bench run
    over the same data reuses the vectors (and the reverse)."""
    from tqdm import tqdm

    from bench.common.caches import cached_bi_encoder
    from mnemos.encoder import bundled_bi_encoder_path

    def progress(total: int) -> tuple[Callable[[int], object], Callable[[], None]]:
        bar = tqdm(total=total, desc="embed", unit="turn", mininterval=5.0, file=sys.stderr)
        return bar.update, bar.close

    encoder = cached_bi_encoder(bundled_bi_encoder_path(), cache_dir / "embeddings", "auto", progress=progress,
                                device=device)
    encoder.encode(list(dict.fromkeys(passages)))
    return encoder


@click.group()
def reranker() -> None:
    """Train and inspect the project's cross-encoder reranker."""


@reranker.command("train")
@click.option("--data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LoCoMo JSON file (CC BY-NC 4.0: a model trained on it is for research only).")
@click.option("--longmemeval", "longmemeval", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LongMemEval JSON (S or oracle; MIT). Repeatable: the same question's haystacks are merged.")
@click.option("--question-fold", default=None,
              help="i/k: split the LongMemEval questions into k folds stratified by type (seeded by --fold-seed, else --seed), "
                   "hold out fold i.")
@click.option("--pairs", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help='JSONL of {"query", "positive", "negatives"?} rows.')
@click.option("--pairs-licence", default=None, metavar="SPDX",
              help="The licence of the --pairs data (SPDX id, e.g. MIT); recorded in the provenance.")
@click.option("--conversations", default=None, help="Comma-separated LoCoMo sample_ids to train on.")
@click.option("--fold", default=None, help="i/k: sort conversations, cut into k chunks, hold out chunk i (1-based).")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="Model directory.")
@click.option("--max-pairs", type=click.IntRange(min=1), default=None, help="Cap on labelled pairs.")
@click.option("--epochs", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--fold-seed", type=int, default=None,
              help="Seed of the --question-fold split (default: --seed): another --seed then trains on the same questions.")
@click.option("--learning-rate", type=click.FloatRange(min=0, min_open=True), default=5e-5, show_default=True,
              help="Peak learning rate (linear warmup over 10% of the steps, then linear decay).")
@click.option("--max-steps", type=click.IntRange(min=1), default=None, help="Stop after this many steps.")
@click.option("--hard-negatives", type=click.IntRange(min=0), default=3, show_default=True,
              help="Hard negatives per positive (BM25 and, with --dense, bi-encoder results of its haystack).")
@click.option("--mining-depth", type=click.IntRange(min=1), default=30, show_default=True,
              help="How deep the BM25 (and bi-encoder) rankings are read for hard negatives.")
@click.option("--evidence-negatives", type=click.IntRange(min=0), default=0, show_default=True,
              help="Extra negatives per positive: other questions' evidence turns (docs/reranker.md).")
@click.option("--chitchat-negatives", type=click.IntRange(min=0), default=0, show_default=True,
              help="Short chit-chat turns ('ok', 'thanks') of the positive's speaker per positive (docs/reranker.md).")
@click.option("--model-negatives", type=click.IntRange(min=0), default=0, show_default=True,
              help="Extra negatives per positive: the hard candidates --negative-miner ranks highest (docs/reranker.md).")
@click.option("--negative-miner", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A trained cross-encoder that ranks candidates for --model-negatives; its training items count as seen.")
@click.option("--dense/--no-dense", default=True, show_default=True, help="Mine negatives with the bi-encoder too.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_CACHE_DIR,
              show_default=True, help="Embedding cache for --dense mining (shared with `mnemos bench quality`).")
@click.option("--same-speaker/--any-speaker", "same_speaker", default=False, show_default=True,
              help="Hard negatives spoken by the positive's own speaker first (docs/reranker.md).")
@click.option("--named-user-share", type=click.FloatRange(min=0, max=1), default=0.0, show_default=True,
              help="Share of LongMemEval questions rendered under a first name, their first person rewritten to it.")
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True, help="torch CPU threads.")
@click.option("--layers", type=click.IntRange(min=1, max=6), default=None,
              help="Keep only the first N transformer layers (a faster reranker); default all 6.")
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
              help="auto: a GPU when torch sees one.")
@click.option("--calibration-queries", type=click.IntRange(min=0), default=200, show_default=True,
              help="Training questions whose pools calibrate the deep-pass threshold (0: none).")
@click.option("--fp16", is_flag=True, help="Store the weights as float16 safetensors (the shipped model).")
@click.option("--loss", type=click.Choice(LOSSES), default="bce", show_default=True,
              help="bce: pointwise; lce: softmax over each positive and its own negatives (docs/reranker.md).")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Pairs per step (bce) or positive groups per step (lce).")
@click.option("--in-batch-negatives", type=click.IntRange(min=0), default=None,
              help="lce: passages of other groups in the batch added to each softmax (default 2).")
@click.option("--teacher", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="A trained cross-encoder directory to distil from (its training conversations count as seen).")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Distillation temperature T > 0 (with --teacher; default 1.0).")
@click.option("--distil-weight", type=click.FloatRange(min=0, max=1), default=None,
              help="Teacher's share W of the target (with --teacher; default 1.0).")
def train(data, longmemeval, question_fold, pairs, pairs_licence, conversations, fold, out, max_pairs, epochs, seed,
          max_steps, dense, same_speaker, named_user_share, threads, layers, device, calibration_queries, fp16, teacher, temperature, distil_weight,
          learning_rate, hard_negatives, mining_depth, cache_dir, fold_seed, evidence_negatives, loss, batch_size,
          in_batch_negatives, model_negatives, negative_miner, chitchat_negatives) -> None:
    """Fine-tune a cross-encoder reranker from the bundled MiniLM.

    A 1-logit head on all-MiniLM-L6-v2 (optionally its first N layers), trained with
    sentence-transformers' CrossEncoderTrainer and BinaryCrossEntropyLoss (batch 32, lr 5e-5,
    max_length 128, three epochs over every mined pair) on positive (query, turn) pairs from
    LongMemEval (--longmemeval, MIT), LoCoMo (--data, non-commercial) and/or a JSONL file (--pairs),
    with hard negatives mined by the service's BM25 and the bi-encoder over the same conversation
    or haystack. The output directory loads as a CrossEncoder and records its training sources,
    their licences and the conversations or questions used.
    With --teacher the student trains on W * sigmoid(teacher_logit / T) + (1 - W) * hard_label.
    """
    if data is None and pairs is None and not longmemeval:
        raise click.UsageError("give at least one source: --data (LoCoMo), --longmemeval or --pairs")
    if data is not None and (conversations is None) == (fold is None):
        raise click.UsageError("with --data give exactly one of --conversations or --fold")
    if data is None and (conversations or fold):
        raise click.UsageError("--conversations/--fold apply to --data only")
    if question_fold and not longmemeval:
        raise click.UsageError("--question-fold applies to --longmemeval only")
    if fold_seed is not None and not question_fold:
        raise click.UsageError("--fold-seed applies to --question-fold only")
    if math.isnan(named_user_share):  # click's FloatRange lets NaN through
        raise click.BadParameter("must be in [0, 1], got nan", param_hint="--named-user-share")
    if named_user_share and not longmemeval:
        raise click.UsageError("--named-user-share applies to --longmemeval only")
    if teacher is not None and loss != "bce":
        raise click.UsageError("--teacher (distillation) trains with --loss bce only")
    if in_batch_negatives is not None and loss != "lce":
        raise click.UsageError("--in-batch-negatives applies to --loss lce only")
    if pairs_licence and pairs is None:
        raise click.UsageError("--pairs-licence applies to --pairs only")
    if teacher is None and (temperature is not None or distil_weight is not None):
        raise click.UsageError("--temperature/--distil-weight apply to distillation only: give --teacher DIR")
    if bool(model_negatives) != (negative_miner is not None):
        raise click.UsageError("--model-negatives N and --negative-miner DIR go together")
    require_extra("train")
    ids = [c.strip() for c in conversations.split(",") if c.strip()] if conversations else None
    sys.exit(
        run_train(
            data=data, pairs=pairs, conversations=ids, fold=_parse_fold(fold) if fold else None, out=out,
            longmemeval=tuple(longmemeval), pairs_licence=pairs_licence,
            question_fold=_parse_fold(question_fold, "--question-fold") if question_fold else None,
            max_pairs=max_pairs, dense=dense, same_speaker=same_speaker,
            train_config=TrainConfig(epochs=epochs, seed=seed, max_steps=max_steps, layers=layers,
                                     device=resolve_device(device), learning_rate=learning_rate, loss=loss,
                                     batch_size=batch_size,
                                     in_batch_negatives=TrainConfig.in_batch_negatives if in_batch_negatives is None
                                     else in_batch_negatives),
            named_user_share=named_user_share, threads=threads, calibration_queries=calibration_queries, fp16=fp16,
            teacher=teacher, temperature=1.0 if temperature is None else temperature,
            distil_weight=1.0 if distil_weight is None else distil_weight,
            hard_negatives=hard_negatives, mining_depth=mining_depth, cache_dir=cache_dir, fold_seed=fold_seed,
            evidence_negatives=evidence_negatives, model_negatives=model_negatives, negative_miner=negative_miner,
            chitchat_negatives=chitchat_negatives,
        )
    )


@reranker.command("check")
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="LoCoMo JSON file.")
@click.option("--questions", "n_questions", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--speed-pairs", type=click.IntRange(min=0), default=300, show_default=True, help="0 skips timing.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
def check(model_dir, data, n_questions, speed_pairs, seed, threads) -> None:
    """Score held-out (question, evidence) vs (question, other turn) pairs and time inference."""
    from bench.training.check import run_check

    sys.exit(run_check(model_dir=model_dir, data=data, n_questions=n_questions, speed_pairs=speed_pairs,
                       seed=seed, threads=threads))
