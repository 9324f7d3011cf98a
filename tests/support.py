"""Service-test fixtures shared by the integration, end-to-end and bad-input suites.

The machine's Redis and Postgres on loopback, isolated per test: each test that needs servers
gets its own database ``<name_prefix>_<random>`` (migrated, dropped afterwards) and a unique
stream prefix and rq queue name (their keys deleted afterwards), so tests never see each other's
data. Models are the fakes (HashingEncoder, FakeReranker) selected through settings.

tests/conftest.py registers this module as a plugin, so every suite has its fixtures; a suite's
``conftest.py`` may override ``name_prefix`` (database and key prefix) and ``settings_overrides``
(fields replaced in the default test settings). Below the fixtures: bounded waits, worker processes
started from a test, and a worker's real consumer loop run in a thread until a condition holds.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from psycopg import sql

from bench.common.queue_cleanup import delete_queue_jobs, queue_job_ids  # noqa: F401 (used by the suites)
from bench.faults.servers import RedisServer, redis_binaries
from workers.ingest.worker import GROUP as INGEST_GROUP
from workers.ingest.worker import IngestWorker
from workers.ops.migrate import ensure_database, run_migrations
from workers.query.config import FEATURE_FIELDS
from workers.runtime.streams import run_consumer
from workers.settings import FAKE_MODEL, Settings, to_environment
from workers.store import PostgresStore
from workers.suppression.worker import GROUP as SUPPRESSION_GROUP
from workers.suppression.worker import SuppressionWorker

REPO = Path(__file__).resolve().parents[1]
PG_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
REDIS_URL = "redis://127.0.0.1:6379/0"
JOB_TTLS = {"result_ttl": 600, "failure_ttl": 600}  # for a test's raw enqueue (rq keeps a failed job a year by default); long enough for a loaded machine


def services_unreachable() -> str | None:
    """Why Redis or Postgres on loopback cannot be used, or None when both answer."""
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
    except redis.RedisError as exc:
        return f"Redis not reachable: {exc}"
    try:
        psycopg.connect(PG_ADMIN_URL, connect_timeout=2).close()
    except psycopg.Error as exc:
        return f"Postgres not reachable: {exc}"
    return None


@pytest.fixture(scope="session")
def services() -> None:
    reason = services_unreachable()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def name_prefix() -> str:
    """Prefix of the per-test database name and stream/queue keys."""
    return "mnemos_test"


@pytest.fixture
def settings_overrides() -> dict[str, Any]:
    """Settings fields a suite sets differently from the defaults below."""
    return {}


@pytest.fixture
def database_url(services: None, name_prefix: str) -> Iterator[str]:
    name = f"{name_prefix}_{uuid.uuid4().hex[:12]}"
    url = f"postgresql://postgres@127.0.0.1:5432/{name}"
    ensure_database(url)
    run_migrations(url)
    yield url
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def redis_client(services: None) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def settings(database_url: str, redis_client: redis.Redis, name_prefix: str,
             settings_overrides: dict[str, Any]) -> Iterator[Settings]:
    prefix = f"{name_prefix}_{uuid.uuid4().hex[:10]}"
    value = Settings(
        redis_url=REDIS_URL,
        database_url=database_url,
        stream_prefix=prefix,
        queue_name=f"{prefix}_retrievals",
        bi_encoder=FAKE_MODEL,
        cross_encoder=FAKE_MODEL,
        fake_encoder_dim=64,
        metrics_enabled=False,
        block_ms=100,
        claim_idle_ms=60_000,
        clusters_k=2,
        bootstrap_factor=2,
        retrieve_timeout_s=10.0,
        # every post-rerank feature off: its default weight is in logits of the shipped cross-encoder,
        # not of the fake one; tests that want a feature set its weight
        **{name: 0.0 for name in FEATURE_FIELDS if name.endswith("_weight")},
    ).replace(**settings_overrides)
    yield value
    delete_test_keys(redis_client, value)


def delete_test_keys(client: redis.Redis, settings: Settings) -> None:
    """Delete a test's Redis keys: its streams and queue (named after its prefix) and its rq jobs."""
    delete_queue_jobs(client, settings.queue_name)
    keys = list(client.scan_iter(match=f"{settings.stream_prefix}*"))
    keys += list(client.scan_iter(match=f"rq:*{settings.stream_prefix}*"))
    if keys:
        client.delete(*keys)
    names = [name for name in client.smembers("rq:queues") if settings.stream_prefix.encode() in name]
    if names:  # rq's set of every queue's name, which rq itself never prunes
        client.srem("rq:queues", *names)


@pytest.fixture
def store(settings: Settings) -> Iterator[PostgresStore]:
    with PostgresStore(settings.database_url, settings.db_app_role) as value:
        yield value


# shards on their own servers ----------------------------------------------------------------------


@dataclass
class ShardCluster:
    """Shards each on its own throwaway ``redis-server`` and Postgres database (MNEMOS_SHARD_MAP)."""

    settings: Settings  # MNEMOS_SHARD_MAP of every shard; shard 0's view
    servers: list[RedisServer]
    database_urls: list[str]


def drop_database(url: str) -> None:
    """Drop the database of ``url`` (its last path part) on the loopback Postgres, if it exists."""
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(url.rsplit("/", 1)[1])))


