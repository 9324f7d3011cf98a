"""``mnemos bench packets``: evidence packets against a top-k list at equal token budgets.

docs/architecture.md "Evidence packets". Two measurements, both with the pipeline's default
configuration (no suppression state: a packet is selected from one retrieval's reranked pool):

* LoCoMo, per tenant (each conversation its own index), every question with evidence, reranked by
  the model of the held-out fold that never trained on the question's conversation
  (:class:`~bench.common.folds.FoldRerankers`): evidence recall (share of the question's evidence turns,
  mapped to canonical entries, that the selection holds) of the packet and of the top-k list at
  the same budget, for every budget in ``budgets`` (256, 512, 1,024 tokens), with percentile
  bootstrap CIs of each mean and of the paired difference (:mod:`bench.common.stats`).
* LongMemEval, ``knowledge-update`` questions: how often the selection holds an evidence turn of
  the newest evidence session (the updated value), and how often it holds only stale evidence.

The top-k list at a budget is the reranked pool in rank order, each item kept while it still
fits (an item that does not fit is skipped, not a stop): the strongest list baseline at that
budget. A list of hits is pasted as self-contained lines, so each of its items costs
:func:`mnemos.packets.render_item` (every qualifier on every line); a packet pastes each session's
header once and its items' lines under it (:func:`mnemos.packets.prompt_text`). A third selection,
``topk_grouped`` (the top-k list priced and pasted like a packet), separates what the packet's
rendering gains from what its selection gains. Tokens are counted by the cross-encoder's tokenizer
(``tokenizer.json`` of the first fold model; words for tests). This module is a benchmark: it
writes ``packets.{json,md,png}`` and never runs in the service.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.common.corpora import CorpusMode, Tenant, build_tenants, global_id, rendered_texts, unread_of
from bench.common.datasets import Conversation, Question
from bench.common.questions import prepare_questions
from bench.common.stats import bootstrap_ci
from bench.packets.knobs import StudyQuestion, knob_study
from bench.packets.selection import RankedPool, _Selections, choose, topk_within_budget
from mnemos.encoder import Encoder
from mnemos.packets import (
    PacketConfig,
    Relevance,
    TokenCounter,
    candidates_from_index,
    render_item,
)
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import Reranker

__all__ = ["BUDGETS", "PacketBenchOptions", "run_packets_bench", "topk_within_budget", "write_outputs"]

logger = logging.getLogger(__name__)

BUDGETS = (256, 512, 1024)
ARMS = ("packet", "topk", "topk_grouped")
KNOWLEDGE_UPDATE = "knowledge-update"
RerankerFor = Callable[[str], Reranker | None]


@dataclass(frozen=True)
class PacketBenchOptions:
    """Budgets in tokens, the packet knobs, the retrieval configuration and the bootstrap settings."""

    budgets: tuple[int, ...] = BUDGETS
    packet: PacketConfig = field(default_factory=PacketConfig)
    retrieval: RetrievalConfig = field(default_factory=RetrievalConfig)
    resamples: int = 10_000
    seed: int = 0


def ranked_pool(tenant: Tenant, question: Question, encoder: Encoder, reranker: Reranker | None,
                count_tokens: TokenCounter, options: PacketBenchOptions) -> RankedPool:
    """The pipeline's retrieval of ``question`` on ``tenant`` as packet candidates."""
    index = tenant.index
    query_vector = encoder.encode([question.text])[0]
    core = retrieve(index, question.text, query_vector, k=10, config=options.retrieval, reranker=reranker,
                    reference_time=question.question_date, outcome_id=question.question_id)
    candidates = candidates_from_index(index, core.ranking, count_tokens)
    embeddings = np.asarray(index.embeddings_of([c.entry_id for c in candidates]))
    config = options.packet if core.pool_size > 0 else dataclasses.replace(options.packet, relevance=Relevance.MINMAX)
    flat = tuple(max(1, int(count_tokens(render_item(c.text, c.qualifiers)))) for c in candidates)
    return RankedPool(candidates, embeddings, config, flat)


