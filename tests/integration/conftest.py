"""Factories for service tests against the real Redis and Postgres on loopback (tests/support.py's
fixtures, registered in tests/conftest.py).

Each test gets its own database ``mnemos_test_<random>`` (migrated, dropped afterwards) and a
unique stream prefix and rq queue name (their keys deleted afterwards), so tests never see each
other's data. Models are the fakes (HashingEncoder, FakeReranker) selected through settings.
``any_store`` runs a store-contract test twice: on the Postgres store and on the in-memory fake.
"""

from collections.abc import Iterator

import pytest

from workers.store import FakeStore, Store


@pytest.fixture(params=["postgres", "fake"])
def any_store(request: pytest.FixtureRequest) -> Iterator[Store]:
    if request.param == "fake":
        yield FakeStore()
    else:
        yield request.getfixturevalue("store")
