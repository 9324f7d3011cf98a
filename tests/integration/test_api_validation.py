"""Client-side validation: every refusal is a typed error with a stable reason (no server needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api import InvalidInputError, Limits, Reason, RetrievalFilters, RetrievalRequest, RetrievalTimeout, Turn
from api.forget import ForgetRequest
from api.schemas import Outcome, PoolRow

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
GOOD = {"v": 1, "tenant_id": "t", "session_id": "s", "turn_id": "x", "role": "user", "text": "hello there",
        "occurred_at": "2024-05-01T10:00:00+02:00"}


@pytest.mark.parametrize(("change", "reason"), [
    ({"text": ""}, Reason.EMPTY_TEXT),
    ({"text": " \n\t "}, Reason.EMPTY_TEXT),
    ({"text": "x" * (32 * 1024 + 1)}, Reason.TEXT_TOO_LARGE),
    ({"text": "nul\x00byte"}, Reason.CONTROL_CHARACTERS),
    ({"text": "bell\x07"}, Reason.CONTROL_CHARACTERS),
    ({"text": "lone \ud800 surrogate"}, Reason.INVALID_UTF8),
    ({"text": 42}, Reason.EMPTY_TEXT),
    ({"turn_id": None}, Reason.MISSING_FIELD),
    ({"turn_id": 7}, Reason.BAD_ID),
    ({"tenant_id": "  "}, Reason.BAD_ID),
    ({"session_id": "a\nb"}, Reason.CONTROL_CHARACTERS),
    ({"turn_id": "x" * 257}, Reason.BAD_ID),
    ({"occurred_at": "yesterday"}, Reason.BAD_TIMESTAMP),
    ({"occurred_at": "2024-05-01T10:00:00"}, Reason.TIMESTAMP_WITHOUT_ZONE),
    ({"occurred_at": "2031-01-01T00:00:00Z"}, Reason.TIMESTAMP_IN_FUTURE),
    ({"occurred_at": 1714557600}, Reason.BAD_TIMESTAMP),
    ({"v": 2}, Reason.UNSUPPORTED_VERSION),
    ({"v": "one"}, Reason.UNSUPPORTED_VERSION),
    ({"metadata": "[1, 2]"}, Reason.BAD_METADATA),
    ({"metadata": "{not json"}, Reason.BAD_METADATA),
    ({"metadata": {"blob": "y" * 9000}}, Reason.METADATA_TOO_LARGE),
])
def test_bad_turns_are_refused_with_their_reason(change: dict, reason: Reason) -> None:
    with pytest.raises(InvalidInputError) as info:
        Turn.parse({**GOOD, **change}, Limits(), NOW)
    assert info.value.reason is reason


def test_valid_turn_is_normalised_to_utc_and_round_trips_through_stream_fields() -> None:
    turn = Turn.parse({**GOOD, "turn_id": "id with ; DROP TABLE entries; --", "text": "only 🎉!!",
                       "metadata": {"source": "chat"}}, Limits(), NOW)
    assert turn.occurred_at == datetime(2024, 5, 1, 8, 0, tzinfo=UTC)
    raw = {k.encode(): v.encode() for k, v in turn.to_stream_fields().items()}
    assert Turn.from_stream_fields(raw, Limits(), NOW) == turn
    assert Turn.parse({**GOOD, "occurred_at": (NOW + timedelta(hours=1)).isoformat()}, Limits(), NOW)


@pytest.mark.parametrize(("payload", "reason"), [
    ({"query": "   "}, Reason.EMPTY_QUERY),
    ({"query": "q" * 5000}, Reason.QUERY_TOO_LARGE),
    ({"k": 0}, Reason.K_OUT_OF_RANGE),
    ({"k": 101}, Reason.K_OUT_OF_RANGE),
    ({"k": True}, Reason.K_OUT_OF_RANGE),
    ({"k": 2.5}, Reason.K_OUT_OF_RANGE),
    ({"tenant_id": None}, Reason.MISSING_FIELD),
    ({"v": 9}, Reason.UNSUPPORTED_VERSION),
])
def test_bad_requests_are_refused(payload: dict, reason: Reason) -> None:
    with pytest.raises(InvalidInputError) as info:
        RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "where", "k": 10, **payload})
    assert info.value.reason is reason


def test_outcome_round_trip_and_malformed_message() -> None:
    outcome = Outcome("o", "t", 3, 2, (PoolRow(1, 1, 2, -0.5), PoolRow(2, 2, 1, 1.5)), (0.6, 0.8))
    raw = {k.encode(): v.encode() for k, v in outcome.to_stream_fields().items()}
    assert Outcome.from_stream_fields(raw) == outcome
    with pytest.raises(InvalidInputError) as info:
        Outcome.from_stream_fields({b"v": b"1", b"tenant_id": b"t", b"outcome": b"{}"})
    assert info.value.reason is Reason.MALFORMED_MESSAGE


def test_an_outcome_carries_the_forget_version_its_retrieval_read() -> None:
    pool = (PoolRow(1, 1, 1, 0.5),)
    older = Outcome("o", "t", None, 1, pool).to_stream_fields()
    assert "forget_version" not in older["outcome"]  # an outcome without it reads as an older worker's
    for version in (0, 7):
        outcome = Outcome("o", "t", None, 1, pool, forget_version=version)
        raw = {k.encode(): v.encode() for k, v in outcome.to_stream_fields().items()}
        assert Outcome.from_stream_fields(raw).forget_version == version
    for bad in ("true", "-1", "1.5", '"3"'):
        body = f'{{"outcome_id":"o","cluster":null,"pool_size":1,"pool":[[1,1,1,0.5]],"forget_version":{bad}}}'
        with pytest.raises(InvalidInputError) as info:
            Outcome.from_stream_fields({b"v": b"1", b"tenant_id": b"t", b"outcome": body.encode()})
        assert info.value.reason is Reason.MALFORMED_MESSAGE, bad


def test_json_nested_past_the_parsers_depth_is_a_malformed_message_not_an_internal_error() -> None:
    """Break-it round 15: RecursionError escaped the parsers of outcomes and forgets, so such a raw
    message was dead-lettered as a handler failure instead of for its reason."""
    deep = ("[" * 100_000 + "]" * 100_000).encode()
    with pytest.raises(InvalidInputError) as info:
        Outcome.from_stream_fields({b"v": b"1", b"tenant_id": b"t", b"outcome": deep})
    assert info.value.reason is Reason.MALFORMED_MESSAGE and "nested too deeply" in str(info.value)
    forget = {b"v": b"1", b"kind": b"forget", b"tenant_id": b"t", b"scope": b"turns", b"turn_ids": deep}
    with pytest.raises(InvalidInputError) as info:
        ForgetRequest.from_stream_fields(forget, Limits())
    assert info.value.reason is Reason.BAD_FORGET and info.value.field == "turn_ids"


AS_OF = "2024-05-01T12:00:00+02:00"


@pytest.mark.parametrize(("payload", "reason", "field"), [
    ({"as_of": "last tuesday"}, Reason.BAD_TIMESTAMP, "as_of"),
    ({"as_of": "2024-05-01T12:00:00"}, Reason.TIMESTAMP_WITHOUT_ZONE, "as_of"),
    ({"as_of": 1714557600}, Reason.BAD_TIMESTAMP, "as_of"),
    ({"filters": ["s1"]}, Reason.BAD_FILTER, "filters"),
    ({"filters": "session_ids=s1"}, Reason.BAD_FILTER, "filters"),
    ({"filters": {"session": ["s1"]}}, Reason.BAD_FILTER, "filters"),
    ({"filters": {"session_ids": ["s1"], "tenant_id": "other"}}, Reason.BAD_FILTER, "filters"),
    ({"filters": {"session_ids": []}}, Reason.BAD_FILTER, "filters.session_ids"),
    ({"filters": {"roles": []}}, Reason.BAD_FILTER, "filters.roles"),
    ({"filters": {"session_ids": "s1"}}, Reason.BAD_FILTER, "filters.session_ids"),
    ({"filters": {"roles": {"user": True}}}, Reason.BAD_FILTER, "filters.roles"),
    ({"filters": {"session_ids": None}}, Reason.BAD_FILTER, "filters.session_ids"),
    ({"filters": {"session_ids": ["s" + str(i) for i in range(1025)]}}, Reason.BAD_FILTER, "filters.session_ids"),
    ({"filters": {"session_ids": ["s1", 7]}}, Reason.BAD_ID, "filters.session_ids[1]"),
    ({"filters": {"roles": ["  "]}}, Reason.BAD_ID, "filters.roles[0]"),
    ({"filters": {"roles": ["a\x00b"]}}, Reason.CONTROL_CHARACTERS, "filters.roles[0]"),
    ({"filters": {"session_ids": ["x" * 257]}}, Reason.BAD_ID, "filters.session_ids[0]"),
    ({"filters": {"occurred_after": "2024-05-01"}}, Reason.TIMESTAMP_WITHOUT_ZONE, "filters.occurred_after"),
    ({"filters": {"occurred_after": "soon"}}, Reason.BAD_TIMESTAMP, "filters.occurred_after"),
    ({"filters": {"occurred_after": None}}, Reason.BAD_FILTER, "filters.occurred_after"),
    ({"as_of": AS_OF, "filters": {"occurred_after": "2024-05-01T10:00:01Z"}}, Reason.BAD_FILTER,
     "filters.occurred_after"),
])
def test_bad_as_of_and_filters_are_refused(payload: dict, reason: Reason, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "where", **payload})
    assert (info.value.reason, info.value.field) == (reason, field)


def test_as_of_and_filters_parse_to_utc_and_round_trip() -> None:
    request = RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "where", "as_of": AS_OF, "filters": {
        "session_ids": ["s2", "s1", "s2"], "roles": ["user"], "occurred_after": "2024-05-01T10:00:00Z"}})
    assert request.as_of == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert request.filters == RetrievalFilters(("s2", "s1"), ("user",), datetime(2024, 5, 1, 10, 0, tzinfo=UTC))
    assert RetrievalRequest.parse(request.to_payload()) == request
    far = RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "q", "as_of": "2999-01-01T00:00:00Z"})
    assert far.as_of is not None  # no clock is read: a future as_of simply hides nothing


def test_v1_payloads_without_the_new_fields_are_unchanged() -> None:
    old = {"v": 1, "request_id": "r", "tenant_id": "t", "query": "where", "k": 10}
    request = RetrievalRequest.parse(old)
    assert (request.as_of, request.filters) == (None, None)
    assert request.to_payload() == old  # an unfiltered request sends exactly what it always sent
    for empty in ({"as_of": None}, {"filters": None}, {"filters": {}}):
        assert RetrievalRequest.parse({**old, **empty}) == request


@pytest.mark.parametrize("field", [b"text", b"tenant_id"])
def test_a_value_that_is_not_utf8_names_its_field_as_text(field: bytes) -> None:
    """The detail a dead letter keeps reads ``text: ...``, not the bytes repr ``b'text': ...``."""
    good = {k.encode(): v.encode() for k, v in GOOD.items() if k != "v"} | {b"v": b"1"}
    with pytest.raises(InvalidInputError) as info:
        Turn.from_stream_fields({**good, field: b"caf\xe9"}, Limits(), NOW)
    assert info.value.reason is Reason.INVALID_UTF8
    assert info.value.field == field.decode() and str(info.value).startswith(f"{field.decode()}: ")
    assert "b'" not in str(info.value)
    with pytest.raises(InvalidInputError) as info:
        Turn.from_stream_fields({**good, b"\xfe\xffname": b"x"}, Limits(), NOW)
    assert info.value.field == "\ufffd\ufffdname" and "b'" not in str(info.value)
    forget = {b"v": b"1", b"kind": b"forget", b"tenant_id": b"t", b"scope": b"\xff"}
    with pytest.raises(InvalidInputError) as info:
        ForgetRequest.from_stream_fields(forget, Limits())
    assert info.value.field == "scope" and "b'" not in str(info.value)


@pytest.mark.parametrize(("timeout_s", "shown"), [(0.05, "within 0.05s"), (0.004, "within 0.004s"),
                                                  (30.0, "within 30s"), (2.5, "within 2.5s")])
def test_a_timeout_message_shows_the_timeout_it_waited(timeout_s: float, shown: str) -> None:
    assert shown in str(RetrievalTimeout("r-1", timeout_s, "canceled"))


@pytest.mark.parametrize("written", ["2024-05-01t10:00:00z", "2024-05-01T10:00:00z", "2024-05-01t10:00:00Z",
                                     "2024-05-01t12:00:00+02:00"])
def test_rfc3339_lowercase_t_and_z_are_accepted(written: str) -> None:
    turn = Turn.parse({**GOOD, "occurred_at": written}, Limits(), NOW)
    assert turn.occurred_at == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    request = RetrievalRequest.parse({"v": 1, "tenant_id": "t", "query": "q", "as_of": written,
                                      "filters": {"occurred_after": written}})
    assert request.as_of == turn.occurred_at


def test_nanoseconds_are_truncated_to_microseconds_as_documented() -> None:
    """Documented in check_zoned_time and docs/architecture.md "Contracts": truncated, not rounded."""
    turn = Turn.parse({**GOOD, "occurred_at": "2024-05-01T10:00:00.123456789Z"}, Limits(), NOW)
    assert turn.occurred_at == datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)



@pytest.mark.parametrize(("tenant_id", "detail"), [
    ("jose\u0301", "NFKC"),                   # "josé" decomposed: renders as the composed "jos\u00e9"
    ("\uff41lice", "NFKC"),                   # a fullwidth "a"
    ("\ufb01ona", "NFKC"),                    # the "fi" ligature
    ("al\u200bice", "U+200B"),               # a zero-width space inside
    ("alice\u00ad", "U+00AD"),               # a soft hyphen at the end
    ("\ufeffalice\u2060", "U+2060, U+FEFF"),  # BOM and word joiner, every code point named
    ("ali\u034fce", "U+034F"),               # combining grapheme joiner (break-it session, round 2)
    ("alice\ufe00", "U+FE00"),               # a variation selector
    ("alice\u3164", "U+3164"),               # a Hangul filler
    ("alice\u2800", "U+2800"),               # the braille blank
    ("alice ", "whitespace"),                # a trailing space
    ("alice\u00a0", "whitespace"),           # a trailing no-break space
])
def test_a_turn_under_a_tenant_id_that_renders_like_another_is_refused(tenant_id: str, detail: str) -> None:
    """The tenant id is the isolation boundary: two ids that look the same never name two tenants.

    Only new memory is refused: retrievals, catalog reads and forgets still accept the id, so a
    tenant stored before the rule stays readable and erasable.
    """
    with pytest.raises(InvalidInputError) as info:
        Turn.parse({**GOOD, "tenant_id": tenant_id}, Limits(), NOW)
    assert (info.value.reason, info.value.field) == (Reason.BAD_ID, "tenant_id")
    assert detail in info.value.detail
    raw = {k.encode(): str(v).encode() for k, v in GOOD.items()} | {b"tenant_id": tenant_id.encode()}
    with pytest.raises(InvalidInputError) as info:
        Turn.from_stream_fields(raw, Limits(), NOW)  # what the ingest worker reads: a dead letter
    assert info.value.reason is Reason.BAD_ID
    assert RetrievalRequest.parse({"v": 1, "tenant_id": tenant_id, "query": "q"}).tenant_id == tenant_id
    assert ForgetRequest.parse({"v": 1, "tenant_id": tenant_id, "scope": "tenant"}, Limits()).tenant_id == tenant_id


def test_a_composed_tenant_id_and_invisible_characters_in_other_ids_are_accepted() -> None:
    """Only the tenant id has the look-alike rule; session and turn ids keep check_id's."""
    turn = Turn.parse({**GOOD, "tenant_id": "jos\u00e9", "session_id": "s\u200b1", "turn_id": "t\u00ad1"},
                      Limits(), NOW)
    assert (turn.tenant_id, turn.session_id, turn.turn_id) == ("jos\u00e9", "s\u200b1", "t\u00ad1")
