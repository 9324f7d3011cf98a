"""Forget through the ingest worker and the query service, on the in-memory store
(tests/unit/worker_fakes.py; docs/architecture.md "Forget").

The same flows run against the real Redis and Postgres in tests/integration/test_forget.py, which
also scans every table and stream for the forgotten text.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest

from api.errors import InvalidInputError, Reason
from api.forget import ForgetRequest, ForgetScope
from api.schemas import RetrievalRequest
from api.validation import Limits
from tests.unit.worker_fakes import (
    RecordingRedis,
    conversation,
    forget_message,
    ingest_worker,
    query_service,
    turn_message,
)
from workers.ingest.forget import plan_promotions
from workers.runtime.streams import StreamMessage
from workers.store import FakeStore
from workers.store.rows import EntryLink


def _turns(store: FakeStore, tenant: str) -> dict[str, int | None]:
    """turn id -> the entry id it is an alias of (None: canonical)."""
    with store.tenant(tenant) as tx:
        rows = tx.entries_after(0)
    by_id = {r.entry_id: r.turn_id for r in rows}
    return {r.turn_id: None if r.canonical_entry_id is None else by_id[r.canonical_entry_id] for r in rows}


def _versions(store: FakeStore, tenant: str) -> tuple[int, int]:
    with store.tenant(tenant) as tx:
        row = tx.tenant()
    assert row is not None
    return row.memory_version, row.forget_version


def test_a_turn_forget_erases_the_entry_its_scores_and_its_dead_letters() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle(conversation("alice") + conversation("bob", first_id=50))
    worker.handle([turn_message("60-0", "alice", "alice-t0", "a changed cat story")])  # a conflict letter
    with store.tenant("alice") as tx:
        (entry,) = [r.entry_id for r in tx.entries_after(0) if r.turn_id == "alice-t0"]
        tx.add_suppression({(entry, 0): 1.0})
    assert len(store.tables.dead_letters) == 1
    assert worker.handle([forget_message("70-0", "alice", turn_ids=("alice-t0",))]) == ["70-0"]
    assert "alice-t0" not in _turns(store, "alice") and len(_turns(store, "alice")) == len(conversation("alice")) - 1
    assert len(_turns(store, "bob")) == len(conversation("bob"))  # another tenant keeps everything
    assert not store.tables.suppression and not store.tables.dead_letters
    assert _versions(store, "alice") == (2, 1)
    assert worker.metrics.forget_turns._value.get() == 1 and worker.metrics.forget_events._value.get() == 1


def test_an_alias_forgotten_alone_leaves_its_canonical_entry() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message("1-0", "alice", "a", "I moved to Lisbon in March"),
                   turn_message("2-0", "alice", "b", "I moved to Lisbon in March!", session="s2")])
    assert _turns(store, "alice") == {"a": None, "b": "a"}
    worker.handle([forget_message("3-0", "alice", turn_ids=("b",))])
    assert _turns(store, "alice") == {"a": None}


def test_a_forgotten_canonical_entry_promotes_its_first_live_alias() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message(f"{i}-0", "alice", name, "I moved to Lisbon in March" + "!" * i, session=f"s{i}")
                   for i, name in enumerate(("a", "b", "c", "d"), start=1)])
    assert _turns(store, "alice") == {"a": None, "b": "a", "c": "a", "d": "a"}
    worker.handle([forget_message("9-0", "alice", turn_ids=("a", "c"))])
    assert _turns(store, "alice") == {"b": None, "d": "b"}
    # the ingest worker's canonical cache follows: a new duplicate joins the promoted entry
    worker.handle([turn_message("10-0", "alice", "e", "I moved to Lisbon in March", session="s9")])
    assert _turns(store, "alice")["e"] == "b"


def test_plan_promotions_ignores_aliases_forgotten_with_their_canonical_entry() -> None:
    def link(entry_id: int, canonical: int | None) -> EntryLink:
        return EntryLink(entry_id, f"t{entry_id}", "s", canonical, None)

    forgotten = [link(1, None), link(3, 1), link(7, None)]
    aliases = [link(3, 1), link(4, 1), link(5, 1), link(8, 7)]
    assert plan_promotions(forgotten, aliases) == {4: None, 5: 4, 8: None}


def test_a_session_forget_is_ordered_with_the_turns_around_it() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    batch = [turn_message("1-0", "alice", "before", "cello lessons on Monday", session="s1"),
             turn_message("2-0", "alice", "other", "my dog is called Rex", session="s2"),
             forget_message("3-0", "alice", session="s1"),
             turn_message("4-0", "alice", "after", "violin lessons on Friday", session="s1")]
    assert worker.handle(batch) == ["1-0", "2-0", "3-0", "4-0"]
    assert set(_turns(store, "alice")) == {"other", "after"}
    # the first turn comes again (a redelivery): published before the forget, it stays out
    worker.handle([turn_message("1-0", "alice", "before", "cello lessons on Monday", session="s1")])
    assert set(_turns(store, "alice")) == {"other", "after"}
    assert "1-0" in redis.deleted["unit:turns"] and worker.metrics.ingest_tombstoned._value.get() == 1


def test_a_forgotten_turn_id_comes_back_only_when_re_added_after_the_forget(caplog: pytest.LogCaptureFixture) -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message("1-0", "alice", "t", "my pin is 1234")])
    worker.handle([forget_message("2-0", "alice", turn_ids=("t",))])
    with caplog.at_level(logging.INFO, logger="workers.ingest.worker"):
        worker.handle([turn_message("3-0", "alice", "t", "my pin is 1234")])  # a retry, not a re-add
    assert _turns(store, "alice") == {}
    assert any("dropped turn 't' of tenant 'alice' (3-0)" in m and "readd" in m for m in caplog.messages)
    worker.handle([turn_message("1-0", "alice", "t", "my pin is 1234", readd=True)])  # a re-add before the forget
    assert _turns(store, "alice") == {}
    worker.handle([turn_message("4-0", "alice", "t", "my pin is 4321", readd=True)])
    assert _turns(store, "alice") == {"t": None}
    worker.handle([turn_message("4-0", "alice", "t", "my pin is 4321", readd=True)])  # its redelivery
    with store.tenant("alice") as tx:
        assert [r.text for r in tx.entries_after(0)] == ["my pin is 4321"]
        assert [s.readd_position for s in tx.tombstones(session_ids=[], turn_ids=["t"])] == [(4, 0)]  # kept
    worker.handle([turn_message("3-0", "alice", "t", "my pin is 1234")])  # the retry, read only now: dropped
    worker.handle([turn_message("5-0", "alice", "t", "my pin is 4321")])  # after the re-add: a redelivery
    worker.handle([turn_message("6-0", "alice", "t", "my pin is 9999")])  # after the re-add: a conflict
    with store.tenant("alice") as tx:
        assert [r.text for r in tx.entries_after(0)] == ["my pin is 4321"]
    assert [letter.stream_id for letter in store.tables.dead_letters.values()] == ["6-0"]


def test_a_turn_a_scope_forget_erased_is_swept_only_for_later_messages() -> None:
    """A session or tenant forget read before an earlier replacement that moved one of its turn ids
    to another session keeps that replacement (scope ``swept``, migration 0009); later retries of the turn
    id are dropped, an explicit re-add after the forget stores it again."""
    for scope in ("session", "tenant"):
        store, redis = FakeStore(), RecordingRedis()
        worker = ingest_worker(store, redis)
        worker.handle([turn_message("1-0", "alice", "k", "I live in Lisbon", session="s1")])
        forget = forget_message("4-0", "alice", session="s1") if scope == "session" else forget_message("4-0", "alice")
        worker.handle([forget])  # read first by a faster consumer
        moved = turn_message("2-0", "alice", "k", "I live in Porto", session="s2")
        worker.handle([StreamMessage(moved.stream_id, {**moved.fields, b"readd": b"replace"})])  # a replacement
        expected = {"session": {"k"}, "tenant": set()}[scope]  # a tenant forget covers every session
        assert set(_turns(store, "alice")) == expected
        worker.handle([turn_message("5-0", "alice", "k", "I live in Lisbon", session="s1")])  # a retry
        assert set(_turns(store, "alice")) == expected
        with store.tenant("alice") as tx:
            assert {(t.scope, t.key) for t in tx.tombstones(session_ids=["s1"], turn_ids=["k"])} >= {("swept", "k")}
            assert not any(t.scope == "turn" for t in tx.tombstones(session_ids=["s1"], turn_ids=["k"]))
    worker.handle([turn_message("6-0", "alice", "k", "I live in Braga", session="s3", readd=True)])
    worker.handle([turn_message("5-0", "alice", "k", "I live in Lisbon", session="s1")])  # before the re-add
    with store.tenant("alice") as tx:
        assert [r.text for r in tx.entries_after(0)] == ["I live in Braga"]
        assert [(t.scope, t.readd_position) for t in tx.tombstones(session_ids=[], turn_ids=["k"])
                if t.key and t.scope != "replace"] == [("swept", (6, 0))]


def test_a_retry_after_a_forget_read_before_it_is_erased_by_it_but_a_re_add_is_kept() -> None:
    """A plain message of a turn id published after a forget of that id is a retry, which stream order
    drops. Read first (another consumer was faster) it used to be stored and to survive the forget,
    which keeps values carried after it: the forgotten text came back (migration 0009)."""
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle([turn_message("3-0", "alice", "t", "my pin is 1234")])  # the retry, read first
    worker.handle([forget_message("2-0", "alice", turn_ids=("t",))])
    assert _turns(store, "alice") == {}
    assert "3-0" in redis.deleted["unit:turns"]  # its stream copy too
    worker.handle([turn_message("1-0", "alice", "t", "my pin is 1234")])  # the original, read last
    assert _turns(store, "alice") == {}
    # a re-add after the forget, read before it, is what stream order keeps, and so is its repetition
    worker.handle([turn_message("5-0", "alice", "u", "my pin is 4321", readd=True),
                   turn_message("6-0", "alice", "v", "my pin is 9999"),
                   turn_message("8-0", "alice", "v", "my pin is 9999", readd=True)])
    worker.handle([forget_message("4-0", "alice", turn_ids=("u",)), forget_message("7-0", "alice", turn_ids=("v",))])
    with store.tenant("alice") as tx:
        assert {r.turn_id: r.text for r in tx.entries_after(0)} == {"u": "my pin is 4321", "v": "my pin is 9999"}
        stones = {t.key: t.readd_position for t in tx.tombstones(session_ids=[], turn_ids=["u", "v"])}
    assert stones == {"u": (5, 0), "v": (8, 0)}  # the re-adds' positions: retries before them stay dropped


def test_a_message_a_session_forget_covers_read_after_it_sweeps_its_turn_id() -> None:
    """The forget of a session read before an earlier message of it (its consumer died): in stream
    order that message was stored, then erased, and its turn id swept, so a retry published after
    the forget is dropped, or erased if it was read first (migration 0009)."""
    for order in (("2-0", "1-0", "3-0"), ("3-0", "2-0", "1-0")):
        store, redis = FakeStore(), RecordingRedis()
        worker = ingest_worker(store, redis)
        messages = {"1-0": turn_message("1-0", "alice", "t", "my pin is 1234", session="s1"),
                    "2-0": forget_message("2-0", "alice", session="s1"),
                    "3-0": turn_message("3-0", "alice", "t", "my pin is 1234", session="s2")}
        for stream_id in order:
            worker.handle([messages[stream_id]])
        assert _turns(store, "alice") == {}, order
        assert {"1-0", "3-0"} <= set(redis.deleted["unit:turns"]), order
        with store.tenant("alice") as tx:
            assert [(t.scope, t.stream_position) for t in tx.tombstones(session_ids=[], turn_ids=["t"])] == [
                ("swept", (2, 0))]
        worker.handle([turn_message("4-0", "alice", "t", "my pin is 5678", session="s2", readd=True)])
        assert _turns(store, "alice") == {"t": None}  # a re-add after the forget stores it again


def test_a_tenant_forget_leaves_only_its_tenant_row_and_tombstones() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle(conversation("alice") + conversation("bob", first_id=50))
    bad = turn_message("60-0", "alice", "x", "x")
    bad.fields[b"text"] = b"   "
    worker.handle([bad])
    with store.tenant("alice") as tx:
        tx.buffer_query("o1", np.ones(4, dtype=np.float32))
        tx.record_outcome("o1", None, {}, None)
    worker.handle([forget_message("70-0", "alice")])
    tables = store.tables
    assert _turns(store, "alice") == {} and len(_turns(store, "bob")) == len(conversation("bob"))
    assert not tables.dead_letters and "alice" not in tables.buffer
    assert not [key for key in tables.ledger if key[0] == "alice"]
    assert {(t, s) for t, s, _ in tables.tombstones} == {("alice", "tenant"), ("alice", "swept")}
    # a turn published after the tenant forget is a new memory
    worker.handle([turn_message("80-0", "alice", "new", "a fresh start")])
    assert _turns(store, "alice") == {"new": None}


def test_the_query_service_forgets_with_the_store_and_drops_rerank_pairs() -> None:
    store, redis = FakeStore(), RecordingRedis()
    worker = ingest_worker(store, redis)
    worker.handle(conversation("alice"))
    service = query_service(store, redis)
    first = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=3))
    assert first.hits[0].turn_id == "alice-t0"
    assert service.rerank_cache is not None
    pixel = "user: I adopted a grey cat named Pixel last spring"
    assert service.rerank_cache.pairs_of(pixel) == 1
    worker.handle([forget_message("90-0", "alice", turn_ids=("alice-t0",))])
    again = service.answer(RetrievalRequest("alice", "grey cat named Pixel", k=10))
    assert "alice-t0" not in {h.turn_id for h in again.hits}
    assert service.rerank_cache.pairs_of(pixel) == 0
    assert again.memory_version == 2


def test_an_unknown_scope_or_mixed_fields_are_refused() -> None:
    limits = Limits()
    with pytest.raises(InvalidInputError) as caught:
        ForgetRequest.parse({"v": 1, "tenant_id": "a", "scope": "everything"}, limits)
    assert caught.value.reason is Reason.BAD_FORGET
    with pytest.raises(InvalidInputError):
        ForgetRequest.parse({"v": 1, "tenant_id": "a", "scope": "tenant", "session_id": "s"}, limits)
    with pytest.raises(InvalidInputError):
        ForgetRequest.parse({"v": 1, "tenant_id": "a", "scope": "turns", "turn_ids": "[]"}, limits)
    request = ForgetRequest.parse({"v": 1, "tenant_id": "a", "scope": "turns", "turn_ids": ["x", "x", "y"]}, limits)
    assert request.turn_ids == ("x", "y") and request.scope is ForgetScope.TURNS
    fields = {k.encode(): v.encode() for k, v in request.to_stream_fields().items()}
    assert ForgetRequest.from_stream_fields(fields, limits) == request


def test_a_malformed_forget_is_a_dead_letter() -> None:
    store, redis = FakeStore(), RecordingRedis()
    message = forget_message("1-0", "alice", session="s1")
    message.fields[b"scope"] = b"galaxy"
    assert ingest_worker(store, redis).handle([message]) == ["1-0"]
    (letter,) = store.tables.dead_letters.values()
    assert letter.reason == Reason.BAD_FORGET.value
