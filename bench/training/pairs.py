"""Training pairs for the project's cross-encoder: selecting data and mining negatives.

The first two steps of the recipe in :mod:`bench.training.cross_encoder` (which fine-tunes on their output):

1. ``locomo_positives`` / ``longmemeval_positives`` / :func:`bench.training.jsonl_pairs.read_pairs_jsonl`: positives (and given
   negatives) as records, from the conversations ``fold_conversations`` selects or the questions
   ``question_folds`` selects;
2. ``mine_examples``: labelled pairs with hard negatives (BM25 and bi-encoder results of the same
   conversation or haystack, ranked by the service's own :class:`mnemos.bm25_index.BM25Index` and
   exact inner product over the bi-encoder's vectors) and random ones, seeded.

The caller loads the bi-encoder; nothing here reads the environment or keeps a model between calls.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Protocol

import numpy as np

from bench.training.chitchat import chitchat_negatives
from bench.training.errors import TrainingDataError
from bench.training.evidence_negatives import evidence_candidates, evidence_negatives
from bench.training.model_negatives import Scorer, model_negatives, model_order
from bench.training.named_user import name_question
from bench.training.speaker_sampling import speaker_first, speaker_first_sample
from mnemos.bm25_index import BM25Index
from mnemos.fusion import reciprocal_rank_fusion
from mnemos.rendering import RENDERING_VERSION, Rendering, render_turn, rendered_speaker

__all__ = [
    "Conversation",
    "LabelledPair",
    "MiningConfig",
    "PairSource",
    "PositivePair",
    "TextEncoder",
    "fold_conversations",
    "locomo_positives",
    "longmemeval_positives",
    "question_folds",
    "mine_examples",
    "turn_passages",
    "calibration_pools",
]

logger = logging.getLogger(__name__)


class PairSource(StrEnum):
    """Where a positive pair came from."""

    OBSERVATION = "observation"  # LoCoMo generated fact -> the turn it cites
    QA = "qa"  # LoCoMo question -> one of its (repaired) evidence turns
    LONGMEMEVAL = "longmemeval"  # LongMemEval question -> one of its has_answer turns
    JSONL = "jsonl"  # a user-supplied pairs file


@dataclass(frozen=True)
class PositivePair:
    """A query and one passage that answers it.

    ``group`` scopes negative mining: passages of the same group (a LoCoMo conversation, or the
    whole file for JSONL input) are the candidate negatives. ``negatives`` are given ones (JSONL).
    ``session`` holds the rendered turns of the passage's session (LoCoMo, LongMemEval; empty for
    JSONL), which often restate the answer: never a model negative (:func:`mine_examples`).
    """

    query: str
    passage: str
    group: str
    source: PairSource
    turn_id: str | None = None
    negatives: tuple[str, ...] = ()
    session: frozenset[str] = frozenset()


@dataclass(frozen=True)
class LabelledPair:
    """One training example: label 1.0 = relevant, 0.0 = not."""

    query: str
    passage: str
    label: float


@dataclass(frozen=True)
class MiningConfig:
    """Negatives per positive and how deep to look for hard ones.

    Hard negatives alternate between the BM25 and the dense ranking of the query over its group
    (top ``depth`` of each), skipping every passage that is a positive of that query; positive
    j of a query takes the j-th slice of that list, so sibling positives get different negatives.
    ``max_pairs`` caps the output by sampling whole positive groups (a positive with its
    negatives), so the positive/negative ratio survives the cap.

    ``same_speaker`` puts the hard candidates spoken by the positive's own speaker
    (:func:`mnemos.rendering.rendered_speaker`) ahead of the others, each part in its ranking
    order, and draws the random negatives from that speaker's turns first (then any turn when they
    run out; any turn for a positive without a speaker prefix), so a speaker's share of positives
    is the same for every speaker. Without it the speaker prefix itself becomes a label:
    LongMemEval's evidence is a user turn for 94% of its questions while BM25's hard candidates
    are mostly long assistant turns, so a model learns "assistant: ... = not relevant" and buries
    every answer the assistant gave (docs/reranker.md "Why the first LongMemEval model was weak").

    ``evidence_negatives`` adds that many negatives per positive drawn from the positives of the
    other groups (other questions' evidence turns: a user's statements about other things), of the
    positive's own speaker under ``same_speaker``, from a generator seeded apart (``seed + 1``) so
    the other negatives stay as they are (docs/reranker.md "Style over content").

    ``model_negatives`` adds that many negatives per positive that a trained cross-encoder (the
    ``scorer`` of :func:`mine_examples`) ranks highest among the query's hard candidates (the
    top ``depth`` above, positives and every turn of an evidence turn's session excluded: about
    half of a model's favourites there restate the answer), its own speaker's first under ``same_speaker``
    (:mod:`bench.training.model_negatives`; docs/reranker.md "Self-mined negatives").

    ``chitchat_negatives`` adds that many short chit-chat turns ("ok", "thanks") per positive,
    rendered as the positive's own speaker's turns (always: the prefix must not be a label), from a
    generator seeded apart (``seed + 2``) so the other negatives stay as they are
    (:mod:`bench.training.chitchat`; docs/reranker.md "Chit-chat and an unsure cross-encoder").
    """

    hard_negatives: int = 3
    random_negatives: int = 1
    depth: int = 30
    use_bm25: bool = True
    use_dense: bool = True
    max_pairs: int | None = None
    seed: int = 0
    same_speaker: bool = False
    evidence_negatives: int = 0
    model_negatives: int = 0
    chitchat_negatives: int = 0


class TextEncoder(Protocol):
    """Anything that embeds texts as (n, dim) float32 L2-normalised rows (e.g. the bi-encoder)."""

    def encode(self, texts: Sequence[str]) -> np.ndarray: ...


class _TurnLike(Protocol):
    turn_id: str
    session_id: str
    role: str
    text: str
    image_caption: str | None


class _QuestionLike(Protocol):
    text: str
    relevant_turn_ids: frozenset[str]
    category: int | None


class Conversation(Protocol):
    """The shape of ``bench.common.datasets.Conversation`` this module reads (the core never imports bench)."""

    conversation_id: str
    turns: Sequence[_TurnLike]
    questions: Sequence[_QuestionLike]
    observations: Sequence[tuple[str, str]]


# --------------------------------------------------------------------------------------------
# selecting data


def fold_conversations(conversation_ids: Iterable[str], fold: int, n_folds: int) -> tuple[list[str], list[str]]:
    """Split conversations into ``(train, held_out)`` for fold ``fold`` of ``n_folds`` (1-based).

    Ids are sorted and cut into ``n_folds`` contiguous chunks (the first chunks one larger when
    the count does not divide); chunk ``fold`` is held out, the rest is training data. With the
    ten LoCoMo conversations, ``2/2`` trains on conv-26..conv-43 and holds out conv-44..conv-50.

    Raises:
        TrainingDataError: unless ``1 <= fold <= n_folds <= number of conversations``.
    """
    ids = sorted(set(conversation_ids))
    if not 1 <= fold <= n_folds or n_folds > len(ids):
        raise TrainingDataError("fold", f"fold {fold}/{n_folds} impossible with {len(ids)} conversations")
    bounds = np.array_split(np.arange(len(ids)), n_folds)[fold - 1]
    held_out = [ids[i] for i in bounds]
    return [c for c in ids if c not in held_out], held_out


def turn_passages(conversation: Conversation, rendering: Rendering | int = RENDERING_VERSION) -> dict[str, str]:
    """``{turn_id: rendered text}`` of a conversation: the passages the reranker is trained on,
    rendered exactly as the service renders stored turns (:func:`mnemos.rendering.render_turn`)."""
    return {t.turn_id: render_turn(t.role, t.text, t.image_caption, version=rendering) for t in conversation.turns}


def session_texts(conversation: Conversation, text_of: Mapping[str, str]) -> dict[str, frozenset[str]]:
    """``{turn_id: the rendered texts (``text_of``) of every turn of that turn's session}``."""
    members: dict[str, set[str]] = defaultdict(set)
    for t in conversation.turns:
        members[t.session_id].add(text_of[t.turn_id])
    return {t.turn_id: frozenset(members[t.session_id]) for t in conversation.turns}


def locomo_positives(
    conversations: Sequence[Conversation],
    conversation_ids: Iterable[str] | None = None,
    *,
    use_observations: bool = True,
    use_qa: bool = True,
    qa_categories: frozenset[int] | None = frozenset({1, 2, 3, 4}),
    rendering: Rendering | int = RENDERING_VERSION,
) -> list[PositivePair]:
    """Positive pairs from LoCoMo conversations (only those named in ``conversation_ids``).

    Observation facts pair with each turn they cite; questions pair with each evidence turn
    (ids already repaired by ``bench.common.datasets.load_locomo``). By default category-5 questions are
    left out: the data README notes their evidence turns do not answer the question as asked.
    Passages are the turns' renderings (:func:`turn_passages`), as the service indexes them.

    Raises:
        TrainingDataError: if a named conversation is not in ``conversations``.
    """
    by_id = {c.conversation_id: c for c in conversations}
    wanted = list(by_id) if conversation_ids is None else list(conversation_ids)
    missing = [c for c in wanted if c not in by_id]
    if missing:
        raise TrainingDataError("conversations", f"unknown conversation ids {missing}; have {sorted(by_id)}")
    pairs: list[PositivePair] = []
    for conv_id in wanted:
        conv = by_id[conv_id]
        text_of = turn_passages(conv, rendering)
        session = session_texts(conv, text_of)
        if use_observations:
            for fact, turn_id in conv.observations:
                if turn_id in text_of:
                    pairs.append(PositivePair(fact, text_of[turn_id], conv_id, PairSource.OBSERVATION, turn_id,
                                              session=session[turn_id]))
        if use_qa:
            for q in conv.questions:
                if qa_categories is not None and q.category not in qa_categories:
                    continue
                for turn_id in sorted(q.relevant_turn_ids):
                    if turn_id in text_of:
                        pairs.append(PositivePair(q.text, text_of[turn_id], conv_id, PairSource.QA, turn_id,
                                                  session=session[turn_id]))
    return pairs


ABSTENTION_SUFFIX = "_abs"
"""LongMemEval's abstention questions end their id so: their answer is not in the haystack."""


def longmemeval_positives(
    conversations: Sequence[Conversation],
    question_ids: Iterable[str] | None = None,
    *,
    rendering: Rendering | int = RENDERING_VERSION,
    user_names: Mapping[str, str] | None = None,
) -> tuple[list[PositivePair], dict[str, list[str]]]:
    """Positive pairs and mining corpora from LongMemEval items (one question per haystack).

    Each named question (``question_ids``; None = all) pairs with each of its ``has_answer`` turns
    (``relevant_turn_ids`` as ``bench.common.datasets.load_longmemeval`` reads them); the group is the
    question id and its corpus is every rendered turn of its haystack, a session repeated in
    the haystack counted once (the loader keeps it at its first date) and identical texts once.
    Abstention questions (id ending ``_abs``) and questions without an evidence turn give no
    positive and no corpus. Passages are rendered as the service renders stored turns.

    A question in ``user_names`` (``{question_id: first name}``, from
    :func:`bench.training.named_user.assign_names`) is rendered under that name: its haystack's
    ``user`` turns take the name as their speaker and its text's first person is rewritten to it
    (:func:`bench.training.named_user.name_question`), as a LoCoMo question names its speaker.

    Returns:
        ``(positives, corpora)``: positives in item order, evidence turns by id; corpora
        ``{question_id: [rendered turn, ...]}`` for the questions that gave a positive.

    Raises:
        TrainingDataError: if a named question id is not among ``conversations``.
    """
    by_id = {c.conversation_id: c for c in conversations}
    wanted = list(by_id) if question_ids is None else list(dict.fromkeys(question_ids))
    missing = [q for q in wanted if q not in by_id]
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise TrainingDataError("questions", f"unknown LongMemEval question ids: {shown}")
    positives: list[PositivePair] = []
    corpora: dict[str, list[str]] = {}
    for qid in wanted:
        conv = by_id[qid]
        name = (user_names or {}).get(qid)
        text_of = turn_passages(conv, rendering) if name is None else {
            t.turn_id: render_turn(name if t.role == "user" else t.role, t.text, t.image_caption, version=rendering)
            for t in conv.turns}
        session = session_texts(conv, text_of)
        found = False
        for question in conv.questions:
            if qid.endswith(ABSTENTION_SUFFIX):
                continue
            text = question.text if name is None else name_question(question.text, name)
            for turn_id in sorted(question.relevant_turn_ids):
                if turn_id in text_of:
                    positives.append(PositivePair(text, text_of[turn_id], qid, PairSource.LONGMEMEVAL, turn_id,
                                                  session=session[turn_id]))
                    found = True
        if found:
            corpora[qid] = list(dict.fromkeys(text_of.values()))
    return positives, corpora


def question_folds(questions: Sequence[tuple[str, str | None]], n_folds: int, seed: int) -> list[list[str]]:
    """Split question ids into ``n_folds`` folds stratified by question type, seeded.

    ``questions`` holds ``(question_id, question_type)``. Within each type (in sorted type order,
    None last) the ids are sorted, shuffled with ``random.Random(f"{seed}:{type}")`` and dealt
    round-robin, the deal continuing from type to type, so every fold gets its share of every
    type and the fold sizes differ by at most one. Used for cross-fitting on LongMemEval, which
    holds one question per haystack: fold i's model trains on every other fold and ranks fold i.

    Returns:
        ``n_folds`` lists of question ids, each sorted.

    Raises:
        TrainingDataError: unless ``2 <= n_folds <= number of distinct questions``, or an id repeats.
    """
    ids = [q for q, _ in questions]
    if len(set(ids)) != len(ids):
        raise TrainingDataError("questions", "a question id repeats")
    if not 2 <= n_folds <= len(ids):
        raise TrainingDataError("fold", f"{n_folds} folds impossible with {len(ids)} questions")
    by_type: dict[str, list[str]] = defaultdict(list)
    for qid, qtype in questions:
        by_type["\uffff" if qtype is None else qtype].append(qid)
    folds: list[list[str]] = [[] for _ in range(n_folds)]
    dealt = 0
    for qtype in sorted(by_type):
        members = sorted(by_type[qtype])
        random.Random(f"{seed}:{qtype}").shuffle(members)
        for qid in members:
            folds[dealt % n_folds].append(qid)
            dealt += 1
    return [sorted(f) for f in folds]


# --------------------------------------------------------------------------------------------
# mining negatives


class _GroupIndex:
    """BM25 and dense rankings over one group's passages, by the service's own code: BM25 is
    :class:`mnemos.bm25_index.BM25Index` (the query worker's index and tokenizer), dense is the
    exact inner product of the bi-encoder's normalised vectors (what its flat faiss index computes)."""

    def __init__(self, passages: list[str], encoder: TextEncoder | None, use_bm25: bool) -> None:
        self.passages = passages
        self._bm25: BM25Index | None = None
        if use_bm25:
            self._bm25 = BM25Index()
            self._bm25.add(list(range(len(passages))), passages)
        self._vectors = None if encoder is None else np.asarray(encoder.encode(passages), dtype=np.float32)
        self._encoder = encoder

    def bm25(self, queries: list[str], depth: int) -> list[list[int]]:
        if self._bm25 is None:
            return [[] for _ in queries]
        return [[i for i, _ in self._bm25.search(q, min(depth, len(self.passages)))] for q in queries]

    def dense(self, queries: list[str], depth: int) -> list[list[int]]:
        if self._encoder is None or self._vectors is None:
            return [[] for _ in queries]
        q = np.asarray(self._encoder.encode(queries), dtype=np.float32)
        sims = q @ self._vectors.T  # (n_queries, n_passages)
        k = min(depth, len(self.passages))
        top = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        return [[int(i) for i in row] for row in top]


def _interleave(*rankings: list[int]) -> list[int]:
    out: list[int] = []
    for i in range(max((len(r) for r in rankings), default=0)):
        for r in rankings:
            if i < len(r) and r[i] not in out:
                out.append(r[i])
    return out


def _random_negatives(rng: random.Random, others: list[str], speaker: str | None,
                      speaker_of: Mapping[str, str | None], config: MiningConfig) -> list[str]:
    """``config.random_negatives`` passages drawn from ``others``; from those of ``speaker`` (the
    positive's, under ``same_speaker``) first, topped up from the rest when they run out (None: any)."""
    return speaker_first_sample(rng, others, speaker, speaker_of, config.random_negatives)


def mine_examples(
    positives: Sequence[PositivePair],
    *,
    config: MiningConfig = MiningConfig(),
    encoder: TextEncoder | None = None,
    corpora: Mapping[str, Sequence[str]] | None = None,
    scorer: Scorer | None = None,
) -> list[LabelledPair]:
    """Turn positives into labelled pairs: each positive, its hard negatives, its random ones.

    ``corpora`` maps a group to its candidate passages (LoCoMo: every turn text of the
    conversation); groups without an entry use their positives' passages. Dense mining runs only
    when ``encoder`` is given and ``config.use_dense``. Given negatives (JSONL) are kept and
    count toward ``hard_negatives``. A passage that is a positive of the same query (same text)
    is never a negative. Deterministic for a given ``config.seed`` (and ``scorer``).
    ``scorer`` (query, passages) -> logits ranks each query's hard candidates once for
    ``config.model_negatives``.

    Raises:
        TrainingDataError: if ``positives`` is empty, or ``config.model_negatives`` is set without
            a ``scorer``.
    """
    if not positives:
        raise TrainingDataError("positives", "no positive pairs to mine from")
    if config.model_negatives and scorer is None:
        raise TrainingDataError("model_negatives", "model negatives need a trained cross-encoder to rank candidates")
    rng = random.Random(config.seed)
    # seeded apart from rng, so the other negatives are the same with or without evidence negatives
    evidence_rng = random.Random(config.seed + 1)
    evidence_pool = evidence_candidates(positives) if config.evidence_negatives else None
    chitchat_rng = random.Random(config.seed + 2)
    by_group: dict[str, list[int]] = defaultdict(list)
    for i, p in enumerate(positives):
        by_group[p.group].append(i)

    blocks: list[list[LabelledPair]] = []
    for group, members in by_group.items():
        passages = list(dict.fromkeys(corpora[group] if corpora and group in corpora else
                                      [positives[i].passage for i in members]))
        # each passage's speaker, parsed once per group (same_speaker only)
        speaker_of = {x: rendered_speaker(x) for x in passages} if config.same_speaker else {}
        ranks = config.hard_negatives > 0 or config.model_negatives > 0  # both read the hard candidates
        index = _GroupIndex(passages, encoder if config.use_dense else None, config.use_bm25 and ranks)
        queries = list(dict.fromkeys(positives[i].query for i in members))
        bm25 = index.bm25(queries, config.depth) if ranks else [[] for _ in queries]
        dense = index.dense(queries, config.depth) if ranks else [[] for _ in queries]
        gold: dict[str, set[str]] = defaultdict(set)
        for i in members:
            gold[positives[i].query].add(positives[i].passage)
        slot: dict[str, int] = defaultdict(int)
        for q, b, d in zip(queries, bm25, dense, strict=True):
            hard = [passages[j] for j in _interleave(b, d) if passages[j] not in gold[q]]
            asked = [m for m in members if positives[m].query == q]
            by_model = model_order(scorer, q, hard) if scorer is not None and config.model_negatives else []
            # never a model negative: the query's positives and every turn of their sessions
            sessions = gold[q].union(*(positives[m].session for m in asked)) if by_model else gold[q]
            for i in asked:
                p = positives[i]
                chosen = [n for n in p.negatives if n not in gold[q]][: max(config.hard_negatives, len(p.negatives))]
                speaker = rendered_speaker(p.passage) if config.same_speaker else None
                ranked = speaker_first(hard, speaker, speaker_of)
                start = slot[q] * config.hard_negatives
                pool = ranked[start:] + ranked[:start]
                chosen += [n for n in pool if n not in chosen][: max(0, config.hard_negatives - len(chosen))]
                slot[q] += 1
                others = [x for x in passages if x not in gold[q] and x not in chosen]
                chosen += _random_negatives(rng, others, speaker, speaker_of, config)
                if evidence_pool is not None:
                    chosen += evidence_negatives(evidence_rng, evidence_pool, group, gold[q] | set(chosen), speaker,
                                                  config.evidence_negatives)
                chosen += model_negatives(by_model, sessions | set(chosen), speaker, speaker_of, config.model_negatives)
                if config.chitchat_negatives:
                    chosen += chitchat_negatives(chitchat_rng, rendered_speaker(p.passage), gold[q] | set(chosen),
                                                 config.chitchat_negatives)
                blocks.append([LabelledPair(q, p.passage, 1.0)] + [LabelledPair(q, n, 0.0) for n in chosen])
        logger.info("mined group %s: %d positives over %d passages", group, len(members), len(passages))

    if config.max_pairs is not None and sum(map(len, blocks)) > config.max_pairs:
        rng.shuffle(blocks)
        kept, total = [], 0
        for block in blocks:
            if total + len(block) > config.max_pairs:
                continue
            kept.append(block)
            total += len(block)
        blocks = kept
    return [pair for block in blocks for pair in block]


def calibration_pools(
    positives: Sequence[PositivePair],
    corpora: Mapping[str, Sequence[str]],
    *,
    encoder: TextEncoder | None,
    n_queries: int = 200,
    pool_size: int = 30,
    sources: frozenset[PairSource] = frozenset({PairSource.QA, PairSource.LONGMEMEVAL}),
    seed: int = 0,
) -> list[tuple[str, list[str]]]:
    """First-stage pools of sampled training questions, for calibrating the deep pass.

    Up to ``n_queries`` distinct queries of ``sources`` (questions by default: the deep pass acts on
    questions, LoCoMo's or LongMemEval's, not on observation facts) are drawn with a seeded sample;
    each gets the RRF fusion (k = 60) of its BM25 and dense top ``pool_size`` over its group's
    passages, cut to ``pool_size``: the pool the retrieval pipeline would rerank (BM25's alone when
    ``encoder`` is None, e.g. a run mining LongMemEval-S without the bi-encoder). Groups without a
    corpus are skipped.
    """
    queries: dict[tuple[str, str], None] = {}
    for p in positives:
        if p.source in sources and p.group in corpora:
            queries[(p.group, p.query)] = None
    chosen = sorted(queries)
    random.Random(seed).shuffle(chosen)
    chosen = chosen[:n_queries]
    by_group: dict[str, list[str]] = defaultdict(list)
    for group, query in chosen:
        by_group[group].append(query)
    pools: list[tuple[str, list[str]]] = []
    for group, group_queries in by_group.items():
        passages = list(dict.fromkeys(corpora[group]))
        index = _GroupIndex(passages, encoder, use_bm25=True)
        for query, bm25, dense in zip(group_queries, index.bm25(group_queries, pool_size),
                                      index.dense(group_queries, pool_size), strict=True):
            fused = reciprocal_rank_fusion([bm25, dense])[:pool_size]
            pools.append((query, [passages[i] for i, _ in fused]))
    return pools
