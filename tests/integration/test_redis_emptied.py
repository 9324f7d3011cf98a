"""Redis came back without its data (no persistence, failover to an empty replica): the ingest and
suppression workers recreate their consumer groups, say once at WARNING what was lost upstream,
and go on consuming (issue 29, part 3, item 2).

The shared Redis is not flushed: deleting every key of the test's prefix is the same loss for the
workers, whose streams and groups all live under it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import pytest
import redis

from api.schemas import Outcome, PoolRow
from tests.integration.factories import (
    client_for,
    conversation_turns,
    ingest_worker,
    suppression_worker,
    turn,
)
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0  # generous: a loaded machine; every wait ends as soon as its condition holds


class _Running:
    """A worker's consumer loop in a thread; an exception it dies of is kept, not raised in the thread."""

    def __init__(self, run: Callable[[threading.Event], None]) -> None:
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(run,), daemon=True)
        self.thread.start()

    def _run(self, run: Callable[[threading.Event], None]) -> None:
        try:
            run(self.stop)
        except BaseException as exc:  # noqa: BLE001 (reported by the test)
            self.error = exc

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert self.error is None, f"the worker died waiting for {what}: {type(self.error).__name__}: {self.error}"
            assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S}s"
            time.sleep(0.02)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=DEADLINE_S)


def _empty_redis(connection: redis.Redis, settings: Settings) -> None:
    keys = list(connection.scan_iter(match=f"{settings.stream_prefix}*"))
    assert keys
    connection.delete(*keys)


def _stored(store: PostgresStore, tenant: str) -> set[str]:
    with store.tenant_tx(tenant) as conn:
        return {r[0] for r in conn.execute("SELECT turn_id FROM entries")}


def _applied(store: PostgresStore, tenant: str) -> set[str]:
    with store.tenant_tx(tenant) as conn:
        return {r[0] for r in conn.execute("SELECT outcome_id FROM applied_outcomes")}


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "lost the consumer group" in r.getMessage()]


def test_the_ingest_worker_recreates_its_group_after_redis_lost_its_data(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workers")
    client = client_for(settings, redis_client)
    running = _Running(ingest_worker(settings, redis_client, store).run)
    try:
        client.publish_turn(turn("t", "before", "a turn stored before the loss"))
        running.wait_for(lambda: _stored(store, "t") == {"before"}, "first turn")
        _empty_redis(redis_client, settings)
        client.publish_turn(turn("t", "after", "a turn published after Redis came back empty"))
        running.wait_for(lambda: _stored(store, "t") == {"before", "after"}, "turn after the loss")
        client.publish_turn(turn("t", "later", "and the worker goes on"))
        running.wait_for(lambda: "later" in _stored(store, "t"), "a later turn")
    finally:
        running.close()
    assert running.error is None and not running.thread.is_alive()
    (warning,) = _warnings(caplog)  # once, however many reads failed meanwhile
    assert "ingest" in warning and settings.turns_stream in warning
    assert "publish those turns again" in warning  # what was lost upstream, and what to do about it
    assert redis_client.xpending(settings.turns_stream, "ingest")["pending"] == 0


def test_the_suppression_worker_recreates_its_group_after_redis_lost_its_data(
        settings: Settings, redis_client: redis.Redis, store: PostgresStore, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="workers")
    settings = settings.replace(clusters_k=1)
    client_for(settings, redis_client).publish_turns(conversation_turns("alice"))
    ingesting = _Running(ingest_worker(settings, redis_client, store).run)
    try:
        ingesting.wait_for(lambda: len(_stored(store, "alice")) == 8, "the conversation")
    finally:
        ingesting.close()
    with store.tenant_tx("alice") as conn:
        ids = [int(r[0]) for r in conn.execute("SELECT entry_id FROM entries ORDER BY entry_id LIMIT 4")]

    def publish(outcome_id: str) -> None:
        pool = tuple(PoolRow(e, rank, len(ids) + 1 - rank, 2.0 - rank) for rank, e in enumerate(ids, start=1))
        redis_client.xadd(settings.outcomes_stream, Outcome(outcome_id, "alice", 0, len(ids), pool).to_stream_fields())

    running = _Running(suppression_worker(settings, redis_client, store).run)
    try:
        publish("o-before")
        running.wait_for(lambda: _applied(store, "alice") == {"o-before"}, "first outcome")
        _empty_redis(redis_client, settings)
        publish("o-after")
        running.wait_for(lambda: _applied(store, "alice") == {"o-before", "o-after"}, "outcome after the loss")
    finally:
        running.close()
    assert running.error is None and not running.thread.is_alive()
    (warning,) = _warnings(caplog)
    assert "suppression" in warning and settings.outcomes_stream in warning
    assert "suppression updates are gone" in warning
