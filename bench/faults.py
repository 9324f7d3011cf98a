"""Fault-injection runner: real worker processes, private Redis and Postgres, faults, then a count.

Promise 1 (turns) and promise 2 (outcomes) of issue 4, checked from the ids:

* **turns**: uniquely identified turns of several tenants (some near-duplicates that must become
  aliases, some exact re-sends, a few malformed ones that must become dead letters) are published
  while ``mnemos worker ingest`` processes are SIGKILLed and restarted, one is SIGSTOPped past the
  claim idle time and SIGCONTed, Redis is SIGKILLed and restarted (append-only file, fsync
  always) and Postgres is crashed (``pg_ctl stop -m immediate``) and restarted. Then every
  accepted turn must be in Postgres exactly once, as an entry or an alias.
* **outcomes**: the same faults against ``mnemos worker suppression`` processes; every accepted
  outcome must be in the ledger once and the scores must equal a recomputation from the
  published outcomes and from the ledger.

``python -m bench.faults --turns 5000 --outcomes 2000 --kills 8`` runs a longer version and can
write the figures as Markdown (``--markdown bench/results/faults.md``). Fake models (hashing
encoder), loopback only, everything in one temporary directory.
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import shlex
import shutil
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import redis

from api.client import MnemosClient
from api.errors import ServiceUnavailable
from api.schemas import Outcome, PoolRow
from bench.fault_servers import PostgresCluster, RedisServer, WorkerProcess
from mnemos.suppression import UpdateRule, outcome_deltas
from workers.ingest import limits_of
from workers.migrate import ensure_database, run_migrations
from workers.settings import FAKE_MODEL, Settings, to_environment
from workers.suppression import core_outcome

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
    settled: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return (self.settled and self.lost == 0 and self.duplicated == 0 and self.dedupe_violations == 0
                and self.dead_letters_found == self.dead_letters_expected and self.score_mismatches == 0
                and self.ledger_mismatches == 0 and self.buffer_violations == 0)

    def line(self) -> str:
        unit = "turns" if self.phase == "turns" else "outcomes"
        extra = (f"aliases={self.aliases} dedupe_violations={self.dedupe_violations} "
                 f"dead_letters={self.dead_letters_found}/{self.dead_letters_expected}" if self.phase == "turns"
                 else f"score_mismatches={self.score_mismatches} ledger_mismatches={self.ledger_mismatches} "
                      f"buffer_violations={self.buffer_violations}")
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


def count_scores(actual: dict[Any, float], expected: dict[Any, float], rel: float = 1e-9) -> int:
    """Number of keys whose score differs (a missing key counts as 0.0)."""
    keys = set(actual) | set(expected)
    return sum(not math.isclose(actual.get(k, 0.0), expected.get(k, 0.0), rel_tol=rel, abs_tol=1e-12)
               for k in keys)


# --- the run --------------------------------------------------------------------------------------

class FaultRun:
    """Owns the private servers; each phase gets its own database and stream prefix."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.redis = RedisServer(workdir)
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
            except (psycopg.Error, redis.RedisError) as exc:
                log.debug("settle check failed: %s", exc)
            time.sleep(0.5)
        return False

    def drained(self, settings: Settings, stream: str, group: str) -> bool:
        connection = redis.Redis.from_url(settings.redis_url, socket_timeout=5)
        try:
            info = {g["name"].decode(): g for g in connection.xinfo_groups(stream)}
            last = connection.xinfo_stream(stream)["last-generated-id"]
        finally:
            connection.close()
        state = info.get(group)  # "lag" is Redis >= 7 only: compare the last delivered id instead
        return state is not None and int(state["pending"]) == 0 and state["last-delivered-id"] == last


def _publish(batches: Sequence[Callable[[], Any]], seconds: float, report: PhaseReport,
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


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(4000)}x{rng.randrange(97)}" for _ in range(n))


