"""The fault run's multi-shard phase: one shard's Redis goes down while three shards work.

Three shards, each on its own private ``redis-server`` (:class:`bench.faults.servers.RedisServer`)
and its own database on the run's Postgres cluster (``MNEMOS_SHARD_MAP``), with one
``mnemos worker ingest`` and one ``mnemos worker query`` process per shard. ``plan.tenants``
tenants live on each shard (chosen by the ring). One publisher per shard publishes its tenants'
turns at an even pace over ``plan.publish_seconds`` (a batch refused by a shard's Redis is retried
until it is accepted), and one asker per shard sends ``plan.queries`` retrievals over the same time.
Halfway, shard 1's Redis is SIGKILLed, stays down ``plan.shard_outage_s`` seconds and starts again
on the same port with its append-only file (fsync always), as in the other phases.

Counted per shard (:class:`ShardFigures`): turns lost and stored twice, read from that shard's
database after the system settled (a turn of a tenant of another shard counts as duplicated);
retrievals answered and failed, by error class; for the shard that went down, the retrievals that
failed with :class:`api.errors.ShardUnavailable` naming it and the longest time one took to fail;
for every shard, the latency of answered retrievals before the outage (each tenant's first, a cold
index load, left out), during it (begun between the kill and the restart) and after it. The
isolation claim (docs/scaling.md "Shards on their own servers") holds when the healthy shards
answered during the outage and none of their retrievals failed.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from api import sharding
from api.client import MnemosClient
from api.errors import MnemosClientError, ShardUnavailable
from bench.faults.phases import dedupe_violations, turn_traffic
from bench.faults.run import FaultPlan, FaultRun, PhaseReport, count_turns, publish_paced, words
from bench.faults.servers import RedisServer, WorkerProcess
from bench.faults.shard_figures import ShardFigures
from workers.runtime.connections import settings_client
from workers.settings import Settings, to_environment
from workers.store.audit import Audit

PHASE = "shards"
SHARDS = 3
DOWN = 1  # the shard whose Redis goes down


@dataclass(frozen=True)
class Ask:
    """One retrieval of the phase: when it began (monotonic seconds), how long it took and how it ended."""

    shard: int
    tenant: str
    began: float
    seconds: float
    outcome: str  # "answered", an api.errors class name, or "untyped <class>: <message>"
    named_shard: int | None = None  # the shard a ShardUnavailable named
    foreign_hits: int = 0
    first: bool = False  # the tenant's first retrieval (a cold index load)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` quantile (0 < q <= 1) of ``values``; None when there are none."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def shard_tenants(per_shard: int, shards: int, prefix: str = "tenant") -> dict[int, list[str]]:
    """``per_shard`` tenant ids (``<prefix>-<n>``, n = 0, 1, ...) on each of ``shards`` shards of the
    ring, the first ones found; shared by this phase and the shard tests."""
    found: dict[int, list[str]] = {shard: [] for shard in range(shards)}
    for number in itertools.count():
        tenant = f"{prefix}-{number}"
        owned = found[sharding.shard_of(tenant, shards)]
        if len(owned) < per_shard:
            owned.append(tenant)
        if all(len(t) == per_shard for t in found.values()):
            return found
    raise AssertionError("unreachable")


def shard_figures(shard: int, asks: Sequence[Ask], window: tuple[float, float]) -> ShardFigures:
    """The retrieval figures of ``shard`` from every ask of the phase; ``window`` is (down, up) in
    monotonic seconds: when shard DOWN's Redis was killed and when it answered again."""
    down, up = window
    own = [a for a in asks if a.shard == shard]
    figures = ShardFigures(shard)
    for ask in own:
        in_outage = down <= ask.began < up
        if ask.outcome == "answered":
            figures.answered += 1
            figures.answered_during += in_outage
            continue
        figures.failed[ask.outcome] = figures.failed.get(ask.outcome, 0) + 1
        figures.failed_during += in_outage
        figures.unavailable_named += ask.outcome == "ShardUnavailable" and ask.named_shard == shard
        figures.max_fail_s = max(figures.max_fail_s, ask.seconds)
    answered = [a for a in own if a.outcome == "answered"]
    before = [a.seconds for a in answered if a.began < down and not a.first]
    during = [a.seconds for a in answered if down <= a.began < up]
    after = [a.seconds for a in answered if a.began >= up]
    figures.p50_before_s, figures.p95_before_s = percentile(before, 0.5), percentile(before, 0.95)
    figures.p50_during_s, figures.p95_during_s = percentile(during, 0.5), percentile(during, 0.95)
    figures.p50_after_s, figures.p95_after_s = percentile(after, 0.5), percentile(after, 0.95)
    return figures


