"""The service harness of the benchmarks: a run's own database, streams and worker processes.

:func:`running_service` creates and migrates a fresh database ``mnemos_bench_<stamp>``, starts the
ingest, query and suppression workers as processes (``python -m workers worker ...``) on a stream
prefix and queue of the run's own, waits until they listen, and removes everything on exit.
:func:`publish_tenants` publishes dataset conversations turn by turn, as an agent would, and waits
until every turn is committed. ``mnemos bench service`` (the main job, :mod:`bench.service.mainjob`) and
``mnemos bench speed`` (:mod:`bench.speed.run`) run on it; both time :func:`freshness` on it.

A reranker trained on some conversations (its ``mnemos_provenance.json``) is only evaluated on
the others (:func:`evaluated_conversations`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import numpy as np
import psycopg
import redis
from rq import Worker

from api.client import MnemosClient
from api.validation import limits_of
from bench.common.datasets import Conversation, load_locomo
from bench.common.datasets import Turn as DatasetTurn
from bench.common.queue_cleanup import delete_queue
from workers.ingest.worker import GROUP as INGEST_GROUP
from workers.launch.supervisor import WORKER_KINDS, spawn_workers, stop_workers
from workers.ops.migrate import ensure_database, run_migrations
from workers.runtime.models import cross_encoder_location, reranker_provenance
from workers.settings import Settings
from workers.store import PostgresStore
from workers.store.schema import drop_database
from workers.suppression.worker import GROUP as SUPPRESSION_GROUP

log = logging.getLogger(__name__)


# a running service ------------------------------------------------------------------------------

@dataclass
class ServiceRun:
    """A benchmark's own service: settings, client, store and worker processes."""

    settings: Settings
    client: MnemosClient
    store: PostgresStore
    connection: redis.Redis
    children: list = field(default_factory=list)

    def stored(self, tenant_id: str) -> int:
        with self.store.tenant(tenant_id) as tx:
            return tx.count_entries()

    def add_workers(self, own: Settings, kinds: Sequence[str], ready_timeout_s: float = 300.0,
                    log_level: str | None = None) -> None:
        """Start ``kinds`` with ``own`` (e.g. a new shard's) while the run goes on, and wait until they
        listen; they are stopped with the run's other workers."""
        self.children.extend(spawn_workers(own, tuple(kinds), log_level=log_level))
        _wait_listening(self, own, kinds, ready_timeout_s)

    def entry_turns(self, tenant_id: str) -> dict[int, str]:
        """``{entry_id: turn_id}`` of every stored turn of a tenant (canonical entries and aliases)."""
        with self.store.tenant(tenant_id) as tx:
            return {r.entry_id: r.turn_id for r in tx.entries_after(0)}

    def turn_embeddings(self, tenant_id: str) -> dict[str, np.ndarray]:
        """``{turn_id: (dim,) float32 embedding}`` of every stored turn of a tenant, as the ingest
        worker stored it (canonical entries and aliases)."""
        with self.store.tenant(tenant_id) as tx:
            return {r.turn_id: np.frombuffer(r.embedding, dtype=np.float32) for r in tx.entries_after(0)}

    def ledger(self, tenant_id: str) -> list[tuple[str, int | None, int | None]]:
        """``(outcome_id, cluster, suppression_version)`` of every outcome the suppression worker applied
        to a tenant, in the order it applied them (by the version each one produced)."""
        with self.store.tenant(tenant_id) as tx:
            return [(r.outcome_id, r.cluster, r.suppression_version) for r in tx.ledger()]

    def suppression_state(self, tenant_id: str) -> dict[str, Any]:
        """The tenant's suppression version, stored scores and frozen centroids (None before bootstrap)."""
        with self.store.tenant(tenant_id) as tx:
            tenant = tx.tenant()
            scores = len(tx.suppression_scores())
            centroids = tx.centroids()
        return {"suppression_version": None if tenant is None else tenant.suppression_version, "scores": scores,
                "centroids": centroids}

    def canonical_map(self, tenant_id: str) -> dict[str, str]:
        """``{turn_id: canonical turn_id}`` of a tenant, from Postgres."""
        with self.store.tenant(tenant_id) as tx:
            rows = tx.entries_after(0)
        turn_of = {r.entry_id: r.turn_id for r in rows}
        return {r.turn_id: turn_of.get(r.canonical_entry_id, r.turn_id) if r.canonical_entry_id is not None
                else r.turn_id for r in rows}


