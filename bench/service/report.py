"""The main job's figures: per-question metrics, bootstrap intervals, the table, the JSON and the PNG.

Headline metrics are means over the evaluated LoCoMo questions of categories 1-4 (as ``mnemos
bench quality`` reports them), each with a 95% percentile bootstrap interval
(:func:`bench.common.stats.bootstrap_ci`, 10,000 resamples, seeded); category 5 (adversarial questions)
is reported apart. Relevance is alias-aware on each side: the service's canonical turns come from
its Postgres rows, the replay's from its own dedupe.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.common.harness import machine, percentile
from bench.common.paths import display_path
from bench.common.plot import plot_ndcg
from bench.common.questions import overall_question
from bench.common.stats import bootstrap_ci
from mnemos.evaluation import ndcg_at_k, recall_at_k, session_metrics
from mnemos.precision import bf16_speedup, resolve_precision
from workers.query.config import feature_settings
from workers.runtime.models import resolve_device

if TYPE_CHECKING:
    from bench.service.mainjob_replay import ReplayRecord
    from bench.service.records import Asked, ServiceRecord
    from workers.settings import Settings

__all__ = ["CATEGORY_NAMES", "MEANINGS", "Report", "build_report", "cache_split", "format_table", "write_outputs"]

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
"""LoCoMo's question categories."""

MEANINGS = {
    "ndcg@10": "ranking of the evidence turns in the top 10 (1 = all at the top, 0 = none in the top 10)",
    "recall@10": "share of a question's evidence turns that are in the top 10",
    "session_hit@1": "the session of the best hit holds evidence (sessions ranked by their best turn)",
    "ingest": "turns per second, first XADD to last commit (validate, embed, dedupe, store)",
    "query": "client wall time of one evaluation question through the rq queue (p50 / p95)",
    "freshness": "a published turn is committed, and so retrievable, this long after its XADD (p50 / p95)",
    "in_process": "the same requests through the core pipeline at the same suppression states",
}
EQUAL_TOLERANCE = 1e-9
"""Two NDCG@10 values closer than this are equal (they are sums of the same few logs)."""


@dataclass
class Report:
    """The JSON payload and the table printed at the end of the run."""

    payload: dict[str, Any]
    table: str


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None or not np.isfinite(value) else round(float(value), digits)


def _mean_ci(values: Sequence[float], seed: int) -> tuple[float | None, list[float | None]]:
    if not values:
        return None, [None, None]
    low, high = bootstrap_ci(np.asarray(values, dtype=np.float64), seed=seed)
    return _round(statistics.fmean(values)), [_round(low), _round(high)]


def question_rows(record: ServiceRecord, replay: ReplayRecord) -> list[dict[str, Any]]:
    """One row per evaluation request: the service's metrics, the replay's, and whether they agree."""
    rows = []
    for asked in (a for a in record.asked if a.phase == "evaluation"):
        question = asked.question
        conversation = next(p.conversation for p in record.plans if p.tenant_id == asked.tenant_id)
        sessions = {t.turn_id: t.session_id for t in conversation.turns}
        local = [t.split("/", 1)[1] for t in question.relevant_turns]
        service_canonical = record.canonical[asked.tenant_id]
        service_relevant = frozenset(service_canonical[t] for t in local if t in service_canonical)
        service_ranked = [h.turn_id for h in asked.result.hits]
        replayed = replay.replayed[asked.result.request_id]
        ours = replay.canonical[asked.tenant_id]
        replay_relevant = frozenset(ours[t] for t in local if t in ours)
        service_ndcg = ndcg_at_k(service_ranked, service_relevant, 10)
        replay_ndcg = None if replayed.error else ndcg_at_k(list(replayed.turn_ids), replay_relevant, 10)
        rows.append({
            "key": question.key, "tenant_id": asked.tenant_id, "category": question.category,
            "ndcg@10": service_ndcg, "recall@10": recall_at_k(service_ranked, service_relevant, 10),
            "session_hit@1": session_metrics(service_ranked, service_relevant, sessions).hit1,
            "in_process_ndcg@10": replay_ndcg,
            "in_process_recall@10": None if replayed.error else recall_at_k(list(replayed.turn_ids),
                                                                              replay_relevant, 10),
            "in_process_session_hit@1": None if replayed.error else session_metrics(
                list(replayed.turn_ids), replay_relevant, sessions).hit1,
            "equal_ndcg@10": replay_ndcg is not None and abs(service_ndcg - replay_ndcg) <= EQUAL_TOLERANCE,
            "equal_ranking": not replayed.error and tuple(service_ranked) == replayed.turn_ids,
            "cluster": asked.result.cluster, "in_process_cluster": replayed.cluster,
            "suppression_version": asked.result.suppression_version, "latency_s": asked.latency_s,
            "error": replayed.error,
        })
    return rows