def isolation_violations(figures: Sequence[ShardFigures], asks: Sequence[Ask]) -> int:
    """Broken isolation: a healthy shard's failed retrieval, a healthy shard that answered nothing
    during the outage, a ShardUnavailable naming another shard than the asker's, a foreign hit."""
    healthy = [f for f in figures if f.shard != DOWN]
    return (sum(sum(f.failed.values()) for f in healthy) + sum(f.answered_during == 0 for f in healthy)
            + sum(a.named_shard is not None and a.named_shard != a.shard for a in asks)
            + sum(a.foreign_hits for a in asks))


def _ask_once(client: MnemosClient, shard: int, tenant: str, query: str, timeout_s: float, first: bool) -> Ask:
    began = time.monotonic()
    named, foreign = None, 0
    try:
        result = client.retrieve(tenant, query, k=5, timeout_s=timeout_s)
        outcome = "answered"
        foreign = sum(not h.turn_id.startswith(f"{tenant}-") for h in result.hits)
    except ShardUnavailable as exc:
        outcome, named = type(exc).__name__, exc.shard if f"shard {exc.shard}" in str(exc) else None
    except MnemosClientError as exc:
        outcome = type(exc).__name__
    except Exception as exc:  # anything else breaks promise 5
        outcome = f"untyped {type(exc).__name__}: {exc}"
    return Ask(shard, tenant, began, time.monotonic() - began, outcome, named, foreign, first)


def asker(client: MnemosClient, shard: int, tenants: Sequence[str], plan: FaultPlan, asks: list[Ask],
          stop: threading.Event) -> threading.Thread:
    """A thread sending ``plan.queries`` retrievals of ``tenants`` (round-robin) at an even pace over
    ``plan.publish_seconds``; each ends in ``asks``."""
    rng = random.Random(plan.seed * 31 + shard)

    def body() -> None:
        pace = plan.publish_seconds / max(1, plan.queries)
        started, seen = time.monotonic(), set()
        for n in range(plan.queries):
            if stop.is_set():
                return
            tenant = tenants[n % len(tenants)]
            asks.append(_ask_once(client, shard, tenant, words(rng, 3), plan.query_timeout_s, tenant not in seen))
            seen.add(tenant)
            time.sleep(max(0.0, started + (n + 1) * pace - time.monotonic()))

    thread = threading.Thread(target=body, name=f"shard-{shard}-asker", daemon=True)
    thread.start()
    return thread


def shard_settings(run: FaultRun, plan: FaultPlan, servers: Sequence[RedisServer]) -> Settings:
    """Settings of the phase's deployment (shard 0's view): a migrated database per shard on the run's
    Postgres cluster, and a shard map naming each shard's own Redis and database."""
    own = [run.settings(f"{PHASE}_{n}", plan) for n in range(len(servers))]  # creates and migrates each
    shard_map = json.dumps({str(n): {"redis_url": s.url, "database_url": o.database_url}
                            for n, (s, o) in enumerate(zip(servers, own, strict=True))})
    return own[0].replace(stream_prefix=f"faults_{PHASE}", queue_name=f"faults_{PHASE}_retrievals",
                          shards=len(servers), shard_map=shard_map, retrieve_timeout_s=plan.query_timeout_s,
                          job_timeout_s=30)


def sharded_client(settings: Settings) -> MnemosClient:
    """A client of every shard, each on its shard's Redis, built as the ``mnemos`` processes build theirs
    (:func:`workers.runtime.connections.settings_client`, with the shard map's servers)."""
    return settings_client(settings)


def wait_until(done: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll ``done`` until it returns something true; TimeoutError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:.0f}s")
        time.sleep(0.2)


@dataclass
class Traffic:
    """What the phase sent: turn keys each shard accepted, near-duplicate pairs, every retrieval, and
    the outage window ``[down, up]`` in monotonic seconds (infinite until it happened)."""

    accepted: dict[int, list[tuple[str, str]]]
    pairs: list[tuple[str, str, str]]
    asks: list[Ask] = field(default_factory=list)
    window: list[float] = field(default_factory=lambda: [math.inf, math.inf])


