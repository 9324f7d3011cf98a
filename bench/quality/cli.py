"""``mnemos bench quality``: the command and what it loads and writes.

:mod:`bench.commands` adds it, with the other benchmarks' commands, to the ``mnemos bench`` group
and offers the group to the root CLI as an entry-point plugin. Commands are thin: parse options, call a
``run_*`` function that returns an exit code.

Example (the committed LoCoMo run)::

    mnemos bench quality --data ../shared/data/locomo/locomo10.json \\
        --reranker-fold models/locomo-fold-a --reranker-fold models/locomo-fold-b \\
        --json bench/results/locomo.json --markdown bench/results/locomo.md --plot bench/results/locomo.png
"""

from __future__ import annotations

import gzip
import json
import logging
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from bench.common.caches import DEFAULT_CACHE_DIR
from bench.common.folds import load_folds

if TYPE_CHECKING:
    from bench.common.caches import PersistentEncoder
    from bench.common.datasets import Conversation
    from bench.quality.engine import FoldRerankers
    from bench.quality.run import QualityOptions, QualityReport

__all__ = ["QualityCommand", "quality", "run_quality_command"]

logger = logging.getLogger(__name__)

VARIANT_NAMES = ("rendering_off", "dedupe_guard_off", "suppression_off", "fusion_convex")


def build_variants(names: list[str], reranker_specs: list[str], *, cache_dir: Path, max_length: int,
                   batch_size: int, main_loaders: dict, main_router=None, precision: str = "auto",
                   device: str = "cpu", windows: int = 1) -> list:
    """Ablations by name (:data:`VARIANT_NAMES`) and reranker variants from
    ``NAME=DIR[,DIR...][@MAX_LENGTH][:PRECISION]`` specs (each DIR a fold, as ``--reranker-fold``;
    :func:`bench.quality.variants.parse_reranker_spec`), as :class:`bench.quality.variants.Variant` values.

    Raises:
        ValueError: on an unknown ablation name or a malformed spec.
    """
    from bench.quality.variants import Variant, parse_reranker_spec, reranker_details
    from mnemos.fusion import Fusion
    from mnemos.rendering import Rendering

    out = []
    main_timing = next(iter(main_loaders.values()), None)
    for name in names:
        if name == "rendering_off":
            out.append(Variant(name, "turns indexed, embedded and reranked as their text alone (rendering v0), "
                                     "same rerankers", {"rendering": Rendering.TEXT}))
        elif name == "dedupe_guard_off":
            out.append(Variant(name, "dedupe on cosine >= 0.95 alone (no distinguishing-token guard)",
                               {"dedupe_guard": False}))
        elif name == "suppression_off":
            out.append(Variant(name, "mnemos_full's features on hybrid_rerank pools (no suppression)", {},
                               suppression=False))
        elif name == "fusion_convex":
            out.append(Variant(name, "reranking arms (and the features' first-stage rank) fused by convex fusion "
                                     "at hybrid_convex's dev-split weight instead of RRF", {}, fusion=Fusion.CONVEX))
        else:
            raise ValueError(f"unknown variant {name!r}; known: {', '.join(VARIANT_NAMES)}")
    if main_timing is not None and reranker_specs:
        out.append(Variant("main_reranker", "the main run's rerankers (timing only)", {}, timing=main_timing,
                           reranker=reranker_details(main_router, max_length, precision)))
    for spec in reranker_specs:
        label, dirs, length_value, variant_precision = parse_reranker_spec(spec, max_length=max_length,
                                                                           precision=precision)
        router, loaders = load_folds(dirs, cache_dir=cache_dir, max_length=length_value, batch_size=batch_size,
                                     precision=variant_precision, device=device, windows=windows)
        details = reranker_details(router, length_value, variant_precision)
        out.append(Variant(label, f"rerankers {','.join(dirs)} at max_length {length_value}, "
                                  f"{details['precision'] if details else variant_precision}", {},
                           rerankers=router, timing=next(iter(loaders.values())), reranker=details))
    return out


