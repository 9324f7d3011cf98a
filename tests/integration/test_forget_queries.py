"""Forget racing with query workers (docs/architecture.md "Forget", its "Caches" and "Limits").

A query worker that has answered a tenant holds the tenant's index (BM25, dense, sessions), the
reranker's scores of its turns and whole evidence packets in memory. Here a forget lands while
retrievals of that tenant and of another one keep coming through the rq queue: every retrieval
enqueued after the forget's commit, on every path (plain, filters, ``as_of``, packets), answers
without the forgotten turn and exactly as a worker started from scratch would, the other turns
still come back, and the other tenant's answers do not move. A query worker SIGKILLed half-way
through a request it read before the forget ends that request in a typed failure, runs it no
further, and no stored answer holds the text.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from itertools import product
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from api.client import MnemosClient, job_id_for
from api.errors import RetrievalTimeout
from api.schemas import RetrievalRequest, RetrievalResult
from api.validation import limits_of
from tests.integration import factories
from tests.support import queue_job_ids, spawn_logged, stop_process, wait_for
from workers.query.worker import QueryService, build_worker
from workers.runtime.streams import run_consumer
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

SECRET = "my passport number is X9-4471-ZQ"
TENANTS = ("alice", "bob")  # alice forgets her turn "sec"; bob, served by the same worker, forgets nothing
KINDS: dict[str, dict[str, Any]] = {  # the retrieval paths of the queue, as client.retrieve keywords
    "plain": {"query": "passport number", "k": 3},
    "filters": {"query": "passport number", "k": 3, "filters": {"session_ids": ["s1"], "roles": ["user"]}},
    "as_of": {"query": "passport number", "k": 3, "as_of": (factories.BASE_TIME + timedelta(minutes=30)).isoformat()},
    "packet": {"query": "passport number", "k": 2, "budget_tokens": 400},
    "pool_packet": {"query": "cello teacher Ines", "k": 1, "budget_tokens": 2000},  # the secret below the hits
}
T = TypeVar("T")


def _turns(tenant: str) -> list[dict[str, object]]:
    """Eight conversation turns, a passport number (alice's ``sec``, bob's own ``bsec``) and two
    other passport turns, one (``late``) after the ``as_of`` of :data:`KINDS`."""
    number = SECRET if tenant == "alice" else "my passport number is K2-8810-PL"
    return [*factories.conversation_turns(tenant, tenant[0]),
            factories.turn(tenant, "sec" if tenant == "alice" else "bsec", number, session="s1", minutes=20),
            factories.turn(tenant, "pp", "I renewed my passport at the consulate in Porto", session="s2", minutes=21),
            factories.turn(tenant, "late", "The new passport arrives next month", session="s3", minutes=40)]


def _turn_ids(answer: RetrievalResult) -> set[str]:
    """Every turn id an answer names: hits, their aliases, packet items and omitted candidates."""
    ids = {h.turn_id for h in answer.hits} | {a for h in answer.hits for a in h.aliases}
    if answer.packet is not None:
        ids |= {i.turn_id for i in answer.packet.items} | {o.turn_id for o in answer.packet.omitted}
    return ids


def _texts(answer: RetrievalResult) -> str:
    """Every text an answer carries: hit texts, packet item texts and their prompt lines."""
    items = answer.packet.items if answer.packet is not None else ()
    return "\n".join([h.text for h in answer.hits] + [i.text for i in items] + [i.line for i in items])


def _signature(answer: RetrievalResult) -> tuple:
    """What two answers to the same request must share: hits with texts and scores, packet items."""
    items = None if answer.packet is None else tuple(i.turn_id for i in answer.packet.items)
    return tuple((h.turn_id, h.text, round(h.score, 4)) for h in answer.hits), items


def _client(settings: Settings, connection: redis.Redis) -> MnemosClient:
    """A client that does not refuse in the moment between two of :func:`_serve`'s workers."""
    return MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                        limits=limits_of(settings), retrieve_timeout_s=5.0, require_query_worker=False)


def _serve(settings: Settings, connection: redis.Redis, service: QueryService, body: Callable[[], T]) -> T:
    """``body()`` in a thread while real rq query workers around ``service`` (so its caches carry over)
    take jobs in this thread, where rq wants them; a worker idle for a second quits, and the next
    one starts while ``body`` still runs (at most 60 s)."""
    deadline = time.monotonic() + 60.0
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(body)
        while not future.done() and time.monotonic() < deadline:
            name = f"{settings.stream_prefix}-w{time.monotonic_ns()}"
            build_worker(settings, connection, service, name=name).work(max_idle_time=1)
        return future.result(timeout=15)


@dataclass(frozen=True)
class Asked:
    """One retrieval of the race: whether the forget was committed before it was enqueued, and its
    answer or error."""

    tenant: str
    kind: str
    after_commit: bool
    answer: RetrievalResult | None
    error: Exception | None


