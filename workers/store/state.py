"""What a process checks of its database before it takes work, and of each tenant while it runs.

* **Schema**: every migration this code ships is applied (else :class:`SchemaOutdatedError`, which
  names ``mnemos migrate``). Newer migrations than the code knows are allowed (they are additive).
* **Embedding versions**: a tenant's stored embeddings were all made with one rendering
  (:mod:`mnemos.rendering`) and one encoder dimension, recorded on its ``tenants`` row (migration
  0004). A process that embeds (ingest) or compares against stored embeddings (query) must make
  the same pair, or :class:`EmbeddingVersionError` names both and ``mnemos reindex``. A tenant
  without embeddings (dimension NULL) fits any process; the first ingest write gives it its version.

The checks across tenants read :meth:`workers.store.Store.tenant_versions` (on Postgres a function
of migration 0004, since row-level security shows the service's role one tenant per transaction).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass

from mnemos.rendering import RENDERING_VERSION
from workers.runtime.errors import EmbeddingVersionError, SchemaOutdatedError
from workers.store import Store, TenantSession
from workers.store.rows import TenantRow
from workers.store.schema import discover


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
    """A tenant's row: its memory version, the version of its stored embeddings, its suppression
    version and its forget version (how many forgets were applied, migration 0006)."""

    tenant_id: str
    memory_version: int
    embeddings: EmbeddingVersion
    suppression_version: int = 0
    forget_version: int = 0


# schema ---------------------------------------------------------------------------------------------

def pending_migrations(store: Store) -> tuple[str, ...]:
    """Versions of this code's migrations the database lacks.

    Raises SchemaOutdatedError when the database cannot tell (no migrations table, or one the
    store's role may not read: the grant comes with migration 0004).
    """
    state = store.schema_state()
    if not state.exists:
        raise SchemaOutdatedError("no migration was ever applied", tuple(m.version for m in discover()))
    if not state.readable:
        raise SchemaOutdatedError("it predates migration 0004")
    return tuple(m.version for m in discover() if m.version not in state.applied)


def check_schema(store: Store) -> None:
    """Raise SchemaOutdatedError unless every migration of this code is applied (StoreError if
    Postgres fails)."""
    pending = pending_migrations(store)
    if pending:
        raise SchemaOutdatedError(f"pending migrations {', '.join(pending)}", pending)


# versions across tenants ----------------------------------------------------------------------------

def _version(rendering: int, dim: int | None) -> EmbeddingVersion:
    return EmbeddingVersion(int(rendering), None if dim is None else int(dim))


def version_counts(store: Store) -> Counter[EmbeddingVersion]:
    """Tenants per embedding version (tenants without embeddings counted under ``dim`` None)."""
    return Counter(_version(r.rendering_version, r.embedding_dim) for r in store.tenant_versions())


def tenant_versions(store: Store) -> dict[str, EmbeddingVersion]:
    """Every tenant id with the version of its stored embeddings."""
    return {r.tenant_id: _version(r.rendering_version, r.embedding_dim) for r in store.tenant_versions()}


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

def _record(row: TenantRow) -> TenantRecord:
    return TenantRecord(row.tenant_id, int(row.memory_version), _version(row.rendering_version, row.embedding_dim),
                        int(row.suppression_version), int(row.forget_version))


def read_tenant(session: TenantSession) -> TenantRecord | None:
    """The session's tenant, or None for an unknown tenant."""
    row = session.tenant()
    return None if row is None else _record(row)


def require_tenant_version(session: TenantSession, worker: EmbeddingVersion, *,
                           adopt: bool = False) -> TenantRecord | None:
    """The session's tenant after checking that its embeddings fit ``worker``'s version.

    With ``adopt`` (the ingest worker, under the tenant's advisory lock), a tenant without
    embeddings takes ``worker``'s version. Returns None for an unknown tenant.

    Raises:
        EmbeddingVersionError: the tenant's embeddings were made with another rendering or
            dimension (``tenant_id`` set on the error, not in its message).
    """
    record = read_tenant(session)
    if record is None:
        return None
    stored = record.embeddings
    if not stored.fits(worker):
        assert worker.dim is not None
        raise EmbeddingVersionError(stored.pair(), (worker.rendering, worker.dim), tenant_id=session.tenant_id)
    if adopt and stored.dim is None:
        assert worker.dim is not None
        session.set_embedding_version(worker.rendering, worker.dim)
        record = dataclasses.replace(record, embeddings=worker)
    return record
