"""Forget against the real Redis and Postgres (docs/architecture.md "Forget").

After a forget, every table (read as the owner, past row-level security) and every stream of the
test's prefix is scanned for the forgotten text; the query service no longer returns it; a forget
racing with two ingest workers loses no other turn.
"""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
import redis
from psycopg import sql
from rq.results import Result
from rq.serializers import JSONSerializer

from api.client import job_id_for
from api.errors import InvalidInputError
from api.schemas import RetrievalRequest
from tests.integration.factories import (
    answered_by_worker,
    client_for,
    drain,
    ingest_worker,
    query_service,
    suppression_worker,
    turn,
)
from tests.support import wait_for
from workers.runtime.streams import StreamMessage, run_consumer
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

SECRET = "my passport number is X9-4471-ZQ"


def _tables_holding(store: PostgresStore, needle: str) -> list[str]:
    """Tables with a row whose JSON form contains ``needle`` (as the owner: every tenant's rows)."""
    found = []
    with psycopg.connect(store.database_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")]
        for table in tables:
            query = sql.SQL("SELECT count(*) FROM {} AS t WHERE strpos(row_to_json(t)::text, %s) > 0").format(
                sql.Identifier(table))
            row = conn.execute(query, (needle,)).fetchone()
            if row and row[0]:
                found.append(table)
    return found


def _streams_holding(connection: redis.Redis, settings: Settings, needle: str) -> list[str]:
    found = []
    for key in connection.scan_iter(match=f"{settings.stream_prefix}*"):
        if connection.type(key) != b"stream":
            continue
        for _id, fields in connection.xrange(key):
            if any(needle.encode() in value for value in fields.values()):
                found.append(key.decode())
                break
    return found


def _results_holding(connection: redis.Redis, needle: str) -> list[str]:
    """Stored rq job results (every queue of the db) whose return value contains ``needle``."""
    found = []
    for key in connection.scan_iter(match=Result.get_key("*")):
        job_id = key.decode().removeprefix(Result.get_key(""))
        for raw_id, fields in connection.xrange(key):
            result = Result.restore(job_id, raw_id.decode(), fields, connection, serializer=JSONSerializer)
            if needle in json.dumps(result.return_value):
                found.append(key.decode())
    return found


def _stored(store: PostgresStore, tenant: str) -> set[str]:
    with store.tenant(tenant) as tx:
        return {r.turn_id for r in tx.entries_after(0)}


def test_after_a_forget_no_table_stream_or_answer_holds_the_text(settings: Settings, redis_client: redis.Redis,
                                                                  store: PostgresStore) -> None:
    earlier = set(_results_holding(redis_client, SECRET))  # another test's results, if any are still kept
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "a1", SECRET, session="s1"),
                          turn("alice", "a2", "I like long walks on the beach", session="s1", minutes=1),
                          turn("alice", "a3", SECRET + "!", session="s2", minutes=2),  # an alias of a1
                          turn("alice", "a4", "My sister lives in Lisbon", session="s2", minutes=3),
                          turn("bob", "b1", SECRET, session="s1")])
    redis_client.xadd(settings.turns_stream, {**turn("alice", "a5", SECRET + "?", session="s1"),  # a dead letter
                                              "v": "1", "occurred_at": "2024-03-01T09:00:00"})
    worker = ingest_worker(settings, redis_client, store)
    drain(worker)
    service = query_service(settings, redis_client, store)
    answered = answered_by_worker(settings, redis_client, service, client.retrieve, "alice", "passport number", k=4,
                                  request_id="before")
    assert answered.hits[0].turn_id == "a1"
    read = answered_by_worker(settings, redis_client, service, client.turns, "alice", ["a1", "a2"])
    assert [t.text for t in read] == [SECRET, "I like long walks on the beach"]  # a catalog read keeps texts too
    assert len(set(_results_holding(redis_client, SECRET)) - earlier) == 2
    stored_result = Result.get_key(job_id_for("alice", "before", settings.stream_prefix))
    assert redis_client.xlen(stored_result) == 1  # rq keeps the answer, hit texts included
    assert {"entries", "dead_letters"} <= set(_tables_holding(store, SECRET))

    client.forget("alice", turn_ids=["a1", "a3", "a5"])
    drain(worker)
    assert _stored(store, "alice") == {"a2", "a4"} and _stored(store, "bob") == {"b1"}
    with store.tenant("bob") as tx:  # bob's copy of the same words is his, and stays
        assert [r.text for r in tx.entries_after(0)] == [SECRET]
    with psycopg.connect(store.database_url) as conn:
        conn.execute("DELETE FROM entries WHERE tenant_id = 'bob'")  # so the scan below looks for alice's copies
    assert _tables_holding(store, SECRET) == []
    assert _streams_holding(redis_client, settings, SECRET) == [settings.turns_stream]  # bob's turn only
    assert redis_client.xlen(stored_result) == 0
    assert set(_results_holding(redis_client, SECRET)) <= earlier  # the catalog read's went too (break-it session)
    answer = service.answer(RetrievalRequest("alice", "passport number X9-4471-ZQ", k=4))
    assert all(SECRET not in hit.text and hit.turn_id not in {"a1", "a3"} for hit in answer.hits)
    assert worker.metrics.forget_turns._value.get() == 2


