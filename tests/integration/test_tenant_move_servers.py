"""Moving a tenant between shards' servers while its turns keep arriving (docs/scaling.md "Moving a
tenant between shards").

Two throwaway ``redis-server`` processes and two Postgres databases, an ingest worker per shard
running in a thread. Tenant T (ring shard 0) has stored turns, an alias, a forgotten turn (a
tombstone), suppression scores and a ledger row on shard 0, and tenant V on shard 1 holds the same
entry ids there, so T's ids must be renumbered. A thread keeps publishing T's turns through the
client while :func:`workers.ops.tenant_move.move_tenant` moves T to shard 1, and shard 0's ingest worker
holds some of T's turns, read and waiting for T's lock, when the move begins; then every published turn
is stored on shard 1 exactly once, nothing of T is left in shard 0's database or streams, its alias,
scores, ledger and tombstone point at its new ids, a retrieval through the client is answered by
shard 1, and tenant U, also on shard 0, is untouched. ``mnemos reshard move`` then takes T home.
Skipped when ``redis-server`` is not installed.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import psycopg
import pytest

from api import sharding
from api.client import MnemosClient, job_id_for
from api.schemas import Outcome, PoolRow
from tests.integration import factories
from tests.support import ShardCluster, postgres_tenants, redis_tenants, shard_cluster
from workers.ops.migrate import migrate_shards
from workers.ops.tenant_move import MoveReport, move_tenant
from workers.runtime.connections import redis_client
from workers.settings import Settings
from workers.store import PostgresStore
from workers.store.rows import TenantLock

pytestmark = pytest.mark.integration
SHARDS = 2
WAIT_S = 60.0


@pytest.fixture
def cluster(settings: Settings, tmp_path: Path) -> Iterator[ShardCluster]:
    with shard_cluster(settings, tmp_path, SHARDS) as value:
        yield value


def _tenants() -> tuple[str, str, str]:
    """T and U on ring shard 0, V on ring shard 1."""
    zero = (t for t in (f"tenant-{n}" for n in itertools.count()) if sharding.shard_of(t, SHARDS) == 0)
    t, u = itertools.islice(zero, 2)
    v = next(t for t in (f"other-{n}" for n in itertools.count()) if sharding.shard_of(t, SHARDS) == 1)
    return t, u, v


def _rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``query`` as the superuser (row-level security does not hide rows)."""
    with psycopg.connect(url) as conn:
        return conn.execute(query, params).fetchall()