def shard_map_json(redis_urls: list[str], database_urls: list[str]) -> str:
    """A MNEMOS_SHARD_MAP naming shard n's Redis and database as the n-th of each list."""
    return json.dumps({str(n): {"redis_url": r, "database_url": d}
                       for n, (r, d) in enumerate(zip(redis_urls, database_urls, strict=True))})


@contextmanager
def shard_cluster(settings: Settings, workdir: Path, shards: int) -> Iterator[ShardCluster]:
    """``shards`` redis-servers on spare ports and as many (not yet created) databases named after them,
    stopped and dropped afterwards; skips the test when ``redis-server`` is not installed."""
    if not redis_binaries():
        pytest.skip("redis-server is not installed")
    servers = [RedisServer(workdir / f"shard-{n}") for n in range(shards)]
    databases = [f"postgresql://postgres@127.0.0.1:5432/mnemos_test_shard{n}_{uuid.uuid4().hex[:8]}"
                 for n in range(shards)]
    try:
        for server in servers:
            server.start()
        shard_map = shard_map_json([s.url for s in servers], databases)
        yield ShardCluster(settings.replace(shards=shards, shard_map=shard_map), servers, databases)
    finally:
        for server in servers:
            server.stop()
        for url in databases:
            drop_database(url)


def redis_tenants(connection: redis.Redis) -> set[str]:
    """Every tenant id in any stream of this Redis (turns, outcomes, dead letters)."""
    tenants: set[str] = set()
    for key in connection.scan_iter():
        if connection.type(key) == b"stream":
            tenants |= {f[b"tenant_id"].decode() for _, f in connection.xrange(key) if b"tenant_id" in f}
    return tenants


def postgres_tenants(url: str) -> set[str]:
    """Every tenant id in any table of this database (as the superuser: row-level security does not hide rows)."""
    with psycopg.connect(url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT DISTINCT c.table_name FROM information_schema.columns c JOIN pg_class p ON p.relname = "
            "c.table_name WHERE c.column_name = 'tenant_id' AND c.table_schema = 'public' AND NOT p.relispartition")]
        return {r[0] for t in tables for r in conn.execute(
            sql.SQL("SELECT DISTINCT tenant_id::text FROM {}").format(sql.Identifier(t)))}


def wait_for(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passed; returns whether it held at the end."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def http_status(port: int, path: str, timeout_s: float = 10.0) -> int:
    """The HTTP status of ``GET http://127.0.0.1:<port><path>``; 0 when the connection was closed
    unanswered (a metrics endpoint with no slot left) or refused."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code
    except (urllib.error.URLError, http.client.HTTPException, ConnectionError):
        return 0


def wait_until(predicate: Callable[[], Any], timeout_s: float = 30.0, what: str = "condition",
               interval_s: float = 0.05) -> Any:
    """Poll ``predicate`` until it returns something truthy (returned); AssertionError naming ``what``
    once ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(interval_s)


def process_env(settings: Settings, **extra: str) -> dict[str, str]:
    """The environment of a process a test starts: this one's, ``settings`` as ``MNEMOS_*`` variables,
    the repository on ``PYTHONPATH``, then ``extra``."""
    return {**os.environ, **to_environment(settings), "PYTHONPATH": str(REPO), **extra}


def spawn_logged(args: Sequence[str], settings: Settings, log: Path) -> subprocess.Popen:
    """Start ``args`` in the repository with :func:`process_env`, stdout and stderr appended to
    ``log``, in a session of its own (a signal to the test's group does not reach it)."""
    with log.open("ab") as sink:
        return subprocess.Popen(list(args), env=process_env(settings), cwd=REPO, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """Kill ``process`` unless it has exited already, then reap it."""
    if process.poll() is None:
        process.kill()
    process.wait(timeout_s)


def pending(connection: redis.Redis, stream: str, group: str) -> int:
    try:
        return int(connection.xpending(stream, group)["pending"])
    except redis.ResponseError:  # no stream or group yet
        return 0


def run_loop_until(worker: IngestWorker | SuppressionWorker, until: Callable[[], bool], *,
                   timeout_s: float = 60.0, name: str = "c1") -> bool:
    """Run the worker's real consumer loop in a thread until ``until()`` holds and nothing is pending.

    Returns False when that did not happen within ``timeout_s`` (a wedged or dead loop). The thread
    is always stopped before returning.
    """
    if isinstance(worker, IngestWorker):
        stream, group = worker.settings.turns_stream, INGEST_GROUP
    else:
        stream, group = worker.settings.outcomes_stream, SUPPRESSION_GROUP
    stop = threading.Event()
    errors: list[BaseException] = []

    def body() -> None:
        try:
            run_consumer(worker.consumer(name), worker.handle, stop, poison=worker.poison)
        except BaseException as exc:  # surfaced to the test below
            errors.append(exc)

    thread = threading.Thread(target=body, name="test-consumer", daemon=True)
    thread.start()
    try:
        done = wait_for(lambda: bool(errors) or (until() and pending(worker.connection, stream, group) == 0),
                        timeout_s)
    finally:
        stop.set()
        thread.join(30)  # the loop ends after its current read or batch; a loaded 2-core machine needs headroom
    assert not thread.is_alive(), "consumer loop did not stop"
    if errors:
        raise AssertionError(f"consumer loop died: {errors[0]!r}") from errors[0]
    return done
