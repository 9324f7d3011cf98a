"""All three workers as separate processes (fake models), driven through the public client."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest
import redis

from api.heartbeats import live_workers
from tests.integration.factories import client_for, conversation_turns, turn
from tests.support import wait_until
from workers.launch.supervisor import spawn_workers, stop_workers
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.e2e


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def e2e_settings(settings: Settings) -> Settings:
    return settings.replace(
        metrics_enabled=True, ingest_metrics_port=_free_port(), query_metrics_port=_free_port(),
        suppression_metrics_port=_free_port(), clusters_k=1, update_rule="uniform", sample_interval_s=0.5,
        claim_idle_ms=1000, claim_interval_s=0.5, retrieve_timeout_s=30.0)


@pytest.fixture
def running(e2e_settings: Settings, redis_client: redis.Redis) -> Iterator[list[subprocess.Popen]]:
    children = spawn_workers(e2e_settings)
    try:
        for kind in ("ingest", "query", "suppression"):  # a client refuses at once while no query worker beats
            wait_until(lambda kind=kind: bool(live_workers(redis_client, e2e_settings.stream_prefix, kind)),
                       what=f"the {kind} worker's heartbeat")
        yield children
    finally:
        stop_workers(children, timeout_s=10)


def _count(store: PostgresStore, tenant: str, table: str) -> int:
    with store.tenant_tx(tenant) as conn:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # noqa: S608 (fixed names)


def _metrics(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_publish_retrieve_and_suppress_through_processes(e2e_settings: Settings, redis_client: redis.Redis,
                                                         store: PostgresStore, running: list[subprocess.Popen]) -> None:
    client = client_for(e2e_settings, redis_client)
    client.publish_turns(conversation_turns("alice", "a") + conversation_turns("bob", "b"))
    wait_until(lambda: _count(store, "alice", "entries") == 8 and _count(store, "bob", "entries") == 8,
               what="ingestion")
    result = client.retrieve("alice", "grey cat Pixel", k=3)
    assert result.hits[0].turn_id == "a0" and all(h.turn_id.startswith("a") for h in result.hits)
    # a turn acknowledged before a request is visible to it
    client.publish_turn(turn("alice", "late", "We adopted a second cat called Byte", minutes=50))
    wait_until(lambda: _count(store, "alice", "entries") == 9, what="the late turn")
    assert "late" in [h.turn_id for h in client.retrieve("alice", "second cat Byte", k=3).hits]
    for _ in range(4):
        client.retrieve("alice", "grey cat Pixel balcony", k=3)
    wait_until(lambda: _count(store, "alice", "applied_outcomes") == 6, what="outcomes applied")
    assert _count(store, "alice", "suppression") > 0
    assert _count(store, "bob", "suppression") == 0
    assert client.retrieve("nobody", "anything", k=3).hits == ()
    ingest_metrics = _metrics(e2e_settings.ingest_metrics_port)
    assert "mnemos_ingest_turns_read_total 17.0" in ingest_metrics
    assert 'mnemos_worker_up{worker="ingest"} 1.0' in ingest_metrics
    query_metrics = _metrics(e2e_settings.query_metrics_port)
    assert 'mnemos_query_jobs_total{status="ok"} 7.0' in query_metrics
    assert "mnemos_suppression_outcomes_applied_total 6.0" in _metrics(e2e_settings.suppression_metrics_port)
    wait_until(lambda: f'mnemos_stream_lag{{group="ingest",stream="{e2e_settings.turns_stream}"}} 0.0'
               in _metrics(e2e_settings.ingest_metrics_port), timeout_s=5, what="stream lag sample")
    for child in running:  # a clean stop on SIGTERM
        child.send_signal(signal.SIGTERM)
    assert [child.wait(15) for child in running] == [0, 0, 0]


def test_killed_ingest_worker_loses_and_duplicates_nothing(e2e_settings: Settings, redis_client: redis.Redis,
                                                           store: PostgresStore) -> None:
    settings = e2e_settings.replace(ingest_batch_size=8, metrics_enabled=False)
    client = client_for(settings, redis_client)
    # enough turns that the kill lands mid-stream: with the fake encoder and batched inserts the
    # worker stores 300 turns before the 0.2 s poll below first sees a commit
    n = 3000
    client.publish_turns([turn("t", f"k{i:04d}", f"turn number {i} mentions item {i * 7}") for i in range(n)])
    first = spawn_workers(settings, ("ingest",))
    wait_until(lambda: _count(store, "t", "entries") > 0, what="first commits")
    first[0].send_signal(signal.SIGKILL)  # mid-stream, possibly between a commit and its XACK
    first[0].wait(5)
    assert _count(store, "t", "entries") < n
    second = spawn_workers(settings, ("ingest",))
    try:
        wait_until(lambda: _count(store, "t", "entries") == n, timeout_s=180, what="all turns after the kill")
        wait_until(lambda: redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0, timeout_s=20,
                   what="claimed entries acknowledged")
    finally:
        stop_workers(second)
    with store.tenant_tx("t") as conn:
        turn_ids = [r[0] for r in conn.execute("SELECT turn_id FROM entries")]
    assert sorted(turn_ids) == [f"k{i:04d}" for i in range(n)]  # lost 0, duplicated 0


def test_retrieve_times_out_with_a_typed_error_when_the_query_worker_is_killed(
        e2e_settings: Settings, redis_client: redis.Redis, store: PostgresStore) -> None:
    from api.errors import RetrievalTimeout

    settings = e2e_settings.replace(metrics_enabled=False)
    client = client_for(settings, redis_client)
    query = spawn_workers(settings, ("query",))
    try:
        wait_until(lambda: bool(client.query_workers()), what="the query worker's heartbeat")
        assert client.retrieve("x", "warm", k=1, timeout_s=30).hits == ()
    except Exception:
        stop_workers(query)
        raise
    query[0].send_signal(signal.SIGKILL)
    query[0].wait(5)
    started = time.monotonic()
    with pytest.raises(RetrievalTimeout):
        client.retrieve("x", "nobody answers", k=1, timeout_s=1.5)
    assert time.monotonic() - started < 3.0
    retry = spawn_workers(settings, ("query",))
    try:
        assert client.retrieve("x", "answered after a restart", k=1, timeout_s=30).hits == ()
    finally:
        stop_workers(retry)