def _tqdm_progress(total: int, description: str):
    from tqdm import tqdm

    bar = tqdm(total=total, desc=description, unit="q", dynamic_ncols=True, mininterval=2.0, file=sys.stderr)
    return bar.update, bar.close


@dataclass(frozen=True)
class QualityCommand:
    """What ``mnemos bench quality`` was asked to do: data, models, outputs and the run's options.

    Attributes:
        data / data_format: the dataset file and its format (``locomo`` or ``longmemeval``).
        only_conversations: conversation ids to keep (empty: all).
        folds: reranker fold specs (``DIR[=CONV,...]``, :func:`parse_fold_spec`).
        arms / corpora / protocols: names as given (empty ``arms``: every arm); validated by
            :meth:`quality_options`.
        burnin_factor ... suppression_study: the :class:`~bench.quality.run.QualityOptions` of the run
            (``resamples`` is its ``n_resamples``; ``dedupe`` False turns the 0.95 dedupe off).
        json_path / markdown_path / plot_path / per_question_path: outputs (None: not written).
        cache_dir: rerank-score and embedding caches. threads: torch threads. max_length /
            batch_size: of the cross-encoders. rerank_precision / encoder_precision: what the
            cross-encoders / the bi-encoder compute in (``auto`` as the workers resolve it).
            bi_encoder: directory (None: the bundled model). device: where both encoders run
            (``cpu``, ``cuda``, or ``auto``: a GPU when torch sees one). rerank_windows: windows a long
            turn is read in by the cross-encoders (as ``MNEMOS_RERANK_WINDOWS``).
        variants / compare_rerankers: ablation names and reranker variant specs (:func:`build_variants`).
        command: the command line, recorded in the report.
    """

    data: Path
    data_format: str = "locomo"
    only_conversations: tuple[str, ...] = ()
    folds: tuple[str, ...] = ()
    arms: tuple[str, ...] = ()
    corpora: tuple[str, ...] = ("per_tenant", "pooled")
    variant_corpora: tuple[str, ...] = ()
    protocols: tuple[str, ...] = ("heldout", "transductive")
    limit: int | None = None
    burnin_factor: float = 5.0
    clusters: int = 30
    queries_per_cluster: int = 17
    seed: int = 0
    resamples: int = 10_000
    abstain_threshold: float = 0.0
    dedupe: bool = True
    full_features: str = "auto"
    suppression_study: bool = False
    json_path: Path | None = None
    markdown_path: Path | None = None
    plot_path: Path | None = None
    per_question_path: Path | None = None
    cache_dir: Path = DEFAULT_CACHE_DIR
    threads: int = 2
    max_length: int = 128
    batch_size: int = 32
    rerank_precision: str = "auto"
    encoder_precision: str = "auto"
    bi_encoder: Path | None = None
    device: str = "cpu"
    rerank_windows: int = 4
    variants: tuple[str, ...] = ()
    compare_rerankers: tuple[str, ...] = ()
    command: str = "mnemos bench quality"

    def quality_options(self) -> QualityOptions:
        """The run's options.

        Raises:
            ValueError: on an unknown arm, corpus mode or protocol, or an invalid option value.
        """
        from bench.common.corpora import CorpusMode
        from bench.quality.arms import ARM_NAMES
        from bench.quality.engine import Protocol
        from bench.quality.run import QualityOptions

        return QualityOptions(
            arms=self.arms or ARM_NAMES,
            modes=tuple(CorpusMode(c) for c in self.corpora),
            variant_modes=tuple(CorpusMode(c) for c in self.variant_corpora),
            protocols=tuple(Protocol(p) for p in self.protocols),
            burnin_factor=self.burnin_factor, clusters=self.clusters, queries_per_cluster=self.queries_per_cluster,
            seed=self.seed, n_resamples=self.resamples, abstain_threshold=self.abstain_threshold,
            dedupe_threshold=0.95 if self.dedupe else None, limit=self.limit, full_features=self.full_features,
            suppression_study=self.suppression_study,
        )