def _select(tenant: Tenant, question: Question, encoder: Encoder, reranker: Reranker | None,
            count_tokens: TokenCounter, options: PacketBenchOptions) -> _Selections:
    pool = ranked_pool(tenant, question, encoder, reranker, count_tokens, options)
    return choose(pool, options.budgets, supersessions=tenant.index.supersessions)


def _tenants(conversations: Sequence[Conversation], encoder: Encoder) -> dict[str, Tenant]:
    turns = [t for conv in conversations for t in conv.turns]
    vectors = np.asarray(encoder.encode(rendered_texts(turns)), dtype=np.float32).reshape(len(turns), encoder.dim)
    return build_tenants(conversations, vectors, CorpusMode.PER_TENANT, dim=encoder.dim, unread_of=unread_of(encoder))


def _questions(conversations: Iterable[Conversation], wanted: Callable[[Question], bool]
               ) -> Iterable[tuple[Conversation, Question]]:
    for conv in conversations:
        for question in conv.questions:
            if question.relevant_turn_ids and wanted(question):
                yield conv, question


def _interval(values: Sequence[float], options: PacketBenchOptions) -> dict[str, Any]:
    x = np.asarray(values, dtype=np.float64)
    lo, hi = bootstrap_ci(x, n_resamples=options.resamples, seed=options.seed)
    return {"mean": float(x.mean()) if x.size else float("nan"), "ci95": [lo, hi], "n": int(x.size)}


def evidence_recall(conversations: Sequence[Conversation], encoder: Encoder, reranker_for: RerankerFor,
                    count_tokens: TokenCounter, options: PacketBenchOptions) -> tuple[dict[str, Any], dict[str, Any]]:
    """LoCoMo part: per budget, mean evidence recall of packet and top-k with CIs, and their paired
    difference; and the knob study on the same pools (:func:`bench.packets.knobs.knob_study`)."""
    tenants = _tenants(conversations, encoder)
    dev = {q.key for q in prepare_questions(conversations, seed=options.seed) if q.dev}
    recalls: dict[int, dict[str, list[float]]] = {b: {arm: [] for arm in ARMS} for b in options.budgets}
    study: list[StudyQuestion] = []
    for conv, question in _questions(conversations, lambda q: True):
        tenant = tenants[conv.conversation_id]
        relevant = tenant.relevant_entries(frozenset(global_id(conv.conversation_id, t)
                                                     for t in question.relevant_turn_ids))
        if not relevant:
            continue
        pool = ranked_pool(tenant, question, encoder, reranker_for(conv.conversation_id), count_tokens, options)
        chosen = choose(pool, options.budgets, supersessions=tenant.index.supersessions)
        study.append(StudyQuestion(question.question_id in dev, relevant, pool, tenant.index.supersessions))
        for budget in options.budgets:
            for arm in ARMS:
                recalls[budget][arm].append(len(relevant & getattr(chosen, arm)[budget]) / len(relevant))
    out = {}
    for budget, arms in recalls.items():
        packet = np.asarray(arms["packet"])
        out[str(budget)] = {**{arm: _interval(values, options) for arm, values in arms.items()},
                            "difference": _interval(list(packet - np.asarray(arms["topk"])), options),
                            "difference_vs_grouped": _interval(list(packet - np.asarray(arms["topk_grouped"])),
                                                               options)}
    return out, knob_study(study, options.budgets, options.packet)


def _newest_evidence(tenant: Tenant, conv: Conversation, question: Question) -> tuple[frozenset[int], frozenset[int]]:
    """Canonical entries of the evidence turns of the newest evidence session, and of the older ones."""
    turns = {t.turn_id: t for t in conv.turns}
    evidence = [turns[t] for t in question.relevant_turn_ids if t in turns]
    newest = max(t.occurred_at for t in evidence)
    new = frozenset(t.turn_id for t in evidence if t.occurred_at == newest)
    entries = tenant.relevant_entries
    return (entries(frozenset(global_id(conv.conversation_id, t) for t in new)),
            entries(frozenset(global_id(conv.conversation_id, t.turn_id) for t in evidence if t.turn_id not in new)))


