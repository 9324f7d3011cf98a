"""Errors raised by the Mnemos core.

Every error derives from :class:`MnemosError`, so a caller can catch the whole family at a
boundary. Errors that signal a bad argument also derive from :class:`ValueError` (and lookups
from :class:`KeyError`), so generic handlers keep working.
"""

from __future__ import annotations


class MnemosError(Exception):
    """Base class of every error raised by :mod:`mnemos`."""


class EmptyQueryError(MnemosError, ValueError):
    """Raised by :func:`mnemos.pipeline.retrieve` when the query is empty or only whitespace.

    A query of only punctuation is *not* empty: it reaches the dense retriever and simply gives
    BM25 no tokens.
    """

    def __init__(self, query: str) -> None:
        super().__init__(f"query is empty or whitespace only: {query!r}")
        self.query = query


class DimensionMismatchError(MnemosError, ValueError):
    """Raised when a vector or matrix has the wrong shape for an index, encoder or centroid set.

    Carries the expected and the actual shape (as tuples) for the log line.
    """

    def __init__(self, what: str, expected: tuple[int, ...] | str, actual: tuple[int, ...]) -> None:
        super().__init__(f"{what}: expected shape {expected}, got {actual}")
        self.what = what
        self.expected = expected
        self.actual = actual


class DuplicateEntryError(MnemosError, ValueError):
    """Raised when an index is asked to add an entry id it already holds (or twice in one call)."""

    def __init__(self, entry_ids: list[int]) -> None:
        shown = entry_ids[:10]
        super().__init__(f"entry ids already present or repeated: {shown}{'...' if len(entry_ids) > 10 else ''}")
        self.entry_ids = entry_ids


class UnknownEntryError(MnemosError, KeyError):
    """Raised by :class:`mnemos.tenant_index.TenantIndex` when an entry id is not in the tenant."""

    def __init__(self, tenant_id: str, entry_id: int) -> None:
        super().__init__(f"tenant {tenant_id!r} has no entry {entry_id}")
        self.tenant_id = tenant_id
        self.entry_id = entry_id

    def __str__(self) -> str:  # KeyError would otherwise print the repr of the message
        return str(self.args[0])


class TenantMismatchError(MnemosError, ValueError):
    """Raised when an entry of one tenant is handed to another tenant's index (isolation gate)."""

    def __init__(self, expected: str, actual: str) -> None:
        super().__init__(f"entry of tenant {actual!r} handed to the index of tenant {expected!r}")
        self.expected = expected
        self.actual = actual


class InvalidParameterError(MnemosError, ValueError):
    """Raised when a parameter is out of its documented range (a rank outside 1..P, a negative
    pool size, a retrieval config with both retrievers disabled, and so on)."""


class ModelLoadError(MnemosError):
    """Raised when a bi-encoder or cross-encoder cannot be loaded from the given name or path.

    The library's own exception is chained as ``__cause__``.
    """

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"cannot load model {model!r}: {reason}")
        self.model = model
        self.reason = reason

