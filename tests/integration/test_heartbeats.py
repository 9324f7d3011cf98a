"""Worker heartbeats: a Redis record with a TTL renewed from each work loop, and a Prometheus gauge."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import redis

from api.errors import NoQueryWorker
from api.heartbeats import heartbeat_key, live_workers, worker_beats
from tests.integration.factories import answered_by_worker, client_for, ingest_worker, query_service, turn
from tests.support import REPO, process_env, wait_until
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.metrics import ServiceMetrics
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_the_record_lives_for_its_ttl_longer_while_busy_and_goes_on_a_clean_stop(
        settings: Settings, redis_client: redis.Redis) -> None:
    settings = settings.replace(heartbeat_ttl_s=30.0)
    clock, mono, metrics = _Clock(), _Clock(), ServiceMetrics()
    beat = Heartbeat(redis_client, settings, "ingest", "w1", metrics=metrics, busy_s=60.0, info={"dim": 64},
                     clock=clock, monotonic=mono)
    key = heartbeat_key(settings.stream_prefix, "ingest", "w1")
    beat.idle()
    assert 29_000 < redis_client.pttl(key) <= 30_000
    assert json.loads(redis_client.get(key)) | {"host": None, "pid": None} == {
        "kind": "ingest", "name": "w1", "at": 1_000.0, "ttl_s": 30.0, "busy": False, "dim": 64, "host": None,
        "pid": None}
    assert metrics.worker_heartbeat.labels(worker="ingest")._value.get() == 1_000.0
    clock.now += 5  # within the renewal interval (ttl/3): the gauge moves, Redis is not written
    beat.idle()
    assert json.loads(redis_client.get(key))["at"] == 1_000.0
    assert metrics.worker_heartbeat.labels(worker="ingest")._value.get() == 1_005.0
    beat.busy()  # a batch may take up to busy_s
    assert 89_000 < redis_client.pttl(key) <= 90_000 and json.loads(redis_client.get(key))["busy"] is True
    beat.idle()  # back to the short TTL at once
    assert redis_client.pttl(key) <= 30_000
    [seen] = worker_beats(redis_client, settings.stream_prefix, "ingest")
    assert (seen.name, seen.live, seen.last_seen, seen.info["dim"]) == ("w1", True, 1_005.0, 64)
    beat.stop()
    [seen] = worker_beats(redis_client, settings.stream_prefix, "ingest")
    assert (seen.live, seen.last_seen) == (False, 1_005.0)  # still listed as seen, not live
    assert live_workers(redis_client, settings.stream_prefix, "ingest") == []


def test_the_stream_loop_beats_while_idle_and_busy(settings: Settings, redis_client: redis.Redis,
                                                   store: PostgresStore) -> None:
    worker = ingest_worker(settings, redis_client, store)
    beat = Heartbeat(redis_client, settings.replace(heartbeat_ttl_s=3.0), "ingest", "loop", metrics=worker.metrics,
                     busy_s=60.0)
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop, "loop", beat))
    thread.start()
    try:
        wait_until(lambda: bool(live_workers(redis_client, settings.stream_prefix, "ingest")), 60.0,
                   "the first heartbeat")
        client_for(settings, redis_client).publish_turn(turn("alice", "a1", "a turn"))
        wait_until(lambda: worker.metrics.ingest_turns_read._value.get() == 1, 60.0, "the batch")
        first = worker.metrics.worker_heartbeat.labels(worker="ingest")._value.get()
        wait_until(lambda: worker.metrics.worker_heartbeat.labels(worker="ingest")._value.get() > first, 60.0,
                   "a later heartbeat")
    finally:
        stop.set()
        thread.join(30)
    assert not thread.is_alive()


def test_the_query_worker_beats_from_rq_and_sets_the_gauge(settings: Settings, redis_client: redis.Redis,
                                                           store: PostgresStore) -> None:
    service = query_service(settings, redis_client, store)
    client = client_for(settings, redis_client)
    result = answered_by_worker(settings, redis_client, service, client.retrieve, "nobody", "anything")
    assert result.hits == ()
    assert service.metrics.worker_heartbeat.labels(worker="query")._value.get() > 0
    [seen] = worker_beats(redis_client, settings.stream_prefix, "query")
    assert not seen.live and seen.info == {}  # the burst worker ended cleanly: its record is gone


@pytest.fixture
def spawn(settings: Settings) -> Iterator[Callable[..., subprocess.Popen]]:
    children: list[subprocess.Popen] = []

    def start(kind: str, worker_settings: Settings) -> subprocess.Popen:
        child = subprocess.Popen([sys.executable, "-m", "workers", "worker", kind], env=process_env(worker_settings),
                                 cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGCONT)
            child.terminate()
            try:
                child.wait(20)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _health(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workers", "health", "--no-models", *args], env=process_env(settings),
                          cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_a_stream_workers_heartbeat_goes_stale_when_its_loop_stops(settings: Settings, redis_client: redis.Redis,
                                                                   spawn: Callable[..., subprocess.Popen]) -> None:
    short = settings.replace(heartbeat_ttl_s=1.5)
    child = spawn("suppression", short)
    live = lambda: bool(live_workers(redis_client, short.stream_prefix, "suppression"))  # noqa: E731
    wait_until(live, 60.0, "the suppression worker's heartbeat")
    child.send_signal(signal.SIGSTOP)  # the loop stops; the process is still there
    wait_until(lambda: not live(), 60.0, "the heartbeat to go stale")
    stale = _health(short, "--require-worker", "suppression")
    assert stale.returncode == 1 and "FAIL suppression workers: 0 live" in stale.stdout
    assert stale.stderr.strip().splitlines()[-1].startswith("Error: suppression workers: 0 live")
    assert _health(short).returncode == 0  # by default workers are reported, not required
    child.send_signal(signal.SIGCONT)
    wait_until(live, 60.0, "the heartbeat to come back")
    assert _health(short, "--require-worker", "suppression").returncode == 0
    child.terminate()
    assert child.wait(20) == 0
    assert not live()  # a clean stop removes the record at once


def test_an_idle_query_worker_stays_live_and_retrieve_refuses_once_it_stops(
        settings: Settings, redis_client: redis.Redis, spawn: Callable[..., subprocess.Popen]) -> None:
    short = settings.replace(heartbeat_ttl_s=3.0)
    child = spawn("query", short)
    client = client_for(short, redis_client)
    wait_until(lambda: bool(client.query_workers()), 60.0, "the query worker's heartbeat")
    first = client.query_workers()[0].last_seen
    idle_until = time.monotonic() + 3 * short.heartbeat_ttl_s
    while time.monotonic() < idle_until:  # no job at all: rq's dequeue wait renews it
        assert client.query_workers(), "an idle query worker lost its heartbeat"
        time.sleep(0.5)
    assert client.query_workers()[0].last_seen > first
    child.send_signal(signal.SIGSTOP)
    wait_until(lambda: not client.query_workers(), 60.0, "the heartbeat to go stale")
    with pytest.raises(NoQueryWorker):
        client.retrieve("alice", "anyone there?", timeout_s=30.0)
    child.send_signal(signal.SIGCONT)
    wait_until(lambda: bool(client.query_workers()), 60.0, "the heartbeat to come back")
    assert client.retrieve("alice", "anyone there?", timeout_s=30.0).hits == ()
