"""The fault run's Redis-restarted-empty phase: Redis loses its data in the middle of ingest.

``mnemos worker ingest`` processes consume the turns stream while turns are published at an even
pace; halfway through, Redis is SIGKILLed, its data files are deleted and it starts again empty (no
persistence, or a failover to an empty replica). The workers must find their consumer group gone
(``NOGROUP``), create it again and go on, without exiting (docs/architecture.md "Invariants").

What Redis held and no consumer had acknowledged when it went is lost upstream, by Redis: the phase
counts those turns (``upstream_lost``) apart from Mnemos's losses, and checks that they were among
the entries unacknowledged at the restart (``unacked_at_restart``, read just before the kill).
Every turn published after the restart must be stored exactly once (``lost``, ``duplicated``).
Publishing and the restart take turns under one lock, so each batch is known to have reached the
old Redis or the new one.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import redis

from bench.faults.phases import dedupe_violations, turn_traffic
from bench.faults.run import FaultPlan, FaultRun, PhaseReport, count_across_restart, publish_paced
from workers.settings import Settings
from workers.store.audit import Audit

PHASE = "redis_empty"


def unacknowledged(connection: redis.Redis, stream: str, group: str) -> int:
    """Entries of ``stream`` that ``group`` has not acknowledged: pending ones plus those never
    delivered (every entry when the group does not exist yet)."""
    groups = {g["name"].decode() if isinstance(g["name"], bytes) else g["name"]: g
              for g in connection.xinfo_groups(stream)} if connection.exists(stream) else {}
    state = groups.get(group)
    if state is None:
        return int(connection.xlen(stream))
    last = state["last-delivered-id"]
    last = last.decode() if isinstance(last, bytes) else str(last)
    undelivered = connection.xrange(stream, min=f"({last}", max="+")
    return int(state["pending"]) + len(undelivered)


def run_redis_empty(run: FaultRun, plan: FaultPlan) -> PhaseReport:
    """Turns through ingest workers while Redis restarts empty halfway (module docstring)."""
    started = time.monotonic()
    report = PhaseReport(PHASE)
    settings = run.settings(PHASE, plan)
    rng = random.Random(plan.seed + 13)
    tenants = [f"tenant-{chr(97 + i)}{plan.seed}" for i in range(plan.tenants)]
    good, pairs, _malformed = turn_traffic(plan, rng, tenants)  # the turns phase counts dead letters
    report.published = report.accepted = len(good)
    lock = threading.Lock()
    epoch = [0]  # 0: the Redis before the restart, 1: the empty one after it
    reached: list[list[tuple[str, str]]] = [[], []]  # turn keys each Redis accepted
    client = run.client(settings)

    def send(chunk: list[dict[str, Any]]) -> None:
        with lock:
            client.publish_turns(chunk)
            reached[epoch[0]].extend((t["tenant_id"], t["turn_id"]) for t in chunk)

    batches: list[Callable[[], Any]] = [lambda chunk=good[i:i + 10]: send(chunk) for i in range(0, len(good), 10)]
    workers = run.workers("ingest", settings, plan.workers)
    for worker in workers:
        worker.start()
    stop = threading.Event()
    publisher = publish_paced(batches, plan.publish_seconds, report, stop)
    restarter = threading.Timer(plan.publish_seconds / 2, _restart_empty, (run, settings, lock, epoch, report))
    restarter.start()
    try:
        quiet = replace(plan, kills=0, pauses=0, redis_restarts=0, postgres_restarts=0)
        run.chaos(quiet, workers, report, publisher)  # no other fault: restarts a worker that exits
        publisher.join(plan.settle_timeout_s)
        restarter.join(plan.settle_timeout_s)
        after = set(reached[1])
        report.settled = run.settle_stored(settings, lambda audit: after <= audit.turn_keys(),
                                           settings.turns_stream, "ingest", plan.settle_timeout_s)
    finally:
        stop.set()
        restarter.cancel()
        for worker in workers:
            worker.terminate()
    with Audit.connect(settings.database_url) as audit:
        rows = audit.entry_links()
        dead = audit.dead_letter_keys()
    report.published_before, report.published_after = len(reached[0]), len(reached[1])
    report.upstream_lost, report.lost, report.duplicated = count_across_restart(
        reached[0], reached[1], [(r.tenant_id, r.turn_id) for r in rows], dead)
    report.aliases = sum(r.canonical_entry_id is not None for r in rows)
    report.dedupe_violations = dedupe_violations(rows, pairs)
    report.seconds = time.monotonic() - started
    return report


def _restart_empty(run: FaultRun, settings: Settings, lock: threading.Lock, epoch: list[int],
                   report: PhaseReport) -> None:
    """Between two published batches: count what the ingest group has not acknowledged, then bring
    Redis back empty; batches after this reach the new Redis."""
    with lock:
        connection = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        try:
            report.unacked_at_restart = unacknowledged(connection, settings.turns_stream, "ingest")
        finally:
            connection.close()
        run.redis.restart_empty()
        epoch[0] = 1
        report.redis_restarts += 1
