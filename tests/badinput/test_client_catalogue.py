"""Bad-input catalogue, client side: every kind is refused with a typed error before anything is sent.

The client here is bound to a Redis port nothing listens on, so a turn or request that got past
validation would surface as ``ServiceUnavailable`` instead of ``InvalidInputError``: the tests
prove both the refusal and that nothing reached the network. Accepted kinds go through
``make_turn`` (the exact value that would be sent).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from api.client import MnemosClient
from api.errors import InvalidInputError, Reason, ServiceUnavailable
from api.validation import Limits

NOW = datetime(2024, 6, 1, 12, 0, tzinfo=UTC)
LIMITS = Limits()


@pytest.fixture
def client() -> MnemosClient:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    return MnemosClient(dead, stream_prefix="mnemos_badinput_unsent", clock=lambda: NOW)


def good(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = {"tenant_id": "t1", "session_id": "s1", "turn_id": "u1", "role": "user",
                             "text": "I adopted a grey cat named Pixel", "occurred_at": "2024-05-30T10:00:00+00:00"}
    value.update(changes)
    return value


def refused(client: MnemosClient, **changes: Any) -> InvalidInputError:
    """Publish ``good(**changes)``; it must be refused before any network call."""
    with pytest.raises(InvalidInputError) as info:
        client.publish_turn(good(**changes))
    return info.value


def without(field: str) -> dict[str, Any]:
    value = good()
    del value[field]
    return value


# --- the control experiment: a valid turn is accepted and would be sent -------------------------

def test_a_valid_turn_reaches_the_network(client: MnemosClient) -> None:
    with pytest.raises(ServiceUnavailable):
        client.publish_turn(good())


# --- text ---------------------------------------------------------------------------------------

def test_empty_text(client: MnemosClient) -> None:
    exc = refused(client, text="")
    assert exc.reason is Reason.EMPTY_TEXT and exc.field == "turns[0].text"
    assert "empty" in str(exc)


@pytest.mark.parametrize("text", [" ", "   \t\n  ", "\r\n", "\u3000\u2003"])
def test_whitespace_only_text(client: MnemosClient, text: str) -> None:
    assert refused(client, text=text).reason is Reason.EMPTY_TEXT


def test_invisible_only_text_is_empty(client: MnemosClient) -> None:
    """Zero-width spaces / joiners and a BOM carry nothing: the same refusal as whitespace."""
    assert refused(client, text="\u200b\u200d\ufeff\u200b").reason is Reason.EMPTY_TEXT


@pytest.mark.parametrize("text", ["🎉🎉🙂", "?!...;;", "— … ‽"])
def test_text_that_tokenizes_to_nothing_is_accepted_verbatim(client: MnemosClient, text: str) -> None:
    assert client.make_turn(good(text=text)).text == text


def test_nul_in_text(client: MnemosClient) -> None:
    exc = refused(client, text="before\x00after")
    assert exc.reason is Reason.CONTROL_CHARACTERS and exc.field == "turns[0].text"
    assert "NUL" in exc.detail


@pytest.mark.parametrize("char", ["\x07", "\x1b", "\x7f", "\x08", "\x9b"])
def test_other_control_characters_in_text(client: MnemosClient, char: str) -> None:
    assert refused(client, text=f"red{char}[31m alert").reason is Reason.CONTROL_CHARACTERS


def test_tab_newline_and_carriage_return_are_kept(client: MnemosClient) -> None:
    text = "line one\n\tindented\r\nline three"
    assert client.make_turn(good(text=text)).text == text


def test_lone_surrogate_text_is_invalid_utf8(client: MnemosClient) -> None:
    exc = refused(client, text=json.loads('"broken \\ud800 pair"'))
    assert exc.reason is Reason.INVALID_UTF8 and exc.field == "turns[0].text"


def test_invalid_utf8_bytes_as_text_read_the_same_as_on_the_stream(client: MnemosClient) -> None:
    """The worker dead-letters these bytes as invalid_utf8; the client must give the same reason."""
    exc = refused(client, text=b"caf\xe9 \xff\xfe")
    assert exc.reason is Reason.INVALID_UTF8 and exc.field == "turns[0].text"


def test_text_far_over_the_size_limit(client: MnemosClient) -> None:
    text = "secret-payload " * 70_000  # ~1 MB
    exc = refused(client, text=text)
    assert exc.reason is Reason.TEXT_TOO_LARGE
    assert str(LIMITS.max_text_bytes) in exc.detail and str(len(text.encode())) in exc.detail
    assert "secret-payload" not in str(exc)  # the message never echoes the text


def test_text_limit_counts_utf8_bytes(client: MnemosClient) -> None:
    fits = "é" * (LIMITS.max_text_bytes // 2)  # 2 bytes each: exactly at the limit
    assert client.make_turn(good(text=fits)).text == fits
    assert refused(client, text=fits + "e").reason is Reason.TEXT_TOO_LARGE


# --- ids ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("field", ["tenant_id", "session_id", "turn_id", "role"])
def test_missing_id(client: MnemosClient, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        client.publish_turn(without(field))
    assert info.value.reason is Reason.MISSING_FIELD and info.value.field == f"turns[0].{field}"
    assert "missing" in str(info.value)


@pytest.mark.parametrize("field", ["text", "occurred_at"])
def test_missing_text_or_timestamp(client: MnemosClient, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        client.publish_turn(without(field))
    assert info.value.reason is Reason.MISSING_FIELD and info.value.field == f"turns[0].{field}"


@pytest.mark.parametrize("value", [123, 1.5, True, ["t1"], {"id": "t1"}, b"t1"])
@pytest.mark.parametrize("field", ["tenant_id", "turn_id"])
def test_non_string_id(client: MnemosClient, field: str, value: Any) -> None:
    exc = refused(client, **{field: value})
    assert exc.reason is Reason.BAD_ID and "must be a string" in exc.detail


@pytest.mark.parametrize("value", ["", " ", "\t\n"])
def test_blank_id(client: MnemosClient, value: str) -> None:
    assert refused(client, turn_id=value).reason is Reason.BAD_ID


def test_overlong_id(client: MnemosClient) -> None:
    exc = refused(client, tenant_id="x" * (LIMITS.max_id_chars + 1))
    assert exc.reason is Reason.BAD_ID and str(LIMITS.max_id_chars) in exc.detail
    assert client.make_turn(good(tenant_id="x" * LIMITS.max_id_chars)).tenant_id == "x" * LIMITS.max_id_chars


@pytest.mark.parametrize("value", ["a\x00b", "line\nbreak", "tab\there", "esc\x1b"])
def test_id_with_control_characters(client: MnemosClient, value: str) -> None:
    assert refused(client, tenant_id=value).reason is Reason.CONTROL_CHARACTERS


@pytest.mark.parametrize("char", ["\u202e", "\u202d", "\u202a", "\u2066", "\u2067", "\u2068", "\u2069",
                                  "\u200e", "\u200f", "\u061c"])
@pytest.mark.parametrize("field", ["tenant_id", "session_id", "turn_id", "role"])
def test_id_with_bidirectional_controls(client: MnemosClient, field: str, char: str) -> None:
    """An id that would read otherwise on screen than it is ("acme\u202egnp.exe") is refused."""
    exc = refused(client, **{field: f"acme{char}gnp.exe"})
    assert exc.reason is Reason.CONTROL_CHARACTERS and exc.field == f"turns[0].{field}"
    assert f"U+{ord(char):04X}" in exc.detail and "bidirectional" in exc.detail


def test_text_loses_its_bidirectional_overrides_and_keeps_its_marks(client: MnemosClient) -> None:
    """Overrides, embeddings and isolates are removed (documented in docs/architecture.md "Contracts");
    the marks right-to-left writing needs stay."""
    sent = client.make_turn(good(text="pay \u202eoof\u202c to \u2067\u05e9\u05dc\u05d5\u05dd\u2069 \u200fok"))
    assert sent.text == "pay oof to \u05e9\u05dc\u05d5\u05dd \u200fok"
    assert refused(client, text="\u202e\u2066 \u2069").reason is Reason.EMPTY_TEXT  # nothing visible is left


@pytest.mark.parametrize("value", ["org:42/user|7", "a b", "x'; DROP TABLE entries; --", "' OR '1'='1",
                                   "%_*?", "tenant\\with\\backslash", "ünïcødé-ťenant"])
def test_ids_with_separators_or_sql_are_accepted_verbatim(client: MnemosClient, value: str) -> None:
    sent = client.make_turn(good(tenant_id=value, turn_id=value, session_id=value))
    assert (sent.tenant_id, sent.turn_id, sent.session_id) == (value, value, value)


# --- timestamps ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["yesterday", "", "2024-13-01T00:00:00Z", "2024-02-30T10:00:00Z",
                                   "2024-05-30 25:61", "1717070400", 1717070400, 1717070400.5, ["2024-05-30"]])
def test_malformed_timestamp(client: MnemosClient, value: Any) -> None:
    exc = refused(client, occurred_at=value)
    assert exc.reason is Reason.BAD_TIMESTAMP and exc.field == "turns[0].occurred_at"


def test_far_future_timestamp(client: MnemosClient) -> None:
    exc = refused(client, occurred_at="2999-01-01T00:00:00Z")
    assert exc.reason is Reason.TIMESTAMP_IN_FUTURE and "future" in exc.detail
    within_skew = (NOW + timedelta(hours=23)).isoformat()
    assert client.make_turn(good(occurred_at=within_skew)).occurred_at == NOW + timedelta(hours=23)


@pytest.mark.parametrize("value", ["2024-05-30T10:00:00", "2024-05-30", datetime(2024, 5, 30, 10)])
def test_timestamp_without_zone(client: MnemosClient, value: Any) -> None:
    exc = refused(client, occurred_at=value)
    assert exc.reason is Reason.TIMESTAMP_WITHOUT_ZONE and "zone" in exc.detail


@pytest.mark.parametrize("value", ["9999-12-31T23:59:59-14:00", "0001-01-01T00:00:00+14:00",
                                   "9999-12-31T23:00:00-01:00"])
def test_timestamp_past_the_calendar_edge_in_utc(client: MnemosClient, value: str) -> None:
    """Valid ISO 8601 whose UTC form falls outside years 1..9999: a typed refusal, not OverflowError."""
    exc = refused(client, occurred_at=value)
    assert exc.reason in (Reason.BAD_TIMESTAMP, Reason.TIMESTAMP_IN_FUTURE)


def test_non_utc_offset_is_normalised_to_utc(client: MnemosClient) -> None:
    sent = client.make_turn(good(occurred_at="2024-05-30T12:30:00+02:30"))
    assert sent.occurred_at == datetime(2024, 5, 30, 10, 0, tzinfo=UTC)
    assert sent.occurred_at.utcoffset() == timedelta(0)


# --- schema version -----------------------------------------------------------------------------

@pytest.mark.parametrize("value", [2, 0, -1, "2", "abc", "1.0", 1.5, None])
def test_unknown_schema_version(client: MnemosClient, value: Any) -> None:
    exc = refused(client, v=value)
    assert exc.reason is Reason.UNSUPPORTED_VERSION and exc.field == "turns[0].v"


# --- metadata -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["{not json", "{'single': 'quotes'}", "{\"a\": }"])
def test_metadata_not_json(client: MnemosClient, value: str) -> None:
    exc = refused(client, metadata=value)
    assert exc.reason is Reason.BAD_METADATA and "JSON" in exc.detail


@pytest.mark.parametrize("value", ["[1, 2]", "3", "\"text\"", "null", [1, 2], 3.5, "true"])
def test_metadata_not_an_object(client: MnemosClient, value: Any) -> None:
    exc = refused(client, metadata=value)
    assert exc.reason is Reason.BAD_METADATA and "object" in exc.detail


def test_oversized_metadata(client: MnemosClient) -> None:
    exc = refused(client, metadata={"blob": "x" * (LIMITS.max_metadata_bytes + 1)})
    assert exc.reason is Reason.METADATA_TOO_LARGE and str(LIMITS.max_metadata_bytes) in exc.detail


def test_deeply_nested_metadata_text(client: MnemosClient) -> None:
    """6 KB of brackets: within the size limit, deeper than the JSON parser's recursion limit."""
    exc = refused(client, metadata="[" * 3000 + "]" * 3000)
    assert exc.reason in (Reason.BAD_METADATA, Reason.METADATA_TOO_LARGE)


