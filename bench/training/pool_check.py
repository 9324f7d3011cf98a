"""How a cross-encoder reorders BM25's own candidate pools, question by question (``mnemos reranker pools``).

For each LongMemEval question the haystack's turns are rendered as the service renders them
(:func:`mnemos.rendering.render_turn`) and indexed by the service's BM25 (:class:`mnemos.bm25_index.BM25Index`,
entry id = the turn's position); BM25's best ``pool_size`` turns are the pool, which the reranker
scores (:class:`mnemos.rerank.Reranker`). Three orders of the same pool are compared by NDCG@10
over turn ids (:func:`mnemos.evaluation.ndcg_at_k`):

* ``bm25``: BM25's own order;
* ``rerank``: the reranker's logits, descending (stable: equal logits keep BM25's order);
* ``interp``: ``z(logit) + z(bm25 score)``, descending (stable), where ``z(x) = (x - mean) / (std + 1e-9)``
  within the pool.

Beside them: the pool's recall of the evidence (the ceiling any reorder can reach) and, for BM25's and
the reranker's top 10, the share of turns spoken by the assistant (LongMemEval's evidence is mostly
the user's: a reranker that prefers assistant turns shows up here).

With ``chitchat`` > 0, that many short chit-chat user turns (:data:`bench.training.chitchat.HELD_OUT_PHRASES`,
never trained on; a seeded draw per question) join each pool, as in a small tenant where every turn is
a candidate. Each gets the lowest BM25 score of the pool, as the service's BM25 evidence gives a turn
BM25 did not return (:func:`mnemos.features.retriever_scores`); ``chitchat_rerank`` is their share of
the reranker's top 10 (docs/reranker.md "Chit-chat and an unsure cross-encoder").

Questions: one per conversation (:func:`bench.common.datasets.load_longmemeval`), abstention
(category 5) and evidence-less ones skipped, and only those whose conversation the model was not
trained on (or, for a check of fit, only those it was). Pure: no file, no click.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import numpy as np

from bench.common.datasets import Conversation, Question
from bench.common.questions import overall_question
from bench.common.stats import PairedComparison, bootstrap_ci, compare_paired
from bench.training.chitchat import HELD_OUT_PHRASES, chitchat_turns
from mnemos.bm25_index import BM25Index
from mnemos.evaluation import ndcg_at_k
from mnemos.rendering import render_turn
from mnemos.rerank import Reranker

__all__ = [
    "ALL",
    "METRICS",
    "NDCG_K",
    "MetricSummary",
    "PoolCheck",
    "PoolGroup",
    "PoolRow",
    "check_pools",
    "interpolated_order",
    "markdown_table",
    "pool_row",
    "select_questions",
    "summarise",
]

NDCG_K = 10
"""Rank cut-off of NDCG and of the assistant share."""

METRICS = ("bm25", "rerank", "interp", "recall_pool", "assistant_bm25", "assistant_rerank", "chitchat_rerank")
"""The per-question values of a :class:`PoolRow`, in table order."""

ALL = "all"
"""The name of the group of every question."""


@dataclass(frozen=True)
class PoolRow:
    """One question's pool.

    ``bm25``, ``rerank``, ``interp``: NDCG@10 in [0, 1] of the three orders (module docstring);
    ``recall_pool``: share of the evidence turns in the pool; ``assistant_bm25`` and ``assistant_rerank``:
    share of assistant turns among the first 10 of BM25's and the reranker's order (0.0 for an empty
    pool); ``chitchat_rerank``: share of added chit-chat turns among the reranker's first 10 (0.0
    without them); ``pool``: turns in the pool (fewer than the pool size when fewer turns share a token
    with the question), added chit-chat turns included.
    """

    question_id: str
    question_type: str
    pool: int
    bm25: float
    rerank: float
    interp: float
    recall_pool: float
    assistant_bm25: float
    assistant_rerank: float
    chitchat_rerank: float = 0.0


CHITCHAT_ID = "chitchat:"
"""Turn-id prefix of the chit-chat turns a check adds to a pool (no LongMemEval turn id has it)."""


@dataclass(frozen=True)
class MetricSummary:
    """Mean of one metric over a group's questions and its 95% percentile bootstrap interval."""

    mean: float
    ci95: tuple[float, float]


@dataclass(frozen=True)
class PoolGroup:
    """The questions of one type (or :data:`ALL`): their count and a :class:`MetricSummary` per :data:`METRICS` name."""

    name: str
    n: int
    metrics: dict[str, MetricSummary]


@dataclass(frozen=True)
class PoolCheck:
    """The result of :func:`check_pools`.

    ``rows``: one per question, in data order; ``groups``: :data:`ALL` first, then each question type
    (sorted); ``rerank_vs_bm25`` and ``interp_vs_bm25``: paired NDCG@10 differences over every question
    (mean, bootstrap CI, permutation p; :func:`bench.common.stats.compare_paired`).
    """

    rows: tuple[PoolRow, ...]
    groups: tuple[PoolGroup, ...]
    rerank_vs_bm25: PairedComparison
    interp_vs_bm25: PairedComparison


