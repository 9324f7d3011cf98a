"""The wire records (api.schemas) and the core records (mnemos.records, mnemos.filters) stay in step,
and workers/runtime/wire.py converts between them without losing a field."""

from __future__ import annotations

from dataclasses import fields
from datetime import UTC, datetime

from api import packets as wire_packets
from api import schemas
from mnemos import records
from mnemos.filters import EntryFilter
from workers.runtime.wire import entry_filter, hit_message, outcome_message, outcome_record, result_message

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
# core-only fields of a retrieval result: the outcome goes to the outcomes stream, the timings
# become stage_seconds; wire-only fields are what only the service knows
# the core's ranking is what a packet is selected from, its unfiltered lists what the packet's hidden
# candidates are ranked by; the packet is built by the service; the candidate lists feed the
# post-rerank features and the bench, not the client
RESULT_CORE_ONLY = {"outcome", "timings", "ranking", "unfiltered", "candidates"}
RESULT_WIRE_ONLY = {"request_id", "tenant_id", "stage_seconds", "memory_version", "suppression_version", "packet",
                    "rerank_pairs_scored", "rerank_pairs_cached", "v"}
RENAMED = {"PoolRow": "PoolEntry"}


def _shape(record: type) -> dict[str, str]:
    """Field name -> annotation, wire names mapped to their core twins."""
    out = {}
    for f in fields(record):
        annotation = str(f.type)
        for wire, core in RENAMED.items():
            annotation = annotation.replace(wire, core)
        out[f.name] = annotation
    return out


def test_hit_and_pool_rows_have_the_same_fields_in_the_same_order() -> None:
    assert _shape(schemas.Hit) == _shape(records.Hit)
    assert list(_shape(schemas.Hit)) == list(_shape(records.Hit))
    assert _shape(schemas.PoolRow) == _shape(records.PoolEntry)


def test_outcome_is_the_core_outcome_plus_its_schema_and_forget_versions() -> None:
    """The forget version is the query worker's, read from the tenant row (the core never sees it)."""
    wire = _shape(schemas.Outcome)
    assert wire.pop("v") == "int"
    assert wire.pop("forget_version") == "int | None"
    assert wire == _shape(records.Outcome)


def test_result_differs_only_by_the_fields_named_here() -> None:
    wire, core = _shape(schemas.RetrievalResult), _shape(records.RetrievalResult)
    assert set(core) - set(wire) == RESULT_CORE_ONLY
    assert set(wire) - set(core) == RESULT_WIRE_ONLY
    for name in set(core) & set(wire):
        if name != "hits":
            assert wire[name] == core[name], name


def test_the_core_filter_is_as_of_plus_the_wire_filters() -> None:
    assert {f.name for f in fields(EntryFilter)} == {"as_of", *schemas.FILTER_KEYS}


def _core_result() -> records.RetrievalResult:
    hits = (records.Hit(7, "t7", "s1", "ann", "I have a grey cat.", T0, 2.5, 1, ("t9",)),
            records.Hit(3, "t3", "s2", "bo", "Lovely.", T0, -0.25, 2))
    pool = (records.PoolEntry(7, 2, 1, 2.5), records.PoolEntry(3, 1, 2, -0.25))
    outcome = records.Outcome("req-1", "alice", 4, 2, pool, (0.5, -0.5))
    return records.RetrievalResult(hits, outcome, records.StageTimings(total=0.1), pool_size=2, deep_pass=True,
                                   cluster=4, top_rerank_score=2.5)


def test_a_result_survives_the_wire() -> None:
    core = _core_result()
    request = schemas.RetrievalRequest("alice", "Who has a cat?", k=2, request_id="req-1")
    message = result_message(core, request, stage_seconds={"total": 0.1}, memory_version=12, suppression_version=3)
    back = schemas.RetrievalResult.from_payload(message.to_payload())
    assert back == message
    assert (back.request_id, back.tenant_id, back.memory_version, back.suppression_version) == ("req-1", "alice", 12, 3)
    assert (back.pool_size, back.deep_pass, back.cluster, back.top_rerank_score) == (2, True, 4, 2.5)
    for hit, sent in zip(core.hits, back.hits, strict=True):
        assert {f.name: getattr(sent, f.name) for f in fields(sent)} == {
            f.name: getattr(hit, f.name) for f in fields(hit)}
    assert hit_message(core.hits[0]) == back.hits[0]


def test_a_result_carries_its_packet_from_the_one_conversion() -> None:
    request = schemas.RetrievalRequest("alice", "Who has a cat?", k=2, request_id="req-1", budget_tokens=64)
    packet = wire_packets.Packet(items=(), omitted=(), budget_tokens=64, used_tokens=0)
    message = result_message(_core_result(), request, stage_seconds={"total": 0.1, "packet": 0.01}, memory_version=12,
                             suppression_version=3, packet=packet)
    assert message.packet == packet and message.stage_seconds["packet"] == 0.01
    assert schemas.RetrievalResult.from_payload(message.to_payload()) == message
    without = result_message(_core_result(), request, stage_seconds={"total": 0.1}, memory_version=12,
                             suppression_version=3)
    assert without.packet is None


def test_an_outcome_survives_the_stream_with_and_without_its_embedding() -> None:
    core = _core_result().outcome
    assert core is not None
    for with_embedding in (True, False):
        fields_ = outcome_message(core, with_embedding=with_embedding).to_stream_fields()
        raw = {k.encode(): v.encode() for k, v in fields_.items()}
        back = outcome_record(schemas.Outcome.from_stream_fields(raw))
        expected = core if with_embedding else records.Outcome(core.outcome_id, core.tenant_id, core.cluster,
                                                               core.pool_size, core.pool, None)
        assert back == expected


def test_entry_filter_is_the_request_restrictions_once() -> None:
    plain = schemas.RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "cat"})
    assert entry_filter(plain) is None
    request = schemas.RetrievalRequest.parse({
        "v": 1, "tenant_id": "alice", "query": "cat", "as_of": "2024-05-02T00:00:00+02:00",
        "filters": {"session_ids": ["s1", "s2", "s1"], "roles": ["ann"], "occurred_after": "2024-04-01T00:00:00Z"}})
    assert entry_filter(request) == EntryFilter(
        as_of=datetime(2024, 5, 1, 22, 0, tzinfo=UTC), occurred_after=datetime(2024, 4, 1, tzinfo=UTC),
        session_ids=frozenset({"s1", "s2"}), roles=frozenset({"ann"}))
    only_as_of = schemas.RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "cat", "as_of": T0.isoformat()})
    assert entry_filter(only_as_of) == EntryFilter(as_of=T0)
    empty_filters = schemas.RetrievalRequest.parse({"v": 1, "tenant_id": "alice", "query": "cat", "filters": {}})
    assert empty_filters.filters is None and entry_filter(empty_filters) is None
