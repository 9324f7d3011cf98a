"""Promise 3 under request filters: a filter can never name another tenant's turn into a result.

Tenants alpha and beta store identical texts under identical session ids and roles; beta also has
sessions alpha never used (one of them also deduplicates a text alpha has). Alpha asks with
session, role, ``occurred_after`` and ``as_of`` filters that name beta's sessions (alone or next to
its own) and with deduplication-heavy filters, directly and through the rq job path. Every hit
and every outcome pool row must be alpha's, a filter naming only beta's sessions gets nothing
and sends no outcome, and beta's memory version does not move.
"""

from __future__ import annotations

import itertools

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer

from api.schemas import Outcome, RetrievalRequest
from mnemos.rerank import FakeReranker
from tests.badinput import harness
from tests.support import JOB_TTLS
from workers.query.worker import build_worker
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

SHARED = [("s1", "user", "I really like coffee in the morning"), ("s1", "assistant", "my sister Ana lives in Lisbon"),
          ("s2", "user", "the spare key is under the mat"), ("s2", "assistant", "we adopted a grey cat named Pixel")]
BETA_ONLY = [("beta-secret", "user", "beta keeps a secret diary about volcanoes"),
             ("beta-secret", "narrator", "the spare key is under the mat"),  # a duplicate of alpha's text too
             ("beta-late", "user", "beta flew a zeppelin over Reykjavik")]
QUERIES = ["coffee", "spare key mat", "volcanoes secret diary", "zeppelin Reykjavik", "grey cat Pixel"]
FILTERS = [  # (filters, names only what alpha never used)
    ({"session_ids": ["beta-secret"]}, True),
    ({"session_ids": ["beta-secret", "beta-late"]}, True),
    ({"session_ids": ["s2", "beta-secret"]}, False),
    ({"session_ids": ["s1"]}, False),
    ({"roles": ["narrator"]}, True),
    ({"roles": ["narrator", "assistant"]}, False),
    ({"session_ids": ["beta-late"], "occurred_after": "2024-03-01T09:00:00Z"}, True),
]
AS_OFS = [None, "2024-03-01T09:02:00Z", "2030-01-01T00:00:00Z"]


def ingest(settings: Settings, connection: redis.Redis, store: PostgresStore, tenant: str, rows: list[tuple]) -> None:
    have = len(harness.turn_ids(store, tenant))
    harness.publish(settings, connection,
                    [harness.turn(tenant, f"{tenant}{have + i}", text, session=session, role=role, minutes=have + i)
                     for i, (session, role, text) in enumerate(rows)])
    worker = harness.ingest_worker(settings, connection, store)
    assert harness.run_loop_until(worker, lambda: len(harness.turn_ids(store, tenant)) >= have + len(rows))


def _ids(store: PostgresStore, tenant: str) -> set[int]:
    return {int(r[0]) for r in harness.entries(store, tenant)}


def _version(store: PostgresStore, tenant: str) -> list:
    with store.tenant_tx(tenant) as conn:
        return conn.execute("SELECT memory_version FROM tenants").fetchall()


def test_filters_naming_beta_never_reach_beta(settings, redis_client, store) -> None:
    ingest(settings, redis_client, store, "alpha", SHARED)
    ingest(settings, redis_client, store, "beta", SHARED + BETA_ONLY)
    alpha, beta = _ids(store, "alpha"), _ids(store, "beta")
    assert alpha and beta and not alpha & beta
    beta_version = _version(store, "beta")
    service = harness.query_service(settings, redis_client, store, FakeReranker())
    service.answer(RetrievalRequest("beta", "warm up beta's cached index", k=3))  # both tenants cached in one worker
    n_outcomes = redis_client.xlen(settings.outcomes_stream)

    for q, (f, beta_only), as_of in itertools.product(QUERIES, FILTERS, AS_OFS):
        payload = {"v": 1, "tenant_id": "alpha", "query": q, "k": 10, "filters": f,
                   **({} if as_of is None else {"as_of": as_of})}
        result = service.answer(RetrievalRequest.parse(payload))
        got = {h.entry_id for h in result.hits}
        assert got <= alpha, f"{payload}: {got - alpha} are beta's entries"
        if beta_only:
            assert result.hits == () and result.pool_size == 0, payload
    for _, fields in redis_client.xrange(settings.outcomes_stream)[n_outcomes:]:
        outcome = Outcome.from_stream_fields(fields)
        assert outcome.tenant_id == "alpha" and {p.entry_id for p in outcome.pool} <= alpha

    # the rq job path, one worker answering both tenants with the same filters
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    jobs = []
    for tenant in ("alpha", "beta"):
        for f, _ in FILTERS:
            request = RetrievalRequest.parse({"v": 1, "tenant_id": tenant, "query": "spare key mat", "filters": f})
            jobs.append((tenant, queue.enqueue("workers.query.worker.retrieval_job", request.to_payload(),
                                               job_id=request.request_id, **JOB_TTLS)))
    build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-fiso").work(burst=True)
    beta_found_secret = False
    for tenant, job in jobs:
        result = job.latest_result()
        assert result is not None and result.type == result.Type.SUCCESSFUL, job.id
        got = {h["entry_id"] for h in result.return_value["hits"]}
        assert got <= (alpha if tenant == "alpha" else beta)
        beta_found_secret |= tenant == "beta" and any(h["session_id"] == "beta-secret"
                                                      for h in result.return_value["hits"])
    assert beta_found_secret  # the same filters do find beta's turns for beta
    assert _version(store, "beta") == beta_version