def _summary(rows: Sequence[dict[str, Any]], prefix: str, seed: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n_questions": len(rows)}
    for metric in ("ndcg@10", "recall@10", "session_hit@1"):
        values = [r[prefix + metric] for r in rows if r[prefix + metric] is not None]
        out[metric], out[f"{metric}_ci95"] = _mean_ci(values, seed)
    return out


def cache_split(asked: Sequence[Asked]) -> dict[str, Any]:
    """Client latency of the questions whose pool the cross-encoder scored (at least one pair
    missed the query worker's score cache: what a new question costs) apart from those answered
    wholly from the cache (the tenant asked the same question before: the score cache is per
    tenant, so only a question text its burn-in also drew), with the cached share. Answers that carry no counts (a worker without a score cache) are in neither."""
    def summary(values: list[float]) -> dict[str, Any]:
        if not values:
            return {"n": 0, "p50_s": None, "p95_s": None}
        return {"n": len(values), "p50_s": _round(percentile(values, 50)), "p95_s": _round(percentile(values, 95))}

    scored = [a.latency_s for a in asked if (a.result.rerank_pairs_scored or 0) > 0]
    cached = [a.latency_s for a in asked if a.result.rerank_pairs_scored == 0]
    known = len(scored) + len(cached)
    return {"pairs_scored": summary(scored), "all_pairs_cached": summary(cached),
            "cached_share": _round(len(cached) / known, 4) if known else None}


def _query_block(record: ServiceRecord) -> dict[str, Any]:
    """The payload's ``query`` block: client latency of the evaluation (all, new, cached) and the
    burn-in, deep passes, and the worker's median seconds per stage."""
    asked = [a for a in record.asked if a.phase == "evaluation"]
    evaluation = [a.latency_s for a in asked]
    burn_in = [a.latency_s for a in record.asked if a.phase == "burn-in"]
    return {"n": len(evaluation), "p50_s": _round(percentile(evaluation, 50)),
            "p95_s": _round(percentile(evaluation, 95)), "burn_in_n": len(burn_in),
            "burn_in_p50_s": _round(percentile(burn_in, 50)),
            **cache_split(asked),
            "deep_passes": sum(a.result.deep_pass for a in record.asked),
            "worker_stage_p50_s": {phase: _stage_p50(record, phase) for phase in ("burn-in", "evaluation")}}


def _stage_p50(record: ServiceRecord, phase: str) -> dict[str, float | None]:
    """Median seconds of each stage the query worker reported, over one phase's requests."""
    stages = [a.result.stage_seconds for a in record.asked if a.phase == phase]
    return {name: _round(percentile([s.get(name, 0.0) for s in stages], 50), 5)
            for name in sorted({k for s in stages for k in s})}


def _outcome_check(record: ServiceRecord, replay: ReplayRecord) -> dict[str, int]:
    """Requests whose replayed outcome pool (turn, initial rank, final rank) equals the service's."""
    equal = compared = 0
    for asked in record.asked:
        outcome = record.outcomes.get(asked.result.request_id)
        replayed = replay.replayed.get(asked.result.request_id)
        if outcome is None or replayed is None or replayed.error:
            continue
        turns = record.entry_turns[asked.tenant_id]
        ours = {(turns[p.entry_id], p.initial_rank, p.final_rank) for p in outcome.pool}
        compared += 1
        equal += ours == set(replayed.pool)
    return {"requests_compared": compared, "equal_outcome_pools": equal}


def _precisions(settings: Settings) -> dict[str, Any]:
    """What ``MNEMOS_ENCODER_PRECISION`` and ``MNEMOS_RERANK_PRECISION`` resolved to, as the workers
    resolve them on this machine, and ``bf16_speedup``: this process's measurement behind ``auto``
    (:func:`mnemos.precision.bf16_speedup`; None on a CPU without native bf16, where nothing is
    measured, or when the measurement failed)."""
    device = resolve_device(settings.device)
    return {"encoder": resolve_precision(settings.encoder_precision, device).value,
            "cross_encoder": resolve_precision(settings.rerank_precision, device).value,
            "bf16_speedup": None if (speedup := bf16_speedup()) is None else round(speedup, 2)}


def build_report(record: ServiceRecord, replay: ReplayRecord, *, data_path: Path, reranker: dict[str, Any],
                 trained: Sequence[str], burnin_factor: float, seed: int, command: str, started: float) -> Report:
    """The payload (see the README's main-job section for the keys) and the printed table."""
    import time

    settings = record.settings
    rows = question_rows(record, replay)
    headline = [r for r in rows if overall_question(r["category"])]
    service = _summary(headline, "", seed)
    in_process = _summary(headline, "in_process_", seed)
    unequal = [r["key"] for r in rows if not r["equal_ndcg@10"]]
    errors = sorted({r["error"] for r in rows if r["error"]})
    pairs = sum(len(o.pool) for o in record.outcomes.values())
    check = replay.logit_check
    phases = dict(record.phases_s)
    payload: dict[str, Any] = {
        "command": command, "machine": machine(),
        "data": {"path": display_path(data_path), "conversations": sorted({p.conversation.conversation_id for p in record.plans}),
                 "excluded_reranker_training_conversations": list(trained)},
        "reranker": reranker,
        "suppression": settings.suppression,
        "features": [{"feature": f.feature.value, **dict(f.params)} for f in feature_settings(settings)],
        "settings": {name: getattr(settings, name) for name in (
            "bi_encoder", "n_candidates", "pool_size", "deep_pool_size", "deep_threshold", "rrf_k", "alpha", "eta",
            "update_rule", "suppression_threshold", "clusters_k", "bootstrap_factor", "dedupe_threshold", "rerank_cache_pairs",
            "rerank_max_length", "device")}, "precision": _precisions(settings),
        "protocol": {
            "heldout": "two tenants per conversation: .a burns in on half A and is evaluated on half B, .b the "
                       "other way round; halves from bench.common.questions.prepare_questions",
            "burnin_factor": burnin_factor, "seed": seed,
            "burn_in": "draws with replacement from the half (seeded as mnemos bench quality's per-tenant held-out "
                       "runs); evaluation starts once the suppression worker applied every burn-in outcome",
            "headline": "LoCoMo categories 1-4; category 5 reported apart"},
        "n_questions": service["n_questions"], "n_questions_evaluated": len(rows),  # category 5 included
        **{key: service[key] for key in service if key != "n_questions"},
        "category_5": _summary([r for r in rows if not overall_question(r["category"])], "", seed),
        "per_category": {str(c): {"name": CATEGORY_NAMES.get(c, str(c)),
                                  "service": _summary([r for r in rows if r["category"] == c], "", seed),
                                  "in_process": _summary([r for r in rows if r["category"] == c], "in_process_", seed)}
                         for c in sorted({r["category"] for r in rows if r["category"] is not None})},
        "in_process": {
            **in_process,
            "rerank_scores": "cross-encoder logits taken from the service's outcomes (every pool entry's logit); "
                             f"{check['pairs']} of {check['pairs_recorded']} pairs, drawn with seed {seed}, were "
                             "scored again by the real model here",
            "recomputed_pairs": check["pairs"],
            "max_abs_logit_difference": _round(check["max_abs_difference"], 6),
            "mean_abs_logit_difference": _round(check["mean_abs_difference"], 6),
            "centroid_max_abs_difference": {t: _round(v, 8) for t, v in replay.centroid_max_abs_difference.items()},
        },
        "per_question_check": {
            "questions": len(rows), "equal_ndcg@10": len(rows) - len(unequal),
            "equal_rankings": sum(r["equal_ranking"] for r in rows),
            "equal_clusters": sum(r["cluster"] == r["in_process_cluster"] for r in rows),
            "max_abs_ndcg@10_difference": _round(max((abs(r["ndcg@10"] - r["in_process_ndcg@10"]) for r in rows
                                                      if r["in_process_ndcg@10"] is not None), default=0.0), 9),
            **_outcome_check(record, replay),
            "unequal_questions": unequal[:50], "errors": errors[:10], "passed": not unequal and not errors,
        },
        "tenants": record.tenants,
        "ingest": {"turns": record.ingest["turns"], "seconds": _round(record.ingest["ingest_seconds"], 2),
                   "turns_per_s": _round(record.ingest["ingest_turns_per_s"], 1)},
        "query": _query_block(record),
        "rerank_cache": {"pairs_in_pools": pairs, "hits": record.rerank_cache_hits,
                         "scored_by_model": None if record.rerank_cache_hits is None
                         else pairs - int(record.rerank_cache_hits)},
        "freshness": {"probes": len(record.freshness_s), "returned": record.freshness_returned,
                      "p50_s": _round(percentile(record.freshness_s, 50)),
                      "p95_s": _round(percentile(record.freshness_s, 95))},
        "phases_s": phases,
        "per_question": [{k: (_round(v, 6) if isinstance(v, float) else v) for k, v in r.items()} for r in rows],
    }
    phases["total"] = time.monotonic() - started
    payload["phases_s"] = {k: _round(v, 1) for k, v in phases.items()}
    return Report(payload, format_table(payload))


def _ci(values: list[float | None]) -> str:
    return "" if values[0] is None else f"[{values[0]:.3f}, {values[1]:.3f}]"


def format_table(payload: dict[str, Any]) -> str:
    """The figures of ``payload`` as a plain-text table, rounded, one line of meaning each."""
    lines = [f"Mnemos main job: {payload['n_questions']} LoCoMo questions (categories 1-4) of "
             f"{', '.join(payload['data']['conversations'])}, reranker {payload['reranker']['name']}, "
             f"suppression {'on' if payload['suppression'] else 'off'}", ""]
    width = 16

    def row(name: str, value: str, ci: str, meaning: str) -> None:
        lines.append(f"{name:<{width}} {value:>15} {ci:>16}  {meaning}")

    row("metric", "value", "95% CI", "meaning")
    for key, label in (("ndcg@10", "NDCG@10"), ("recall@10", "Recall@10"), ("session_hit@1", "session Hit@1")):
        value = payload[key]
        row(label, "n/a" if value is None else f"{value:.3f}", _ci(payload[f"{key}_ci95"]), MEANINGS[key])
    check = payload["per_question_check"]
    in_process = payload["in_process"]
    row("in process", "n/a" if in_process["ndcg@10"] is None else f"{in_process['ndcg@10']:.3f}",
        f"{check['equal_ndcg@10']}/{check['questions']} equal", MEANINGS["in_process"] + " (NDCG@10)")
    five = payload["category_5"]
    if five["n_questions"]:
        row("category 5", f"{five['ndcg@10']:.3f}", _ci(five["ndcg@10_ci95"]),
            f"NDCG@10 of the {five['n_questions']} adversarial questions (not in the headline)")
    ingest, query, fresh = payload["ingest"], payload["query"], payload["freshness"]
    row("ingest", f"{ingest['turns_per_s']:.0f} turns/s", f"{ingest['turns']} turns", MEANINGS["ingest"])
    scored, cached = query.get("pairs_scored") or {}, query.get("all_pairs_cached") or {}
    if scored.get("n"):
        row("query, new", f"{1000 * scored['p50_s']:.0f} / {1000 * scored['p95_s']:.0f} ms",
            f"{scored['n']} questions", MEANINGS["query"] + ", the cross-encoder scoring the pool")
    if cached.get("n"):
        row("query, cached", f"{1000 * cached['p50_s']:.0f} / {1000 * cached['p95_s']:.0f} ms",
            f"{cached['n']} questions", f"the same, every pool pair from the score cache "
            f"({100 * query['cached_share']:.0f}% of questions: their tenant asked them before)")
    row("query, all", f"{1000 * query['p50_s']:.0f} / {1000 * query['p95_s']:.0f} ms", f"{query['n']} questions",
        MEANINGS["query"])
    if fresh["probes"]:
        row("freshness", f"{1000 * fresh['p50_s']:.0f} / {1000 * fresh['p95_s']:.0f} ms",
            f"{fresh['returned']}/{fresh['probes']} returned", MEANINGS["freshness"])
    lines.append("")
    lines.append("phases (s): " + ", ".join(f"{k} {v:.0f}" for k, v in payload["phases_s"].items()))
    tenants = payload["tenants"]
    lines.append(f"suppression: {sum(t['bootstrapped_before_evaluation'] for t in tenants)}/{len(tenants)} tenants "
                 f"had bootstrapped their clusters before evaluation; "
                 f"{sum(t['outcomes_applied'] or 0 for t in tenants)} outcomes applied")
    cache = payload["rerank_cache"]
    if cache["hits"] is not None:
        lines.append(f"rerank cache: {int(cache['hits'])} of {cache['pairs_in_pools']} pool pairs answered "
                     "from the query worker's cache")
    lines.append(f"cross-encoder scores of the replay: taken from the service's outcomes; "
                 f"{in_process['recomputed_pairs']} sampled pairs rescored by the real model here differ by at most "
                 f"{in_process['max_abs_logit_difference']}")
    verdict = "PASSED" if check["passed"] else "FAILED"
    lines.append(f"in-process check {verdict}: NDCG@10 equal on {check['equal_ndcg@10']}/{check['questions']} "
                 f"questions, rankings equal on {check['equal_rankings']}")
    for error in check["errors"]:
        lines.append(f"  replay error: {error}")
    return "\n".join(lines)


def write_outputs(report: Report, json_path: Path, plot_path: Path | None,
                  echo: Callable[[str], None]) -> None:
    """Write the JSON and the per-category PNG, print the table and both paths."""
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(report.payload, indent=1, default=str) + "\n", encoding="utf-8")
    echo("")
    echo(report.table)
    echo("")
    echo(f"JSON: {json_path}")
    per_category = report.payload["per_category"]
    if plot_path is not None and per_category:
        runs = [{"corpus": "LoCoMo, held-out conversations", "protocol": side,
                 "arm": f"{c} {entry['name']} (n={entry['service']['n_questions']})",
                 "ndcg@10": entry[key]["ndcg@10"], "ndcg@10_ci95": entry[key]["ndcg@10_ci95"]}
                for c, entry in per_category.items() for side, key in (("service", "service"),
                                                                      ("in process", "in_process"))]
        plot_ndcg(runs, plot_path, title="Mnemos main job: NDCG@10 per LoCoMo category (95% CI)")
        echo(f"PNG:  {plot_path}")