def _keep_asking(client: MnemosClient, tenant: str, committed: Callable[[], bool], out: list[Asked]) -> None:
    """Ask every kind of :data:`KINDS` in turn until two whole rounds were enqueued after the commit
    (or 30 s passed)."""
    rounds_after, deadline = 0, time.monotonic() + 30.0
    while rounds_after < 2 and time.monotonic() < deadline:
        whole = True
        for kind, kwargs in KINDS.items():
            after = committed()
            whole = whole and after
            try:
                out.append(Asked(tenant, kind, after, client.retrieve(tenant, **kwargs), None))
            except RetrievalTimeout as exc:
                out.append(Asked(tenant, kind, after, None, exc))
        rounds_after += int(whole)


def _stored(store: PostgresStore, tenant: str) -> set[str]:
    with store.tenant(tenant) as tx:
        return {r.turn_id for r in tx.entries_after(0)}


def _race(settings: Settings, connection: redis.Redis, store: PostgresStore, client: MnemosClient) -> list[Asked]:
    """Both tenants ask all along; once a few answers came back, alice forgets ``sec``."""
    asked: list[Asked] = []

    def committed() -> bool:
        return "sec" not in _stored(store, "alice")

    askers = [threading.Thread(target=_keep_asking, args=(client, t, committed, asked)) for t in TENANTS]
    for asker in askers:
        asker.start()
    wait_for(lambda: len(asked) >= 4, 10.0, interval_s=0.01)
    client.forget("alice", turn_ids=["sec"])
    for asker in askers:
        asker.join(40.0)
    return asked


def _check_race(asked: list[Asked], warm: dict[tuple[str, str], RetrievalResult], fresh: QueryService,
                settings: Settings) -> None:
    """Bob's answers never move; alice's after the commit hold no trace of ``sec`` and equal a fresh
    worker's; alice's racing the commit are answered (or time out, docs "Forget") from her turns."""
    assert {(a.tenant, a.kind) for a in asked if a.after_commit} == set(product(TENANTS, KINDS))
    assert any(not a.after_commit for a in asked if a.tenant == "alice")
    for a in asked:
        if a.tenant == "bob":
            assert a.answer is not None and _signature(a.answer) == _signature(warm[("bob", a.kind)]), a
            continue
        if not a.after_commit:
            assert a.answer is not None or a.error is not None  # a result the forget erased: a timeout
            assert a.answer is None or _turn_ids(a.answer) <= set(_stored_ids_of(warm))
            continue
        assert a.answer is not None, a
        assert SECRET not in _texts(a.answer) and "sec" not in _turn_ids(a.answer), a
        payload = {"v": 1, "tenant_id": "alice", **KINDS[a.kind]}
        oracle = fresh.answer(RetrievalRequest.parse(payload, limits_of(settings)))
        assert _signature(a.answer) == _signature(oracle), a.kind
        if a.kind in ("plain", "packet"):  # the other passport turns come first now
            assert {h.turn_id for h in a.answer.hits[:2]} == {"pp", "late"}, a


def _stored_ids_of(warm: dict[tuple[str, str], RetrievalResult]) -> set[str]:
    return {t for (tenant, _kind), answer in warm.items() if tenant == "alice" for t in _turn_ids(answer)}


def test_a_forget_landing_while_a_query_worker_serves_the_tenant(settings: Settings, redis_client: redis.Redis,
                                                                  store: PostgresStore) -> None:
    client = _client(settings, redis_client)
    client.publish_turns(_turns("alice") + _turns("bob"))
    ingest = factories.ingest_worker(settings, redis_client, store)
    factories.drain(ingest)
    service = factories.query_service(settings, redis_client, store)
    assert service.rerank_cache is not None

    def warm_up() -> dict[tuple[str, str], RetrievalResult]:
        answers = {(t, kind): client.retrieve(t, request_id=f"warm-{kind}", **kwargs)
                   for t, (kind, kwargs) in product(TENANTS, KINDS.items())}
        client.retrieve("alice", **KINDS["packet"])  # answered from the packet cache
        return answers

    warm = _serve(settings, redis_client, service, warm_up)
    for kind in KINDS:  # before the forget, every path returns the secret: the checks below can fail
        assert SECRET in _texts(warm[("alice", kind)]) and "sec" in _turn_ids(warm[("alice", kind)]), kind
    assert "late" in _turn_ids(warm[("alice", "plain")]) and "late" not in _turn_ids(warm[("alice", "as_of")])
    assert {h.turn_id for h in warm[("alice", "filters")].hits} <= {"a0", "a2", "sec"}
    assert SECRET not in "".join(h.text for h in warm[("alice", "pool_packet")].hits)  # in its packet only
    state = service.cache.get("alice")
    assert state is not None
    [secret_entry] = [e for e in state.index.entries() if e.text == SECRET]
    rendered = state.index.render(secret_entry)
    assert service.rerank_cache.pairs_of(rendered) > 0
    assert service.metrics.query_packet_cache_hits._value.get() == 1

    stop = threading.Event()
    ingesting = threading.Thread(target=run_consumer, args=(ingest.consumer("c1"), ingest.handle, stop),
                                 kwargs={"poison": ingest.poison, "after_ack": ingest.after_ack})
    ingesting.start()
    try:
        asked = _serve(settings, redis_client, service, lambda: _race(settings, redis_client, store, client))
    finally:
        stop.set()
        ingesting.join(10)
    assert _stored(store, "alice") == {t["turn_id"] for t in _turns("alice")} - {"sec"}
    _check_race(asked, warm, factories.query_service(settings, redis_client, store), settings)
    state = service.cache.get("alice")
    assert state is not None and all(e.text != SECRET for e in state.index.entries())
    assert service.rerank_cache.pairs_of(rendered) == 0
    for kind in KINDS:  # the stored results of the warm-up: alice's held the secret and are gone
        assert redis_client.xlen(Result.get_key(job_id_for("alice", f"warm-{kind}", settings.stream_prefix))) == 0, kind
        assert redis_client.xlen(Result.get_key(job_id_for("bob", f"warm-{kind}", settings.stream_prefix))) == 1, kind


