"""``mnemos migrate``: apply ``migrations/NNNN_name.sql`` in order, exactly once each, on the
database of every shard (:func:`migrate_shards`; one database unless ``MNEMOS_SHARD_MAP`` gives each
shard its own).

Applied versions are recorded in ``schema_migrations`` (version, name, sha256, applied_at). A
session-level advisory lock serialises concurrent migrators (two pods starting at once), so each
file runs once; each file runs in its own transaction together with its bookkeeping row (the
files are found, and the statements run, by :mod:`workers.store.schema`). An applied file whose
checksum changed is an error: migrations are append-only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import psycopg

from workers.runtime.errors import MigrationError, WorkerError
from workers.runtime.redaction import redact_url
from workers.settings import Settings
from workers.store.schema import MIGRATIONS_DIR, discover, ensure_database, migration_ledger

__all__ = ["ensure_database", "migrate_shards", "run_migrations"]

log = logging.getLogger(__name__)

def run_migrations(database_url: str, directory: Path = MIGRATIONS_DIR) -> list[str]:
    """Apply every pending migration; returns the versions applied now (empty if up to date).

    Raises MigrationError when a file fails (its transaction is rolled back, later files are not
    run) or when an already applied file was edited.
    """
    migrations = discover(directory)
    applied_now: list[str] = []
    with migration_ledger(database_url) as ledger:
        done = ledger.applied()
        for migration in migrations:
            if migration.version in done:
                if done[migration.version] != migration.sha256:
                    raise MigrationError(
                        f"migration {migration.version}_{migration.name} changed after it was "
                        "applied; add a new migration instead",
                        migration.version,
                    )
                continue
            log.info("applying migration %s_%s", migration.version, migration.name)
            ledger.apply(migration.version, migration.name, migration.sha256, migration.sql_text())
            applied_now.append(migration.version)
    return applied_now


def migrate_shards(settings: Settings, shards: Sequence[int] | None = None, *,
                   echo: Callable[[str], None] = print, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Create (if needed) and migrate the database of each of ``shards`` (default: every shard),
    one line per shard with ``echo``; returns the shards migrated. Shards sharing one database (no
    shard map) are migrated once. A shard that fails (unreachable, a failing file) does not stop the
    others: each is independent and migrations are idempotent.

    Raises MigrationError after the last shard when any failed, naming the failed and the done ones.
    """
    chosen = list(range(settings.shards)) if shards is None else list(shards)
    done: list[int] = []
    failed: list[str] = []
    migrated: dict[str, str] = {}  # database URL -> what was applied there
    for shard in chosen:
        url = settings.servers_of(shard).database_url
        where = f"shard {shard} ({redact_url(url)})"
        if url in migrated:
            echo(f"{where}: {migrated[url]} (the database of an earlier shard)")
            done.append(shard)
            continue
        try:
            ensure_database(url)
            applied = run_migrations(url, directory)
        except (WorkerError, psycopg.Error) as exc:
            detail = " ".join(str(exc).split())
            echo(f"{where}: FAILED: {detail}")
            failed.append(f"shard {shard} ({detail})")
            continue
        migrated[url] = f"applied {', '.join(applied)}" if applied else "up to date"
        echo(f"{where}: {migrated[url]}")
        done.append(shard)
    if failed:
        raise MigrationError(f"migration failed on {'; '.join(failed)}; migrated: "
                             f"{', '.join(f'shard {s}' for s in done) or 'none'}")
    return done
