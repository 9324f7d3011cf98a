"""A SIGTERM'd query worker process exits promptly: at once when idle, right after its job when busy.

Kubernetes sends SIGTERM and kills at the end of the grace period; a worker that lingers past it is
killed with its job (and rq's registries are left to clean up). With rq 3 and redis-py 8.2 a
worker waited up to 60 s on its command-channel thread before exiting (``QueryWorker.subscribe``).
The deadlines are generous for a loaded machine and still far below that minute.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis

from tests.integration.factories import client_for, drain, ingest_worker, query_service, turn
from tests.support import spawn_logged, stop_process, wait_for
from workers.query.worker import PUBSUB_POLL_S, build_worker
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

EXIT_WITHIN_S = 40.0  # after SIGTERM (idle) or after the job's end (busy): below rq 3's 60 s linger, with room for a busy machine


def _spawn_slow_worker(settings: Settings, marker: Path, sleep_s: float, log: Path) -> subprocess.Popen:
    return spawn_logged([sys.executable, "-m", "tests.badinput.slow_query_worker", "--marker", str(marker),
                         "--sleep-s", str(sleep_s)], settings, log)


def _exit_code_within(process: subprocess.Popen, timeout_s: float) -> int | None:
    try:
        return process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return None


def test_an_idle_query_worker_exits_within_seconds_of_sigterm(settings: Settings, redis_client: redis.Redis,
                                                             tmp_path: Path) -> None:
    client = client_for(settings, redis_client)
    log = tmp_path / "worker.log"
    worker = _spawn_slow_worker(settings, tmp_path / "rerank-started", 0.0, log)
    try:
        assert wait_for(lambda: bool(client.query_workers()), 60.0), log.read_text()[-3000:]
        began = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = _exit_code_within(worker, EXIT_WITHIN_S)
        took = time.monotonic() - began
    finally:
        stop_process(worker)
    assert code == 0, f"no clean exit {took:.1f} s after SIGTERM:\n{log.read_text()[-3000:]}"


def test_a_busy_query_worker_finishes_its_job_then_exits(settings: Settings, redis_client: redis.Redis,
                                                         store: PostgresStore, tmp_path: Path) -> None:
    client = client_for(settings, redis_client)
    client.publish_turns([turn("alice", f"a{i}", text) for i, text in enumerate(
        ["my cello teacher is Ines", "the cabin wifi password is on the fridge", "I adopted a cat named Pixel"])])
    drain(ingest_worker(settings, redis_client, store))
    marker, log = tmp_path / "rerank-started", tmp_path / "worker.log"
    worker = _spawn_slow_worker(settings, marker, 3.0, log)
    answer: dict[str, object] = {}

    def ask() -> None:
        try:
            answer["result"] = client.retrieve("alice", "cello teacher", k=2, timeout_s=60.0)
        except Exception as exc:  # reported by the assertion below
            answer["error"] = exc
        answer["at"] = time.monotonic()

    asker = threading.Thread(target=ask, daemon=True)
    try:
        assert wait_for(lambda: bool(client.query_workers()), 60.0), log.read_text()[-3000:]
        asker.start()
        assert wait_for(marker.exists, 30.0), log.read_text()[-3000:]  # the job is in its rerank
        worker.send_signal(signal.SIGTERM)
        asker.join(60.0)
        code = _exit_code_within(worker, 60.0)
        exited_at = time.monotonic()
    finally:
        stop_process(worker)
    assert not asker.is_alive(), "the client never returned"
    result = answer.get("result")
    assert result is not None, answer  # the job in flight at SIGTERM was finished, not dropped
    assert [h.turn_id for h in result.hits][:1] == ["a0"]  # type: ignore[attr-defined]
    assert code == 0, log.read_text()[-3000:]
    after_job = exited_at - float(answer["at"])  # type: ignore[arg-type]
    assert after_job < EXIT_WITHIN_S, f"exited {after_job:.1f} s after its job ended:\n{log.read_text()[-3000:]}"


def test_the_command_channel_listener_stops_within_its_poll(settings: Settings, redis_client: redis.Redis,
                                                             store: PostgresStore) -> None:
    """The mechanism behind the minute-long exits, without its race: a listener blocked in its read
    is told to stop (redis-py 8.2's ``stop`` joins it). rq 3's 60 s read held this for a minute;
    whether a real exit hit it depended on which of UNSUBSCRIBE's reply and the stop flag came first."""
    worker = build_worker(settings, redis_client, query_service(settings, redis_client, store))
    worker.subscribe()
    thread = worker.pubsub_thread
    try:
        assert wait_for(lambda: worker.pubsub.subscribed, 10.0)  # the thread consumed the confirmation
        time.sleep(0.2)  # and sits in its blocking read (there is no condition to see that from outside)
        began = time.monotonic()
        thread.stop(timeout=EXIT_WITHIN_S)
        took = time.monotonic() - began
        assert not thread.is_alive(), f"the listener was still reading {took:.1f} s after stop"
        assert took <= 2 * PUBSUB_POLL_S + 1.0
    finally:
        worker.pubsub.close()
