"""Database administration: create and drop a database, and the bookkeeping of ``mnemos migrate``.

:mod:`workers.ops.migrate` decides which migration files run; this module finds the files this code
ships (:func:`discover`, which the workers' start-up check of the schema reads too) and
holds the statements: creating the database, the ``schema_migrations`` table (version, name, sha256,
applied_at), the session-level advisory lock that serialises concurrent migrators (two pods starting
at once), and running one file in its own transaction together with its bookkeeping row.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql
from psycopg.rows import dict_row

from workers.runtime.errors import MigrationError

log = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = 0x6D6E656D6F73  # "mnemos": any fixed bigint shared by all migrators
MIGRATIONS_DIR = Path(str(importlib.resources.files("migrations")))  # package data: works installed or editable
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


def _admin_url(database_url: str) -> tuple[str, str | None]:
    name = psycopg.conninfo.conninfo_to_dict(database_url).get("dbname")
    return psycopg.conninfo.make_conninfo(database_url, dbname="postgres"), None if name is None else str(name)


def ensure_database(database_url: str) -> bool:
    """Create the database named in ``database_url`` if it does not exist; True if created.

    Raises MigrationError when the server refuses.
    """
    admin, name = _admin_url(database_url)
    if not name or name == "postgres":
        return False
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


def drop_database(database_url: str) -> None:
    """Drop the database named in ``database_url`` if it exists, closing its connections (a
    benchmark's own database at the end of its run). Raises psycopg.Error when the server refuses."""
    admin, name = _admin_url(database_url)
    if not name:
        return
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


class MigrationLedger:
    """The ``schema_migrations`` table on one autocommit connection that holds the migration lock."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def applied(self) -> dict[str, str]:
        """``{version: sha256}`` of the migrations applied so far."""
        with self._conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT version, sha256 FROM schema_migrations")
            return {str(r["version"]): str(r["sha256"]) for r in cur}

    def apply(self, version: str, name: str, sha256: str, text: str) -> None:
        """Run one migration's SQL ``text`` and record it, in one transaction (a failure leaves neither
        and raises MigrationError naming the version)."""
        try:
            with self._conn.transaction():
                self._conn.execute(text)  # a trusted migration file, no parameters
                self._conn.execute("INSERT INTO schema_migrations (version, name, sha256) VALUES (%s, %s, %s)",
                                   (version, name, sha256))
        except psycopg.Error as exc:
            raise MigrationError(f"migration {version}_{name} failed: {exc}", version) from exc


@contextmanager
def migration_ledger(database_url: str) -> Iterator[MigrationLedger]:
    """Connect, take the migration lock (waiting for another migrator) and create
    ``schema_migrations`` if needed; the lock is released on exit. Raises MigrationError when
    Postgres fails."""
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    " version text PRIMARY KEY, name text NOT NULL, sha256 text NOT NULL,"
                    " applied_at timestamptz NOT NULL DEFAULT now())")
                yield MigrationLedger(conn)
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
    except psycopg.Error as exc:
        raise MigrationError(f"migration failed: {exc}") from exc