def run_quality_command(request: QualityCommand) -> int:
    """Load data and models, run :func:`bench.quality.run.run_quality`, write the outputs.

    Returns 0 on success, 2 on unusable input (message on stderr).
    """
    import faiss
    import torch

    from bench.common.datasets import DatasetError
    from bench.quality.run import run_quality
    from bench.training.sources import file_sha256
    from mnemos.errors import MnemosError
    from workers.runtime.errors import SettingsError
    from workers.runtime.models import resolve_device
    from workers.settings import Settings

    torch.set_num_threads(request.threads)
    device = resolve_device(request.device)
    # One query at a time: faiss's OpenMP start-up costs more than the search itself (measured
    # ~1.7 ms vs ~0.3 ms per search on a LoCoMo-sized index), so search single-threaded.
    faiss.omp_set_num_threads(1)
    started = time.perf_counter()
    try:
        conversations = _load_conversations(request)
        options = request.quality_options()
        service_settings = Settings.from_env()
    except (DatasetError, ValueError, SettingsError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    try:
        router, loaders = load_folds(list(request.folds), cache_dir=request.cache_dir,
                                     max_length=request.max_length, batch_size=request.batch_size,
                                     precision=request.rerank_precision, device=device,
                                     windows=request.rerank_windows)
        variant_list = build_variants(list(request.variants), list(request.compare_rerankers),
                                      cache_dir=request.cache_dir, max_length=request.max_length,
                                      batch_size=request.batch_size, main_loaders=loaders, main_router=router,
                                      precision=request.rerank_precision, device=device,
                                      windows=request.rerank_windows)
    except (OSError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    dataset = {"name": "LoCoMo" if request.data_format == "locomo" else "LongMemEval",
               "format": request.data_format, "path": request.data.name, "sha256": file_sha256(request.data)}
    try:
        encoder = _bi_encoder(request, device)
    except (OSError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    reranker_info = _reranker_info(router, [c.conversation_id for c in conversations], request.max_length,
                                   request.rerank_precision)
    try:
        report = run_quality(
            conversations, encoder=encoder, rerankers=router, options=options, dataset=dataset,
            reranker_info=reranker_info, command=request.command, progress=_tqdm_progress, variants=variant_list,
            service_settings=service_settings,
        )
    except (LookupError, ValueError, MnemosError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    click.echo(report.markdown)
    _write_outputs(request, report)
    cost = report.document["cost"]
    click.echo(
        f"total seconds: {time.perf_counter() - started:.1f}; reranker pairs: {cost['reranker_pairs']} "
        f"({cost['reranker_pairs_scored_by_model']} scored by the model, the rest from {request.cache_dir})",
        err=True,
    )
    return 0


def _load_conversations(request: QualityCommand) -> list[Conversation]:
    """The dataset's conversations, only those of ``request.only_conversations`` when given.

    Raises:
        DatasetError: if the file cannot be read as its format.
        ValueError: if a requested conversation is not in the data.
    """
    from bench.common.datasets import load_locomo, load_longmemeval

    data = request.data
    conversations = load_locomo(data) if request.data_format == "locomo" else load_longmemeval(data)
    wanted = set(request.only_conversations)
    if wanted:
        unknown = sorted(wanted - {c.conversation_id for c in conversations})
        if unknown:
            raise ValueError(f"--conversations: not in the data: {', '.join(unknown)}")
        conversations = [c for c in conversations if c.conversation_id in wanted]
    return conversations


def _bi_encoder(request: QualityCommand, device: str) -> PersistentEncoder:
    """The bi-encoder (``request.bi_encoder`` or the bundled one) on ``device`` in
    ``request.encoder_precision`` behind the disk embedding cache (:func:`bench.common.caches.cached_bi_encoder`)."""
    from bench.common.caches import cached_bi_encoder
    from mnemos.encoder import bundled_bi_encoder_path

    return cached_bi_encoder(request.bi_encoder or bundled_bi_encoder_path(), request.cache_dir / "embeddings",
                             request.encoder_precision, progress=lambda n: _tqdm_progress(n, "embed"), device=device)


def _reranker_info(router: FoldRerankers | None, conversation_ids: list[str], max_length: int,
                   precision: str = "auto") -> dict[str, Any]:
    """The report's ``reranker`` block: each fold with the conversations it trained on and evaluates,
    the max length and the precision the cross-encoders computed in (``auto`` resolved)."""
    from mnemos.precision import resolve_precision

    assignment: dict[str, str] = {}
    for conv in conversation_ids:
        try:
            assignment[conv] = router.fold_for(conv).name if router else ""
        except LookupError:
            assignment[conv] = ""
    return {
        "selection": "per question: the first fold whose training conversations exclude the question's conversation",
        "max_length": max_length,
        "precision": resolve_precision(precision, "cpu").value,
        "folds": [
            {
                "name": f.name, "path": f.path, "identity": f.identity,
                "train_conversations": sorted(f.train_conversations),
                "evaluated_conversations": [c for c in conversation_ids if assignment[c] == f.name],
                "provenance": f.provenance,
            }
            for f in (router.folds if router else [])
        ],
    }


def _write_outputs(request: QualityCommand, report: QualityReport) -> None:
    """Write the JSON document, the Markdown report, the plot and the per-question values that
    ``request`` names (parent directories are created)."""
    from bench.common.plot import plot_ndcg
    from bench.quality.question_metrics import PER_QUESTION_METRICS

    doc = report.document
    if request.json_path:
        request.json_path.parent.mkdir(parents=True, exist_ok=True)
        request.json_path.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    if request.markdown_path:
        request.markdown_path.parent.mkdir(parents=True, exist_ok=True)
        request.markdown_path.write_text(report.markdown, encoding="utf-8")
    if request.plot_path:
        plot_ndcg(doc["runs"], request.plot_path, title=f"{doc['dataset']['name']}: NDCG@10 per arm (95% CI)")
    if request.per_question_path:
        request.per_question_path.parent.mkdir(parents=True, exist_ok=True)
        with gzip.open(request.per_question_path, "wt", encoding="utf-8") as handle:
            json.dump({"metrics": list(PER_QUESTION_METRICS), "runs": report.per_question}, handle)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


@click.command("quality")
@click.option("--data", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Dataset file (LoCoMo locomo10.json or a LongMemEval JSON).")
@click.option("--format", "data_format", type=click.Choice(["locomo", "longmemeval"]), default="locomo",
              show_default=True)
@click.option("--reranker-fold", "folds", multiple=True, metavar="DIR[=CONV,...]",
              help="A cross-encoder directory, optionally with the conversations it was trained on "
                   "(default: read from its mnemos_provenance.json). Repeat per fold.")
@click.option("--arms", default=None, help="Comma-separated arms (default: all).")
@click.option("--corpus", default="per_tenant,pooled", show_default=True, help="per_tenant and/or pooled.")
@click.option("--protocol", default="heldout,transductive", show_default=True, help="heldout and/or transductive.")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="About N questions, spread over conversations.")
@click.option("--conversations", default=None, help="Comma-separated conversation ids to keep (default: all).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--markdown", "markdown_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--per-question", "per_question_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Gzipped JSON of per-question NDCG@10/Recall@10/Recall@30 for every run.")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_CACHE_DIR,
              show_default=True, help="Rerank-score and embedding caches (diskcache directories).")
@click.option("--burnin-factor", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Burn-in draws per burn-in question.")
@click.option("--clusters", type=click.IntRange(min=1), default=30, show_default=True, help="Max K (the paper: 30).")
@click.option("--queries-per-cluster", type=click.IntRange(min=1), default=17, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--resamples", type=click.IntRange(min=100), default=10_000, show_default=True)
@click.option("--abstain-threshold", type=float, default=0.0, show_default=True, help="T of abstain@T (logits).")
@click.option("--dedupe/--no-dedupe", default=True, show_default=True, help="Cosine >= 0.95 dedupe per tenant.")
@click.option("--full-features", type=click.Choice(["auto", "none"]), default="auto", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--max-length", type=click.IntRange(min=8), default=128, show_default=True)
@click.option("--rerank-precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="What the cross-encoders compute in on the CPU; auto as the query worker's "
                   "MNEMOS_RERANK_PRECISION: bf16 where the CPU computes it natively, else fp32.")
@click.option("--encoder-precision", type=click.Choice(["auto", "fp32", "bf16"]), default="auto", show_default=True,
              help="What the bi-encoder computes in; auto as the workers' MNEMOS_ENCODER_PRECISION.")
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the bi-encoder and the cross-encoders run (auto: a GPU when torch sees one).")
@click.option("--rerank-windows", type=click.IntRange(min=1), default=4, show_default=True,
              help="Windows a turn longer than the pair's room is read in, best kept (MNEMOS_RERANK_WINDOWS).")
@click.option("--bi-encoder", type=click.Path(exists=True, file_okay=False, path_type=Path), default=None,
              help="Bi-encoder directory (default: the bundled all-MiniLM-L6-v2).")
@click.option("--variant", "variants", multiple=True, type=click.Choice(VARIANT_NAMES),
              help="An ablation measured beside the main run (repeatable).")
@click.option("--suppression-study", is_flag=True, default=False,
              help="Also run the dev-split suppression study (alpha x evidence threshold grid; bench/quality/suppression_study.py).")
@click.option("--variant-corpus", "variant_corpus", default="",
              help="Corpus modes of the variants (default: those of --corpus), e.g. per_tenant.")
@click.option("--compare-rerankers", "compare_rerankers", multiple=True, metavar="NAME=DIR[,DIR...][@MAX_LENGTH][:PRECISION]",
              help="Other reranker folds measured beside the main ones, quality and time per pool (repeatable).")
def quality(**kwargs: Any) -> None:
    """Retrieval quality of every arm on identical questions (see bench/quality/run.py)."""
    command = "mnemos bench quality " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("quality") + 1:]) \
        if "quality" in sys.argv else "mnemos bench quality"
    request = QualityCommand(
        data=kwargs["data"], data_format=kwargs["data_format"], folds=tuple(kwargs["folds"]),
        arms=tuple(_split(kwargs["arms"])), corpora=tuple(_split(kwargs["corpus"])),
        variant_corpora=tuple(_split(kwargs["variant_corpus"])),
        protocols=tuple(_split(kwargs["protocol"])), limit=kwargs["limit"], json_path=kwargs["json_path"],
        markdown_path=kwargs["markdown_path"], plot_path=kwargs["plot_path"],
        per_question_path=kwargs["per_question_path"], cache_dir=kwargs["cache_dir"],
        burnin_factor=kwargs["burnin_factor"], clusters=kwargs["clusters"],
        queries_per_cluster=kwargs["queries_per_cluster"], seed=kwargs["seed"], resamples=kwargs["resamples"],
        abstain_threshold=kwargs["abstain_threshold"], dedupe=kwargs["dedupe"],
        full_features=kwargs["full_features"], threads=kwargs["threads"], max_length=kwargs["max_length"],
        batch_size=kwargs["batch_size"], rerank_precision=kwargs["rerank_precision"], bi_encoder=kwargs["bi_encoder"],
        encoder_precision=kwargs["encoder_precision"], device=kwargs["device"],
        rerank_windows=kwargs["rerank_windows"],
        command=command,
        only_conversations=tuple(_split(kwargs["conversations"])), variants=tuple(kwargs["variants"]),
        compare_rerankers=tuple(kwargs["compare_rerankers"]), suppression_study=kwargs["suppression_study"],
    )
    sys.exit(run_quality_command(request))
