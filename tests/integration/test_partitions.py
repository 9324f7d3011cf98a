"""The per-tenant tables are hash-partitioned by tenant (migration 0007): rows land in their
tenant's partition, keys carry the tenant, data written before the migration survives it."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support import PG_ADMIN_URL
from workers.ops.migrate import run_migrations
from workers.store.schema import discover

pytestmark = pytest.mark.integration

PARTITIONED = ("entries", "suppression", "query_buffer", "applied_outcomes")
PARTITIONS = 16


def _partitions(conn: psycopg.Connection, table: str) -> list[str]:
    return [r[0] for r in conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
        " WHERE i.inhparent = %s::regclass ORDER BY 1", (table,))]


def test_tenant_tables_are_hash_partitioned_on_tenant_id(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        for table in PARTITIONED:
            strategy, key = conn.execute(
                "SELECT p.partstrat, a.attname FROM pg_partitioned_table p"
                " JOIN pg_attribute a ON a.attrelid = p.partrelid AND a.attnum = p.partattrs[0]"
                " WHERE p.partrelid = %s::regclass", (table,)).fetchone()
            assert (table, strategy, key) == (table, "h", "tenant_id")
            parts = _partitions(conn, table)
            assert len(parts) == PARTITIONS
            for part in parts:  # a direct read of a partition is scoped like the parent, and the app may not
                enabled, forced = conn.execute("SELECT relrowsecurity, relforcerowsecurity FROM pg_class"
                                               " WHERE oid = %s::regclass", (part,)).fetchone()
                assert (part, enabled, forced) == (part, True, True)
                assert not conn.execute("SELECT has_table_privilege('mnemos_app', %s, 'SELECT')", (part,)
                                        ).fetchone()[0]
            assert conn.execute("SELECT has_table_privilege('mnemos_app', %s, 'INSERT')", (table,)).fetchone()[0]


def _insert_entry(conn: psycopg.Connection, tenant: str, turn: str, canonical: int | None = None) -> int:
    return conn.execute(
        "INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding, canonical_entry_id)"
        " VALUES (%s, %s, 's1', 'user', %s, now(), '\\x00000000', %s) RETURNING entry_id",
        (tenant, turn, f"text of {turn}", canonical)).fetchone()[0]


def test_an_alias_or_a_score_cannot_name_another_tenants_entry(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:  # the owner: row-level security does not hide the rows
        conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES ('a', 1), ('b', 1)")
        entry_a = _insert_entry(conn, "a", "t1")
        conn.commit()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            _insert_entry(conn, "b", "t1", canonical=entry_a)
        conn.rollback()
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            conn.execute("INSERT INTO suppression (tenant_id, entry_id, cluster, score) VALUES ('b', %s, 0, 1.0)",
                         (entry_a,))
        conn.rollback()
        alias = _insert_entry(conn, "a", "t2", canonical=entry_a)  # within the tenant, as before
        assert alias > entry_a
        partitions = {r[0] for r in conn.execute("SELECT DISTINCT tableoid::regclass::text FROM entries")}
        assert partitions <= set(_partitions(conn, "entries"))


@pytest.fixture(params=["superuser", "owner"])
def database_at_0006(request: pytest.FixtureRequest, name_prefix: str, tmp_path: Path) -> Iterator[str]:
    """A database migrated up to 0006 (the schema before partitioning) by a superuser, or by a login
    role that owns the database and is no superuser (row-level security then applies to it); the
    URL connects as that migrator."""
    name = f"{name_prefix}_{uuid.uuid4().hex[:12]}"
    role = f"{name}_owner" if request.param == "owner" else None
    folder = tmp_path / "migrations"
    folder.mkdir()
    for migration in discover():
        if migration.version <= "0006":
            shutil.copy(migration.path, folder / migration.path.name)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        if role:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER NOBYPASSRLS CREATEROLE").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name),
                                                                    sql.Identifier(role or "postgres")))
    if role:
        with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{name}", autocommit=True) as conn:
            conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(sql.Identifier(role)))
    url = f"postgresql://{role or 'postgres'}@127.0.0.1:5432/{name}"
    run_migrations(url, folder)
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
        if role:
            conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(role)))


def test_rows_written_before_partitioning_survive_it(database_at_0006: str) -> None:
    url = database_at_0006
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM pg_partitioned_table").fetchone()[0] == 0
        for tenant in ("a", "b"):  # as a tenant's transaction writes them (the owner is subject to RLS)
            conn.execute("SELECT set_config('mnemos.tenant_id', %s, true)", (tenant,))
            conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES (%s, 1)", (tenant,))
            if tenant == "a":
                first = _insert_entry(conn, "a", "t1")
                alias = _insert_entry(conn, "a", "t2", canonical=first)
                conn.execute("INSERT INTO suppression (tenant_id, entry_id, cluster, score) VALUES ('a', %s, 3, 0.25)",
                             (first,))
                conn.execute("INSERT INTO query_buffer (tenant_id, outcome_id, embedding) VALUES ('a', 'o1', '\\x00')")
                conn.execute("INSERT INTO applied_outcomes (tenant_id, outcome_id, deltas, suppression_version)"
                             " VALUES ('a', 'o1', '[]', 1)")
            else:
                other = _insert_entry(conn, "b", "t1")
            conn.commit()
    assert run_migrations(url) == [m.version for m in discover() if m.version > "0006"]
    with psycopg.connect(f"postgresql://postgres@127.0.0.1:5432/{url.rsplit('/', 1)[1]}") as conn:  # every row
        after = {t: conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(t))).fetchone()[0]
                 for t in PARTITIONED}
        assert after == {"entries": 3, "suppression": 1, "query_buffer": 1, "applied_outcomes": 1}
        rows = conn.execute("SELECT entry_id, tenant_id, turn_id, canonical_entry_id FROM entries ORDER BY 1").fetchall()
        assert rows == [(first, "a", "t1", None), (alias, "a", "t2", first), (other, "b", "t1", None)]
        assert conn.execute("SELECT entry_id, cluster, score FROM suppression").fetchall() == [(first, 3, 0.25)]
        assert _insert_entry(conn, "b", "t2") > other  # the sequence carried on
        assert conn.execute("SELECT count(*) FROM pg_partitioned_table").fetchone()[0] == len(PARTITIONED)
        forced = conn.execute("SELECT bool_and(relforcerowsecurity) FROM pg_class WHERE relname = ANY(%s)",
                              (list(PARTITIONED),)).fetchone()[0]
        assert forced  # lifted for the copy only
    assert run_migrations(url) == []
