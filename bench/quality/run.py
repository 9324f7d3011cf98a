"""``mnemos bench quality``: all arms on identical questions, both corpus modes, both protocols.

:func:`run_quality` drives :class:`~bench.quality.engine.Engine` (retrievals), :mod:`bench.quality.selection`
(``mnemos_full``), :mod:`bench.quality.report` (CIs, p-values, tables) and returns the JSON document
and the Markdown report; :mod:`bench.quality.fusion_choice` chooses ``hybrid_convex``'s weight on the dev
split. The order of work keeps the expensive part, cross-encoder scoring,
to one pass over each (query, text) pair: stateless fused arms first, then one rerank call
per question over every fused candidate of both corpus modes (each retriever's top 30: any
pool, suppressed or not, is cut from them), then the arms, which read those scores from the
cache. Only deep-pass pools reshuffled by suppression still score a few pairs lazily.
See :mod:`bench.quality.engine` for the protocols and the choice of K.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.datasets import Conversation
from bench.quality.arms import BASELINE_ARM, CONVEX_ARM, FULL_ARM, GAP_ARM, Arm, arm_by_name
from bench.quality.document import (
    DEEP_VARIANT,
    MetricsByRun,
    ablation_without_suppression,
    corpus_json,
    cost_json,
    dataset_json,
    full_vs_gap_on_test_split,
    no_evidence_json,
    run_rows,
    selection_json,
    service_defaults_json,
    settings_json,
)
from bench.quality.engine import (
    BenchQuestion,
    Engine,
    FoldRerankers,
    PoolResult,
    Protocol,
    QuestionMetrics,
    prepare_questions,
)
from bench.quality.fusion_choice import FusionChoice, choose_convex_weight, fusion_json
from bench.quality.markdown import quality_header
from bench.quality.options import QualityOptions
from bench.quality.report import render_markdown
from bench.quality.selection import Selection, select_full
from bench.quality.suppression_study import suppression_study
from bench.quality.variants import Variant, run_variant
from mnemos.encoder import Encoder
from mnemos.fusion import Fusion
from workers.query.config import FEATURE_FIELDS, feature_settings
from workers.settings import ENV_VARS, Settings

__all__ = ["QualityOptions", "QualityReport", "run_quality"]

logger = logging.getLogger(__name__)

Results = dict[tuple[CorpusMode, Protocol, str], Mapping[str, PoolResult]]
"""Pools of each (corpus mode, protocol, arm) run, keyed by question key."""
_FIXED_SELECTION = Selection(False, (), (), 0, "fixed: mnemos_full = +clustered_rif_gap (selection off)")
"""``mnemos_full`` without a selection: ``+clustered_rif_gap`` as it is."""
_SERVICE_DEFAULTS = Settings()
"""The service's built-in settings: what ``service_defaults`` scores unless a run is given others."""
Progress = Callable[[int, str], tuple[Callable[[int], None], Callable[[], None]]]


