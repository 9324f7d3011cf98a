"""Forgets across a tenant move (docs/scaling.md "Moving a tenant between shards").

A forget erases only what was published before it. Another consumer may store a later turn of its
scope first; if the move then carried the forget to the target's stream, it would get a later
position there and erase that turn too (break-it session, round 5: a later turn of a forgotten
session, a turn published after a tenant forget, the value of a later replacement). The move
applies such forgets at their source positions instead; the dead-letter copy of a message a forget
covers does not move. Stream ids are each server's clock, so the target's turns stream is raised
to the source's last id first: a turn published after the move is later than every forget the
source applied, whatever the clocks say. Two throwaway ``redis-server`` processes and two Postgres databases; workers
are driven batch by batch. Skipped when ``redis-server`` is not installed.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from api import sharding
from api.client import MnemosClient, job_id_for
from tests.integration import factories
from tests.support import ShardCluster, shard_cluster
from workers.ops.migrate import migrate_shards
from workers.ops.tenant_move import move_tenant
from workers.runtime.connections import redis_client
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration
SHARDS = 2


@pytest.fixture
def cluster(settings: Settings, tmp_path: Path) -> Iterator[ShardCluster]:
    with shard_cluster(settings, tmp_path, SHARDS) as value:
        yield value


def _on_shard_zero(count: int) -> tuple[str, ...]:
    """``count`` tenant ids whose ring shard is 0 (the moves below take them to shard 1)."""
    return tuple(itertools.islice((t for t in (f"tenant-{n}" for n in itertools.count())
                                   if sharding.shard_of(t, SHARDS) == 0), count))


def _moving(settings: Settings, count: int) -> tuple[MnemosClient, Settings, tuple[str, ...]]:
    """Both shards migrated; a sharded client, shard 0's settings (the source) and ``count`` tenants
    that live there."""
    migrate_shards(settings, echo=lambda _: None)
    return factories.sharded_client(settings), settings.for_shard(0), _on_shard_zero(count)


def _source_answer(client: MnemosClient, settings: Settings, tenant: str, hits: list[dict[str, str]]) -> str:
    """Store, on the source's Redis, an answer of its query worker to request "r1" of ``tenant``
    showing ``hits``; returns the result's key."""
    job = Job.create("workers.query.jobs.retrieve", id=job_id_for(tenant, "r1", settings.stream_prefix),
                     connection=client.connections[0], serializer=JSONSerializer)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=3600, return_value={"tenant_id": tenant, "hits": hits})
    return Result.get_key(job.id)


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _texts(url: str, tenant: str) -> dict[str, str]:
    return dict(_rows(url, "SELECT turn_id, text FROM entries WHERE tenant_id = %s", tenant))


def _handle_only_the_last(worker: Any, name: str) -> None:
    """Read every new message as consumer ``name``, but handle and acknowledge only the last one: the
    earlier ones stay pending, as with a consumer that died holding them while another went on."""
    consumer = worker.consumer(name)
    consumer.ensure_group()
    batch = consumer.read()
    consumer.ack(worker.handle(batch[-1:]))


def test_a_pending_forget_moves_at_its_source_position(cluster: ShardCluster) -> None:
    settings = cluster.settings
    a, b = cluster.database_urls
    client, source, (session_t, tenant_t, put_t) = _moving(settings, 3)
    target = settings.for_shard(1)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        client.publish_turns([factories.turn(session_t, "old", "I live in Porto"),
                              factories.turn(session_t, "other", "my cat is called Pixel", session="s2"),
                              factories.turn(tenant_t, "old", "my sister is a nurse"),
                              factories.turn(put_t, "k", "the wifi password is pear")])
        client.connections[0].xadd(source.turns_stream, {  # a dead letter of session s1, before its forget
            "v": "1", "tenant_id": session_t, "session_id": "s1", "turn_id": "bad", "role": "user",
            "text": "my old address is 5 Rua Escura", "occurred_at": "yesterday"})
        factories.drain(worker, "fast")
        assert _rows(a, "SELECT count(*) FROM dead_letters WHERE tenant_id = %s", session_t) == [(1,)]

        client.forget(session_t, session_id="s1")
        client.publish_turn(factories.turn(session_t, "new", "I live in Lisbon now", minutes=60))
        _handle_only_the_last(worker, "dead-1")
        client.forget(tenant_t)
        client.publish_turn(factories.turn(tenant_t, "new", "my brother is a pilot", minutes=60))
        _handle_only_the_last(worker, "dead-2")
        client.forget(put_t, turn_ids=["k"])
        client.replace_turn(factories.turn(put_t, "k", "the wifi password is plum", minutes=60))
        _handle_only_the_last(worker, "dead-3")
        assert _texts(a, session_t) == {"old": "I live in Porto", "other": "my cat is called Pixel",
                                        "new": "I live in Lisbon now"}  # the forget is still pending

    answer = _source_answer(client, settings, tenant_t,  # naming a kept turn
                            [{"session_id": "s1", "turn_id": "new", "text": "my brother is a pilot"}])
    reports = [move_tenant(settings, tenant, 1, echo=lambda _: None) for tenant in (session_t, tenant_t, put_t)]
    assert 0 < client.connections[0].ttl(answer) <= 60  # left behind: expires soon
    assert [(r.forgets, r.turns.moved) for r in reports] == [(1, 0)] * 3
    assert (reports[0].dead_letters.moved, reports[0].dead_letters.dropped) == (0, 1)
    factories.drain_shard(settings, client, 1)  # whatever the move carried
    assert _texts(b, session_t) == {"other": "my cat is called Pixel", "new": "I live in Lisbon now"}
    assert _texts(b, tenant_t) == {"new": "my brother is a pilot"}
    assert _texts(b, put_t) == {"k": "the wifi password is plum"}
    assert _rows(b, "SELECT count(*) FROM dead_letters WHERE tenant_id = %s", session_t) == [(0,)]
    dead = redis_client(target).xrange(target.dead_letter_stream)
    assert not [f for _, f in dead if f.get(b"tenant_id") == session_t.encode()]


