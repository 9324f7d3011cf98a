"""The main job's in-process replay: the same requests through the core pipeline, state for state.

The service answers each request against whatever suppression state its suppression worker had
applied so far, and says which: the result's ``suppression_version`` counts the tenant's outcomes
in that state, and the ledger (``applied_outcomes.suppression_version``, migration 0005) gives the
order the worker applied them in. The replay walks one tenant's requests in the order they were
asked; before each one it applies its OWN outcomes (those :func:`mnemos.pipeline.retrieve` produced
here for earlier requests) in the service's order until its state version equals the request's,
then retrieves. The state is rebuilt with the core code the suppression worker runs
(:func:`mnemos.suppression.outcome_deltas`, :class:`~mnemos.suppression.SuppressionTable`,
:class:`~mnemos.suppression.QueryClusters` with the centroids passed through
:meth:`~mnemos.suppression.QueryClusters.from_centroids` as the store round trip does).

Cross-encoder scores come from the service's outcomes, which carry every pool entry's logit
(:class:`ServiceLogits`); a pool entry the service did not score raises :class:`ReplayError`, and
that request, and every later request of its tenant, fails the equality check. The main job
recomputes a seeded sample of those logits with the real model (:func:`recompute_sample`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.common.corpora import Tenant, global_id
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.records import Outcome
from mnemos.rerank import Reranker
from mnemos.suppression import QueryClusters, SuppressionTable, UpdateRule, outcome_deltas

__all__ = ["ReplayError", "ReplayRequest", "Replayed", "ServiceLogits", "SuppressionReplica", "recompute_sample",
           "replay_tenant"]


class ReplayError(Exception):
    """Raised when the replay cannot reproduce what the service did: a pool entry the service did not
    score, an outcome the service applied that the replay never produced, a ledger shorter than a
    recorded version. The message names the request."""


@dataclass(frozen=True)
class ReplayRequest:
    """One request as the service saw it: ``suppression_version`` from its result, ``logits`` the
    rendered text -> cross-encoder logit of every entry of its outcome's pool."""

    request_id: str
    conversation_id: str
    query: str
    suppression_version: int
    logits: Mapping[str, float]


@dataclass(frozen=True)
class Replayed:
    """The replay of one request: hit turn ids (the conversation's own ids, best first), the cluster
    it was assigned, its outcome's pool as ``(turn id, initial rank, final rank)``; or the error."""

    turn_ids: tuple[str, ...] = ()
    cluster: int | None = None
    pool: tuple[tuple[str, int, int], ...] = ()
    error: str | None = None


class ServiceLogits:
    """A :class:`~mnemos.rerank.Reranker` that answers with the logits the service recorded for the
    current request (set :attr:`current` before each retrieval).

    Raises:
        ReplayError: from :meth:`score` when a text has no recorded logit.
    """

    def __init__(self) -> None:
        self.current: ReplayRequest | None = None

    def score(self, query: str, texts: Sequence[str]) -> np.ndarray:
        request = self.current
        if request is None:
            raise ReplayError("no request is being replayed")
        missing = [t for t in texts if t not in request.logits]
        if missing:
            raise ReplayError(f"request {request.request_id}: the replay pooled {len(missing)} entries the service "
                              f"did not score, e.g. {missing[0][:80]!r}")
        return np.asarray([request.logits[t] for t in texts], dtype=np.float32)


@dataclass
class SuppressionReplica:
    """One tenant's suppression state, updated the way the suppression worker updates Postgres.

    ``version`` counts the outcomes applied (the service's ``suppression_version``).
    """

    k: int
    bootstrap_factor: int
    rule: UpdateRule
    eta: float
    table: SuppressionTable = field(default_factory=SuppressionTable)
    version: int = 0

    def __post_init__(self) -> None:
        self.clusters = QueryClusters(k=self.k, bootstrap_factor=self.bootstrap_factor)

    def apply(self, outcome: Outcome) -> None:
        """Deltas of the outcome's own cluster into the table; while not bootstrapped, its query
        embedding into the buffer (k-means and freeze when full); then one version more."""
        self.table.apply(outcome_deltas(outcome, self.rule, self.eta))
        froze = (not self.clusters.frozen and outcome.query_embedding is not None
                 and self.clusters.observe(np.asarray(outcome.query_embedding, dtype=np.float32)))
        if froze:
            assert self.clusters.centroids is not None  # stored as float32 and read back, as the worker does
            self.clusters = QueryClusters.from_centroids(self.clusters.centroids, bootstrap_factor=self.bootstrap_factor)
        self.version += 1

    @property
    def bootstrapped(self) -> bool:
        return self.clusters.frozen


