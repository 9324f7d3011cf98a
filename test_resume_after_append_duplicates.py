"""A move whose streams step stops after appending the tenant's pending messages to the target but
before the source's copies are acknowledged and deleted (here: the write of the moved-ids hash fails;
equally a crash or a lost reply between the XADD pipeline and the XDEL) is resumed as documented
("run the same move again"). The resume appends the same pending messages a second time, under new ids:
the source still holds them unacknowledged and nothing marks them carried
(tenant_move_streams.move_turns / _move). The target applies each twice: a malformed message gets two
dead letters, and a replacement is applied again, its forget half erasing the value its first copy
stored (a new entry id), which 3cc2bf7 set out to prevent."""
import pytest
from conftest import tenants_on, texts, rows
from tests.integration import factories
from workers.ops import tenant_move_streams
from workers.ops.tenant_move import TenantMoveError, move_tenant
from workers.store import PostgresStore


def test_resumed_move_appends_pending_messages_twice(cluster, monkeypatch):
    settings = cluster.settings
    (t,) = tenants_on(0, 1)
    client = factories.sharded_client(settings)
    s0, s1 = settings.for_shard(0), settings.for_shard(1)
    c0, c1 = client.connections
    with PostgresStore(s0.database_url, s0.db_app_role) as store:
        client.publish_turns([factories.turn(t, "k", "the wifi password is pear")])
        factories.drain(factories.ingest_worker(s0, c0, store), "c")
    client.replace_turn(factories.turn(t, "k", "the wifi password is plum", minutes=5))  # pending
    c0.xadd(s0.turns_stream, {"v": "1", "tenant_id": t, "session_id": "s1", "turn_id": "bad", "role": "user",
                              "text": "x", "occurred_at": "nope"})  # pending, malformed
    real = tenant_move_streams.moved_field
    with monkeypatch.context() as m:
        def boom(*a, **k):
            raise ConnectionError("target redis connection reset")
        m.setattr(tenant_move_streams, "moved_field", boom)
        with pytest.raises(TenantMoveError, match="run the same move again"):
            move_tenant(settings, t, 1, echo=lambda _: None)
    with PostgresStore(s1.database_url, s1.db_app_role) as store:  # the target's workers run meanwhile
        factories.drain(factories.ingest_worker(s1, c1, store), "c")
    assert texts(cluster.urls[1], t) == {"k": "the wifi password is plum"}
    (first,) = rows(cluster.urls[1], "SELECT entry_id FROM entries WHERE tenant_id=%s", t)
    report = move_tenant(settings, t, 1, echo=lambda _: None)  # resumed
    with PostgresStore(s1.database_url, s1.db_app_role) as store:
        factories.drain(factories.ingest_worker(s1, c1, store), "c")
    appended = [f for _, f in c1.xrange(s1.turns_stream) if f[b"tenant_id"] == t.encode()]
    assert len(appended) == 2, f"{len(appended)} copies of 2 pending messages on the target ({report.line()})"
    assert rows(cluster.urls[1], "SELECT count(*) FROM dead_letters WHERE tenant_id=%s", t) == [(1,)]
    assert rows(cluster.urls[1], "SELECT entry_id FROM entries WHERE tenant_id=%s", t) == [first]
