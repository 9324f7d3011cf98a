"""Dead workers' consumer names are removed from a group, and nothing pending is ever lost to it."""

from __future__ import annotations

import pytest
import redis

from tests.support import wait_until
from workers.runtime.consumers import prune_idle_consumers
from workers.runtime.streams import StreamConsumer
from workers.settings import Settings

pytestmark = pytest.mark.integration


def _consumers(connection: redis.Redis, stream: str) -> dict[str, tuple[int, int]]:
    return {c["name"].decode() if isinstance(c["name"], bytes) else c["name"]: (c["pending"], c["idle"])
            for c in connection.xinfo_consumers(stream, "ingest")}


def _consumer(connection: redis.Redis, stream: str, name: str, **options: int) -> StreamConsumer:
    return StreamConsumer(connection, stream, "ingest", name, batch_size=1, block_ms=10, claim_idle_ms=600_000,
                          claim_interval_s=0, **options)


def test_only_idle_consumers_with_nothing_pending_are_removed(settings: Settings,
                                                              redis_client: redis.Redis) -> None:
    stream = settings.turns_stream
    finished, holding = _consumer(redis_client, stream, "dead-finished"), _consumer(redis_client, stream, "dead-holding")
    finished.ensure_group()
    redis_client.xadd(stream, {"n": "1"})
    redis_client.xadd(stream, {"n": "2"})
    done = finished.read()  # its own (empty) pending list, a claim scan, then one new entry
    assert len(done) == 1
    finished.ack([m.stream_id for m in done])
    assert len(holding.read()) == 1  # read, never acknowledged: a worker killed mid-batch
    wait_until(lambda: min(idle for _, idle in _consumers(redis_client, stream).values()) > 50,
               what="both consumers idle for 50 ms")
    assert prune_idle_consumers(redis_client, stream, "ingest", keep="me", idle_ms=600_000) == []  # not idle enough
    assert prune_idle_consumers(redis_client, stream, "ingest", keep="dead-finished", idle_ms=50) == []  # its own name
    assert prune_idle_consumers(redis_client, stream, "ingest", keep="me", idle_ms=50) == ["dead-finished"]
    assert set(_consumers(redis_client, stream)) == {"dead-holding"}
    assert redis_client.xpending(stream, "ingest")["pending"] == 1  # its entry is still claimable


def test_a_consumer_prunes_after_each_full_claim_scan(settings: Settings, redis_client: redis.Redis) -> None:
    stream = settings.turns_stream
    old = _consumer(redis_client, stream, "ingest-old-host-1")
    old.ensure_group()
    old.read()
    wait_until(lambda: _consumers(redis_client, stream)["ingest-old-host-1"][1] > 50, what="the old consumer idle")
    live = _consumer(redis_client, stream, "ingest-new-host-2", prune_idle_ms=50)
    assert live.read() == []  # own pending list, then a claim scan over nothing, then a read
    assert live.read() == []
    assert set(_consumers(redis_client, stream)) == {"ingest-new-host-2"}
