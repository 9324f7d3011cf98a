"""Why clustered suppression can cost NDCG, and the evidence threshold that stops it.

``mnemos bench suppression`` runs, on the **dev split only** (held-out protocol, categories 1-4),
``hybrid_rerank`` and ``+clustered_rif_gap`` under a grid of (alpha, evidence threshold tau)
settings (:attr:`mnemos.pipeline.RetrievalConfig.suppression_threshold`), and breaks the effect of
the current default down:

* per LoCoMo category: mean NDCG@10 change against ``hybrid_rerank``;
* per question: whether suppression **evicted** a relevant turn from the reranked pool (it was in
  the ``hybrid_rerank`` pool and is not in the suppressed one) or **admitted** one (the reverse).
  Suppression acts only through the pool cut (the cross-encoder rescores whatever enters), so
  these two counts are the whole mechanism by which it can help or hurt.

The test split is never read, so a default chosen from this table can be reported on the test
split by ``mnemos bench quality`` without bias (docs/architecture.md "Suppression", evidence
threshold").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.questions import overall_question
from bench.common.stats import compare_paired
from bench.quality.arms import BASELINE_ARM, GAP_ARM, Arm, arm_by_name
from bench.quality.engine import Engine, PoolResult, Protocol

__all__ = ["DEFAULT_STUDY_GRID", "study_markdown", "suppression_study"]

DEFAULT_STUDY_GRID: tuple[tuple[float, float], ...] = ((0.3, 0.0), (0.3, 0.5), (0.3, 1.5), (0.1, 0.0))
"""(alpha, tau) settings tried; (0.3, 0) is the paper's rule. With burn-in draws repeating a question,
one question's strongest demotion adds about 0.5 to a score, so tau 0.5 asks for more than one
question's worth of evidence and 1.5 for about three; alpha 0.1 is the plain alternative of a weaker
penalty."""


def _arm(alpha: float, tau: float) -> Arm:
    base = arm_by_name(GAP_ARM)
    if (alpha, tau) == (base.config.alpha, base.config.suppression_threshold):
        return base  # the run the quality bench makes anyway (same cache entry)
    config = dataclasses.replace(base.config, alpha=alpha, suppression_threshold=tau)
    return Arm(f"{GAP_ARM}[alpha={alpha:g},tau={tau:g}]", config, base.suppression)


def _relevant_in_pool(engine: Engine, mode: CorpusMode, key: str, pool: PoolResult, depth: int) -> set[int]:
    question = engine.question(key)
    relevant = engine.tenant_of(mode, question).relevant_entries(question.relevant_turns)
    return set(pool.entry_ids[:depth]) & set(relevant)


def suppression_study(
    engine: Engine,
    modes: Sequence[CorpusMode],
    grid: Sequence[tuple[float, float]] = DEFAULT_STUDY_GRID,
    *,
    pool_depth: int = 30,
    n_resamples: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """The grid and the breakdowns on the dev questions (module docstring).

    Returns a JSON-ready dict: ``grid`` (one row per (alpha, tau) per mode: NDCG@10 of the arm and
    of ``hybrid_rerank``, delta with 95% CI and p, evicted / admitted counts) and ``categories``
    (per mode, per category delta of each setting). ``pool_depth`` is the reranked pool size P.

    Raises:
        ValueError: if the engine has no rerankers.
    """
    if engine.rerankers is None:
        raise ValueError("the suppression study needs reranker folds")
    rows: list[dict[str, Any]] = []
    categories: dict[str, dict[str, dict[str, float]]] = {}
    for mode in modes:
        baseline = engine.run_plain(mode, arm_by_name(BASELINE_ARM))
        dev = [k for k in baseline if engine.question(k).dev and engine.question(k).labelled
               and overall_question(engine.question(k).category)]
        base_metrics = engine.evaluate(mode, baseline, reranked=True, keys=dev)
        keys = [k for k in dev if k in base_metrics]
        for alpha, tau in grid:
            arm = _arm(alpha, tau)
            runs = engine.run_suppressed(mode, Protocol.HELDOUT, arm, variant=arm.name)
            metrics = engine.evaluate(mode, runs, reranked=True, keys=keys)
            new = np.array([metrics[k].ndcg10 for k in keys])
            old = np.array([base_metrics[k].ndcg10 for k in keys])
            cmp = compare_paired(new, old, n_resamples=n_resamples, seed=seed)
            evicted = admitted = 0
            by_cat: dict[str, list[float]] = {}
            for k, a, b in zip(keys, new, old, strict=True):
                before = _relevant_in_pool(engine, mode, k, baseline[k], pool_depth)
                after = _relevant_in_pool(engine, mode, k, runs[k], pool_depth)
                evicted += bool(before - after)
                admitted += bool(after - before)
                by_cat.setdefault(str(engine.question(k).category), []).append(float(a - b))
            rows.append({
                "mode": mode.value, "alpha": alpha, "tau": tau, "n": cmp.n,
                "ndcg@10": float(new.mean()), "hybrid_rerank": float(old.mean()), "delta": cmp.delta,
                "ci95": list(cmp.delta_ci95), "p": cmp.p_value,
                "questions_evicted": evicted, "questions_admitted": admitted,
            })
            categories.setdefault(f"{mode.value} alpha={alpha:g} tau={tau:g}", {}).update(
                {c: {"delta": float(np.mean(v)), "n": len(v)} for c, v in sorted(by_cat.items())})
    return {"split": "dev (held-out protocol, categories 1-4)", "pool_depth": pool_depth,
            "grid": rows, "categories": categories}


def study_markdown(study: Mapping[str, Any]) -> list[str]:
    """The study as Markdown lines: the grid table, then per-category deltas."""
    lines = [f"Suppression study on the {study['split']}; Δ against hybrid_rerank, 95% CI and paired p. "
             "'evicted': questions whose reranked pool lost a relevant turn to suppression; "
             "'admitted': questions whose pool gained one.", "",
             "| mode | alpha | tau | NDCG@10 | hybrid_rerank | Δ [95% CI] | p | evicted | admitted |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in study["grid"]:
        lines.append(f"| {r['mode']} | {r['alpha']:g} | {r['tau']:g} | {r['ndcg@10']:.4f} | {r['hybrid_rerank']:.4f} "
                     f"| {r['delta']:+.4f} [{r['ci95'][0]:+.4f}, {r['ci95'][1]:+.4f}] | {r['p']:.3f} "
                     f"| {r['questions_evicted']} | {r['questions_admitted']} |")
    lines += ["", "Per category (Δ NDCG@10, n):", ""]
    for setting, cats in study["categories"].items():
        cells = ", ".join(f"cat {c}: {v['delta']:+.4f} (n={v['n']})" for c, v in cats.items())
        lines.append(f"- {setting}: {cells}")
    return lines