def knowledge_updates(conversations: Sequence[Conversation], encoder: Encoder, reranker_for: RerankerFor,
                      count_tokens: TokenCounter, options: PacketBenchOptions) -> dict[str, Any]:
    """LongMemEval part: per budget, the share of knowledge-update questions whose packet (and top-k
    list) holds the newest evidence, and the share holding only stale evidence."""
    picked = [(conv, q) for conv, q in _questions(conversations, lambda q: q.question_type == KNOWLEDGE_UPDATE)]
    tenants = _tenants([conv for conv, _ in picked], encoder) if picked else {}
    rows: dict[int, dict[str, list[float]]] = {b: {f"{arm}_{what}": [] for arm in ("packet", "topk")
                                                   for what in ("newest", "stale_only")} for b in options.budgets}
    for conv, question in picked:
        tenant = tenants[conv.conversation_id]
        new, old = _newest_evidence(tenant, conv, question)
        if not new:
            continue
        chosen = _select(tenant, question, encoder, reranker_for(conv.conversation_id), count_tokens, options)
        for budget in options.budgets:
            for arm, selection in (("packet", chosen.packet[budget]), ("topk", chosen.topk[budget])):
                has_new = bool(new & selection)
                rows[budget][f"{arm}_newest"].append(float(has_new))
                rows[budget][f"{arm}_stale_only"].append(float(not has_new and bool((old - new) & selection)))
    return {str(budget): {name: _interval(values, options) for name, values in metrics.items()}
            for budget, metrics in rows.items()}


def run_packets_bench(locomo: Sequence[Conversation], longmemeval: Sequence[Conversation], encoder: Encoder,
                      reranker_for: RerankerFor, count_tokens: TokenCounter,
                      options: PacketBenchOptions | None = None) -> dict[str, Any]:
    """The benchmark's JSON document (module docstring); either data set may be empty (its part is ``{}``)."""
    options = options or PacketBenchOptions()
    packet = options.packet
    recall, study = evidence_recall(locomo, encoder, reranker_for, count_tokens, options) if locomo else ({}, {})
    return {
        "benchmark": "packets",
        "settings": {"budgets": list(options.budgets), "corpus": CorpusMode.PER_TENANT.value,
                     "reranker": "held-out fold per conversation", "resamples": options.resamples,
                     "seed": options.seed,
                     "packet": {"mmr_lambda": packet.mmr_lambda, "redundancy_threshold": packet.redundancy_threshold,
                                "session_share": packet.session_share, "token_exponent": packet.token_exponent},
                     "topk_baseline": "reranked pool in rank order, each item kept while it fits, priced as "
                                      "a flat list's self-contained line (render_item)",
                     "topk_grouped": "the same list priced and pasted like a packet (session headers once)"},
        "locomo_evidence_recall": recall,
        "locomo_knob_study": study,
        "longmemeval_knowledge_update": knowledge_updates(longmemeval, encoder, reranker_for, count_tokens, options)
        if longmemeval else {},
    }