def run_database_url(base: Settings, stamp: str) -> str:
    """The URL of a run's own database ``mnemos_bench_<stamp>`` on the server of ``base``."""
    return psycopg.conninfo.make_conninfo(base.database_url, dbname=f"mnemos_bench_{stamp}")


def isolated_settings(base: Settings, *, stamp: str, **changes: Any) -> Settings:
    """``base`` with a run's own database, stream prefix and queue, and waits long enough for a
    loaded machine; every retrieval knob stays as ``base`` has it unless ``changes`` say otherwise."""
    return base.replace(
        database_url=run_database_url(base, stamp), stream_prefix=f"mnemos_bench_{stamp}",
        queue_name=f"mnemos_bench_{stamp}_retrievals",
        retrieve_timeout_s=max(base.retrieve_timeout_s, 120.0), job_timeout_s=max(base.job_timeout_s, 120),
        claim_idle_ms=max(base.claim_idle_ms, 120_000), **changes)


def bench_settings(base: Settings, *, reranker: str | None, stamp: str) -> Settings:
    """Settings of a ``bench speed`` run: its own database and prefix, the ``hybrid_rerank`` knobs
    (suppression off, no deep pass) and no metrics ports."""
    return isolated_settings(base, stamp=stamp, cross_encoder=reranker, suppression=False, deep_threshold=None,
                             metrics_enabled=False)


def run_stamp() -> str:
    """A run's name part: the time to the second plus a random token (two runs never share a database)."""
    return f"{time.strftime('%Y%m%d%H%M%S')}_{uuid.uuid4().hex[:6]}"


