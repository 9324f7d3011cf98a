"""The phases of the fault-injection run: turns (ingest), outcomes (suppression), queries (query).

Each phase uses its own database and stream prefix on the run's private servers, starts real
``mnemos worker <kind>`` processes, publishes while :meth:`bench.faults.run.FaultRun.chaos`
injects the planned faults, waits for the system to settle and fills a
:class:`bench.faults.run.PhaseReport` from the ids.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from api.schemas import Outcome, PoolRow
from bench.faults.run import (
    BASE_TIME,
    FaultPlan,
    FaultRun,
    PhaseReport,
    count_scores,
    count_turns,
    publish_paced,
    words,
)
from mnemos.suppression import UpdateRule, outcome_deltas
from workers.runtime.wire import outcome_record
from workers.settings import Settings
from workers.store.audit import Audit

log = logging.getLogger(__name__)

def run_turns(run: FaultRun, plan: FaultPlan) -> PhaseReport:
    """Phase 1: turns through killed, paused and restarted ingest workers (module docstring)."""
    started = time.monotonic()
    report = PhaseReport("turns")
    settings = run.settings("turns", plan)
    rng = random.Random(plan.seed)
    tenants = [f"tenant-{chr(97 + i)}{plan.seed}" for i in range(plan.tenants)]
    good, pairs, bad = turn_traffic(plan, rng, tenants)
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
    publisher = publish_paced(batches, plan.publish_seconds, report, stop)
    try:
        run.chaos(plan, workers, report, publisher)
        publisher.join(plan.settle_timeout_s)
        accepted = {(t["tenant_id"], t["turn_id"]) for t in good}
        bad_keys = {(b["tenant_id"], b["turn_id"]) for b in bad}
        report.settled = run.settle_stored(
            settings, lambda audit: accepted <= audit.turn_keys() and bad_keys <= audit.dead_letter_keys(),
            settings.turns_stream, "ingest", plan.settle_timeout_s)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
    with Audit.connect(settings.database_url) as audit:
        rows = audit.entry_links()
        dead = audit.dead_letter_keys()
    report.lost, report.duplicated = count_turns(accepted, [(r.tenant_id, r.turn_id) for r in rows], dead)
    report.dead_letters_found = len(bad_keys & dead)
    report.aliases = sum(r.canonical_entry_id is not None for r in rows)
    report.dedupe_violations = dedupe_violations(rows, pairs)
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
    with Audit.connect(settings.database_url) as audit:
        ids = audit.entry_ids()
    outcomes = _random_outcomes(plan, rng, tenants, ids, settings)
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
    publisher = publish_paced(batches, plan.publish_seconds, report, stop)
    accepted = {(o.tenant_id, o.outcome_id) for o in outcomes}
    try:
        run.chaos(plan, workers, report, publisher)
        publisher.join(plan.settle_timeout_s)
        report.settled = run.settle_stored(settings, lambda audit: accepted <= audit.outcome_keys(),
                                           settings.outcomes_stream, "suppression", plan.settle_timeout_s)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
    expected = _expected_scores(outcomes, settings.eta)
    with Audit.connect(settings.database_url) as audit:
        ledger = audit.ledger()
        actual = audit.suppression_scores()
        buffers = audit.buffer_counts()
        frozen = audit.frozen_tenants()
    from_ledger: dict[tuple[str, int, int], float] = {}
    for row in ledger:
        for entry, cluster, delta in row.deltas:
            key = (row.tenant_id, entry, cluster)
            from_ledger[key] = from_ledger.get(key, 0.0) + delta
    ledger_keys = Counter((r.tenant_id, r.outcome_id) for r in ledger)
    report.lost = len(accepted - set(ledger_keys))
    report.duplicated = sum(n - 1 for n in ledger_keys.values()) + len(set(ledger_keys) - accepted)
    report.score_mismatches = count_scores(actual, expected)
    report.ledger_mismatches = count_scores(actual, from_ledger)
    size = settings.clusters_k * settings.bootstrap_factor
    report.buffer_violations = sum(b.rows != size or b.outcomes != b.rows for b in buffers) + len(
        set(tenants) - frozen)
    report.seconds = time.monotonic() - started
    return report


def turn_traffic(plan: FaultPlan, rng: random.Random, tenants: Sequence[str]
                  ) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]], list[dict[str, str]]]:
    """The turns phase's traffic: ``plan.turns`` valid turns round-robin over ``tenants`` (every
    25th a near-duplicate of its tenant's previous turn), the ``(tenant, original, near-duplicate)``
    turn id pairs, and raw stream fields of invalid turns (one in 97, blank text) for the dead letter."""
    good: list[dict[str, Any]] = []
    pairs: list[tuple[str, str, str]] = []  # (tenant, original, near-duplicate)
    bad: list[dict[str, str]] = []
    last: dict[str, dict[str, Any]] = {}
    for i in range(plan.turns):
        tenant = tenants[i % len(tenants)]
        text = words(rng, 8)
        role = "user" if i % 2 else "assistant"
        if i % 25 == 24 and tenant in last:
            text = last[tenant]["text"] + "."
            role = last[tenant]["role"]  # a near-duplicate repeats its speaker too (dedupe's guard)
            pairs.append((tenant, last[tenant]["turn_id"], f"{tenant}-{i:06d}"))
        turn = {"tenant_id": tenant, "session_id": f"s{i // 50}", "turn_id": f"{tenant}-{i:06d}",
                "role": role, "text": text,
                "occurred_at": (BASE_TIME + timedelta(seconds=i)).isoformat()}
        good.append(turn)
        last[tenant] = turn
        if i % 97 == 50:
            bad.append({"v": "1", "tenant_id": tenant, "session_id": "s", "turn_id": f"{tenant}-bad-{i}",
                        "role": "user", "text": " ", "occurred_at": BASE_TIME.isoformat()})
    return good, pairs, bad


def dedupe_violations(rows: Sequence[Any], pairs: Sequence[tuple[str, str, str]]) -> int:
    """Aliases that point outside their tenant or at another alias, plus near-duplicate pairs that
    did not end as one memory (one canonical entry and its alias). ``rows`` are
    :meth:`~workers.store.audit.Audit.entry_links` rows."""
    by_key = {(r.tenant_id, r.turn_id): r for r in rows}
    # an alias points at a canonical entry of its own tenant; each near-duplicate pair is one memory
    violations = sum(
        r.canonical_entry_id is not None and (r.canonical_tenant_id != r.tenant_id or r.canonical_of_canonical is not None)
        for r in rows)
    for tenant, first, second in pairs:
        a, b = by_key.get((tenant, first)), by_key.get((tenant, second))
        if a is None or b is None:
            continue
        one_memory = ((a.canonical_entry_id is None and b.canonical_entry_id == a.entry_id)
                      or (b.canonical_entry_id is None and a.canonical_entry_id == b.entry_id))
        violations += not one_memory
    return violations


def _random_outcomes(plan: FaultPlan, rng: random.Random, tenants: Sequence[str],
                     ids: dict[str, list[int]], settings: Settings) -> list[Outcome]:
    """``plan.outcomes`` outcomes round-robin over ``tenants``: pools of 1-8 of the tenant's entry
    ids (``ids``) with shuffled final ranks and random logits, a random cluster and a random unit
    query embedding of ``settings.fake_encoder_dim``."""
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
    return outcomes


def _expected_scores(outcomes: Sequence[Outcome], eta: float) -> dict[tuple[str, int, int], float]:
    """``(tenant, entry, cluster) -> score`` after applying every outcome once (rank-gap rule)."""
    expected: dict[tuple[str, int, int], float] = {}
    for outcome in outcomes:
        for (entry, cluster), delta in outcome_deltas(outcome_record(outcome), UpdateRule.RANK_GAP,
                                                      eta).items():
            key = (outcome.tenant_id, entry, cluster)
            expected[key] = expected.get(key, 0.0) + delta
    return expected


def seed_entries(run: FaultRun, settings: Settings, tenants: Sequence[str], per_tenant: int) -> None:
    """Entries for the outcome phase: one ingest worker, no faults, until all are stored."""
    rng = random.Random(3)
    turns = [{"tenant_id": t, "session_id": "s", "turn_id": f"{t}-seed-{i}", "role": "user", "text": words(rng, 6),
              "occurred_at": (BASE_TIME + timedelta(minutes=i)).isoformat()} for t in tenants for i in range(per_tenant)]
    run.client(settings).publish_turns(turns)
    worker = run.workers("ingest", settings, 1)[0]
    worker.start()
    try:
        def stored() -> bool:
            with Audit.connect(settings.database_url, timeout_s=2) as audit:
                return audit.count_entries() == len(turns)

        if not run.settle(stored, 60.0):
            raise RuntimeError(f"seeding the outcome phase failed:\n{worker.tail()}")
    finally:
        worker.terminate()


def run_queries(run: FaultRun, plan: FaultPlan, slack_s: float = 2.0) -> PhaseReport:
    """Phase 3 (promise 5): retrievals while query workers are killed and paused and the servers restart.

    Every request must end within its timeout (+ ``slack_s``) with a result or a typed
    :class:`api.errors.MnemosClientError`; every hit must be the asking tenant's; once the faults
    are over, a retry per tenant must succeed.
    """
    from api.errors import MnemosClientError

    started = time.monotonic()
    report = PhaseReport("queries")
    settings = run.settings("queries", plan).replace(retrieve_timeout_s=plan.query_timeout_s, job_timeout_s=30)
    rng = random.Random(plan.seed + 11)
    tenants = [f"tenant-{chr(97 + i)}{plan.seed}" for i in range(plan.tenants)]
    seed_entries(run, settings, tenants, per_tenant=12)
    requests = [(tenants[n % len(tenants)], words(rng, 3)) for n in range(plan.queries)]
    report.accepted = report.published = len(requests)
    lock = threading.Lock()

    def ask(share: Sequence[tuple[str, str]]) -> None:
        client = run.client(settings)
        pace = plan.publish_seconds / max(1, len(share))
        for tenant, query in share:
            began = time.monotonic()
            try:
                result = client.retrieve(tenant, query, k=5, timeout_s=plan.query_timeout_s)
                outcome = "answered"
                foreign = sum(not h.turn_id.startswith(f"{tenant}-") for h in result.hits)
            except MnemosClientError as exc:
                outcome, foreign = type(exc).__name__, 0
            except Exception as exc:  # anything else breaks promise 5
                outcome, foreign = f"untyped {type(exc).__name__}: {exc}", 0
            waited = time.monotonic() - began
            with lock:
                report.max_wait_s = max(report.max_wait_s, waited)
                report.overtime += waited > plan.query_timeout_s + slack_s
                report.isolation_violations += foreign
                if outcome == "answered":
                    report.answered += 1
                elif outcome.startswith("untyped"):
                    report.untyped_failures.append(outcome)
                else:
                    report.typed_failures[outcome] = report.typed_failures.get(outcome, 0) + 1
            time.sleep(max(0.0, pace - waited))

    workers = run.workers("query", settings, max(2, plan.workers - 1))
    for worker in workers:
        worker.start()
    run.wait_for_query_worker(settings)
    askers = [threading.Thread(target=ask, args=(requests[i::2],), daemon=True) for i in range(2)]
    for asker in askers:
        asker.start()
    supervisor = threading.Thread(target=lambda: [a.join() for a in askers], daemon=True)
    supervisor.start()
    try:
        run.chaos(plan, workers, report, supervisor)
        client = run.client(settings)
        try:
            for tenant in tenants:  # after the faults: the same question again must be answered
                result = client.retrieve(tenant, "w1x1 w2x2", k=3, timeout_s=30.0)
                report.retry_ok &= bool(result.hits) and all(h.turn_id.startswith(f"{tenant}-") for h in result.hits)
        except MnemosClientError as exc:
            log.error("retry after the faults failed: %s", exc)
            report.retry_ok = False
        report.settled = True
    finally:
        for worker in workers:
            worker.terminate()
    report.seconds = time.monotonic() - started
    return report