def test_deeply_nested_metadata_object(client: MnemosClient) -> None:
    nested: dict[str, Any] = {}
    cursor = nested
    for _ in range(3000):
        cursor["a"] = {}
        cursor = cursor["a"]
    exc = refused(client, metadata=nested)
    assert exc.reason in (Reason.BAD_METADATA, Reason.METADATA_TOO_LARGE)


@pytest.mark.parametrize("value", ['{"a": NaN}', '{"a": Infinity}', {"a": float("nan")}, {"a": float("-inf")}])
def test_metadata_with_non_finite_numbers(client: MnemosClient, value: Any) -> None:
    assert refused(client, metadata=value).reason is Reason.BAD_METADATA


@pytest.mark.parametrize("value", ['{"a": "x\\u0000y"}', {"k\x00": 1}])
def test_metadata_with_nul(client: MnemosClient, value: Any) -> None:
    assert refused(client, metadata=value).reason is Reason.CONTROL_CHARACTERS


@pytest.mark.parametrize("value", [{1: "a", "1": "b"}, {"d": {None: 1}}, {"l": [{True: "x"}]}, {"n": {2.5: "x"}}])
def test_metadata_keys_that_are_not_strings(client: MnemosClient, value: Any) -> None:
    # break-it round 12: JSON turned them into text, so {1: "a", "1": "b"} came back as {"1": "b"}
    exc = refused(client, metadata=value)
    assert exc.reason is Reason.BAD_METADATA and "keys must be strings" in exc.detail


