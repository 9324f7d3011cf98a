"""The main job's in-process replay reproduces a lagging service request by request, and fails loudly."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bench.common.corpora import CorpusMode, build_tenants, rendered_texts
from bench.service.replay import ReplayRequest, SuppressionReplica, recompute_sample, replay_tenant
from mnemos.encoder import HashingEncoder
from mnemos.pipeline import RetrievalConfig, retrieve
from mnemos.rerank import FakeReranker
from mnemos.suppression import DEFAULT_ETA, QueryClusters, SuppressionTable, UpdateRule, outcome_deltas
from tests.unit.test_bench_synthetic import synthetic_conversations

LAG = 2  # outcomes the "service" has not applied yet when it answers the next request


@pytest.fixture(scope="module")
def service_run():
    """A service simulated with the core: its suppression state trails its answers by LAG outcomes."""
    conversation = synthetic_conversations(1)[0]
    encoder = HashingEncoder(64)
    tenant = build_tenants([conversation], encoder.encode(rendered_texts(conversation.turns)), CorpusMode.PER_TENANT,
                           dim=64)[conversation.conversation_id]
    config = RetrievalConfig()
    reranker = FakeReranker()
    table, clusters = SuppressionTable(), QueryClusters(k=2, bootstrap_factor=2)
    rng = np.random.default_rng(3)
    pending, ledger, requests, answers = [], [], [], {}
    for i in range(30):
        while len(pending) > LAG:
            outcome = pending.pop(0)
            table.apply(outcome_deltas(outcome, UpdateRule.RANK_GAP, DEFAULT_ETA))
            if not clusters.frozen and clusters.observe(np.asarray(outcome.query_embedding, dtype=np.float32)):
                clusters = QueryClusters.from_centroids(clusters.centroids)
            ledger.append(outcome.outcome_id)
        question = conversation.questions[int(rng.integers(8))]
        vector = encoder.encode([question.text])[0]
        cluster = clusters.assign(vector)
        result = retrieve(tenant.index, question.text, vector, k=10, config=config, reranker=reranker,
                          suppression=table if cluster is not None else None, cluster=cluster, outcome_id=f"r{i}")
        logits = {tenant.index.rendered(p.entry_id): p.rerank_score for p in result.outcome.pool}
        requests.append(ReplayRequest(f"r{i}", conversation.conversation_id, question.text, len(ledger), logits))
        answers[f"r{i}"] = (tuple(h.turn_id.split("/", 1)[1] for h in result.hits), cluster)
        pending.append(result.outcome)
    assert len(table) > 0  # suppression was learned and applied along the way
    return tenant, encoder, config, requests, ledger, answers


def _replay(service_run, requests=None, ledger=None):
    tenant, encoder, config, recorded, recorded_ledger, _ = service_run
    replica = SuppressionReplica(2, 2, UpdateRule.RANK_GAP, DEFAULT_ETA)
    out = replay_tenant(tenant, recorded if requests is None else requests,
                        recorded_ledger if ledger is None else ledger, config=config, replica=replica,
                        query_vector=lambda text: encoder.encode([text])[0])
    return out, replica


def test_the_replay_reproduces_every_request_at_its_recorded_state(service_run) -> None:
    *_, answers = service_run
    out, replica = _replay(service_run)
    assert all(r.error is None for r in out.values())
    assert {key: (r.turn_ids, r.cluster) for key, r in out.items()} == answers
    assert replica.bootstrapped and any(cluster is not None for _, cluster in answers.values())
    assert replica.version == service_run[3][-1].suppression_version


def test_a_pool_entry_the_service_did_not_score_fails_that_request_and_the_rest(service_run) -> None:
    requests = list(service_run[3])
    victim = requests[5]
    requests[5] = dataclasses.replace(victim, logits=dict(list(victim.logits.items())[1:]))
    out, _ = _replay(service_run, requests=requests)
    assert all(out[f"r{i}"].error is None for i in range(5))
    assert "did not score" in out["r5"].error
    assert all("earlier request failed" in out[f"r{i}"].error for i in range(6, 30))


def test_an_outcome_the_replay_never_produced_fails(service_run) -> None:
    ledger = ["somebody-else", *service_run[4][1:]]
    out, _ = _replay(service_run, ledger=ledger)
    first = next(r for r in service_run[3] if r.suppression_version > 0)
    assert "has not produced it" in out[first.request_id].error


def test_recompute_sample_reports_the_largest_difference() -> None:
    reranker = FakeReranker()
    exact = [("cat names", text, float(reranker.score("cat names", [text])[0])) for text in ("the cat", "names", "x")]
    assert recompute_sample(exact, reranker, 10)["max_abs_difference"] == 0.0
    off = [*exact[:2], ("cat names", "x", exact[2][2] + 0.25)]
    check = recompute_sample(off, reranker, 3, seed=1)
    assert check["pairs"] == 3 and check["max_abs_difference"] == pytest.approx(0.25)
    assert recompute_sample([], reranker, 3)["pairs"] == 0
