"""End-to-end tests reuse the integration factories (own database, own stream prefix)."""

from tests.integration.conftest import database_url, redis_client, services, settings, store  # noqa: F401