@dataclass
class QualityReport:
    """The JSON document, the Markdown report and per-question NDCG/Recall for reanalysis."""

    document: dict[str, Any]
    markdown: str
    per_question: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def run_quality(
    conversations: Sequence[Conversation],
    *,
    encoder: Encoder,
    rerankers: FoldRerankers | None,
    options: QualityOptions,
    dataset: Mapping[str, Any],
    reranker_info: Mapping[str, Any] | None = None,
    command: str = "",
    progress: Progress | None = None,
    variants: Sequence[Variant] = (),
    service_settings: Settings = _SERVICE_DEFAULTS,
) -> QualityReport:
    """Run the benchmark and build its report (see the module docstring for the order of work).

    ``service_settings`` gives the post-rerank features of the ``service_defaults`` block (default:
    ``Settings()``, the service's defaults); the CLI passes ``Settings.from_env()``, so a run measures the
    service as the ``MNEMOS_*`` variables configure it, and the document names those of them that set a feature.

    Raises:
        ValueError: if a reranking arm is requested without rerankers.
        LookupError: if some question's conversation was seen by every reranker fold.
    """
    started = time.perf_counter()
    arms = [arm_by_name(a) for a in options.arms]
    rerank_needed = any(a.reranks for a in arms)
    _refuse_what_cannot_run(options, variants, rerank_needed, has_rerankers=rerankers is not None)
    questions = prepare_questions(conversations, seed=options.seed, limit=options.limit)
    if rerankers is not None:
        for conv in {q.conversation_id for q in questions}:
            rerankers.fold_for(conv)  # fail before any work if a conversation has no clean fold
    make_engine = functools.partial(
        Engine, conversations=conversations, questions=questions, encoder=encoder, rerankers=rerankers,
        modes=options.modes, burnin_factor=options.burnin_factor, clusters=options.clusters,
        queries_per_cluster=options.queries_per_cluster, bootstrap_factor=options.bootstrap_factor,
        seed=options.seed, dedupe_threshold=options.dedupe_threshold, progress=progress,
    )
    engine = make_engine()
    by_key = {q.key: q for q in questions}

    # 1. stateless fused arms; 2. one rerank pass over every fused candidate; 3. suppression arms
    results, fusion = _run_fused_arms(engine, arms, options)
    if rerank_needed:
        _prewarm(engine, options)
    baseline = _run_reranked_arms(engine, arms, options, results, rerank_needed)
    protocols = sorted(options.protocols, key=lambda p: p is not Protocol.HELDOUT)  # held-out feeds the selection
    _run_suppression_arms(engine, arms, options, results, protocols)
    selection = _FIXED_SELECTION
    if FULL_ARM in options.arms:
        selection = _run_full_arm(engine, options, results, baseline, protocols)
    study = None
    if options.suppression_study and rerank_needed and Protocol.HELDOUT in options.protocols:
        t0 = time.perf_counter()
        study = suppression_study(engine, options.modes, n_resamples=options.n_resamples, seed=options.seed)
        engine.seconds["suppression_study"] = time.perf_counter() - t0

    # 4. metrics, statistics, rows
    metrics = _evaluate(engine, results, selection, options)
    base_metrics = {
        m: engine.evaluate(m, baseline[m], reranked=True, abstain_threshold=options.abstain_threshold)
        for m in baseline
    }
    t0 = time.perf_counter()
    runs = run_rows(engine, options, selection, metrics, base_metrics, by_key)
    no_evidence_json(runs, results, by_key, options.abstain_threshold)
    full_block = _full_arm_json(engine, options, selection, metrics, base_metrics, baseline, by_key)
    engine.seconds["statistics"] = time.perf_counter() - t0
    variant_blocks = _run_variants(variants, make_engine, engine, metrics, selection, baseline, options, fusion)

    service, service_metrics = service_defaults_json(engine, options, results, metrics, by_key,
                                                     feature_settings(service_settings))
    document: dict[str, Any] = {
        "dataset": dataset_json(dataset, conversations, questions, options.limit),
        "corpus": corpus_json(engine),
        "command": command,
        "reranker": dict(reranker_info or {}),
        "encoder": {"dim": encoder.dim, "identity": getattr(encoder, "model_key", type(encoder).__name__)},
        "settings": settings_json(options),
        "mnemos_full": full_block,
        "service_defaults": service,
        "service_environment": _feature_variables(service_settings),
        "fusion": fusion_json(fusion, metrics, by_key, n_resamples=options.n_resamples, seed=options.seed)
        if fusion is not None else None,
        "cost": cost_json(rerankers, engine, time.perf_counter() - started),
        "runs": runs,
        "variants": variant_blocks,
        "suppression_study": study,
    }
    return QualityReport(document=document, markdown=render_markdown(document, header=quality_header),
                         per_question=_per_question({**metrics, **service_metrics}))


def _feature_variables(settings: Settings) -> list[str]:
    """The ``MNEMOS_*`` variables that set one of ``settings``' post-rerank features, sorted."""
    return sorted(ENV_VARS[name] for name in settings.from_environment if name in FEATURE_FIELDS)


def _per_question(metrics: MetricsByRun) -> dict[str, dict[str, list[float]]]:
    """``{"mode/protocol/arm": {question key: [NDCG@10, Recall@10, Recall@30]}}`` for reanalysis."""
    return {
        f"{m.value}/{p.value}/{a}": {k: [v.ndcg10, v.recall10, v.recall30] for k, v in values.items()}
        for (m, p, a), values in metrics.items()
    }


def _refuse_what_cannot_run(options: QualityOptions, variants: Sequence[Variant], rerank_needed: bool, *,
                            has_rerankers: bool) -> None:
    """Refuse, before any work: reranking arms without rerankers; a fusion variant without a
    reranking arm (it changes only those); a convex one without ``hybrid_convex`` (whose
    dev-split choice is its weight).

    Raises:
        ValueError: naming what is missing.
    """
    if rerank_needed and not has_rerankers:
        raise ValueError("reranking arms need --reranker-fold models")
    if any(v.fusion is not None for v in variants) and not rerank_needed:
        raise ValueError("a fusion variant changes only the reranking arms; run one (e.g. hybrid_rerank) with it")
    if any(v.fusion is Fusion.CONVEX for v in variants) and CONVEX_ARM not in options.arms:
        raise ValueError(f"the fusion_convex variant takes its weight from the {CONVEX_ARM} arm's dev-split choice; "
                         f"add {CONVEX_ARM} to --arms")