def test_metadata_that_is_not_serializable(client: MnemosClient) -> None:
    assert refused(client, metadata={"when": datetime(2024, 1, 1)}).reason is Reason.BAD_METADATA


# --- batches ------------------------------------------------------------------------------------

def test_one_bad_turn_in_a_batch_sends_nothing_and_names_its_index(client: MnemosClient) -> None:
    batch = [good(turn_id="u1"), good(turn_id="u2"), good(turn_id="u3", text=" "), good(turn_id="u4")]
    with pytest.raises(InvalidInputError) as info:
        client.publish_turns(batch)
    assert info.value.field == "turns[2].text" and info.value.reason is Reason.EMPTY_TEXT


def test_an_empty_batch_sends_nothing(client: MnemosClient) -> None:
    assert client.publish_turns([]) == []


# --- retrieval requests -------------------------------------------------------------------------

def ask(client: MnemosClient, tenant: Any = "t1", query: Any = "where is Pixel", k: Any = 10) -> InvalidInputError:
    with pytest.raises(InvalidInputError) as info:
        client.retrieve(tenant, query, k=k, timeout_s=0.5)
    return info.value


@pytest.mark.parametrize("k", [0, -1, -(10**9), LIMITS.max_k + 1, 10**9])
def test_k_out_of_range(client: MnemosClient, k: int) -> None:
    exc = ask(client, k=k)
    assert exc.reason is Reason.K_OUT_OF_RANGE and exc.field == "k" and str(k) in exc.detail


