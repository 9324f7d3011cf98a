"""Recovering retrieval jobs stranded in rq's intermediate list, and counting jobs that expired unanswered.

rq dequeues by moving a job id from ``rq:queue:<name>`` to ``rq:queue:<name>:intermediate``
(BLMOVE) and removes it from there once the job is registered as started. A worker stopped between
the two (a SIGTERM to an idle worker a few milliseconds after a job arrived) leaves the id behind,
the job still ``queued``: no worker ever looks at it again, and the client waits until its timeout.
rq's own maintenance (``IntermediateQueue.cleanup``) only fails such a job, a minute after it first
noticed it and at most every ten minutes, long after any client gave up.

:func:`sweep` is run by every query worker at start and then periodically (``workers.query.worker``):

* an id whose job is still ``queued`` and not started is put back at the head of its queue once it
  has sat in the intermediate list, seen by some sweep, for ``grace_s`` (first sightings are recorded
  in Redis, shared by all workers). A live worker holds an id there for a few Redis round trips;
  one that overruns the grace (a worker paused between dequeue and start) may run the job a second
  time, which retrieval tolerates: the outcome id is the request id, so suppression applies it once,
  and the client reads the first result;
* an id whose job hash is gone expired in the queue before a worker took it (rq skips it silently):
  it is dropped from the list and counted as expired;
* an id whose job is in any other state (cancelled, finished) is dropped from the list;
* jobs a client cancelled while they waited (it gave up: ``RetrievalTimeout``) are counted as
  expired once, and removed from rq's cancelled registry.

Each move is one atomic Lua script (LREM, then LPUSH only if the LREM removed it), so concurrent
sweeps of several workers, and a worker starting the job meanwhile, never duplicate or lose an id,
and every expiry is counted once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis
from rq import Queue

log = logging.getLogger(__name__)

SEEN_TTL_S = 3600  # a first-sighting record outlives any job that waits for a client
_MOVE = """
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
    if ARGV[2] == '1' then redis.call('LPUSH', KEYS[2], ARGV[1]) end
    redis.call('DEL', KEYS[3])
    return 1
end
redis.call('DEL', KEYS[3])
return 0
"""


@dataclass(frozen=True)
class SweepReport:
    """What one sweep did: ids put back in the queue, jobs counted as expired, ids dropped otherwise."""

    requeued: tuple[str, ...] = ()
    expired: int = 0
    dropped: int = 0


def seen_key(queue: Queue, job_id: str) -> str:
    """The record of when a sweep first saw ``job_id`` stranded (Unix seconds of the sweeper's clock)."""
    return f"{queue.intermediate_queue_key}:mnemos_seen:{job_id}"


def sweep(queue: Queue, *, grace_s: float, clock: Callable[[], float] = time.time) -> SweepReport:
    """Recover stranded jobs of ``queue`` and count its expired ones (see the module docstring).

    Args:
        queue: the rq queue (its connection is used).
        grace_s: seconds an unstarted ``queued`` job may sit in the intermediate list after the
            first sweep saw it there, before it is put back in the queue.
        clock: Unix seconds; every worker's clock should roughly agree (they compare sightings).

    Raises:
        redis.RedisError: when Redis fails (nothing half-done: each move is atomic).
    """
    connection: redis.Redis = queue.connection
    move = connection.register_script(_MOVE)
    started = set(queue.started_job_registry.get_job_ids(cleanup=False))
    requeued: list[str] = []
    expired = dropped = 0
    for raw in connection.lrange(queue.intermediate_queue_key, 0, -1):
        job_id = raw.decode() if isinstance(raw, bytes) else str(raw)
        if job_id in started:
            continue
        seen = seen_key(queue, job_id)
        status = connection.hget(queue.job_class.key_for(job_id), "status")
        if status is None:  # the job's hash expired while it waited: nobody will ever take it
            if move(keys=[queue.intermediate_queue_key, queue.key, seen], args=[job_id, "0"]):
                expired += 1
            continue
        if status.decode() != "queued":
            dropped += int(move(keys=[queue.intermediate_queue_key, queue.key, seen], args=[job_id, "0"]))
            continue
        now = clock()
        if connection.set(seen, repr(now), nx=True, ex=SEEN_TTL_S):
            continue  # first sighting: a live worker may be about to start it
        first = connection.get(seen)
        if first is None or now - float(first) < grace_s:
            continue
        if move(keys=[queue.intermediate_queue_key, queue.key, seen], args=[job_id, "1"]):
            requeued.append(job_id)
            log.warning("job %s was stranded in %s (its worker stopped between dequeue and start): put back in "
                        "the queue", job_id, queue.intermediate_queue_key)
    return SweepReport(tuple(requeued), expired + _count_cancelled(queue), dropped)


def _count_cancelled(queue: Queue) -> int:
    """Jobs a client cancelled while they waited in the queue, each counted once across all workers."""
    registry = queue.canceled_job_registry
    counted = 0
    for job_id in registry.get_job_ids(cleanup=False):
        counted += int(queue.connection.zrem(registry.key, job_id))
    return counted


__all__ = ["SweepReport", "seen_key", "sweep"]
