"""Client-side validation: every refusal is a typed error with a stable reason (no server needed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from api import InvalidInputError, Limits, Reason, RetrievalRequest, Turn
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
