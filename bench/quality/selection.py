"""Choosing ``mnemos_full``: forward selection of candidate features on a development split.

Start from ``+clustered_rif_gap`` (the best arm of *Clustered Retrieval-Induced Forgetting*) under the held-out protocol.
Candidates, in order: the adaptive deep pass (docs/architecture.md "Retrieval"), then the
post-rerank features of :mod:`bench.quality.arms` (session-then-turn, temporal match, importance; from
*AssoMem*, docs/architecture.md "Features"), then first-stage evidence (the fused rank, then the BM25
rank, then the BM25 score; docs/reranker.md). For each post-rerank family the best
grid setting is picked by mean NDCG@10 gain over corpus modes on the development questions
(categories 1-4); a candidate is kept only if its NDCG@10 gain is positive in every corpus mode
and significant (two-sided paired permutation p < ``alpha``) in at least one. Kept candidates
accumulate. Last, the starting point itself is put to the same test: the kept features on the
``hybrid_rerank`` pools (suppression off) against the current configuration; suppression is
dropped from ``mnemos_full`` only when that wins by the same rule (it is only tried when the
deep pass was not kept, because the deep pass is measured on suppressed pools). The rest of the questions (the test split) never influence the choice, so
``bench.quality.run`` can report ``mnemos_full`` against ``+clustered_rif_gap`` on them alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.common.corpora import CorpusMode
from bench.common.questions import overall_question
from bench.common.stats import DEFAULT_RESAMPLES, compare_paired
from bench.quality.engine import Engine, PoolResult
from mnemos.features import Feature, FeatureSetting

__all__ = ["DEFAULT_GRID", "SUPPRESSION_OFF", "CandidateOutcome", "Selection", "select_full"]

DEFAULT_GRID: dict[Feature, tuple[dict[str, float], ...]] = {
    Feature.SESSION: tuple({"top": t, "weight": w} for t in (1, 3) for w in (0.5, 1.0, 2.0)),
    Feature.TEMPORAL: tuple({"slack_days": s, "weight": w} for s in (7, 31) for w in (0.5, 1.0, 2.0)),
    Feature.IMPORTANCE: tuple({"weight": w} for w in (0.25, 0.5, 1.0)),
    Feature.FIRST_STAGE: tuple({"weight": w} for w in (0.5, 1.0, 2.0, 4.0)),
    Feature.BM25: tuple({"weight": w} for w in (0.5, 1.0, 2.0, 4.0)),
    Feature.BM25_SCORE: tuple({"weight": w} for w in (0.5, 1.0, 2.0, 4.0)),
}
"""Settings tried per feature; weights are in rerank-logit units."""

SUPPRESSION_OFF = "suppression_off(hybrid_rerank pools)"
"""The last candidate: the kept features without clustered RIF suppression."""

SELECTION_RULE = (
    "forward selection on the dev split (held-out protocol, categories 1-4): keep a candidate when its "
    "NDCG@10 gain over the current configuration is > 0 in every corpus mode and paired permutation "
    "p < {alpha} in at least one"
)


@dataclass(frozen=True)
class CandidateOutcome:
    """One selection step: the candidate, its best setting's per-mode result and the decision.

    ``per_mode`` maps a corpus mode to ``{"base", "new", "delta", "delta_ci95", "p", "n"}`` on
    the dev questions; ``grid`` lists every setting tried with its mean gain over modes.
    """

    candidate: str
    kept: bool
    per_mode: Mapping[str, Mapping[str, object]]
    grid: tuple[Mapping[str, object], ...] = ()


@dataclass(frozen=True)
class Selection:
    """The outcome: whether the deep pass and suppression are on, the post-rerank settings, every step."""

    deep_pass: bool
    settings: tuple[FeatureSetting, ...]
    steps: tuple[CandidateOutcome, ...]
    dev_questions: int
    rule: str
    labels: tuple[str, ...] = field(default=())
    suppression: bool = True


def _ndcg(engine: Engine, mode: CorpusMode, results: Mapping[str, PoolResult], keys: Sequence[str],
          settings: Sequence[FeatureSetting]) -> np.ndarray:
    metrics = engine.evaluate(mode, results, reranked=True, settings=settings, keys=keys)
    return np.asarray([metrics[k].ndcg10 for k in keys], dtype=np.float64)


def _decide(new: Mapping[CorpusMode, np.ndarray], base: Mapping[CorpusMode, np.ndarray], alpha: float,
            n_resamples: int, seed: int) -> tuple[bool, dict[str, dict[str, object]]]:
    per_mode: dict[str, dict[str, object]] = {}
    positive, significant = True, False
    for mode in base:
        comparison = compare_paired(new[mode], base[mode], n_resamples=n_resamples, seed=seed)
        per_mode[mode.value] = {
            "base": float(base[mode].mean()) if base[mode].size else float("nan"),
            "new": float(new[mode].mean()) if new[mode].size else float("nan"),
            "delta": comparison.delta,
            "delta_ci95": list(comparison.delta_ci95),
            "p": comparison.p_value,
            "n": comparison.n,
        }
        positive = positive and comparison.delta > 0
        significant = significant or comparison.p_value < alpha
    return positive and significant, per_mode


def select_full(
    engine: Engine,
    shallow: Mapping[CorpusMode, Mapping[str, PoolResult]],
    deep: Mapping[CorpusMode, Mapping[str, PoolResult]] | None,
    plain: Mapping[CorpusMode, Mapping[str, PoolResult]] | None = None,
    *,
    grid: Mapping[Feature, Sequence[Mapping[str, float]]] = DEFAULT_GRID,
    alpha: float = 0.05,
    n_resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
) -> Selection:
    """Run the forward selection (module docstring) on held-out results of every corpus mode.

    Args:
        engine: the engine that produced the results (questions, tenants, vectors).
        shallow: held-out ``+clustered_rif_gap`` results per corpus mode.
        deep: held-out results of the same arm with the deep pass, or None to skip that candidate.
        plain: ``hybrid_rerank`` results per corpus mode (no suppression), or None to keep
            suppression without testing it.
    """
    keys = [q.key for q in engine.questions if q.dev and q.labelled and overall_question(q.category)]
    modes = list(shallow)
    current = dict(shallow)
    settings: list[FeatureSetting] = []
    steps: list[CandidateOutcome] = []
    deep_on = False
    base = {m: _ndcg(engine, m, current[m], keys, settings) for m in modes}
    if deep is not None:
        new = {m: _ndcg(engine, m, deep[m], keys, settings) for m in modes}
        kept, per_mode = _decide(new, base, alpha, n_resamples, seed)
        for m in modes:
            per_mode[m.value]["deep_pass_rate"] = float(np.mean([deep[m][k].deep_pass for k in keys])) if keys else 0.0
        steps.append(CandidateOutcome("deep_pass(pool=30->100,threshold=calibrated)", kept, per_mode))
        if kept:
            deep_on, current, base = True, dict(deep), new
    for feature, options in grid.items():
        tried = []
        best: tuple[float, FeatureSetting, dict[CorpusMode, np.ndarray]] | None = None
        for params in options:
            setting = FeatureSetting(feature, dict(params))
            new = {m: _ndcg(engine, m, current[m], keys, [*settings, setting]) for m in modes}
            gain = float(np.mean([new[m].mean() - base[m].mean() for m in modes])) if keys else 0.0
            tried.append({"setting": setting.label(), "mean_delta": gain})
            if best is None or gain > best[0]:
                best = (gain, setting, new)
        if best is None:
            continue
        kept, per_mode = _decide(best[2], base, alpha, n_resamples, seed)
        steps.append(CandidateOutcome(best[1].label(), kept, per_mode, tuple(tried)))
        if kept:
            settings.append(best[1])
            base = best[2]
    suppression_on = True
    if plain is not None and not deep_on:
        new = {m: _ndcg(engine, m, plain[m], keys, settings) for m in modes}
        kept, per_mode = _decide(new, base, alpha, n_resamples, seed)
        steps.append(CandidateOutcome(SUPPRESSION_OFF, kept, per_mode))
        suppression_on = not kept
    labels = (("deep_pass",) if deep_on else ()) + (() if suppression_on else (SUPPRESSION_OFF,)) \
        + tuple(s.label() for s in settings)
    return Selection(
        deep_pass=deep_on, settings=tuple(settings), steps=tuple(steps), dev_questions=len(keys),
        rule=SELECTION_RULE.format(alpha=alpha), labels=labels, suppression=suppression_on,
    )
