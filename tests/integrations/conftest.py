"""The agents' doors (integrations/) against real workers: the service-test fixtures (own database,
own stream prefix, fake models; tests/support.py) and ``service``, the ingest and query workers as
processes (tests/integrations/harness.py)."""

from tests.integrations.harness import service  # noqa: F401
from tests.support import (  # noqa: F401
    database_url,
    name_prefix,
    redis_client,
    services,
    settings,
    settings_overrides,
    store,
)