def select_questions(
    conversations: Sequence[Conversation], trained: Collection[str], *, on_training: bool = False,
    limit: int | None = None,
) -> list[tuple[Conversation, Question]]:
    """The (conversation, its first question) pairs to check, in data order.

    Skips abstention (category 5) and questions without relevant turns; keeps conversations whose
    ``conversation_id`` is not in ``trained`` (the model's ``training_conversations``), or only those
    that are with ``on_training``; then the first ``limit`` (all when None).
    """
    chosen = []
    trained_ids = set(trained)
    for conv in conversations:
        if not conv.questions or (conv.conversation_id in trained_ids) != on_training:
            continue
        question = conv.questions[0]
        if overall_question(question.category) and question.relevant_turn_ids:
            chosen.append((conv, question))
    return chosen if limit is None else chosen[:limit]


def _zscore(values: np.ndarray) -> np.ndarray:
    z: np.ndarray = (values - values.mean()) / (values.std() + 1e-9)
    return z


def interpolated_order(logits: np.ndarray, bm25_scores: np.ndarray) -> np.ndarray:
    """Positions of a pool (``(n,)`` logits and BM25 scores, BM25 order) sorted by
    ``z(logits) + z(bm25_scores)`` descending, ties kept in BM25's order; ``(n,)`` int64."""
    return np.argsort(-(_zscore(logits) + _zscore(bm25_scores)), kind="stable")


def _assistant_share(roles: Sequence[str]) -> float:
    top = roles[:NDCG_K]
    return sum(role == "assistant" for role in top) / len(top) if top else 0.0


@dataclass(frozen=True)
class _PoolTurn:
    """What a pool row reads of a turn: a haystack turn's, or an added chit-chat turn's (:data:`CHITCHAT_ID`)."""

    turn_id: str
    role: str


def _with_chitchat(question: Question, turns: list[_PoolTurn], texts: list[str], scores: list[float],
                   chitchat: int) -> None:
    """Append ``chitchat`` held-out chit-chat user turns (a draw seeded by the question id) to a pool, in place."""
    phrases = random.Random(question.question_id).sample(HELD_OUT_PHRASES, min(chitchat, len(HELD_OUT_PHRASES)))
    lowest = min(scores) if scores else 0.0
    for i, text in enumerate(chitchat_turns(phrases, "user")):
        turns.append(_PoolTurn(f"{CHITCHAT_ID}{i}", "user"))
        texts.append(text)
        scores.append(lowest)


def pool_row(conv: Conversation, question: Question, reranker: Reranker, pool_size: int = 30,
             chitchat: int = 0) -> PoolRow:
    """Index ``conv``'s rendered turns, pool BM25's best ``pool_size`` for ``question`` (plus ``chitchat``
    held-out chit-chat turns, module docstring), rerank and measure.

    One reranker call per question (none for an empty pool, whose NDCGs and shares are 0.0).

    Raises:
        ValueError: if the reranker returns another number of scores than the pool has turns.
    """
    rendered = [render_turn(t.role, t.text, t.image_caption) for t in conv.turns]
    index = BM25Index()
    index.add(list(range(len(rendered))), rendered)
    hits = index.search(question.text, pool_size)
    turns = [_PoolTurn(conv.turns[position].turn_id, conv.turns[position].role) for position, _ in hits]
    texts = [rendered[position] for position, _ in hits]
    scores = [float(score) for _, score in hits]
    bm25_ids = [t.turn_id for t in turns]
    if chitchat:
        _with_chitchat(question, turns, texts, scores, chitchat)
    logits = np.asarray(reranker.score(question.text, texts)) if texts else np.zeros(0, dtype=np.float32)
    if logits.shape != (len(texts),):
        raise ValueError(f"the reranker gave {logits.shape} scores for a pool of {len(texts)} turns")
    bm25_scores = np.asarray(scores, dtype=np.float64)
    by_rerank = np.argsort(-logits, kind="stable")
    by_interp = interpolated_order(logits, bm25_scores) if texts else by_rerank
    ids = [t.turn_id for t in turns]
    relevant = question.relevant_turn_ids
    top = [ids[i] for i in by_rerank[:NDCG_K]]
    return PoolRow(
        question_id=question.question_id,
        question_type=question.question_type or "unknown",
        pool=len(turns),
        bm25=ndcg_at_k(bm25_ids, relevant, NDCG_K),
        rerank=ndcg_at_k([ids[i] for i in by_rerank], relevant, NDCG_K),
        interp=ndcg_at_k([ids[i] for i in by_interp], relevant, NDCG_K),
        recall_pool=len(relevant & set(ids)) / len(relevant),
        assistant_bm25=_assistant_share([t.role for t in turns[:len(bm25_ids)]]),
        assistant_rerank=_assistant_share([turns[i].role for i in by_rerank]),
        chitchat_rerank=sum(i.startswith(CHITCHAT_ID) for i in top) / len(top) if top else 0.0,
    )