def _wait(predicate, timeout_s: float, what: str, interval_s: float = 0.2) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > timeout_s:
            raise click.ClickException(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
    return time.monotonic()


@contextmanager
def running_service(settings: Settings, kinds: Sequence[str] = WORKER_KINDS, *, keep: bool = False,
                    ready_timeout_s: float = 300.0, log_level: str | None = None,
                    workers_of: Sequence[Settings] | None = None) -> Iterator[ServiceRun]:
    """Create and migrate the run's database, start the workers, wait until they listen.

    ``log_level`` is the workers' (default: this process's). With ``settings.shards`` > 1 the client
    routes tenants to shards (docs/scaling.md) and ``kinds`` are started once per shard;
    ``workers_of`` gives the settings of each set of workers to start instead (default: ``settings``
    itself, or ``settings`` with ``shard`` 0 .. shards-1), e.g. each with its own metrics ports.
    On exit the workers are stopped and, unless ``keep``, the run's streams, queues and database
    are removed.
    """
    from workers.runtime.connections import redis_client  # the workers' socket timeout and TLS settings

    ensure_database(settings.database_url)
    children: list = []
    store: PostgresStore | None = None
    connection: redis.Redis | None = None
    client: MnemosClient | None = None
    try:  # from here on, whatever fails removes what the run made (a refused start left its database)
        run_migrations(settings.database_url)
        connection = redis_client(settings)
        client = run_client(settings, connection)
        if workers_of is None:
            workers_of = [settings.replace(shard=shard) for shard in range(settings.shards)]
        for own in workers_of:  # added as they start: a later spawn that fails still stops the earlier ones
            children.extend(spawn_workers(own, tuple(kinds), log_level=log_level))
        store = PostgresStore(settings.database_url, settings.db_app_role).open()
        run = ServiceRun(settings, client, store, connection, children)
        for own in workers_of:
            _wait_listening(run, own, kinds, ready_timeout_s)
        yield run
    finally:
        stop_workers(children)
        if store is not None:
            store.close()
        if connection is not None and client is not None and not keep:
            with contextlib.suppress(redis.RedisError):  # Redis down: nothing of the run's can be there to delete
                keys = list(connection.scan_iter(match=f"{settings.stream_prefix}*"))
                if keys:
                    connection.delete(*keys)
                for queue in client.queues:
                    delete_queue(connection, queue.name)
        if not keep:
            drop_database(settings.database_url)


def run_client(settings: Settings, connection: redis.Redis, shards: int | None = None) -> MnemosClient:
    """A client of a run's streams and queues with the run's limits and timeouts, routing tenants over
    ``shards`` shards (default ``settings.shards``; fewer are the clients before a shard was added)."""
    return MnemosClient(connection, stream_prefix=settings.stream_prefix, queue_name=settings.queue_name,
                        limits=limits_of(settings), retrieve_timeout_s=settings.retrieve_timeout_s,
                        job_timeout_s=settings.job_timeout_s, result_ttl_s=settings.result_ttl_s,
                        shards=settings.shards if shards is None else shards)


def _wait_listening(run: ServiceRun, own: Settings, kinds: Sequence[str], timeout_s: float) -> None:
    """Wait until the workers of ``kinds`` started with ``own`` (one shard's) listen.

    Raises click.ClickException as soon as one of the run's worker processes has exited (a model
    that does not load, say: waiting out ``timeout_s`` for it helps no one), or after ``timeout_s``.
    """
    def listening(predicate: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            for child in run.children:
                if child.poll() is not None:
                    raise click.ClickException(f"the {child.args[-1]} worker exited with status {child.returncode} "
                                               "before it listened; its log above says why")
            return predicate()
        return check

    if "ingest" in kinds:
        _wait(listening(lambda: _has_consumer(run.connection, own.turns_stream, INGEST_GROUP)), timeout_s,
              "the ingest worker")
    if "query" in kinds:
        _wait(listening(lambda: bool(Worker.all(queue=run.client.queues[own.shard]))), timeout_s, "the query worker")
    if "suppression" in kinds:
        _wait(listening(lambda: _has_consumer(run.connection, own.outcomes_stream, SUPPRESSION_GROUP)), timeout_s,
              "the suppression worker")


def _has_consumer(connection: redis.Redis, stream: str, group: str) -> bool:
    try:
        return bool(connection.xinfo_consumers(stream, group))
    except redis.ResponseError:
        return False


def group_info(connection: redis.Redis, stream: str, group: str) -> dict | None:
    try:
        groups = {g["name"]: g for g in connection.xinfo_groups(stream)}
    except redis.ResponseError:
        return None
    return groups.get(group.encode()) or groups.get(group)


def group_caught_up(connection: redis.Redis, stream: str, group: str) -> bool:
    """True when ``group`` has been delivered the stream's last entry (no lag) and acknowledged
    everything (no pending entry)."""
    try:
        last = connection.xinfo_stream(stream)["last-generated-id"]
    except redis.ResponseError:
        return False
    info = group_info(connection, stream, group)
    return info is not None and info["pending"] == 0 and info["last-delivered-id"] == last


def group_acknowledged(connection: redis.Redis, stream: str, group: str) -> int | None:
    """Entries ``group`` has read and acknowledged (Redis >= 7 reports ``entries-read``; else None)."""
    info = group_info(connection, stream, group)
    if info is None or info.get("entries-read") is None:
        return None
    return int(info["entries-read"]) - int(info["pending"])


def turn_message(tenant_id: str, turn: DatasetTurn) -> dict[str, Any]:
    """The published form of a dataset turn; an image caption travels as ``metadata.image_caption``."""
    message = {"tenant_id": tenant_id, "session_id": turn.session_id, "turn_id": turn.turn_id, "role": turn.role,
               "text": turn.text, "occurred_at": turn.occurred_at.isoformat()}
    if turn.image_caption:
        message["metadata"] = {"image_caption": turn.image_caption}
    return message


def publish_tenants(run: ServiceRun, tenants: Sequence[tuple[str, Conversation]], timeout_s: float = 3600.0,
                    progress: Callable[[int], None] | None = None) -> dict[str, float]:
    """Publish every turn of each ``(tenant id, conversation)`` turn by turn, wait until all are stored
    (with shards, each tenant on its shard's turns stream, and every shard's ingest worker caught up).

    ``progress(n)`` is called with the number of newly acknowledged turns while the ingest worker
    catches up (every turn is acknowledged only after its commit). Returns ``turns``,
    ``publish_seconds``, ``ingest_seconds`` (first XADD to the last commit) and ``ingest_turns_per_s``.
    Raises ClickException when ingestion times out or stored fewer turns than were published.
    """
    turns = [turn_message(tenant_id, t) for tenant_id, c in tenants for t in c.turns]
    expected = {tenant_id: len(c.turns) for tenant_id, c in tenants}
    streams = [run.settings.replace(shard=shard).turns_stream for shard in range(run.settings.shards)]

    def acknowledged() -> int | None:
        counts = [group_acknowledged(run.connection, stream, INGEST_GROUP) for stream in streams]
        known = [c for c in counts if c is not None]
        return sum(known) if known else None

    before = acknowledged() or 0
    reported = 0

    def caught_up() -> bool:
        nonlocal reported
        if progress is not None:
            done = acknowledged()
            if done is not None and done - before > reported:
                progress(done - before - reported)
                reported = done - before
        return all(group_caught_up(run.connection, stream, INGEST_GROUP) for stream in streams)

    started = time.monotonic()
    for turn in turns:  # turn by turn, as an agent would
        run.client.publish_turn(turn)
    published = time.monotonic()
    done = _wait(caught_up, timeout_s, "ingestion", 0.05)
    if progress is not None and reported < len(turns):
        progress(len(turns) - reported)
    seconds = done - started
    stored = {t: run.stored(t) for t in expected}
    short = {t: (stored[t], n) for t, n in expected.items() if stored[t] < n}
    if short:
        raise click.ClickException(f"ingestion acknowledged every turn but stored fewer: {short} (see dead letters)")
    return {"turns": len(turns), "publish_seconds": published - started, "ingest_seconds": seconds,
            "ingest_turns_per_s": len(turns) / seconds if seconds > 0 else float("nan")}


def publish_conversations(run: ServiceRun, conversations: Sequence[Conversation],
                          timeout_s: float = 3600.0) -> dict[str, float]:
    """:func:`publish_tenants` with one tenant per conversation, named after it."""
    return publish_tenants(run, [(c.conversation_id, c) for c in conversations], timeout_s)


def freshness(run, tenant_id: str, probes: int) -> tuple[list[float], int]:
    """Seconds from XADD to the committed row, for ``probes`` new turns of ``tenant_id``; and how
    many of them the query worker then returned.

    Each probe has a session of its own, and the check retrieves with a filter on that session:
    it tests that the committed turn is visible to the query worker, not how the cross-encoder ranks
    an off-topic sentence (a LoCoMo-trained one scores these probes below ordinary chat turns).
    """
    seconds, visible = [], 0
    for number in range(probes):
        turn_id = f"probe-{uuid.uuid4().hex[:8]}"
        session_id = f"session-{turn_id}"
        text = f"Freshness probe {number}: the parcel code is {uuid.uuid4().hex[:6]}"
        started = time.perf_counter()
        run.client.publish_turn({"tenant_id": tenant_id, "session_id": session_id, "turn_id": turn_id,
                                 "role": "user", "text": text, "occurred_at": datetime.now(UTC).isoformat()})
        deadline = started + 60
        while True:
            with run.store.tenant(tenant_id) as tx:
                if tx.stored_turns([turn_id]):
                    break
            if time.perf_counter() > deadline:
                raise click.ClickException(f"probe {turn_id} was not stored within 60s")
            time.sleep(0.005)
        seconds.append(time.perf_counter() - started)
        hits = run.client.retrieve(tenant_id, text, k=5, filters={"session_ids": [session_id]}).hits
        if turn_id in [t for h in hits for t in (h.turn_id, *h.aliases)]:
            visible += 1
        else:
            log.warning("probe %s committed but the query worker did not return it", turn_id)
    return seconds, visible


# what the service recorded -----------------------------------------------------------------------

def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values, dtype=np.float64), q)) if values else float("nan")


def evaluated_conversations(data: Path, reranker: str | None, limit_conversations: int | None,
                            all_conversations: bool) -> tuple[list[Conversation], list[str]]:
    """LoCoMo conversations to evaluate: those the reranker was not trained on (unless overridden).

    ``reranker`` is a cross-encoder setting (``"shipped"``, a directory, ``"fake"``, None); its
    training conversations come from its ``mnemos_provenance.json``. Returns the conversations and
    the training conversations. Raises ClickException when none is left.
    """
    conversations = load_locomo(data)
    location = cross_encoder_location(Settings(cross_encoder=reranker)) if reranker is not None else None
    trained = list((reranker_provenance(location) or {}).get("training_conversations") or [])
    if not all_conversations:
        conversations = [c for c in conversations if c.conversation_id not in set(trained)]
    if limit_conversations is not None:
        conversations = conversations[:limit_conversations]
    if not conversations:
        raise click.ClickException("no conversation left to evaluate (all were used to train the reranker?)")
    return conversations, trained


def machine() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cores": os.cpu_count(), "cpu": cpu, "python": platform.python_version()}


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n", encoding="utf-8")


