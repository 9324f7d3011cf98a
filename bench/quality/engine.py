"""The benchmark engine: retrievals of every arm over shared embeddings, indexes and rerankers.

Protocol (§4 of *Clustered Retrieval-Induced Forgetting*, adapted; docs/architecture.md "Evaluation"; the choices are recorded in
the JSON under ``settings``):

* Non-suppression arms have no state, so one pass per corpus mode serves both protocols.
* Suppression arms keep a :class:`~mnemos.suppression.SuppressionTable` and
  :class:`~mnemos.suppression.QueryClusters` per tenant. A burn-in replays queries drawn with
  replacement (``burnin_factor x`` the burn-in set's size), applying each outcome's deltas;
  the state is then frozen and the evaluation questions are retrieved against it.

  - ``transductive`` (the paper's): burn-in drawn from the tenant's own evaluation questions.
  - ``heldout``: each tenant's questions are split in two halves by a seeded shuffle (per
    conversation, so the pooled tenant is split the same way); burn-in on half A evaluates half
    B and vice versa, so no question is ever scored by state it contributed to.

  All suppression arms of one (mode, protocol, tenant, half) replay the same query sequence.
* Clusters: *Clustered Retrieval-Induced Forgetting* (§5.2) uses K = 30 for 500 evaluation queries (about 17 queries per cluster) and
  bootstraps on the first 10 x K queries. A LoCoMo conversation has 105-260 questions, so a
  per-tenant K of 30 would leave 2-8 distinct questions per cluster. We keep the paper's ratio:
  ``K = min(clusters, max(2, distinct burn-in questions // queries_per_cluster))`` (pooled: 30),
  and bootstrap on the first 10 x K burn-in draws. Global RIF is K = 1.
* Rerankers: each question is reranked by the fold model whose training conversations exclude
  the question's conversation (:class:`~bench.common.folds.FoldRerankers`); every (query, text) pair is scored once
  per run (:class:`~mnemos.rerank.CachedReranker`) and persisted (:mod:`bench.common.caches`).
* ``mnemos_full``: selected on a development half of the questions (seeded, per conversation)
  under the held-out protocol; see :mod:`bench.quality.selection`. ``bench.quality.run`` orchestrates.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

import numpy as np

from bench.common.corpora import CorpusMode, Tenant, build_tenants, rendered_texts, unread_of
from bench.common.datasets import Conversation
from bench.common.folds import FoldRerankers, RerankerFold
from bench.common.questions import BenchQuestion, prepare_questions, stable_seed
from bench.quality.arms import Arm
from bench.quality.question_metrics import RECALL_DEPTH, QuestionMetrics, question_metrics
from mnemos.encoder import Encoder
from mnemos.features import (
    Feature,
    FeatureSetting,
    PoolView,
    QueryContext,
    apply_features,
    parse_time_expressions,
    retriever_ranks,
    retriever_scores,
)
from mnemos.fusion import Fusion
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rendering import RENDERING_VERSION, Rendering
from mnemos.suppression import QueryClusters, SuppressionTable, outcome_deltas

__all__ = [
    "BenchQuestion",
    "Engine",
    "FoldRerankers",
    "PoolResult",
    "Protocol",
    "QuestionMetrics",
    "RerankerFold",
    "RunKey",
    "StateRecord",
    "prepare_questions",
    "stable_seed",
]

logger = logging.getLogger(__name__)

class Protocol(StrEnum):
    """How suppression state is built before evaluation (module docstring)."""

    HELDOUT = "heldout"
    TRANSDUCTIVE = "transductive"


@dataclass(frozen=True)
class PoolResult:
    """One retrieval: hit entry ids best first (at most the pool), their scores, diagnostics."""

    entry_ids: tuple[int, ...]
    scores: tuple[float, ...]
    deep_pass: bool
    top_score: float | None
    initial_ranks: tuple[int, ...] = ()  # per hit: its suppressed fused rank (the outcome's), when reranked
    bm25_ranks: tuple[int, ...] = ()  # per hit: its rank in BM25's shallow candidates (mnemos.features.retriever_ranks)
    bm25_scores: tuple[float, ...] = ()  # per hit: its BM25 score there (mnemos.features.retriever_scores)


@dataclass(frozen=True)
class StateRecord:
    """How the suppression state that evaluated some questions was built.

    ``burn_keys`` are the question keys drawn during its burn-in (the only questions whose
    queries touched the state), ``k`` the number of clusters, ``bootstrapped`` whether the
    cluster bootstrap completed, ``suppressed`` the number of (entry, cluster) scores held,
    ``entries_touched`` the distinct entries with any score out of ``tenant_entries`` (§5.4 of
    *Clustered Retrieval-Induced Forgetting* reads this as saturation: 4% of LongMemEval's corpus, about 70% of NFCorpus).
    """

    tenant_id: str
    half: int | None
    burn_keys: frozenset[str]
    evaluated: frozenset[str]
    steps: int
    k: int
    bootstrapped: bool
    suppressed: int
    entries_touched: int = 0
    tenant_entries: int = 0


@dataclass(frozen=True)
class RunKey:
    """A retrieval run: corpus mode, protocol (None for stateless arms) and retrieval variant."""

    mode: CorpusMode
    protocol: Protocol | None
    variant: str


@dataclass
class Engine:
    """Runs retrievals for every corpus mode over shared embeddings and rerankers.

    Args:
        conversations: the dataset.
        questions: from :func:`prepare_questions` (same conversations).
        encoder: bi-encoder (e.g. a :class:`~bench.common.caches.PersistentEncoder`).
        rerankers: fold selection; its rerankers should be :class:`~mnemos.rerank.CachedReranker`.
        modes: corpus modes to build.
        burnin_factor / clusters / queries_per_cluster / bootstrap_factor / seed: see module doc.
        dedupe_threshold: cosine for write-time dedupe (None: off).
        dedupe_guard: dedupe only turns with equal speaker and distinguishing tokens (the default,
            as the service); False dedupes on cosine alone (the "dedupe guard off" ablation).
        rendering: what the models see of a turn (:mod:`mnemos.rendering`; ablations turn it off).
        reranked_fusion: ``(fusion, convex weight)`` every reranking arm fuses its first stage with
            instead of its own (None: each arm's own, reciprocal rank fusion); arms without a reranker
            keep theirs. The ``fusion_convex`` variant sets it (docs/reranker.md "Convex fusion under
            the cross-encoder").
        progress: ``progress(total, description)`` returns an ``advance(n)`` callable and a
            ``close()`` callable (tqdm in the CLI, no-op in tests).
    """

    conversations: Sequence[Conversation]
    questions: Sequence[BenchQuestion]
    encoder: Encoder
    rerankers: FoldRerankers | None
    modes: Sequence[CorpusMode]
    burnin_factor: float = 5.0
    clusters: int = 30
    queries_per_cluster: int = 17
    bootstrap_factor: int = 10
    seed: int = 0
    dedupe_threshold: float | None = 0.95
    dedupe_guard: bool = True
    rendering: Rendering = RENDERING_VERSION
    reranked_fusion: tuple[Fusion, float] | None = None
    progress: Callable[[int, str], tuple[Callable[[int], None], Callable[[], None]]] | None = None
    tenants: dict[CorpusMode, dict[str, Tenant]] = field(default_factory=dict)
    states: dict[RunKey, list[StateRecord]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    retrievals: int = 0

    def __post_init__(self) -> None:
        started = time.perf_counter()
        texts = rendered_texts([t for c in self.conversations for t in c.turns], self.rendering)
        vectors = self.encoder.encode(texts + [q.text for q in self.questions])
        self.turn_vectors = vectors[: len(texts)]
        self.question_vectors = vectors[len(texts) :]
        self.seconds["embed"] = time.perf_counter() - started
        started = time.perf_counter()
        for mode in self.modes:
            self.tenants[mode] = build_tenants(
                self.conversations, self.turn_vectors, mode, dim=self.encoder.dim, dedupe_threshold=self.dedupe_threshold,
                rendering=self.rendering, dedupe_guard=self.dedupe_guard, unread_of=unread_of(self.encoder),
            )
            for tenant in self.tenants[mode].values():
                tenant.question_keys = [q.key for q in self.questions if q.conversation_id in tenant.conversations]
        self.seconds["index"] = time.perf_counter() - started
        self._by_key = {q.key: q for q in self.questions}
        self._runs: dict[RunKey, dict[str, PoolResult]] = {}
        self._session_rankings: dict[tuple[CorpusMode, str], tuple[str, ...]] = {}

    # ---- helpers ---------------------------------------------------------------------------

    def tenant_of(self, mode: CorpusMode, question: BenchQuestion) -> Tenant:
        """The tenant holding ``question``'s conversation in ``mode``."""
        tenants = self.tenants[mode]
        return tenants["pooled"] if mode is CorpusMode.POOLED else tenants[question.conversation_id]

    def _bar(self, total: int, description: str) -> tuple[Callable[[int], None], Callable[[], None]]:
        if self.progress is None:
            return (lambda n: None), (lambda: None)
        return self.progress(total, description)

    def _fused_as_asked(self, config: RetrievalConfig) -> RetrievalConfig:
        """``config`` with :attr:`reranked_fusion` when it reranks and one is set, else itself."""
        if self.reranked_fusion is None or not config.rerank:
            return config
        fusion, weight = self.reranked_fusion
        return dataclasses.replace(config, fusion=fusion, convex_weight=weight)

    def _retrieve(
        self, tenant: Tenant, question: BenchQuestion, config: RetrievalConfig, *,
        table: SuppressionTable | None = None, cluster: int | None = None, outcome_id: str = "",
    ):
        reranker = None
        config = self._fused_as_asked(config)
        if config.rerank:
            if self.rerankers is None:
                raise ValueError("a reranking arm needs rerankers")
            reranker = self.rerankers.for_conversation(question.conversation_id)
            if config.deep_threshold is not None:  # each fold's own calibrated threshold
                config = dataclasses.replace(config, deep_threshold=self.rerankers.deep_threshold_for(
                    question.conversation_id, config.deep_threshold))
        depth = max(RECALL_DEPTH, config.deep_pool_size if config.deep_enabled else config.pool_size)
        self.retrievals += 1
        return retrieve(
            tenant.index, question.text, self.question_vectors[question.row], k=depth, config=config,
            reranker=reranker, suppression=table, cluster=cluster, outcome_id=outcome_id,
        )

    @staticmethod
    def _pool(result, config: RetrievalConfig) -> PoolResult:
        """The bench's record of one retrieval; BM25 ranks and scores are cut as the pipeline's features cut them."""
        initial = {e.entry_id: e.initial_rank for e in result.outcome.pool} if result.outcome is not None else {}
        hit_ids = tuple(h.entry_id for h in result.hits)
        bm25 = result.candidates.bm25 if result.candidates is not None else ()
        return PoolResult(
            entry_ids=hit_ids,
            scores=tuple(float(h.score) for h in result.hits),
            deep_pass=bool(result.deep_pass),
            top_score=result.top_rerank_score,
            initial_ranks=tuple(initial.get(eid, 0) for eid in hit_ids) if initial else (),
            bm25_ranks=tuple(int(r) for r in retriever_ranks(hit_ids, bm25, config.n_candidates)) if initial else (),
            bm25_scores=tuple(float(v) for v in retriever_scores(hit_ids, bm25, config.n_candidates)) if initial else (),
        )

    # ---- stateless arms ----------------------------------------------------------------------

    def run_plain(self, mode: CorpusMode, arm: Arm) -> dict[str, PoolResult]:
        """One retrieval per question with no suppression state (cached per mode and arm)."""
        key = RunKey(mode, None, arm.name)
        if key not in self._runs:
            advance, close = self._bar(len(self.questions), f"{mode.value} {arm.name}")
            out = {}
            for q in self.questions:
                out[q.key] = self._pool(self._retrieve(self.tenant_of(mode, q), q, arm.config), arm.config)
                advance(1)
            close()
            self._runs[key] = out
        return self._runs[key]

    def _score_union(self, question: BenchQuestion, texts: dict[str, None]) -> int:
        """One rerank call for ``texts`` (shortest first, so batches pad little); returns the count."""
        if self.rerankers is None or not texts:
            return 0
        ordered = sorted(texts, key=len)
        self.rerankers.for_conversation(question.conversation_id).score(question.text, ordered)
        return len(ordered)

    def _fused_texts(self, question: BenchQuestion, configs: Sequence[RetrievalConfig], depth: int) -> dict[str, None]:
        texts: dict[str, None] = {}
        for mode in self.modes:
            tenant = self.tenant_of(mode, question)
            for config in configs:
                result = retrieve(tenant.index, question.text, self.question_vectors[question.row], k=depth,
                                  config=config)
                texts.update((tenant.index.rendered(h.entry_id), None) for h in result.hits)
        return texts

    def prewarm(self, configs: Iterable[RetrievalConfig]) -> int:
        """Score, per question, every fused candidate of ``configs`` (each retriever's top
        ``n_candidates``, the set any suppressed pool is cut from) over all modes in one reranker
        call, so later arms read the cache instead of scoring a few pairs per call. Returns the
        number of texts requested."""
        if self.rerankers is None:
            return 0
        fused = [dataclasses.replace(self._fused_as_asked(c), rerank=False, suppression=False, deep_threshold=None)
                 for c in configs]
        depth = max(c.n_candidates * (int(c.use_bm25) + int(c.use_dense)) for c in fused)
        advance, close = self._bar(len(self.questions), "rerank pools (each pair once)")
        requested = 0
        for q in self.questions:
            requested += self._score_union(q, self._fused_texts(q, fused, depth))
            advance(1)
        close()
        return requested

    def prewarm_deep(self, shallow: RetrievalConfig, deep_pool_size: int, threshold: float) -> int:
        """Like :meth:`prewarm` for the deep pass: questions whose unsuppressed ``shallow`` pool tops
        out below the threshold (the fold's calibrated one, else ``threshold``) in some mode get their
        deep candidates (fused top ``deep_pool_size`` of both retrievers read that deep) scored in one
        call. Call after :meth:`prewarm`."""
        if self.rerankers is None:
            return 0
        deep = dataclasses.replace(self._fused_as_asked(shallow), rerank=False, suppression=False, deep_threshold=None,
                                   n_candidates=deep_pool_size, pool_size=deep_pool_size)
        advance, close = self._bar(len(self.questions), "rerank deep-pass pools")
        requested = 0
        for q in self.questions:
            tops = [self._retrieve(self.tenant_of(m, q), q, shallow).top_rerank_score for m in self.modes]
            cut = self.rerankers.deep_threshold_for(q.conversation_id, threshold)
            if any(t is not None and t < cut for t in tops):
                requested += self._score_union(q, self._fused_texts(q, [deep], deep_pool_size))
            advance(1)
        close()
        return requested

    # ---- suppression arms --------------------------------------------------------------------

    def cluster_count(self, arm: Arm, distinct_burn_questions: int) -> int:
        """K for one burn-in (module docstring): 1 for global RIF, else the paper's ratio."""
        assert arm.suppression is not None
        if not arm.suppression.clustered:
            return 1
        return max(1, min(self.clusters, distinct_burn_questions, max(2, distinct_burn_questions // self.queries_per_cluster)))

    def _burn_and_evaluate(
        self, mode: CorpusMode, protocol: Protocol, arm: Arm, tenant: Tenant,
        burn: Sequence[BenchQuestion], evaluate: Sequence[BenchQuestion], half: int | None,
        advance: Callable[[int], None],
    ) -> tuple[dict[str, PoolResult], StateRecord]:
        assert arm.suppression is not None
        k = self.cluster_count(arm, len(burn))
        table = SuppressionTable()
        clusters = QueryClusters(k=k, bootstrap_factor=self.bootstrap_factor, seed=self.seed)
        rng = np.random.default_rng(stable_seed(self.seed, "burn", mode.value, protocol.value, tenant.tenant_id, half or 0))
        steps = round(self.burnin_factor * len(burn)) if burn else 0
        drawn: set[str] = set()
        for step in range(steps):
            q = burn[int(rng.integers(len(burn)))]
            drawn.add(q.key)
            vector = self.question_vectors[q.row]
            cluster = clusters.assign(vector)
            result = self._retrieve(
                tenant, q, arm.config, table=table, cluster=cluster, outcome_id=f"{tenant.tenant_id}/{half}/{step}"
            )
            clusters.observe(vector)
            if cluster is not None and result.outcome is not None:
                table.apply(outcome_deltas(result.outcome, arm.suppression.rule, arm.suppression.eta))
            advance(1)
        out = {}
        for q in evaluate:
            cluster = clusters.assign(self.question_vectors[q.row])
            out[q.key] = self._pool(self._retrieve(tenant, q, arm.config, table=table, cluster=cluster), arm.config)
            advance(1)
        record = StateRecord(
            tenant_id=tenant.tenant_id, half=half, burn_keys=frozenset(drawn),
            evaluated=frozenset(q.key for q in evaluate), steps=steps, k=k,
            bootstrapped=clusters.frozen, suppressed=len(table),
            entries_touched=len({entry for entry, _ in table}), tenant_entries=len(tenant.index),
        )
        return out, record

    def run_suppressed(self, mode: CorpusMode, protocol: Protocol, arm: Arm, variant: str | None = None
                       ) -> dict[str, PoolResult]:
        """Burn-in then frozen evaluation, per tenant, under ``protocol`` (cached per variant)."""
        key = RunKey(mode, protocol, variant or arm.name)
        if key in self._runs:
            return self._runs[key]
        plan = []
        for tenant in self.tenants[mode].values():
            members = [self._by_key[k] for k in tenant.question_keys]
            if protocol is Protocol.TRANSDUCTIVE:
                plan.append((tenant, members, members, None))
            else:
                halves = [[q for q in members if q.half == h] for h in (0, 1)]
                plan.append((tenant, halves[0], halves[1], 0))
                plan.append((tenant, halves[1], halves[0], 1))
        total = sum(round(self.burnin_factor * len(b)) + len(e) for _, b, e, _ in plan)
        advance, close = self._bar(total, f"{mode.value} {protocol.value} {key.variant}")
        out: dict[str, PoolResult] = {}
        records = []
        for tenant, burn, evaluate, half in plan:
            results, record = self._burn_and_evaluate(mode, protocol, arm, tenant, burn, evaluate, half, advance)
            out.update(results)
            records.append(record)
        close()
        self._runs[key] = out
        self.states[key] = records
        return out

    # ---- features and metrics ----------------------------------------------------------------

    def context(self, mode: CorpusMode, question: BenchQuestion, *, sessions: bool) -> QueryContext:
        """Session ranking (only when ``sessions``; cached) and time spans of ``question``."""
        ranking: tuple[str, ...] = ()
        if sessions:
            cache_key = (mode, question.key)
            if cache_key not in self._session_rankings:
                tenant = self.tenant_of(mode, question)
                self._session_rankings[cache_key] = tenant.sessions.rank(
                    question.text, self.question_vectors[question.row]
                )
            ranking = self._session_rankings[cache_key]
        return QueryContext(session_ranking=ranking, time_spans=parse_time_expressions(question.text, question.question_date))

    def reorder(self, mode: CorpusMode, question: BenchQuestion, pool: PoolResult,
                settings: Sequence[FeatureSetting]) -> tuple[int, ...]:
        """``pool``'s entry ids after the post-rerank features (unchanged with no settings).

        Session dates are the session's start (:meth:`mnemos.sessions.SessionIndex.date`), as
        in the service's pipeline.
        """
        if not settings or not pool.entry_ids:
            return pool.entry_ids
        tenant = self.tenant_of(mode, question)
        sessions = tuple(tenant.entry_session[e] for e in pool.entry_ids)
        view = PoolView(
            scores=np.asarray(pool.scores, dtype=np.float64),
            sessions=sessions,
            session_dates=tuple(tenant.sessions.date(s) for s in sessions),
            embeddings=self.turn_vectors[list(pool.entry_ids)],
            initial_ranks=np.asarray(pool.initial_ranks, dtype=np.int64),
            bm25_ranks=np.asarray(pool.bm25_ranks, dtype=np.int64),
            bm25_scores=np.asarray(pool.bm25_scores, dtype=np.float64),
        )
        needs_sessions = any(s.feature is Feature.SESSION for s in settings)
        order = apply_features(view, self.context(mode, question, sessions=needs_sessions), settings)
        return tuple(pool.entry_ids[i] for i in order)

    def metrics(self, mode: CorpusMode, question: BenchQuestion, ranking: Sequence[int], pool: PoolResult,
                abstain_threshold: float | None, reranked: bool) -> QuestionMetrics:
        """Metrics of one labelled question's final ranking (§5.1 and §5.3 of *Clustered Retrieval-Induced Forgetting*)."""
        top_score = None
        if reranked and ranking:
            top_score = pool.scores[pool.entry_ids.index(ranking[0])]
        return question_metrics(self.tenant_of(mode, question), question.relevant_turns, ranking, top_score=top_score,
                                deep_pass=pool.deep_pass, abstain_threshold=abstain_threshold, reranked=reranked)

    def evaluate(self, mode: CorpusMode, results: Mapping[str, PoolResult], *, reranked: bool,
                 settings: Sequence[FeatureSetting] = (), abstain_threshold: float | None = 0.0,
                 keys: Iterable[str] | None = None) -> dict[str, QuestionMetrics]:
        """Metrics of every labelled question in ``results`` (or only ``keys``), after ``settings``."""
        wanted = results.keys() if keys is None else keys
        out = {}
        for key in wanted:
            question = self._by_key[key]
            if not question.labelled or key not in results:
                continue
            pool = results[key]
            ranking = self.reorder(mode, question, pool, settings)
            out[key] = self.metrics(mode, question, ranking, pool, abstain_threshold, reranked)
        return out

    def question(self, key: str) -> BenchQuestion:
        """The question with ``key``."""
        return self._by_key[key]
