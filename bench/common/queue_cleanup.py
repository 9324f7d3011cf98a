"""Deleting every rq key of one retrieval queue: for benchmark runs and tests that own their queue.

rq keys jobs and results by job id alone (``rq:job:<id>``, ``rq:results:<id>``) and keeps one
registry per queue (``rq:finished:<queue>`` and friends, some without an expiry), so deleting the
keys that start with a run's stream prefix leaves all of them behind.
"""

from __future__ import annotations

import redis
from rq import Queue
from rq.job import Job
from rq.results import Result


def queue_job_ids(client: redis.Redis, queue_name: str) -> set[str]:
    """Ids of every rq job of ``queue_name``: queued, in any of its registries, or with it as ``origin``.

    The ``origin`` scan also finds jobs whose registry entry already expired.
    """
    queue = Queue(queue_name, connection=client)
    ids = set(queue.get_job_ids())
    for registry in _registries(queue):
        ids.update(registry.get_job_ids(cleanup=False))
    prefix = Job.redis_job_namespace_prefix.encode()
    keys = [k for k in client.scan_iter(match=prefix + b"*", count=1000) if b":" not in k[len(prefix):]]
    if keys:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.hget(key, "origin")
        for key, origin in zip(keys, pipe.execute(raise_on_error=False), strict=True):
            if origin == queue_name.encode():
                ids.add(key[len(prefix):].decode())
    return ids


def delete_queue_jobs(client: redis.Redis, queue_name: str) -> int:
    """Delete every job of ``queue_name`` with its result stream; returns their number."""
    ids = queue_job_ids(client, queue_name)
    keys = [key for job_id in ids
            for key in (Job.key_for(job_id), Job.dependents_key_for(job_id), Result.get_key(job_id))]
    if keys:
        client.delete(*keys)
    return len(ids)


def delete_queue(client: redis.Redis, queue_name: str) -> int:
    """Delete the queue's jobs, its registries, the queue itself, its name in rq's set of queues and
    the query workers' sighting records of its intermediate list; returns the number of jobs."""
    count = delete_queue_jobs(client, queue_name)
    queue = Queue(queue_name, connection=client)
    client.delete(queue.key, *(registry.key for registry in _registries(queue)))
    client.srem(Queue.redis_queues_keys, queue.key)  # rq's set of every queue's name (rq:queues)
    # the query workers' records of stranded-job sightings (workers/query/intermediate.py), kept up to an hour
    sightings = list(client.scan_iter(match=f"{queue.intermediate_queue_key}:*", count=500))
    if sightings:
        client.delete(*sightings)
    return count


def _registries(queue: Queue) -> tuple:
    return (queue.started_job_registry, queue.finished_job_registry, queue.failed_job_registry,
            queue.deferred_job_registry, queue.scheduled_job_registry, queue.canceled_job_registry)