def test_a_refused_message_published_after_a_forget_keeps_its_dead_letter(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """The forget and a later malformed message of the same turn id arrive in one batch (letters are
    recorded before forgets are applied): the later message's letter is not the forget's to delete."""
    client = client_for(settings, redis_client)
    bad = {**turn("alice", "a1", "my new number", session="s1"), "v": "1", "occurred_at": "2024-03-01T09:00:00"}
    redis_client.xadd(settings.turns_stream, bad)  # refused before the forget: the forget erases its letter
    client.forget("alice", turn_ids=["a1"])
    later = redis_client.xadd(settings.turns_stream, {**bad, "text": "my newer number"}).decode()
    worker = ingest_worker(settings, redis_client, store)
    assert drain(worker) == 3
    with psycopg.connect(store.database_url) as conn:
        rows = conn.execute("SELECT stream_id FROM dead_letters WHERE tenant_id = 'alice'").fetchall()
    assert rows == [(later,)]
    letters = [f[b"stream_id"].decode() for _id, f in redis_client.xrange(settings.dead_letter_stream)]
    assert letters == [later]


def test_a_refused_message_published_before_a_forget_and_read_after_it_leaves_no_letter(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Break-it session (2026-12-07): a malformed message a dead consumer left pending, refused after
    the forget of its turn was applied, kept the forgotten text as a dead letter."""
    client = client_for(settings, redis_client)
    bad = {**turn("alice", "a1", SECRET, session="s1"), "v": "1", "occurred_at": "2024-03-01T09:00:00"}
    stranded = redis_client.xadd(settings.turns_stream, bad).decode()
    other = redis_client.xadd(settings.turns_stream, {**bad, "turn_id": "a2", "session_id": "s9"}).decode()
    client.forget("alice", session_id="s1")
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    worker = ingest_worker(settings, redis_client, store)
    forget = next(sid for sid in messages if sid not in {stranded, other})
    worker.handle([messages[forget]])
    worker.handle([messages[stranded], messages[other]])  # read after the forget was applied
    with psycopg.connect(store.database_url) as conn:
        rows = conn.execute("SELECT stream_id FROM dead_letters WHERE tenant_id = 'alice'").fetchall()
    assert rows == [(other,)]  # another session's letter stays
    assert [f[b"stream_id"].decode() for _id, f in redis_client.xrange(settings.dead_letter_stream)] == [other]
    assert worker.metrics.ingest_tombstoned._value.get() == 1


def test_a_tenant_forget_empties_every_table_of_the_tenant(settings: Settings, redis_client: redis.Redis,
                                                          store: PostgresStore) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", f"a{i}", f"{SECRET} {i}", session=f"s{i % 2}", minutes=i) for i in range(4)])
    client.publish_turns([turn("bob", "b1", "bob keeps his memories")])
    worker = ingest_worker(settings, redis_client, store)
    drain(worker)
    client.forget("alice")
    drain(worker)
    assert _tables_holding(store, SECRET) == [] and _streams_holding(redis_client, settings, SECRET) == []
    with psycopg.connect(store.database_url) as conn:
        for table in ("entries", "suppression", "centroids", "query_buffer", "applied_outcomes", "dead_letters"):
            query = sql.SQL("SELECT count(*) FROM {} WHERE tenant_id = 'alice'").format(sql.Identifier(table))
            assert conn.execute(query).fetchone() == (0,), table
    assert _stored(store, "bob") == {"b1"}
    client.publish_turns([turn("alice", "a1", "published again without readd", minutes=9)])
    client.publish_turns([turn("alice", "a2", "re-added after the forget", minutes=9)], readd=True)
    drain(worker)
    assert _stored(store, "alice") == {"a2"}


def _tenant_rows(store: PostgresStore, tenant: str, table: str) -> int:
    with psycopg.connect(store.database_url) as conn:
        query = sql.SQL("SELECT count(*) FROM {} WHERE tenant_id = %s").format(sql.Identifier(table))
        row = conn.execute(query, (tenant,)).fetchone()
        return int(row[0]) if row else 0


def test_outcomes_of_retrievals_before_a_tenant_forget_leave_nothing_after_it(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """With the suppression worker behind, a tenant forget used to be refilled by the outcomes of
    retrievals made before it (ledger rows and the queries' embeddings in the bootstrap buffer)."""
    settings = settings.replace(clusters_k=4)  # no centroids yet: every outcome carries its query embedding
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", f"a{i}", f"{SECRET} {i}", minutes=i) for i in range(4)]
                         + [turn("bob", "b1", "bob keeps his passport memories")])
    ingest = ingest_worker(settings, redis_client, store)
    drain(ingest)
    service = query_service(settings, redis_client, store)
    for n in range(3):
        service.answer(RetrievalRequest("alice", "passport number", k=3, request_id=f"before-{n}"))
    service.answer(RetrievalRequest("bob", "passport memories", k=3, request_id="bob-1"))
    client.forget("alice")
    drain(ingest)  # the forget commits while the suppression worker has applied none of the four
    worker = suppression_worker(settings, redis_client, store)
    drain(worker)  # type: ignore[arg-type]
    assert worker.metrics.suppression_outdated._value.get() == 3
    for table in ("applied_outcomes", "query_buffer", "suppression"):
        assert _tenant_rows(store, "alice", table) == 0, table
    assert (_tenant_rows(store, "bob", "applied_outcomes"), _tenant_rows(store, "bob", "query_buffer")) == (1, 1)
    client.publish_turns([turn("alice", "n1", "a new memory after the forget", minutes=9)])
    drain(ingest)
    service.answer(RetrievalRequest("alice", "new memory", k=3, request_id="after"))
    drain(worker)  # type: ignore[arg-type]
    assert _tenant_rows(store, "alice", "applied_outcomes") == 1  # what the tenant asks afterwards is learnt
    assert worker.metrics.suppression_outdated._value.get() == 3


def _stored_texts(store: PostgresStore, tenant: str) -> list[tuple[str, str]]:
    with store.tenant(tenant) as tx:
        return [(r.turn_id, r.text) for r in tx.entries_after(0)]


def test_replace_turn_is_one_message_that_forgets_then_re_adds(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    """Break-it sessions (2026-12-07): a put as a forget and a re-add in two messages lost the later
    of two concurrent puts, and, with two ingest consumers, could erase the value altogether (the
    re-add refused as a conflict by one consumer before the other applied the forget)."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "the first value")])
    drain(ingest_worker(settings, redis_client, store))
    before = redis_client.xlen(settings.turns_stream)
    with pytest.raises(InvalidInputError):
        client.replace_turn(turn("alice", "k", "  "))  # refused before anything is sent
    second = client.replace_turn(turn("alice", "k", "the second value"))
    third = client.replace_turn(turn("alice", "k", "the third value"))
    assert redis_client.xlen(settings.turns_stream) == before + 2  # one message per replacement
    fields = dict(redis_client.xrange(settings.turns_stream, min=second, max=second))[second.encode()]
    assert (fields[b"turn_id"], fields[b"readd"], fields[b"text"]) == (b"k", b"replace", b"the second value")
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    # two consumers, the later replacement applied first: the one published last still wins
    ingest_worker(settings, redis_client, store).handle([messages[third]])
    assert _stored_texts(store, "alice") == [("k", "the third value")]
    ingest_worker(settings, redis_client, store).handle([messages[second]])
    assert _stored_texts(store, "alice") == [("k", "the third value")]
    ingest_worker(settings, redis_client, store).handle([messages[third]])  # a redelivery changes nothing
    assert _stored_texts(store, "alice") == [("k", "the third value")]
    # the stale replacement is older than the replacement applied: dropped (its "replace" tombstone),
    # so neither it nor a redelivery of an older value leaves a conflict letter (break-it round 4)
    with psycopg.connect(store.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM dead_letters WHERE tenant_id = 'alice'").fetchone() == (0,)
    assert second not in [f[b"stream_id"].decode() for _, f in redis_client.xrange(settings.dead_letter_stream)]
    ingest_worker(settings, redis_client, store).handle([messages[first] for first in list(messages)[:1]])
    assert _stored_texts(store, "alice") == [("k", "the third value")]  # the first value, redelivered
    # a replace deletes no dead letter of a message published after it (a refused later write of the key)
    fifth = client.replace_turn(turn("alice", "k", "the fifth value"))
    redis_client.xadd(settings.turns_stream, {**turn("alice", "k", "no zone", occurred_at="2024-03-01T09:00:00"), "v": "1"})
    drain(ingest_worker(settings, redis_client, store))
    with psycopg.connect(store.database_url) as conn:
        reasons = conn.execute("SELECT reason FROM dead_letters WHERE tenant_id = 'alice' ORDER BY stream_id").fetchall()
    assert reasons == [("timestamp_without_zone",)] and fifth
    assert _stored_texts(store, "alice") == [("k", "the fifth value")]
    fourth = client.replace_turn(turn("bob", "k", "a key of another tenant"))  # never touches alice's
    drain(ingest_worker(settings, redis_client, store))
    assert _stored_texts(store, "alice") == [("k", "the fifth value")] and fourth
    assert _stored_texts(store, "bob") == [("k", "a key of another tenant")]


def test_a_session_forget_read_first_keeps_a_turn_moved_out_of_the_session_before_it(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Two consumers of one group: a replacement that moved a turn id out of a session, published
    before a forget of that session, is read after it. The forget erased the old value and used to
    tombstone the turn id, which dropped the new value too; in stream order the forget does not
    cover it (migration 0009, scope ``swept``). A retry of the erased value stays dropped."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", "I live in Lisbon", session="s1"),
                          turn("alice", "other", "my dog is called Rex", session="s1")])
    drain(ingest_worker(settings, redis_client, store))
    moved = client.replace_turn(turn("alice", "k", "I live in Porto", session="s2"))
    forget = client.forget("alice", session_id="s1")
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    ingest_worker(settings, redis_client, store).handle([messages[forget]])  # the other consumer was faster
    assert _stored_texts(store, "alice") == []
    ingest_worker(settings, redis_client, store).handle([messages[moved]])
    assert _stored_texts(store, "alice") == [("k", "I live in Porto")]
    client.publish_turns([turn("alice", "k", "I live in Lisbon", session="s1"),  # retries after the forget
                          turn("alice", "other", "my dog is called Rex", session="s1")])
    drain(ingest_worker(settings, redis_client, store))
    assert _stored_texts(store, "alice") == [("k", "I live in Porto")]
    with psycopg.connect(store.database_url) as conn:
        assert conn.execute("SELECT count(*) FROM dead_letters WHERE tenant_id = 'alice'").fetchone() == (0,)
        scopes = conn.execute("SELECT scope, key FROM tombstones WHERE tenant_id = 'alice' ORDER BY 1, 2").fetchall()
    assert scopes == [("replace", "k"), ("session", "s1"), ("swept", "k"), ("swept", "other")]


def test_retries_of_forgotten_text_read_out_of_order_leave_no_copy(settings: Settings, redis_client: redis.Redis,
                                                                   store: PostgresStore) -> None:
    """Two consumers of one group, and a client that retries its publish after a forget. A retry of
    a turn id read before the turn-id forget it follows, and a turn of a forgotten session read after
    that forget followed by its retry: stream order drops both retries, so no order may keep the
    text (migration 0009); a re-add published after the forget and read before it stays."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "a1", SECRET, session="s1")])
    turn_forget = client.forget("alice", turn_ids=["a1"])
    client.publish_turns([turn("alice", "a1", SECRET, session="s1"),  # the client's retry
                          turn("alice", "b1", SECRET + "!", session="s2")])
    session_forget = client.forget("alice", session_id="s2")
    client.publish_turns([turn("alice", "b1", SECRET + "!", session="s3")])  # a retry, moved to another session
    client.forget("alice", turn_ids=["c1"])
    client.publish_turns([turn("alice", "c1", "my sister lives in Lisbon")], readd=True)
    ids = [sid.decode() for sid, _ in redis_client.xrange(settings.turns_stream)]
    messages = {sid.decode(): StreamMessage(sid.decode(), f) for sid, f in redis_client.xrange(settings.turns_stream)}
    fast, slow = ingest_worker(settings, redis_client, store), ingest_worker(settings, redis_client, store)
    # the fast consumer reads the retries and the re-add before the forgets, the slow one the rest
    for stream_id in (ids[2], ids[5], ids[7], turn_forget, session_forget, ids[6], ids[0], ids[3]):
        (fast if stream_id in (ids[2], ids[5], ids[7]) else slow).handle([messages[stream_id]])
    assert _stored_texts(store, "alice") == [("c1", "my sister lives in Lisbon")]
    assert _tables_holding(store, SECRET) == []
    assert _streams_holding(redis_client, settings, SECRET) == []
    with psycopg.connect(store.database_url) as conn:
        scopes = conn.execute("SELECT scope, key FROM tombstones WHERE tenant_id = 'alice' ORDER BY 1, 2").fetchall()
    assert scopes == [("session", "s2"), ("swept", "b1"), ("turn", "a1"), ("turn", "c1")]


def test_a_retry_read_before_its_original_leaves_no_copy_of_a_session_forget_s_text(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    """Break-it round 8: a turn, a forget of its session, and the client's retry of the turn, read
    retry first, then the turn (taken for a redelivery of the stored retry), then the forget. The
    stored value takes the turn's earlier position, so the forget erases it, and the retry's copy,
    delivered and published after the forget, is deleted with the forget's copies (stream order
    drops the retry)."""
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "k", SECRET, session="s1")])
    client.forget("alice", session_id="s1")
    client.publish_turns([turn("alice", "k", SECRET, session="s1")])
    redis_client.xgroup_create(settings.turns_stream, "ingest", id="0")
    delivered = redis_client.xreadgroup("ingest", "c1", {settings.turns_stream: ">"})[0][1]  # delivered, pending
    first, forget, retry = (StreamMessage(sid.decode(), fields) for sid, fields in delivered)
    for message in (retry, first, forget):  # each read by its own consumer
        worker = ingest_worker(settings, redis_client, store)
        redis_client.xack(settings.turns_stream, "ingest", *worker.handle([message]))
    assert _stored_texts(store, "alice") == []
    assert _tables_holding(store, SECRET) == []
    assert _streams_holding(redis_client, settings, SECRET) == []


def test_a_put_of_a_new_key_keeps_the_forget_version(settings: Settings, redis_client: redis.Redis,
                                                    store: PostgresStore) -> None:
    """Break-it session (2026-12-07): every replace bumped the forget version, so a put of a new key
    made the next retrieval rebuild the tenant's index and turned earlier outcomes stale."""
    client = client_for(settings, redis_client)
    worker = ingest_worker(settings, redis_client, store)
    client.publish_turns([turn("alice", "k1", "the first value")])
    drain(worker)

    def versions() -> tuple[int, int]:
        with store.tenant("alice") as tx:
            row = tx.tenant()
            assert row is not None
            return row.memory_version, row.forget_version

    memory, forgets = versions()
    client.replace_turn(turn("alice", "k2", "a new key"))
    client.forget("alice", turn_ids=["never-stored"])
    drain(worker)
    assert versions() == (memory + 1, forgets)  # the new turn moved the memory version only
    assert _stored_texts(store, "alice") == [("k1", "the first value"), ("k2", "a new key")]
    client.replace_turn(turn("alice", "k1", "an update"))  # erases the old value: caches must see it
    drain(worker)
    assert versions()[1] == forgets + 1
    assert sorted(_stored_texts(store, "alice")) == [("k1", "an update"), ("k2", "a new key")]


def test_a_forget_racing_with_two_ingest_workers_loses_nothing_else(settings: Settings, redis_client: redis.Redis,
                                                                    store: PostgresStore) -> None:
    settings = settings.replace(ingest_batch_size=3)
    client = client_for(settings, redis_client)
    workers = [ingest_worker(settings, redis_client, store) for _ in range(2)]
    stop = threading.Event()
    threads = [threading.Thread(target=run_consumer, args=(w.consumer(f"c{i}"), w.handle, stop),
                                kwargs={"poison": w.poison, "after_ack": w.after_ack}) for i, w in enumerate(workers)]
    for thread in threads:
        thread.start()
    expected: set[str] = set()
    try:
        for i in range(30):
            session = "s1" if i % 2 else "s2"
            client.publish_turn(turn("alice", f"t{i}", f"turn number {i} of {session}", session=session, minutes=i))
            if i == 14:
                client.forget("alice", session_id="s1")
            if session == "s2" or i > 14:
                expected.add(f"t{i}")
        wait_for(lambda: _stored(store, "alice") == expected, 60.0, interval_s=0.1)
        # the last acknowledgement's sweep runs in the worker threads
        wait_for(lambda: not redis_client.scard(f"{settings.turns_stream}:forgotten"), 10.0, interval_s=0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    assert _stored(store, "alice") == expected
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0
    assert sum(w.metrics.forget_events._value.get() for w in workers) == 1
    for _id, fields in redis_client.xrange(settings.turns_stream):  # no copy of a forgotten turn is left
        if b"turn_id" in fields:  # the forget event holds ids only
            assert not (fields[b"session_id"] == b"s1" and int(fields[b"turn_id"][1:]) <= 14), fields


def test_the_cli_publishes_a_forget_and_refuses_two_scopes(settings: Settings, redis_client: redis.Redis,
                                                            store: PostgresStore) -> None:
    from click.testing import CliRunner

    from workers.cli import cli
    from workers.settings import to_environment

    client_for(settings, redis_client).publish_turns([turn("alice", "a1", SECRET), turn("alice", "a2", "kept")])
    worker = ingest_worker(settings, redis_client, store)
    drain(worker)
    env = to_environment(settings)
    out = CliRunner().invoke(cli, ["forget", "--tenant", "alice", "--turn", "a1"], env=env)
    assert out.exit_code == 0 and "1 turn(s) of tenant alice" in out.output, out.output
    drain(worker)
    assert _stored(store, "alice") == {"a2"}
    refused = CliRunner().invoke(cli, ["forget", "--tenant", "alice", "--session", "s1", "--turn", "a2"], env=env)
    assert refused.exit_code == 2 and "not both" in refused.output


def test_a_forget_killed_after_its_commit_is_applied_again_harmlessly(settings: Settings, redis_client: redis.Redis,
                                                                      store: PostgresStore) -> None:
    settings = settings.replace(claim_idle_ms=200, claim_interval_s=0.0)
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "t0", SECRET, session="s1"), turn("alice", "k0", "kept", session="s2")])
    client.forget("alice", session_id="s1")
    client.publish_turns([turn("alice", "t1", "said after the forget", session="s1", minutes=1)])
    dying = ingest_worker(settings, redis_client, store)
    consumer = dying.consumer("dying")
    consumer.ensure_group()
    batch = consumer.read()
    assert len(batch) == 4
    dying.handle(batch)  # committed, then killed before its acknowledgement
    assert _stored(store, "alice") == {"k0", "t1"}
    time.sleep(0.3)
    alive = ingest_worker(settings, redis_client, store)
    # t0 was acknowledged and deleted with the forget's commit; the other three are claimed and handled
    # again, which changes nothing
    assert drain(alive, "alive") == 3
    assert _stored(store, "alice") == {"k0", "t1"}
    assert dying.metrics.forget_turns._value.get() == 1 and alive.metrics.forget_turns._value.get() == 0
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0
    assert _streams_holding(redis_client, settings, SECRET) == [] and _tables_holding(store, SECRET) == []


