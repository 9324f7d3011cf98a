"""Bad-input catalogue, worker side: malformed stream messages that bypassed the client.

Every test XADDs the bad message(s) raw, then one good turn, and runs the ingest worker's real
consumer loop until the good turn is stored and nothing is pending. The bad message must become
exactly one dead letter (Postgres row + copy on ``<prefix>:turns:dead``) with the right reason,
counted under that reason, and nothing else may be lost.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis

from api.errors import Reason
from tests.badinput.harness import (
    dead_letters,
    entries,
    ingest_worker,
    query_service,
    reasons,
    run_loop_until,
    turn,
    turn_ids,
    wire_fields,
)
from workers.ingest.worker import IngestWorker
from workers.runtime.dead_letters import MAX_PAYLOAD_FIELD_CHARS
from workers.settings import Settings
from workers.store import PostgresStore

pytestmark = pytest.mark.integration

TENANT = "acme"


def base(settings: Settings, connection: redis.Redis, turn_id: str = "bad") -> dict[str, Any]:
    return dict(wire_fields(settings, connection, turn(TENANT, turn_id, "a perfectly fine turn")))


def feed(settings: Settings, connection: redis.Redis, store: PostgresStore, *bad: dict[Any, Any],
         worker: IngestWorker | None = None) -> IngestWorker:
    """XADD ``bad`` raw, then one good turn; run the loop until the good turn is stored."""
    for fields in bad:
        connection.xadd(settings.turns_stream, fields)
    connection.xadd(settings.turns_stream, wire_fields(
        settings, connection, turn(TENANT, "good-after", "the next good turn arrives", minutes=5)))
    worker = worker or ingest_worker(settings, connection, store)
    done = run_loop_until(worker, lambda: "good-after" in turn_ids(store, TENANT))
    assert done, f"the worker did not go on to the next good turn; dead letters: {reasons(store)}"
    return worker


def assert_one_letter(settings: Settings, connection: redis.Redis, store: PostgresStore, worker: IngestWorker,
                      reason: Reason, *, field_hint: str | None = None) -> tuple:
    letters = dead_letters(store)
    assert [row[1] for row in letters] == [reason.value]
    assert letters[0][0] == settings.turns_stream
    if field_hint is not None:
        assert field_hint in letters[0][2]
    copies = connection.xrange(settings.dead_letter_stream)
    assert [c[1][b"reason"].decode() for c in copies] == [reason.value]
    assert worker.metrics.ingest_rejected.labels(reason=reason.value)._value.get() == 1
    assert turn_ids(store, TENANT) == ["good-after"]
    return letters[0]


@pytest.mark.parametrize("text", ["", "   \n\t "])
def test_empty_or_whitespace_text(settings, redis_client, store, text: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": text})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.EMPTY_TEXT, field_hint="text")
    assert (letter[3], letter[4]) == (TENANT, "bad")  # the letter says whose turn it was


def test_nul_in_text(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": "a\x00b"})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.CONTROL_CHARACTERS)
    assert "\x00" not in letter[5]["text"]  # Postgres cannot hold NUL: the payload keeps a marker


def test_escape_sequence_in_text(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": "\x1b[2J wipe"})
    assert_one_letter(settings, redis_client, store, worker, Reason.CONTROL_CHARACTERS)


def test_invalid_utf8_bytes_in_text(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": b"caf\xe9 \xff\xfe\xfd"})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.INVALID_UTF8, field_hint="text")
    assert letter[2].startswith("text: ") and "b'" not in letter[2]  # the field's name, not its bytes repr
    assert letter[5]["text"].startswith("caf\ufffd")  # kept, readable, with replacement characters
    assert (letter[3], letter[4]) == (TENANT, "bad")


@pytest.mark.parametrize("tenant_id", [b"acme\xc3\x28", b"acme\x00"])
def test_a_tenant_id_not_sent_as_text_names_no_tenant(settings, redis_client, store, tenant_id: bytes) -> None:
    # break-it session: the letter's tenant was the payload's copy, "acme\ufffd(" or "acme\ufffd",
    # so a real tenant of that name owned it (its forget deleted it)
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "tenant_id": tenant_id})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.INVALID_UTF8 if b"\xc3" in tenant_id
                               else Reason.CONTROL_CHARACTERS)
    assert letter[3] is None and letter[5]["tenant_id"].startswith("acme\ufffd")
    assert [c[b"tenant_id"] for _, c in redis_client.xrange(settings.dead_letter_stream)] == [b""]


def test_invalid_utf8_bytes_in_a_field_name(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), b"\xfe\xffname": "x"})
    assert_one_letter(settings, redis_client, store, worker, Reason.INVALID_UTF8)


def test_text_far_over_the_size_limit(settings, redis_client, store) -> None:
    huge = "x" * (4 * 1024 * 1024)
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": huge})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.TEXT_TOO_LARGE)
    assert str(settings.max_text_bytes) in letter[2]
    assert len(letter[5]["text"]) <= MAX_PAYLOAD_FIELD_CHARS  # the dead letter does not hold 4 MB


@pytest.mark.parametrize("field", ["tenant_id", "session_id", "turn_id", "role", "text", "occurred_at"])
def test_missing_field(settings, redis_client, store, field: str) -> None:
    fields = base(settings, redis_client)
    del fields[field]
    worker = feed(settings, redis_client, store, fields)
    assert_one_letter(settings, redis_client, store, worker, Reason.MISSING_FIELD, field_hint=field)


def test_missing_schema_version(settings, redis_client, store) -> None:
    fields = base(settings, redis_client)
    del fields["v"]
    worker = feed(settings, redis_client, store, fields)
    assert_one_letter(settings, redis_client, store, worker, Reason.UNSUPPORTED_VERSION, field_hint="missing")


@pytest.mark.parametrize("v", ["2", "0", "abc", "1.5", ""])
def test_unknown_schema_version(settings, redis_client, store, v: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "v": v})
    assert_one_letter(settings, redis_client, store, worker, Reason.UNSUPPORTED_VERSION)


def test_a_message_that_is_not_a_turn_at_all(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {"hello": "world"}, {"payload": b"\x00\x01\x02"})
    assert sorted(reasons(store)) == sorted([Reason.UNSUPPORTED_VERSION.value, Reason.UNSUPPORTED_VERSION.value])
    assert turn_ids(store, TENANT) == ["good-after"]
    assert worker.metrics.ingest_rejected.labels(reason="unsupported_version")._value.get() == 2


@pytest.mark.parametrize("kind", ["bogus", "FORGET"])
def test_a_turn_with_an_unknown_kind_is_not_stored_as_a_turn(settings, redis_client, store, kind: str) -> None:
    # found by a break-it session: a forget in the wrong case was stored as an ordinary turn
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "kind": kind})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.MALFORMED_MESSAGE)
    assert f"kind: '{kind}' is not a message kind" in letter[2]


def test_an_image_caption_with_control_characters(settings, redis_client, store) -> None:
    fields = {**base(settings, redis_client), "metadata": json.dumps({"image_caption": "a\u0007b"})}
    worker = feed(settings, redis_client, store, fields)
    assert_one_letter(settings, redis_client, store, worker, Reason.CONTROL_CHARACTERS,
                      field_hint="metadata.image_caption")


@pytest.mark.parametrize("value", ["\u200b", "\ufeff", " \u200b\u2060 "])
def test_an_id_of_invisible_characters_only(settings, redis_client, store, value: str) -> None:
    turn_id = json.loads(f'"{value}"')
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "turn_id": turn_id})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_ID, field_hint="turn_id")


@pytest.mark.parametrize("value", ["2024-02-30T10:00:00Z", "not a time", "1717070400"])
def test_malformed_timestamp(settings, redis_client, store, value: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "occurred_at": value})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_TIMESTAMP, field_hint="occurred_at")


def test_timestamp_without_zone(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "occurred_at": "2024-03-01T09:00"})
    assert_one_letter(settings, redis_client, store, worker, Reason.TIMESTAMP_WITHOUT_ZONE)


def test_far_future_timestamp(settings, redis_client, store) -> None:
    future = (datetime.now(UTC) + timedelta(days=400)).isoformat()
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "occurred_at": future})
    assert_one_letter(settings, redis_client, store, worker, Reason.TIMESTAMP_IN_FUTURE)


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00"])
def test_timestamp_past_the_calendar_edge_in_utc(settings, redis_client, store, value: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "occurred_at": value})
    assert reasons(store) in ([Reason.BAD_TIMESTAMP.value], [Reason.TIMESTAMP_IN_FUTURE.value])
    assert worker.metrics.ingest_rejected.labels(reason=Reason.PROCESSING_ERROR.value)._value.get() == 0


@pytest.mark.parametrize("value", ["{not json", "{'a': 1}", "\xff"])
def test_metadata_not_json(settings, redis_client, store, value: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "metadata": value})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_METADATA, field_hint="metadata")


@pytest.mark.parametrize("value", ["[1, 2]", "42", "\"str\"", "null"])
def test_metadata_not_an_object(settings, redis_client, store, value: str) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "metadata": value})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_METADATA)


def test_oversized_metadata(settings, redis_client, store) -> None:
    big = json.dumps({"blob": "y" * (settings.max_metadata_bytes * 4)})
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "metadata": big})
    assert_one_letter(settings, redis_client, store, worker, Reason.METADATA_TOO_LARGE)


def test_deeply_nested_metadata(settings, redis_client, store) -> None:
    feed(settings, redis_client, store, {**base(settings, redis_client), "metadata": "[" * 3000 + "]" * 3000})
    assert reasons(store) in ([Reason.BAD_METADATA.value], [Reason.METADATA_TOO_LARGE.value])


def test_metadata_with_nan(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "metadata": '{"score": NaN}'})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_METADATA)


def test_id_with_control_characters(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "turn_id": "bad\nid"})
    assert_one_letter(settings, redis_client, store, worker, Reason.CONTROL_CHARACTERS, field_hint="turn_id")


def test_tenant_id_with_a_right_to_left_override(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "tenant_id": "acme\u202egnp"})
    letter = assert_one_letter(settings, redis_client, store, worker, Reason.CONTROL_CHARACTERS,
                               field_hint="tenant_id")
    assert "U+202E" in letter[2]


def test_text_with_a_right_to_left_override_is_stored_without_it(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "text": "pay \u202eoof\u202c now"})
    assert dead_letters(store) == [] and worker.metrics.ingest_rejected.labels(
        reason=Reason.CONTROL_CHARACTERS.value)._value.get() == 0
    assert {row[1]: row[2] for row in entries(store, TENANT)}["bad"] == "pay oof now"


def test_blank_tenant_id(settings, redis_client, store) -> None:
    worker = feed(settings, redis_client, store, {**base(settings, redis_client), "tenant_id": "   "})
    assert_one_letter(settings, redis_client, store, worker, Reason.BAD_ID)


def test_duplicate_turn_id_with_different_text(settings, redis_client, store) -> None:
    first = base(settings, redis_client, "dup")
    worker = feed(settings, redis_client, store, first, {**first, "text": "a rewritten second version"})
    letters = dead_letters(store)
    assert [(r[1], r[3], r[4]) for r in letters] == [(Reason.TURN_ID_CONFLICT.value, TENANT, "dup")]
    assert letters[0][5]["text"] == "a rewritten second version"  # the refused version is kept
    stored = {row[1]: row[2] for row in entries(store, TENANT)}
    assert stored == {"dup": "a perfectly fine turn", "good-after": "the next good turn arrives"}
    assert worker.metrics.ingest_rejected.labels(reason="turn_id_conflict")._value.get() == 1


def test_duplicate_turn_id_with_different_text_in_a_later_batch(settings, redis_client, store) -> None:
    first = base(settings, redis_client, "dup")
    worker = feed(settings, redis_client, store, first)
    redis_client.xadd(settings.turns_stream, {**first, "text": "changed later"})
    redis_client.xadd(settings.turns_stream, wire_fields(settings, redis_client, turn(TENANT, "last", "last one")))
    assert run_loop_until(worker, lambda: "last" in turn_ids(store, TENANT))
    assert reasons(store) == [Reason.TURN_ID_CONFLICT.value]
    assert {row[1]: row[2] for row in entries(store, TENANT)}["dup"] == "a perfectly fine turn"


def test_duplicate_turn_id_with_the_same_content_is_a_silent_retry(settings, redis_client, store) -> None:
    first = base(settings, redis_client, "retry")
    same_instant = {**first, "occurred_at": "2024-03-01T10:00:00+01:00"}  # 09:00Z written another way
    feed(settings, redis_client, store, first, first, same_instant)
    assert dead_letters(store) == []
    assert turn_ids(store, TENANT) == ["retry", "good-after"]


def test_a_retry_with_numbers_postgres_rewrites_is_still_a_silent_retry(settings, redis_client, store) -> None:
    # found by a break-it session: jsonb gives 1.5e300 back as an integer, which was read as a conflict
    first = {**base(settings, redis_client, "big"), "metadata": json.dumps({"x": 1.5e300, "y": [0.1, 2.0, True]})}
    worker = feed(settings, redis_client, store, first)
    redis_client.xadd(settings.turns_stream, first)  # the same message again, in a later batch
    changed = {**first, "turn_id": "big2", "metadata": json.dumps({"x": 1})}
    redis_client.xadd(settings.turns_stream, changed)
    redis_client.xadd(settings.turns_stream, {**changed, "metadata": json.dumps({"x": True})})
    redis_client.xadd(settings.turns_stream, wire_fields(settings, redis_client, turn(TENANT, "last", "last one")))
    assert run_loop_until(worker, lambda: "last" in turn_ids(store, TENANT))
    letters = dead_letters(store)
    assert [(row[1], row[4]) for row in letters] == [(Reason.TURN_ID_CONFLICT.value, "big2")]  # true is not 1
    assert "metadata.x" in letters[0][2]


@pytest.mark.parametrize("value", ["x'; DROP TABLE entries; --", "' OR '1'='1", "org:1/user|2", "%", "_"])
def test_ids_with_separators_or_sql_are_stored_verbatim(settings, redis_client, store, value: str) -> None:
    fields = {**base(settings, redis_client), "tenant_id": value, "turn_id": value, "session_id": value}
    feed(settings, redis_client, store, fields)
    assert dead_letters(store) == []
    assert [(r[1], r[2]) for r in entries(store, value)] == [(value, "a perfectly fine turn")]
    assert turn_ids(store, TENANT) == ["good-after"]  # and the other tenant saw none of it


def test_unknown_extra_fields_are_ignored(settings, redis_client, store) -> None:
    feed(settings, redis_client, store, {**base(settings, redis_client, "extra"), "colour": "blue", "v2_only": "x"})
    assert dead_letters(store) == []
    assert turn_ids(store, TENANT) == ["extra", "good-after"]


@pytest.mark.parametrize("text", ["🎉🎉🎉", "?!?!...", "\u2014 \u2026"])
def test_text_that_tokenizes_to_nothing_is_stored_and_retrievable(settings, redis_client, store, text: str) -> None:
    feed(settings, redis_client, store, {**base(settings, redis_client, "symbols"), "text": text})
    assert dead_letters(store) == []
    assert [r[2] for r in entries(store, TENANT) if r[1] == "symbols"] == [text]
    result = query_service(settings, redis_client, store).answer(
        __import__("api.schemas", fromlist=["RetrievalRequest"]).RetrievalRequest(TENANT, text, k=5))
    assert "symbols" in [h.turn_id for h in result.hits]  # the dense arm still finds it


def test_many_bad_messages_interleaved_with_good_ones(settings, redis_client, store) -> None:
    good = [wire_fields(settings, redis_client, turn(TENANT, f"g{i}", f"good turn number {i} about llamas"))
            for i in range(6)]
    bad = [{**good[0], "turn_id": "b0", "text": ""}, {**good[0], "turn_id": "b1", "v": "9"},
           {**good[0], "turn_id": "b2", "occurred_at": "nope"}, {**good[0], "turn_id": "b3", "metadata": "["},
           {**good[0], "turn_id": "b4", "text": b"\xff"}, {"junk": "1"}]
    for g, b in zip(good, bad, strict=True):
        redis_client.xadd(settings.turns_stream, b)
        redis_client.xadd(settings.turns_stream, g)
    worker = ingest_worker(settings, redis_client, store)
    assert run_loop_until(worker, lambda: len(turn_ids(store, TENANT)) == 6)
    assert turn_ids(store, TENANT) == [f"g{i}" for i in range(6)]
    assert sorted(reasons(store)) == sorted(["empty_text", "unsupported_version", "bad_timestamp", "bad_metadata",
                                             "invalid_utf8", "unsupported_version"])
    assert redis_client.xlen(settings.dead_letter_stream) == 6


def test_redelivered_bad_message_is_recorded_once(settings, redis_client, store) -> None:
    """A dead letter is idempotent per stream message: processing the batch twice adds no row."""
    redis_client.xadd(settings.turns_stream, {**base(settings, redis_client), "text": ""})
    worker = ingest_worker(settings, redis_client, store)
    consumer = worker.consumer("c1")
    consumer.ensure_group()
    batch = consumer.read()
    worker.handle(batch)
    consumer.ack(worker.handle(batch))
    assert reasons(store) == [Reason.EMPTY_TEXT.value]


def test_a_stored_embedding_of_the_wrong_size_does_not_wedge_the_group(settings, redis_client, store) -> None:
    """State the worker cannot use (e.g. written under another encoder) is a per-message failure,
    dead-lettered with the reason; it is not mistaken for an outage and retried forever."""
    with psycopg.connect(settings.database_url) as conn:  # as the owner: a row from another encoder, mislabelled
        conn.execute("INSERT INTO tenants (tenant_id, rendering_version, embedding_dim) VALUES ('legacy', 1, 64)")
        conn.execute("INSERT INTO entries (tenant_id, turn_id, session_id, role, text, occurred_at, embedding)"
                     " VALUES ('legacy', 'old', 's', 'user', 'from the old encoder', now(), %s)", (b"\0" * 16,))
    redis_client.xadd(settings.turns_stream, wire_fields(settings, redis_client, turn("legacy", "new", "a new turn")))
    feed(settings, redis_client, store)
    assert reasons(store) == [Reason.PROCESSING_ERROR.value]
    assert dead_letters(store)[0][4] == "new" and "expected 64" in dead_letters(store)[0][2]


def test_the_dead_letter_stream_keeps_about_the_latest_letters(settings, redis_client, store, monkeypatch) -> None:
    # it had no bound: a producer sending malformed turns grew Redis without end, and every forget
    # reads the whole stream; the table keeps every letter
    import workers.runtime.dead_letters as dead_letters_module

    monkeypatch.setattr(dead_letters_module, "DEAD_STREAM_MAXLEN", 10)
    worker = feed(settings, redis_client, store, *({**base(settings, redis_client, f"bad-{n}"), "text": ""}
                                                   for n in range(400)))
    assert len(reasons(store)) == 400
    copies = redis_client.xrange(settings.dead_letter_stream)
    assert len(copies) < 400 and copies[-1][1][b"turn_id"] == b"bad-399"
    assert worker.metrics.ingest_rejected.labels(reason=Reason.EMPTY_TEXT.value)._value.get() == 400