def replay_tenant(tenant: Tenant, requests: Sequence[ReplayRequest], ledger: Sequence[str], *,
                  config: RetrievalConfig, replica: SuppressionReplica, query_vector: Callable[[str], np.ndarray],
                  k: int = 10, suppression: bool = True) -> dict[str, Replayed]:
    """Replay one service tenant's ``requests`` (in the order they were asked) on ``tenant``'s index.

    ``ledger`` lists the tenant's outcome ids in the order the service applied them (version 1
    first); ``query_vector(text)`` embeds a query; ``config`` is the service's retrieval config
    and ``suppression`` its switch. Returns ``{request_id: Replayed}``; after the first error every
    later request of the tenant is marked failed too (the state can no longer be rebuilt).
    """
    reranker = ServiceLogits()
    produced: dict[str, Outcome] = {}
    conversation = tenant.conversations[0]
    out: dict[str, Replayed] = {}
    broken: str | None = None
    for request in requests:
        if broken is not None:
            out[request.request_id] = Replayed(error=f"not replayed: an earlier request failed ({broken})")
            continue
        try:
            while replica.version < request.suppression_version:
                if replica.version >= len(ledger):
                    raise ReplayError(f"request {request.request_id} read suppression version "
                                      f"{request.suppression_version}, the ledger holds {len(ledger)} outcomes")
                outcome_id = ledger[replica.version]
                if outcome_id not in produced:
                    raise ReplayError(f"the service applied outcome {outcome_id} before request "
                                      f"{request.request_id}, but the replay has not produced it")
                replica.apply(produced[outcome_id])
            if replica.version != request.suppression_version:
                raise ReplayError(f"request {request.request_id} read suppression version "
                                  f"{request.suppression_version}, the replay is already at {replica.version}")
            vector = query_vector(request.query)
            cluster = replica.clusters.assign(vector)
            table = replica.table if suppression and cluster is not None else None
            reranker.current = request
            result = retrieve(tenant.index, request.query, vector, k=k, config=config, reranker=reranker,
                              suppression=table, cluster=cluster, outcome_id=request.request_id)
        except ReplayError as exc:
            broken = str(exc)
            out[request.request_id] = Replayed(error=broken)
            continue
        if result.outcome is not None:
            produced[request.request_id] = result.outcome
        local = _local_turn(conversation)
        pool = () if result.outcome is None else tuple(
            (local(tenant.index.entry(p.entry_id).turn_id), p.initial_rank, p.final_rank) for p in result.outcome.pool)
        out[request.request_id] = Replayed(tuple(local(h.turn_id) for h in result.hits), cluster, pool)
    return out


def _local_turn(conversation: str) -> Callable[[str], str]:
    prefix = global_id(conversation, "")

    def local(turn_id: str) -> str:
        return turn_id[len(prefix):] if turn_id.startswith(prefix) else turn_id

    return local


def recompute_sample(pairs: Sequence[tuple[str, str, float]], reranker: Reranker, n: int, seed: int = 0
                     ) -> dict[str, float | int]:
    """Score a seeded sample of ``n`` ``(query, text, recorded logit)`` pairs with ``reranker`` (one call
    per query); returns ``pairs`` (sampled), ``max_abs_difference`` and ``mean_abs_difference``."""
    if not pairs or n <= 0:
        return {"pairs": 0, "max_abs_difference": float("nan"), "mean_abs_difference": float("nan")}
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(len(pairs), size=min(n, len(pairs)), replace=False).tolist())
    by_query: dict[str, list[tuple[str, float]]] = {}
    for i in chosen:
        query, text, logit = pairs[i]
        by_query.setdefault(query, []).append((text, logit))
    differences: list[float] = []
    for query, items in by_query.items():
        scores = np.asarray(reranker.score(query, [t for t, _ in items]), dtype=np.float64)
        differences.extend(abs(float(s) - logit) for s, (_, logit) in zip(scores, items, strict=True))
    return {"pairs": len(differences), "max_abs_difference": max(differences),
            "mean_abs_difference": float(np.mean(differences))}
