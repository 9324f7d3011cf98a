"""Turning per-question metrics into JSON run rows (with CIs and p-values) and Markdown tables.

Headline numbers ("overall") are LoCoMo categories 1-4 (all questions for uncategorised data);
category 5 (adversarial) is reported on its own under ``categories``. Only labelled questions
(at least one valid evidence turn) are scored. CIs are 95% percentile bootstrap intervals
(10,000 resamples, seeded) and p-values two-sided paired permutation tests against
``hybrid_rerank`` on the same questions (*Clustered Retrieval-Induced Forgetting* §4.1; docs/architecture.md "Evaluation").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from bench.common.questions import overall_question
from bench.common.stats import bootstrap_ci, compare_paired, format_p
from bench.quality.arms import BASELINE_ARM
from bench.quality.engine import BenchQuestion, QuestionMetrics

__all__ = ["CATEGORY_NAMES", "render_markdown", "run_row"]

CATEGORY_NAMES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_MAIN = (("ndcg@10", "ndcg10"), ("recall@10", "recall10"), ("recall@30", "recall30"),
         ("session_hit@1", "session_hit1"), ("session_ndcg@5", "session_ndcg5"), ("session_recall@5", "session_recall5"))
_BEHAVIOUR = ("exact_episode", "wrong_family", "sibling_confusion")


def _values(metrics: Mapping[str, QuestionMetrics], keys: Sequence[str], attr: str) -> np.ndarray:
    return np.asarray([getattr(metrics[k], attr) for k in keys], dtype=np.float64)


def _block(
    metrics: Mapping[str, QuestionMetrics],
    keys: Sequence[str],
    baseline: Mapping[str, QuestionMetrics] | None,
    *,
    abstain_label: str,
    n_resamples: int,
    seed: int,
    tests: Sequence[str],
) -> dict[str, Any]:
    """Means, CIs, behaviour rates and (for ``tests``) paired comparisons on ``keys``."""
    block: dict[str, Any] = {"n_questions": len(keys)}
    for name, attr in _MAIN:
        values = _values(metrics, keys, attr)
        block[name] = float(values.mean()) if values.size else None
        block[f"{name}_ci95"] = list(bootstrap_ci(values, n_resamples=n_resamples, seed=seed)) if values.size else None
    for name in _BEHAVIOUR:
        values = _values(metrics, keys, name)
        block[name] = float(values.mean()) if values.size else None
    abstain = [metrics[k].abstain for k in keys]
    block[abstain_label] = float(np.mean(abstain)) if keys and None not in abstain else None
    block["deep_pass_rate"] = float(np.mean([metrics[k].deep_pass for k in keys])) if keys else None
    if baseline is not None and keys:
        deltas = {}
        for name, attr in _MAIN:
            if name not in tests:
                continue
            comparison = compare_paired(
                _values(metrics, keys, attr), _values(baseline, keys, attr), n_resamples=n_resamples, seed=seed
            )
            suffix = "" if name == "ndcg@10" else f"_{name}"
            block[f"p_vs_{BASELINE_ARM}{suffix}"] = comparison.p_value
            deltas[name] = {"delta": comparison.delta, "ci95": list(comparison.delta_ci95)}
        block[f"delta_vs_{BASELINE_ARM}"] = deltas
    return block


def run_row(
    *,
    corpus: str,
    protocol: str,
    arm: str,
    metrics: Mapping[str, QuestionMetrics],
    baseline: Mapping[str, QuestionMetrics] | None,
    questions: Mapping[str, BenchQuestion],
    abstain_threshold: float,
    n_resamples: int,
    seed: int,
) -> dict[str, Any]:
    """One JSON run row: overall block (categories 1-4) plus a block per category.

    The baseline comparison (p-values, deltas) is made on the same questions; NDCG@10,
    Recall@10 and Recall@30 are tested overall, NDCG@10 per category.
    """
    keys = [k for k in metrics if overall_question(questions[k].category)]
    label = f"abstain@{abstain_threshold:g}"
    common = {"abstain_label": label, "n_resamples": n_resamples, "seed": seed}
    row: dict[str, Any] = {"corpus": corpus, "protocol": protocol, "arm": arm}
    row.update(_block(metrics, keys, baseline, tests=("ndcg@10", "recall@10", "recall@30"), **common))
    categories: dict[str, Any] = {}
    for category in sorted({q.category for k in metrics if (q := questions[k]).category is not None}):
        members = [k for k in metrics if questions[k].category == category]
        block = _block(metrics, members, baseline, tests=("ndcg@10",), **common)
        block["name"] = questions[members[0]].category_name or CATEGORY_NAMES.get(category, str(category))
        categories[str(category)] = block
    row["categories"] = categories
    return row


def _fmt(value: float | None, digits: int = 3) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _ci(row: Mapping[str, Any], name: str) -> str:
    ci = row.get(f"{name}_ci95")
    if row.get(name) is None:
        return "–"
    return f"{row[name]:.3f} [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else f"{row[name]:.3f}"


def _p(value: float | None) -> str:
    if value is None:
        return "–"
    return format_p(value)


def _delta(row: Mapping[str, Any], name: str) -> str:
    entry = row.get(f"delta_vs_{BASELINE_ARM}", {}).get(name)
    if not entry:
        return "–"
    lo, hi = entry["ci95"]
    return f"{entry['delta']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def _table(rows: Sequence[Mapping[str, Any]], abstain_label: str) -> list[str]:
    lines = [
        f"| arm | n | NDCG@10 [95% CI] | Δ NDCG@10 vs {BASELINE_ARM} [95% CI] | p | Recall@10 [95% CI] | p (R@10) "
        f"| Recall@30 | session Hit@1 | session NDCG@5 | session R@5 | exact_episode | wrong_family "
        f"| sibling_confusion | {abstain_label} | deep pass |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['arm']} | {r['n_questions']} | {_ci(r, 'ndcg@10')} | {_delta(r, 'ndcg@10')} "
            f"| {_p(r.get(f'p_vs_{BASELINE_ARM}'))} | {_ci(r, 'recall@10')} "
            f"| {_p(r.get(f'p_vs_{BASELINE_ARM}_recall@10'))} | {_ci(r, 'recall@30')} | {_fmt(r.get('session_hit@1'))} "
            f"| {_fmt(r.get('session_ndcg@5'))} | {_fmt(r.get('session_recall@5'))} | {_fmt(r['exact_episode'])} "
            f"| {_fmt(r['wrong_family'])} | {_fmt(r['sibling_confusion'])} | {_fmt(r.get(abstain_label))} "
            f"| {_fmt(r.get('deep_pass_rate'), 2)} |"
        )
    return lines


def _category_table(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    categories = sorted({c for r in rows for c in r.get("categories", {})}, key=int)
    if not categories:
        return []
    def name(c: str) -> str:
        named = next((r["categories"][c].get("name") for r in rows if c in r.get("categories", {})), None)
        return named or CATEGORY_NAMES.get(int(c), "")

    head = " | ".join(f"{c} {name(c)} (n={rows[0]['categories'].get(c, {}).get('n_questions', '?')})"
                      for c in categories)
    lines = [f"| arm | {head} |", "|---|" + "---|" * len(categories)]
    for r in rows:
        cells = []
        for c in categories:
            block = r["categories"].get(c)
            if not block:
                cells.append("–")
                continue
            p = block.get(f"p_vs_{BASELINE_ARM}")
            mark = "" if p is None or p >= 0.05 or r["arm"] == BASELINE_ARM else " *"
            cells.append(f"{_fmt(block['ndcg@10'])}{mark}")
        lines.append(f"| {r['arm']} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(document: Mapping[str, Any], *, header: Callable[[Mapping[str, Any]], list[str]] | None = None) -> str:
    """Markdown report: optional header lines, then per corpus mode and protocol the main table and
    the NDCG@10-per-category table (``*``: p < 0.05 against the baseline on that category)."""
    lines = list(header(document)) if header else []
    runs = document["runs"]
    label = f"abstain@{document['settings']['abstain_threshold']:g}"
    for corpus in dict.fromkeys(r["corpus"] for r in runs):
        for protocol in dict.fromkeys(r["protocol"] for r in runs):
            rows = [r for r in runs if r["corpus"] == corpus and r["protocol"] == protocol]
            if not rows:
                continue
            lines += ["", f"## {corpus} · {protocol}", "", *_table(rows, label)]
            cat = _category_table(rows)
            if cat:
                lines += ["", "NDCG@10 per category (`*`: paired permutation p < 0.05 vs "
                          f"{BASELINE_ARM} on that category):", "", *cat]
            no_evidence = [r for r in rows if r.get("no_evidence", {}).get(label) is not None]
            if no_evidence:
                n = no_evidence[0]["no_evidence"]["n_questions"]
                lines += ["", f"Questions without an evidence turn ({n}, not scored): {label}, the share whose "
                          "top cross-encoder score is below the threshold (an agent would answer that it does "
                          "not know): " + ", ".join(f"{r['arm']} {_fmt(r['no_evidence'][label])}" for r in no_evidence)]
    return "\n".join(lines) + "\n"