def _run_fused_arms(engine: Engine, arms: Sequence[Arm],
                    options: QualityOptions) -> tuple[Results, FusionChoice | None]:
    """Stage 1: the arms without a reranker (no state, so one run serves every protocol), and the
    choice of ``hybrid_convex``'s weight on the dev split (None when that arm is not run)."""
    results: Results = {}
    choice = None
    if CONVEX_ARM in options.arms:
        t0 = time.perf_counter()
        choice = choose_convex_weight(engine, options.modes)
        engine.seconds["fusion_weight_choice"] = time.perf_counter() - t0
    for mode in options.modes:
        for arm in arms:
            if not arm.reranks:
                run = choice.arm if choice is not None and arm.name == CONVEX_ARM else arm
                for protocol in options.protocols:
                    results[(mode, protocol, arm.name)] = engine.run_plain(mode, run)
    return results, choice


def _prewarm(engine: Engine, options: QualityOptions) -> None:
    """Stage 2: one rerank call per question over every fused candidate the reranking arms can
    pool (and over the deep pools when ``mnemos_full`` may select the deep pass)."""
    t0 = time.perf_counter()
    prewarm = [arm_by_name(BASELINE_ARM).config]
    if "dense_rerank" in options.arms:
        prewarm.append(arm_by_name("dense_rerank").config)
    engine.prewarm(prewarm)
    if FULL_ARM in options.arms and options.full_features == "auto" and Protocol.HELDOUT in options.protocols:
        _prewarm_deep(engine)
    engine.seconds["rerank_prewarm"] = time.perf_counter() - t0


def _prewarm_deep(engine: Engine) -> None:
    """Score the deep-pass pools ``mnemos_full``'s deep pass would rerank (after ``hybrid_rerank``'s)."""
    deep = arm_by_name(FULL_ARM, deep_pass=True).config
    assert deep.deep_threshold is not None
    engine.prewarm_deep(arm_by_name(BASELINE_ARM).config, deep.deep_pool_size, deep.deep_threshold)


def _run_reranked_arms(engine: Engine, arms: Sequence[Arm], options: QualityOptions, results: Results,
                       rerank_needed: bool) -> dict[CorpusMode, Mapping[str, PoolResult]]:
    """Stage 2b: the reranking arms without suppression into ``results``; returns the
    ``hybrid_rerank`` pools per corpus mode (empty when no arm reranks)."""
    baseline = {}
    for mode in options.modes:
        if rerank_needed:
            baseline[mode] = engine.run_plain(mode, arm_by_name(BASELINE_ARM))
        for arm in arms:
            if arm.reranks and arm.suppression is None:
                for protocol in options.protocols:
                    results[(mode, protocol, arm.name)] = engine.run_plain(mode, arm)
    return baseline


def _run_suppression_arms(engine: Engine, arms: Sequence[Arm], options: QualityOptions, results: Results,
                          protocols: Sequence[Protocol]) -> None:
    """Stage 3: the suppression arms except ``mnemos_full``, in ``protocols`` order, into ``results``."""
    for protocol in protocols:
        for mode in options.modes:
            for arm in arms:
                if arm.suppression is not None and arm.name != FULL_ARM:
                    results[(mode, protocol, arm.name)] = engine.run_suppressed(mode, protocol, arm)


def _run_full_arm(engine: Engine, options: QualityOptions, results: Results,
                  baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
                  protocols: Sequence[Protocol]) -> Selection:
    """Stage 3b: select ``mnemos_full`` on the dev split (``full_features`` ``"auto"`` under the
    held-out protocol, else fixed to ``+clustered_rif_gap``) and run it into ``results``."""
    selection = _FIXED_SELECTION
    if options.full_features == "auto" and Protocol.HELDOUT in options.protocols:
        gap = arm_by_name(GAP_ARM)
        deep = arm_by_name(FULL_ARM, deep_pass=True)
        shallow_runs = {m: engine.run_suppressed(m, Protocol.HELDOUT, gap) for m in options.modes}
        deep_runs = {m: engine.run_suppressed(m, Protocol.HELDOUT, deep, DEEP_VARIANT) for m in options.modes}
        t0 = time.perf_counter()
        selection = select_full(engine, shallow_runs, deep_runs, baseline or None, alpha=options.alpha,
                                n_resamples=options.n_resamples, seed=options.seed)
        engine.seconds["selection"] = time.perf_counter() - t0
    elif options.full_features == "auto":
        logger.warning("mnemos_full selection needs the held-out protocol; using +clustered_rif_gap alone")
    base_arm = arm_by_name(FULL_ARM, deep_pass=selection.deep_pass)
    variant = DEEP_VARIANT if selection.deep_pass else GAP_ARM
    for protocol in protocols:
        for mode in options.modes:
            results[(mode, protocol, FULL_ARM)] = (
                engine.run_suppressed(mode, protocol, base_arm, variant) if selection.suppression
                else baseline[mode])
    return selection


