"""Records are frozen and expose every turn id an entry or hit stands for."""

import dataclasses

import pytest

from mnemos.records import Hit, Outcome, PoolEntry, StageTimings

from .conftest import T0, make_entries


def test_records_are_frozen():
    entry = make_entries(["x"])[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        entry.text = "y"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        PoolEntry(1, 1, 1, 0.0).final_rank = 2  # type: ignore[misc]


def test_turn_ids_include_aliases():
    entry = dataclasses.replace(make_entries(["x"])[0], aliases=("a", "b"))
    assert entry.turn_ids == ("u1", "a", "b")
    hit = Hit(1, "u1", "S1", "user", "x", T0, 0.5, 1, aliases=("a",))
    assert hit.turn_ids == ("u1", "a")


def test_defaults():
    assert StageTimings().total == 0.0
    assert Outcome("o", "t", None, 0, ()).query_embedding is None
    assert T0.tzinfo is not None and make_entries(["x"])[0].occurred_at.utcoffset().total_seconds() == 0