def _markdown(document: Mapping[str, Any]) -> str:
    lines = ["# Evidence packets vs top-k at equal token budgets", "",
             "docs/architecture.md \"Evidence packets\". Means with 95% bootstrap CIs.", ""]
    if document.get("command"):
        lines += [f"Command: `{document['command']}`", ""]
    recall = document["locomo_evidence_recall"]
    if recall:
        lines += ["## LoCoMo evidence recall (per tenant, held-out reranker folds)", "",
                  "top-k: the reranked list pasted as self-contained lines (every qualifier on every line); "
                  "top-k grouped: the same list priced like a packet (session headers once), the control "
                  "that isolates the packet's selection from its rendering.", "",
                  "| budget | packet | top-k | packet - top-k | top-k grouped | packet - top-k grouped | n |",
                  "|---|---|---|---|---|---|---|"]
        for budget, row in recall.items():
            cells = [f"{row[a]['mean']:+.3f} [{row[a]['ci95'][0]:+.3f}, {row[a]['ci95'][1]:+.3f}]"
                     if a.startswith("difference") else
                     f"{row[a]['mean']:.3f} [{row[a]['ci95'][0]:.3f}, {row[a]['ci95'][1]:.3f}]"
                     for a in ("packet", "topk", "difference", "topk_grouped", "difference_vs_grouped")]
            lines.append(f"| {budget} | {' | '.join(cells)} | {row['packet']['n']} |")
        lines.append("")
    lines += _study_lines(document.get("locomo_knob_study") or {})
    updates = document["longmemeval_knowledge_update"]
    if updates:
        lines += ["## LongMemEval knowledge-update: newest value held", "",
                  "| budget | packet newest | top-k newest | packet stale only | top-k stale only | n |",
                  "|---|---|---|---|---|---|"]
        for budget, row in updates.items():
            cells = [f"{row[m]['mean']:.3f}" for m in ("packet_newest", "topk_newest", "packet_stale_only",
                                                       "topk_stale_only")]
            lines.append(f"| {budget} | {' | '.join(cells)} | {row['packet_newest']['n']} |")
    return "\n".join(lines) + "\n"


def _study_lines(study: Mapping[str, Any]) -> list[str]:
    """The knob study's table: packet - top-k evidence recall per knob setting, dev and test halves."""
    if not study:
        return []
    budgets = list(study["grid"][0]["dev"])
    lines = ["## Knob study (LoCoMo; chosen on the dev half, test half reported only)", "",
             f"Default {study['default']}; chosen on dev {study['chosen']} "
             f"({study['n_dev']} dev / {study['n_test']} test questions). Packet - top-k evidence recall:", "",
             "| mmr_lambda | session_share | token_exponent | " + " | ".join(f"dev {b}" for b in budgets) + " | "
             + " | ".join(f"test {b}" for b in budgets) + " |", "|---|---|---|" + "---|" * (2 * len(budgets))]
    for row in study["grid"]:
        knobs = row["knobs"]
        cells = [f"{row[split][b]:+.3f}" for split in ("dev", "test") for b in budgets]
        lines.append(f"| {knobs['mmr_lambda']} | {knobs['session_share']} | {knobs['token_exponent']} | "
                     + " | ".join(cells) + " |")
    return [*lines, ""]


def _plot(document: Mapping[str, Any], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    recall = document["locomo_evidence_recall"]
    figure = Figure(figsize=(6, 4))
    FigureCanvasAgg(figure)
    axes = figure.add_subplot(1, 1, 1)
    budgets = list(recall)
    x = np.arange(len(budgets))
    for offset, arm in ((-0.27, "packet"), (0.0, "topk"), (0.27, "topk_grouped")):
        means = [recall[b][arm]["mean"] for b in budgets]
        errors = [[m - recall[b][arm]["ci95"][0] for b, m in zip(budgets, means, strict=True)],
                  [recall[b][arm]["ci95"][1] - m for b, m in zip(budgets, means, strict=True)]]
        axes.bar(x + offset, means, width=0.27, yerr=errors, capsize=3, label=arm)
    axes.set_xticks(x, [f"{b} tokens" for b in budgets])
    axes.set_ylabel("evidence recall (LoCoMo, per tenant)")
    axes.set_title("Evidence packets vs top-k at equal budgets")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def write_outputs(document: Mapping[str, Any], out_dir: Path, stem: str = "packets") -> list[Path]:
    """Write ``<stem>.json``, ``<stem>.md`` and (with LoCoMo results) ``<stem>.png`` under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / f"{stem}.json", out_dir / f"{stem}.md"]
    paths[0].write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(_markdown(document), encoding="utf-8")
    if document["locomo_evidence_recall"]:
        paths.append(out_dir / f"{stem}.png")
        _plot(document, paths[2])
    return paths
