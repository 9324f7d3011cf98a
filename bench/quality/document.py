"""The JSON document of a quality run: run rows, the ``mnemos_full`` block, settings and cost.

:func:`bench.quality.run.run_quality` retrieves and evaluates; the functions here turn its per-question
metrics into the document's parts (CIs and p-values come from :mod:`bench.quality.report` and
:mod:`bench.common.stats`). The Markdown report is rendered from the finished document
(:mod:`bench.quality.markdown`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.datasets import Conversation
from bench.common.questions import overall_question
from bench.common.stats import bootstrap_ci, compare_paired
from bench.quality.arms import BASELINE_ARM, FULL_ARM, GAP_ARM, arm_by_name
from bench.quality.engine import (
    BenchQuestion,
    Engine,
    FoldRerankers,
    PoolResult,
    Protocol,
    QuestionMetrics,
    RunKey,
)
from bench.quality.report import run_row
from bench.quality.selection import Selection
from mnemos.features import FeatureSetting

if TYPE_CHECKING:
    from bench.quality.options import QualityOptions

__all__ = [
    "DEEP_VARIANT",
    "SERVICE_DEFAULTS",
    "MetricsByRun",
    "ablation_without_suppression",
    "corpus_json",
    "cost_json",
    "dataset_json",
    "no_evidence_json",
    "run_rows",
    "selection_json",
    "service_defaults_json",
    "settings_json",
    "full_vs_gap_on_test_split",
]

SERVICE_DEFAULTS = "service_defaults"
"""The per-question key of the service's default features (:func:`service_defaults_json`)."""

DEEP_VARIANT = "+clustered_rif_gap+deep_pass"
"""The state key of ``mnemos_full`` runs with the adaptive deep pass."""

MetricsByRun = Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, QuestionMetrics]]
"""Per-question metrics of each (corpus mode, protocol, arm) run, keyed by question key."""


def corpus_json(engine: Engine) -> dict[str, Any]:
    """Per corpus mode: tenants, indexed entries, dedupe aliases and the turns a pooled corpus held
    once for several conversations (:func:`bench.common.corpora.build_tenants`)."""
    return {
        mode.value: {
            "tenants": len(tenants),
            "entries": sum(len(t.index) for t in tenants.values()),
            "aliases": sum(t.n_aliases for t in tenants.values()),
            "repeats": sum(t.n_repeats for t in tenants.values()),
        }
        for mode, tenants in engine.tenants.items()
    }


def no_evidence_json(runs: Sequence[dict[str, Any]],
                     results: Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, PoolResult]],
                     by_key: Mapping[str, BenchQuestion], abstain_threshold: float) -> None:
    """Add to each run row of a reranking arm a ``no_evidence`` block over the category-5 questions
    (whose answer is not in memory) without an evidence turn, which NDCG cannot score (LongMemEval's
    abstention questions without ``has_answer``): their number and ``abstain@T``, the share whose
    best cross-encoder logit is below ``T`` or whose pool is empty (*Clustered Retrieval-Induced
    Forgetting* §5.3). Rows of other arms, and runs without such questions, are left alone (a LoCoMo
    question whose evidence ids are unusable has an answer: abstaining on it is no success)."""
    label = f"abstain@{abstain_threshold:g}"
    for row in runs:
        pools = results.get((CorpusMode(row["corpus"]), Protocol(row["protocol"]), row["arm"]))
        if pools is None or not arm_by_name(row["arm"]).reranks:
            continue
        keys = [k for k in pools if not by_key[k].labelled and by_key[k].category == 5]
        if not keys:
            continue
        abstained = [pools[k].top_score is None or pools[k].top_score < abstain_threshold for k in keys]
        row["no_evidence"] = {"n_questions": len(keys), label: float(np.mean(abstained))}


def selection_json(selection: Selection) -> dict[str, Any]:
    """The ``mnemos_full`` selection: kept features, deep pass, suppression, rule and each step."""
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


def cost_json(rerankers: FoldRerankers | None, engine: Engine, seconds: float) -> dict[str, Any]:
    """Seconds (total and per stage), reranker pairs (scored by the model, read from the disk
    cache), embeddings computed and retrievals run."""
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


