"""The one place that talks to Postgres: typed repository methods behind a Protocol.

* :class:`Store` and :class:`TenantSession` (:mod:`workers.store.protocol`): what the workers
  need, one tenant-scoped transaction at a time.
* :class:`PostgresStore` (:mod:`workers.store.postgres`, statements of a tenant's transaction in
  :mod:`workers.store.postgres_tenant`): the service's implementation, rows read by column name.
* :class:`FakeStore` (:mod:`workers.store.fake`): the same Protocol in memory, for fast tests of
  the worker logic.
* :mod:`workers.store.schema` (create and drop databases, migration files and bookkeeping),
  :mod:`workers.store.state` (what a process checks of its database before work: the schema, the
  tenants' embedding versions) and :mod:`workers.store.audit` (cross-tenant reads for the fault
  benchmark).

No SQL text lives outside this package and ``migrations/`` (``tests/unit/test_architecture.py``).
"""

from workers.store.fake import FakeStore, FakeTenantSession
from workers.store.postgres import PostgresStore, one_line, probe
from workers.store.postgres_tenant import PostgresTenantSession
from workers.store.protocol import Store, TenantSession

__all__ = [
    "FakeStore",
    "FakeTenantSession",
    "PostgresStore",
    "PostgresTenantSession",
    "Store",
    "TenantSession",
    "one_line",
    "probe",
]
