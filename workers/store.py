"""Postgres adapter shared by the workers: a connection pool, tenant-scoped transactions, codecs.

Every statement on a tenant table runs inside :meth:`Store.tenant_tx`, which sets the
transaction-local ``mnemos.tenant_id`` that the row-level security policies of migration 0002
compare against; connections switch to the non-superuser ``db_app_role`` when they open, so the
policies apply even when the login role is a superuser. A forgotten tenant scope therefore reads
and writes nothing, instead of another tenant's rows.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import psycopg
from psycopg import sql
from psycopg_pool import ConnectionPool, PoolTimeout

from workers.errors import DatabaseMissingError, StoreError
from workers.redaction import redact, secrets_of

log = logging.getLogger(__name__)

_MISSING_DATABASE = re.compile(r'database "(?P<name>[^"]+)" does not exist')

VECTOR_DTYPE = np.dtype("<f4")  # embeddings are stored as little-endian float32 bytes


def vector_to_bytes(vector: np.ndarray) -> bytes:
    """Bytes of one ``(dim,)`` vector (or a ``(k, dim)`` matrix, row-major) as little-endian float32."""
    return np.ascontiguousarray(vector, dtype=VECTOR_DTYPE).tobytes()


def vectors_from_bytes(blobs: Sequence[bytes], dim: int) -> np.ndarray:
    """``(len(blobs), dim)`` float32 matrix from per-row bytes; raises StoreError on a bad length."""
    out = np.zeros((len(blobs), dim), dtype=np.float32)
    for row, blob in enumerate(blobs):
        vector = np.frombuffer(blob, dtype=VECTOR_DTYPE)
        if vector.shape[0] != dim:
            raise StoreError(f"stored embedding has {vector.shape[0]} floats, expected {dim}")
        out[row] = vector
    return out


def matrix_from_bytes(blob: bytes, rows: int, dim: int) -> np.ndarray:
    """``(rows, dim)`` float32 matrix from one row-major blob; raises StoreError on a bad length."""
    flat = np.frombuffer(blob, dtype=VECTOR_DTYPE)
    if flat.shape[0] != rows * dim:
        raise StoreError(f"stored matrix has {flat.shape[0]} floats, expected {rows}x{dim}")
    return flat.reshape(rows, dim).astype(np.float32)


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


class Store:
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

    def open(self, wait: bool = True) -> Store:
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

    def __enter__(self) -> Store:
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
        """One transaction scoped to ``tenant_id`` (row-level security); commits on clean exit.

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
        """A transaction without tenant scope: it may record dead letters, and reads nothing of any tenant."""
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

    # reads shared by several workers ------------------------------------------------------------

    @staticmethod
    def memory_version(conn: psycopg.Connection, tenant_id: str) -> int | None:
        """The tenant's memory version, or None for an unknown tenant (inside its tenant_tx)."""
        row = conn.execute("SELECT memory_version FROM tenants WHERE tenant_id = %s", (tenant_id,)).fetchone()
        return None if row is None else int(row[0])

    @staticmethod
    def versions(conn: psycopg.Connection, tenant_id: str) -> tuple[int, int] | None:
        """``(memory_version, suppression_version)`` of the tenant, or None for an unknown tenant
        (inside its tenant_tx; read both in one snapshot to know which state a retrieval used)."""
        row = conn.execute("SELECT memory_version, suppression_version FROM tenants WHERE tenant_id = %s",
                           (tenant_id,)).fetchone()
        return None if row is None else (int(row[0]), int(row[1]))

    @staticmethod
    def centroids(conn: psycopg.Connection, tenant_id: str) -> np.ndarray | None:
        """The tenant's frozen ``(k, dim)`` centroids, or None before bootstrap (inside its tenant_tx)."""
        row = conn.execute(
            "SELECT k, dim, vectors FROM centroids WHERE tenant_id = %s", (tenant_id,)
        ).fetchone()
        if row is None:
            return None
        return matrix_from_bytes(bytes(row[2]), int(row[0]), int(row[1]))