def start_workers(run: FaultRun, settings: Settings) -> list[WorkerProcess]:
    """One ingest and one query worker process per shard, each with its shard's settings."""
    workers: list[WorkerProcess] = []
    for shard in range(settings.shards):
        env = to_environment(settings.for_shard(shard))
        for kind in ("ingest", "query"):
            worker = WorkerProcess(kind, env, run.workdir / f"{PHASE}-{shard}-{kind}.log")
            worker.start()
            workers.append(worker)
    return workers


def outage(server: RedisServer, seconds: float, window: list[float], report: PhaseReport) -> None:
    """SIGKILL ``server``, keep it down ``seconds`` (the deliberate outage), start it again on its port
    with its append-only file; ``window`` gets the kill and the first answer after the restart."""
    window[0] = time.monotonic()
    server.kill()
    time.sleep(seconds)
    server.start()
    window[1] = time.monotonic()
    report.redis_restarts += 1


def send_traffic(run: FaultRun, plan: FaultPlan, settings: Settings, tenants: dict[int, list[str]],
                 down: RedisServer, workers: list[WorkerProcess], report: PhaseReport) -> Traffic:
    """Publish every shard's turns and ask its retrievals (one thread each per shard, each with its own
    client) while shard DOWN's Redis goes down halfway; returns when all have ended (or the deadline
    of ``publish_seconds + settle_timeout_s`` stopped them), restarting workers that exit meanwhile."""
    everyone = [t for shard in range(SHARDS) for t in tenants[shard]]
    good, pairs, _malformed = turn_traffic(plan, random.Random(plan.seed + 17), everyone)
    traffic = Traffic({shard: [] for shard in range(SHARDS)}, pairs)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    for shard in range(SHARDS):
        client, own = sharded_client(settings), set(tenants[shard])
        mine = [t for t in good if t["tenant_id"] in own]

        def send(chunk: list[dict[str, Any]], client: MnemosClient = client, shard: int = shard) -> None:
            client.publish_turns(chunk)
            traffic.accepted[shard].extend((t["tenant_id"], t["turn_id"]) for t in chunk)

        batches: list[Callable[[], Any]] = [functools.partial(send, mine[i:i + 10]) for i in range(0, len(mine), 10)]
        threads.append(publish_paced(batches, plan.publish_seconds, report, stop))
        threads.append(asker(sharded_client(settings), shard, tenants[shard], plan, traffic.asks, stop))
    fault = threading.Timer(plan.publish_seconds / 2, outage, (down, plan.shard_outage_s, traffic.window, report))
    watchdog = threading.Timer(plan.publish_seconds + plan.settle_timeout_s, stop.set)
    for timer in (fault, watchdog):
        timer.daemon = True
        timer.start()
    def join_all() -> None:
        for thread in [*threads, fault]:
            thread.join()

    supervisor = threading.Thread(target=join_all, daemon=True)
    supervisor.start()
    try:
        quiet = replace(plan, kills=0, pauses=0, redis_restarts=0, postgres_restarts=0)
        run.chaos(quiet, workers, report, supervisor)  # no other fault: restarts a worker that exits
    finally:
        stop.set()
        watchdog.cancel()
    report.settled = not math.isinf(traffic.window[1])  # the outage happened and Redis came back
    return traffic


def settled(run: FaultRun, settings: Settings, shard: int, accepted: Sequence[tuple[str, str]]) -> bool:
    """Every turn ``shard`` accepted is stored in its database, and its ingest group read and
    acknowledged its whole turns stream."""
    own = settings.for_shard(shard)
    with Audit.connect(own.database_url, timeout_s=2) as audit:
        stored = audit.turn_keys()
    return set(accepted) <= stored and run.drained(own, own.turns_stream, "ingest")


