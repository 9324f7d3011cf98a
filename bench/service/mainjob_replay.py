"""The main job's in-process replay (step 5 of :mod:`bench.service.mainjob`): every request the service
answered, replayed through the core pipeline on the embeddings the ingest worker stored, at the
suppression state version the service recorded for it, with the cross-encoder logits of the
service's outcomes; then a seeded sample of those logits rescored by the real model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import click
import numpy as np

from bench.service.replay import Replayed, ReplayRequest, SuppressionReplica, recompute_sample, replay_tenant

if TYPE_CHECKING:
    from bench.service.records import ServiceRecord, TenantPlan

__all__ = ["ReplayRecord", "replay_in_process", "stored_vectors"]


@dataclass
class ReplayRecord:
    """The in-process replay of every request (:mod:`bench.service.replay`) and what was checked on the way."""

    replayed: dict[str, Replayed]
    canonical: dict[str, dict[str, str]]  # per service tenant: turn id -> turn id of its canonical entry
    centroid_max_abs_difference: dict[str, float | None]
    logit_check: dict[str, float | int]


def stored_vectors(record: ServiceRecord, plan: TenantPlan) -> np.ndarray:
    """``(turns, dim)`` float32: the embedding the ingest worker stored for each turn of the plan's
    conversation, in turn order.

    The replay indexes these rather than embedding the texts again: a bi-encoder computing in bf16
    gives a text a vector that depends slightly on the batch it was encoded with (about 1e-3 per
    component), so an in-process embedding would test the encoder's batch invariance, not the
    pipeline. Queries are still embedded in process, one at a time, as the query worker does.

    Raises:
        click.ClickException: if a turn of the conversation was not stored.
    """
    stored = record.embeddings[plan.tenant_id]
    missing = [t.turn_id for t in plan.conversation.turns if t.turn_id not in stored]
    if missing:
        raise click.ClickException(f"tenant {plan.tenant_id}: {len(missing)} turns were not stored, e.g. {missing[0]}")
    return np.stack([stored[t.turn_id] for t in plan.conversation.turns]).astype(np.float32)


def replay_in_process(record: ServiceRecord, *, sample_pairs: int, seed: int) -> ReplayRecord:
    """Replay the record's requests in process (the turns' stored embeddings, the same query encoder,
    index build, pipeline and suppression code), then recompute ``sample_pairs`` of the service's
    logits with the real model."""
    from bench.common.corpora import CorpusMode, build_tenants
    from bench.service.records import progress_bar  # the phases' bars
    from mnemos.rendering import render_turn
    from mnemos.suppression import UpdateRule
    from workers.query.config import retrieval_config
    from workers.runtime.models import load_encoder, load_reranker, load_truncation_counter

    settings = record.settings
    encoder = load_encoder(settings)
    window = load_truncation_counter(settings)  # dedupe reads what the encoder cut, as the ingest worker
    rendered = {p.conversation.conversation_id: {t.turn_id: render_turn(t.role, t.text, t.image_caption)
                                                 for t in p.conversation.turns} for p in record.plans}
    vectors: dict[str, np.ndarray] = {}

    def query_vector(text: str) -> np.ndarray:
        if text not in vectors:
            vectors[text] = encoder.encode([text])[0]
        return vectors[text]

    config = retrieval_config(settings, rerank=True)
    pairs: list[tuple[str, str, float]] = []
    replayed: dict[str, Replayed] = {}
    centroids: dict[str, float | None] = {}
    canonical: dict[str, dict[str, str]] = {}  # per tenant: turn id -> the turn id of its canonical entry
    with progress_bar(len(record.asked), "in-process replay", "q") as bar:
        for plan in record.plans:
            conversation = plan.conversation.conversation_id
            tenant = build_tenants([plan.conversation], stored_vectors(record, plan), CorpusMode.PER_TENANT,
                                   dim=encoder.dim, dedupe_threshold=settings.dedupe_threshold,
                                   unread_of=window.unread)[conversation]
            prefix = len(conversation) + 1
            canonical[plan.tenant_id] = {gid[prefix:]: tenant.index.entry(eid).turn_id[prefix:]
                                         for gid, eid in tenant.canonical.items()}
            requests = []
            for asked in (a for a in record.asked if a.tenant_id == plan.tenant_id):
                outcome = record.outcomes.get(asked.result.request_id)
                logits: dict[str, float] = {}
                for row in outcome.pool if outcome is not None else ():
                    text = rendered[conversation][record.entry_turns[plan.tenant_id][row.entry_id]]
                    logits[text] = row.rerank_score
                    pairs.append((asked.question.text, text, row.rerank_score))
                if asked.result.suppression_version is None:
                    raise click.ClickException("the query worker reports no suppression_version (migration 0005)")
                requests.append(ReplayRequest(asked.result.request_id, conversation, asked.question.text,
                                              asked.result.suppression_version, logits))
            replica = SuppressionReplica(settings.clusters_k, settings.bootstrap_factor,
                                         UpdateRule(settings.update_rule), settings.eta)
            replayed.update(replay_tenant(tenant, requests, record.ledgers[plan.tenant_id],
                                          config=config, replica=replica, query_vector=query_vector,
                                          suppression=settings.suppression))
            service_centroids = record.centroids[plan.tenant_id]
            ours = replica.clusters.centroids
            centroids[plan.tenant_id] = (float(np.max(np.abs(service_centroids - ours)))
                                         if service_centroids is not None and ours is not None
                                         and service_centroids.shape == ours.shape else None)
            bar.update(len(requests))
    reranker = load_reranker(settings)
    assert reranker is not None
    check = recompute_sample(pairs, reranker, sample_pairs, seed)
    return ReplayRecord(replayed, canonical, centroids, {**check, "pairs_recorded": len(pairs)})
