"""Variants of the product measured beside the main run: ablations and other rerankers.

A variant changes one thing (how turns are rendered, the dedupe guard, the rerankers, or whether
suppression runs) and re-runs the arms that tell its effect, on the same questions and under the
held-out protocol, with ``mnemos_full``'s selection taken as it is from the main run (a variant
never re-selects features). Each variant gets its own :class:`~bench.quality.engine.Engine` built by the
caller's factory, so embeddings and reranker scores come from the same disk caches as the main
run and the main run's engine is left untouched.

Reported per corpus mode: ``hybrid_rrf`` (first stage), ``hybrid_rerank`` and ``mnemos_full``
(only when the main run ran it, since its features come from the main run's selection)
NDCG@10 with 95% bootstrap CIs, and each one's paired difference from the main run's same arm
(CI and permutation p). A reranker variant also reports the cross-encoder's own time on real
pools, measured in this process (:func:`time_reranker`), so quality and speed are read together.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common.corpora import CorpusMode
from bench.common.questions import overall_question
from bench.common.stats import bootstrap_ci, compare_paired
from bench.quality.arms import BASELINE_ARM, arm_by_name
from bench.quality.engine import Engine, Protocol, QuestionMetrics
from bench.quality.selection import Selection
from mnemos.fusion import Fusion
from mnemos.rerank import Reranker

__all__ = ["Variant", "parse_reranker_spec", "reranker_details", "run_variant", "time_reranker"]

FIRST_STAGE_ARM = "hybrid_rrf"
FULL_ARM = "mnemos_full"
_GAP_ARM = "+clustered_rif_gap"
_DEEP_VARIANT = "+clustered_rif_gap+deep_pass"


@dataclass(frozen=True)
class Variant:
    """One variant: a name, what it changes (for the report) and how to build its engine.

    ``engine_changes`` are keyword arguments the caller's engine factory applies (for example
    ``{"rendering": Rendering.TEXT}`` or ``{"dedupe_guard": False}``); ``rerankers`` replaces the
    main run's folds (None keeps them); ``suppression`` False evaluates ``mnemos_full``'s features
    on ``hybrid_rerank`` pools (suppression off); ``timing`` names the reranker to time per pool;
    ``reranker`` describes a reranker variant for the sweep table (``layers``, ``max_length``,
    ``epochs``, ``max_pairs`` of its first fold's provenance); ``fusion`` makes every reranking arm
    fuse its first stage that way (:attr:`bench.quality.engine.Engine.reranked_fusion`), convex
    fusion at the weight the main run chose for ``hybrid_convex`` on the dev split.
    """

    name: str
    description: str
    engine_changes: Mapping[str, Any]
    rerankers: Any = None
    suppression: bool = True
    timing: Callable[[], Reranker] | None = None
    reranker: Mapping[str, Any] | None = None
    fusion: Fusion | None = None


def time_reranker(reranker: Reranker, pools: Sequence[tuple[str, Sequence[str]]], *, warmup: int = 3
                  ) -> dict[str, float]:
    """Seconds the cross-encoder alone takes per pool: ``{"p50_ms", "p95_ms", "pools"}``.

    ``pools`` are ``(query, rendered texts)`` of real retrievals (the main run's reranked pools);
    the first ``warmup`` are scored once untimed. Measured with ``time.perf_counter`` in this
    process, so compare variants timed in the same run only.
    """
    for query, texts in pools[:warmup]:
        reranker.score(query, list(texts))
    seconds = []
    for query, texts in pools:
        started = time.perf_counter()
        reranker.score(query, list(texts))
        seconds.append(time.perf_counter() - started)
    ordered = sorted(seconds)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))] if ordered else 0.0
    return {"p50_ms": 1000 * statistics.median(seconds) if seconds else 0.0, "p95_ms": 1000 * p95,
            "pools": len(seconds)}


def _metrics(engine: Engine, mode: CorpusMode, arm: str, selection: Selection, suppression: bool,
             abstain: float) -> dict[str, QuestionMetrics]:
    if arm == FIRST_STAGE_ARM:
        return engine.evaluate(mode, engine.run_plain(mode, arm_by_name(arm)), reranked=False,
                               abstain_threshold=abstain)
    if arm == BASELINE_ARM or not (suppression and selection.suppression):
        results = engine.run_plain(mode, arm_by_name(BASELINE_ARM))
    else:
        base = arm_by_name(FULL_ARM, deep_pass=selection.deep_pass)
        results = engine.run_suppressed(mode, Protocol.HELDOUT, base,
                                        _DEEP_VARIANT if selection.deep_pass else _GAP_ARM)
    settings = selection.settings if arm == FULL_ARM else ()
    return engine.evaluate(mode, results, reranked=True, settings=settings, abstain_threshold=abstain)


def run_variant(
    variant: Variant,
    engine: Engine,
    main: Mapping[tuple[CorpusMode, str], Mapping[str, QuestionMetrics]],
    selection: Selection,
    *,
    abstain_threshold: float,
    n_resamples: int,
    seed: int,
    timing_pools: Sequence[tuple[str, Sequence[str]]] = (),
    modes: Sequence[CorpusMode] | None = None,
) -> dict[str, Any]:
    """Measure ``variant`` on ``engine`` (its own) against the main run's per-question ``main``
    metrics keyed by ``(corpus mode, arm)``, in ``modes`` (default: all of the engine's); returns
    the JSON block of the variant.

    Raises:
        KeyError: if ``main`` lacks an arm this variant is compared on.
    """
    block: dict[str, Any] = {"name": variant.name, "description": variant.description, "modes": {}}
    if variant.reranker is not None:
        block["reranker"] = dict(variant.reranker)
    for mode in modes or engine.modes:
        arms: dict[str, Any] = {}
        for arm in (FIRST_STAGE_ARM, BASELINE_ARM, FULL_ARM):
            if arm != FIRST_STAGE_ARM and engine.rerankers is None:
                continue
            if arm == FULL_ARM and (mode, FULL_ARM) not in main:
                continue  # the main run selected no mnemos_full: its "features" would be none
            metrics = _metrics(engine, mode, arm, selection, variant.suppression, abstain_threshold)
            keys = [k for k in metrics if overall_question(engine.question(k).category)]
            values = [metrics[k].ndcg10 for k in keys]
            entry: dict[str, Any] = {
                "n": len(keys),
                "ndcg@10": sum(values) / len(values) if values else None,
                "ndcg@10_ci95": list(bootstrap_ci(values, n_resamples=n_resamples, seed=seed)) if values else None,
                "recall@10": sum(metrics[k].recall10 for k in keys) / len(keys) if keys else None,
                "session_hit@1": sum(metrics[k].session_hit1 for k in keys) / len(keys) if keys else None,
            }
            reference = main.get((mode, arm))
            if reference is not None and keys:
                shared = [k for k in keys if k in reference]
                cmp = compare_paired([metrics[k].ndcg10 for k in shared], [reference[k].ndcg10 for k in shared],
                                     n_resamples=n_resamples, seed=seed)
                entry["vs_main"] = {"n": cmp.n, "delta": cmp.delta, "ci95": list(cmp.delta_ci95), "p": cmp.p_value}
            arms[arm] = entry
        block["modes"][mode.value] = arms
    if variant.timing is not None and timing_pools:
        block["rerank_time"] = time_reranker(variant.timing(), timing_pools)
    return block


def reranker_details(router, max_length: int, precision: str = "auto") -> dict | None:
    """``{"layers", "max_length", "precision", "epochs", "max_pairs", "learning_rate"}`` of a fold
    router's first fold (None for none); ``precision`` is the resolved format the cross-encoder
    computes in; ``learning_rate`` is None when the provenance does not record it."""
    from mnemos.precision import resolve_precision

    if router is None:
        return None
    provenance = router.folds[0].provenance
    train_config = provenance.get("train_config") or {}
    return {"layers": provenance.get("layers", 6), "max_length": max_length,
            "precision": resolve_precision(precision, "cpu").value, "epochs": provenance.get("epochs"),
            "max_pairs": provenance.get("max_pairs"), "learning_rate": train_config.get("learning_rate")}


def parse_reranker_spec(spec: str, *, max_length: int, precision: str) -> tuple[str, list[str], int, str]:
    """``NAME=DIR[,DIR...][@MAX_LENGTH][:PRECISION]`` as ``(name, dirs, max_length, precision)``;
    an absent part takes the main run's value. A ``:`` followed by text without ``/`` or ``,``
    names a precision (so a directory name cannot end in such a suffix).

    Raises:
        ValueError: for a spec without ``NAME=DIR``, a max length that is not an integer, or an
            unknown precision.
    """
    from mnemos.rerank import RerankPrecision

    known = [p.value for p in RerankPrecision]
    label, sep, rest = spec.partition("=")
    if not sep or not rest or not label:
        raise ValueError(f"expected NAME=DIR[,DIR...][@MAX_LENGTH][:PRECISION], got {spec!r}")
    head, colon, tail = rest.rpartition(":")
    if colon and not any(c in tail for c in "/,"):
        if tail not in known:
            raise ValueError(f"unknown precision {tail!r} in {spec!r}; known: {', '.join(known)}")
        rest, precision = head, tail
    dirs, _, length = rest.partition("@")
    try:
        length_value = int(length) if length else max_length
    except ValueError as exc:
        raise ValueError(f"max length {length!r} of {spec!r} is not an integer") from exc
    return label, [d for d in dirs.split(",") if d], length_value, precision