def _wait_for(condition: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def _turn_ids(url: str, tenant: str) -> list[str]:
    return [r[0] for r in _rows(url, "SELECT turn_id FROM entries WHERE tenant_id = %s", tenant)]


class _Publisher(threading.Thread):
    """Publishes T's turns one at a time through the client until stopped; ``published`` in order."""

    def __init__(self, client: MnemosClient, tenant: str) -> None:
        super().__init__(daemon=True)
        self.client, self.tenant = client, tenant
        self.published: list[str] = []
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for n in itertools.count():
                if self.stop.is_set():
                    return
                turn_id = f"live-{n}"
                self.client.publish_turn(factories.turn(self.tenant, turn_id,
                                                        f"garden note {n} about tomatoes and basil {n}",
                                                        session="live", minutes=100 + n))
                self.published.append(turn_id)
                self.stop.wait(0.01)  # pace the publisher, not a wait for a condition
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def _run_ingest_workers(stack: ExitStack, settings: Settings) -> None:
    """One ingest worker per shard, each in a thread on its own shard's Redis and Postgres."""
    stop = threading.Event()
    threads = []
    for shard in range(SHARDS):
        own = settings.for_shard(shard)
        store = stack.enter_context(PostgresStore(own.database_url, own.db_app_role))
        worker = factories.ingest_worker(own, redis_client(own), store)
        threads.append(threading.Thread(target=worker.run, args=(stop, f"ingest-{shard}"), daemon=True))
    for thread in threads:
        thread.start()

    def halt() -> None:
        stop.set()
        for thread in threads:
            thread.join(timeout=10)
    stack.callback(halt)


def _seed(client: MnemosClient, cluster: ShardCluster, t: str, u: str, v: str) -> None:
    """T's conversation with an alias and a forgotten turn, scores and a ledger row; U's and V's."""
    a, b = cluster.database_urls
    client.publish_turns([*factories.conversation_turns(v, "V-"), *factories.conversation_turns(t, "T-"),
                          *factories.conversation_turns(u, "U-")])
    # an alias of T-0
    client.publish_turn(factories.turn(t, "T-dup", "I adopted a grey cat named Pixel last spring", minutes=50))
    _wait_for(lambda: len(_turn_ids(a, t)) == 9 and len(_turn_ids(a, u)) == 8 and len(_turn_ids(b, v)) == 8,
              "the first turns to be stored")
    client.forget(t, turn_ids=["T-1"])
    _wait_for(lambda: "T-1" not in _turn_ids(a, t), "the forget of T-1")
    ids = dict(_rows(a, "SELECT turn_id, entry_id FROM entries WHERE tenant_id = %s", t))
    own = cluster.settings.for_shard(0)
    with PostgresStore(own.database_url, own.db_app_role) as store, store.tenant(t) as tx:
        deltas = {(ids["T-0"], 0): 0.25, (ids["T-2"], 1): -0.5}
        assert tx.record_outcome("outcome-1", 0, deltas, None)
        tx.bump_suppression_version("outcome-1")
        tx.add_suppression(deltas)
    pool = (PoolRow(ids["T-0"], 1, 3, 0.5), PoolRow(ids["T-2"], 2, 2, 1.0), PoolRow(ids["T-3"], 3, 1, 2.0))
    pending = Outcome("outcome-2", t, 0, 3, pool)  # no suppression worker runs on shard 0: it stays pending
    client.connections[0].xadd(own.outcomes_stream, pending.to_stream_fields())  # type: ignore[arg-type]


def _waiting_ingest_locks(url: str) -> int:
    """Transactions of ``url``'s database waiting for a tenant's ingest lock (an advisory lock)."""
    return int(_rows(url, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                     " AND classid = %s", int(TenantLock.INGEST))[0][0])


def _move_with_turns_in_flight(settings: Settings, client: MnemosClient, tenant: str, held: list[str],
                               lines: list[str]) -> MoveReport:
    """Move ``tenant`` to shard 1 while shard 0's ingest worker holds its ``held`` turns, read and waiting
    for the tenant's lock (the test holds it); the move queues behind that worker for the same lock."""
    source = settings.for_shard(0)
    with psycopg.connect(source.database_url, autocommit=True) as blocker:
        blocker.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", (int(TenantLock.INGEST), tenant))
        client.publish_turns([factories.turn(tenant, turn_id, f"held note {turn_id}", session="held")
                              for turn_id in held])
        _wait_for(lambda: _waiting_ingest_locks(source.database_url) == 1, "shard 0's worker to wait for the lock")
        with ThreadPoolExecutor(1) as pool:
            moving = pool.submit(move_tenant, settings, tenant, 1, echo=lines.append)
            _wait_for(lambda: _waiting_ingest_locks(source.database_url) == 2 or moving.done(),
                      "the move to wait for the lock")
            blocker.execute("SELECT pg_advisory_unlock(%s, hashtext(%s))", (int(TenantLock.INGEST), tenant))
            return moving.result(timeout=WAIT_S)


def _apply_outcomes_on(own: Settings, client: MnemosClient, stack: ExitStack) -> None:
    """One pass of a suppression worker of ``own``'s shard over its outcomes stream."""
    store = stack.enter_context(PostgresStore(own.database_url, own.db_app_role))
    worker = factories.suppression_worker(own, client.connections[own.shard], store)
    consumer = worker.consumer("s1")
    consumer.ensure_group()
    consumer.ack(worker.handle(consumer.read()))


def test_a_tenant_moves_to_another_shard_s_servers_while_its_turns_arrive(cluster: ShardCluster) -> None:
    settings = cluster.settings
    a, b = cluster.database_urls
    migrate_shards(settings, echo=lambda _: None)
    t, u, v = _tenants()
    client = factories.sharded_client(settings)
    with ExitStack() as stack:
        _run_ingest_workers(stack, settings)
        _seed(client, cluster, t, u, v)
        source_ids = {r[0] for r in _rows(a, "SELECT entry_id FROM entries WHERE tenant_id = %s", t)}
        assert source_ids & {r[0] for r in _rows(b, "SELECT entry_id FROM entries")}  # ids collide on shard 1
        untouched = _rows(a, "SELECT entry_id, turn_id, text FROM entries WHERE tenant_id = %s ORDER BY entry_id", u)

        publisher = _Publisher(client, t)
        publisher.start()
        _wait_for(lambda: len(publisher.published) >= 10, "turns published before the move")
        lines: list[str] = []
        held = [f"held-{n}" for n in range(5)]
        report = _move_with_turns_in_flight(settings, client, t, held, lines)
        at_flip = len(publisher.published)
        _wait_for(lambda: len(publisher.published) >= at_flip + 10, "turns published after the move")
        publisher.stop.set()
        publisher.join(timeout=WAIT_S)
        assert publisher.error is None, publisher.error
        expected = {f"T-{n}" for n in range(8)} - {"T-1"} | {"T-dup", *held, *publisher.published}
        _wait_for(lambda: set(_turn_ids(b, t)) == expected, "every published turn of T stored on shard 1")

        stored = _turn_ids(b, t)
        assert len(stored) == len(expected)  # 0 lost, 0 duplicated
        assert (report.source, report.target, report.outcomes.moved) == (0, 1, 1) and report.entries >= 8
        assert report.turns.moved >= len(held)  # held on shard 0: read by its waiting worker, or not read yet
        assert lines[-1].startswith("routing")
        assert postgres_tenants(a) == {u} and t not in redis_tenants(client.connections[0])
        assert _rows(a, "SELECT entry_id, turn_id, text FROM entries WHERE tenant_id = %s ORDER BY entry_id",
                     u) == untouched
        new = dict(_rows(b, "SELECT turn_id, entry_id FROM entries WHERE tenant_id = %s", t))
        assert not set(new.values()) & {r[0] for r in _rows(b, "SELECT entry_id FROM entries WHERE tenant_id = %s", v)}
        assert _rows(b, "SELECT canonical_entry_id FROM entries WHERE tenant_id = %s AND turn_id = 'T-dup'",
                     t) == [(new["T-0"],)]
        assert sorted(_rows(b, "SELECT entry_id, cluster, score FROM suppression WHERE tenant_id = %s", t)) == sorted(
            [(new["T-0"], 0, 0.25), (new["T-2"], 1, -0.5)])
        assert _rows(b, "SELECT deltas FROM applied_outcomes WHERE tenant_id = %s", t) == [
            (sorted([[new["T-0"], 0, 0.25], [new["T-2"], 1, -0.5]]),)]
        assert _rows(b, "SELECT scope, key FROM tombstones WHERE tenant_id = %s", t) == [("turn", "T-1")]
        _apply_outcomes_on(settings.for_shard(1), client, stack)  # the pending outcome, renumbered
        deltas = _rows(b, "SELECT deltas FROM applied_outcomes WHERE tenant_id = %s AND outcome_id = 'outcome-2'", t)
        assert deltas and deltas[0][0] and {e for e, _, _ in deltas[0][0]} <= {new["T-0"], new["T-2"], new["T-3"]}

        assert client.shard_of(t) == 1 and client.home_shard(t) == 0
        services = {}
        for shard in range(SHARDS):
            own = settings.for_shard(shard)
            store = stack.enter_context(PostgresStore(own.database_url, own.db_app_role))
            services[shard] = factories.query_service(own, client.connections[shard], store)
        hits = factories.retrieve_on_shard(client, t, services[1], query="tomatoes and basil")
        assert hits and set(hits) <= expected
        assert set(factories.retrieve_on_shard(client, u, services[0])) <= {f"U-{n}" for n in range(8)}

        _move_home_with_the_cli(cluster, t, expected)


def _cli(settings: Settings, *args: str) -> Any:
    """``mnemos *args`` in-process (click's runner) with the shard map's environment; the click Result."""
    from click.testing import CliRunner

    from workers.cli import cli

    assert settings.shard_map is not None
    env = {"MNEMOS_SHARDS": str(SHARDS), "MNEMOS_SHARD_MAP": settings.shard_map,
           "MNEMOS_STREAM_PREFIX": settings.stream_prefix, "MNEMOS_QUEUE_NAME": settings.queue_name}
    return CliRunner().invoke(cli, list(args), env=env)


def _move_home_with_the_cli(cluster: ShardCluster, tenant: str, expected: set[str]) -> None:
    """``mnemos reshard move`` back to the ring's shard: the directory has no marker of it left."""
    settings = cluster.settings
    moved = _cli(settings, "reshard", "move", "--tenant", tenant, "--to", "0")
    assert moved.exit_code == 0, moved.output
    assert f"moved tenant {tenant} from shard 1 to shard 0" in moved.output
    where = _cli(settings, "reshard", "where", "--tenant", tenant)
    assert where.exit_code == 0 and f"tenant {tenant}: shard 0\n" in where.output
    a, b = cluster.database_urls
    assert set(_turn_ids(a, tenant)) == expected and tenant not in postgres_tenants(b)
    for shard in range(SHARDS):
        key = sharding.directory_key(settings.stream_prefix, shard, SHARDS)
        assert redis_client(settings.for_shard(shard)).hget(key, tenant) == (None if shard == 0 else b"0")
    again = _cli(settings, "reshard", "move", "--tenant", tenant, "--to", "0")
    # new-operator session: running a move twice failed with exit code 1, "a service failed"
    assert again.exit_code == 0 and f"tenant {tenant} is served by shard 0 already: nothing moved" in again.output
    # new-operator session: a mistyped id "moved", leaving a directory marker for a tenant that never was
    elsewhere = str(1 - sharding.shard_of(tenant + "-typo", SHARDS))
    typo = _cli(settings, "reshard", "move", "--tenant", tenant + "-typo", "--to", elsewhere)
    assert typo.exit_code == 2 and "nothing to move (a mistyped id?)" in typo.output  # the command must change
    # break-it session: a typo whose ring shard is the target read "served by shard N already: nothing moved"
    home = str(sharding.shard_of(tenant + "-typo", SHARDS))
    typo = _cli(settings, "reshard", "move", "--tenant", tenant + "-typo", "--to", home)
    assert typo.exit_code == 2 and "nothing to move (a mistyped id?)" in typo.output
    assert not any(redis_client(settings.for_shard(shard)).hexists(
        sharding.directory_key(settings.stream_prefix, shard, SHARDS), tenant + "-typo") for shard in range(SHARDS))


def test_a_move_that_fails_is_undone_before_its_copy_and_resumed_after_it(cluster: ShardCluster,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.ops.tenant_move as tenant_move
    from workers.runtime.errors import StoreError, TenantMoveError

    settings = cluster.settings
    a, b = cluster.database_urls
    migrate_shards(settings, echo=lambda _: None)
    t, _, _ = _tenants()
    client = factories.sharded_client(settings)
    client.publish_turns(factories.conversation_turns(t, "T-"))
    assert factories.drain_shard(settings, client, 0) == 8
    marker = sharding.directory_key(settings.stream_prefix, 0, SHARDS)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("injected")

    monkeypatch.setattr(tenant_move, "copy_tenant", broken)
    with pytest.raises(TenantMoveError, match="before its rows were copied .* served by shard 0 as before"):
        move_tenant(settings, t, 1, echo=lambda _: None)
    assert client.connections[0].hget(marker, t) is None and t not in postgres_tenants(b)

    monkeypatch.undo()
    # pending
    client.publish_turns([factories.turn(t, f"late-{n}", f"late note {n}", session="late") for n in range(2)])
    monkeypatch.setattr(tenant_move, "move_turns", broken)
    with pytest.raises(TenantMoveError, match="after its rows were copied to shard 1 .* stays frozen"):
        move_tenant(settings, t, 1, echo=lambda _: None)
    assert client.connections[0].hget(marker, t) == b"frozen" and len(_turn_ids(b, t)) == 8 == len(_turn_ids(a, t))

    monkeypatch.undo()
    lines: list[str] = []
    report = move_tenant(settings, t, 1, echo=lines.append)
    assert report.resumed and report.turns.moved == 2 and client.shard_of(t) == 1
    # new-operator session: the summary said "copied 8 entries ... 0 tombstones" for a copy it did not make
    assert report.copied_before and "8 entries found copied by the stopped run" in report.line()
    assert f"found 8 entries of tenant {t} on shard 1, copied by the stopped run" in lines
    assert factories.drain_shard(settings, client, 1) == 2
    assert set(_turn_ids(b, t)) == {f"T-{n}" for n in range(8)} | {"late-0", "late-1"}
    assert t not in postgres_tenants(a) and t not in redis_tenants(client.connections[0])


def _frozen_gauges(settings: Settings) -> dict[int, float]:
    """``mnemos_tenants_frozen`` as a worker of each shard samples it (its own Redis, its directory key)."""
    from workers.runtime.metrics import ServiceMetrics
    from workers.runtime.streams import StreamSampler

    out = {}
    for shard in range(SHARDS):
        own, metrics = settings.for_shard(shard), ServiceMetrics()
        key = sharding.directory_key(settings.stream_prefix, shard, SHARDS)
        StreamSampler(redis_client(own), metrics, [], [], 60.0, key).sample()
        out[shard] = metrics.tenants_frozen.labels(directory=key)._value.get()
    return out


def test_a_move_back_to_the_ring_shard_that_fails_after_its_streams_moved_is_resumed(
        cluster: ShardCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it session: the streams step removes the target's marker; the ring shard had none left,
    # so the rerun found the tenant "served by shard 0 already" and the source kept its rows
    import workers.ops.tenant_move as tenant_move
    from workers.runtime.errors import StoreError, TenantMoveError

    settings = cluster.settings
    a, b = cluster.database_urls
    migrate_shards(settings, echo=lambda _: None)
    t, _, _ = _tenants()
    client = factories.sharded_client(settings)
    client.publish_turns(factories.conversation_turns(t, "T-"))
    assert factories.drain_shard(settings, client, 0) == 8
    move_tenant(settings, t, 1, echo=lambda _: None)

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("injected")

    monkeypatch.setattr(tenant_move, "delete_tenant", broken)
    with pytest.raises(TenantMoveError, match="stays frozen"):
        move_tenant(settings, t, 0, echo=lambda _: None)
    monkeypatch.undo()
    # `reshard where` said nothing for 30 s, then failed (new-operator session)
    where = _cli(settings, "reshard", "where", "--tenant", t)
    assert where.exit_code == 0 and f"tenant {t}: shard 1 (frozen" in where.output
    health = _cli(settings, "health", "--all-shards", "--no-models")  # it said all was well
    assert health.exit_code == 0 and f"shard 1 tenant moves: 1 tenant(s) frozen by a move running or stopped: {t!r}" \
        in health.output and "shard 0 tenant moves: no tenant frozen" in health.output
    frozen = _frozen_gauges(settings)  # new-operator session: no metric, so no alert, for a frozen tenant
    assert frozen == {0: 0.0, 1: 1.0}
    # break-it session: "--to" the frozen source said "served by shard 1 already: nothing moved", exit 0
    back = _cli(settings, "reshard", "move", "--tenant", t, "--to", "1")
    assert back.exit_code == 2 and f"tenant {t!r} is frozen on shard 1" in back.output
    assert "shard 0 holds its copy or messages: finish that move with --to 0" in back.output
    report = move_tenant(settings, t, 0, echo=lambda _: None)
    assert (report.source, report.target, report.resumed) == (1, 0, True) and client.shard_of(t) == 0
    assert _frozen_gauges(settings) == {0: 0.0, 1: 0.0}
    assert len(_turn_ids(a, t)) == 8 and t not in postgres_tenants(b)


def test_an_id_published_before_a_move_is_followed_to_its_copy(cluster: ShardCluster) -> None:
    # break-it session: the old id never existed on the target, so once the target's group had
    # delivered past it (raising the target's ids makes that certain) acknowledged() said True while
    # the moved turn still waited there unstored
    settings = cluster.settings
    b = cluster.database_urls[1]
    migrate_shards(settings, echo=lambda _: None)
    t, _, v = _tenants()
    client = factories.sharded_client(settings)
    old_id = client.publish_turn(factories.turn(t, "late", "my sister is a nurse"))  # no worker on shard 0
    assert move_tenant(settings, t, 1, echo=lambda _: None).turns.moved == 1
    client.publish_turn(factories.turn(v, "v1", "the wifi password is pear"))
    target = settings.for_shard(1)
    with PostgresStore(target.database_url, target.db_app_role) as store:
        worker = factories.ingest_worker(target, client.connections[1], store)
        consumer = worker.consumer("c1")
        consumer.ensure_group()
        moved, other = consumer.read()
        consumer.ack(worker.handle([other]))
        assert not client.acknowledged(t, old_id)
        consumer.ack(worker.handle([moved]))
    assert client.acknowledged(t, old_id) and _turn_ids(b, t) == ["late"]


def test_a_result_stored_for_a_tenant_moving_away_expires_soon(cluster: ShardCluster) -> None:
    # break-it session: a retrieval running across a move stored its answer after the move had let the
    # tenant's other results on the source expire; no forget made on the new shard reaches it
    from rq.results import Result

    from api.directory import FROZEN, MOVED_RESULT_TTL_S
    from workers.query.worker import build_worker

    settings = cluster.settings
    migrate_shards(settings, echo=lambda _: None)
    t, u, _ = _tenants()
    client = factories.sharded_client(settings)
    own = settings.for_shard(0)
    connection = client.connections[0]
    client.publish_turns([factories.turn(t, "x", "my cat is called Pixel"), factories.turn(u, "y", "my cat is Tom")])
    with PostgresStore(own.database_url, own.db_app_role) as store:
        factories.drain(factories.ingest_worker(own, connection, store))
        worker = build_worker(own, connection, factories.query_service(own, connection, store), name="q-moving")
        worker.beats.idle()
        with ThreadPoolExecutor(2) as pool:
            asked = [pool.submit(client.retrieve, tenant, "cat", 3) for tenant in (t, u)]
            _wait_for(lambda: client.queue_of(t).count == 2, "both retrievals to be queued")
            connection.hset(sharding.directory_key(settings.stream_prefix, 0, SHARDS), t, FROZEN)  # a move begins
            worker.work(burst=True)
            results = [future.result(timeout=WAIT_S) for future in asked]
    assert [[h.turn_id for h in r.hits] for r in results] == [["x"], ["y"]]  # both answered
    ttls = {tenant: connection.ttl(Result.get_key(job_id_for(tenant, r.request_id, settings.stream_prefix)))
            for tenant, r in zip((t, u), results, strict=True)}
    assert 0 < ttls[t] <= MOVED_RESULT_TTL_S < ttls[u]


def test_a_stopped_move_is_finished_where_it_went_or_not_at_all(settings: Settings, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it session: a move 1 -> 0 (the ring shard) stopped after its streams step, and clients
    # stored a turn on shard 0 since; a move to shard 2 then took shard 1's stale rows there and left
    # that turn behind, unreachable
    import workers.ops.tenant_move as tenant_move
    from workers.runtime.errors import StoreError, TenantMoveError, TenantMoveRefused

    with shard_cluster(settings, tmp_path, 3) as cluster:
        three = cluster.settings
        migrate_shards(three, echo=lambda _: None)
        t = next(t for t in (f"tenant-{n}" for n in itertools.count()) if sharding.shard_of(t, 3) == 0)
        client = factories.sharded_client(three)
        client.publish_turn(factories.turn(t, "a", "first turn"))
        factories.drain_shard(three, client, 0)
        move_tenant(three, t, 1, echo=lambda _: None)

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("injected")

        monkeypatch.setattr(tenant_move, "delete_tenant", broken)
        with pytest.raises(TenantMoveError, match="stays frozen"):
            move_tenant(three, t, 0, echo=lambda _: None)
        monkeypatch.undo()
        with pytest.raises(TenantMoveRefused, match="finish that move with --to 0"):
            move_tenant(three, t, 2, echo=lambda _: None)
        assert not postgres_tenants(cluster.database_urls[2]) and client.shard_of(t) == 0
        assert move_tenant(three, t, 0, echo=lambda _: None).resumed
        assert _turn_ids(cluster.database_urls[0], t) == ["a"] and t not in postgres_tenants(cluster.database_urls[1])


def test_moved_ids_hold_across_moves_stops_and_quiet_shards(cluster: ShardCluster,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it session, round 3: acknowledged() followed one move only; said False, on a quiet target,
    # for an id the move did not carry because it was committed; and a move stopped after appending
    # appended the pending messages again when resumed (a second dead letter)
    import workers.ops.tenant_move_streams as tenant_move_streams
    from workers.runtime.errors import TenantMoveError

    settings = cluster.settings
    a, b = cluster.database_urls
    migrate_shards(settings, echo=lambda _: None)
    t, _, _ = _tenants()
    client = factories.sharded_client(settings)
    source, target = settings.for_shard(0), settings.for_shard(1)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        committed = client.publish_turn(factories.turn(t, "c", "committed, never acknowledged"))
        consumer = worker.consumer("dying")
        consumer.ensure_group()
        worker.handle(consumer.read())
    waiting = client.publish_turn(factories.turn(t, "w", "still waiting"))
    client.connections[0].xadd(source.turns_stream, {"v": "1", "tenant_id": t, "session_id": "s1", "turn_id": "bad",
                                                     "role": "user", "text": "x", "occurred_at": "nope"})
    real_delete = tenant_move_streams._delete

    def stop_once(*args: Any, **kwargs: Any) -> None:
        monkeypatch.setattr(tenant_move_streams, "_delete", real_delete)
        raise ConnectionError("lost the source")

    monkeypatch.setattr(tenant_move_streams, "_delete", stop_once)
    with pytest.raises(TenantMoveError, match="stays frozen"):
        move_tenant(settings, t, 1, echo=lambda _: None)
    assert move_tenant(settings, t, 1, echo=lambda _: None).turns.moved == 2  # the resume appends nothing more
    assert len([f for _, f in client.connections[1].xrange(target.turns_stream) if f[b"tenant_id"] == t.encode()]) == 2
    assert client.acknowledged(t, committed) and not client.acknowledged(t, waiting)  # the target is quiet
    move_tenant(settings, t, 0, echo=lambda _: None)  # back, "w" still waiting: its third id
    assert client.acknowledged(t, committed) and not client.acknowledged(t, waiting)
    factories.drain_shard(settings, client, 0)
    assert client.acknowledged(t, waiting) and sorted(_turn_ids(a, t)) == ["c", "w"]
    assert _rows(a, "SELECT count(*) FROM dead_letters WHERE tenant_id = %s", t) == [(1,)]
    assert t not in postgres_tenants(b)


def test_a_move_leaves_no_lag_on_the_source_s_groups(cluster: ShardCluster) -> None:
    # new-operator session: the move deleted the tenant's messages the ingest group had never
    # delivered, and Redis's lag for the group (KEDA's scaling input, mnemos_stream_lag) stayed higher
    # by their number for good
    settings = cluster.settings
    migrate_shards(settings, echo=lambda _: None)
    t, u, _ = _tenants()
    client = factories.sharded_client(settings)
    source = settings.for_shard(0)
    with PostgresStore(source.database_url, source.db_app_role) as store:
        worker = factories.ingest_worker(source, client.connections[0], store)
        client.publish_turn(factories.turn(u, "u0", "my cat is called Tom"))
        factories.drain(worker)
        client.publish_turns([factories.turn(t, f"t{n}", f"note {n} about tomatoes") for n in range(3)])
        move_tenant(settings, t, 1, echo=lambda _: None)
        client.publish_turn(factories.turn(u, "u1", "my dog is called Rex"))
        factories.drain(worker)
    (group,) = client.connections[0].xinfo_groups(source.turns_stream)
    assert group["lag"] == 0 and group["pending"] == 0


def test_the_moved_ids_floor_is_the_tenant_s_own_last_id(cluster: ShardCluster,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it session, round 4: the floor was the source stream's last id, read after the target's
    # ids were raised; another tenant's message in between lifted it above the tenant's first turn on
    # a target whose clock is behind, and acknowledged() said True for that unread turn. And a mapping
    # an earlier move left on a shard sent an old id to a copy that shard never delivered
    import workers.ops.tenant_move as tenant_move

    settings = cluster.settings
    migrate_shards(settings, echo=lambda _: None)
    t, u, _ = _tenants()
    client = factories.sharded_client(settings)
    source = settings.for_shard(0)
    never_read = client.publish_turn(factories.turn(t, "x", "my cat is called Pixel"))
    ahead = int(time.time() * 1000) + 3_600_000  # shard 0's clock an hour ahead of shard 1's
    client.connections[0].xadd(source.turns_stream, {"tenant_id": u, "v": "1"}, id=f"{ahead}-0")
    real = tenant_move.carry_positions

    def carry_then_another_tenant_publishes(src: Any, stream: str, *rest: Any) -> bool:
        moved = real(src, stream, *rest)
        src.xadd(stream, {"tenant_id": u, "v": "1"}, id=f"{ahead + 5}-0")
        return moved

    monkeypatch.setattr(tenant_move, "carry_positions", carry_then_another_tenant_publishes)
    move_tenant(settings, t, 1, echo=lambda _: None)
    monkeypatch.undo()
    after = client.publish_turn(factories.turn(t, "y", "my dog is called Rex"))
    assert not client.acknowledged(t, after) and not client.acknowledged(t, never_read)
    move_tenant(settings, t, 0, echo=lambda _: None)  # "x" and "y" unread: carried back
    factories.drain_shard(settings, client, 0)
    move_tenant(settings, t, 1, echo=lambda _: None)  # nothing to carry now
    assert client.acknowledged(t, never_read) and client.acknowledged(t, after)


def test_a_stopped_move_of_a_tenant_with_only_pending_turns_is_not_resumed_elsewhere(
        settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # break-it session, round 4: the refusal above looked at rows only; a tenant with nothing stored
    # yet had its pending turns moved to shard 1's stream, and a move to shard 2 left them there
    import workers.ops.tenant_move as tenant_move
    from workers.runtime.errors import StoreError, TenantMoveError, TenantMoveRefused

    with shard_cluster(settings, tmp_path, 3) as cluster:
        three = cluster.settings
        migrate_shards(three, echo=lambda _: None)
        t = next(t for t in (f"tenant-{n}" for n in itertools.count()) if sharding.shard_of(t, 3) == 0)
        client = factories.sharded_client(three)
        client.publish_turn(factories.turn(t, "a", "a turn no worker has read yet"))

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise StoreError("injected")

        monkeypatch.setattr(tenant_move, "delete_tenant", broken)
        with pytest.raises(TenantMoveError, match="stays frozen"):
            move_tenant(three, t, 1, echo=lambda _: None)
        monkeypatch.undo()
        assert not postgres_tenants(cluster.database_urls[1])  # only its message is there
        with pytest.raises(TenantMoveRefused, match="finish that move with --to 1"):
            move_tenant(three, t, 2, echo=lambda _: None)
        assert move_tenant(three, t, 1, echo=lambda _: None).resumed and client.shard_of(t) == 1


def test_directory_markers_that_name_no_shard_are_refused_by_name(cluster: ShardCluster) -> None:
    # break-it session: such a marker ended `reshard move` and `reshard where` in a raw ValueError or IndexError
    settings = cluster.settings
    migrate_shards(settings, echo=lambda _: None)
    t, _, _ = _tenants()
    home = sharding.shard_of(t, SHARDS)
    key = sharding.directory_key(settings.stream_prefix, home, SHARDS)
    connection = redis_client(settings.for_shard(home))
    try:
        for bad in ("not-a-shard", "7", "-1"):
            connection.hset(key, t, bad)
            for args in (["reshard", "move", "--tenant", t, "--to", str(1 - home)], ["reshard", "where", "--tenant", t]):
                result = _cli(settings, *args)
                assert result.exit_code == 2, (bad, args, result.output)
                assert f"holds {bad!r} for tenant {t!r}, which is not a shard of this map" in result.output
    finally:
        connection.delete(key)
        connection.close()


def test_a_second_move_of_a_tenant_is_refused_while_one_runs(cluster: ShardCluster) -> None:
    # break-it session: a second move started while the first copied took the frozen source for a
    # stopped move, then "moved" the emptied source to a third shard and routed the tenant away from its rows
    from api.errors import ShardUnavailable
    from workers.runtime.errors import TenantMoveRefused
    from workers.store.tenant_copy import try_move_lock

    settings = cluster.settings
    migrate_shards(settings, echo=lambda _: None)
    t, _, _ = _tenants()
    client = factories.sharded_client(settings)
    client.publish_turns(factories.conversation_turns(t, "T-"))
    assert factories.drain_shard(settings, client, 0) == 8
    ring = settings.for_shard(sharding.shard_of(t, SHARDS))
    with psycopg.connect(ring.database_url, autocommit=True) as running:  # the first move, still at work
        assert try_move_lock(running, t)
        with pytest.raises(TenantMoveRefused, match=f"another `mnemos reshard move` of tenant {t!r} is running"):
            move_tenant(settings, t, 1, echo=lambda _: None)
        assert client.shard_of(t) == 0 and len(_turn_ids(cluster.database_urls[0], t)) == 8  # nothing touched
    assert move_tenant(settings, t, 1, echo=lambda _: None).entries == 8  # its connection closed: the lock went

    # break-it session: an empty marker let the publish script append turns the shard's workers never
    # ingest (they leave a marked tenant alone), while every reader refused it as no shard
    key = sharding.directory_key(settings.stream_prefix, 0, SHARDS)
    own = redis_client(settings.for_shard(0))
    try:
        own.hset(key, t, "")
        before = own.xlen(settings.for_shard(0).turns_stream)
        with pytest.raises(ShardUnavailable, match="does not have"):
            client.publish_turn(factories.turn(t, "late", "a turn after the marker was emptied"))
        assert own.xlen(settings.for_shard(0).turns_stream) == before
    finally:
        own.hset(key, t, "1")
        own.close()
