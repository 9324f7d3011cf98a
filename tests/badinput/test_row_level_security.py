"""Tenant isolation below the application: Postgres row-level security, and metric labels.

The queries run as the non-superuser app role (``SET ROLE mnemos_app``, exactly what the store's
connections do), scoped to the wrong tenant, and must see, change and count nothing of the other
tenant. The metric test exercises all three workers and then reads every sample of their
registries: no label may carry a tenant id or text.
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from api.schemas import Outcome, PoolRow, RetrievalRequest
from mnemos.rerank import FakeReranker
from tests.badinput.harness import (
    entries,
    ingest_worker,
    publish,
    query_service,
    run_loop_until,
    suppression_worker,
    turn,
    turn_ids,
    wire_fields,
)
from workers.runtime.metrics import STAGES
from workers.runtime.streams import StreamSampler
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

TENANT_A = "tenant-aurora-7f3a"
TENANT_B = "tenant-boreal-91c2"
TENANT_TABLES = ("tenants", "entries", "suppression", "centroids", "query_buffer", "applied_outcomes")


@pytest.fixture
def populated(settings: Settings, redis_client, store: PostgresStore) -> Settings:
    """Both tenants with entries, a suppression row, a ledger row, a buffered query and centroids each."""
    settings = settings.replace(clusters_k=2, bootstrap_factor=1)
    for tenant in (TENANT_A, TENANT_B):
        publish(settings, redis_client, [turn(tenant, f"u{i}", f"{tenant} private memory number {i} zebra")
                                         for i in range(3)])
        redis_client.xadd(settings.turns_stream, {  # refused by the worker: a dead letter with the tenant
            **wire_fields(settings, redis_client, turn(tenant, "bad", "private zebra")), "text": " "})
    assert run_loop_until(ingest_worker(settings, redis_client, store),
                          lambda: len(turn_ids(store, TENANT_A)) == len(turn_ids(store, TENANT_B)) == 3)
    worker = suppression_worker(settings, redis_client, store)
    for tenant in (TENANT_A, TENANT_B):
        ids = [r[0] for r in entries(store, tenant)]
        for n in range(2):
            embedding = tuple(1.0 if j == n else 0.0 for j in range(64))
            redis_client.xadd(settings.outcomes_stream, Outcome(
                f"o{n}", tenant, 0, 3, (PoolRow(ids[0], 1, 3, -1.0), PoolRow(ids[1], 2, 1, 1.0),
                                        PoolRow(ids[2], 3, 2, 0.0)), query_embedding=embedding).to_stream_fields())
    assert run_loop_until(worker, lambda: worker.metrics.suppression_applied._value.get() == 4)
    return settings


@pytest.fixture
def app_conn(populated: Settings) -> Iterator[psycopg.Connection]:
    """A connection as the app role (no tenant chosen yet), autocommit off."""
    with psycopg.connect(populated.database_url) as conn:
        conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(populated.db_app_role)))
        conn.commit()  # session-level: survives the rollbacks below
        yield conn


def scope(conn: psycopg.Connection, tenant: str) -> None:
    conn.execute("SELECT set_config('mnemos.tenant_id', %s, true)", (tenant,))


def test_every_tenant_table_has_rows_of_both_tenants_for_the_superuser(populated: Settings) -> None:
    """The control experiment: the rows exist; only the policies hide them."""
    with psycopg.connect(populated.database_url) as conn:
        for table in TENANT_TABLES:
            tenants = {r[0] for r in conn.execute(sql.SQL("SELECT DISTINCT tenant_id FROM {}").format(
                sql.Identifier(table)))}
            assert tenants == {TENANT_A, TENANT_B}, table


@pytest.mark.parametrize("table", TENANT_TABLES)
def test_a_query_with_the_wrong_tenant_returns_zero_rows(app_conn: psycopg.Connection, table: str) -> None:
    scope(app_conn, TENANT_B)
    rows = app_conn.execute(sql.SQL("SELECT * FROM {} WHERE tenant_id = %s").format(sql.Identifier(table)),
                            (TENANT_A,)).fetchall()
    assert rows == []
    tenants = {r[0] for r in app_conn.execute(sql.SQL("SELECT tenant_id FROM {}").format(sql.Identifier(table)))}
    assert tenants == {TENANT_B}


@pytest.mark.parametrize("table", TENANT_TABLES)
def test_without_a_tenant_nothing_is_visible(app_conn: psycopg.Connection, table: str) -> None:
    count = app_conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()[0]
    assert count == 0


def test_the_wrong_tenant_can_neither_change_nor_delete(app_conn: psycopg.Connection) -> None:
    scope(app_conn, TENANT_B)
    assert app_conn.execute("UPDATE entries SET text = 'pwned' WHERE tenant_id = %s", (TENANT_A,)).rowcount == 0
    assert app_conn.execute("DELETE FROM suppression WHERE tenant_id = %s", (TENANT_A,)).rowcount == 0
    assert app_conn.execute("UPDATE tenants SET memory_version = 0 WHERE tenant_id = %s", (TENANT_A,)).rowcount == 0


def test_the_wrong_tenant_cannot_insert_rows_of_another(app_conn: psycopg.Connection) -> None:
    scope(app_conn, TENANT_B)
    with pytest.raises(psycopg.errors.InsufficientPrivilege, match="row-level security"):
        app_conn.execute("INSERT INTO tenants (tenant_id, rendering_version) VALUES (%s, 1)", ("tenant-injected",))


def test_the_app_role_cannot_switch_the_policies_off(app_conn: psycopg.Connection) -> None:
    app_conn.execute("SET row_security = off")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app_conn.execute("SELECT count(*) FROM entries").fetchone()
    app_conn.rollback()
    assert app_conn.execute("SELECT current_user").fetchone()[0] == "mnemos_app"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        app_conn.execute("ALTER TABLE entries DISABLE ROW LEVEL SECURITY")


def test_the_app_role_is_not_privileged_and_the_store_uses_it(populated: Settings, store: PostgresStore) -> None:
    with store.tenant_tx(TENANT_A) as conn:
        user = conn.execute("SELECT current_user").fetchone()[0]
        super_, bypass = conn.execute("SELECT rolsuper, rolbypassrls FROM pg_roles WHERE rolname = current_user"
                                      ).fetchone()
    assert (user, super_, bypass) == (populated.db_app_role, False, False)


def test_every_table_with_a_tenant_column_forces_a_policy(populated: Settings) -> None:
    with psycopg.connect(populated.database_url) as conn:
        tables = [r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.columns WHERE table_schema = 'public'"
            " AND column_name = 'tenant_id' ORDER BY 1")]
        for table in tables:
            enabled, forced = conn.execute("SELECT relrowsecurity, relforcerowsecurity FROM pg_class"
                                           " WHERE oid = %s::regclass", (table,)).fetchone()
            policies = conn.execute("SELECT count(*) FROM pg_policies WHERE tablename = %s", (table,)).fetchone()[0]
            assert (table, enabled, forced, policies > 0) == (table, True, True, True)
    assert set(TENANT_TABLES) <= set(tables)


def test_dead_letters_of_one_tenant_are_not_readable_under_another(populated: Settings, store: PostgresStore) -> None:
    """Dead letters keep a tenant's refused text: a session scoped to B must not read A's."""
    with store.tenant_tx(TENANT_B) as conn:
        rows = conn.execute("SELECT payload FROM dead_letters WHERE tenant_id = %s", (TENANT_A,)).fetchall()
    assert rows == []


def test_the_tenant_scope_ends_with_its_transaction(populated: Settings) -> None:
    with PostgresStore(populated.database_url, populated.db_app_role, max_size=1) as one:
        with one.tenant_tx(TENANT_A) as conn:
            assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 3
        with one.plain_tx() as conn:  # the same pooled connection, no tenant
            assert conn.execute("SELECT count(*) FROM entries").fetchone()[0] == 0
        with one.tenant_tx(TENANT_B) as conn:
            assert {r[0] for r in conn.execute("SELECT tenant_id FROM entries")} == {TENANT_B}


# --- metric labels --------------------------------------------------------------------------------

ALLOWED_LABELS = {"reason", "status", "stage", "stream", "group", "queue", "worker", "le",  # le: histogram buckets
                  "tool", "outcome"}  # the MCP server's tool calls: its four tool names (or unknown), ok / tool_error


def test_tenant_ids_and_text_never_appear_in_metric_labels(populated: Settings, redis_client, store: PostgresStore) -> None:
    settings = populated
    ingest = ingest_worker(settings, redis_client, store)
    publish(settings, redis_client, [turn(TENANT_A, "late", "zebra crossing near the aurora office"),
                                     turn(TENANT_A, "u0", "conflicting zebra")])
    redis_client.xadd(settings.turns_stream, {
        **wire_fields(settings, redis_client, turn(TENANT_B, "late", "private zebra")), "text": " "})
    assert run_loop_until(ingest, lambda: "late" in turn_ids(store, TENANT_A), name="metrics")
    query = query_service(settings, redis_client, store, FakeReranker())
    for tenant in (TENANT_A, TENANT_B, "tenant-unknown-55aa"):
        query.answer(RetrievalRequest(tenant, "zebra private memory", k=5))
    with pytest.raises(ValueError):
        query.handle_payload({"v": 1, "tenant_id": TENANT_A, "query": " "})
    suppress = suppression_worker(settings, redis_client, store)
    assert run_loop_until(suppress, lambda: True, name="metrics")
    registries = [ingest.metrics.registry, query.metrics.registry, suppress.metrics.registry]
    for metrics in (ingest.metrics, query.metrics, suppress.metrics):
        StreamSampler(redis_client, metrics, [(settings.turns_stream, "ingest"),
                                              (settings.outcomes_stream, "suppression")],
                      [settings.queue_name], 60.0).sample()
        metrics.worker_up.labels(worker="ingest").set(1)
    forbidden = [TENANT_A, TENANT_B, "tenant-unknown-55aa", "zebra", "aurora", "private"]
    seen_values: dict[str, set[str]] = {}
    n_samples = 0
    for registry in registries:
        for family in registry.collect():
            for sample in family.samples:
                n_samples += 1
                assert set(sample.labels) <= ALLOWED_LABELS, (sample.name, sample.labels)
                for name, value in sample.labels.items():
                    seen_values.setdefault(name, set()).add(value)
                    assert not any(word in value for word in forbidden), (sample.name, name, value)
    assert n_samples > 50
    assert seen_values["stage"] <= set(STAGES) | {"encode"}
    assert seen_values["status"] <= {"ok", "error"}
    assert {"empty_text", "turn_id_conflict"} <= seen_values["reason"]
