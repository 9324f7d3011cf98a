"""Embedding versions in the store: migration 0004, start-up checks, per-tenant refusals, ``mnemos reindex``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from api.errors import RetrievalFailed
from api.schemas import RetrievalRequest
from tests.integration.factories import (
    answered_by_worker,
    client_for,
    conversation_turns,
    drain,
    ingest_turns,
    ingest_worker,
    query_service,
    turn,
)
from tests.support import PG_ADMIN_URL
from workers.ingest.reindex import run_reindex
from workers.ops.migrate import ensure_database, run_migrations
from workers.runtime.errors import EmbeddingVersionError, ReindexError, SchemaOutdatedError
from workers.settings import Settings
from workers.store import PostgresStore
from workers.store.schema import discover
from workers.store.state import (
    EmbeddingVersion,
    check_schema,
    check_store,
    current_version,
    tenant_versions,
)

pytestmark = pytest.mark.integration


def _owner(settings: Settings) -> psycopg.Connection:
    """A connection as the database owner (a superuser here): sees every tenant."""
    return psycopg.connect(settings.database_url, autocommit=True)


def _set_version(settings: Settings, tenant: str, rendering: int, dim: int | None) -> None:
    with _owner(settings) as conn:
        conn.execute("UPDATE tenants SET rendering_version = %s, embedding_dim = %s WHERE tenant_id = %s",
                     (rendering, dim, tenant))


def _tenant_row(settings: Settings, tenant: str) -> tuple:
    with _owner(settings) as conn:
        return conn.execute("SELECT rendering_version, embedding_dim, memory_version FROM tenants WHERE tenant_id = %s",
                            (tenant,)).fetchone()


def _dims(settings: Settings, tenant: str) -> dict[int, int]:
    """Stored embedding dimension -> rows, over every row (canonical and alias) of ``tenant``."""
    with _owner(settings) as conn:
        rows = conn.execute("SELECT octet_length(embedding) / 4, count(*) FROM entries WHERE tenant_id = %s"
                            " GROUP BY 1", (tenant,)).fetchall()
    return {int(d): int(n) for d, n in rows}


def _staged(settings: Settings, tenant: str) -> int:
    with _owner(settings) as conn:
        return int(conn.execute("SELECT count(*) FROM entries WHERE tenant_id = %s AND reindex_embedding IS NOT NULL",
                                (tenant,)).fetchone()[0])


@pytest.fixture
def bare_database(services: None) -> Iterator[str]:
    """A database that exists but has no migration applied."""
    name = f"mnemos_test_{uuid.uuid4().hex[:12]}"
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    ensure_database(url)
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


# migration 0004 and the start-up checks ------------------------------------------------------------

def test_migration_0004_backfills_rendering_0_and_the_stored_dimension(bare_database: str, tmp_path: Path) -> None:
    with PostgresStore(bare_database) as store, pytest.raises(SchemaOutdatedError, match="mnemos migrate"):
        check_schema(store)
    for migration in discover():
        if migration.version < "0004":
            (tmp_path / migration.path.name).write_text(migration.sql_text())
    run_migrations(bare_database, tmp_path)
    with PostgresStore(bare_database) as store, pytest.raises(SchemaOutdatedError, match="predates migration 0004"):
        check_schema(store)
    with psycopg.connect(bare_database, autocommit=True) as conn:  # data written before 0004, as the owner
        conn.execute("INSERT INTO tenants (tenant_id) VALUES ('old'), ('empty')")
        for turn_id in ("t1", "t2"):
            conn.execute("INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding)"
                         " VALUES ('old', %s, 's', 'user', 'x', now(), %s)", (turn_id, b"\0" * 4 * 12))
    assert run_migrations(bare_database) == [m.version for m in discover() if m.version >= "0004"]
    with PostgresStore(bare_database) as store:
        check_schema(store)
        assert tenant_versions(store) == {"old": EmbeddingVersion(0, 12), "empty": EmbeddingVersion(0, None)}
        with pytest.raises(EmbeddingVersionError) as info:
            check_store(store, current_version(12))
    message = str(info.value)
    assert "rendering 0, dimension 12" in message and "rendering 1, dimension 12" in message
    assert "mnemos reindex" in message and "1 tenant" in message and "'old'" not in message


def test_ingest_records_its_version_and_the_start_up_check_compares_every_tenant(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a") + conversation_turns("bob", "b"))
    assert _tenant_row(settings, "alice")[:2] == (1, 64)
    check_store(store, current_version(64))  # fits
    with pytest.raises(EmbeddingVersionError, match="dimension 64 but this worker makes rendering 1, dimension 32"):
        check_store(store, current_version(32))
    _set_version(settings, "bob", 0, 64)
    with pytest.raises(EmbeddingVersionError, match="rendering 0, dimension 64") as info:
        check_store(store, current_version(64))
    assert info.value.tenants == 1


def test_ingest_refuses_to_write_into_a_tenant_of_another_version(settings: Settings, redis_client: redis.Redis,
                                                                  store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, [turn("alice", "a0", "first"), turn("bob", "b0", "first")])
    _set_version(settings, "bob", 0, 64)  # e.g. reindexed to another version while this worker runs
    worker = ingest_worker(settings, redis_client, store)
    client_for(settings, redis_client).publish_turns([turn("alice", "a1", "the cat is grey"),
                                                      turn("bob", "b1", "the dog is brown"),
                                                      turn("bob", "b2", "the bird is blue")])
    assert drain(worker) == 3
    assert _dims(settings, "alice") == {64: 2}
    assert _dims(settings, "bob") == {64: 1}  # nothing written
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 2  # left for a fitting worker
    assert worker.metrics.version_refusals.labels(worker="ingest")._value.get() == 2
    with _owner(settings) as conn:
        assert conn.execute("SELECT count(*) FROM dead_letters").fetchone() == (0,)


def test_a_worker_of_another_version_applies_no_half_of_a_replace(settings: Settings, redis_client: redis.Redis,
                                                                   store: PostgresStore) -> None:
    """Break-it session, round 3: such a worker applied the forget half, then refused the re-add, so
    the key read empty until a fitting worker came."""
    ingest_turns(settings, redis_client, store, [turn("bob", "k", "the first value")])
    _set_version(settings, "bob", 0, 64)
    client_for(settings, redis_client).replace_turn(turn("bob", "k", "the second value"))
    worker = ingest_worker(settings, redis_client, store)
    assert drain(worker) == 1
    with store.tenant("bob") as tx:
        assert [r.text for r in tx.entries_after(0)] == ["the first value"]  # nothing forgotten
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 1  # left whole for a fitting worker


def test_a_tenant_without_embeddings_takes_the_version_of_its_first_writer(settings: Settings,
                                                                           redis_client: redis.Redis,
                                                                           store: PostgresStore) -> None:
    with store.tenant_tx("hollow") as conn:  # e.g. a tenant row left by migration 0004 without entries
        conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES ('hollow', 0)")
    check_store(store, current_version(64))
    ingest_turns(settings, redis_client, store, [turn("hollow", "h1", "now it has one")])
    assert _tenant_row(settings, "hollow")[:2] == (1, 64)


def test_the_query_worker_refuses_a_tenant_of_another_version(settings: Settings, redis_client: redis.Redis,
                                                              store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))
    service = query_service(settings, redis_client, store)
    assert service.answer(RetrievalRequest("alice", "grey cat Pixel", k=3)).hits
    assert service.cache.get("alice") is not None
    _set_version(settings, "alice", 0, 64)  # the rendering differs, the dimension does not
    with pytest.raises(EmbeddingVersionError, match="mnemos reindex"):
        service.answer(RetrievalRequest("alice", "grey cat Pixel", k=3))
    assert service.cache.get("alice") is None  # nothing of the old index survives
    client = client_for(settings, redis_client)
    with pytest.raises(RetrievalFailed, match="EmbeddingVersionError"):
        answered_by_worker(settings, redis_client, service, client.retrieve, "alice", "grey cat Pixel", k=3)
    assert service.metrics.version_refusals.labels(worker="query")._value.get() == 2


# mnemos reindex -------------------------------------------------------------------------------------

def _seed_clusters(settings: Settings, tenant: str, dim: int) -> None:
    with _owner(settings) as conn:
        entry = conn.execute("SELECT min(entry_id) FROM entries WHERE tenant_id = %s", (tenant,)).fetchone()[0]
        conn.execute("INSERT INTO centroids (tenant_id, k, dim, vectors, n_queries) VALUES (%s, 1, %s, %s, 4)",
                     (tenant, dim, b"\0" * 4 * dim))
        conn.execute("INSERT INTO query_buffer (tenant_id, outcome_id, embedding) VALUES (%s, 'o1', %s)",
                     (tenant, b"\0" * 4 * dim))
        conn.execute("INSERT INTO suppression (tenant_id, entry_id, cluster, score) VALUES (%s, %s, 0, 0.5)",
                     (tenant, entry))


def _clusters(settings: Settings, tenant: str) -> tuple[int, int, int]:
    with _owner(settings) as conn:
        return tuple(int(conn.execute(f"SELECT count(*) FROM {t} WHERE tenant_id = %s",  # noqa: S608
                                      (tenant,)).fetchone()[0]) for t in ("centroids", "query_buffer", "suppression"))


class _Interrupted(Exception):
    pass


def test_reindex_is_resumable_and_moves_every_row(settings: Settings, redis_client: redis.Redis,
                                                  store: PostgresStore) -> None:
    turns = conversation_turns("alice", "a") + [turn("alice", "dup", "I adopted a grey cat named Pixel last spring",
                                                     minutes=30)]
    ingest_turns(settings, redis_client, store, turns + conversation_turns("bob", "b"))
    assert _dims(settings, "alice") == {64: 9}
    with _owner(settings) as conn:  # canonical and alias rows are both reindexed
        assert conn.execute("SELECT count(*) FROM entries WHERE tenant_id = 'alice' AND canonical_entry_id IS NOT NULL"
                            ).fetchone() == (1,)
    _seed_clusters(settings, "alice", 64)
    version_before = _tenant_row(settings, "alice")[2]
    new = settings.replace(fake_encoder_dim=32, reindex_batch_size=3)

    def interrupt(batches: int) -> None:
        if batches == 2:
            raise _Interrupted

    with pytest.raises(_Interrupted):  # killed after two committed batches
        run_reindex(new, tenant_id="alice", progress=False, on_batch=interrupt)
    assert _tenant_row(settings, "alice")[:2] == (1, 64)  # still served at the old version meanwhile
    assert _dims(settings, "alice") == {64: 9} and _staged(settings, "alice") == 6
    assert query_service(settings, redis_client, store).answer(RetrievalRequest("alice", "grey cat", k=3)).hits

    report = run_reindex(new, tenant_id="alice", progress=False)
    assert (report.tenants, report.resumed, report.embedded) == (1, 6, 3)
    assert _tenant_row(settings, "alice") == (1, 32, version_before + 1)
    assert _dims(settings, "alice") == {32: 9} and _staged(settings, "alice") == 0
    assert _clusters(settings, "alice") == (0, 0, 0)  # they lived in the old embedding space
    assert _tenant_row(settings, "bob")[:2] == (1, 64)  # --tenant: only alice
    hits = query_service(new, redis_client, store).answer(RetrievalRequest("alice", "grey cat Pixel", k=3)).hits
    assert hits and hits[0].turn_id == "a0" and hits[0].aliases == ("dup",)
    with pytest.raises(EmbeddingVersionError):
        query_service(settings, redis_client, store).answer(RetrievalRequest("alice", "grey cat Pixel", k=3))

    report = run_reindex(new, progress=False)  # every stale tenant: bob is left
    assert (report.tenants, report.current, report.embedded) == (1, 1, 8)
    assert run_reindex(new, progress=False).tenants == 0
    with pytest.raises(ReindexError, match="not stored"):
        run_reindex(new, tenant_id="nobody", progress=False)


def test_rows_an_old_ingest_worker_writes_during_a_reindex_end_at_the_new_version(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    ingest_turns(settings, redis_client, store, conversation_turns("alice", "a"))
    old_worker = ingest_worker(settings, redis_client, store)  # dimension 64, running all along
    client = client_for(settings, redis_client)
    new = settings.replace(fake_encoder_dim=32, reindex_batch_size=2)

    def ingest_meanwhile(batches: int) -> None:
        if batches == 1:  # the tenant is still at 64: the old worker may write, and does
            client.publish_turns([turn("alice", f"late{i}", f"late news number {i}", minutes=40 + i) for i in range(3)])
            assert drain(old_worker, "old") == 3

    report = run_reindex(new, progress=False, on_batch=ingest_meanwhile)
    assert report.embedded == 11
    assert _dims(settings, "alice") == {32: 11}
    assert _tenant_row(settings, "alice")[:2] == (1, 32)

    client.publish_turns([turn("alice", "after", "written after the reindex", minutes=60)])
    assert drain(old_worker, "old") == 1
    assert _dims(settings, "alice") == {32: 11}  # the old worker refused it, left it pending
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 1
    new_worker = ingest_worker(new, redis_client, store)
    consumer = new_worker.consumer("new")
    claimed = redis_client.xclaim(settings.turns_stream, "ingest", "new", 0,
                                  [e["message_id"] for e in redis_client.xpending_range(
                                      settings.turns_stream, "ingest", "-", "+", 10)])
    assert len(claimed) == 1
    consumer.replay_pending()
    consumer.ack(new_worker.handle(consumer.read()))
    assert _dims(settings, "alice") == {32: 12}