def test_a_turn_published_after_a_move_is_later_than_the_source_s_forgets(cluster: ShardCluster) -> None:
    # stream ids are each Redis's own clock: with the target's an hour behind the source's, a turn
    # published on the target right after the move read as published before the tenant forget the
    # source had applied, and was dropped
    settings = cluster.settings
    a, b = cluster.database_urls
    client, source, (tenant,) = _moving(settings, 1)
    ahead_ms = int(time.time() * 1000) + 3_600_000
    client.connections[0].xgroup_create(source.turns_stream, "ingest", id="0", mkstream=True)
    client.connections[0].execute_command("XSETID", source.turns_stream, f"{ahead_ms}-0")  # the source's clock, an hour ahead
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        client.publish_turn(factories.turn(tenant, "old", "my sister is a nurse"))
        client.forget(tenant)
        factories.drain(worker)
    assert sorted(_rows(a, "SELECT scope, stream_ms >= %s FROM tombstones WHERE tenant_id = %s", ahead_ms,
                        tenant)) == [("swept", True), ("tenant", True)]
    move_tenant(settings, tenant, 1, echo=lambda _: None)
    client.publish_turn(factories.turn(tenant, "new", "my brother is a pilot", minutes=60))
    assert factories.drain_shard(settings, client, 1) == 1
    assert _texts(b, tenant) == {"new": "my brother is a pilot"}


def _secret_copies(client: MnemosClient, settings: Settings) -> list[dict[bytes, bytes]]:
    """Dead-stream copies on either shard that hold the erased text."""
    return [f for shard, c in enumerate(client.connections) for _, f in c.xrange(settings.for_shard(shard).dead_letter_stream)
            if b"SECRET" in f.get(b"payload", b"")]


def test_a_forget_finds_dead_letter_copies_a_move_brought_from_another_shard(cluster: ShardCluster) -> None:
    # break-it session: a moved copy keeps its source turns stream's name, and both the ingest
    # worker's forget and a later move matched copies by the current shard's stream name only: the
    # erased text stayed on the dead stream (a forget after the move; a forget a move back applied)
    settings = cluster.settings
    a, b = cluster.database_urls
    client, source, (first, second) = _moving(settings, 2)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        for tenant in (first, second):
            client.connections[0].xadd(source.turns_stream, {
                "v": "1", "tenant_id": tenant, "session_id": "s1", "turn_id": "bad", "role": "user",
                "text": "SECRET my old address is 5 Rua Escura", "occurred_at": "yesterday"})
            client.publish_turn(factories.turn(tenant, "ok", "my cat is called Pixel", session="s2"))
        factories.drain(factories.ingest_worker(source, client.connections[0], store))
    for tenant in (first, second):
        assert move_tenant(settings, tenant, 1, echo=lambda _: None).dead_letters.moved == 1
    assert len(_secret_copies(client, settings)) == 2
    client.forget(first, session_id="s1")
    factories.drain_shard(settings, client, 1)
    assert [c[b"tenant_id"] for c in _secret_copies(client, settings)] == [second.encode()]
    client.forget(second, session_id="s1")  # pending on shard 1 when the tenant moves back
    report = move_tenant(settings, second, 0, echo=lambda _: None)
    assert (report.forgets, report.dead_letters.moved, report.dead_letters.dropped) == (1, 0, 1)
    assert _secret_copies(client, settings) == []
    assert _rows(a, "SELECT count(*) FROM dead_letters") == _rows(b, "SELECT count(*) FROM dead_letters") == [(0,)]


def test_a_pending_replacement_a_pending_forget_covers_still_erases_the_value_it_replaced(
        cluster: ShardCluster) -> None:
    # break-it session: put X in s2 (stored), replace X into s1, forget s1, both pending. In order X is
    # gone; the move applied the forget, then dropped the replacement whole (its new value is covered),
    # forget half included, and the s2 value came back
    settings = cluster.settings
    b = cluster.database_urls[1]
    client, source, (tenant,) = _moving(settings, 1)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        client.publish_turn(factories.turn(tenant, "X", "the wifi password is pear", session="s2"))
        client.publish_turn(factories.turn(tenant, "Y", "my cat is called Pixel", session="s2"))
        factories.drain(factories.ingest_worker(source, client.connections[0], store))
    client.replace_turn(factories.turn(tenant, "X", "the wifi password is plum", session="s1", minutes=5))
    client.forget(tenant, session_id="s1")
    report = move_tenant(settings, tenant, 1, echo=lambda _: None)
    assert (report.forgets, report.turns.moved, report.turns.dropped) == (1, 0, 2)  # both: applied here
    factories.drain_shard(settings, client, 1)
    assert _texts(b, tenant) == {"Y": "my cat is called Pixel"}


