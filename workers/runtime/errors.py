"""Errors raised by the workers and their adapters (root: ``WorkerError``).

Adapters translate redis, rq and psycopg errors into these with ``raise ... from exc``.
"""

from __future__ import annotations


class WorkerError(Exception):
    """Base class of every error raised by ``workers``."""


class SettingsError(WorkerError):
    """Raised when a setting (or its environment variable) has an invalid value."""


class MigrationError(WorkerError):
    """Raised when a migration file is malformed or fails to apply; carries the version."""

    def __init__(self, message: str, version: str | None = None) -> None:
        super().__init__(message)
        self.version = version


class StoreError(WorkerError):
    """Raised when Postgres rejects or cannot serve a store operation.

    ``transient`` is True when the server could not be reached or the connection broke (retry
    later); False when the server refused the statement itself or the stored data cannot be used
    (retrying will not help). Only a known outage is transient: the default is False, so a new
    failure mode goes to the poison path (a dead letter) instead of being retried forever.
    """

    def __init__(self, message: str, *, transient: bool = False) -> None:
        super().__init__(message)
        self.transient = transient


class ModelSetupError(WorkerError):
    """Raised when a configured model cannot be loaded (path missing, unreadable weights)."""


class OutsideQueryWorkerError(WorkerError):
    """Raised when the retrieval job function runs outside a ``QueryWorker`` (no service bound)."""


class EmbeddedServicesError(WorkerError):
    """Raised when ``mnemos up`` cannot start the embedded Redis or Postgres."""


class StoreStateError(WorkerError):
    """Raised when Postgres answers but its database cannot be used as it stands by this process.

    An operator must act (the message names the command); retrying does not help. The CLI exits
    with code 2 on it.
    """


class DatabaseMissingError(StoreStateError):
    """Raised when the configured database does not exist (``mnemos migrate`` creates it)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"database {name!r} does not exist: run `mnemos migrate` (it creates the database "
                         "and its tables)")
        self.name = name


class SchemaOutdatedError(StoreStateError):
    """Raised when migrations this code ships are not applied to the database (``mnemos migrate``).

    ``pending`` holds the missing versions, or is empty when the database cannot say which (a schema
    older than migration 0004 does not let the service's role read its migrations table).
    """

    def __init__(self, detail: str, pending: tuple[str, ...] = ()) -> None:
        super().__init__(f"the database schema is not up to date ({detail}): run `mnemos migrate`")
        self.pending = pending


class EmbeddingVersionError(StoreStateError):
    """Raised when stored embeddings were made with another rendering or encoder dimension than
    this process's: at a worker's start (any tenant) or per request/batch while it runs (one tenant,
    e.g. reindexed while an old worker runs). ``mnemos reindex`` moves tenants to the current version.

    ``stored`` and ``expected`` are ``(rendering, dimension)`` pairs; ``tenants`` counts the tenants
    stored under ``stored``; ``tenant_id`` is set for a per-tenant refusal (not in the message, which
    may reach logs).
    """

    def __init__(self, stored: tuple[int, int | None], expected: tuple[int, int], *, tenants: int = 1,
                 tenant_id: str | None = None, what: str = "this worker") -> None:
        scope = "a tenant's stored embeddings are" if tenant_id is not None else (
            f"stored embeddings of {tenants} tenant{'s' if tenants != 1 else ''} are")
        super().__init__(
            f"{scope} rendering {stored[0]}, dimension {stored[1]} but {what} makes rendering {expected[0]}, "
            f"dimension {expected[1]}: run `mnemos reindex` with this configuration, or configure the encoder "
            "and code the stored embeddings were made with")
        self.stored = stored
        self.expected = expected
        self.tenants = tenants
        self.tenant_id = tenant_id


class ReindexError(WorkerError):
    """Raised when ``mnemos reindex`` is asked for a tenant the store does not hold."""


class TenantMoveError(WorkerError):
    """Raised by ``mnemos reshard move`` when a tenant cannot be moved between shards (a move of it under
    way, or a step that failed); the message says where the tenant is left (serving from its source, or
    frozen until the move is run again)."""


class TenantMoveRefused(TenantMoveError):
    """Raised by ``mnemos reshard move`` before it changes anything, when the command itself must change:
    a tenant id with no rows and no messages (a mistyped id?), or a stopped move resumed towards another
    shard than one that holds its copy (exit code 2, as for a setting that must change first)."""
