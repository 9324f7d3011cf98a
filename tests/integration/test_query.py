"""Query worker against the real Redis and Postgres (fake encoder and reranker)."""

from __future__ import annotations

import time

import pytest
import redis
from rq import Queue
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException

from api.errors import InvalidInputError, NoQueryWorker, RetrievalFailed, RetrievalTimeout, ServiceUnavailable
from api.schemas import Outcome, RetrievalFilters, RetrievalRequest, RetrievalResult
from mnemos.errors import UnknownEntryError
from mnemos.tenant_index import TenantIndex
from tests.integration import factories
from tests.support import JOB_TTLS
from workers.query.worker import build_worker, retrieval_job
from workers.runtime.errors import OutsideQueryWorkerError
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.metrics import ServiceMetrics
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration


def test_answers_from_one_tenant_only_and_emits_an_outcome(settings: Settings, redis_client: redis.Redis,
                                                           store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store,
                           factories.conversation_turns("alice", "a") + factories.conversation_turns("bob", "b"))
    service = factories.query_service(settings, redis_client, store)
    result = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    assert result.hits and all(h.turn_id.startswith("a") for h in result.hits)
    assert result.hits[0].turn_id == "a0"
    assert [h.rank for h in result.hits] == list(range(1, len(result.hits) + 1))
    assert result.memory_version == 1 and result.pool_size > 0 and result.cluster is None
    entries = redis_client.xrange(settings.outcomes_stream)
    assert len(entries) == 1
    outcome = Outcome.from_stream_fields(entries[0][1])
    assert outcome.outcome_id == result.request_id and outcome.tenant_id == "alice"
    assert outcome.query_embedding is not None  # bootstrapping: the embedding travels
    # the identical texts of bob never appear, on any path
    for query in ("cat", "Pixel", "sourdough bread Porto", "cello teacher"):
        for k in (1, 10, 100):
            hits = service.answer(RetrievalRequest("alice", query, k=k)).hits
            assert all(h.turn_id.startswith("a") for h in hits)


def test_unknown_tenant_gets_an_empty_result(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    service = factories.query_service(settings, redis_client, store)
    for _ in range(20):
        result = service.answer(RetrievalRequest("nobody", "anything at all", k=10))
        assert result.hits == () and result.memory_version == 0
    assert redis_client.exists(settings.outcomes_stream) == 0


def test_index_refreshes_incrementally_by_memory_version(settings: Settings, redis_client: redis.Redis,
                                                         store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, factories.conversation_turns("alice", "a"))
    service = factories.query_service(settings, redis_client, store)
    service.answer(RetrievalRequest("alice", "cat", k=3))
    state = service.cache.get("alice")
    assert state is not None and len(state.index) == 8
    factories.ingest_turns(settings, redis_client, store, [
        factories.turn("alice", "new", "We booked a trip to Kyoto in October", minutes=99),
        factories.turn("alice", "dup", "I adopted a grey cat named Pixel last spring.")])
    result = service.answer(RetrievalRequest("alice", "trip Kyoto", k=3))
    assert result.hits[0].turn_id == "new" and result.memory_version == 2
    assert service.cache.get("alice") is state and len(state.index) == 9  # extended, not rebuilt
    pixel = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=1)).hits[0]
    assert pixel.turn_id == "a0" and pixel.aliases == ("dup",)
    assert service.metrics.query_index_refreshes._value.get() == 2



@pytest.mark.parametrize(("error", "times"), [
    (JobTimeoutException("Task exceeded maximum timeout value"), 1),  # the extension, once
    (UnknownEntryError("alice", 7), 2)])  # the extension, then the rebuild it falls back to (break-it round 14)
