"""Factories for service tests against the real Redis and Postgres on loopback (see tests/support.py).

Each test gets its own database ``mnemos_test_<random>`` (migrated, dropped afterwards) and a
unique stream prefix and rq queue name (their keys deleted afterwards), so tests never see each
other's data. Models are the fakes (HashingEncoder, FakeReranker) selected through settings.
"""

from tests.support import (  # noqa: F401
    database_url,
    name_prefix,
    redis_client,
    services,
    settings,
    settings_overrides,
    store,
)
