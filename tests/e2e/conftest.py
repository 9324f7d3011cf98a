"""End-to-end tests reuse the service-test fixtures (own database, own stream prefix)."""

from tests.support import (  # noqa: F401
    database_url,
    name_prefix,
    redis_client,
    services,
    settings,
    settings_overrides,
    store,
)
