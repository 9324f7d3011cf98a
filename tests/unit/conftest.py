"""Factories shared by the core unit tests (fakes only; no models, no servers)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mnemos.encoder import HashingEncoder
from mnemos.records import Entry
from mnemos.tenant_index import TenantIndex

T0 = datetime(2024, 1, 1, tzinfo=UTC)


def make_entries(
    texts: Sequence[str], tenant_id: str = "t1", start_id: int = 1, session_of=None
) -> list[Entry]:
    """Entries with ids start_id.., turn ids 'u<id>', one session per 3 turns unless session_of given."""
    out = []
    for offset, text in enumerate(texts):
        entry_id = start_id + offset
        session = session_of(offset) if session_of else f"S{offset // 3 + 1}"
        out.append(
            Entry(
                entry_id=entry_id,
                tenant_id=tenant_id,
                turn_id=f"u{entry_id}",
                session_id=session,
                role="user" if offset % 2 == 0 else "assistant",
                text=text,
                occurred_at=T0 + timedelta(minutes=offset),
            )
        )
    return out


def build_index(texts: Sequence[str], encoder: HashingEncoder, tenant_id: str = "t1", start_id: int = 1) -> TenantIndex:
    index = TenantIndex(tenant_id, encoder.dim)
    entries = make_entries(texts, tenant_id=tenant_id, start_id=start_id)
    index.add(entries, encoder.encode(texts))
    return index


@pytest.fixture
def encoder() -> HashingEncoder:
    return HashingEncoder(dim=64)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(1234)


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)
