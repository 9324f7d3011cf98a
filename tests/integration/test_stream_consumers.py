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


def _delivered(connection: redis.Redis, stream: str) -> dict[str, int]:
    return {(e["message_id"].decode() if isinstance(e["message_id"], bytes) else e["message_id"]): e["times_delivered"]
            for e in connection.xpending_range(stream, "ingest", "-", "+", 100)}


def test_a_replay_reads_each_entry_left_pending_once_then_new_entries(settings: Settings,
                                                                      redis_client: redis.Redis) -> None:
    """Break-it round 13: a restarted consumer whose handler leaves its own pending entries pending (a
    tenant refused for its embedding version, or moving away) re-read them from ``0`` for ever: it never
    read a new entry, and each re-read reset their idle time, so no other consumer could claim them."""
    stream = settings.turns_stream
    before = _consumer(redis_client, stream, "ingest-pod-1")
    before.ensure_group()
    left = [redis_client.xadd(stream, {"n": str(n)}).decode() for n in range(2)]
    assert [m.stream_id for m in before.read()] == left[:1]  # batch_size 1: the claim scan, then one new entry
    assert [m.stream_id for m in before.read()] == left[1:]
    fresh = redis_client.xadd(stream, {"n": "new"}).decode()
    restarted = _consumer(redis_client, stream, "ingest-pod-1")  # the same name: pid 1 in a container
    assert [m.stream_id for m in restarted.read()] == left[:1]  # the replay pass, one batch at a time
    assert [m.stream_id for m in restarted.read()] == left[1:]
    assert [m.stream_id for m in restarted.read()] == [fresh]  # the pass is over: the new entry
    assert restarted.read() == []
    assert _delivered(redis_client, stream) == {left[0]: 2, left[1]: 2, fresh: 1}  # once by the pass
    restarted.replay_pending()  # after a failed batch: one more pass over everything still pending
    assert [m.stream_id for m in restarted.read()] == left[:1]
    restarted.ack(left[:1])
    assert [m.stream_id for m in restarted.read()] == left[1:]
    assert [m.stream_id for m in restarted.read()] == [fresh]
    assert restarted.read() == []


def test_claims_and_new_entries_alternate_so_an_entry_left_pending_starves_nothing(
        settings: Settings, redis_client: redis.Redis) -> None:
    """Break-it round 14: with claim_idle_ms 0 and no claim interval, the consumer claimed back an entry
    its handler leaves pending on every read, and never read a new one."""
    stream = settings.turns_stream
    eager = StreamConsumer(redis_client, stream, "ingest", "ingest-pod-1", batch_size=1, block_ms=10,
                           claim_idle_ms=0, claim_interval_s=0)
    eager.ensure_group()
    left = redis_client.xadd(stream, {"n": "left"}).decode()
    assert [m.stream_id for m in eager.read()] == [left]  # its own replay pass (nothing), a claim (nothing), new
    fresh = [redis_client.xadd(stream, {"n": str(n)}).decode() for n in range(2)]
    read = [[m.stream_id for m in eager.read()] for _ in range(4)]
    assert read == [[left], fresh[:1], [left], fresh[1:]]  # claimed back, then a new entry, in turn
    assert _delivered(redis_client, stream)[left] == 3
