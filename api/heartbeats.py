"""Worker heartbeats in Redis: the key layout, and reading which workers are alive.

Each worker's loop renews one record (the writer is ``workers.runtime.heartbeats``):

* ``<prefix>:heartbeat:<kind>:<name>``: a JSON object (``kind``, ``name``, ``host``, ``pid``,
  ``at`` Unix seconds, ``ttl_s``, ``busy``, and per kind ``queue``, ``rendering``, ``dim``) with a
  Redis TTL. The key exists exactly while the worker is alive by its own account: Redis expires
  it, so no clocks are compared.
* ``<prefix>:heartbeats:<kind>``: a sorted set of worker names scored by the Unix time of their
  last heartbeat, so readers find the records without SCAN and can say when a dead worker was
  last seen (entries older than :data:`SEEN_HISTORY_S` are pruned by the writers).

``kind`` is ``ingest``, ``query`` or ``suppression``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, cast

import redis

KINDS = ("ingest", "query", "suppression")
SEEN_HISTORY_S = 86_400.0  # how long a dead worker stays listed as "last seen"


def heartbeat_key(prefix: str, kind: str, name: str) -> str:
    """The record of one worker (exists while the worker is alive)."""
    return f"{prefix}:heartbeat:{kind}:{name}"


def seen_key(prefix: str, kind: str) -> str:
    """The sorted set of the workers of ``kind`` seen recently, scored by Unix time."""
    return f"{prefix}:heartbeats:{kind}"


@dataclass(frozen=True)
class WorkerBeat:
    """One worker as its heartbeats tell it: ``live`` while its record exists; ``last_seen`` in
    Unix seconds (the writer's clock); ``info`` the record's fields (empty once it expired)."""

    kind: str
    name: str
    live: bool
    last_seen: float
    info: dict[str, Any] = field(default_factory=dict)


def worker_beats(connection: redis.Redis, prefix: str, kind: str) -> list[WorkerBeat]:
    """Every worker of ``kind`` seen within :data:`SEEN_HISTORY_S`, live ones first, then by last
    heartbeat (newest first). Raises redis.RedisError when Redis fails."""
    seen = cast(list[tuple[bytes | str, float]], connection.zrange(seen_key(prefix, kind), 0, -1, withscores=True))
    if not seen:
        return []
    names = [n.decode() if isinstance(n, bytes) else str(n) for n, _ in seen]
    records = connection.mget([heartbeat_key(prefix, kind, n) for n in names])
    beats = []
    for name, (_, score), record in zip(names, seen, records, strict=True):
        info: dict[str, Any] = {}
        if record is not None:
            try:
                info = json.loads(record)
            except ValueError:
                info = {}
        beats.append(WorkerBeat(kind, name, record is not None, float(score), info))
    return sorted(beats, key=lambda b: (not b.live, -b.last_seen))


def live_workers(connection: redis.Redis, prefix: str, kind: str, *, queue: str | None = None) -> list[WorkerBeat]:
    """The live workers of ``kind`` (for ``query``, with ``queue``: only those taking jobs from it)."""
    return [b for b in worker_beats(connection, prefix, kind)
            if b.live and (queue is None or b.info.get("queue") == queue)]
