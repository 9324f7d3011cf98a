"""The heartbeat a worker's loop renews: a Redis record with a TTL, and a Prometheus gauge.

Layout and readers are in :mod:`api.heartbeats` (clients read them too). The loop calls
:meth:`Heartbeat.idle` on every turn (it writes at most every ``ttl/3`` seconds) and
:meth:`Heartbeat.busy` before a batch or a job, which extends the record's TTL by the longest
legitimate batch or job, so a worker busy with a slow one stays live and a stuck one does not.
The same bounds drive this process's :class:`~workers.runtime.liveness.Liveness` (the pod's liveness probe).
A worker that stops (killed, hung, or paused) stops renewing, and its record expires after the TTL;
a clean stop deletes it at once. ``mnemos_worker_heartbeat_timestamp_seconds{worker=<kind>}`` is set
on every beat, before Redis is written, so it also ticks while Redis is down.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from typing import Any

import redis

from api.heartbeats import KINDS, SEEN_HISTORY_S, heartbeat_key, seen_key
from workers.runtime.liveness import Liveness
from workers.runtime.metrics import ServiceMetrics
from workers.settings import Settings

log = logging.getLogger(__name__)


class Heartbeat:
    """Heartbeats of one worker (single-threaded: call it from the worker's loop only).

    Args:
        connection: Redis.
        settings: ``stream_prefix`` names the keys, ``heartbeat_ttl_s`` is the record's TTL.
        kind: ``ingest``, ``query`` or ``suppression`` (the gauge's label).
        name: the worker's name (its stream consumer or rq worker name), unique per process.
        metrics: where the gauge lives.
        busy_s: how long one batch or job may legitimately take (seconds), added to the TTL by
            :meth:`busy`.
        info: extra fields of the record (``queue``, ``rendering``, ``dim``).
        liveness: this process's :class:`~workers.runtime.liveness.Liveness`, extended on every beat by the
            same bound as the record's TTL (``/livez`` fails once the loop overruns it).

    Raises:
        ValueError: unknown ``kind``.
    """

    def __init__(self, connection: redis.Redis, settings: Settings, kind: str, name: str, *,
                 metrics: ServiceMetrics, busy_s: float = 0.0, info: Mapping[str, Any] | None = None,
                 liveness: Liveness | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.connection = connection
        self.kind = kind
        self.name = name
        self.metrics = metrics
        self.ttl_s = settings.heartbeat_ttl_s
        self.interval_s = settings.heartbeat_ttl_s / 3
        self.busy_s = busy_s
        self.key = heartbeat_key(settings.stream_prefix, kind, name)
        self.seen_key = seen_key(settings.stream_prefix, kind)
        self.info = {"host": socket.gethostname(), "pid": os.getpid(), **(info or {})}
        self.clock = clock
        self.monotonic = monotonic
        self._next = 0.0  # monotonic time of the next idle write
        self._busy = False  # the last record written was a busy one (with the longer TTL)
        self.liveness = liveness

    def idle(self) -> None:
        """The loop is alive and waiting: renew the record if ``interval_s`` passed or it was busy."""
        if self.liveness is not None:
            self.liveness.extend(self.ttl_s)
        if not self._busy and self.monotonic() < self._next:
            self.metrics.heartbeat(self.kind, self.clock())
            return
        self._write(busy=False)

    def busy(self) -> None:
        """The loop starts a batch or job: renew the record with ``ttl_s + busy_s``."""
        if self.liveness is not None:
            self.liveness.extend(self.ttl_s + self.busy_s)
        self._write(busy=True)

    def stop(self) -> None:
        """A clean stop: delete the record (the worker stays in the seen set); Redis errors are logged."""
        try:
            self.connection.delete(self.key)
        except redis.RedisError as exc:
            log.warning("could not delete the heartbeat of %s: %s", self.name, exc)

    def _write(self, *, busy: bool) -> None:
        now = self.clock()
        self.metrics.heartbeat(self.kind, now)
        ttl_s = self.ttl_s + (self.busy_s if busy else 0.0)
        record = json.dumps({"kind": self.kind, "name": self.name, "at": now, "ttl_s": ttl_s, "busy": busy,
                             **self.info})
        pipe = self.connection.pipeline(transaction=False)
        pipe.set(self.key, record, px=max(1, int(ttl_s * 1000)))
        pipe.zadd(self.seen_key, {self.name: now})
        pipe.zremrangebyscore(self.seen_key, "-inf", now - SEEN_HISTORY_S)
        pipe.execute()
        self._busy = busy
        self._next = self.monotonic() + self.interval_s
