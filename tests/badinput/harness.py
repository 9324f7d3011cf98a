"""Helpers of the bad-input, public-report and isolation tests: the integration suite's builders
(tests/integration/factories.py), the bounded wait of tests/support.py, the consumer loop in a
thread and readers of what the workers stored.

Workers run in-process here (fake models, a fresh metrics registry each); the stream workers run
their real consumer loop (:func:`workers.runtime.streams.run_consumer`) in a thread, so a message that
wedges the loop shows up as a bounded wait that never completes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
import redis

from tests.integration.factories import client_for, ingest_worker, query_service, suppression_worker, turn
from tests.support import pending, run_loop_until, wait_for
from workers.settings import Settings
from workers.store import PostgresStore

__all__ = ["client_for", "dead_letters", "entries", "ingest_worker", "pending", "publish", "query_service", "reasons",
           "run_loop_until", "suppression_rows", "suppression_worker", "turn", "turn_ids", "wait_for", "wire_fields"]


def wire_fields(settings: Settings, connection: redis.Redis, value: dict[str, Any]) -> dict[str, str]:
    """The stream fields a well-behaved client would XADD for ``value`` (the base of raw edits)."""
    return client_for(settings, connection).make_turn(value).to_stream_fields()


def entries(store: PostgresStore, tenant: str) -> list[tuple]:
    """``(entry_id, turn_id, text, canonical_entry_id)`` of ``tenant``, by entry id."""
    with store.tenant_tx(tenant) as conn:
        return conn.execute("SELECT entry_id, turn_id, text, canonical_entry_id FROM entries"
                            " WHERE tenant_id = %s ORDER BY entry_id", (tenant,)).fetchall()


def turn_ids(store: PostgresStore, tenant: str) -> list[str]:
    return [row[1] for row in entries(store, tenant)]


def dead_letters(store: PostgresStore) -> list[tuple]:
    """``(stream, reason, detail, tenant_id, turn_id, payload)`` of every dead letter, in order.

    Read as the login role (the table owner), as an operator would: the app role only sees the
    letters of the tenant its transaction is scoped to.
    """
    with psycopg.connect(store.database_url) as conn:
        return conn.execute("SELECT stream, reason, detail, tenant_id, turn_id, payload FROM dead_letters"
                            " ORDER BY dead_letter_id").fetchall()


def reasons(store: PostgresStore) -> list[str]:
    return [row[1] for row in dead_letters(store)]


def suppression_rows(store: PostgresStore, tenant: str) -> dict[tuple[int, int], float]:
    with store.tenant_tx(tenant) as conn:
        rows = conn.execute("SELECT entry_id, cluster, score FROM suppression WHERE tenant_id = %s",
                            (tenant,)).fetchall()
    return {(int(e), int(c)): float(s) for e, c, s in rows}


def publish(settings: Settings, connection: redis.Redis, turns: Sequence[dict[str, Any]]) -> list[str]:
    return client_for(settings, connection).publish_turns(turns)
