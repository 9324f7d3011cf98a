"""The Postgres store: a connection pool, tenant-scoped transactions, the statements of the service.

Every statement on a tenant table runs inside :meth:`PostgresStore.tenant_tx`, which sets the
transaction-local ``mnemos.tenant_id`` that the row-level security policies of migration 0002
compare against; connections switch to the non-superuser ``db_app_role`` when they open, so the
policies apply even when the login role is a superuser. A forgotten tenant scope therefore reads
and writes nothing, instead of another tenant's rows. The statements of one tenant's
transaction are the methods of :class:`workers.store.postgres_tenant.PostgresTenantSession`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from workers.runtime.errors import DatabaseMissingError, StoreError
from workers.runtime.redaction import redact, secrets_of
from workers.store.postgres_tenant import PostgresTenantSession, insert_dead_letters
from workers.store.rows import SchemaState, TenantVersionRow

if TYPE_CHECKING:
    from workers.runtime.dead_letters import DeadLetter

log = logging.getLogger(__name__)

_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')


def one_line(text: str) -> str:
    """``text`` on one line (libpq's messages span several)."""
    return " ".join(str(text).split())


def probe(database_url: str, timeout_s: float = 5.0) -> None:
    """Open and close one direct connection to ``database_url``.

    Raises:
        DatabaseMissingError: the server answered that the database does not exist.
        StoreError: any other failure, with libpq's reason in the message (password masked);
            transient when the server could not be reached or refused the login.
    """
    try:
        psycopg.connect(database_url, connect_timeout=max(1, round(timeout_s))).close()
    except psycopg.Error as exc:
        reason = redact(one_line(str(exc)), secrets_of([database_url]))
        missing = _MISSING_DATABASE.search(reason)
        if missing:
            raise DatabaseMissingError(missing.group("name")) from exc
        raise StoreError(f"cannot connect to Postgres: {reason}",
                         transient=isinstance(exc, psycopg.OperationalError)) from exc


class PostgresStore:
    """A small pool of Postgres connections (psycopg 3) for one worker process.

    Args:
        database_url: libpq connection string.
        app_role: role to ``SET ROLE`` to on connect ("" keeps the login role).
        max_size: connections in the pool (workers are single-threaded: 2 is plenty).
        timeout_s: seconds to wait for a connection before StoreError.
        statement_timeout_s: Postgres ``statement_timeout`` of every connection (seconds; None: the
            server's). A statement over it is cancelled and raises a transient StoreError, so a hung
            query or lock wait cannot stall a worker's loop.
    """

    def __init__(self, database_url: str, app_role: str = "mnemos_app", *, max_size: int = 2,
                 timeout_s: float = 10.0, statement_timeout_s: float | None = None) -> None:
        self.database_url = database_url
        self.app_role = app_role
        self.timeout_s = timeout_s
        self.statement_timeout_s = statement_timeout_s
        self._pool = ConnectionPool(
            database_url,
            min_size=1,
            max_size=max_size,
            configure=self._configure,
            check=ConnectionPool.check_connection,
            open=False,
            name="mnemos-store",
        )

    def open(self, wait: bool = True) -> PostgresStore:
        """Open the pool; with ``wait`` block until one connection works.

        With ``wait``, one direct connection first tells a missing database or a malformed URL at
        once; an unreachable server is waited for up to ``timeout_s``.

        Raises:
            DatabaseMissingError: the database does not exist (``mnemos migrate`` creates it).
            StoreError: no connection within ``timeout_s`` (transient), or a URL libpq refuses; the
                message holds libpq's own reason.
        """
        if wait:
            try:
                probe(self.database_url, min(self.timeout_s, 5.0))
            except StoreError as exc:
                if not exc.transient:
                    raise
                log.warning("%s; waiting up to %.1fs", exc, self.timeout_s)
        try:
            self._pool.open(wait=wait, timeout=self.timeout_s)
        except PoolTimeout as exc:
            self._pool.close()
            try:
                probe(self.database_url, 2.0)
                reason = "the pool got no working connection"
            except StoreError as cause:
                reason = str(cause).removeprefix("cannot connect to Postgres: ")
            raise StoreError(f"cannot connect to Postgres within {self.timeout_s}s: {reason}",
                             transient=True) from exc
        return self

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _configure(self, conn: psycopg.Connection) -> None:
        if self.app_role:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.app_role)))
        if self.statement_timeout_s is not None:
            conn.execute("SELECT set_config('statement_timeout', %s, false)",
                         (f"{max(1, round(self.statement_timeout_s * 1000))}ms",))
        conn.commit()

    @contextmanager
    def tenant_tx(self, tenant_id: str, *, snapshot: bool = False) -> Iterator[psycopg.Connection]:
        """One transaction scoped to ``tenant_id`` (row-level security) on a raw connection; commits on
        clean exit. The workers use :meth:`tenant`; the raw connection is for this package and for
        tests that inspect the database directly.

        ``snapshot`` makes it REPEATABLE READ READ ONLY: every read sees one consistent snapshot
        (the query worker reads a memory version and its entries together).
        Raises StoreError on connection or server errors; the transaction is rolled back.
        """
        if not tenant_id:  # a caller's bug, not an outage: never retried
            raise StoreError("tenant_tx needs a non-empty tenant id")
        with self._transaction() as conn:
            if snapshot:
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute("SELECT set_config('mnemos.tenant_id', %s, true)", (tenant_id,))
            yield conn

    @contextmanager
    def plain_tx(self) -> Iterator[psycopg.Connection]:
        """A raw transaction without tenant scope: it may record dead letters, and reads nothing of any
        tenant (for this package and for tests, like :meth:`tenant_tx`)."""
        with self._transaction() as conn:
            yield conn

    @contextmanager
    def _transaction(self) -> Iterator[psycopg.Connection]:
        try:
            with self._pool.connection(timeout=self.timeout_s) as conn, conn.transaction():
                yield conn
        except PoolTimeout as exc:
            raise StoreError(f"no Postgres connection within {self.timeout_s}s", transient=True) from exc
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}", transient=True) from exc
        except psycopg.Error as exc:
            raise StoreError(f"{type(exc).__name__}: {exc}", transient=False) from exc

    def ping(self) -> None:
        """Round-trip ``SELECT 1``; raises StoreError when Postgres does not answer."""
        with self.plain_tx() as conn:
            conn.execute("SELECT 1")

    # the typed API (workers.store.protocol.Store) ---------------------------------------------------

    @contextmanager
    def tenant(self, tenant_id: str, *, snapshot: bool = False) -> Iterator[PostgresTenantSession]:
        """:meth:`tenant_tx` as a :class:`~workers.store.protocol.TenantSession`."""
        with self.tenant_tx(tenant_id, snapshot=snapshot) as conn:
            yield PostgresTenantSession(conn, tenant_id)

    def record_dead_letters(self, letters: Sequence[DeadLetter]) -> list[DeadLetter]:
        """Insert ``letters`` in a transaction without tenant scope (the insert policy of migration
        0003 lets any letter in; none can be read back there); returns those inserted now."""
        if not letters:
            return []
        with self.plain_tx() as conn:
            return insert_dead_letters(conn, letters)

    def schema_state(self) -> SchemaState:
        with self.plain_tx() as conn, conn.cursor(row_factory=dict_row) as cur:
            cur.execute("SELECT to_regclass('schema_migrations') IS NOT NULL AS present,"
                        " to_regclass('schema_migrations') IS NOT NULL"
                        " AND has_table_privilege(to_regclass('schema_migrations'), 'SELECT') AS readable")
            state = cur.fetchone()
            assert state is not None
            if not (state["present"] and state["readable"]):
                return SchemaState(bool(state["present"]), bool(state["readable"]))
            cur.execute("SELECT version FROM schema_migrations")
            return SchemaState(True, True, frozenset(str(r["version"]) for r in cur))

    def tenant_versions(self) -> list[TenantVersionRow]:
        """Read through ``mnemos_tenant_versions()`` (migration 0004): row-level security shows the
        service's role one tenant per transaction."""
        with self.plain_tx() as conn, conn.cursor(row_factory=class_row(TenantVersionRow)) as cur:
            cur.execute("SELECT tenant_id, rendering_version, embedding_dim FROM mnemos_tenant_versions()")
            return cur.fetchall()