def dataset_json(dataset: Mapping[str, Any], conversations: Sequence[Conversation],
                 questions: Sequence[BenchQuestion], limit: int | None) -> dict[str, Any]:
    """The caller's dataset description with the counts of what was run."""
    labelled = [q for q in questions if q.labelled]
    return {
        **dataset,
        "conversations": len(conversations),
        "turns": sum(len(c.turns) for c in conversations),
        "questions": len(questions),
        "labelled": len(labelled),
        "overall_questions": sum(1 for q in labelled if overall_question(q.category)),
        "category_names": {str(c): n for c, n in sorted({(q.category, q.category_name) for q in questions
                                                          if q.category is not None and q.category_name})},
        "limit": limit,
    }


def settings_json(options: QualityOptions) -> dict[str, Any]:
    """The options, the suppression settings of the arms and the rules of K and of the splits."""
    gap_arm = arm_by_name(GAP_ARM)
    gap = gap_arm.config
    assert gap_arm.suppression is not None
    return {
        **{k: v for k, v in asdict(options).items() if k not in ("arms", "modes", "protocols")},
        "arms": list(options.arms),
        "corpus_modes": [m.value for m in options.modes],
        "protocols": [p.value for p in options.protocols],
        "alpha": gap.alpha,
        "eta": gap_arm.suppression.eta,
        "suppression_threshold": gap.suppression_threshold,
        "pool_size": gap.pool_size,
        "n_candidates": gap.n_candidates,
        "k_rule": f"min({options.clusters}, max(2, distinct burn-in questions // {options.queries_per_cluster})); "
                  f"global = 1; bootstrap after {options.bootstrap_factor} x K burn-in draws "
                  "(Clustered Retrieval-Induced Forgetting: K = 30 at 500 queries)",
        "heldout_split": "per conversation (over the whole dataset when each conversation holds one question, "
                         "as LongMemEval), seeded shuffle into halves A/B; burn-in on A evaluates B and vice versa",
        "dev_split": "drawn like the halves, an independent seeded half; used only to select mnemos_full",
    }


def run_rows(engine: Engine, options: QualityOptions, selection: Selection, metrics: MetricsByRun,
             base_metrics: Mapping[CorpusMode, Mapping[str, QuestionMetrics]],
             by_key: Mapping[str, BenchQuestion]) -> list[dict[str, Any]]:
    """One row per (corpus mode, protocol, arm) in option order (:func:`bench.quality.report.run_row`);
    a stateless arm's row is computed once and repeated for each protocol. Suppression arms add
    the state their burn-ins built (``suppression_state``)."""
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
                    variant = (DEEP_VARIANT if selection.deep_pass else GAP_ARM) if name == FULL_ARM else name
                    row["suppression_state"] = _state_json(engine, RunKey(mode, protocol, variant))
                runs.append(row)
    return runs


def _state_json(engine: Engine, key: RunKey) -> dict[str, Any]:
    """Summary of the suppression states of one run: K, burn-in steps, bootstrap, saturation."""
    states = engine.states.get(key, [])
    return {
        "k_per_state": sorted({s.k for s in states}),
        "burn_in_steps": sum(s.steps for s in states),
        "all_bootstrapped": all(s.bootstrapped for s in states),
        "suppressed_scores_mean": float(np.mean([s.suppressed for s in states])) if states else 0.0,
        "entries_touched_fraction": float(np.mean([s.entries_touched / max(1, s.tenant_entries)
                                                   for s in states])) if states else 0.0,
    }


def full_vs_gap_on_test_split(options: QualityOptions, metrics: MetricsByRun,
               by_key: Mapping[str, BenchQuestion]) -> list[dict[str, Any]]:
    """``mnemos_full`` against ``+clustered_rif_gap`` on the test split alone (questions that never
    influenced the selection), per corpus mode and protocol: paired delta, CI and p."""
    out = []
    for mode in options.modes:
        for protocol in options.protocols:
            full, gap = metrics.get((mode, protocol, FULL_ARM)), metrics.get((mode, protocol, GAP_ARM))
            if full is None or gap is None:
                continue
            keys = [k for k in full if not by_key[k].dev and overall_question(by_key[k].category)]
            cmp = compare_paired([full[k].ndcg10 for k in keys], [gap[k].ndcg10 for k in keys],
                                 n_resamples=options.n_resamples, seed=options.seed)
            out.append({"corpus": mode.value, "protocol": protocol.value, "n": cmp.n, "delta": cmp.delta,
                        "ci95": list(cmp.delta_ci95), "p": cmp.p_value})
    return out


