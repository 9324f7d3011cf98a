"""A fact said past the bi-encoder's window is stored and found (real Redis, Postgres and bi-encoder).

The bundled all-MiniLM-L6-v2 reads 256 word pieces: two long turns that share those and differ
only at the end embed alike (cosine 1.0). The ingest worker must keep the second one as its own
entry (the dedupe guard compares the words the encoder did not read), with a warm cache of
canonical entries, a cold one (loaded from Postgres) and within one batch, and a query must
return its text.
"""

from __future__ import annotations

import pytest
import redis

from mnemos.rendering import render_turn
from tests.integration import factories
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILLER = ("We spent most of the afternoon walking along the river and talking about the garden, the weather "
          "and the old house. ") * 12
FIRST = FILLER + "That was all."
SECOND = FILLER + "Oh, and the vault access phrase is purple harmonica sunrise."


def _canonical_of(store: PostgresStore, tenant: str) -> dict[str, int | None]:
    with store.tenant_tx(tenant) as conn:
        rows = conn.execute("SELECT turn_id, canonical_entry_id, encoder_truncated FROM entries").fetchall()
    assert all(cut for _, _, cut in rows), rows  # every turn here is longer than the window
    return {turn_id: canonical for turn_id, canonical, _ in rows}


def test_a_fact_past_the_encoder_window_is_stored_and_retrieved(settings: Settings, redis_client: redis.Redis,
                                                                store: PostgresStore) -> None:
    settings = settings.replace(bi_encoder="bundled")
    client = factories.client_for(settings, redis_client)
    warm = factories.ingest_worker(settings, redis_client, store)
    vectors = warm.encoder.encode([render_turn("user", FIRST), render_turn("user", SECOND)])
    assert float(vectors[0] @ vectors[1]) >= settings.dedupe_threshold  # the embeddings cannot tell them apart

    client.publish_turns([factories.turn("batch", "first", FIRST),
                          factories.turn("batch", "second", SECOND, minutes=1)])
    factories.drain(warm, "w")
    for tenant in ("warm", "cold"):
        client.publish_turn(factories.turn(tenant, "first", FIRST))
    factories.drain(warm, "w")
    client.publish_turns([factories.turn("warm", "second", SECOND, minutes=1),
                          factories.turn("warm", "again", FIRST, minutes=2)])
    factories.drain(warm, "w")
    client.publish_turns([factories.turn("cold", "second", SECOND, minutes=1),
                          factories.turn("cold", "again", FIRST, minutes=2)])
    # the fresh worker reads the canonical entries from Postgres
    factories.drain(factories.ingest_worker(settings, redis_client, store), "fresh")

    for tenant in ("batch", "warm", "cold"):
        canonical_of = _canonical_of(store, tenant)
        assert canonical_of["first"] is None and canonical_of["second"] is None, tenant
    for tenant in ("warm", "cold"):  # the same long turn again is still a duplicate
        with store.tenant_tx(tenant) as conn:
            first_id = conn.execute("SELECT entry_id FROM entries WHERE turn_id = 'first'").fetchone()[0]
        assert _canonical_of(store, tenant)["again"] == first_id, tenant

    service = factories.query_service(settings, redis_client, store)
    for tenant in ("batch", "warm", "cold"):
        result = factories.answered_by_worker(settings, redis_client, service, client.retrieve, tenant,
                                              "What is the vault access phrase?", k=2)
        top = result.hits[0]
        assert top.turn_id == "second" and top.text.endswith("purple harmonica sunrise."), (tenant, result.hits)