def run_turns(run: FaultRun, plan: FaultPlan) -> PhaseReport:
    """Phase 1: turns through killed, paused and restarted ingest workers (module docstring)."""
    started = time.monotonic()
    report = PhaseReport("turns")
    settings = run.settings("turns", plan)
    rng = random.Random(plan.seed)
    tenants = [f"tenant-{chr(97 + i)}{plan.seed}" for i in range(plan.tenants)]
    good: list[dict[str, Any]] = []
    pairs: list[tuple[str, str, str]] = []  # (tenant, original, near-duplicate)
    bad: list[dict[str, str]] = []
    last: dict[str, dict[str, Any]] = {}
    for i in range(plan.turns):
        tenant = tenants[i % len(tenants)]
        text = _words(rng, 8)
        if i % 25 == 24 and tenant in last:
            text = last[tenant]["text"] + "."
            pairs.append((tenant, last[tenant]["turn_id"], f"{tenant}-{i:06d}"))
        turn = {"tenant_id": tenant, "session_id": f"s{i // 50}", "turn_id": f"{tenant}-{i:06d}",
                "role": "user" if i % 2 else "assistant", "text": text,
                "occurred_at": (BASE_TIME + timedelta(seconds=i)).isoformat()}
        good.append(turn)
        last[tenant] = turn
        if i % 97 == 50:
            bad.append({"v": "1", "tenant_id": tenant, "session_id": "s", "turn_id": f"{tenant}-bad-{i}",
                        "role": "user", "text": " ", "occurred_at": BASE_TIME.isoformat()})
    client = run.client(settings)
    batches: list[Callable[[], Any]] = []
    for start in range(0, len(good), 10):
        chunk = good[start:start + 10]
        if start % 40 == 0:
            chunk = [*chunk, chunk[0]]  # an exact re-send, as a client retry would produce
            report.resent += 1
        batches.append(lambda chunk=chunk: client.publish_turns(chunk))
    for fields in bad:
        batches.insert(rng.randrange(len(batches)), lambda fields=fields: client.connection.xadd(
            settings.turns_stream, fields))
    report.published = len(good) + len(bad)
    report.accepted = len(good)
    report.dead_letters_expected = len(bad)

    workers = run.workers("ingest", settings, plan.workers)
    for worker in workers:
        worker.start()
    stop = threading.Event()
    publisher = _publish(batches, plan.publish_seconds, report, stop)
    try:
        run.chaos(plan, workers, report, publisher)
        publisher.join(plan.settle_timeout_s)
        accepted = {(t["tenant_id"], t["turn_id"]) for t in good}
        bad_keys = {(b["tenant_id"], b["turn_id"]) for b in bad}

        def done() -> bool:
            with psycopg.connect(settings.database_url, connect_timeout=2) as conn:
                stored = set(conn.execute("SELECT tenant_id, turn_id FROM entries").fetchall())
                dead = set(conn.execute("SELECT tenant_id, turn_id FROM dead_letters").fetchall())
            return accepted <= stored and bad_keys <= dead and run.drained(settings, settings.turns_stream, "ingest")

        report.settled = run.settle(done, plan.settle_timeout_s)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
    with psycopg.connect(settings.database_url) as conn:
        rows = conn.execute("SELECT e.tenant_id, e.turn_id, e.entry_id, e.canonical_entry_id, c.tenant_id,"
                            " c.canonical_entry_id FROM entries e LEFT JOIN entries c"
                            " ON c.entry_id = e.canonical_entry_id").fetchall()
        dead = conn.execute("SELECT tenant_id, turn_id FROM dead_letters").fetchall()
    report.lost, report.duplicated = count_turns(accepted, [(r[0], r[1]) for r in rows], dead)
    report.dead_letters_found = len(bad_keys & set(dead))
    report.aliases = sum(r[3] is not None for r in rows)
    by_key = {(r[0], r[1]): r for r in rows}
    # an alias points at a canonical entry of its own tenant; each near-duplicate pair is one memory
    report.dedupe_violations = sum(r[3] is not None and (r[4] != r[0] or r[5] is not None) for r in rows)
    for tenant, first, second in pairs:
        a, b = by_key.get((tenant, first)), by_key.get((tenant, second))
        if a is None or b is None:
            continue
        one_memory = (a[3] is None and b[3] == a[2]) or (b[3] is None and a[3] == b[2])
        report.dedupe_violations += not one_memory
    report.seconds = time.monotonic() - started
    return report


