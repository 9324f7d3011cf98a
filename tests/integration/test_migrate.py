"""Migrations apply once, record their versions, and row-level security isolates tenants."""

from __future__ import annotations

import uuid
from pathlib import Path

import psycopg
import pytest

from workers.ops.migrate import run_migrations
from workers.runtime.errors import MigrationError
from workers.store import PostgresStore
from workers.store.schema import discover

pytestmark = pytest.mark.integration


def test_migrate_is_idempotent_and_records_versions(database_url: str) -> None:
    assert run_migrations(database_url) == []
    with psycopg.connect(database_url) as conn:
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_migrations ORDER BY 1")]
    assert versions == [m.version for m in discover()]


def test_edited_migration_is_refused(database_url: str, tmp_path: Path) -> None:
    for migration in discover():
        (tmp_path / migration.path.name).write_text(migration.sql_text() + "\n-- edited\n")
    with pytest.raises(MigrationError, match="changed after it was applied"):
        run_migrations(database_url, tmp_path)


def test_failing_migration_rolls_back(database_url: str, tmp_path: Path) -> None:
    for migration in discover():
        (tmp_path / migration.path.name).write_text(migration.sql_text())
    (tmp_path / "9999_broken.sql").write_text("CREATE TABLE half_done (x int); SELECT nope FROM nowhere;")
    with pytest.raises(MigrationError) as info:
        run_migrations(database_url, tmp_path)
    assert info.value.version == "9999"
    with psycopg.connect(database_url) as conn:
        assert conn.execute("SELECT to_regclass('half_done')").fetchone() == (None,)


def _seed_two_tenants(store: PostgresStore) -> None:
    for tenant in ("alice", "bob"):
        with store.tenant_tx(tenant) as conn:
            conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES (%s, 1)", (tenant,))
            conn.execute(
                "INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding)"
                " VALUES (%s, 't1', 's1', 'user', 'same words', now(), '\\x00')",
                (tenant,),
            )


def test_row_level_security_through_the_store(store: PostgresStore) -> None:
    _seed_two_tenants(store)
    with store.tenant_tx("alice") as conn:
        rows = conn.execute("SELECT tenant_id FROM entries").fetchall()
        assert rows == [("alice",)]
        # asking for the other tenant explicitly still returns nothing
        assert conn.execute("SELECT * FROM entries WHERE tenant_id = 'bob'").fetchall() == []
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding)"
                " VALUES ('bob', 't9', 's', 'user', 'x', now(), '\\x00')"
            )
    with store.plain_tx() as conn:  # no tenant scope: nothing visible
        assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)


def test_row_level_security_for_a_non_superuser_login(store: PostgresStore, database_url: str) -> None:
    _seed_two_tenants(store)
    login = f"mnemos_login_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {login} LOGIN NOSUPERUSER IN ROLE mnemos_app")
    try:
        url = psycopg.conninfo.make_conninfo(database_url, user=login)
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone() == (False,)
            assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
            conn.execute("SELECT set_config('mnemos.tenant_id', 'mallory', true)")
            assert conn.execute("SELECT count(*) FROM entries").fetchone() == (0,)
            conn.execute("SELECT set_config('mnemos.tenant_id', 'bob', true)")
            assert conn.execute("SELECT tenant_id, turn_id FROM entries").fetchall() == [("bob", "t1")]
    finally:
        with psycopg.connect(database_url, autocommit=True) as admin:
            admin.execute(f"DROP ROLE {login}")