def _group(name: str, rows: Sequence[PoolRow], n_resamples: int) -> PoolGroup:
    metrics = {}
    for metric in METRICS:
        values = [float(getattr(row, metric)) for row in rows]
        metrics[metric] = MetricSummary(mean=float(np.mean(values)),
                                        ci95=bootstrap_ci(values, n_resamples=n_resamples))
    return PoolGroup(name=name, n=len(rows), metrics=metrics)


def summarise(rows: Sequence[PoolRow], *, n_resamples: int = 10_000) -> PoolCheck:
    """Group ``rows`` (all, then per question type) and compare rerank and interp with BM25, paired.

    Raises:
        ValueError: if ``rows`` is empty (no mean to report).
    """
    if not rows:
        raise ValueError("no question to summarise")
    types = sorted({row.question_type for row in rows})
    groups = [_group(ALL, rows, n_resamples)]
    groups += [_group(t, [row for row in rows if row.question_type == t], n_resamples) for t in types]
    bm25 = [row.bm25 for row in rows]
    return PoolCheck(
        rows=tuple(rows), groups=tuple(groups),
        rerank_vs_bm25=compare_paired([row.rerank for row in rows], bm25, n_resamples=n_resamples),
        interp_vs_bm25=compare_paired([row.interp for row in rows], bm25, n_resamples=n_resamples),
    )


def _nothing_selected(conversations: Sequence[Conversation], trained: Collection[str], on_training: bool) -> str:
    """Why :func:`select_questions` chose nothing: no usable question at all, or every one on the other side."""
    usable = len(select_questions(conversations, ()))
    if not usable:
        return "no question with evidence (abstention apart) in the data"
    if on_training:
        return (f"no trained-on question: none of the {usable} questions with evidence (abstention apart) "
                "is in the model's training_conversations")
    return (f"no held-out question, nothing is held out: all {usable} questions with evidence (abstention apart) "
            "are in the model's training_conversations (--on-training checks them as a fit)")


def check_pools(
    conversations: Sequence[Conversation], reranker: Reranker, *, trained: Collection[str],
    on_training: bool = False, pool_size: int = 30, limit: int | None = None, n_resamples: int = 10_000,
    progress: Callable[[int, int], None] | None = None, chitchat: int = 0,
) -> PoolCheck:
    """Measure every selected question's pool (:func:`select_questions`, :func:`pool_row`) and summarise.

    Args:
        conversations: LongMemEval conversations, one question each.
        reranker: what scores the pools (the trained cross-encoder, or a fake in tests).
        trained: the model's ``training_conversations`` (its provenance).
        on_training: check the trained-on questions instead of the held-out ones (a check of fit).
        pool_size: BM25 candidates per question (>= 1).
        limit: check only the first ``limit`` selected questions.
        n_resamples: bootstrap resamples and permutations of the statistics.
        progress: called as ``progress(done, total)`` after each question.
        chitchat: held-out chit-chat turns added to each pool (>= 0; module docstring).

    Raises:
        ValueError: if ``pool_size`` < 1 or ``chitchat`` < 0, or no question is selected (the message says whether the data
            has none with evidence or every one is on the other side of ``trained``).
    """
    if pool_size < 1:
        raise ValueError(f"pool_size must be >= 1, got {pool_size}")
    if chitchat < 0:
        raise ValueError(f"chitchat must be >= 0, got {chitchat}")
    chosen = select_questions(conversations, trained, on_training=on_training, limit=limit)
    if not chosen:
        raise ValueError(_nothing_selected(conversations, trained, on_training))
    rows = []
    for done, (conv, question) in enumerate(chosen, start=1):
        rows.append(pool_row(conv, question, reranker, pool_size, chitchat))
        if progress is not None:
            progress(done, len(chosen))
    return summarise(rows, n_resamples=n_resamples)


def markdown_table(check: PoolCheck, pool_size: int) -> str:
    """A markdown table: one line per group (n, mean NDCG@10 of the three orders with their 95% CI,
    recall of the pool, assistant share of each top 10), then the paired comparisons with BM25."""
    lines = [f"| questions | n | bm25 | rerank | interp | recall@{pool_size} | assistant@10 bm25 | assistant@10 rerank "
             "| chit-chat@10 rerank |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for group in check.groups:
        cells = []
        for metric in METRICS:
            summary = group.metrics[metric]
            low, high = summary.ci95
            cells.append(f"{summary.mean:.3f} [{low:.3f}, {high:.3f}]" if metric in METRICS[:3]
                         else f"{summary.mean:.3f}")
        lines.append(f"| {group.name} | {group.n} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, comparison in (("rerank - bm25", check.rerank_vs_bm25), ("interp - bm25", check.interp_vs_bm25)):
        low, high = comparison.delta_ci95
        lines.append(f"- {name}: {comparison.delta:+.3f} NDCG@10 [{low:+.3f}, {high:+.3f}], "
                     f"paired permutation p = {comparison.p_value:.4f} (n = {comparison.n})")
    return "\n".join(lines) + "\n"