@pytest.mark.parametrize("k", ["5", 5.0, True, None, [5]])
def test_k_of_the_wrong_type(client: MnemosClient, k: Any) -> None:
    exc = ask(client, k=k)
    assert exc.reason is Reason.K_OUT_OF_RANGE and "integer" in exc.detail


@pytest.mark.parametrize("query", ["", "   ", "\n\t\r"])
def test_empty_query(client: MnemosClient, query: str) -> None:
    exc = ask(client, query=query)
    assert exc.reason is Reason.EMPTY_QUERY and exc.field == "query"


def test_query_too_large(client: MnemosClient) -> None:
    exc = ask(client, query="where " * 2000)
    assert exc.reason is Reason.QUERY_TOO_LARGE and str(LIMITS.max_query_bytes) in exc.detail


@pytest.mark.parametrize("query", ["where\x00is", "bell\x07"])
def test_query_with_control_characters(client: MnemosClient, query: str) -> None:
    assert ask(client, query=query).reason is Reason.CONTROL_CHARACTERS


@pytest.mark.parametrize(("tenant", "reason"), [(None, Reason.MISSING_FIELD), ("", Reason.BAD_ID),
                                                (" ", Reason.BAD_ID), (7, Reason.BAD_ID),
                                                ("t\x00", Reason.CONTROL_CHARACTERS)])
