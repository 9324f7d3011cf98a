"""The ``hybrid_convex`` arm: its fusion weight chosen on the development split, then compared with
``hybrid_rrf`` on the questions that never influenced the choice.

Convex fusion (:func:`mnemos.fusion.convex_fusion`, *An Analysis of Fusion Functions for Hybrid
Retrieval*, Bruch, Gai and Ingber, ACM TOIS 2023) ranks by ``w * bm25 + (1 - w) * dense`` of the
two candidate lists' min-max normalised scores. ``w`` is chosen the way :mod:`bench.quality.selection`
chooses a feature's setting: each weight of the grid is run as a first-stage arm (no rerank, no
suppression) and the one with the best mean NDCG@10 on the dev questions (categories 1-4),
averaged over the corpus modes of the run, is kept (ties: the smaller weight). The test split
(every labelled question of categories 1-4 outside the dev split) then compares ``hybrid_convex``
with ``hybrid_rrf`` in NDCG@10, Recall@10 and Recall@30 (Recall@30 is what a rerank pool of 30 can
hold): both means with 95% bootstrap CIs, the paired difference with its CI and the two-sided
paired permutation p (docs/architecture.md "Evaluation").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.questions import overall_question
from bench.common.stats import DEFAULT_RESAMPLES, bootstrap_ci, compare_paired, format_p
from bench.quality.arms import CONVEX_ARM, Arm, arm_by_name
from bench.quality.engine import BenchQuestion, Engine, Protocol, QuestionMetrics

__all__ = ["CONVEX_GRID", "RRF_ARM", "FusionChoice", "choose_convex_weight", "convex_arm", "fusion_json", "fusion_lines"]

CONVEX_GRID: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)
"""Weights tried (BM25's share of the convex fusion)."""
RRF_ARM = "hybrid_rrf"
"""The arm ``hybrid_convex`` is compared with."""

RULE = ("w in {grid} maximising mean NDCG@10 on the dev split (categories 1-4), averaged over the corpus "
        "modes run (ties: the smaller w); compared with hybrid_rrf on the test split only")


@dataclass(frozen=True)
class FusionChoice:
    """The chosen weight, each grid weight's dev NDCG@10 (per corpus mode and the mean over modes),
    the number of dev questions and the rule."""

    weight: float
    grid: tuple[Mapping[str, Any], ...]
    dev_questions: int
    rule: str

    @property
    def arm(self) -> Arm:
        """``hybrid_convex`` with the chosen weight."""
        return convex_arm(self.weight)


def convex_arm(weight: float) -> Arm:
    """``hybrid_convex`` at ``weight``; its name carries the weight, so each is its own engine run.

    Raises:
        InvalidParameterError: if ``weight`` is not in [0, 1].
    """
    base = arm_by_name(CONVEX_ARM)
    return Arm(f"{CONVEX_ARM}(w={weight:g})", dataclasses.replace(base.config, convex_weight=weight))


def choose_convex_weight(engine: Engine, modes: Sequence[CorpusMode],
                         grid: Sequence[float] = CONVEX_GRID) -> FusionChoice:
    """Run every weight of ``grid`` in every mode of ``modes`` and keep the best on the dev split
    (module docstring). Only dev questions' metrics are read; the runs are cached by the engine.

    Raises:
        ValueError: if ``grid`` or ``modes`` is empty.
    """
    if not grid or not modes:
        raise ValueError("choosing the convex weight needs a grid and at least one corpus mode")
    keys = [q.key for q in engine.questions if q.dev and q.labelled and overall_question(q.category)]
    rows: list[dict[str, Any]] = []
    best: tuple[float, float] | None = None
    for weight in grid:
        arm = convex_arm(weight)
        per_mode = {}
        for mode in modes:
            metrics = engine.evaluate(mode, engine.run_plain(mode, arm), reranked=False, keys=keys)
            per_mode[mode.value] = float(np.mean([m.ndcg10 for m in metrics.values()])) if metrics else 0.0
        mean = float(np.mean(list(per_mode.values())))
        rows.append({"weight": weight, "dev_ndcg@10": per_mode, "mean": mean})
        if best is None or mean > best[1]:
            best = (weight, mean)
    assert best is not None
    return FusionChoice(weight=best[0], grid=tuple(rows), dev_questions=len(keys),
                        rule=RULE.format(grid=", ".join(f"{w:g}" for w in grid)))


_METRICS = (("ndcg@10", "ndcg10"), ("recall@10", "recall10"), ("recall@30", "recall30"))
"""(report name, :class:`~bench.quality.engine.QuestionMetrics` attribute) of the metrics compared."""


def _compare(convex: Mapping[str, QuestionMetrics], rrf: Mapping[str, QuestionMetrics], keys: Sequence[str],
             attr: str, n_resamples: int, seed: int) -> dict[str, Any]:
    """Each arm's mean of ``attr`` over ``keys`` with its bootstrap CI, and the paired comparison."""
    a = np.asarray([getattr(convex[k], attr) for k in keys], dtype=np.float64)
    b = np.asarray([getattr(rrf[k], attr) for k in keys], dtype=np.float64)
    cmp = compare_paired(a, b, n_resamples=n_resamples, seed=seed)
    out: dict[str, Any] = {}
    for arm, values in ((CONVEX_ARM, a), (RRF_ARM, b)):
        out[arm] = {"mean": float(values.mean()) if values.size else None,
                    "ci95": list(bootstrap_ci(values, n_resamples=n_resamples, seed=seed))}
    return {**out, "delta": cmp.delta, "delta_ci95": list(cmp.delta_ci95), "p": cmp.p_value}


def fusion_json(choice: FusionChoice, metrics: Mapping[tuple[CorpusMode, Protocol, str], Mapping[str, QuestionMetrics]],
                by_key: Mapping[str, BenchQuestion], *, n_resamples: int = DEFAULT_RESAMPLES,
                seed: int = 0) -> dict[str, Any]:
    """The document's ``fusion`` block: the choice and, per corpus mode where both arms ran, the
    test-split comparison: ``n`` and, for NDCG@10, Recall@10 and Recall@30, each arm's mean with its
    CI and ``hybrid_convex`` − ``hybrid_rrf`` (delta, CI, p). First-stage arms hold no state, so one
    protocol's metrics serve."""
    comparisons = []
    for mode in dict.fromkeys(m for m, _, _ in metrics):
        pairs = [(metrics.get((mode, p, CONVEX_ARM)), metrics.get((mode, p, RRF_ARM))) for p in Protocol]
        convex, rrf = next(((c, r) for c, r in pairs if c is not None and r is not None), (None, None))
        if convex is None or rrf is None:
            continue
        keys = sorted(k for k in convex if k in rrf and not by_key[k].dev and overall_question(by_key[k].category))
        comparisons.append({"corpus": mode.value, "n": len(keys),
                            **{name: _compare(convex, rrf, keys, attr, n_resamples, seed) for name, attr in _METRICS}})
    return {"arm": CONVEX_ARM, "weight": choice.weight, "rule": choice.rule, "dev_questions": choice.dev_questions,
            "grid": [dict(row) for row in choice.grid], "test_split": comparisons}


def fusion_lines(block: Mapping[str, Any] | None) -> list[str]:
    """Markdown lines of a ``fusion`` block (none without one)."""
    if not block:
        return []
    modes = list(block["grid"][0]["dev_ndcg@10"]) if block["grid"] else []
    lines = ["", f"`{CONVEX_ARM}` = BM25 and dense scores min-max normalised per list, fused as "
                 f"w · bm25 + (1 − w) · dense, w = {block['weight']:g} ({block['rule']}; "
                 f"{block['dev_questions']} dev questions).", "",
             "| w | " + " | ".join(f"dev NDCG@10 {m}" for m in modes) + " | mean |",
             "|---|" + "---|" * (len(modes) + 1)]
    for row in block["grid"]:
        mark = " ←" if row["weight"] == block["weight"] else ""
        lines.append(f"| {row['weight']:g}{mark} | " + " | ".join(f"{row['dev_ndcg@10'][m]:.4f}" for m in modes)
                     + f" | {row['mean']:.4f} |")
    for item in block["test_split"]:
        lines += ["", f"Test split ({item['corpus']}, n={item['n']}, questions never used to choose w), "
                      f"{CONVEX_ARM} against {RRF_ARM}:", "",
                  f"| metric | {CONVEX_ARM} [95% CI] | {RRF_ARM} [95% CI] | Δ [95% CI] | paired permutation p |",
                  "|---|---|---|---|---|"]
        for name, _ in _METRICS:
            m = item[name]
            cells = [f"{m[arm]['mean']:.3f} [{m[arm]['ci95'][0]:.3f}, {m[arm]['ci95'][1]:.3f}]"
                     for arm in (CONVEX_ARM, RRF_ARM)]
            p = format_p(m["p"])
            lines.append(f"| {name} | {' | '.join(cells)} | {m['delta']:+.4f} [{m['delta_ci95'][0]:+.4f}, "
                         f"{m['delta_ci95'][1]:+.4f}] | {p} |")
    return lines