def ablation_without_suppression(
    engine: Engine,
    options: QualityOptions,
    selection: Selection,
    baseline: Mapping[CorpusMode, Mapping[str, PoolResult]],
    base_metrics: Mapping[CorpusMode, Mapping[str, QuestionMetrics]],
    metrics: MetricsByRun,
    by_key: Mapping[str, BenchQuestion],
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
        others = {BASELINE_ARM: base_metrics[mode]}
        if (mode, Protocol.HELDOUT, FULL_ARM) in metrics:
            others[f"{FULL_ARM} (heldout)"] = metrics[(mode, Protocol.HELDOUT, FULL_ARM)]
        out.append(_features_entry(engine, options, mode, results, selection.settings, others, by_key)[0])
    return out


def service_defaults_json(
    engine: Engine,
    options: QualityOptions,
    results: Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, PoolResult]],
    metrics: MetricsByRun,
    by_key: Mapping[str, BenchQuestion],
    settings: Sequence[FeatureSetting],
) -> tuple[list[dict[str, Any]], dict[tuple[CorpusMode, Protocol, str], dict[str, QuestionMetrics]]]:
    """The service's default post-rerank features (``workers.settings``, passed in as ``settings``)
    on the held-out ``+clustered_rif_gap`` pools: what the service ranks with suppression on, the
    deep pass off and its defaults, whatever the dev-split selection picked for ``mnemos_full``.
    The suppression state is the bench's (its burn-in and K rule), not a service's.

    Compared on the same questions (all of categories 1-4, and the test split alone) with held-out
    ``mnemos_full``, ``+clustered_rif_gap``, ``hybrid_rerank`` and ``bm25`` where they were run;
    one entry per corpus mode, none when ``+clustered_rif_gap`` was not run held out. Returns the
    entries and the per-question metrics, keyed ``(mode, HELDOUT, SERVICE_DEFAULTS)``.
    """
    t0 = time.perf_counter()
    out = []
    per_question = {}
    for mode in options.modes:
        pools = results.get((mode, Protocol.HELDOUT, GAP_ARM))
        if pools is None:
            continue
        others = {f"{name} (heldout)": metrics[(mode, Protocol.HELDOUT, name)]
                  for name in (FULL_ARM, GAP_ARM, BASELINE_ARM, "bm25") if (mode, Protocol.HELDOUT, name) in metrics}
        entry, ranked = _features_entry(engine, options, mode, pools, settings, others, by_key)
        out.append(entry)
        per_question[(mode, Protocol.HELDOUT, SERVICE_DEFAULTS)] = ranked
    engine.seconds["service_defaults"] = time.perf_counter() - t0
    return out, per_question


def _features_entry(engine: Engine, options: QualityOptions, mode: CorpusMode, pools: Mapping[str, PoolResult],
                    settings: Sequence[FeatureSetting], others: Mapping[str, Mapping[str, QuestionMetrics]],
                    by_key: Mapping[str, BenchQuestion]) -> tuple[dict[str, Any], dict[str, QuestionMetrics]]:
    """NDCG@10 and Recall@10 (with CIs) of ``pools`` ranked with ``settings``, and the paired
    NDCG@10 difference with each of ``others`` on every question of categories 1-4 and on the test
    split; with the per-question metrics of ``pools`` so ranked."""
    ranked = engine.evaluate(mode, pools, reranked=True, settings=settings,
                             abstain_threshold=options.abstain_threshold)
    keys = [k for k in ranked if overall_question(by_key[k].category)]
    test = [k for k in keys if not by_key[k].dev]
    values = np.asarray([ranked[k].ndcg10 for k in keys])
    recall = np.asarray([ranked[k].recall10 for k in keys])
    entry: dict[str, Any] = {
        "corpus": mode.value, "features": [s.label() for s in settings], "n": len(keys),
        "ndcg@10": float(values.mean()), "ndcg@10_ci95": list(bootstrap_ci(values, n_resamples=options.n_resamples,
                                                                            seed=options.seed)),
        "recall@10": float(recall.mean()), "recall@10_ci95": list(bootstrap_ci(recall, n_resamples=options.n_resamples,
                                                                               seed=options.seed)),
    }
    for name, other in others.items():
        for split, subset in (("all", keys), ("test_split", test)):
            cmp = compare_paired([ranked[k].ndcg10 for k in subset], [other[k].ndcg10 for k in subset],
                                 n_resamples=options.n_resamples, seed=options.seed)
            entry[f"vs {name} ({split})"] = {"n": cmp.n, "delta_ndcg@10": cmp.delta,
                                             "ci95": list(cmp.delta_ci95), "p": cmp.p_value}
    return entry, ranked
