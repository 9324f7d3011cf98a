"""What a process checks of its database before it takes work, and of each tenant while it runs.

* **Schema**: every migration this code ships is applied (else :class:`SchemaOutdatedError`, which
  names ``mnemos migrate``). Newer migrations than the code knows are allowed (they are additive).
* **Embedding versions**: a tenant's stored embeddings were all made with one rendering
  (:mod:`mnemos.rendering`) and one encoder dimension, recorded on its ``tenants`` row (migration
  0004). A process that embeds (ingest) or compares against stored embeddings (query) must make
  the same pair, or :class:`EmbeddingVersionError` names both and ``mnemos reindex``. A tenant
  without embeddings (dimension NULL) fits any process; the first ingest write gives it its version.

The checks across tenants read ``mnemos_tenant_versions()`` (a function of migration 0004), since
row-level security shows the service's role one tenant per transaction.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import psycopg

from mnemos.rendering import RENDERING_VERSION
from workers.errors import EmbeddingVersionError, SchemaOutdatedError
from workers.migrate import discover
from workers.store import Store


@dataclass(frozen=True)
class EmbeddingVersion:
    """The rendering and the encoder dimension (floats) of embeddings; ``dim`` None: none stored."""

    rendering: int
    dim: int | None

    def fits(self, worker: EmbeddingVersion) -> bool:
        """True when embeddings of this version may be mixed with ``worker``'s (or none are stored)."""
        return self.dim is None or (self.rendering, self.dim) == (worker.rendering, worker.dim)

    def pair(self) -> tuple[int, int | None]:
        return self.rendering, self.dim

    def sort_key(self) -> tuple[int, int]:
        return self.rendering, -1 if self.dim is None else self.dim

    def __str__(self) -> str:
        return f"rendering {self.rendering}, dimension {self.dim}"


def current_version(dim: int) -> EmbeddingVersion:
    """The version this code makes with an encoder of ``dim`` floats (the current rendering)."""
    return EmbeddingVersion(int(RENDERING_VERSION), int(dim))


@dataclass(frozen=True)
class TenantRecord:
    """A tenant's row: its memory version and the version of its stored embeddings."""

    tenant_id: str
    memory_version: int
    embeddings: EmbeddingVersion
    suppression_version: int = 0


# schema ---------------------------------------------------------------------------------------------

def pending_migrations(conn: psycopg.Connection) -> tuple[str, ...]:
    """Versions of this code's migrations the database lacks.

    Raises SchemaOutdatedError when the database cannot tell (no migrations table, or one the
    connection's role may not read: the grant comes with migration 0004).
    """
    exists, readable = conn.execute(
        "SELECT to_regclass('schema_migrations') IS NOT NULL,"
        " to_regclass('schema_migrations') IS NOT NULL"
        " AND has_table_privilege(to_regclass('schema_migrations'), 'SELECT')").fetchone()
    if not exists:
        raise SchemaOutdatedError("no migration was ever applied", tuple(m.version for m in discover()))
    if not readable:
        raise SchemaOutdatedError("it predates migration 0004")
    applied = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
    return tuple(m.version for m in discover() if m.version not in applied)


def check_schema(store: Store) -> None:
    """Raise SchemaOutdatedError unless every migration of this code is applied (StoreError if
    Postgres fails)."""
    with store.plain_tx() as conn:
        pending = pending_migrations(conn)
    if pending:
        raise SchemaOutdatedError(f"pending migrations {', '.join(pending)}", pending)


# versions across tenants ----------------------------------------------------------------------------

def version_counts(store: Store) -> Counter[EmbeddingVersion]:
    """Tenants per embedding version (tenants without embeddings counted under ``dim`` None)."""
    with store.plain_tx() as conn:
        rows = conn.execute("SELECT rendering_version, embedding_dim FROM mnemos_tenant_versions()").fetchall()
    return Counter(EmbeddingVersion(int(r[0]), None if r[1] is None else int(r[1])) for r in rows)


def tenant_versions(store: Store) -> dict[str, EmbeddingVersion]:
    """Every tenant id with the version of its stored embeddings."""
    with store.plain_tx() as conn:
        rows = conn.execute("SELECT tenant_id, rendering_version, embedding_dim FROM mnemos_tenant_versions()"
                            ).fetchall()
    return {r[0]: EmbeddingVersion(int(r[1]), None if r[2] is None else int(r[2])) for r in rows}


def check_versions(store: Store, worker: EmbeddingVersion, *, what: str = "this worker") -> Counter[EmbeddingVersion]:
    """Raise EmbeddingVersionError naming the first stored version ``worker`` does not fit (with its
    tenant count); returns the counts otherwise."""
    counts = version_counts(store)
    for version, n in sorted(counts.items(), key=lambda item: item[0].sort_key()):
        if not version.fits(worker):
            assert worker.dim is not None
            raise EmbeddingVersionError(version.pair(), (worker.rendering, worker.dim), tenants=n, what=what)
    return counts


def check_store(store: Store, worker: EmbeddingVersion | None = None) -> None:
    """Start-up check of a worker: the schema, then (for a worker with an encoder) the versions."""
    check_schema(store)
    if worker is not None:
        check_versions(store, worker)


# one tenant, inside its transaction -----------------------------------------------------------------

def read_tenant(conn: psycopg.Connection, tenant_id: str) -> TenantRecord | None:
    """The tenant's row, or None for an unknown tenant (inside its ``tenant_tx``)."""
    row = conn.execute("SELECT memory_version, rendering_version, embedding_dim, suppression_version FROM tenants"
                       " WHERE tenant_id = %s", (tenant_id,)).fetchone()
    if row is None:
        return None
    return TenantRecord(tenant_id, int(row[0]), EmbeddingVersion(int(row[1]), None if row[2] is None else int(row[2])),
                        int(row[3]))


def require_tenant_version(conn: psycopg.Connection, tenant_id: str, worker: EmbeddingVersion, *,
                           adopt: bool = False) -> TenantRecord | None:
    """The tenant's row after checking that its embeddings fit ``worker``'s version.

    With ``adopt`` (the ingest worker, under the tenant's advisory lock), a tenant without
    embeddings takes ``worker``'s version. Returns None for an unknown tenant.

    Raises:
        EmbeddingVersionError: the tenant's embeddings were made with another rendering or
            dimension (``tenant_id`` set on the error, not in its message).
    """
    record = read_tenant(conn, tenant_id)
    if record is None:
        return None
    stored = record.embeddings
    if not stored.fits(worker):
        assert worker.dim is not None
        raise EmbeddingVersionError(stored.pair(), (worker.rendering, worker.dim), tenant_id=tenant_id)
    if adopt and stored.dim is None:
        conn.execute("UPDATE tenants SET rendering_version = %s, embedding_dim = %s WHERE tenant_id = %s",
                     (worker.rendering, worker.dim, tenant_id))
        record = TenantRecord(tenant_id, record.memory_version, worker, record.suppression_version)
    return record