def test_a_tenant_forget_applied_again_keeps_the_suppression_state_built_after_it(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    # break-it session: the tenant state (scores, ledger, query clusters) has no stream position, and a
    # redelivered tenant forget (its worker died before acknowledging; or a tenant move's step 4) wiped
    # what outcomes of turns published after it had built
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "t0", SECRET)])
    worker = ingest_worker(settings, redis_client, store)
    drain(worker, "c1")
    client.forget("alice")
    dying = worker.consumer("dying")
    dying.ensure_group()
    forget = dying.read()
    worker.handle(forget)  # committed, then killed before its acknowledgement
    client.publish_turns([turn("alice", "t1", "said after the forget", minutes=1)])
    drain(worker, "c1")
    with store.tenant("alice") as tx:
        (entry,) = [link.entry_id for link in tx.entry_links()]
        assert tx.record_outcome("outcome-after", 0, {(entry, 0): 0.25}, None)
        tx.bump_suppression_version("outcome-after")
        tx.add_suppression({(entry, 0): 0.25})
    assert worker.handle(forget) == [forget[0].stream_id]  # the redelivery
    assert _stored(store, "alice") == {"t1"}
    with store.tenant("alice") as tx:
        assert tx.suppression_scores() == {(entry, 0): 0.25}


def test_a_forget_erases_a_stored_hit_that_showed_its_turn_under_an_alias(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    # break-it session: a retrieval filtered to an alias's session shows the alias's turn id and
    # session with the canonical turn's text; forgetting the canonical turn (by id or session) left
    # that stored result holding the text. The hit's entry id is the canonical entry's
    from rq.job import Job

    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", "c", SECRET, session="s1"), turn("alice", "a", SECRET + "!", session="s2")])
    worker = ingest_worker(settings, redis_client, store)
    drain(worker)
    with store.tenant("alice") as tx:
        links = {link.turn_id: link for link in tx.entry_links()}
    assert links["a"].canonical_entry_id == links["c"].entry_id  # deduplicated into c
    job = Job.create("workers.query.jobs.retrieve", id=job_id_for("alice", "filtered", settings.stream_prefix), connection=redis_client,
                     serializer=JSONSerializer)
    Result.create(job, Result.Type.SUCCESSFUL, ttl=60, return_value={"tenant_id": "alice", "hits": [
        {"entry_id": links["c"].entry_id, "turn_id": "a", "session_id": "s2", "text": SECRET, "aliases": []}]})
    client.forget("alice", turn_ids=["c"])
    drain(worker)
    assert _stored(store, "alice") == {"a"}
    assert redis_client.xlen(Result.get_key(job.id)) == 0
    redis_client.delete(Result.get_key(job.id), Job.key_for(job.id))
