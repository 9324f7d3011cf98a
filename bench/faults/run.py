"""The fault-injection run: plan, report, counting and the fault loop (see :mod:`bench.faults.cli`).

:class:`FaultRun` owns a private Redis and Postgres (:mod:`bench.faults.servers`); a phase
(:mod:`bench.faults.phases`) starts real worker processes, publishes at an even pace with
:func:`publish_paced` while :meth:`FaultRun.chaos` SIGKILLs, SIGSTOPs and restarts workers and
servers, then waits (bounded) for the system to settle and counts from the ids.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import redis

from api.client import MnemosClient
from api.errors import ServiceUnavailable
from api.validation import limits_of
from bench.faults.servers import PostgresCluster, RedisServer, WorkerProcess
from workers.ops.migrate import ensure_database, run_migrations
from workers.runtime.errors import StoreError
from workers.settings import FAKE_MODEL, Settings, to_environment
from workers.store.audit import Audit

if TYPE_CHECKING:
    from bench.faults.shard_figures import ShardFigures

log = logging.getLogger(__name__)

BASE_TIME = datetime(2024, 1, 1, tzinfo=UTC)
EVENTS = ("kill", "pause", "redis", "postgres")


@dataclass(frozen=True)
class FaultPlan:
    """What to publish and which faults to inject (counts are per phase)."""

    turns: int = 600
    outcomes: int = 300
    tenants: int = 4
    workers: int = 3
    kills: int = 3
    pauses: int = 1
    redis_restarts: int = 1
    postgres_restarts: int = 1
    publish_seconds: float = 15.0  # publishing is spread over this long; faults fire during it
    settle_timeout_s: float = 90.0
    claim_idle_ms: int = 1500
    queries: int = 120  # retrieval requests in the query phase
    query_timeout_s: float = 4.0  # the client's own wait per request
    shard_outage_s: float = 5.0  # shards phase: how long one shard's Redis stays down
    seed: int = 0


@dataclass
class PhaseReport:
    """The figures of one phase; ``ok`` when nothing was lost or applied twice."""

    phase: str
    published: int = 0
    accepted: int = 0
    resent: int = 0
    kills: int = 0
    pauses: int = 0
    redis_restarts: int = 0
    postgres_restarts: int = 0
    worker_exits: list[int] = field(default_factory=list)
    lost: int = 0
    duplicated: int = 0
    aliases: int = 0
    dedupe_violations: int = 0
    dead_letters_expected: int = 0
    dead_letters_found: int = 0
    score_mismatches: int = 0
    ledger_mismatches: int = 0
    buffer_violations: int = 0
    publish_retries: int = 0
    # query phase: how each request ended (promise 5)
    answered: int = 0
    typed_failures: dict[str, int] = field(default_factory=dict)
    untyped_failures: list[str] = field(default_factory=list)
    overtime: int = 0  # requests that took longer than their timeout (+ slack) to end
    max_wait_s: float = 0.0
    isolation_violations: int = 0
    retry_ok: bool = True
    # redis_empty phase: turns published before and after Redis came back empty, the turns of the
    # stream no consumer had acknowledged when it went, and the turns Redis took with it (not Mnemos)
    published_before: int = 0
    published_after: int = 0
    unacked_at_restart: int = 0
    upstream_lost: int = 0
    # shards phase: each shard's figures (bench.faults.shard_figures.ShardFigures) and how long its Redis was down
    per_shard: list[ShardFigures] = field(default_factory=list)
    outage_s: float = 0.0
    settled: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.settled and self.lost == 0 and self.duplicated == 0 and self.dedupe_violations == 0
                and self.dead_letters_found == self.dead_letters_expected and self.score_mismatches == 0
                and self.ledger_mismatches == 0 and self.buffer_violations == 0 and not self.untyped_failures
                and self.overtime == 0 and self.isolation_violations == 0 and self.retry_ok
                and self.upstream_lost <= self.unacked_at_restart)

    def line(self) -> str:
        unit = {"turns": "turns", "outcomes": "outcomes", "redis_empty": "turns", "shards": "turns"}.get(self.phase, "requests")
        if self.phase == "turns":
            extra = (f"aliases={self.aliases} dedupe_violations={self.dedupe_violations} "
                     f"dead_letters={self.dead_letters_found}/{self.dead_letters_expected}")
        elif self.phase == "redis_empty":
            extra = (f"published_before={self.published_before} published_after={self.published_after} "
                     f"unacked_at_restart={self.unacked_at_restart} upstream_lost={self.upstream_lost} "
                     f"aliases={self.aliases} dedupe_violations={self.dedupe_violations}")
        elif self.phase == "shards":
            extra = (f"outage_s={self.outage_s:g} answered={self.answered} typed_failures={self.typed_failures} "
                     f"untyped={len(self.untyped_failures)} overtime={self.overtime} "
                     f"isolation_violations={self.isolation_violations} retry_ok={self.retry_ok} "
                     + " ".join(f.summary() for f in self.per_shard))
        elif self.phase == "outcomes":
            extra = (f"score_mismatches={self.score_mismatches} ledger_mismatches={self.ledger_mismatches} "
                     f"buffer_violations={self.buffer_violations}")
        else:
            extra = (f"answered={self.answered} typed_failures={self.typed_failures} "
                     f"untyped={len(self.untyped_failures)} overtime={self.overtime} "
                     f"max_wait_s={self.max_wait_s:.1f} isolation_violations={self.isolation_violations} "
                     f"retry_ok={self.retry_ok}")
        return (f"faults[{self.phase}] {unit}={self.accepted} (re-sent {self.resent}) kills={self.kills} "
                f"pauses={self.pauses} redis_restarts={self.redis_restarts} "
                f"postgres_restarts={self.postgres_restarts} worker_exits={self.worker_exits} lost={self.lost} "
                f"duplicated={self.duplicated} {extra} settled={self.settled} seconds={self.seconds:.1f}")


# --- counting (pure) ------------------------------------------------------------------------------

def count_turns(accepted: Iterable[tuple[str, str]], stored: Iterable[tuple[str, str]],
                dead: Iterable[tuple[str, str]]) -> tuple[int, int]:
    """``(lost, duplicated)`` from turn keys ``(tenant_id, turn_id)``.

    Lost: accepted but not stored. Duplicated: extra rows of a key, stored keys nobody published,
    and accepted turns that were (also) dead-lettered.
    """
    accepted_set = set(accepted)
    rows = Counter(stored)
    lost = len(accepted_set - set(rows))
    duplicated = sum(n - 1 for n in rows.values()) + len(set(rows) - accepted_set) + len(accepted_set & set(dead))
    return lost, duplicated


def count_across_restart(before: Iterable[tuple[str, str]], after: Iterable[tuple[str, str]],
                         stored: Iterable[tuple[str, str]], dead: Iterable[tuple[str, str]]) -> tuple[int, int, int]:
    """``(upstream_lost, lost, duplicated)`` of turn keys published ``before`` and ``after`` Redis
    came back empty.

    Upstream lost: published before, never stored (Redis lost them with its data; not Mnemos).
    Lost: published after, not stored (Mnemos lost them). Duplicated: as :func:`count_turns`, over
    every turn that was published after or stored.
    """
    before_set, after_set, rows = set(before), set(after), list(stored)
    stored_set = set(rows)
    lost, duplicated = count_turns(after_set | (before_set & stored_set), rows, dead)
    return len(before_set - stored_set - after_set), lost, duplicated


def count_scores(actual: dict[Any, float], expected: dict[Any, float], rel: float = 1e-9) -> int:
    """Number of keys whose score differs (a missing key counts as 0.0)."""
    keys = set(actual) | set(expected)
    return sum(not math.isclose(actual.get(k, 0.0), expected.get(k, 0.0), rel_tol=rel, abs_tol=1e-12)
               for k in keys)


# --- the run --------------------------------------------------------------------------------------

class FaultRun:
    """Owns the private servers; each phase gets its own database and stream prefix."""

    def __init__(self, workdir: Path, redis_binary: str | None = None) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir, binary=redis_binary)
        self.postgres = PostgresCluster(workdir)

    def __enter__(self) -> FaultRun:
        self.postgres.init()
        self.postgres.start()
        self.redis.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.redis.stop()
        self.postgres.stop()

    def settings(self, phase: str, plan: FaultPlan) -> Settings:
        database_url = self.postgres.url(f"mnemos_faults_{phase}")
        ensure_database(database_url)
        run_migrations(database_url)
        return Settings(redis_url=self.redis.url, database_url=database_url, stream_prefix=f"faults_{phase}",
                        queue_name=f"faults_{phase}_retrievals", bi_encoder=FAKE_MODEL, cross_encoder=FAKE_MODEL,
                        fake_encoder_dim=64, metrics_enabled=False, block_ms=200, claim_idle_ms=plan.claim_idle_ms,
                        claim_interval_s=0.5, trim_interval_s=1.0, ingest_batch_size=16, outcome_batch_size=16,
                        sample_interval_s=3600.0, clusters_k=3, bootstrap_factor=4)

    def client(self, settings: Settings) -> MnemosClient:
        connection = redis.Redis.from_url(settings.redis_url, socket_timeout=5, socket_connect_timeout=2)
        return MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                            limits=limits_of(settings))

    def wait_for_query_worker(self, settings: Settings, timeout_s: float = 120.0) -> None:
        """Block until a query worker has a live heartbeat (clients refuse at once before that)."""
        client = self.client(settings)
        deadline = time.monotonic() + timeout_s
        while not client.query_workers():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no query worker heartbeat within {timeout_s:.0f}s")
            time.sleep(0.2)

    def workers(self, kind: str, settings: Settings, n: int) -> list[WorkerProcess]:
        env = to_environment(settings)
        return [WorkerProcess(kind, env, self.workdir / f"{settings.stream_prefix}-{kind}-{i}.log") for i in range(n)]

    # faults -------------------------------------------------------------------------------------

    def chaos(self, plan: FaultPlan, workers: list[WorkerProcess], report: PhaseReport,
              publisher: threading.Thread) -> None:
        """Fire the planned faults spread over ``publish_seconds``; restart workers that exit."""
        rng = random.Random(plan.seed + 1)
        events = (["kill"] * plan.kills + ["pause"] * plan.pauses + ["redis"] * plan.redis_restarts
                  + ["postgres"] * plan.postgres_restarts)
        rng.shuffle(events)
        due = [plan.publish_seconds * (i + 1) / (len(events) + 1) for i in range(len(events))]
        pause_s = plan.claim_idle_ms / 1000 * 2.5
        resumes: list[tuple[float, WorkerProcess]] = []
        started = time.monotonic()
        while events or resumes or publisher.is_alive():
            now = time.monotonic() - started
            while events and due[0] <= now:
                self._fire(events.pop(0), due.pop(0), rng, workers, report, resumes, now + pause_s)
            for at, worker in list(resumes):
                if at <= now:
                    worker.resume()
                    resumes.remove((at, worker))
            for worker in workers:
                code = worker.exited()
                if code is not None:
                    report.worker_exits.append(code)
                    log.warning("%s worker exited with %s; restarting it:\n%s", worker.kind, code, worker.tail(600))
                    worker.start()
            time.sleep(0.1)

    def _fire(self, event: str, at: float, rng: random.Random, workers: list[WorkerProcess], report: PhaseReport,
              resumes: list, resume_at: float) -> None:
        log.info("t=%.1fs fault: %s", at, event)
        running = [w for w in workers if not w.paused] or workers
        if event == "kill":
            target = rng.choice(running)
            target.kill()
            target.start()
            report.kills += 1
        elif event == "pause":
            target = rng.choice(running)
            target.pause()
            resumes.append((resume_at, target))
            report.pauses += 1
        elif event == "redis":
            self.redis.restart()
            report.redis_restarts += 1
        else:
            self.postgres.restart()
            report.postgres_restarts += 1

    def settle(self, done: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if done():
                    return True
            except (StoreError, redis.RedisError) as exc:
                log.debug("settle check failed: %s", exc)
            time.sleep(0.5)
        return False

    def settle_stored(self, settings: Settings, stored: Callable[[Audit], bool], stream: str, group: str,
                      timeout_s: float) -> bool:
        """:meth:`settle` until ``stored(audit)`` holds in Postgres and ``group`` has drained ``stream``."""

        def done() -> bool:
            with Audit.connect(settings.database_url, timeout_s=2) as audit:
                reached = stored(audit)
            return reached and self.drained(settings, stream, group)

        return self.settle(done, timeout_s)

    def drained(self, settings: Settings, stream: str, group: str) -> bool:
        connection = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        try:
            info = {g["name"].decode(): g for g in connection.xinfo_groups(stream)}
            last = connection.xinfo_stream(stream)["last-generated-id"]
        finally:
            connection.close()
        state = info.get(group)  # "lag" is Redis >= 7 only: compare the last delivered id instead
        return state is not None and int(state["pending"]) == 0 and state["last-delivered-id"] == last


def publish_paced(batches: Sequence[Callable[[], Any]], seconds: float, report: PhaseReport,
             stop: threading.Event) -> threading.Thread:
    """Run each batch callable at an even pace, retrying a batch until Redis accepts it."""

    def body() -> None:
        pace = seconds / max(1, len(batches))
        started = time.monotonic()
        for i, send in enumerate(batches):
            while not stop.is_set():
                try:
                    send()
                    break
                except (ServiceUnavailable, redis.RedisError) as exc:
                    report.publish_retries += 1
                    log.debug("publish retry: %s", exc)
                    time.sleep(0.2)
            time.sleep(max(0.0, started + (i + 1) * pace - time.monotonic()))

    thread = threading.Thread(target=body, name="fault-publisher", daemon=True)
    thread.start()
    return thread


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(4000)}x{rng.randrange(97)}" for _ in range(n))
