"""Shard routing (api/sharding.py): a consistent-hash ring on the tenant id, and the per-shard names.

Routing is deterministic and pinned, balanced within a tolerance over 10,000 tenant ids, and growing
from N to N + 1 shards moves about 1 / (N + 1) of the tenants, every one of them to the new shard.
With one shard every name is exactly the unsharded one. The client publishes and enqueues on the
tenant's shard; a worker's settings name its own shard's streams and queue.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from api import sharding
from api.client import MnemosClient
from tests.unit.worker_fakes import RecordingRedis
from workers.runtime.errors import SettingsError
from workers.settings import Settings

TENANTS = [f"tenant-{i}" for i in range(10_000)]


def test_routing_is_pinned_and_the_same_in_another_process() -> None:
    # a change of the hash, the point names or VIRTUAL_NODES would move tenants of running deployments
    pinned = {"alice": [0, 0, 0], "bob": [1, 1, 1], "carol": [0, 0, 0], "dave": [0, 2, 2]}
    assert {t: [sharding.shard_of(t, n) for n in (2, 3, 4)] for t in pinned} == pinned
    code = "from api.sharding import shard_of; print([shard_of(f'tenant-{i}', 5) for i in range(200)])"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONHASHSEED": "123"}, cwd=Path(__file__).resolve().parents[2])
    assert other.stdout.strip() == str([sharding.shard_of(t, 5) for t in TENANTS[:200]])


def test_one_shard_routes_everything_to_shard_zero() -> None:
    assert {sharding.shard_of(t, 1) for t in TENANTS[:500]} == {0}


@pytest.mark.parametrize("shards", [2, 3, 4, 8])
def test_tenants_are_balanced_within_twelve_percent(shards: int) -> None:
    counts = Counter(sharding.shard_of(t, shards) for t in TENANTS)
    mean = len(TENANTS) / shards
    assert set(counts) == set(range(shards))
    assert max(abs(n - mean) / mean for n in counts.values()) < 0.12, counts


@pytest.mark.parametrize("shards", [1, 2, 3, 4, 7])
def test_adding_a_shard_moves_about_its_share_and_only_to_it(shards: int) -> None:
    moved = [t for t in TENANTS if sharding.shard_of(t, shards) != sharding.shard_of(t, shards + 1)]
    assert {sharding.shard_of(t, shards + 1) for t in moved} == {shards}  # only to the new shard
    share = len(moved) / len(TENANTS)
    assert abs(share - 1 / (shards + 1)) < 0.15 / (shards + 1), share


def test_the_ring_refuses_no_shards() -> None:
    with pytest.raises(ValueError, match="shards must be >= 1"):
        sharding.ShardRing(0)
    with pytest.raises(ValueError, match="shard must be within 0..1"):
        sharding.shard_suffix(2, 2)


def test_one_shard_keeps_the_unsharded_names() -> None:
    s = Settings()
    assert (s.turns_stream, s.outcomes_stream, s.dead_letter_stream, s.retrieval_queue) == (
        "mnemos:turns", "mnemos:outcomes", "mnemos:turns:dead", "retrievals")


def test_a_shard_names_its_streams_and_queue_with_a_cluster_hash_tag() -> None:
    s = Settings(shards=3, shard=2)
    assert (s.turns_stream, s.outcomes_stream, s.dead_letter_stream, s.retrieval_queue) == (
        "mnemos:turns:{shard-2}", "mnemos:outcomes:{shard-2}", "mnemos:turns:dead:{shard-2}", "retrievals:{shard-2}")


@pytest.mark.parametrize("changes", [{"shards": 0}, {"shards": 2, "shard": 2}, {"shard": -1},
                                     {"index_memory_mb": 0}, {"max_cached_tenants": 0}])
def test_settings_refuse_a_shard_outside_the_ring_and_an_empty_budget(changes: dict[str, int]) -> None:
    with pytest.raises(SettingsError):
        Settings(**changes)


def test_settings_read_the_shard_variables() -> None:
    s = Settings.from_env({"MNEMOS_SHARDS": "4", "MNEMOS_SHARD": "3", "MNEMOS_INDEX_MEMORY_MB": "64"})
    assert (s.shards, s.shard, s.index_memory_bytes) == (4, 3, 64 * 1024 * 1024)


def test_the_client_publishes_and_forgets_on_each_tenant_s_shard() -> None:
    redis = RecordingRedis()
    client = MnemosClient(redis, stream_prefix="unit", shards=3)  # type: ignore[arg-type]
    tenants = ["alice", "bob", "dave"]
    assert [client.shard_of(t) for t in tenants] == [0, 1, 2]
    client.publish_turns([{"tenant_id": t, "session_id": "s", "turn_id": f"{t}-{i}", "role": "user",
                           "text": f"turn {i} of {t}", "occurred_at": "2024-03-01T09:00:00+00:00"}
                          for i in range(2) for t in tenants])
    client.forget("dave", session_id="s")
    for shard, tenant in enumerate(tenants):
        stream = redis.streams[f"unit:turns:{{shard-{shard}}}"]
        assert [m["tenant_id"] for m in stream] == [tenant] * (3 if tenant == "dave" else 2)
    assert set(redis.streams) == {f"unit:turns:{{shard-{n}}}" for n in range(3)}
    assert [client.queue_of(t).name for t in tenants] == [f"retrievals:{{shard-{n}}}" for n in range(3)]


def test_an_unsharded_client_keeps_its_one_stream_and_queue() -> None:
    redis = RecordingRedis()
    client = MnemosClient(redis, stream_prefix="unit")  # type: ignore[arg-type]
    client.publish_turn({"tenant_id": "bob", "session_id": "s", "turn_id": "t", "role": "user", "text": "hi",
                         "occurred_at": "2024-03-01T09:00:00+00:00"})
    assert list(redis.streams) == ["unit:turns"] == [client.turns_stream]
    assert client.queue_of("bob").name == client.queue.name == "retrievals"


def test_the_client_follows_the_tenant_directory_and_holds_a_frozen_tenant() -> None:
    from api.directory import FROZEN
    from api.errors import TenantMoving

    redis = RecordingRedis()
    client = MnemosClient(redis, stream_prefix="unit", shards=3, move_wait_s=0.2)  # type: ignore[arg-type]
    turn = {"session_id": "s", "role": "user", "text": "hi", "occurred_at": "2024-03-01T09:00:00+00:00"}
    redis.hashes[sharding.directory_key("unit", 2, 3)] = {"dave": "1"}  # dave (ring shard 2) moved to shard 1
    client.publish_turns([{**turn, "tenant_id": "dave", "turn_id": "d1"}, {**turn, "tenant_id": "alice", "turn_id": "a1"}])
    client.forget("dave")
    assert (client.home_shard("dave"), client.shard_of("dave")) == (2, 1)
    assert [m["tenant_id"] for m in redis.streams["unit:turns:{shard-1}"]] == ["dave", "dave"]
    assert [m["tenant_id"] for m in redis.streams["unit:turns:{shard-0}"]] == ["alice"]
    assert "unit:turns:{shard-2}" not in redis.streams
    assert client.queue_of("dave").name == "retrievals:{shard-1}"

    redis.hashes[sharding.directory_key("unit", 1, 3)] = {"dave": FROZEN}  # a move from shard 1 under way
    with pytest.raises(TenantMoving, match="shard 1 is unavailable: tenant 'dave' is being moved") as caught:
        client.publish_turn({**turn, "tenant_id": "dave", "turn_id": "d2"})
    assert caught.value.shard == 1 and len(redis.streams["unit:turns:{shard-1}"]) == 2
    with pytest.raises(TenantMoving):
        client.shard_of("dave")


def test_a_moved_tenant_is_followed_with_no_wait_and_bad_markers_are_named() -> None:
    # break-it session: with move_wait_s 0 (MNEMOS_MOVE_WAIT_S=0) every call for a moved tenant, not
    # frozen, failed with TenantMoving: the deadline was checked before the marker was read
    from api.directory import FROZEN
    from api.errors import ShardUnavailable, TenantMoving

    redis = RecordingRedis()
    client = MnemosClient(redis, stream_prefix="unit", shards=3, move_wait_s=0.0)  # type: ignore[arg-type]
    turn = {"session_id": "s", "role": "user", "text": "hi", "occurred_at": "2024-03-01T09:00:00+00:00"}
    redis.hashes[sharding.directory_key("unit", 2, 3)] = {"dave": "1"}  # dave (ring shard 2) moved to shard 1
    client.publish_turn({**turn, "tenant_id": "dave", "turn_id": "d1"})
    assert client.shard_of("dave") == 1 and len(redis.streams["unit:turns:{shard-1}"]) == 1
    redis.hashes[sharding.directory_key("unit", 1, 3)] = {"dave": FROZEN}
    with pytest.raises(TenantMoving):  # frozen: no wait at all
        client.shard_of("dave")
    redis.hashes[sharding.directory_key("unit", 1, 3)] = {"dave": "2"}  # 2 -> 1 -> 2: markers that loop
    with pytest.raises(ShardUnavailable, match="loop between shards"):
        client.shard_of("dave")
    with pytest.raises(ShardUnavailable, match="loop between shards"):
        client.publish_turn({**turn, "tenant_id": "dave", "turn_id": "d2"})
    for bad in ("not-a-shard", "7", "-1", "١"):
        redis.hashes[sharding.directory_key("unit", 1, 3)] = {"dave": bad}
        with pytest.raises(ShardUnavailable, match="which this client .shards=3. does not have"):
            client.shard_of("dave")


class _MovingMarkers:
    """Both shards' directories of one tenant as moves back and forth write them: each read returns the
    next state of the shard read (0 or 1); the last state of each shard stays."""

    def __init__(self, states: dict[int, list[str | None]]) -> None:
        self.states = states

    def on(self, shard: int) -> object:
        markers = self.states[shard]

        class Shard:
            def hget(self, key: str, tenant: str) -> bytes | None:
                marker = markers.pop(0) if len(markers) > 1 else markers[0]
                return None if marker is None else marker.encode()

        return Shard()


def test_moves_back_to_back_are_no_loop_but_a_real_loop_is() -> None:
    # break-it session: hops were counted over the whole wait, so a client waiting through more than
    # 2 x shards moves of one tenant got "markers loop between shards" although they never did
    from api.directory import Directory
    from api.errors import ShardUnavailable

    frozen = "frozen"
    # shard 0 is the ring shard; moves 0->1, 1->0, 0->1, ... each freeze, then flip
    states: dict[int, list[str | None]] = {0: ["1"], 1: []}
    for _ in range(6):
        states[1] += [frozen, "0"]
        states[0] += [frozen, "1"]
    states[1].append(None)  # the last move ends on shard 1, which serves the tenant
    flips = _MovingMarkers(states)
    directory = Directory([flips.on(0), flips.on(1)], "unit", wait_s=30.0, poll_s=0.0)  # type: ignore[list-item]
    assert directory.resolve("t", 0) == 1
    looping = _MovingMarkers({0: ["1"], 1: ["0"]})
    directory = Directory([looping.on(0), looping.on(1)], "unit", wait_s=30.0, poll_s=0.0)  # type: ignore[list-item]
    with pytest.raises(ShardUnavailable, match="loop between shards"):
        directory.resolve("t", 0)


@pytest.mark.parametrize("wait_s", [float("nan"), -1.0, float("inf")])
def test_a_wait_that_is_no_number_of_seconds_is_refused(wait_s: float) -> None:
    with pytest.raises(ValueError, match="move_wait_s must be a number of seconds >= 0"):
        MnemosClient(RecordingRedis(), stream_prefix="unit", shards=3, move_wait_s=wait_s)  # type: ignore[arg-type]


def test_a_marker_that_is_not_utf8_is_refused_by_name() -> None:
    from api.errors import ShardUnavailable

    redis = RecordingRedis()
    client = MnemosClient(redis, stream_prefix="unit", shards=3)  # type: ignore[arg-type]
    redis.hashes[sharding.directory_key("unit", 2, 3)] = {"dave": b"\xff"}
    with pytest.raises(ShardUnavailable, match="does not have"):
        client.shard_of("dave")