def test_request_with_a_bad_tenant(client: MnemosClient, tenant: Any, reason: Reason) -> None:
    exc = ask(client, tenant=tenant)
    assert exc.reason is reason and exc.field == "tenant_id"


def test_a_valid_request_reaches_the_network(client: MnemosClient) -> None:
    with pytest.raises(ServiceUnavailable):
        client.retrieve("t1", "where is Pixel", k=5, timeout_s=0.5)


@pytest.mark.parametrize("request_id", ["req:1", "a/b c", "x'; DROP TABLE entries; --", "ünï-42"])
def test_request_ids_with_separators_are_accepted(client: MnemosClient, request_id: str) -> None:
    """Ids may hold separators (they are bound parameters everywhere); the request reaches the network."""
    with pytest.raises(ServiceUnavailable):
        client.retrieve("t1", "where is Pixel", k=5, timeout_s=0.5, request_id=request_id)


@pytest.mark.parametrize(("request_id", "reason"), [("", Reason.BAD_ID), ("r\x00", Reason.CONTROL_CHARACTERS),
                                                    ("r" * 257, Reason.BAD_ID)])
def test_bad_request_ids(client: MnemosClient, request_id: str, reason: Reason) -> None:
    with pytest.raises(InvalidInputError) as info:
        client.retrieve("t1", "where is Pixel", k=5, timeout_s=0.5, request_id=request_id)
    assert info.value.reason is reason and info.value.field == "request_id"


# --- forget and catalog reads: ids -----------------------------------------------------------------

@pytest.mark.parametrize("call", [lambda c: c.forget("t1", turn_ids="u1"), lambda c: c.turns("t1", "u1"),
                                  lambda c: c.forget("t1", turn_ids=b"u1")])
def test_a_lone_string_of_turn_ids_is_refused_not_split_into_characters(client: MnemosClient, call: Any) -> None:
    # found by a break-it session: forget(turn_ids="t1") erased turns "t" and "1" and kept "t1"
    with pytest.raises(InvalidInputError, match=r"not a string: \[") as info:
        call(client)
    assert info.value.field == "turn_ids"
    with pytest.raises(ServiceUnavailable):  # the control: a list of the same id would be sent
        client.forget("t1", turn_ids=["u1"])


# --- waits and stream ids ---------------------------------------------------------------------------

@pytest.mark.parametrize("timeout_s", [float("nan"), float("inf"), 0, -1.0, -1e6, 1e300, True, "10"])
@pytest.mark.parametrize("call", [lambda c, t: c.retrieve("t1", "where is Pixel", timeout_s=t),
                                  lambda c, t: c.sessions("t1", timeout_s=t),
                                  lambda c, t: c.wait_acknowledged("t1", "1-0", t)])
def test_a_wait_that_is_not_a_number_of_seconds_is_refused(client: MnemosClient, call: Any, timeout_s: Any) -> None:
    # break-it round 12: NaN waited for ever, inf and NaN raised untyped errors, and a huge or negative
    # wait reached Redis as a key lifetime it refused, reported as ServiceUnavailable
    with pytest.raises(InvalidInputError) as info:
        call(client, timeout_s)
    assert info.value.reason is Reason.BAD_TIMEOUT and info.value.field == "timeout_s"


def test_a_sane_wait_and_a_stream_entry_id_reach_the_network(client: MnemosClient) -> None:
    # the control of the two tests around it (once: each unreachable call takes seconds of retries)
    with pytest.raises(ServiceUnavailable):
        client.retrieve("t1", "where is Pixel", timeout_s=0.5)
    with pytest.raises(ServiceUnavailable):
        client.acknowledged("t1", "1717243200000-0")


@pytest.mark.parametrize("stream_id", ["garbage", "", "-1", "0-0", "1-2-3", " 1-0", None, 17])
def test_acknowledged_refuses_what_is_not_a_stream_entry_id(client: MnemosClient, stream_id: Any) -> None:
    # break-it round 12: these raised a bare ValueError, and "0-0" read as acknowledged
    with pytest.raises(InvalidInputError) as info:
        client.acknowledged("t1", stream_id)
    assert info.value.reason is Reason.BAD_ID and info.value.field == "stream_id"