def run_outcomes(run: FaultRun, plan: FaultPlan) -> PhaseReport:
    """Phase 2: outcomes through killed, paused and restarted suppression workers."""
    started = time.monotonic()
    report = PhaseReport("outcomes")
    settings = run.settings("outcomes", plan)
    rng = random.Random(plan.seed + 7)
    tenants = [f"tenant-{chr(97 + i)}{plan.seed}" for i in range(plan.tenants)]
    seed_entries(run, settings, tenants, per_tenant=12)
    with psycopg.connect(settings.database_url) as conn:
        ids: dict[str, list[int]] = {}
        for tenant, entry_id in conn.execute("SELECT tenant_id, entry_id FROM entries ORDER BY entry_id"):
            ids.setdefault(tenant, []).append(int(entry_id))
    outcomes: list[Outcome] = []
    for n in range(plan.outcomes):
        tenant = tenants[n % len(tenants)]
        members = rng.sample(ids[tenant], rng.randint(1, min(8, len(ids[tenant]))))
        finals = list(range(1, len(members) + 1))
        rng.shuffle(finals)
        pool = tuple(PoolRow(e, i + 1, f, rng.uniform(-3, 3)) for i, (e, f) in enumerate(zip(members, finals,
                                                                                              strict=True)))
        vector = [rng.gauss(0, 1) for _ in range(settings.fake_encoder_dim)]
        norm = math.sqrt(sum(x * x for x in vector))
        outcomes.append(Outcome(f"{tenant}-o{n:06d}", tenant, rng.randrange(settings.clusters_k), len(pool), pool,
                                tuple(x / norm for x in vector)))
    connection = run.client(settings).connection
    batches: list[Callable[[], Any]] = []
    for start in range(0, len(outcomes), 8):
        chunk = outcomes[start:start + 8]
        if start % 32 == 0:
            chunk = [*chunk, chunk[0]]  # the same outcome twice on the stream
            report.resent += 1

        def send(chunk: list[Outcome] = chunk) -> None:
            pipe = connection.pipeline(transaction=False)
            for outcome in chunk:
                pipe.xadd(settings.outcomes_stream, outcome.to_stream_fields())  # type: ignore[arg-type]
            pipe.execute()

        batches.append(send)
    report.published = report.accepted = len(outcomes)

    workers = run.workers("suppression", settings, plan.workers)
    for worker in workers:
        worker.start()
    stop = threading.Event()
    publisher = _publish(batches, plan.publish_seconds, report, stop)
    accepted = {(o.tenant_id, o.outcome_id) for o in outcomes}
    try:
        run.chaos(plan, workers, report, publisher)
        publisher.join(plan.settle_timeout_s)

        def done() -> bool:
            with psycopg.connect(settings.database_url, connect_timeout=2) as conn:
                ledger = set(conn.execute("SELECT tenant_id, outcome_id FROM applied_outcomes").fetchall())
            return accepted <= ledger and run.drained(settings, settings.outcomes_stream, "suppression")

        report.settled = run.settle(done, plan.settle_timeout_s)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
    expected: dict[tuple[str, int, int], float] = {}
    for outcome in outcomes:
        for (entry, cluster), delta in outcome_deltas(core_outcome(outcome), UpdateRule.RANK_GAP,
                                                      settings.eta).items():
            key = (outcome.tenant_id, entry, cluster)
            expected[key] = expected.get(key, 0.0) + delta
    with psycopg.connect(settings.database_url) as conn:
        ledger = conn.execute("SELECT tenant_id, outcome_id, deltas FROM applied_outcomes ORDER BY applied_at").fetchall()
        actual = {(t, int(e), int(c)): float(s) for t, e, c, s in conn.execute(
            "SELECT tenant_id, entry_id, cluster, score FROM suppression")}
        buffers = conn.execute("SELECT tenant_id, count(*), count(DISTINCT outcome_id) FROM query_buffer"
                               " GROUP BY tenant_id").fetchall()
        frozen = {r[0] for r in conn.execute("SELECT tenant_id FROM centroids")}
    from_ledger: dict[tuple[str, int, int], float] = {}
    for tenant, _oid, deltas in ledger:
        for entry, cluster, delta in deltas:
            key = (tenant, int(entry), int(cluster))
            from_ledger[key] = from_ledger.get(key, 0.0) + float(delta)
    ledger_keys = Counter((t, o) for t, o, _ in ledger)
    report.lost = len(accepted - set(ledger_keys))
    report.duplicated = sum(n - 1 for n in ledger_keys.values()) + len(set(ledger_keys) - accepted)
    report.score_mismatches = count_scores(actual, expected)
    report.ledger_mismatches = count_scores(actual, from_ledger)
    size = settings.clusters_k * settings.bootstrap_factor
    report.buffer_violations = sum(n != size or distinct != n for _, n, distinct in buffers) + len(
        set(tenants) - frozen)
    report.seconds = time.monotonic() - started
    return report