def test_a_message_committed_but_left_unacknowledged_is_not_applied_again_by_a_move(cluster: ShardCluster) -> None:
    # break-it sessions: its worker died before acknowledging, and the move carried it. A refused
    # message was refused again on the target under a new id (a second letter); a replacement was
    # applied again: its forget half erased the value it had stored, and the re-add came back under a
    # new entry id without its suppression score
    settings = cluster.settings
    b = cluster.database_urls[1]
    client, source, (tenant,) = _moving(settings, 1)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        client.publish_turn(factories.turn(tenant, "k", "the wifi password is pear"))
        factories.drain(worker)
        client.connections[0].xadd(source.turns_stream, {
            "v": "1", "tenant_id": tenant, "session_id": "s1", "turn_id": "bad", "role": "user", "text": "",
            "occurred_at": "2024-03-01T09:00:00+00:00"})
        client.replace_turn(factories.turn(tenant, "k", "the wifi password is plum", minutes=5))
        consumer = worker.consumer("dying")
        consumer.ensure_group()
        worker.handle(consumer.read())  # letter recorded and replacement stored, never acknowledged
        with store.tenant(tenant) as tx:
            (entry,) = [link.entry_id for link in tx.entry_links()]
            tx.add_suppression({(entry, 0): 0.5})
    report = move_tenant(settings, tenant, 1, echo=lambda _: None)
    assert (report.turns.moved, report.dead_letters.moved) == (0, 1)
    factories.drain_shard(settings, client, 1)
    assert _rows(b, "SELECT reason FROM dead_letters WHERE tenant_id = %s", tenant) == [("empty_text",)]
    assert _texts(b, tenant) == {"k": "the wifi password is plum"}
    assert _rows(b, "SELECT s.score FROM suppression s JOIN entries e USING (tenant_id, entry_id)"
                 " WHERE e.tenant_id = %s", tenant) == [(0.5,)]


def test_a_pending_replacement_out_of_a_session_survives_a_pending_forget_of_that_session(
        cluster: ShardCluster) -> None:
    # break-it session, round 3: put X in s2 (stored), replace X into s1, forget s2, both pending. In
    # order X lives on in s1; the move applied the forget first, which found the old X still in s2 and
    # tombstoned its turn id, and the replacement was then dropped as forgotten
    settings = cluster.settings
    b = cluster.database_urls[1]
    client, source, (tenant,) = _moving(settings, 1)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        client.publish_turn(factories.turn(tenant, "X", "the wifi password is pear", session="s2"))
        factories.drain(factories.ingest_worker(source, client.connections[0], store))
    client.replace_turn(factories.turn(tenant, "X", "the wifi password is plum", session="s1", minutes=5))
    client.forget(tenant, session_id="s2")
    report = move_tenant(settings, tenant, 1, echo=lambda _: None)
    assert (report.forgets, report.turns.moved) == (1, 1)
    factories.drain_shard(settings, client, 1)
    assert _texts(b, tenant) == {"X": "the wifi password is plum"}


def test_a_pending_turn_a_session_forget_drops_sweeps_a_retry_stored_first(cluster: ShardCluster) -> None:
    # break-it session, round 9: turn "a" in s1, forget s1, a plain message of "a" (here in s2); another
    # consumer stored the last one first, the other two pending. In stream order "a" is erased with s1
    # and its turn id swept, so the later message is a retry and dropped; the source's worker sweeps
    # on reading the first message. The move dropped that message without its sweep, and the retry
    # stayed stored on the target, with the stored result that returned it
    settings = cluster.settings
    b = cluster.database_urls[1]
    client, source, (tenant,) = _moving(settings, 1)
    text = "my old address is 5 Rua Escura"
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        client.publish_turn(factories.turn(tenant, "b", "my cat is called Pixel", session="s2"))
        factories.drain(worker)
        client.publish_turn(factories.turn(tenant, "a", text))
        client.forget(tenant, session_id="s1")
        client.publish_turn(factories.turn(tenant, "a", text, session="s2"))
        _handle_only_the_last(worker, "dead")
        assert _texts(cluster.database_urls[0], tenant)["a"] == text
    answer = _source_answer(client, settings, tenant, [{"session_id": "s2", "turn_id": "a", "text": text}])
    report = move_tenant(settings, tenant, 1, echo=lambda _: None)
    assert (report.forgets, report.turns.moved) == (1, 0)
    assert client.connections[0].xlen(answer) == 0
    factories.drain_shard(settings, client, 1)
    assert _texts(b, tenant) == {"b": "my cat is called Pixel"}
