"""The ``reshard`` phase of ``mnemos bench scale``: growing from ``--shards`` N to N + 1 shards
while turns are in flight (docs/scaling.md "Changing the number of shards").

``--shard-tenants`` LongMemEval question tenants (:func:`bench.scale.data.question_tenants`) start
on N shards (N >= 2: from one shard every stream name changes, docs/scaling.md), an ingest and a
query worker per shard, as deployed. The old shards' ingest workers are paused (SIGSTOP) while
clients publish the first half of every tenant's turns routed over N shards, so that every one of
those turns still waits in an old shard's stream when the change happens: the case in which a moved
tenant's turns sit in two streams at once. Then the new shard's workers are started and the clients
switch to N + 1 shards, as the runbook says (the old shards' workers keep running, and resume), and
publish the second halves. When every shard's ingest group has caught up, the phase checks:

* which tenants moved: every tenant whose shard changed must have moved to the new shard, and the
  new shard's turns stream must hold turns of those tenants only;
* that nothing was lost: each tenant's stored turn ids, read from Postgres, are exactly the ids
  published (both halves, whichever shard's worker stored them), and nothing went to a dead-letter
  stream;
* where requests go: each tenant is asked one question through N + 1 shards, and the shard whose
  query worker ran the job (read from the rq job; unknown when the job expired, counted apart)
  must be the ring's.

The phase's workers never trim their streams (``MNEMOS_TRIM_INTERVAL_S=0``), so the new shard's
stream can be read whole at the end.

Numbers and booleans in the result, not assertions (``tests/integration/test_sharding.py`` asserts
the same properties on small data in ``make test``).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
from tqdm import tqdm

from api.validation import limits_of
from bench.common.datasets import Conversation
from bench.common.harness import (
    ServiceRun,
    group_acknowledged,
    group_caught_up,
    group_info,
    run_client,
    running_service,
    turn_message,
)
from bench.scale.data import question_tenants
from bench.scale.probe import ALIASES, TURNS_INDEXED, scrape, with_free_ports
from bench.scale.run import LONG_WAIT_S, ScaleOptions, phase_stamp, scale_settings
from bench.scale.tenants import shard_requests
from workers.ingest.worker import GROUP as INGEST_GROUP
from workers.settings import Settings

__all__ = ["reshard_phase"]


def _tenants_in_stream(run: ServiceRun, stream: str) -> set[str]:
    """Tenant ids of every message in a turns stream."""
    found: set[str] = set()
    for _id, fields in run.connection.xrange(stream):
        tenant = fields.get(b"tenant_id") or fields.get("tenant_id")
        if tenant is not None:
            found.add(tenant.decode() if isinstance(tenant, bytes) else str(tenant))
    return found


def _waiting(run: ServiceRun, streams: Sequence[str]) -> int:
    """Turns in ``streams`` that their ingest group has not acknowledged: not yet delivered (lag)
    plus delivered and pending. A stream without the group counts its whole length."""
    waiting = 0
    for stream in streams:
        group = group_info(run.connection, stream, INGEST_GROUP)
        if group is None or group.get("lag") is None:
            waiting += int(run.connection.xlen(stream))
        else:
            waiting += int(group["lag"]) + int(group["pending"])
    return waiting


def _wait_caught_up(run: ServiceRun, streams: Sequence[str], total: int, timeout_s: float = LONG_WAIT_S) -> float:
    """Seconds until every stream's ingest group has no lag and nothing pending (a bar of the turns
    acknowledged out of ``total``).

    Raises:
        click.ClickException: past ``timeout_s``.
    """
    started = time.monotonic()
    with tqdm(total=total, desc="ingest (resharding)", unit="turn", disable=None) as bar:
        while not all(group_caught_up(run.connection, s, INGEST_GROUP) for s in streams):
            if time.monotonic() - started > timeout_s:
                raise click.ClickException(f"ingestion did not catch up within {timeout_s:.0f}s")
            done = sum(group_acknowledged(run.connection, s, INGEST_GROUP) or 0 for s in streams)
            bar.update(max(0, done - bar.n))
            time.sleep(0.5)
        bar.update(max(0, total - bar.n))
    return time.monotonic() - started


@contextmanager
def _paused(children: Sequence[Any]) -> Iterator[None]:
    """SIGSTOP the given worker processes for the block, SIGCONT after (also on error)."""
    for child in children:
        os.kill(child.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for child in children:
            os.kill(child.pid, signal.SIGCONT)


def reshard_phase(base: Settings, options: ScaleOptions, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """The ``reshard`` phase (module docstring).

    Raises:
        click.ClickException: for ``--shards`` below 2, or when ingestion does not catch up.
    """
    n = options.shards
    if n < 2:
        raise click.ClickException("the reshard phase grows N >= 2 shards to N + 1 (--shards 2 or more): from one "
                                   "shard every stream name changes, docs/scaling.md \"Changing the number of shards\"")
    grown = scale_settings(base, reranker=options.reranker, stamp=phase_stamp()).replace(shards=n + 1,
                                                                                         trim_interval_s=0.0)
    own = [with_free_ports(grown.replace(shard=shard)) for shard in range(n + 1)]
    tenants = question_tenants(conversations, options.shard_tenants, limits_of(grown))
    streams = [grown.replace(shard=shard).turns_stream for shard in range(n + 1)]
    halves = {t.conversation_id: (t.turns[: len(t.turns) // 2], t.turns[len(t.turns) // 2:]) for t in tenants}
    kinds = ("ingest", "query")
    with running_service(grown, kinds, workers_of=own[:n]) as run:
        before, after = run_client(grown, run.connection, shards=n), run.client
        moved = sorted(t for t in halves if before.shard_of(t) != after.shard_of(t))
        started = time.monotonic()
        with _paused([c for c in run.children if c.args[-1] == "ingest"]):  # the old shards' ingest workers
            for tenant, (first, _second) in halves.items():
                for turn in first:
                    before.publish_turn(turn_message(tenant, turn))
            waiting_at_change = _waiting(run, streams[:n])
            click.echo(f"{sum(len(f) for f, _ in halves.values())} turns published on {n} shards, "
                       f"{waiting_at_change} waiting in the old shards' streams; starting shard {n}")
            clock = time.monotonic()
            run.add_workers(own[n], kinds)
            new_workers_s = time.monotonic() - clock
            for tenant, (_first, second) in halves.items():
                for turn in second:
                    after.publish_turn(turn_message(tenant, turn))
        caught_up_s = _wait_caught_up(run, streams, sum(len(t.turns) for t in tenants))
        ingest_s = time.monotonic() - started
        stored = {t: set(run.entry_turns(t).values()) for t in halves}
        new_stream_tenants = _tenants_in_stream(run, streams[n])
        dead = sum(run.connection.xlen(grown.replace(shard=shard).dead_letter_stream) for shard in range(n + 1))
        indexed = [scrape(s.ingest_metrics_port) for s in own]
        requests = shard_requests(run, tenants, len(tenants), options.k)  # through N + 1 shards
        shard_of = {t: (before.shard_of(t), after.shard_of(t)) for t in halves}
    published = {t: {turn.turn_id for half in pair for turn in half} for t, pair in halves.items()}
    lost = sum(len(published[t] - stored[t]) for t in halves)
    misrouted = sorted({r["tenant"] for r in requests if r["served_by"] is not None and r["served_by"] != r["shard"]})
    unknown = sum(r["served_by"] is None for r in requests)
    click.echo(f"{n} -> {n + 1} shards: {len(moved)} of {len(tenants)} tenants moved, turns lost {lost}, "
               f"requests served by the ring's shard {len(requests) - len(misrouted) - unknown}/{len(requests)}")
    return {
        "shards_before": n, "shards_after": n + 1, "tenants": len(tenants), "turns": sum(map(len, published.values())),
        "turns_published_before_change": sum(len(f) for f, _ in halves.values()),
        "turns_published_after_change": sum(len(s) for _, s in halves.values()),
        "turns_waiting_in_old_streams_at_change": waiting_at_change,
        "moved_tenants_turns_in_old_streams_at_change": sum(len(halves[t][0]) for t in moved),
        "new_shard_workers_ready_s": new_workers_s, "caught_up_after_change_s": caught_up_s,
        "ingest_s_with_worker_start": ingest_s,
        "moved_tenants": moved, "moved_share": len(moved) / len(tenants) if tenants else None,
        "expected_share": 1 / (n + 1),
        "every_moved_tenant_went_to_the_new_shard": all(shard_of[t][1] == n for t in moved),
        "new_shard_stream_holds_only_moved_tenants": new_stream_tenants <= set(moved),
        "new_shard_stream_tenants": len(new_stream_tenants),
        "turns_lost": lost, "turns_unexpected": sum(len(stored[t] - published[t]) for t in halves),
        "dead_letters": dead,
        "per_shard": [{"shard": shard, "tenants_before": sum(b == shard for b, _ in shard_of.values()),
                       "tenants_after": sum(a == shard for _, a in shard_of.values()),
                       "turns_stored_by_its_ingest_worker": indexed[shard].get(TURNS_INDEXED, 0.0)
                       + indexed[shard].get(ALIASES, 0.0)} for shard in range(n + 1)],
        "requests": len(requests), "misrouted_tenants": misrouted, "requests_served_by_unknown_worker": unknown,
        "every_tenant_served_by_its_new_shard": not misrouted and unknown == 0,
    }