def count(settings: Settings, tenants: dict[int, list[str]], traffic: Traffic, plan: FaultPlan,
          report: PhaseReport, slack_s: float = 2.0) -> None:
    """Fill ``report`` with the per-shard figures (:class:`ShardFigures`) and their totals."""
    for shard in range(SHARDS):
        with Audit.connect(settings.for_shard(shard).database_url) as audit:
            rows, dead = audit.entry_links(), audit.dead_letter_keys()
        figures = shard_figures(shard, traffic.asks, (traffic.window[0], traffic.window[1]))
        figures.tenants, figures.turns = len(tenants[shard]), len(traffic.accepted[shard])
        figures.lost, figures.duplicated = count_turns(traffic.accepted[shard],
                                                       [(r.tenant_id, r.turn_id) for r in rows], dead)
        report.aliases += sum(r.canonical_entry_id is not None for r in rows)
        report.dedupe_violations += dedupe_violations(rows, traffic.pairs)
        report.per_shard.append(figures)
    report.accepted = report.published = sum(f.turns for f in report.per_shard)
    report.lost = sum(f.lost for f in report.per_shard)
    report.duplicated = sum(f.duplicated for f in report.per_shard)
    for ask in traffic.asks:
        report.max_wait_s = max(report.max_wait_s, ask.seconds)
        report.overtime += ask.seconds > plan.query_timeout_s + slack_s
        if ask.outcome == "answered":
            report.answered += 1
        elif ask.outcome.startswith("untyped"):
            report.untyped_failures.append(ask.outcome)
        else:
            report.typed_failures[ask.outcome] = report.typed_failures.get(ask.outcome, 0) + 1
    report.isolation_violations = isolation_violations(report.per_shard, traffic.asks)


def retry_each_shard(settings: Settings, tenants: dict[int, list[str]]) -> bool:
    """After the outage, a retrieval of one tenant per shard is answered with its own turns."""
    client = sharded_client(settings)
    try:
        for owned in tenants.values():
            result = client.retrieve(owned[0], "w1x1 w2x2", k=3, timeout_s=30.0)
            if not result.hits or not all(h.turn_id.startswith(f"{owned[0]}-") for h in result.hits):
                return False
    except MnemosClientError:
        return False
    return True


def run_shards(run: FaultRun, plan: FaultPlan) -> PhaseReport:
    """Three shards on their own servers while shard 1's Redis goes down and comes back (module docstring)."""
    started = time.monotonic()
    report = PhaseReport(PHASE, outage_s=plan.shard_outage_s)
    servers = [RedisServer(run.workdir / PHASE / f"shard-{n}", binary=run.redis.binary) for n in range(SHARDS)]
    workers: list[WorkerProcess] = []
    try:
        for server in servers:
            server.start()
        settings = shard_settings(run, plan, servers)
        tenants = shard_tenants(plan.tenants, SHARDS, prefix=f"tenant-{plan.seed}")
        workers = start_workers(run, settings)
        client = sharded_client(settings)
        for shard in range(SHARDS):
            wait_until(functools.partial(client.query_workers, tenants[shard][0]), 120.0,
                       f"no query worker heartbeat on shard {shard}")
        traffic = send_traffic(run, plan, settings, tenants, servers[DOWN], workers, report)
        def done() -> bool:
            return all(settled(run, settings, n, traffic.accepted[n]) for n in range(SHARDS))

        report.settled &= run.settle(done, plan.settle_timeout_s)
        report.retry_ok = retry_each_shard(settings, tenants)
    finally:
        for worker in workers:
            worker.terminate()
        for server in servers:
            server.stop()
    count(settings, tenants, traffic, plan, report)
    report.seconds = time.monotonic() - started
    return report


def shard_table(report: PhaseReport) -> list[str]:
    """The per-shard figures of a shards report as Markdown table lines."""
    def ms(p50: float | None, p95: float | None) -> str:
        return "-" if p50 is None or p95 is None else f"{p50 * 1000:.0f} / {p95 * 1000:.0f}"

    rows = ["| shard | tenants | turns | lost | duplicated | retrievals answered (during the outage) | failed "
            "(during the outage) | ShardUnavailable naming the shard | longest time to fail | p50 / p95 ms, before the outage "
            "| during | after |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for f in report.per_shard:
        failed = ", ".join(f"{k} {v}" for k, v in sorted(f.failed.items())) or "0"
        label = f"{f.shard} (Redis down {report.outage_s:g} s)" if f.shard == DOWN else str(f.shard)
        rows.append(f"| {label} | {f.tenants} | {f.turns} | {f.lost} | {f.duplicated} | {f.answered} "
                    f"({f.answered_during}) | {failed} ({f.failed_during}) | {f.unavailable_named} | "
                    f"{f.max_fail_s:.2f} s | {ms(f.p50_before_s, f.p95_before_s)} | "
                    f"{ms(f.p50_during_s, f.p95_during_s)} | {ms(f.p50_after_s, f.p95_after_s)} |")
    return rows