def _evaluate(engine: Engine, results: Results, selection: Selection,
              options: QualityOptions) -> dict[tuple[CorpusMode, Protocol, str], dict[str, QuestionMetrics]]:
    """Stage 4: per-question metrics of every run (``mnemos_full`` with its selected features)."""
    metrics: dict[tuple[CorpusMode, Protocol, str], dict[str, QuestionMetrics]] = {}
    for (mode, protocol, name), res in results.items():
        settings = selection.settings if name == FULL_ARM else ()
        metrics[(mode, protocol, name)] = engine.evaluate(
            mode, res, reranked=arm_by_name(name).reranks, settings=settings,
            abstain_threshold=options.abstain_threshold,
        )
    return metrics


def _full_arm_json(engine: Engine, options: QualityOptions, selection: Selection, metrics: MetricsByRun,
                   base_metrics: Mapping[CorpusMode, Mapping[str, QuestionMetrics]],
                   baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
                   by_key: Mapping[str, BenchQuestion]) -> dict[str, Any] | None:
    """The document's ``mnemos_full`` block: the selection, the test-split comparison with
    ``+clustered_rif_gap`` and the ablation without suppression (None without that arm)."""
    full_block = None
    if FULL_ARM in options.arms:
        full_block = {**selection_json(selection), "test_split": full_vs_gap_on_test_split(options, metrics, by_key)}
    ablation = ablation_without_suppression(engine, options, selection, baseline, base_metrics, metrics, by_key)
    if full_block is not None:
        full_block["without_suppression"] = ablation
    return full_block


def _run_variants(variants: Sequence[Variant], make_engine: Callable[..., Engine], engine: Engine,
                  metrics: MetricsByRun,
                  selection: Selection, baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
                  options: QualityOptions, fusion: FusionChoice | None = None) -> list[dict[str, Any]]:
    """Each variant on its own engine (the main one when it changes nothing but timing), held-out;
    the seconds they took go to ``engine.seconds["variants"]``. A variant with a ``fusion`` runs its
    reranking arms at ``fusion``'s weight (the main run's ``hybrid_convex`` choice)."""
    t0 = time.perf_counter()
    if not variants:
        engine.seconds["variants"] = 0.0
        return []
    main = {(mode, arm): values for (mode, protocol, arm), values in metrics.items() if protocol is Protocol.HELDOUT}
    pools = _timing_pools(engine, baseline)
    blocks = []
    for variant in variants:
        changes = dict(variant.engine_changes)
        if variant.rerankers is not None:
            changes["rerankers"] = variant.rerankers
        if variant.fusion is not None:
            assert fusion is not None, "run_quality refuses a fusion variant without the hybrid_convex arm"
            changes["reranked_fusion"] = (variant.fusion, fusion.weight)
        modes = options.variant_modes or engine.modes
        target = make_engine(**changes, modes=modes) if changes else engine
        if target is not engine and target.rerankers is not None:
            target.prewarm([arm_by_name(BASELINE_ARM).config])
            if selection.deep_pass:
                _prewarm_deep(target)
        logger.info("variant %s: %s", variant.name, variant.description)
        block = run_variant(variant, target, main, selection, abstain_threshold=options.abstain_threshold,
                            n_resamples=options.n_resamples, seed=options.seed, timing_pools=pools, modes=modes)
        if "reranked_fusion" in changes:
            block["fusion"] = {"fusion": variant.fusion.value, "weight": changes["reranked_fusion"][1]}
        blocks.append(block)
    engine.seconds["variants"] = time.perf_counter() - t0
    return blocks


def _timing_pools(engine: Engine, baseline: Mapping[CorpusMode, Mapping[str, PoolResult]], n: int = 100
                  ) -> list[tuple[str, list[str]]]:
    """``(query, rendered pool texts)`` of a seeded sample of per-tenant ``hybrid_rerank`` pools."""
    mode = CorpusMode.PER_TENANT if CorpusMode.PER_TENANT in baseline else next(iter(baseline), None)
    if mode is None:
        return []
    keys = sorted(baseline[mode])
    chosen = np.random.default_rng(0).permutation(len(keys))[:n] if keys else []
    out = []
    for i in chosen:
        question = engine.question(keys[i])
        tenant = engine.tenant_of(mode, question)
        pool = baseline[mode][keys[i]].entry_ids[: arm_by_name(BASELINE_ARM).config.pool_size]
        out.append((question.text, [tenant.index.rendered(e) for e in pool]))
    return out