def test_an_extension_interrupted_half_way_is_rebuilt_not_kept(settings: Settings, redis_client: redis.Redis,
                                                             store: PostgresStore, monkeypatch: pytest.MonkeyPatch,
                                                             error: Exception, times: int) -> None:
    """Break-it rounds 13 and 14: rq's job timeout (SIGALRM) can interrupt a refresh anywhere; one that
    struck after the new entries were added but before their aliases left the state at the new memory
    version without the aliases (and with a stale last entry id) until the tenant's next write. So did
    a service error whose fallback rebuild failed as well."""
    text = "I adopted a grey cat named Pixel who loves the balcony"
    factories.ingest_turns(settings, redis_client, store, [factories.turn("alice", "a1", text, session="A")])
    service = factories.query_service(settings, redis_client, store)
    service.answer(RetrievalRequest("alice", "grey cat", k=3))
    factories.ingest_turns(settings, redis_client, store, [
        factories.turn("alice", "b1", text, session="B", minutes=1),  # an alias of a1, in session B
        factories.turn("alice", "b2", "My brother moved to Porto", session="B", minutes=2)])
    add_aliases, raised = TenantIndex.add_aliases, []

    def failing(self: TenantIndex, *args: object, **kwargs: object) -> None:
        raised.append(error)
        if len(raised) == times:
            monkeypatch.setattr(TenantIndex, "add_aliases", add_aliases)
        raise error

    monkeypatch.setattr(TenantIndex, "add_aliases", failing)
    with pytest.raises(type(error)):
        service.answer(RetrievalRequest("alice", "grey cat", k=3))
    assert len(raised) == times and service.cache.get("alice") is None  # dropped, not kept half-extended
    in_b = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5, filters=RetrievalFilters(session_ids=("B",))))
    assert {h.turn_id for h in in_b.hits} == {"b1", "b2"}


def test_rq_job_runs_in_the_simple_worker_with_json(settings: Settings, redis_client: redis.Redis,
                                                    store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, factories.conversation_turns("alice", "a"))
    service = factories.query_service(settings, redis_client, store)
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    request = RetrievalRequest("alice", "cello teacher Ines", k=3)
    job = queue.enqueue("workers.query.worker.retrieval_job", request.to_payload(), job_id=request.request_id, **JOB_TTLS)
    bad = queue.enqueue("workers.query.worker.retrieval_job", {"v": 1, "tenant_id": "alice", "query": "  "}, **JOB_TTLS)
    worker = build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-w")
    worker.work(burst=True)
    result = job.latest_result()
    assert result is not None and result.return_value["hits"][0]["turn_id"] == "a7"
    assert bad.get_status() == "failed"
    assert service.metrics.query_jobs.labels(status="error")._value.get() == 1
    with pytest.raises(OutsideQueryWorkerError):
        retrieval_job(request.to_payload())


def test_client_refuses_at_once_when_no_query_worker_has_a_heartbeat(settings: Settings,
                                                                     redis_client: redis.Redis) -> None:
    client = factories.client_for(settings, redis_client)
    with pytest.raises(NoQueryWorker, match="mnemos worker query") as info:
        client.retrieve("alice", "is anyone there", timeout_s=30.0)
    assert isinstance(info.value, ServiceUnavailable) and info.value.queue_name == settings.queue_name
    assert Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer).count == 0  # nothing sent


def test_client_times_out_with_a_typed_error_when_no_worker_takes_the_job(settings: Settings,
                                                                          redis_client: redis.Redis) -> None:
    # a heartbeat that is live, but nothing takes jobs (a worker hung in its loop, say)
    Heartbeat(redis_client, settings, "query", "silent", metrics=ServiceMetrics(),
              info={"queue": settings.queue_name}).idle()
    client = factories.client_for(settings, redis_client)
    started = time.monotonic()
    with pytest.raises(RetrievalTimeout) as info:
        client.retrieve("alice", "is anyone there", timeout_s=1.0)
    assert time.monotonic() - started < 2.5
    assert info.value.status in ("canceled", "queued")
    with pytest.raises(InvalidInputError):
        client.retrieve("alice", "   ")
    with pytest.raises(InvalidInputError):
        client.retrieve("alice", "fine", k=0)