# --- a query worker killed around the forget ------------------------------------------------------------------

def _answers_holding(connection: redis.Redis, settings: Settings, needle: str) -> list[str]:
    """Ids of the queue's jobs with a stored result (any, not only the latest) that holds ``needle``."""
    found = []
    for job_id in sorted(queue_job_ids(connection, settings.queue_name)):
        for raw_id, fields in connection.xrange(Result.get_key(job_id)):
            result = Result.restore(job_id, raw_id.decode(), fields, connection, serializer=JSONSerializer)
            if needle in str(result.return_value):
                found.append(job_id)
    return found


@pytest.mark.e2e
def test_a_query_worker_killed_mid_request_around_a_forget_fails_visibly_and_stores_nothing(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, tmp_path: Path) -> None:
    client = factories.client_for(settings, redis_client)
    client.publish_turns(_turns("alice"))
    ingest = factories.ingest_worker(settings, redis_client, store)
    factories.drain(ingest)
    marker, log = tmp_path / "rerank-started", tmp_path / "slow.log"
    slow = spawn_logged([sys.executable, "-m", "tests.badinput.slow_query_worker", "--marker", str(marker),
                   "--sleep-s", "120"], settings, log)
    outcome: dict[str, object] = {}

    def ask() -> None:
        try:
            outcome["result"] = client.retrieve("alice", "passport number", k=3, timeout_s=5.0, request_id="ask-1")
        except Exception as exc:
            outcome["error"] = exc

    asker = threading.Thread(target=ask)
    try:
        assert wait_for(lambda: bool(client.query_workers()), 30.0), log.read_text()[-3000:]
        asker.start()
        assert wait_for(marker.exists, 20.0), log.read_text()[-3000:]  # its snapshot still holds "sec"
        client.forget("alice", turn_ids=["sec"])
        factories.drain(ingest)  # committed while the worker is half-way through an answer read before it
        assert "sec" not in _stored(store, "alice")
        os.kill(slow.pid, signal.SIGKILL)
        slow.wait(10)
        asker.join(15.0)
    finally:
        stop_process(slow)
    assert not asker.is_alive(), "the client never returned"
    error = outcome.get("error")
    assert isinstance(error, RetrievalTimeout) and error.status == "started", outcome  # typed, not silent
    killed = job_id_for("alice", "ask-1", settings.stream_prefix)
    assert redis_client.exists(settings.outcomes_stream) == 0  # the killed job sent no outcome

    service = factories.query_service(settings, redis_client, store)  # the replacement worker
    other = factories.answered_by_worker(settings, redis_client, service, client.retrieve, "alice",
                                         "cello teacher Ines", k=1, budget_tokens=2000)
    assert other.packet is not None and "a7" in _turn_ids(other) and "sec" not in _turn_ids(other)
    assert SECRET not in _texts(other)
    # the killed job is not run again by the new worker (rq marks it failed in its later maintenance)
    job = Job.fetch(killed, connection=redis_client, serializer=JSONSerializer)
    assert job.get_status() == "started" and redis_client.xlen(Result.get_key(killed)) == 0
    retry = factories.answered_by_worker(settings, redis_client, service, client.retrieve, "alice",
                                         "passport number", k=3,
                                         request_id="ask-1")  # the client's retry, same request id
    assert retry.request_id == "ask-1" and {h.turn_id for h in retry.hits[:2]} == {"pp", "late"}
    assert "sec" not in _turn_ids(retry) and SECRET not in _texts(retry)
    assert _answers_holding(redis_client, settings, SECRET) == []
    assert killed in _answers_holding(redis_client, settings, "renewed my passport")  # the scan can find text
