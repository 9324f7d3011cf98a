"""The ``reshard`` phase of ``mnemos bench scale``: growing from ``--shards`` N to N + 1 shards
while turns are in flight (docs/scaling.md "Changing the number of shards").

``--shard-tenants`` LongMemEval question tenants (:func:`bench.scale_data.question_tenants`) start
on N shards, an ingest and a query worker per shard, as deployed. Clients publish the first half of
every tenant's turns routed over N shards; at once, with those turns still waiting in the old
shards' streams, the new shard's workers are started and the clients switch to N + 1 shards, as the
runbook says (the old shards' workers keep running), and publish the second halves. When every
shard's ingest group has caught up, the phase checks:

* which tenants moved: every tenant whose shard changed must have moved to the new shard, and the
  new shard's turns stream must hold turns of those tenants only;
* that nothing was lost: each tenant's stored turn ids, read from Postgres, are exactly the ids
  published (both halves, whichever shard's worker stored them), and nothing went to a dead-letter
  stream;
* where requests go: each tenant is asked one question through N + 1 shards, and the shard whose
  query worker ran the job (read from the rq job) must be the ring's.

Numbers and booleans in the result, not assertions (``tests/integration/test_sharding.py`` asserts
the same properties on small data in ``make test``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import click
from tqdm import tqdm

from api.client import MnemosClient
from api.validation import limits_of
from bench.datasets import Conversation
from bench.scale import ScaleOptions, phase_stamp, scale_settings
from bench.scale_data import question_tenants
from bench.scale_probe import ALIASES, TURNS_INDEXED, query_worker_shards, scrape, served_by, with_free_ports
from bench.service import ServiceRun, group_acknowledged, group_caught_up, running_service, turn_message
from workers.ingest import GROUP as INGEST_GROUP
from workers.settings import Settings

__all__ = ["reshard_phase"]


def _client_of(run: ServiceRun, shards: int) -> MnemosClient:
    """A client of the run's streams and queues that routes tenants over ``shards`` shards."""
    s = run.settings
    return MnemosClient(run.connection, stream_prefix=s.stream_prefix, queue_name=s.queue_name, limits=limits_of(s),
                        retrieve_timeout_s=s.retrieve_timeout_s, job_timeout_s=s.job_timeout_s,
                        result_ttl_s=s.result_ttl_s, shards=shards)


def _tenants_in_stream(run: ServiceRun, stream: str) -> set[str]:
    """Tenant ids of every message in a turns stream."""
    found: set[str] = set()
    for _id, fields in run.connection.xrange(stream):
        tenant = fields.get(b"tenant_id") or fields.get("tenant_id")
        if tenant is not None:
            found.add(tenant.decode() if isinstance(tenant, bytes) else str(tenant))
    return found


def _waiting(run: ServiceRun, streams: Sequence[str]) -> int:
    """Turns in ``streams`` that their ingest group has not acknowledged yet."""
    return sum(int(run.connection.xlen(s)) - (group_acknowledged(run.connection, s, INGEST_GROUP) or 0)
               for s in streams)


def _wait_caught_up(run: ServiceRun, streams: Sequence[str], total: int, timeout_s: float = 86_400.0) -> float:
    """Seconds until every stream's ingest group has no lag and nothing pending (a bar of the turns
    acknowledged out of ``total``)."""
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


