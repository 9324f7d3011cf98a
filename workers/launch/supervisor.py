"""``mnemos up``: migrations plus the three workers as child processes, for a laptop.

Starts embedded Redis/Postgres when none is configured or answering (see :mod:`workers.runtime.embedded`),
creates and migrates the database, then runs ``python -m workers worker <kind>`` for ingest,
query and suppression with the resolved settings in their environment. Ctrl-C (or SIGTERM)
stops the children; if one of them dies, the others are stopped too and the exit code is 1.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from types import FrameType

from workers.ops.migrate import ensure_database, run_migrations
from workers.runtime.embedded import EmbeddedServices
from workers.runtime.redaction import redact_url
from workers.settings import Settings, child_environment

log = logging.getLogger(__name__)

WORKER_KINDS = ("ingest", "query", "suppression")


def spawn_workers(settings: Settings, kinds: tuple[str, ...] = WORKER_KINDS, *,
                  log_level: str | None = None) -> list[subprocess.Popen]:
    """Start one child process per kind with ``settings`` in its environment.

    The children log at ``log_level`` (default: this process's level); rq's own per-job lines stay
    at WARNING (``mnemos worker --rq-log-level``).
    """
    env = child_environment(settings)
    level = log_level or logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return [subprocess.Popen([sys.executable, "-m", "workers", "--log-level", level, "worker", kind], env=env)
            for kind in kinds]


def stop_workers(children: list[subprocess.Popen], timeout_s: float = 15.0) -> None:
    """SIGTERM each child, wait, then SIGKILL the ones still running."""
    for child in children:
        if child.poll() is None:
            child.terminate()
    deadline = time.monotonic() + timeout_s
    for child in children:
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def prepare(settings: Settings, embedded: EmbeddedServices | None) -> Settings:
    """Resolve URLs (embedded servers if needed), check that Redis answers, create and migrate the
    database. Raises redis.RedisError when Redis does not answer: workers started without it would
    retry for ever, and ``mnemos up`` would never say why (break-it round 15)."""
    from workers.runtime.connections import redis_client

    if embedded is not None:
        settings = embedded.start()
    redis_client(settings).ping()
    ensure_database(settings.database_url)
    applied = run_migrations(settings.database_url)
    log.info("migrations applied: %s", ", ".join(applied) or "none pending")
    return settings


def run_up(settings: Settings, *, allow_embedded: bool = True) -> int:
    embedded = EmbeddedServices(settings) if allow_embedded else None
    settings = prepare(settings, embedded)
    children = spawn_workers(settings)
    stopping = False

    def handler(signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    log.info("mnemos is up: redis %s, postgres %s%s; Ctrl-C stops it", redact_url(settings.redis_url),
             redact_url(settings.database_url),
             "" if settings.shards == 1 else f" (shard {settings.shard} of {settings.shards} only: run one per "
             f"shard with MNEMOS_SHARD, docs/scaling.md)")
    code = 0
    while not stopping:
        if any(child.poll() is not None for child in children):
            log.error("a worker exited (codes %s); stopping the others", [c.poll() for c in children])
            code = 1
            break
        time.sleep(0.5)
    stop_workers(children)
    return code
