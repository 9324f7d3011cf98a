"""``mnemos health``: can this process reach Redis and a migrated Postgres, and load its models?"""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import redis

from workers.errors import ModelSetupError
from workers.migrate import discover
from workers.models import load_encoder, load_reranker
from workers.settings import Settings


def run_health(settings: Settings, *, check_models: bool = True, echo: Callable[[str], None] = print) -> int:
    """Print one line per check; 0 when every check passed, 1 otherwise."""
    ok = True

    def report(name: str, passed: bool, detail: str) -> None:
        nonlocal ok
        ok = ok and passed
        echo(f"{'ok  ' if passed else 'FAIL'} {name}: {detail}")

    try:
        redis.Redis.from_url(settings.redis_url, socket_connect_timeout=3).ping()
        report("redis", True, settings.redis_url)
    except redis.RedisError as exc:
        report("redis", False, str(exc))
    try:
        with psycopg.connect(settings.database_url, connect_timeout=3) as conn:
            applied = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
        missing = [m.version for m in discover() if m.version not in applied]
        report("postgres", not missing, "migrated" if not missing else f"pending migrations {missing}")
    except psycopg.Error as exc:
        report("postgres", False, f"{type(exc).__name__}: {exc}".strip())
    if check_models:
        try:
            encoder = load_encoder(settings)
            report("bi-encoder", True, f"{settings.bi_encoder} (dim {encoder.dim})")
            reranker = load_reranker(settings)
            report("cross-encoder", True, settings.cross_encoder or "none configured (no rerank)")
            del reranker
        except ModelSetupError as exc:
            report("models", False, str(exc))
    return 0 if ok else 1
