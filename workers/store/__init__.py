"""The one place that talks to Postgres: typed repository methods behind a Protocol.

* :class:`Store` and :class:`TenantSession` (:mod:`workers.store.protocol`): what the workers
  need, one tenant-scoped transaction at a time.
* :class:`PostgresStore` (:mod:`workers.store.postgres`, statements of a tenant's transaction in
  :mod:`workers.store.postgres_tenant`): the service's implementation, rows read by column name.
* :class:`FakeStore` (:mod:`workers.store.fake`): the same Protocol in memory, for fast tests of
  the worker logic.
* :mod:`workers.store.schema` (create and drop databases, migration bookkeeping) and
  :mod:`workers.store.audit` (cross-tenant reads for the fault benchmark).

No SQL text lives outside this package and ``migrations/`` (``tests/unit/test_architecture.py``).
"""

from workers.store.fake import FakeStore, FakeTenantSession
from workers.store.postgres import PostgresStore, one_line, probe
from workers.store.postgres_tenant import PostgresTenantSession
from workers.store.protocol import Store, TenantSession
from workers.store.rows import (
    VECTOR_DTYPE,
    CanonicalRow,
    Deltas,
    EntryLink,
    EntryRow,
    LedgerRow,
    NewEntry,
    SchemaState,
    SessionRow,
    StagedEmbedding,
    StagingRow,
    StoredTurn,
    TenantLock,
    TenantRow,
    TenantVersionRow,
    Tombstone,
    matrix_from_bytes,
    vector_to_bytes,
    vectors_from_bytes,
)

__all__ = [
    "VECTOR_DTYPE",
    "CanonicalRow",
    "Deltas",
    "EntryLink",
    "EntryRow",
    "FakeStore",
    "FakeTenantSession",
    "LedgerRow",
    "NewEntry",
    "PostgresStore",
    "PostgresTenantSession",
    "SchemaState",
    "SessionRow",
    "StagedEmbedding",
    "StagingRow",
    "Store",
    "StoredTurn",
    "TenantLock",
    "TenantRow",
    "TenantSession",
    "TenantVersionRow",
    "Tombstone",
    "matrix_from_bytes",
    "one_line",
    "probe",
    "vector_to_bytes",
    "vectors_from_bytes",
]
