"""Bad-input catalogue for the suppression worker: malformed outcomes on ``<prefix>:outcomes``.

Each bad outcome is XADDed raw, followed by a good one; the worker's real consumer loop must
dead-letter the bad one with a clear reason and go on to apply the good one (bounded wait), and
the scores must be exactly those of the good outcome.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
import redis

from api.errors import Reason
from api.schemas import Outcome, PoolRow
from mnemos.suppression import UpdateRule, outcome_deltas
from tests.badinput.harness import (
    dead_letters,
    ingest_worker,
    publish,
    reasons,
    run_loop_until,
    suppression_rows,
    suppression_worker,
    turn,
    turn_ids,
)
from workers.runtime.wire import outcome_record
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

TENANT = "acme"


def seed_entries(settings: Settings, connection: redis.Redis, store: PostgresStore, tenant: str = TENANT) -> list[int]:
    publish(settings, connection, [turn(tenant, f"{tenant}-{i}", text, minutes=i) for i, text in enumerate(
        ["the red kite nests in the old oak", "my dentist moved to Elm Street", "we sold the blue canoe"])])
    assert run_loop_until(ingest_worker(settings, connection, store), lambda: len(turn_ids(store, tenant)) == 3)
    with store.tenant_tx(tenant) as conn:
        return [int(r[0]) for r in conn.execute("SELECT entry_id FROM entries ORDER BY entry_id")]


def good_outcome(ids: list[int], outcome_id: str = "good-after", tenant: str = TENANT) -> Outcome:
    pool = (PoolRow(ids[0], 1, 3, -1.0), PoolRow(ids[1], 2, 1, 2.0), PoolRow(ids[2], 3, 2, 0.5))
    return Outcome(outcome_id, tenant, 0, 3, pool)


def applied(store: PostgresStore, tenant: str = TENANT) -> list[str]:
    with store.tenant_tx(tenant) as conn:
        return [r[0] for r in conn.execute("SELECT outcome_id FROM applied_outcomes ORDER BY outcome_id")]


def feed(settings: Settings, connection: redis.Redis, store: PostgresStore, ids: list[int], *bad: dict[Any, Any]):
    for fields in bad:
        connection.xadd(settings.outcomes_stream, fields)
    connection.xadd(settings.outcomes_stream, good_outcome(ids).to_stream_fields())
    worker = suppression_worker(settings, connection, store)
    done = run_loop_until(worker, lambda: "good-after" in applied(store), timeout_s=10.0)
    assert done, f"the suppression worker did not go on to the next good outcome; dead letters: {reasons(store)}"
    expected = outcome_deltas(outcome_record(good_outcome(ids)), UpdateRule.RANK_GAP, settings.eta)
    cluster_0 = {key: s for key, s in suppression_rows(store, TENANT).items() if key[1] == 0}
    assert cluster_0 == pytest.approx(expected)  # the good outcome applied, nothing of the bad one
    return worker


def body(ids: list[int], **changes: Any) -> dict[str, str]:
    fields = good_outcome(ids, "bad").to_stream_fields()
    data = json.loads(fields["outcome"])
    data.update(changes)
    return {**fields, "outcome": json.dumps(data)}


def one_letter(store: PostgresStore, reason: Reason) -> tuple:
    letters = dead_letters(store)
    assert [row[1] for row in letters] == [reason.value], letters
    return letters[0]


def test_outcome_body_is_not_json(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {"v": "1", "tenant_id": TENANT, "outcome": "{broken"})
    letter = one_letter(store, Reason.MALFORMED_MESSAGE)
    assert letter[0] == settings.outcomes_stream


def test_outcome_without_fields_it_needs(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {"v": "1", "outcome": good_outcome(ids).to_stream_fields()["outcome"]},
         {"v": "1", "tenant_id": TENANT})
    assert reasons(store) == [Reason.MALFORMED_MESSAGE.value] * 2


def test_outcome_with_unknown_version(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {**good_outcome(ids, "v9").to_stream_fields(), "v": "9"})
    one_letter(store, Reason.UNSUPPORTED_VERSION)
    assert "v9" not in applied(store)


def test_outcome_with_invalid_utf8(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {**good_outcome(ids, "u").to_stream_fields(), "tenant_id": b"\xff\xfe"})
    assert reasons(store) in ([Reason.MALFORMED_MESSAGE.value], [Reason.INVALID_UTF8.value])


@pytest.mark.parametrize("pool", [[[1, 0, 1, 0.5]], [[1, 1, 9, 0.5]], [[1, -3, 1, 0.5]]])
def test_outcome_with_ranks_outside_the_pool(settings, redis_client, store, pool) -> None:
    ids = seed_entries(settings, redis_client, store)
    pool = [[ids[0], *row[1:]] for row in pool]
    feed(settings, redis_client, store, ids, body(ids, pool=pool, pool_size=1))
    letter = one_letter(store, Reason.MALFORMED_MESSAGE)
    assert "rank" in letter[2]
    assert "bad" not in applied(store)


@pytest.mark.parametrize("score", ["NaN", "Infinity"])
def test_outcome_with_a_non_finite_rerank_score(settings, redis_client, store, score: str) -> None:
    ids = seed_entries(settings, redis_client, store)
    fields = body(ids)
    fields["outcome"] = fields["outcome"].replace("-1.0", score, 1)  # first pool row's logit
    assert score in fields["outcome"]
    feed(settings, redis_client, store, ids, fields)
    one_letter(store, Reason.MALFORMED_MESSAGE)
    scores = suppression_rows(store, TENANT)
    assert all(math.isfinite(s) for s in scores.values())


def test_outcome_with_an_empty_tenant_id(settings, redis_client, store) -> None:
    """A deterministic refusal must not be mistaken for an outage (the loop would retry it forever)."""
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {**good_outcome(ids, "e").to_stream_fields(), "tenant_id": ""})
    one_letter(store, Reason.MALFORMED_MESSAGE)


def test_outcome_with_a_nul_in_its_tenant_id(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, {**good_outcome(ids, "n").to_stream_fields(), "tenant_id": "ac\x00me"})
    assert reasons(store) in ([Reason.MALFORMED_MESSAGE.value], [Reason.CONTROL_CHARACTERS.value])


@pytest.mark.parametrize("outcome_id", [17, ["r1"], None])
def test_outcome_whose_id_is_not_a_string(settings, redis_client, store, outcome_id: Any) -> None:
    # found by a break-it session: a number or a list became the text "17" or "['r1']" in the ledger
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, body(ids, outcome_id=outcome_id))
    assert "outcome_id must be a string" in one_letter(store, Reason.MALFORMED_MESSAGE)[2]
    assert applied(store) == ["good-after"]


def test_outcome_with_a_cluster_beyond_int32(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, body(ids, cluster=2**40))
    one_letter(store, Reason.MALFORMED_MESSAGE)


def test_outcome_with_an_entry_id_beyond_bigint(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    feed(settings, redis_client, store, ids, body(ids, pool=[[2**70, 1, 2, -1.0], [ids[1], 2, 1, 1.0]], pool_size=2))
    assert reasons(store) in ([], [Reason.MALFORMED_MESSAGE.value])
    assert set(suppression_rows(store, TENANT)) <= {(i, 0) for i in ids}


def test_outcome_naming_another_tenants_entries_suppresses_nothing_there(settings, redis_client, store) -> None:
    ids = seed_entries(settings, redis_client, store)
    other = seed_entries(settings, redis_client, store, tenant="rival")
    hostile = Outcome("hostile", TENANT, 0, 3, (PoolRow(other[0], 1, 3, -2.0), PoolRow(other[1], 2, 1, 1.0),
                                                  PoolRow(ids[2], 3, 2, 0.0)))
    feed(settings, redis_client, store, ids, hostile.to_stream_fields())
    assert suppression_rows(store, "rival") == {}
    assert all(entry in ids for entry, _ in suppression_rows(store, TENANT))


def test_outcome_with_duplicate_pool_rows_is_summed_once(settings, redis_client, store) -> None:
    """Two rows for one entry must not make Postgres touch the same row twice in one statement."""
    ids = seed_entries(settings, redis_client, store)
    twice = Outcome("twice", TENANT, 1, 3, (PoolRow(ids[0], 1, 3, -1.0), PoolRow(ids[0], 2, 3, -1.0),
                                            PoolRow(ids[1], 3, 1, 1.0)))
    feed(settings, redis_client, store, ids, twice.to_stream_fields())
    assert dead_letters(store) == []
    expected = outcome_deltas(outcome_record(twice), UpdateRule.RANK_GAP, settings.eta)
    rows = suppression_rows(store, TENANT)
    assert rows[(ids[0], 1)] == pytest.approx(expected[(ids[0], 1)])
