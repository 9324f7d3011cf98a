"""``mnemos migrate``: apply ``migrations/NNNN_name.sql`` in order, exactly once each.

Applied versions are recorded in ``schema_migrations`` (version, name, sha256, applied_at). A
session-level advisory lock serialises concurrent migrators (two pods starting at once), so each
file runs once; each file runs in its own transaction together with its bookkeeping row. An
applied file whose checksum changed is an error: migrations are append-only.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from workers.errors import MigrationError

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(str(importlib.resources.files("migrations")))  # package data: works installed or editable
MIGRATION_LOCK_KEY = 0x6D6E656D6F73  # "mnemos": any fixed bigint shared by all migrators
_FILE_RE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One SQL file: ``version`` is its 4-digit prefix, ``sha256`` the hex digest of its bytes."""

    version: str
    name: str
    path: Path
    sha256: str

    def sql_text(self) -> str:
        return self.path.read_text(encoding="utf-8")


def discover(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    """Migration files of ``directory`` sorted by version; raises MigrationError on bad names or none."""
    found: list[Migration] = []
    for path in sorted(directory.glob("*.sql")):
        match = _FILE_RE.match(path.name)
        if match is None:
            raise MigrationError(f"migration file name must look like 0001_name.sql: {path.name}")
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        found.append(Migration(match.group(1), match.group(2), path, digest))
    if not found:
        raise MigrationError(f"no migration files (*.sql) in {directory}")
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"duplicate migration versions in {directory}: {versions}")
    return found


def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it does not exist; True if created."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    name = info.get("dbname")
    if not name or name == "postgres":
        return False
    admin = psycopg.conninfo.make_conninfo(database_url, dbname="postgres")
    try:
        with psycopg.connect(admin, autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
            if exists:
                return False
            try:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            except psycopg.errors.DuplicateDatabase:
                return False
    except psycopg.Error as exc:
        raise MigrationError(f"cannot create database {name!r}: {exc}") from exc
    log.info("created database %s", name)
    return True


def run_migrations(database_url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply every pending migration; returns the versions applied now (empty if up to date).

    Raises MigrationError when a file fails (its transaction is rolled back, later files are not
    run) or when an already applied file was edited.
    """
    migrations = discover(directory)
    applied_now: list[str] = []
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version text PRIMARY KEY, name text NOT NULL, sha256 text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())"
                )
                done = dict(conn.execute("SELECT version, sha256 FROM schema_migrations").fetchall())
                for migration in migrations:
                    if migration.version in done:
                        if done[migration.version] != migration.sha256:
                            raise MigrationError(
                                f"migration {migration.version}_{migration.name} changed after it was "
                                "applied; add a new migration instead",
                                migration.version,
                            )
                        continue
                    _apply(conn, migration)
                    applied_now.append(migration.version)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
    return applied_now


def _apply(conn: psycopg.Connection, migration: Migration) -> None:
    log.info("applying migration %s_%s", migration.version, migration.name)
    try:
        with conn.transaction():
            conn.execute(migration.sql_text())  # type: ignore[arg-type]  # trusted file, no params
            conn.execute(
                "INSERT INTO schema_migrations (version, name, sha256) VALUES (%s, %s, %s)",
                (migration.version, migration.name, migration.sha256),
            )
    except psycopg.Error as exc:
        raise MigrationError(
            f"migration {migration.version}_{migration.name} failed: {exc}", migration.version
        ) from exc