def reshard_phase(base: Settings, options: ScaleOptions, conversations: Sequence[Conversation]) -> dict[str, Any]:
    """The ``reshard`` phase (module docstring)."""
    n = options.shards
    grown = scale_settings(base, reranker=options.reranker, stamp=phase_stamp()).replace(shards=n + 1)
    own = [with_free_ports(grown.replace(shard=shard)) for shard in range(n + 1)]
    tenants = question_tenants(conversations, options.shard_tenants, limits_of(grown))
    kinds = ("ingest", "query")
    with running_service(grown, kinds, workers_of=own[:n]) as run:
        before, after = _client_of(run, n), run.client
        shard_before = {t.conversation_id: before.shard_of(t.conversation_id) for t in tenants}
        shard_after = {t.conversation_id: after.shard_of(t.conversation_id) for t in tenants}
        halves = {t.conversation_id: (t.turns[: len(t.turns) // 2], t.turns[len(t.turns) // 2:]) for t in tenants}
        started = time.monotonic()
        for tenant, (first, _second) in halves.items():
            for turn in first:
                before.publish_turn(turn_message(tenant, turn))
        old_streams = [grown.replace(shard=shard).turns_stream for shard in range(n)]
        waiting_at_change = _waiting(run, old_streams)
        click.echo(f"{sum(len(f) for f, _ in halves.values())} turns published on {n} shards; "
                   f"{waiting_at_change} still waiting in the old shards' streams at the change")
        change_s = time.monotonic()
        run.add_workers(own[n], kinds)
        new_workers_s = time.monotonic() - change_s
        for tenant, (_first, second) in halves.items():
            for turn in second:
                after.publish_turn(turn_message(tenant, turn))
        streams = [grown.replace(shard=shard).turns_stream for shard in range(n + 1)]
        total = sum(len(t.turns) for t in tenants)
        caught_up_s = _wait_caught_up(run, streams, total)
        ingest_s = time.monotonic() - started
        stored = {t.conversation_id: set(run.entry_turns(t.conversation_id).values()) for t in tenants}
        new_stream_tenants = _tenants_in_stream(run, streams[n])
        dead = sum(run.connection.xlen(grown.replace(shard=shard).dead_letter_stream) for shard in range(n + 1))
        indexed = [scrape(s.ingest_metrics_port) for s in own]
        names = query_worker_shards(run)
        requests = []
        for tenant in tqdm(tenants, desc="requests after resharding", unit="req", disable=None):
            question = tenant.questions[0].text if tenant.questions else "What did we talk about?"
            result = after.retrieve(tenant.conversation_id, question, k=options.k)
            requests.append({"tenant": tenant.conversation_id, "shard": shard_after[tenant.conversation_id],
                             "served_by": served_by(run, tenant.conversation_id, result.request_id, names)})
    moved = sorted(t for t in shard_before if shard_before[t] != shard_after[t])
    lost = {t.conversation_id: len({turn.turn_id for turn in t.turns} - stored[t.conversation_id]) for t in tenants}
    extra = {t.conversation_id: len(stored[t.conversation_id] - {turn.turn_id for turn in t.turns}) for t in tenants}
    misrouted = sorted({r["tenant"] for r in requests if r["served_by"] != r["shard"]})
    per_shard = [{"shard": shard, "tenants_before": sum(v == shard for v in shard_before.values()),
                  "tenants_after": sum(v == shard for v in shard_after.values()),
                  "turns_stored_by_its_ingest_worker": indexed[shard].get(TURNS_INDEXED, 0.0)
                  + indexed[shard].get(ALIASES, 0.0)} for shard in range(n + 1)]
    click.echo(f"{n} -> {n + 1} shards: {len(moved)} of {len(tenants)} tenants moved (all to shard {n}: "
               f"{all(shard_after[t] == n for t in moved)}), turns lost {sum(lost.values())}, "
               f"requests served by the ring's shard {len(requests) - len(misrouted)}/{len(requests)}")
    return {
        "shards_before": n, "shards_after": n + 1, "tenants": len(tenants), "turns": total,
        "turns_published_before_change": sum(len(f) for f, _ in halves.values()),
        "turns_published_after_change": sum(len(s) for _, s in halves.values()),
        "turns_waiting_in_old_streams_at_change": waiting_at_change,
        "new_shard_workers_ready_s": new_workers_s, "caught_up_after_change_s": caught_up_s,
        "ingest_s": ingest_s, "ingest_turns_per_s": total / ingest_s if ingest_s > 0 else None,
        "moved_tenants": moved, "moved_share": len(moved) / len(tenants) if tenants else None,
        "expected_share": 1 / (n + 1),
        "every_moved_tenant_went_to_the_new_shard": all(shard_after[t] == n for t in moved),
        "new_shard_stream_holds_only_moved_tenants": new_stream_tenants <= set(moved),
        "turns_lost": sum(lost.values()), "turns_unexpected": sum(extra.values()), "dead_letters": dead,
        "per_shard": per_shard, "requests": len(requests), "misrouted_tenants": misrouted,
        "every_tenant_served_by_its_new_shard": not misrouted,
    }
