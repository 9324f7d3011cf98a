"""Benchmark runs started by an e2e test: their settings recorded (stamps made unique) and, after
the test, whatever they left in Redis and Postgres removed (a safety net: the tests assert the
benchmarks cleaned up themselves)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

import psycopg
import pytest
import redis

from bench.common.queue_cleanup import delete_queue_jobs
from tests.support import PG_ADMIN_URL
from workers.settings import Settings


def database_name(run: Settings) -> str:
    """The database a run's settings point at."""
    return psycopg.conninfo.conninfo_to_dict(run.database_url)["dbname"]


def record_runs(monkeypatch: pytest.MonkeyPatch, factories: Iterable[tuple[Any, str]]) -> list[Settings]:
    """Patch each ``(module, name)`` settings factory (``f(base, *, reranker, stamp)``) so that its
    stamp gets this test's token and every value it returns lands in the returned list."""
    token = uuid.uuid4().hex[:8]
    runs: list[Settings] = []
    for module, name in factories:
        original = getattr(module, name)

        def recording(base: Settings, *, reranker: Any, stamp: str, _original: Any = original) -> Settings:
            value = _original(base, reranker=reranker, stamp=f"{stamp}_{token}")
            runs.append(value)
            return value

        monkeypatch.setattr(module, name, recording)
    return runs


def drop_runs(redis_client: redis.Redis, runs: Iterable[Settings]) -> None:
    """Delete each run's rq jobs, its stream-prefixed and rq keys, and its database."""
    for run in runs:
        delete_queue_jobs(redis_client, run.queue_name)
        keys = [*redis_client.scan_iter(match=f"{run.stream_prefix}*"),
                *redis_client.scan_iter(match=f"rq:*{run.stream_prefix}*")]
        if keys:
            redis_client.delete(*keys)
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(database_name(run))))