def test_client_reports_a_failed_job(settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    service = factories.query_service(settings, redis_client, store)
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    job = queue.enqueue("workers.query.worker.retrieval_job", {"v": 99, "tenant_id": "a", "query": "q"}, **JOB_TTLS)
    build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-w2").work(burst=True)
    client = factories.client_for(settings, redis_client)
    with pytest.raises(RetrievalFailed, match="unsupported_version"):
        request = RetrievalRequest("a", "q", request_id=job.id)
        client._wait(job, request.request_id, 2.0, lambda result: client._from_result(request, result))


def test_session_weight_setting_lifts_the_best_sessions_turns(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    cat_talk = ["the cat sleeps all day on the sofa", "the cat eats tuna every evening",
                "Pixel is a happy cat who purrs", "we took the cat to the vet in March"]
    other = ["a cat", "we talked about taxes for an hour", "the dentist appointment was moved to Friday",
             "the bakery on the corner closed"]
    turns = [factories.turn("carol", f"c{i}", text, session="s1", minutes=i) for i, text in enumerate(cat_talk)]
    turns += [factories.turn("carol", f"o{i}", text, session="s2", minutes=10 + i) for i, text in enumerate(other)]
    factories.ingest_turns(settings, redis_client, store, turns)
    plain_service = factories.query_service(settings, redis_client, store)
    plain = plain_service.answer(RetrievalRequest("carol", "cat", k=5))
    state = plain_service.cache.get("carol")
    assert state is not None and state.index.sessions.session_ids == ("s1", "s2")
    assert state.index.sessions.rank("cat", plain_service.encoder.encode(["cat"])[0])[0] == "s1"
    assert plain.hits[0].turn_id == "o0" and "features" in plain.stage_seconds  # "a cat": shortest, fused first

    boosted_service = factories.query_service(settings.replace(session_top=1, session_weight=2.0), redis_client, store)
    boosted = boosted_service.answer(RetrievalRequest("carol", "cat", k=5))
    assert [h.session_id for h in boosted.hits[:4]] == ["s1"] * 4 and boosted.hits[4].turn_id == "o0"
    assert boosted.hits[0].score == pytest.approx(plain.hits[0].score + 2.0)  # every cat turn: 0.5 logit + 2
    plain_outcome, boosted_outcome = (Outcome.from_stream_fields(f) for _, f in
                                      redis_client.xrange(settings.outcomes_stream))
    assert boosted_outcome.pool == plain_outcome.pool  # the rank gap still reads the cross-encoder's ranks
    # a deduplicated turn is no entry, but still a turn of its own session
    factories.ingest_turns(settings, redis_client, store,
                           [factories.turn("carol", "dup", "the cat eats tuna every evening", session="s3",
                                           minutes=30)])
    plain_service.answer(RetrievalRequest("carol", "tuna", k=3))
    assert len(state.index) == 8 and state.index.sessions.n_turns == 9 and "s3" in state.index.sessions


@pytest.mark.slow
def test_dedupe_keeps_the_new_number_and_an_alias_only_word_finds_its_canonical(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Real bi-encoder: the two phone numbers (cosine 0.98) stay two entries and the new one is found;
    a word only the alias says finds the canonical entry listing the alias, whether the query worker
    folds the alias into a warm index or builds the tenant from scratch."""
    from workers.query.worker import QueryService
    from workers.runtime.metrics import ServiceMetrics
    from workers.runtime.models import load_reranker

    settings = settings.replace(bi_encoder="bundled")
    ingest = factories.ingest_worker(settings, redis_client, store)
    client = factories.client_for(settings, redis_client)
    client.publish_turns([factories.turn("pat", "p-old", "My new phone number is 0699 812 003."),
                          factories.turn("pat", "c1", "My sister lives in Lisbon with her husband and their cat."),
                          factories.turn("pat", "x1", "We watched a documentary about whales.")])
    factories.drain(ingest)

    def service() -> QueryService:
        return QueryService(settings, redis_client, store, ingest.encoder, load_reranker(settings), ServiceMetrics())

    warm = service()
    warm.answer(RetrievalRequest("pat", "actually", k=3))
    state = warm.cache.get("pat")
    assert state is not None and state.index.bm25.search("actually", 5) == []  # nobody said it yet
    client.publish_turns([factories.turn("pat", "p-new", "My new phone number is 0612 345 678.", minutes=5),
                          factories.turn("pat", "c2",
                                         "My sister lives in Lisbon with her husband and their cat, actually.",
                                         session="s2", minutes=5)])
    factories.drain(ingest)
    for name, query_service_ in (("warm", warm), ("fresh", service())):
        number = query_service_.answer(RetrievalRequest("pat", "0612 345 678", k=3)).hits
        assert number[0].turn_id == "p-new" and number[0].aliases == (), name
        old_number = query_service_.answer(RetrievalRequest("pat", "0699 812 003", k=3)).hits
        assert old_number[0].turn_id == "p-old" and old_number[0].aliases == (), name
        alias_only = query_service_.answer(RetrievalRequest("pat", "actually", k=3)).hits
        assert alias_only[0].turn_id == "c1" and alias_only[0].aliases == ("c2",), name
        assert alias_only[0].text == "My sister lives in Lisbon with her husband and their cat.", name


def test_a_repeated_question_is_reranked_from_the_cache(settings: Settings, redis_client: redis.Redis,
                                                         store: PostgresStore) -> None:
    factories.ingest_turns(settings, redis_client, store, factories.conversation_turns("alice", "a"))
    service = factories.query_service(settings.replace(rerank_cache_pairs=1000), redis_client, store)
    inner = service.rerank_cache.inner
    first = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    scored = inner.pairs_scored
    assert scored > 0 and service.metrics.query_rerank_cache_hits._value.get() == 0
    again = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    assert inner.pairs_scored == scored  # the model saw nothing new
    assert service.metrics.query_rerank_cache_hits._value.get() == first.pool_size
    assert [h.turn_id for h in again.hits] == [h.turn_id for h in first.hits]
    assert [h.score for h in again.hits] == [h.score for h in first.hits]
    # each answer says which of its pool pairs the model scored and which the cache answered
    assert (first.rerank_pairs_scored, first.rerank_pairs_cached) == (scored, 0)
    assert (again.rerank_pairs_scored, again.rerank_pairs_cached) == (0, first.pool_size)
    assert RetrievalResult.from_payload(again.to_payload()).rerank_pairs_cached == first.pool_size
    uncached = factories.query_service(settings.replace(rerank_cache_pairs=0), redis_client, store)
    assert uncached.rerank_cache is None
    answered = uncached.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    assert answered.rerank_pairs_scored is None and answered.rerank_pairs_cached is None



def test_a_cached_pair_never_answers_for_another_tenant(settings: Settings, redis_client: redis.Redis,
                                                        store: PostgresStore) -> None:
    """Same texts, same question, two tenants: the second is scored afresh, so neither its cache
    counts nor its latency tell it what the first asked or stored (docs/architecture.md "Score cache")."""
    for tenant in ("alice", "bob"):
        factories.ingest_turns(settings, redis_client, store, factories.conversation_turns(tenant, "a"))
    service = factories.query_service(settings.replace(rerank_cache_pairs=1000), redis_client, store)
    inner = service.rerank_cache.inner
    first = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    scored = inner.pairs_scored
    other = service.answer(RetrievalRequest("bob", "grey cat Pixel", k=5))
    assert (other.rerank_pairs_scored, other.rerank_pairs_cached) == (first.pool_size, 0)
    assert inner.pairs_scored == scored + first.pool_size
    assert [h.text for h in other.hits] == [h.text for h in first.hits]  # the same model, the same ranking
    again = service.answer(RetrievalRequest("bob", "grey cat Pixel", k=5))
    assert (again.rerank_pairs_scored, again.rerank_pairs_cached) == (0, first.pool_size)  # its own scope
    service.cache.evict("bob")  # bob's state dropped (LRU, forget): his pairs go, alice's stay ...
    repeat = service.answer(RetrievalRequest("alice", "grey cat Pixel", k=5))
    assert (repeat.rerank_pairs_scored, repeat.rerank_pairs_cached) == (0, first.pool_size)  # ... unseen by her


CALLBACKS: list[str] = []


def record_callback(job: object, *args: object) -> None:
    """A failure callback a job could name: the query worker must never call it."""
    CALLBACKS.append(str(getattr(job, "id", job)))


def test_the_query_worker_runs_no_function_but_its_own_jobs(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore, tmp_path) -> None:
    # anyone who can write to the queue names a function: rq would import and call it
    service = factories.query_service(settings, redis_client, store)
    queue = Queue(settings.queue_name, connection=redis_client, serializer=JSONSerializer)
    target = tmp_path / "made-by-a-job"
    forged = queue.enqueue("os.makedirs", str(target), **JOB_TTLS)
    listed = queue.enqueue("os.listdir", str(tmp_path), **JOB_TTLS)
    callback = queue.enqueue("workers.query.worker.retrieval_job", {"v": 1, "tenant_id": "a", "query": "  "},
                             on_failure=f"{__name__}.record_callback", **JOB_TTLS)  # a stored name too
    good = RetrievalRequest("alice", "cello teacher Ines", k=3)
    answered = queue.enqueue("workers.query.worker.retrieval_job", good.to_payload(), job_id=good.request_id,
                             **JOB_TTLS)
    build_worker(settings, redis_client, service, name=f"{settings.stream_prefix}-w3").work(burst=True)
    assert not target.exists()
    for job in (forged, listed):
        assert job.get_status() == "failed"
        result = job.latest_result()
        assert result is not None and "forbidden_job" in result.exc_string
        assert "is not a query worker job" in result.exc_string
    assert callback.get_status() == "failed" and "empty_query" in callback.latest_result().exc_string
    assert CALLBACKS == []
    assert answered.get_status() == "finished"  # the worker went on
