"""Which of a moved tenant's unacknowledged messages still have an effect to move, and how a pending
outcome's pool is renumbered (workers/ops/tenant_move_streams.py; docs/scaling.md "Moving a tenant
between shards"). The stream moves themselves run against real servers in
tests/integration/test_tenant_move_servers.py."""

from __future__ import annotations

import json

from api.forget import ForgetRequest
from api.schemas import Outcome, PoolRow
from api.validation import Limits
from workers.ops.tenant_move_streams import GONE_ENTRY, _message_to_move, _renumbered
from workers.store.rows import Tombstone

LIMITS = Limits()


def _raw(fields: dict[str, str]) -> dict[bytes, bytes]:
    return {k.encode(): v.encode() for k, v in fields.items()}


def _turn(turn_id: str, session: str = "s1", readd: bool = False) -> dict[bytes, bytes]:
    fields = {"v": "1", "tenant_id": "t", "session_id": session, "turn_id": turn_id, "role": "user", "text": "hi",
              "occurred_at": "2024-03-01T09:00:00+00:00"}
    return _raw({**fields, "readd": "1"} if readd else fields)


def _forget(**values: object) -> dict[bytes, bytes]:
    return _raw(ForgetRequest.parse({"v": 1, "tenant_id": "t", **values}, LIMITS).to_stream_fields())


def _keep_turn_message(fields: dict[bytes, bytes], stream_id: str, stones: dict, limits: Limits) -> bool:
    return _message_to_move(fields, stream_id, stones, limits) is not None


STONES = {("turn", "a"): Tombstone("turn", "a", 200, 0), ("session", "s2"): Tombstone("session", "s2", 300, 0)}


def test_a_turn_a_forget_covered_at_its_source_position_is_not_moved() -> None:
    assert not _keep_turn_message(_turn("a"), "100-0", STONES, LIMITS)  # published before the forget of "a"
    assert not _keep_turn_message(_turn("a"), "250-0", STONES, LIMITS)  # after it, without readd
    assert _keep_turn_message(_turn("a", readd=True), "250-0", STONES, LIMITS)
    assert not _keep_turn_message(_turn("b", session="s2"), "299-0", STONES, LIMITS)
    assert _keep_turn_message(_turn("b", session="s2"), "301-0", STONES, LIMITS)
    assert _keep_turn_message(_turn("c"), "100-0", STONES, LIMITS)


def test_a_forget_already_applied_is_not_moved_and_a_pending_one_is() -> None:
    assert not _keep_turn_message(_forget(scope="turns", turn_ids=["a"]), "200-0", STONES, LIMITS)
    assert not _keep_turn_message(_forget(scope="session", session_id="s2"), "150-0", STONES, LIMITS)  # superseded
    assert _keep_turn_message(_forget(scope="session", session_id="s2"), "400-0", STONES, LIMITS)
    assert _keep_turn_message(_forget(scope="tenant"), "100-0", STONES, LIMITS)
    assert _keep_turn_message(_raw({"tenant_id": "t", "text": "no version"}), "100-0", STONES, LIMITS)  # a dead letter


def test_nothing_older_than_an_applied_replacement_or_forget_is_moved() -> None:
    # break-it session, round 4: without a tombstone for replacements, a stale put or delete left
    # pending moved to the target with a later id and overwrote or erased the newer value there; and
    # an unparseable message a forget covered moved and became a letter holding the erased text
    stones = {**STONES, ("replace", "k"): Tombstone("replace", "k", 500, 0)}
    replace = {**_turn("k"), b"readd": b"replace"}
    assert not _keep_turn_message(replace, "400-0", stones, LIMITS)  # a stale replacement
    assert _keep_turn_message(replace, "600-0", stones, LIMITS)
    assert not _keep_turn_message(_forget(scope="turns", turn_ids=["k"]), "450-0", stones, LIMITS)  # a stale delete
    assert _keep_turn_message(_forget(scope="turns", turn_ids=["k"]), "550-0", stones, LIMITS)
    malformed = {**_turn("a"), b"occurred_at": b"yesterday"}
    assert not _keep_turn_message(malformed, "100-0", stones, LIMITS)  # before the forget of "a": its text is erased
    assert _keep_turn_message(malformed, "250-0", stones, LIMITS)  # after it: the target letters it
    assert _keep_turn_message({**_turn("k"), b"occurred_at": b"yesterday"}, "400-0", stones, LIMITS)  # no forget


def test_a_turn_forget_moves_with_only_the_ids_nothing_later_overtook() -> None:
    # break-it session, round 5: a pending forget of [k, k2] was dropped whole because k had a later
    # replacement, and k2's stored value survived the move
    stones = {**STONES, ("replace", "k"): Tombstone("replace", "k", 500, 0)}
    moved = _message_to_move(_forget(scope="turns", turn_ids=["k", "k2", "a"]), "450-0", stones, LIMITS)
    assert moved is not None and ForgetRequest.from_stream_fields(moved, LIMITS).turn_ids == ("k2", "a")  # a: 200 < 450
    untouched = _forget(scope="turns", turn_ids=["k2"])
    assert _message_to_move(untouched, "450-0", stones, LIMITS) is untouched


def test_a_pending_outcome_names_the_new_entry_ids() -> None:
    pool = (PoolRow(7, 1, 2, 0.5), PoolRow(9, 2, 1, 1.5))
    fields = _raw(Outcome("o", "t", 0, 2, pool).to_stream_fields())
    moved = json.loads(_renumbered(fields, {7: 107})[b"outcome"])
    assert moved["pool"] == [[107, 1, 2, 0.5], [GONE_ENTRY, 2, 1, 1.5]]
    assert _renumbered({b"outcome": b"not json"}, {7: 107}) == {b"outcome": b"not json"}


def test_a_pending_outcome_keeps_its_place_among_the_tenant_s_forgets() -> None:
    # break-it session: the copy raises the tenant's forget version by one, so every moved outcome read
    # as older than a forget, and none of their queries joined the bootstrap buffer on the target
    pool = (PoolRow(7, 1, 1, 0.5),)
    moved = json.loads(_renumbered(_raw(Outcome("o", "t", 0, 1, pool, forget_version=3).to_stream_fields()),
                                   {7: 107})[b"outcome"])
    assert moved["forget_version"] == 4
    assert "forget_version" not in json.loads(_renumbered(_raw(Outcome("o", "t", 0, 1, pool).to_stream_fields()),
                                                          {7: 107})[b"outcome"])
    assert _renumbered({b"outcome": b"[1]"}, {}) == {b"outcome": b"[1]"}
