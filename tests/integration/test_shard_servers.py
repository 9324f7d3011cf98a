"""Three shards, each on its own servers (MNEMOS_SHARD_MAP; docs/scaling.md "Shards on their own servers").

Three throwaway ``redis-server`` processes on spare ports and three Postgres databases (standing in
for three servers): ``migrate_shards`` migrates each; every tenant's turns are published to, ingested
from and answered on its shard's Redis and Postgres only, so no key or row of a tenant appears on
another shard's servers; with one shard's Redis stopped, that shard's tenants get a fast
:class:`ShardUnavailable` naming it while the other two shards still publish and answer. A shard
whose Postgres cannot be reached fails ``migrate`` by name, after the others were migrated; with one
shard's Postgres refusing connections, that shard's retrievals fail as :class:`RetrievalFailed`
naming the shard, and the other shards answer.
Skipped when ``redis-server`` is not installed.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest
import redis
from psycopg import sql

from api.errors import RetrievalFailed, ShardUnavailable
from bench.faults.servers import spare_port
from bench.faults.shards import shard_tenants
from tests.integration.factories import (
    conversation_turns,
    drain,
    ingest_worker,
    query_service,
    retrieve_on_shard,
    sharded_client,
)
from tests.support import (
    PG_ADMIN_URL,
    ShardCluster,
    postgres_tenants,
    redis_tenants,
    shard_cluster,
    shard_map_json,
)
from workers.ops.migrate import migrate_shards
from workers.runtime.errors import MigrationError
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration
SHARDS = 3


Cluster = ShardCluster


@pytest.fixture
def cluster(settings: Settings, tmp_path: Path) -> Iterator[Cluster]:
    with shard_cluster(settings, tmp_path, SHARDS) as value:
        yield value





def test_every_shard_s_tenants_live_and_are_answered_on_its_own_servers(cluster: Cluster) -> None:
    settings = cluster.settings
    lines: list[str] = []
    assert migrate_shards(settings, echo=lines.append) == [0, 1, 2]
    assert [line.split("): ", 1)[0] for line in lines] == [f"shard {n} ({url}" for n, url in
                                                           enumerate(cluster.database_urls)]
    assert all("applied 0001" in line for line in lines)
    lines.clear()
    migrate_shards(settings, echo=lines.append)
    assert all(line.endswith("up to date") for line in lines)

    by_shard = shard_tenants(per_shard=2, shards=SHARDS)
    client = sharded_client(settings)
    turns = [t for tenant in itertools.chain(*by_shard.values()) for t in conversation_turns(tenant, f"{tenant}-")]
    client.publish_turns(turns)
    with ExitStack() as stack:
        services = {}
        for shard in range(SHARDS):
            own = settings.for_shard(shard)
            connection, store = client.connections[shard], stack.enter_context(
                PostgresStore(own.database_url, own.db_app_role))
            assert drain(ingest_worker(own, connection, store), name=f"ingest-{shard}") == 16
            services[shard] = query_service(own, connection, store)
        for tenant in itertools.chain(*by_shard.values()):
            hits = retrieve_on_shard(client, tenant, services[client.shard_of(tenant)])
            assert hits and all(h.startswith(f"{tenant}-") for h in hits)
    for shard in range(SHARDS):  # turns, outcomes, entries, tenants, suppression inputs: on its shard only
        assert redis_tenants(client.connections[shard]) == set(by_shard[shard])
        assert postgres_tenants(cluster.database_urls[shard]) == set(by_shard[shard])

    cluster.servers[1].stop()  # one shard's Redis down: its tenants fail fast, by name; the others answer
    down = by_shard[1][0]
    started = time.monotonic()
    with pytest.raises(ShardUnavailable, match="shard 1 is unavailable") as caught:
        client.publish_turn(conversation_turns(down, "late-")[0])
    assert caught.value.shard == 1
    with pytest.raises(ShardUnavailable, match="shard 1 is unavailable"):
        client.retrieve(down, "cello teacher", 3)
    assert time.monotonic() - started < 5.0
    with ExitStack() as stack:
        for shard in (0, 2):
            own = settings.for_shard(shard)
            store = stack.enter_context(PostgresStore(own.database_url, own.db_app_role))
            tenant = by_shard[shard][0]
            client.publish_turn(conversation_turns(tenant, "late-")[0])
            assert drain(ingest_worker(own, client.connections[shard], store), name=f"ingest-{shard}") == 1
            hits = retrieve_on_shard(client, tenant, query_service(own, client.connections[shard], store))
            assert hits and all(h.startswith((f"{tenant}-", "late-")) for h in hits)


def test_migrate_names_the_unreachable_shard_and_the_ones_it_migrated(cluster: Cluster) -> None:
    closed = f"postgresql://postgres@127.0.0.1:{spare_port()}/mnemos_unreachable"
    urls = [cluster.database_urls[0], closed, cluster.database_urls[2]]
    settings = cluster.settings.replace(shard_map=shard_map_json([s.url for s in cluster.servers], urls))
    lines: list[str] = []
    with pytest.raises(MigrationError, match=r"migration failed on shard 1 \(.*\); migrated: shard 0, shard 2"):
        migrate_shards(settings, echo=lines.append)
    assert "FAILED" in lines[1] and "applied 0001" in lines[0] and "applied 0001" in lines[2]
    lines.clear()
    assert migrate_shards(settings, [2], echo=lines.append) == [2]
    assert lines == [f"shard 2 ({urls[2]}): up to date"]


def test_the_cli_migrates_checks_and_forgets_on_each_shard_s_servers(cluster: Cluster) -> None:
    from click.testing import CliRunner

    from workers.cli import cli

    settings = cluster.settings
    assert settings.shard_map is not None
    env = {"MNEMOS_SHARDS": str(SHARDS), "MNEMOS_SHARD_MAP": settings.shard_map,
           "MNEMOS_STREAM_PREFIX": settings.stream_prefix, "MNEMOS_QUEUE_NAME": settings.queue_name}
    migrated = CliRunner().invoke(cli, ["migrate"], env=env)
    assert migrated.exit_code == 0, migrated.output
    assert [line.split(" (", 1)[0] for line in migrated.output.splitlines()] == [f"shard {n}" for n in range(SHARDS)]
    health = CliRunner().invoke(cli, ["health", "--no-models", "--all-shards"], env=env)
    assert health.exit_code == 0, health.output
    for shard, server in enumerate(cluster.servers):
        assert f"ok   shard {shard} redis: redis://127.0.0.1:{server.port}/0" in health.output
        assert f"ok   shard {shard} postgres: {cluster.database_urls[shard]}" in health.output
    tenant = shard_tenants(per_shard=1, shards=SHARDS)[2][0]
    forgot = CliRunner().invoke(cli, ["forget", "--tenant", tenant], env=env)
    assert forgot.exit_code == 0, forgot.output
    streams = [redis.Redis(port=s.port).xlen(settings.for_shard(n).turns_stream) for n, s in enumerate(cluster.servers)]
    assert streams == [0, 0, 1]
    repeated = json.loads(settings.shard_map)
    repeated["1"]["redis_url"] = repeated["0"]["redis_url"]
    refused = CliRunner().invoke(cli, ["health"], env={**env, "MNEMOS_SHARD_MAP": json.dumps(repeated)})
    assert refused.exit_code == 2 and "shards 0 and 1 the same redis_url" in refused.output


def _refuse_connections(url: str, refuse: bool) -> None:
    """Stand in for a Postgres server that is down: its database takes no connection (those open are ended)."""
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
            sql.Identifier(name), sql.SQL("false" if refuse else "true")))
        if refuse:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))


def test_one_shard_s_postgres_down_fails_only_its_retrievals_by_name(cluster: Cluster) -> None:
    settings = cluster.settings.replace(retrieve_timeout_s=20.0)
    migrate_shards(settings, echo=lambda _: None)
    tenants = {shard: owned[0] for shard, owned in shard_tenants(per_shard=1, shards=SHARDS).items()}
    client = sharded_client(settings)
    client.publish_turns([t for tenant in tenants.values() for t in conversation_turns(tenant, f"{tenant}-")])
    with ExitStack() as stack:
        services = {}
        for shard in range(SHARDS):
            own = settings.for_shard(shard)
            store = stack.enter_context(PostgresStore(own.database_url, own.db_app_role, timeout_s=1.0))
            drain(ingest_worker(own, client.connections[shard], store), name=f"ingest-{shard}")
            services[shard] = query_service(own, client.connections[shard], store)
        _refuse_connections(cluster.database_urls[1], True)
        try:
            started = time.monotonic()
            with pytest.raises(RetrievalFailed, match="on shard 1 failed") as caught:
                retrieve_on_shard(client, tenants[1], services[1])
            assert caught.value.shard == 1 and time.monotonic() - started < 10.0
            for shard in (0, 2):
                assert retrieve_on_shard(client, tenants[shard], services[shard])
        finally:
            _refuse_connections(cluster.database_urls[1], False)
