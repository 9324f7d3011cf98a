"""The typed rows the store reads and writes, and the byte codec of stored embeddings.

Every row is a frozen dataclass whose field names are the column names (the Postgres store reads
them with psycopg's ``class_row``; the fake store builds the same objects). A stored turn and a session
are read as the catalog's records (:class:`api.catalog.TurnRecord`, :class:`api.catalog.SessionSummary`),
and :class:`EntryRow`, the one row of ``entries``, extends the first. Embeddings travel as
the bytes of little-endian float32 vectors, as stored; :func:`vectors_from_bytes` turns a list of
them into a matrix and checks their length.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

import numpy as np

from api.catalog import TurnRecord
from workers.runtime.errors import StoreError

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


class TenantLock(IntEnum):
    """Per-tenant locks held until the end of the transaction (Postgres advisory locks keyed by
    ``(class, hashtext(tenant_id))``; the value is the class key)."""

    INGEST = 0x4D4E4931  # "MNI1": one writer of a tenant's entries at a time (ids grow in commit order)
    SUPPRESSION = 0x4D4E5331  # "MNS1": serialises one tenant's cluster bootstrap across workers


@dataclass(frozen=True)
class TenantRow:
    """A ``tenants`` row: versions of the tenant's memory, suppression state and stored embeddings
    (``embedding_dim`` None: no embedding stored yet), and how many forgets it has seen (migration
    0006: a changed ``forget_version`` means entries were deleted, so derived state is rebuilt)."""

    tenant_id: str
    memory_version: int
    rendering_version: int
    embedding_dim: int | None
    suppression_version: int
    forget_version: int = 0


@dataclass(frozen=True)
class TenantVersionRow:
    """The embedding version of one tenant, as listed across tenants (``mnemos_tenant_versions()``)."""

    tenant_id: str
    rendering_version: int
    embedding_dim: int | None


@dataclass(frozen=True)
class CanonicalRow:
    """A canonical entry as dedupe reads it: its embedding bytes and what its signature is made of
    (``encoder_truncated``: the bi-encoder read only the start of its rendering)."""

    entry_id: int
    embedding: bytes
    role: str
    text: str
    image_caption: str | None
    encoder_truncated: bool = False


@dataclass(frozen=True, kw_only=True)
class EntryRow(TurnRecord):
    """A row of ``entries``: a stored turn as published (:class:`api.catalog.TurnRecord`'s fields) plus
    what the store keeps with it: the id it was allocated, its ``embedding`` (the bytes of its
    ``(dim,)`` float32 vector), the entry it is an alias of (``canonical_entry_id`` None: a canonical
    entry), whether the bi-encoder read only the start of its rendering and the stream id of the
    message that carried it. The one stored-entry row: ingest inserts it, the query worker indexes
    it, the fake store keeps it as its table. ``readd_ms``/``readd_seq``: the stream id of the latest
    re-add message (``readd`` or a replacement) that carried this value, None when none did."""

    entry_id: int
    embedding: bytes
    canonical_entry_id: int | None
    encoder_truncated: bool = False
    stream_id: str | None = None
    readd_ms: int | None = None  # the latest re-add message that carried this value (migration 0009)
    readd_seq: int | None = None

    @property
    def image_caption(self) -> str | None:
        """``metadata.image_caption`` (a caption of an image shared with the turn), or None."""
        caption = self.metadata.get("image_caption")
        return None if caption is None else str(caption)

    @property
    def supersedes(self) -> Any:
        """``metadata.supersedes`` as stored (validated at ingest; a turn stored before that may hold
        anything), or None."""
        return self.metadata.get("supersedes")


@dataclass(frozen=True)
class LedgerRow:
    """One applied outcome: its cluster, the suppression version it produced (None: applied before
    migration 0005) and its deltas as ``(entry_id, cluster, delta)``."""

    outcome_id: str
    cluster: int | None
    suppression_version: int | None
    deltas: tuple[tuple[int, int, float], ...]


@dataclass(frozen=True)
class EntryLink:
    """Where a stored turn sits, without its text: ids, session, the entry it is an alias of (None:
    canonical), the stream id of the message that carried it and the stream id of the latest re-add
    message that carried its value as ``readd_ms``/``readd_seq`` (None: none did). What a forget reads."""

    entry_id: int
    turn_id: str
    session_id: str
    canonical_entry_id: int | None
    stream_id: str | None
    readd_ms: int | None = None
    readd_seq: int | None = None

    @property
    def readd_position(self) -> tuple[int, int] | None:
        return None if self.readd_ms is None or self.readd_seq is None else (self.readd_ms, self.readd_seq)


@dataclass(frozen=True)
class Tombstone:
    """What a forget leaves behind (ids only): its ``scope`` (``tenant``, ``session``, ``turn``,
    ``swept`` for a turn id a session or tenant forget erased, which drops only its later retries
    (migration 0009), or ``replace`` for a replacement's position, which drops older messages of the
    turn id but no letter),
    the ``key`` within it ('' for the tenant, else the session or turn id) and the stream id of the
    latest forget of that scope as ``(ms, seq)``; ``readd_ms``/``readd_seq``: the stream id of the
    earliest explicit re-add of the turn id applied since that forget, None before one (migration 0008)."""

    scope: str
    key: str
    stream_ms: int
    stream_seq: int
    readd_ms: int | None = None
    readd_seq: int | None = None

    @property
    def stream_position(self) -> tuple[int, int]:
        return self.stream_ms, self.stream_seq

    @property
    def readd_position(self) -> tuple[int, int] | None:
        return None if self.readd_ms is None or self.readd_seq is None else (self.readd_ms, self.readd_seq)


@dataclass(frozen=True)
class StagingRow:
    """A stored turn whose embedding ``mnemos reindex`` must (re)stage: what its rendering is made of."""

    entry_id: int
    role: str
    text: str
    image_caption: str | None


@dataclass(frozen=True)
class StagedEmbedding:
    """A new embedding for ``entry_id`` (``(dim,)`` float32) and whether the encoder truncated its input."""

    entry_id: int
    embedding: np.ndarray
    truncated: bool


@dataclass(frozen=True)
class SchemaState:
    """What the database says about its migrations: whether ``schema_migrations`` exists, whether the
    connection's role may read it (the grant came with migration 0004) and the versions applied."""

    exists: bool
    readable: bool
    applied: frozenset[str] = frozenset()


Deltas = Mapping[tuple[int, int], float]
"""Suppression deltas keyed by ``(entry_id, cluster)`` (already summed per key)."""
