"""Fixtures of the bad-input catalogue: the machine's Redis and Postgres on loopback, isolated per test.

The shared fixtures of tests/support.py (registered in tests/conftest.py) with this suite's name
prefix and settings: each test that needs servers gets its own database ``mnemos_bad_<random>``
(migrated, dropped afterwards) and a unique stream prefix / rq queue (keys deleted afterwards). Models are the fakes (HashingEncoder, FakeReranker) chosen through settings.
Tests that only exercise client-side validation need no server at all.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def name_prefix() -> str:
    return "mnemos_bad"


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    # differs from the shared defaults: shorter blocking reads, no periodic stream trim during a test
    return {"block_ms": 50, "trim_interval_s": 3600.0}
