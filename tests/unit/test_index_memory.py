"""TenantIndex.memory_bytes: the estimate a query worker budgets its tenant cache with.

Checked against what the index really allocates: tracemalloc sees every Python object and numpy
array (bm25s's sparse matrices included), and faiss's flat index, allocated in C++ where
tracemalloc cannot see, is added exactly (float32 vectors and int64 ids).
"""

from __future__ import annotations

import gc
import random
import tracemalloc
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from mnemos.filters import EntryFilter
from mnemos.records import Entry
from mnemos.tenant_index import TenantIndex

DIM = 64


def _entries(n: int, seed: int = 0) -> tuple[list[Entry], np.ndarray]:
    rng = random.Random(seed)
    words = [f"w{rng.randrange(3000)}" for _ in range(6000)] + ["the", "cat", "went", "to", "Porto", "with", "my", "brother"]
    entries = [Entry(i + 1, "t", f"turn-{i}", f"s{i // 20}", "user" if i % 2 else "assistant",
                     " ".join(rng.choice(words) for _ in range(rng.randint(5, 40))),
                     datetime(2024, 1, 1, tzinfo=UTC) + timedelta(minutes=i)) for i in range(n)]
    vectors = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return entries, vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def _built(entries: list[Entry], vectors: np.ndarray) -> TenantIndex:
    index = TenantIndex("t", DIM)
    for start in range(0, len(entries), 256):
        index.add(entries[start:start + 256], vectors[start:start + 256])
    index.bm25.search("cat Porto", 10)  # builds the bm25s matrices
    index.sessions.rank("cat", vectors[0])  # and the session centroids and transcripts
    index.allowed_entries(EntryFilter())  # and the turn table's columns
    return index


@pytest.mark.parametrize("n", [300, 1500])
def test_the_estimate_is_within_a_third_of_what_the_index_allocates(n: int) -> None:
    entries, vectors = _entries(n)
    gc.collect()
    tracemalloc.start()
    try:
        index = _built(entries, vectors)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    allocated = traced + len(index.dense) * (4 * DIM + 8)
    assert 0.67 < index.memory_bytes() / allocated < 1.5, (index.memory_bytes(), allocated)


def test_the_estimate_grows_with_entries_and_alias_texts() -> None:
    entries, vectors = _entries(40)
    index = TenantIndex("t", DIM)
    assert index.memory_bytes() == 0
    index.add(entries[:20], vectors[:20])
    first = index.memory_bytes()
    index.add(entries[20:], vectors[20:])
    second = index.memory_bytes()
    index.add_aliases(1, ["alias"], texts=["a long alias text with many more words than before"])
    assert 0 < first < second < index.memory_bytes()
