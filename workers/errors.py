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
