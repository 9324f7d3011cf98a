"""The client an agent uses: publish turns to the stream, ask for memories through rq, forget.

``publish_turn(s)`` validates and XADDs to ``<prefix>:turns``; ``retrieve`` enqueues a JSON job
(never pickle: anyone who can write to Redis could otherwise run code in a worker) on the rq
queue and waits with its own timeout, because a job whose worker was SIGKILLed is only marked
failed by rq's periodic maintenance; and it refuses at once (:class:`NoQueryWorker`, nothing
enqueued) when no query worker has a live heartbeat (:mod:`api.heartbeats`). Redis errors become
:class:`ServiceUnavailable`. The rq job
id is derived from the tenant and the request id (:func:`job_id_for`), and the client only reads
results newer than its own enqueue, so a reused request id never returns an older or another
tenant's answer. A request id names one request: the first enqueue claims it for that request's
digest (``<prefix>:request:<job id>``, for as long as its job or result can exist) and a different
request of the tenant under the same id is refused (:class:`RequestIdReused`) before it is sent.

``sessions`` and ``turns`` read a tenant's stored sessions or turns through the same queue (a catalog
job, :mod:`api.catalog`), and ``acknowledged`` tells when the ingest group committed a published turn
or forget, so a caller can wait until the next retrieval sees it (the MCP server's remember and forget
do, docs/architecture.md "Agents").

With ``shards`` > 1 (docs/scaling.md) a tenant's turns, forgets and retrievals all go to its shard
(:mod:`api.sharding`): the shard's turns stream and rq queue, served by that shard's workers only.
Given one Redis client per shard (each shard on its own server), the client talks to a tenant's
shard's Redis only, and a shard whose Redis fails raises :class:`ShardUnavailable` naming it, for
that shard's tenants alone. A tenant moved off its ring shard (``mnemos reshard move``) is found
through the tenant directory (:mod:`api.directory`): publishes check it atomically with the append,
and every call for a tenant being moved is held until the move has flipped its routing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar, cast

import redis
from rq import Queue
from rq.exceptions import InvalidJobOperation, NoSuchJobError
from rq.job import Job, JobStatus
from rq.results import Result
from rq.serializers import JSONSerializer

from api import sharding
from api.catalog import CATALOG_JOB, CatalogRequest, CatalogResult, SessionSummary, TurnRecord
from api.directory import Directory
from api.errors import (
    InvalidInputError,
    NoQueryWorker,
    Reason,
    RequestIdReused,
    RetrievalFailed,
    RetrievalTimeout,
    ServiceUnavailable,
    ShardUnavailable,
)
from api.forget import READD_FIELD, REPLACE_VALUE, ForgetRequest, ForgetScope
from api.heartbeats import WorkerBeat, worker_beats
from api.schemas import RetrievalRequest, RetrievalResult, Turn
from api.validation import Limits, check_wait

log = logging.getLogger(__name__)

RETRIEVAL_JOB = "workers.query.worker.retrieval_job"  # resolved by the query worker, never imported here
JOB_ID_PREFIX = "mnemos-"  # every retrieval's rq job id starts with it (job_id_for)
DEFAULT_STREAM_PREFIX = "mnemos"  # MNEMOS_STREAM_PREFIX's default
INGEST_GROUP = "ingest"  # the turns stream's consumer group (workers.ingest.worker.GROUP): it acknowledges after the commit
T = TypeVar("T")
_STREAM_ID = re.compile(r"[0-9]{1,20}-[0-9]{1,20}")


class _LimitsDefaultK:
    """The ``k`` of a retrieval that names none: the client's ``limits.default_k`` (an explicit None is
    still refused as not an integer)."""

    def __repr__(self) -> str:
        return "limits.default_k"


LIMITS_DEFAULT_K: Any = _LimitsDefaultK()
_TERMINAL_FAILURES = {JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED}


class MnemosClient:
    """Client of one Mnemos deployment.

    Args:
        connection: a redis-py client (``decode_responses=False``), or one per shard, in shard order,
            when each shard has its own Redis.
        stream_prefix: streams are ``<prefix>:turns`` and ``<prefix>:outcomes`` (with shards, each
            shard's own: :mod:`api.sharding`).
        queue_name: rq queue of the query workers (with shards, the base of each shard's queue name).
        limits: validation limits (the workers apply the same checks).
        retrieve_timeout_s: default wait for a retrieval result.
        job_timeout_s: rq kills a job running longer than this.
        result_ttl_s: seconds rq keeps a result.
        require_query_worker: refuse a retrieval at once (:class:`NoQueryWorker`) when no query
            worker of ``queue_name`` has a live heartbeat (``api.heartbeats``); False waits for
            one instead, up to the timeout (workers older than heartbeats write none).
        shards: how many shards the deployment routes tenants to (``MNEMOS_SHARDS``; 1: unsharded).
        move_wait_s: with shards, how long a call for a tenant being moved between shards waits for
            the move to finish before :class:`~api.errors.TenantMoving` (seconds, finite, >= 0).

    Raises:
        ValueError: if ``shards`` < 1, ``connection`` is a sequence not of ``shards`` clients, or
            ``move_wait_s`` is not a finite number >= 0.
    """

    def __init__(self, connection: redis.Redis | Sequence[redis.Redis], *, stream_prefix: str = DEFAULT_STREAM_PREFIX, queue_name: str = "retrievals",
                 limits: Limits | None = None, retrieve_timeout_s: float = 30.0, job_timeout_s: int = 60,
                 result_ttl_s: int = 600, require_query_worker: bool = True,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), shards: int = 1,
                 move_wait_s: float = 30.0) -> None:
        connections: list[redis.Redis] = (list(connection) if isinstance(connection, (list, tuple))
                                          else [cast(redis.Redis, connection)] * shards)
        if len(connections) != shards:
            raise ValueError(f"one Redis client per shard: got {len(connections)} for {shards} shards")
        self.connections = connections
        self.connection = connections[0]  # unsharded: the only one; else see connection_of
        self.stream_prefix = stream_prefix
        self.require_query_worker = require_query_worker
        self.ring = sharding.ring(shards)
        self.shards = shards
        self.turns_stream = sharding.turns_stream(stream_prefix)  # unsharded: the only one; else see turns_stream_of
        self.limits = limits or Limits()
        self.retrieve_timeout_s = check_wait(retrieve_timeout_s, "retrieve_timeout_s")
        self.job_timeout_s = job_timeout_s
        self.result_ttl_s = result_ttl_s
        self.clock = clock
        self.queues = [Queue(sharding.queue_name(queue_name, shard, shards), connection=connections[shard],
                             serializer=JSONSerializer) for shard in range(shards)]
        self.queue = self.queues[0]  # unsharded: the only one; else see queue_of
        self.directory = Directory(connections, stream_prefix, wait_s=move_wait_s) if shards > 1 else None

    # shards ---------------------------------------------------------------------------------

    def home_shard(self, tenant_id: str) -> int:
        """The ring's shard of ``tenant_id`` (always 0 when unsharded), before any move."""
        return self.ring.shard_of(tenant_id)

    def shard_of(self, tenant_id: str) -> int:
        """The shard that serves ``tenant_id`` now (always 0 when unsharded): its ring shard, unless the
        tenant directory says it moved (waits while it is being moved; :mod:`api.directory`)."""
        home = self.home_shard(tenant_id)
        return home if self.directory is None else self.directory.resolve(tenant_id, home)

    def turns_stream_of(self, tenant_id: str) -> str:
        """The turns stream of ``tenant_id``'s shard."""
        return sharding.turns_stream(self.stream_prefix, self.shard_of(tenant_id), self.shards)

    def queue_of(self, tenant_id: str) -> Queue:
        """The rq queue of ``tenant_id``'s shard."""
        return self.queues[self.shard_of(tenant_id)]

    def connection_of(self, tenant_id: str) -> redis.Redis:
        """The Redis client of ``tenant_id``'s shard."""
        return self.connections[self.shard_of(tenant_id)]

    def _unavailable(self, shard: int, detail: str) -> ServiceUnavailable:
        """The error of a failed Redis call: naming the shard when there is more than one."""
        return ShardUnavailable(shard, detail) if self.shards > 1 else ServiceUnavailable(detail)

    # turns ----------------------------------------------------------------------------------

    def make_turn(self, turn: Turn | Mapping[str, Any]) -> Turn:
        """A validated :class:`Turn` from a Turn or a mapping of its fields (``v`` defaults to 1)."""
        values = turn.to_stream_fields() if isinstance(turn, Turn) else {"v": 1, **turn}
        return Turn.parse(values, self.limits, self.clock())

    def publish_turn(self, turn: Turn | Mapping[str, Any], *, readd: bool = False) -> str:
        """Validate and XADD one turn; returns its stream id. Raises InvalidInputError, ServiceUnavailable."""
        return self.publish_turns([turn], readd=readd)[0]

    def publish_turns(self, turns: Iterable[Turn | Mapping[str, Any]], *, readd: bool = False) -> list[str]:
        """Validate every turn first (nothing is sent if one is invalid), then XADD them in one pipeline.

        ``readd`` re-adds turns a forget erased (:meth:`forget`): without it a turn id a forget
        covered is dropped by the ingest worker, so a retry or a replay cannot bring it back.

        Raises InvalidInputError (its message names the index of the bad turn) or ServiceUnavailable.
        """
        checked: list[Turn] = []
        for index, turn in enumerate(turns):
            try:
                checked.append(self.make_turn(turn))
            except InvalidInputError as exc:
                raise InvalidInputError(exc.reason, f"turns[{index}].{exc.field}", exc.detail) from exc
        if not checked:
            return []
        if self.directory is not None:
            return self.directory.publish([(t.tenant_id, self._fields(t, readd)) for t in checked], self.home_shard)
        by_shard: dict[int, list[int]] = {}  # shard -> indexes of its turns, in order
        for index, turn in enumerate(checked):
            by_shard.setdefault(self.shard_of(turn.tenant_id), []).append(index)
        ids: list[str] = [""] * len(checked)
        for shard, indexes in sorted(by_shard.items()):
            stream = sharding.turns_stream(self.stream_prefix, shard, self.shards)
            try:
                pipe = self.connections[shard].pipeline(transaction=False)
                for index in indexes:
                    pipe.xadd(stream, self._fields(checked[index], readd))  # type: ignore[arg-type]
                for index, stream_id in zip(indexes, pipe.execute(), strict=True):
                    ids[index] = _sid(stream_id)
            except redis.RedisError as exc:
                done = [s for s in sorted(by_shard) if s < shard]
                sent = f" (the turns of shard(s) {', '.join(map(str, done))} were published)" if done else ""
                raise self._unavailable(shard, f"cannot publish to {stream}: {exc}{sent}") from exc
        return ids

    def replace_turn(self, turn: Turn | Mapping[str, Any]) -> str:
        """Forget ``turn``'s turn id and re-add ``turn`` under it, in ONE message of the turns stream
        (``readd`` = ``"replace"``, :func:`api.forget.is_replace`); returns its stream id. One ingest
        consumer applies the forget and the re-add in order, so two concurrent replacements of one id
        end with the one published last, also with several ingest workers (the LangGraph store's
        ``put``; two messages could reach two consumers, and the re-add was then refused as a
        conflict before the forget erased the old value). Upgrade the ingest workers first: an older
        one stores the turn as a plain one. Raises InvalidInputError before anything is sent, or
        ServiceUnavailable."""
        checked = self.make_turn(turn)
        fields = self._fields(checked, True)
        fields[READD_FIELD] = REPLACE_VALUE
        return self._publish_one(checked.tenant_id, fields)

    def _publish_one(self, tenant_id: str, fields: dict[str, str]) -> str:
        """XADD one message to the turns stream of ``tenant_id``'s shard (through the directory while
        tenants move); returns its stream id. Raises ServiceUnavailable."""
        if self.directory is not None:
            return self.directory.publish([(tenant_id, fields)], self.home_shard)[0]
        stream = self.turns_stream_of(tenant_id)
        try:
            return _sid(self.connection_of(tenant_id).xadd(stream, fields))  # type: ignore[arg-type]
        except redis.RedisError as exc:
            raise self._unavailable(self.shard_of(tenant_id), f"cannot publish to {stream}: {exc}") from exc

    @staticmethod
    def _fields(turn: Turn, readd: bool) -> dict[str, str]:
        fields = turn.to_stream_fields()  # already flat strings, a new dict per call
        if readd:
            fields[READD_FIELD] = "1"
        return fields

    def forget(self, tenant_id: str, *, session_id: str | None = None,
               turn_ids: Iterable[str] | None = None) -> str:
        """Erase turns by id, one session, or (neither given) the whole tenant; returns the stream id.

        The forget is an event on the turns stream, ordered with the turns around it: every turn of
        its scope published before it is erased (entries, aliases, embeddings, suppression scores,
        dead letters and the stream's copies), none published after it is touched, and a forgotten
        turn id published again is dropped unless :meth:`publish_turns` is told ``readd``. The
        erasure happens when the ingest worker reaches the event (docs/architecture.md "Forget").

        Raises InvalidInputError (both scopes given, an empty or invalid id) before anything is
        sent, or ServiceUnavailable.
        """
        values: dict[str, Any] = {"v": 1, "tenant_id": tenant_id, "scope": ForgetScope.TENANT.value}
        if session_id is not None and turn_ids is not None:
            raise InvalidInputError(Reason.BAD_FORGET, "scope", "give session_id or turn_ids, not both")
        if session_id is not None:
            values.update(scope=ForgetScope.SESSION.value, session_id=session_id)
        elif turn_ids is not None:
            values.update(scope=ForgetScope.TURNS.value, turn_ids=_id_list(turn_ids, Reason.BAD_FORGET))
        request = ForgetRequest.parse(values, self.limits)
        return self._publish_one(request.tenant_id, request.to_stream_fields())

    # retrieval ------------------------------------------------------------------------------

    def retrieve(self, tenant_id: str, query: str, k: int = LIMITS_DEFAULT_K, *, as_of: datetime | str | None = None,
                 filters: Mapping[str, Any] | None = None, request_id: str | None = None,
                 timeout_s: float | None = None, budget_tokens: int | None = None) -> RetrievalResult:
        """Ask the query workers for the ``k`` best memories (default: the limits' ``default_k``, which a
        client built from the settings takes from ``MNEMOS_DEFAULT_K``); returns the typed result.

        ``as_of`` (a zone-aware datetime or ISO 8601 string) is the knowledge time: only turns that
        occurred at or before it can come back, and relative times in the query ("last week") are
        read from it. ``filters`` may hold ``session_ids`` and ``roles`` (non-empty lists of
        strings) and ``occurred_after`` (zone-aware, inclusive, not after ``as_of``); see
        :class:`~api.schemas.RetrievalRequest` for the exact semantics. ``budget_tokens`` also asks
        for an evidence packet (``result.packet``, :class:`~api.packets.Packet`): the evidence that
        fits that many cross-encoder tokens, with its qualifiers, in reading order, and why each
        other candidate was left out (``budget_out_of_range`` outside 1..``max_budget_tokens``).

        Raises InvalidInputError before anything is sent (``bad_filter`` for a bad ``filters``
        object; :class:`RequestIdReused` when ``request_id`` already names another request of the
        tenant, see :func:`claim_request_id`); NoQueryWorker at once, before anything is sent, when no query worker has a live
        heartbeat; RetrievalFailed when the job failed; RetrievalTimeout when no result arrived
        within ``timeout_s`` (default ``retrieve_timeout_s``); ServiceUnavailable when Redis fails.
        """
        payload: dict[str, Any] = {"v": 1, "tenant_id": tenant_id, "query": query,
                                   "k": self.limits.default_k if k is LIMITS_DEFAULT_K else k}
        if request_id is not None:
            payload["request_id"] = request_id
        if as_of is not None:
            payload["as_of"] = as_of
        if filters is not None:
            payload["filters"] = dict(filters) if isinstance(filters, Mapping) else filters
        if budget_tokens is not None:
            payload["budget_tokens"] = budget_tokens
        request = RetrievalRequest.parse(payload, self.limits)
        timeout = check_wait(self.retrieve_timeout_s if timeout_s is None else timeout_s, "timeout_s")
        job_id = job_id_for(request.tenant_id, request.request_id, self.stream_prefix)
        shard = self.shard_of(request.tenant_id)
        queue, connection = self.queues[shard], self.connections[shard]
        try:
            if self.require_query_worker and not self._live_query_workers([queue]):
                raise NoQueryWorker(queue.name, self.stream_prefix)
            claim_ttl_s = int(timeout) + 5 + self.job_timeout_s + self.result_ttl_s  # queued + running + kept
            if not claim_request_id(connection, f"{self.stream_prefix}:request:{job_id}",
                                    request_digest(request), claim_ttl_s):
                raise RequestIdReused(request.tenant_id, request.request_id)
            # results of an earlier job with this id (a retry) stay in its result stream: read after them
            last = connection.xrevrange(Result.get_key(job_id), count=1)
            after = _sid(last[0][0]) if last else "0-0"
            job = queue.enqueue(
                RETRIEVAL_JOB, request.to_payload(), job_id=job_id,
                job_timeout=self.job_timeout_s, result_ttl=self.result_ttl_s,
                failure_ttl=self.result_ttl_s, ttl=int(timeout) + 5,  # backstop: never runs long after we gave up
            )
            return self._wait(job, request.request_id, timeout,
                              lambda result: self._from_result(request, result, shard), shard=self._named(shard),
                              after=after)
        except redis.RedisError as exc:
            raise self._unavailable(shard, f"retrieval {request.request_id}: {exc}") from exc

    # catalog and ingestion -----------------------------------------------------------------

    def sessions(self, tenant_id: str, *, timeout_s: float | None = None) -> tuple[SessionSummary, ...]:
        """The tenant's sessions (id, first and last turn time, stored turns), read by a query worker
        from Postgres (:mod:`api.catalog`); an unknown tenant has none. Raises as :meth:`retrieve`."""
        values = {"v": 1, "tenant_id": tenant_id, "kind": "sessions"}
        return self._catalog(values, timeout_s).sessions

    def turns(self, tenant_id: str, turn_ids: Iterable[str], *,
              timeout_s: float | None = None) -> tuple[TurnRecord, ...]:
        """The stored turns of ``tenant_id`` among ``turn_ids`` (unknown or forgotten ids are absent), in
        the order asked. Raises as :meth:`retrieve` (InvalidInputError ``bad_id`` for an empty list)."""
        values = {"v": 1, "tenant_id": tenant_id, "kind": "turns", "turn_ids": _id_list(turn_ids, Reason.BAD_ID)}
        return self._catalog(values, timeout_s).turns

    def _catalog(self, values: Mapping[str, Any], timeout_s: float | None) -> CatalogResult:
        request = CatalogRequest.parse(values, self.limits)
        timeout = check_wait(self.retrieve_timeout_s if timeout_s is None else timeout_s, "timeout_s")
        shard = self.shard_of(request.tenant_id)
        queue = self.queues[shard]

        def parse(result: Result) -> CatalogResult:
            if result.type != Result.Type.SUCCESSFUL:
                raise RetrievalFailed(request.request_id, result.type.name.lower(),
                                      _last_line(result.exc_string or result.type.name))
            answer = CatalogResult.from_payload(result.return_value)  # type: ignore[arg-type]
            if (answer.tenant_id, answer.request_id) != (request.tenant_id, request.request_id):
                raise RetrievalFailed(request.request_id, "mismatched", "the result belongs to another request")
            return answer

        try:
            if self.require_query_worker and not self._live_query_workers([queue]):
                raise NoQueryWorker(queue.name, self.stream_prefix)
            job = queue.enqueue(CATALOG_JOB, request.to_payload(), job_id=job_id_for(request.tenant_id,
                                                                                       request.request_id,
                                                                                       self.stream_prefix),
                                job_timeout=self.job_timeout_s, result_ttl=self.result_ttl_s,
                                failure_ttl=self.result_ttl_s, ttl=int(timeout) + 5)
            return self._wait(job, request.request_id, timeout, parse, shard=self._named(shard))
        except redis.RedisError as exc:
            raise self._unavailable(shard, f"catalog {request.request_id}: {exc}") from exc

    def acknowledged(self, tenant_id: str, stream_id: str) -> bool:
        """True once the ingest group has acknowledged message ``stream_id`` of ``tenant_id``'s turns
        stream (a value :meth:`publish_turn` or :meth:`forget` returned): an ingest worker committed
        it (stored the turn, applied the forget) or refused it as a dead letter, so the next retrieval
        sees its effect. False while it waits or is being processed. Raises ServiceUnavailable, or
        InvalidInputError ``bad_id`` when ``stream_id`` is not an entry id (``<ms>-<seq>``).

        After the tenant moved to another shard, an id of the shard it left is followed to its copy
        there (:func:`api.sharding.moved_ids_key`); one the move did not carry (up to the floor it
        recorded) was committed or applied before it, or a forget covered it: True."""
        stream_id = _entry_id(stream_id)
        shard = self.shard_of(tenant_id)
        stream = sharding.turns_stream(self.stream_prefix, shard, self.shards)
        connection = self.connections[shard]
        try:
            moved, floor = connection.hmget(sharding.moved_ids_key(stream), [
                sharding.moved_field(tenant_id, stream_id), sharding.moved_floor_field(tenant_id)])
            if moved is None and floor is not None and _id_key(stream_id) <= _id_key(_sid(floor)):
                return True  # before the tenant moved here, and not carried: handled before the move
            stream_id = stream_id if moved is None else _sid(moved)
            groups = connection.xinfo_groups(stream)
            group = next((g for g in groups if _sid(g["name"]) == INGEST_GROUP), None)
            if group is None or _id_key(_sid(group["last-delivered-id"])) < _id_key(stream_id):
                return False
            return not connection.xpending_range(stream, INGEST_GROUP, min=stream_id, max=stream_id, count=1)
        except redis.ResponseError as exc:
            if "no such key" in str(exc).lower():
                return False
            raise self._unavailable(shard, f"cannot read the ingest group of {stream}: {exc}") from exc
        except redis.RedisError as exc:
            raise self._unavailable(shard, f"cannot read the ingest group of {stream}: {exc}") from exc

    def wait_acknowledged(self, tenant_id: str, stream_id: str, timeout_s: float,
                          poll_s: float = 0.01) -> bool:
        """Poll :meth:`acknowledged` every ``poll_s`` seconds until it holds (True) or ``timeout_s``
        passed (False). Raises ServiceUnavailable; InvalidInputError for a bad id or ``timeout_s``
        (:func:`api.validation.check_wait`)."""
        deadline = time.monotonic() + check_wait(timeout_s, "timeout_s")
        while not self.acknowledged(tenant_id, stream_id):
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
        return True

    def query_workers(self, tenant_id: str | None = None) -> list[WorkerBeat]:
        """The query workers with a live heartbeat taking jobs from ``tenant_id``'s shard's queue, or
        (None) from any of this client's queues (redis.RedisError if Redis fails)."""
        return self._live_query_workers([self.queue_of(tenant_id)] if tenant_id is not None else self.queues)

    def _live_query_workers(self, queues: Sequence[Queue]) -> list[WorkerBeat]:
        names = {q.name for q in queues}
        connections = list({id(q.connection): q.connection for q in queues}.values())  # each Redis once
        return [b for connection in connections for b in worker_beats(connection, self.stream_prefix, "query")
                if b.live and b.info.get("queue") in names]

    def _wait(self, job: Job, request_id: str, timeout_s: float, parse: Callable[[Result], T],
              after: str = "0-0", shard: int | None = None) -> T:
        """Block on the job's result stream until a result newer than ``after`` arrives (read by ``parse``),
        the job fails (RetrievalFailed) or ``timeout_s`` passes (RetrievalTimeout; a job that had not
        started is cancelled)."""
        deadline = time.monotonic() + timeout_s
        key = Result.get_key(job.id)
        while True:
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            if remaining_ms <= 0:
                break
            # block on the job's result stream, waking up at least every 500 ms to look at its status
            if job.connection.xread({key: after}, count=1, block=min(remaining_ms, 500)):
                result = job.latest_result()
                if result is not None:
                    return parse(result)
            status = self._status(job)
            if status in _TERMINAL_FAILURES:
                result = job.latest_result()
                detail = result.exc_string if result is not None and result.exc_string else status.value
                raise RetrievalFailed(request_id, status.value, _last_line(detail), shard)
        status = self._status(job)
        if status in (JobStatus.QUEUED, JobStatus.SCHEDULED, JobStatus.DEFERRED):
            with contextlib.suppress(InvalidJobOperation, NoSuchJobError):
                job.cancel()  # nobody will read its result any more
        raise RetrievalTimeout(request_id, timeout_s, None if status is None else status.value, shard)

    def _named(self, shard: int) -> int | None:
        """The shard an error names: ``shard``, with more than one shard."""
        return shard if self.shards > 1 else None

    @staticmethod
    def _status(job: Job) -> JobStatus | None:
        try:
            return job.get_status(refresh=True)
        except (InvalidJobOperation, NoSuchJobError):
            return None

    def _from_result(self, request: RetrievalRequest, result: Result, shard: int = 0) -> RetrievalResult:
        if result.type == Result.Type.SUCCESSFUL:
            answer = RetrievalResult.from_payload(result.return_value)  # type: ignore[arg-type]
            if (answer.tenant_id, answer.request_id) != (request.tenant_id, request.request_id):
                raise RetrievalFailed(request.request_id, "mismatched", "the result belongs to another request")
            return answer
        detail = result.exc_string or result.type.name
        raise RetrievalFailed(request.request_id, result.type.name.lower(), _last_line(detail), self._named(shard))


def _id_list(turn_ids: Iterable[str], reason: Reason) -> list[str]:
    """``turn_ids`` as a list; raises InvalidInputError for a lone string (it is iterable, and would
    name one turn per character)."""
    if isinstance(turn_ids, str | bytes):
        raise InvalidInputError(reason, "turn_ids", f"must be a list of turn ids, not a string: [{turn_ids!r}] names "
                                "that one turn")
    return list(turn_ids)


def tenant_job_prefix(tenant_id: str, stream_prefix: str = DEFAULT_STREAM_PREFIX) -> str:
    """The start of every rq job id of ``tenant_id``'s requests in the deployment whose streams are
    named by ``stream_prefix``: ``mnemos-`` + a 16-hex-digit hash of the tenant (and, for a prefix
    other than the default, of the prefix) + ``-``. A forget finds the tenant's stored results by it
    (one SCAN MATCH) instead of reading every tenant's. rq keeps one namespace of job ids per Redis
    database: without the prefix in the hash, two deployments sharing one database gave the same
    tenant and request id the same job, so a forget in one erased the other's stored results and a
    client could read the other deployment's answer (a break-it session, 2026-12-07). The default
    prefix hashes the tenant alone, as every id did before, so an upgrade keeps finding the results
    stored before it."""
    scope = tenant_id if stream_prefix == DEFAULT_STREAM_PREFIX else f"{stream_prefix}\x00{tenant_id}"
    return f"{JOB_ID_PREFIX}{sharding.tenant_digest(scope)}-"


def job_id_for(tenant_id: str, request_id: str, stream_prefix: str = DEFAULT_STREAM_PREFIX) -> str:
    """The rq job id of a request: :func:`tenant_job_prefix` + a hash of the tenant and the request id.

    rq job ids are one namespace per Redis and allow only ``[A-Za-z0-9_-]``, while request ids
    are chosen by clients (any id text) and only unique within a tenant: hashing both keeps two
    tenants' ``"req-1"`` apart and lets any valid request id through. (Until 2026-12-07 the id was
    ``mnemos-`` + the second hash alone.)
    """
    digest = hashlib.blake2b(f"{tenant_id}\x00{request_id}".encode(), digest_size=16).hexdigest()
    return f"{tenant_job_prefix(tenant_id, stream_prefix)}{digest}"


def request_digest(request: RetrievalRequest) -> str:
    """A hex digest of everything a request asks (its JSON payload, keys sorted): equal for a retry."""
    body = json.dumps(request.to_payload(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(body.encode(), digest_size=16).hexdigest()


def claim_request_id(connection: redis.Redis, key: str, digest: str, ttl_s: int) -> bool:
    """Claim ``key`` (one tenant's request id) for the request of ``digest`` for ``ttl_s`` seconds.

    True when the key was free (now claimed) or already holds ``digest`` (a retry: its expiry is
    renewed); False when it holds another request's digest. Atomic per call (``SET NX``), so of two
    concurrent different requests exactly one wins. Raises redis.RedisError.
    """
    for _ in range(3):  # the key may expire between SET NX and GET: claim again
        if connection.set(key, digest, nx=True, ex=ttl_s):
            return True
        held = connection.get(key)
        if held is None:
            continue
        if _sid(held) != digest:
            return False
        connection.expire(key, ttl_s)
        return True
    return True  # expired three times in a row: nobody holds it long enough to collide


def _sid(value: bytes | str | None) -> str:
    """A stream entry id as text (redis-py types ids as possibly None; a read entry always has one)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _id_key(stream_id: str) -> tuple[int, int]:
    """A stream entry id (``<ms>-<seq>``) as a sortable pair."""
    millis, _, seq = stream_id.partition("-")
    return int(millis), int(seq or 0)


def _entry_id(value: Any) -> str:
    """``value`` if it is an id Redis gives an entry (``<ms>-<seq>``, above ``0-0``); else
    InvalidInputError ``bad_id``."""
    if not (isinstance(value, str) and _STREAM_ID.fullmatch(value) and _id_key(value) > (0, 0)):
        raise InvalidInputError(Reason.BAD_ID, "stream_id", f"must be a stream entry id <ms>-<seq>, got {value!r}")
    return value


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else text
