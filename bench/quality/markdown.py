"""The Markdown header of the quality report (:func:`bench.quality.report.render_markdown` adds the tables).

Everything here reads the JSON document that :func:`bench.quality.run.run_quality` builds, so the
report can be re-rendered from a saved document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.quality.arms import BASELINE_ARM, FULL_ARM, GAP_ARM
from bench.quality.fusion_choice import fusion_lines
from bench.quality.published import published_lines
from bench.quality.selection import SUPPRESSION_OFF
from bench.quality.suppression_study import study_markdown

__all__ = ["quality_header", "service_lines", "variant_lines"]


def quality_header(document: Mapping[str, Any]) -> list[str]:
    """Markdown lines before the tables: dataset, cost, rerankers, suppression settings, the
    ``mnemos_full`` selection with its ablations, the ``hybrid_convex`` weight choice with its
    test-split comparison against ``hybrid_rrf`` (:mod:`bench.quality.fusion_choice`), the variants, the
    suppression study and, where the source published figures for the data set, ours beside them
    (:mod:`bench.quality.published`)."""
    d, cost = document["dataset"], document["cost"]
    lines = [f"# Retrieval quality on {d['name']}", ""]
    if document.get("command"):
        lines += ["Command:", "", "```", document["command"], "```", ""]
    names = d.get("category_names", {})
    unscored = f"{d['questions'] - d['labelled']} questions without an evidence turn are not scored"
    if "5" in names:
        scope = (f"Overall = every labelled question outside category 5 ({names['5']}: "
                 f"{d['labelled'] - d['overall_questions']} labelled), which is reported apart; {unscored}")
    elif names:
        scope = f"Overall = every labelled question (none of category 5 here); {unscored}"
    else:
        scope = "Overall = categories 1-4; category 5 separately"
    lines += [
        f"Dataset: `{d['path']}` ({d['conversations']} conversations, {d['turns']} turns, {d['questions']} questions"
        f" run, {d['labelled']} with evidence). {scope}.",
        f"Cost: {cost['seconds']} s total, {cost['reranker_pairs']} reranker pairs "
        f"({cost['reranker_pairs_scored_by_model']} scored by the model in this process, the rest from the disk "
        f"cache), {cost['retrievals']} retrievals.",
        *(["Tenants: " + "; ".join(
            f"{mode} {c['tenants']} ({c['entries']:,} entries indexed, {c['aliases']:,} dedupe aliases"
            + (f", {c['repeats']:,} repeated turns held once" if c["repeats"] else "") + ")"
            for mode, c in document["corpus"].items()) + "."] if document.get("corpus") else []),
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
            lines.append(_features_paragraph(
                f"Ablation ({item['corpus']}): the same features on `{BASELINE_ARM}` without suppression", item))
        for item in full.get("test_split", []):
            lines.append(
                f"\nTest split ({item['corpus']}, {item['protocol']}, n={item['n']}): {FULL_ARM} − {GAP_ARM} "
                f"NDCG@10 {item['delta']:+.4f} [{item['ci95'][0]:+.4f}, {item['ci95'][1]:+.4f}], p={item['p']:.3f}"
            )
    lines += service_lines(document.get("service_defaults") or [], document.get("service_environment") or [])
    lines += fusion_lines(document.get("fusion"))
    lines += variant_lines(document.get("variants") or [])
    if document.get("suppression_study"):
        lines += [""] + study_markdown(document["suppression_study"])
    lines += published_lines(document)
    return lines


def service_lines(entries: Sequence[Mapping[str, Any]], environment: Sequence[str] = ()) -> list[str]:
    """One paragraph per corpus mode: the service's default features on the held-out ``+clustered_rif_gap``
    pools and their paired NDCG@10 difference with the other arms (``service_defaults`` of the document).
    With ``environment`` (the ``MNEMOS_*`` variables that were set), the title says the settings came from there."""
    where = f" (settings from {', '.join(environment)})" if environment else ""
    return [_features_paragraph(f"Service defaults{where} ({item['corpus']}): `{GAP_ARM}` (held out) + "
                                f"{', '.join(item['features']) or 'nothing'}", item) for item in entries]


def _features_paragraph(title: str, item: Mapping[str, Any]) -> str:
    """``title``, then the NDCG@10 and Recall@10 (95% CIs) of a features entry
    (:func:`bench.quality.document.service_defaults_json`, the ablation without suppression) and its
    paired NDCG@10 differences."""
    return (
        f"\n{title}: NDCG@10 {item['ndcg@10']:.3f} [{item['ndcg@10_ci95'][0]:.3f}, {item['ndcg@10_ci95'][1]:.3f}], "
        f"Recall@10 {item['recall@10']:.3f} [{item['recall@10_ci95'][0]:.3f}, {item['recall@10_ci95'][1]:.3f}]; "
        + "; ".join(f"{k}: {v['delta_ndcg@10']:+.4f} [{v['ci95'][0]:+.4f}, {v['ci95'][1]:+.4f}] p={v['p']:.3f}"
                    for k, v in item.items() if k.startswith("vs "))
    )


def variant_lines(blocks: Sequence[Mapping[str, Any]]) -> list[str]:
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
