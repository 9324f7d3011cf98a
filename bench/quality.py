"""``mnemos bench quality``: all arms on identical questions, both corpus modes, both protocols.

:func:`run_quality` drives :class:`~bench.engine.Engine` (retrievals), :mod:`bench.selection`
(``mnemos_full``), :mod:`bench.report` (CIs, p-values, tables) and returns the JSON document
and the Markdown report. The order of work keeps the expensive part, cross-encoder scoring,
to one pass over each (query, text) pair: stateless fused arms first, then one rerank call
per question over every fused candidate of both corpus modes (each retriever's top 30: any
pool, suppressed or not, is cut from them), then the arms, which read those scores from the
cache. Only deep-pass pools reshuffled by suppression still score a few pairs lazily.
See :mod:`bench.engine` for the protocols and the choice of K.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from bench.arms import ARM_NAMES, BASELINE_ARM, GAP_ARM, arm_by_name
from bench.corpora import CorpusMode
from bench.datasets import Conversation
from bench.engine import (
    Engine,
    FoldRerankers,
    PoolResult,
    Protocol,
    QuestionMetrics,
    RunKey,
    prepare_questions,
)
from bench.report import render_markdown, run_row
from bench.selection import SUPPRESSION_OFF, Selection, overall_question, select_full
from bench.stats import DEFAULT_RESAMPLES, bootstrap_ci, compare_paired
from bench.suppression_study import study_markdown, suppression_study
from bench.variants import Variant, run_variant
from mnemos.encoder import Encoder

__all__ = ["QualityOptions", "QualityReport", "run_quality"]

logger = logging.getLogger(__name__)

FULL_ARM = "mnemos_full"
_DEEP_VARIANT = "+clustered_rif_gap+deep_pass"


@dataclass(frozen=True)
class QualityOptions:
    """What to run. ``full_features``: ``"auto"`` selects on the dev split (needs the held-out
    protocol), ``"none"`` makes ``mnemos_full`` equal to ``+clustered_rif_gap``."""

    arms: tuple[str, ...] = ARM_NAMES
    modes: tuple[CorpusMode, ...] = (CorpusMode.PER_TENANT, CorpusMode.POOLED)
    protocols: tuple[Protocol, ...] = (Protocol.HELDOUT, Protocol.TRANSDUCTIVE)
    burnin_factor: float = 5.0
    clusters: int = 30
    queries_per_cluster: int = 17
    bootstrap_factor: int = 10
    seed: int = 0
    n_resamples: int = DEFAULT_RESAMPLES
    abstain_threshold: float = 0.0
    dedupe_threshold: float | None = 0.95
    limit: int | None = None
    full_features: str = "auto"
    alpha: float = 0.05
    suppression_study: bool = False

    def __post_init__(self) -> None:
        unknown = [a for a in self.arms if a not in ARM_NAMES]
        if unknown:
            raise ValueError(f"unknown arms {unknown}; known: {', '.join(ARM_NAMES)}")
        if self.full_features not in ("auto", "none"):
            raise ValueError(f"full_features must be 'auto' or 'none', got {self.full_features!r}")
        if self.burnin_factor < 0:
            raise ValueError(f"burnin_factor must be >= 0, got {self.burnin_factor}")


@dataclass
class QualityReport:
    """The JSON document, the Markdown report and per-question NDCG/Recall for reanalysis."""

    document: dict[str, Any]
    markdown: str
    per_question: dict[str, dict[str, list[float]]] = field(default_factory=dict)


def _selection_json(selection: Selection) -> dict[str, Any]:
    return {
        "features": list(selection.labels),
        "deep_pass": selection.deep_pass,
        "suppression": selection.suppression,
        "rule": selection.rule,
        "dev_questions": selection.dev_questions,
        "steps": [
            {"candidate": s.candidate, "kept": s.kept, "dev": dict(s.per_mode), "grid": list(s.grid)}
            for s in selection.steps
        ],
    }


def _cost(rerankers: FoldRerankers | None, engine: Engine, seconds: float) -> dict[str, Any]:
    pairs = model_pairs = 0
    for reranker in (rerankers.rerankers.values() if rerankers else ()):
        pairs += int(getattr(reranker, "pairs_scored", 0))
        inner = getattr(reranker, "inner", None)
        model_pairs += int(getattr(inner, "model_pairs_scored", getattr(reranker, "pairs_scored", 0)))
    return {
        "seconds": round(seconds, 1),
        "stage_seconds": {k: round(v, 1) for k, v in engine.seconds.items()},
        "reranker_pairs": pairs,
        "reranker_pairs_scored_by_model": model_pairs,
        "reranker_pairs_from_disk_cache": pairs - model_pairs,
        "embeddings_computed": int(getattr(engine.encoder, "encoded", 0)),
        "retrievals": engine.retrievals,
    }


def _without_suppression(
    engine: Engine,
    options: QualityOptions,
    selection: Selection,
    baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
    base_metrics: Mapping[CorpusMode, Mapping[str, QuestionMetrics]],
    metrics: Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, QuestionMetrics]],
    by_key: Mapping[str, Any],
) -> list[dict[str, Any]]:
    """Ablation: ``mnemos_full``'s post-rerank features on ``hybrid_rerank`` (no suppression state).

    Not an arm of the issue; reported because it separates the features' effect from the
    suppression's. Compared with ``hybrid_rerank`` and with held-out ``mnemos_full`` on the same
    questions (all categories 1-4, and the test split alone).
    """
    if not selection.settings or FULL_ARM not in options.arms or not selection.suppression:
        return []  # without suppression, mnemos_full is this ablation already
    out = []
    for mode, results in baseline.items():
        ablated = engine.evaluate(mode, results, reranked=True, settings=selection.settings,
                                  abstain_threshold=options.abstain_threshold)
        keys = [k for k in ablated if overall_question(by_key[k].category)]
        test = [k for k in keys if not by_key[k].dev]
        values = np.asarray([ablated[k].ndcg10 for k in keys])
        recall = np.asarray([ablated[k].recall10 for k in keys])
        entry: dict[str, Any] = {
            "corpus": mode.value, "features": [s.label() for s in selection.settings], "n": len(keys),
            "ndcg@10": float(values.mean()), "ndcg@10_ci95": list(bootstrap_ci(values, n_resamples=options.n_resamples,
                                                                                seed=options.seed)),
            "recall@10": float(recall.mean()), "recall@10_ci95": list(bootstrap_ci(recall, n_resamples=options.n_resamples,
                                                                                   seed=options.seed)),
        }
        others = {BASELINE_ARM: base_metrics[mode]}
        if (mode, Protocol.HELDOUT, FULL_ARM) in metrics:
            others[f"{FULL_ARM} (heldout)"] = metrics[(mode, Protocol.HELDOUT, FULL_ARM)]
        for name, other in others.items():
            for split, subset in (("all", keys), ("test_split", test)):
                cmp = compare_paired([ablated[k].ndcg10 for k in subset], [other[k].ndcg10 for k in subset],
                                     n_resamples=options.n_resamples, seed=options.seed)
                entry[f"vs {name} ({split})"] = {"n": cmp.n, "delta_ndcg@10": cmp.delta,
                                                 "ci95": list(cmp.delta_ci95), "p": cmp.p_value}
        out.append(entry)
    return out


def _run_variants(variants: Sequence[Variant], make_engine: Callable[..., Engine], engine: Engine,
                  metrics: Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, QuestionMetrics]],
                  selection: Selection, baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
                  options: QualityOptions) -> list[dict[str, Any]]:
    """Each variant on its own engine (the main one when it changes nothing but timing), held-out."""
    if not variants:
        return []
    main = {(mode, arm): values for (mode, protocol, arm), values in metrics.items() if protocol is Protocol.HELDOUT}
    pools = _timing_pools(engine, baseline)
    blocks = []
    for variant in variants:
        changes = dict(variant.engine_changes)
        if variant.rerankers is not None:
            changes["rerankers"] = variant.rerankers
        target = make_engine(**changes) if changes else engine
        if target is not engine and target.rerankers is not None:
            target.prewarm([arm_by_name(BASELINE_ARM).config])
        logger.info("variant %s: %s", variant.name, variant.description)
        blocks.append(run_variant(variant, target, main, selection, abstain_threshold=options.abstain_threshold,
                                  n_resamples=options.n_resamples, seed=options.seed, timing_pools=pools))
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


def _header(document: Mapping[str, Any]) -> list[str]:
    d, cost = document["dataset"], document["cost"]
    lines = [f"# Retrieval quality on {d['name']}", ""]
    if document.get("command"):
        lines += ["Command:", "", "```", document["command"], "```", ""]
    lines += [
        f"Dataset: `{d['path']}` ({d['conversations']} conversations, {d['turns']} turns, {d['questions']} questions"
        f" run, {d['labelled']} with evidence). Overall = categories 1-4; category 5 separately.",
        f"Cost: {cost['seconds']} s total, {cost['reranker_pairs']} reranker pairs "
        f"({cost['reranker_pairs_scored_by_model']} scored by the model in this process, the rest from the disk "
        f"cache), {cost['retrievals']} retrievals.",
        "",
        "Rerankers (each question uses the fold that never saw its conversation):",
        "",
    ]
    for fold in document["reranker"].get("folds", []):
        lines.append(
            f"- `{fold['name']}` ({fold['path']}): trained on {', '.join(fold['train_conversations']) or '—'}; "
            f"evaluates {', '.join(fold['evaluated_conversations']) or '—'}"
        )
    s = document["settings"]
    lines += [
        "",
        f"Suppression: alpha {s['alpha']}, eta {s['eta']}, burn-in {s['burnin_factor']}x the burn-in set, "
        f"K = {s['k_rule']}; evaluation with frozen state. Held-out: {s['heldout_split']}",
    ]
    full = document.get("mnemos_full")
    if full:
        start = f"`{GAP_ARM}`" if full.get("suppression", True) else \
            f"`{BASELINE_ARM}` (the selection dropped suppression)"
        features = [f for f in full["features"] if f != SUPPRESSION_OFF]
        lines += ["", f"`mnemos_full` = {start} + {', '.join(features) or 'nothing'} "
                      f"({full['rule']}; {full['dev_questions']} dev questions).", ""]
        if full["steps"]:
            lines += ["| candidate | kept | " + " | ".join(f"Δ NDCG@10 {m} (p)" for m in full["steps"][0]["dev"]) + " |",
                      "|---|---|" + "---|" * len(full["steps"][0]["dev"])]
            for step in full["steps"]:
                cells = " | ".join(f"{v['delta']:+.4f} ({v['p']:.3f})" for v in step["dev"].values())
                lines.append(f"| {step['candidate']} | {'yes' if step['kept'] else 'no'} | {cells} |")
        for item in full.get("without_suppression", []):
            lines.append(
                f"\nAblation ({item['corpus']}): the same features on `{BASELINE_ARM}` without suppression: NDCG@10 "
                f"{item['ndcg@10']:.3f} [{item['ndcg@10_ci95'][0]:.3f}, {item['ndcg@10_ci95'][1]:.3f}], Recall@10 "
                f"{item['recall@10']:.3f} [{item['recall@10_ci95'][0]:.3f}, {item['recall@10_ci95'][1]:.3f}]; "
                + "; ".join(f"{k}: {v['delta_ndcg@10']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}] p={v['p']:.3f}"
                            for k, v in item.items() if k.startswith("vs "))
            )
        for item in full.get("test_split", []):
            lines.append(
                f"\nTest split ({item['corpus']}, {item['protocol']}, n={item['n']}): {FULL_ARM} − {GAP_ARM} "
                f"NDCG@10 {item['delta']:+.4f} [{item['ci95'][0]:+.4f}, {item['ci95'][1]:+.4f}], p={item['p']:.3f}"
            )
    lines += _variant_lines(document.get("variants") or [])
    if document.get("suppression_study"):
        lines += [""] + study_markdown(document["suppression_study"])
    return lines


def _variant_lines(blocks: Sequence[Mapping[str, Any]]) -> list[str]:
    """Markdown table of the variants: NDCG@10 per arm and mode, Δ vs the main run, rerank ms per pool."""
    if not blocks:
        return []
    modes = list(dict.fromkeys(m for b in blocks for m in b["modes"]))
    head = " | ".join(f"{m} {arm}" for m in modes for arm in ("hybrid_rrf", BASELINE_ARM, FULL_ARM))
    lines = ["", "Variants (held-out protocol; NDCG@10, and Δ vs the main run with 95% CI and p):", "",
             f"| variant | {head} | rerank ms/pool p50 (p95) |", "|---|" + "---|" * (3 * len(modes) + 1)]
    for block in blocks:
        cells = []
        for mode in modes:
            for arm in ("hybrid_rrf", BASELINE_ARM, FULL_ARM):
                entry = block["modes"].get(mode, {}).get(arm)
                if not entry or entry.get("ndcg@10") is None:
                    cells.append("–")
                    continue
                vs = entry.get("vs_main")
                extra = f" ({vs['delta']:+.3f} [{vs['ci95'][0]:+.3f}, {vs['ci95'][1]:+.3f}], p={vs['p']:.3f})" \
                    if vs and vs["n"] else ""
                cells.append(f"{entry['ndcg@10']:.3f}{extra}")
        timing = block.get("rerank_time")
        cells.append(f"{timing['p50_ms']:.0f} ({timing['p95_ms']:.0f})" if timing else "–")
        lines.append(f"| {block['name']}: {block['description']} | " + " | ".join(cells) + " |")
    return lines


def run_quality(
    conversations: Sequence[Conversation],
    *,
    encoder: Encoder,
    rerankers: FoldRerankers | None,
    options: QualityOptions,
    dataset: Mapping[str, Any],
    reranker_info: Mapping[str, Any] | None = None,
    command: str = "",
    progress: Callable[[int, str], tuple[Callable[[int], None], Callable[[], None]]] | None = None,
    variants: Sequence[Variant] = (),
) -> QualityReport:
    """Run the benchmark and build its report (see the module docstring for the order of work).

    Raises:
        ValueError: if a reranking arm is requested without rerankers.
        LookupError: if some question's conversation was seen by every reranker fold.
    """
    started = time.perf_counter()
    arms = [arm_by_name(a) for a in options.arms]
    rerank_needed = any(a.reranks for a in arms)
    if rerank_needed and rerankers is None:
        raise ValueError("reranking arms need --reranker-fold models")
    questions = prepare_questions(conversations, seed=options.seed, limit=options.limit)
    if rerankers is not None:
        for conv in {q.conversation_id for q in questions}:
            rerankers.fold_for(conv)  # fail before any work if a conversation has no clean fold
    def make_engine(**changes: Any) -> Engine:
        parts: dict[str, Any] = dict(
            conversations=conversations, questions=questions, encoder=encoder, rerankers=rerankers,
            modes=options.modes, burnin_factor=options.burnin_factor, clusters=options.clusters,
            queries_per_cluster=options.queries_per_cluster, bootstrap_factor=options.bootstrap_factor,
            seed=options.seed, dedupe_threshold=options.dedupe_threshold, progress=progress,
        )
        return Engine(**{**parts, **changes})

    engine = make_engine()
    by_key = {q.key: q for q in questions}
    results: dict[tuple[CorpusMode, Protocol, str], Mapping[str, PoolResult]] = {}

    # 1. stateless fused arms; 2. one rerank pass over every fused candidate
    for mode in options.modes:
        for arm in arms:
            if not arm.reranks:
                for protocol in options.protocols:
                    results[(mode, protocol, arm.name)] = engine.run_plain(mode, arm)
    if rerank_needed:
        t0 = time.perf_counter()
        prewarm = [arm_by_name(BASELINE_ARM).config]
        if "dense_rerank" in options.arms:
            prewarm.append(arm_by_name("dense_rerank").config)
        engine.prewarm(prewarm)
        if FULL_ARM in options.arms and options.full_features == "auto" and Protocol.HELDOUT in options.protocols:
            deep = arm_by_name(FULL_ARM, deep_pass=True).config
            assert deep.deep_threshold is not None
            engine.prewarm_deep(arm_by_name(BASELINE_ARM).config, deep.deep_pool_size, deep.deep_threshold)
        engine.seconds["rerank_prewarm"] = time.perf_counter() - t0
    baseline = {}
    for mode in options.modes:
        if rerank_needed:
            baseline[mode] = engine.run_plain(mode, arm_by_name(BASELINE_ARM))
        for arm in arms:
            if arm.reranks and arm.suppression is None:
                for protocol in options.protocols:
                    results[(mode, protocol, arm.name)] = engine.run_plain(mode, arm)

    # 3. suppression arms, held-out first (it feeds the mnemos_full selection)
    protocols = sorted(options.protocols, key=lambda p: p is not Protocol.HELDOUT)
    for protocol in protocols:
        for mode in options.modes:
            for arm in arms:
                if arm.suppression is not None and arm.name != FULL_ARM:
                    results[(mode, protocol, arm.name)] = engine.run_suppressed(mode, protocol, arm)

    selection = Selection(False, (), (), 0, "fixed: mnemos_full = +clustered_rif_gap (selection off)")
    if FULL_ARM in options.arms:
        if options.full_features == "auto" and Protocol.HELDOUT in options.protocols:
            gap = arm_by_name(GAP_ARM)
            deep = arm_by_name(FULL_ARM, deep_pass=True)
            shallow_runs = {m: engine.run_suppressed(m, Protocol.HELDOUT, gap) for m in options.modes}
            deep_runs = {m: engine.run_suppressed(m, Protocol.HELDOUT, deep, _DEEP_VARIANT) for m in options.modes}
            t0 = time.perf_counter()
            selection = select_full(engine, shallow_runs, deep_runs, baseline or None, alpha=options.alpha,
                                    n_resamples=options.n_resamples, seed=options.seed)
            engine.seconds["selection"] = time.perf_counter() - t0
        elif options.full_features == "auto":
            logger.warning("mnemos_full selection needs the held-out protocol; using +clustered_rif_gap alone")
        base_arm = arm_by_name(FULL_ARM, deep_pass=selection.deep_pass)
        variant = _DEEP_VARIANT if selection.deep_pass else GAP_ARM
        for protocol in protocols:
            for mode in options.modes:
                results[(mode, protocol, FULL_ARM)] = (
                    engine.run_suppressed(mode, protocol, base_arm, variant) if selection.suppression
                    else baseline[mode])

    study = None
    if options.suppression_study and rerank_needed and Protocol.HELDOUT in options.protocols:
        t0 = time.perf_counter()
        study = suppression_study(engine, options.modes, n_resamples=options.n_resamples, seed=options.seed)
        engine.seconds["suppression_study"] = time.perf_counter() - t0

    # 4. metrics, statistics, rows
    metrics: dict[tuple[CorpusMode, Protocol, str], dict[str, QuestionMetrics]] = {}
    for (mode, protocol, name), res in results.items():
        arm = arm_by_name(name)
        settings = selection.settings if name == FULL_ARM else ()
        metrics[(mode, protocol, name)] = engine.evaluate(
            mode, res, reranked=arm.reranks, settings=settings, abstain_threshold=options.abstain_threshold
        )
    base_metrics = {
        m: engine.evaluate(m, baseline[m], reranked=True, abstain_threshold=options.abstain_threshold)
        for m in baseline
    }
    t0 = time.perf_counter()
    runs, memo = [], {}
    for mode in options.modes:
        for protocol in options.protocols:
            for name in options.arms:
                arm = arm_by_name(name)
                memo_key = (mode, name) if arm.suppression is None else (mode, protocol, name)
                if memo_key not in memo:
                    memo[memo_key] = run_row(
                        corpus=mode.value, protocol=protocol.value, arm=name, metrics=metrics[(mode, protocol, name)],
                        baseline=base_metrics.get(mode), questions=by_key,
                        abstain_threshold=options.abstain_threshold, n_resamples=options.n_resamples, seed=options.seed,
                    )
                row = dict(memo[memo_key], protocol=protocol.value)
                if arm.suppression is not None and (name != FULL_ARM or selection.suppression):
                    variant = (_DEEP_VARIANT if selection.deep_pass else GAP_ARM) if name == FULL_ARM else name
                    states = engine.states.get(RunKey(mode, protocol, variant), [])
                    row["suppression_state"] = {
                        "k_per_state": sorted({s.k for s in states}),
                        "burn_in_steps": sum(s.steps for s in states),
                        "all_bootstrapped": all(s.bootstrapped for s in states),
                        "suppressed_scores_mean": float(np.mean([s.suppressed for s in states])) if states else 0.0,
                        "entries_touched_fraction": float(np.mean([s.entries_touched / max(1, s.tenant_entries)
                                                                   for s in states])) if states else 0.0,
                    }
                runs.append(row)
    test_split = []
    if FULL_ARM in options.arms:
        for mode in options.modes:
            for protocol in options.protocols:
                full, gap = metrics.get((mode, protocol, FULL_ARM)), metrics.get((mode, protocol, GAP_ARM))
                if full is None or gap is None:
                    continue
                keys = [k for k in full if not by_key[k].dev and overall_question(by_key[k].category)]
                cmp = compare_paired([full[k].ndcg10 for k in keys], [gap[k].ndcg10 for k in keys],
                                     n_resamples=options.n_resamples, seed=options.seed)
                test_split.append({"corpus": mode.value, "protocol": protocol.value, "n": cmp.n, "delta": cmp.delta,
                                   "ci95": list(cmp.delta_ci95), "p": cmp.p_value})
    ablation = _without_suppression(engine, options, selection, baseline, base_metrics, metrics, by_key)
    engine.seconds["statistics"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    variant_blocks = _run_variants(variants, make_engine, engine, metrics, selection, baseline, options)
    engine.seconds["variants"] = time.perf_counter() - t0

    labelled = [q for q in questions if q.labelled]
    document: dict[str, Any] = {
        "dataset": {
            **dataset,
            "conversations": len(conversations),
            "turns": sum(len(c.turns) for c in conversations),
            "questions": len(questions),
            "labelled": len(labelled),
            "overall_questions": sum(1 for q in labelled if overall_question(q.category)),
            "limit": options.limit,
        },
        "command": command,
        "reranker": dict(reranker_info or {}),
        "encoder": {"dim": encoder.dim, "identity": getattr(encoder, "model_key", type(encoder).__name__)},
        "settings": {
            **{k: v for k, v in asdict(options).items() if k not in ("arms", "modes", "protocols")},
            "arms": list(options.arms),
            "corpus_modes": [m.value for m in options.modes],
            "protocols": [p.value for p in options.protocols],
            "alpha": arm_by_name(GAP_ARM).config.alpha,
            "eta": arm_by_name(GAP_ARM).config.eta,
            "suppression_threshold": arm_by_name(GAP_ARM).config.suppression_threshold,
            "pool_size": arm_by_name(GAP_ARM).config.pool_size,
            "n_candidates": arm_by_name(GAP_ARM).config.n_candidates,
            "k_rule": f"min({options.clusters}, max(2, distinct burn-in questions // {options.queries_per_cluster})); "
                      f"global = 1; bootstrap after {options.bootstrap_factor} x K burn-in draws "
                      "(Clustered Retrieval-Induced Forgetting: K = 30 at 500 queries)",
            "heldout_split": "per conversation, seeded shuffle into halves A/B; burn-in on A evaluates B and vice versa",
            "dev_split": "per conversation, an independent seeded half; used only to select mnemos_full",
        },
        "mnemos_full": {**_selection_json(selection), "test_split": test_split, "without_suppression": ablation}
        if FULL_ARM in options.arms else None,
        "cost": _cost(rerankers, engine, time.perf_counter() - started),
        "runs": runs,
        "variants": variant_blocks,
        "suppression_study": study,
    }
    per_question = {
        f"{m.value}/{p.value}/{a}": {k: [v.ndcg10, v.recall10, v.recall30] for k, v in values.items()}
        for (m, p, a), values in metrics.items()
    }
    return QualityReport(document=document, markdown=render_markdown(document, header=_header), per_question=per_question)
