"""The agents' doors (integrations/) against real workers: the service-test fixtures (own database,
own stream prefix, fake models; tests/support.py, registered in tests/conftest.py) and ``service``,
the ingest and query workers as processes (tests/integrations/harness.py)."""

from tests.integrations.harness import service  # noqa: F401