def seed_entries(run: FaultRun, settings: Settings, tenants: Sequence[str], per_tenant: int) -> None:
    """Entries for the outcome phase: one ingest worker, no faults, until all are stored."""
    rng = random.Random(3)
    turns = [{"tenant_id": t, "session_id": "s", "turn_id": f"{t}-seed-{i}", "role": "user", "text": _words(rng, 6),
              "occurred_at": (BASE_TIME + timedelta(minutes=i)).isoformat()} for t in tenants for i in range(per_tenant)]
    run.client(settings).publish_turns(turns)
    worker = run.workers("ingest", settings, 1)[0]
    worker.start()
    try:
        def stored() -> bool:
            with psycopg.connect(settings.database_url, connect_timeout=2) as conn:
                return conn.execute("SELECT count(*) FROM entries").fetchone()[0] == len(turns)

        if not run.settle(stored, 60.0):
            raise RuntimeError(f"seeding the outcome phase failed:\n{worker.tail()}")
    finally:
        worker.terminate()


def markdown(reports: Sequence[PhaseReport], plan: FaultPlan, command: str) -> str:
    rows = ["| phase | accepted | re-sent | kills | pauses | redis restarts | postgres restarts | worker exits "
            "| lost | duplicated | checks | seconds |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in reports:
        checks = (f"aliases {r.aliases}, dedupe violations {r.dedupe_violations}, dead letters "
                  f"{r.dead_letters_found}/{r.dead_letters_expected}" if r.phase == "turns" else
                  f"score mismatches {r.score_mismatches}, ledger mismatches {r.ledger_mismatches}, "
                  f"bootstrap buffer violations {r.buffer_violations}")
        rows.append(f"| {r.phase} | {r.accepted} | {r.resent} | {r.kills} | {r.pauses} | {r.redis_restarts} | "
                    f"{r.postgres_restarts} | {len(r.worker_exits)} | {r.lost} | {r.duplicated} | {checks} | "
                    f"{r.seconds:.1f} |")
    return "\n".join([f"Command: `{command}`", "", f"Plan: `{asdict(plan)}`", "", *rows, ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = FaultPlan()
    for name, value in asdict(defaults).items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(value), default=value)
    parser.add_argument("--markdown", type=Path, default=None, help="write the figures here")
    parser.add_argument("--workdir", type=Path, default=None, help="parent of the temporary directory")
    parser.add_argument("--keep", action="store_true", help="keep the servers' files and worker logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    plan = replace(defaults, **{k: getattr(args, k) for k in asdict(defaults)})
    tmp = Path(tempfile.mkdtemp(prefix="mnemos-faults-", dir=args.workdir))
    tmp.chmod(0o755)  # the postgres user must reach its data directory inside
    try:
        with FaultRun(tmp) as run:
            reports = [run_turns(run, plan), run_outcomes(run, plan)]
    finally:
        if args.keep:
            print(f"files and logs kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    for report in reports:
        print(report.line())
    if args.markdown is not None:
        command = "python -m bench.faults " + shlex.join(sys.argv[1:] if argv is None else argv)
        args.markdown.write_text(markdown(reports, plan, command))
    return 0 if all(r.ok for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
