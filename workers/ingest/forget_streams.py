"""Forget in Redis: deleting the copies of forgotten turns that the streams still hold
(docs/architecture.md "Forget").

A stream entry keeps its fields after it is acknowledged, until a trim passes it. After a forget
is committed, the ingest worker deletes (XDEL):

* every entry of the turns stream up to the forget event that the forget covers. One still
  pending for another consumer is not deleted yet (a pending entry without fields reads as a
  loss, docs/architecture.md "Invariants"): its id goes to the set ``<turns stream>:forgotten``
  and is deleted once acknowledged, by whichever ingest worker looks first: each worker sweeps
  the set after every acknowledgement (:func:`sweep_deferred`), and the forgetting worker once
  more after adding to it, so an acknowledgement racing with the deferral is never missed;
* the entries after the forget that carried a value it erased (``late``: a retry read before the
  forget, or one a dropped message's sweep erased), deferred in the same way while pending;
* the entries of its own batch that a forget covered or a tombstone dropped (acknowledged and
  deleted together, in one MULTI);
* every entry of the dead-letter stream ``<prefix>:turns:dead`` that copies a covered message;
* every stored rq result (a result stream ``rq:results:mnemos-*``) of a retrieval of the tenant
  that returned a covered hit or evidence-packet item (a packet may carry turns of the reranked
  pool below the top ``k`` hits; :func:`erase_results`; one SCAN of the results' keys per forget,
  reading only those whose job id does not name another tenant).

The forget event itself holds ids only and is acknowledged and trimmed like any entry.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from rq.results import Result
from rq.serializers import JSONSerializer

from api.client import JOB_ID_PREFIX, tenant_job_prefix
from api.errors import InvalidInputError
from api.forget import ForgetRequest, is_forget_message, is_readd
from api.schemas import Turn
from api.validation import Limits
from workers.runtime.dead_letters import copied_letter
from workers.runtime.streams import stream_position

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Erasure:
    """What one applied forget erased, for its copies: its ``request``, its event's stream id
    ``upto`` (None for a dropped message's sweep, :func:`workers.ingest.forget.sweep_dropped`, which
    has no event and covers no earlier message), the erased ``entry_ids``, the stream ids of the
    erased values carried after it (``late``), the turn ids its tombstones name (``named``) and
    the stream id of the forget their retries follow (``after``: ``upto``, or for a sweep the
    forget that covered the dropped message)."""

    request: ForgetRequest
    upto: str | None
    entry_ids: tuple[int, ...]
    late: tuple[str, ...]
    named: tuple[str, ...]  # turn ids whose plain messages after ``after`` are retries (:func:`retry_entries`)
    after: str

SCAN_COUNT = 500  # entries per XRANGE / XPENDING round trip


def _text(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value or "")


def _entries(connection: redis.Redis, stream: str, last: str, first: str = "-"
             ) -> Iterator[tuple[str, dict[bytes, bytes]]]:
    """Every entry of ``stream`` from ``first`` up to ``last`` (inclusive; "-" and "+" for all), in order."""
    start = first
    while True:
        chunk = connection.xrange(stream, min=start, max=last, count=SCAN_COUNT)
        for raw_id, fields in chunk:
            yield _text(raw_id), fields
        if len(chunk) < SCAN_COUNT:
            return
        start = "(" + _text(chunk[-1][0])


def _pending(connection: redis.Redis, stream: str, group: str, last: str) -> set[str]:
    """Ids of entries up to ``last`` delivered to ``group`` and not acknowledged."""
    found: set[str] = set()
    start = "-"
    while True:
        try:
            chunk = connection.xpending_range(stream, group, min=start, max=last, count=SCAN_COUNT)
        except redis.ResponseError:  # no such group (nothing was ever delivered)
            return found
        found.update(_text(row["message_id"]) for row in chunk)
        if len(chunk) < SCAN_COUNT:
            return found
        start = "(" + _text(chunk[-1]["message_id"])


def _covered_turn(request: ForgetRequest) -> Callable[[Mapping[bytes, bytes]], bool]:
    def covered(fields: Mapping[bytes, bytes]) -> bool:
        if is_forget_message(fields) or _text(fields.get(b"tenant_id")) != request.tenant_id:
            return False
        return request.covers(_text(fields.get(b"session_id")), _text(fields.get(b"turn_id")))
    return covered


def _covered_letter(request: ForgetRequest, forget_id: str) -> Callable[[Mapping[bytes, bytes]], bool]:
    """Whether a dead-stream copy is of a message of ``request``'s scope published before the forget.
    The dead stream holds copies of turns-stream messages only: this shard's, and those a tenant move
    brought from another shard, which keep their source stream's name and position (earlier than
    every later id of this shard's turns stream, :func:`workers.ops.tenant_move_streams.carry_positions`;
    matching the name alone, a forget after a move left the moved copies holding the erased text)."""
    last = stream_position(forget_id)

    def covered(fields: Mapping[bytes, bytes]) -> bool:
        letter = copied_letter(fields)
        if letter is None or letter.tenant_id != request.tenant_id or letter.payload.get("kind") == "forget":
            return False
        try:
            if stream_position(letter.stream_id) > last:
                return False  # a letter of a message published after the forget
        except ValueError:
            return False
        return request.covers(letter.payload.get("session_id", ""), letter.turn_id or "")
    return covered


def covered_entries(connection: redis.Redis, stream: str, group: str, request: ForgetRequest, forget_id: str | None,
                    own: Iterable[str], late: Iterable[str] = ()) -> tuple[list[str], list[str]]:
    """Ids of the turns-stream entries up to the forget event ``forget_id`` that ``request`` covers
    (None: none, a sweep's erasure), and the entries ``late`` (after it: values erased, retries
    read before it): ``(deletable now, pending for another consumer)`` (``own``: this consumer's
    batch, deletable)."""
    late = list(late)
    ends = [forget_id, *late] if forget_id is not None else late
    if not ends:
        return [], []
    others = _pending(connection, stream, group, max(ends, key=stream_position)) - set(own)
    covered = _covered_turn(request)
    ids = [sid for sid, fields in _entries(connection, stream, forget_id) if covered(fields)] if forget_id else []
    ids += late
    return [sid for sid in ids if sid not in others], [sid for sid in ids if sid in others]


def deferred_key(stream: str) -> str:
    """The set of covered entries of ``stream`` waiting for their acknowledgement to be deleted."""
    return f"{stream}:forgotten"


def defer(connection: redis.Redis, stream: str, group: str, stream_ids: Iterable[str]) -> int:
    """Record covered entries still pending elsewhere, then sweep once; returns how many were deleted."""
    ids = sorted(set(stream_ids))
    if ids:
        connection.sadd(deferred_key(stream), *ids)
    return sweep_deferred(connection, stream, group)


def sweep_deferred(connection: redis.Redis, stream: str, group: str) -> int:
    """Delete the deferred entries that are no longer pending; returns how many were deleted."""
    key = deferred_key(stream)
    waiting = sorted(_text(m) for m in connection.smembers(key))
    if not waiting:
        return 0
    pipe = connection.pipeline(transaction=False)
    for sid in waiting:
        pipe.xpending_range(stream, group, min=sid, max=sid, count=1)
    done = [sid for sid, rows in zip(waiting, pipe.execute(), strict=True) if not rows]
    if not done:
        return 0
    pipe = connection.pipeline(transaction=True)
    pipe.xdel(stream, *done)
    pipe.srem(key, *done)
    deleted = int(pipe.execute()[0])
    log.info("deleted %d forgotten entries of %s after their acknowledgement", deleted, stream)
    return deleted


def covered_dead_letters(connection: redis.Redis, dead_stream: str, request: ForgetRequest, forget_id: str | None
                         ) -> list[str]:
    """Ids of the dead-letter stream's entries that copy a message published before the forget event
    ``forget_id`` that ``request`` covers (None: no forget event, a sweep's erasure, deletes none)."""
    if forget_id is None:
        return []
    covered = _covered_letter(request, forget_id)
    return [sid for sid, fields in _entries(connection, dead_stream, "+") if covered(fields)]


def _turns_with_text(value: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(session_id, turn_id)`` of every turn whose text a stored job result holds: a retrieval's
    hits and its packet's items (omitted packet candidates hold ids only), a catalog read's turns;
    a catalog read's sessions as ``(session_id, "")`` (no text, but a session or tenant forget
    erases their ids too); the ids of a hit's or an item's aliases as ``("", turn_id)`` (the
    canonical turn's text; their sessions are not in the result, so only a forget of their turn id
    or of the tenant finds them: a break-it session saw an alias forgotten alone keep its id there)."""
    for key in ("hits", "turns", "sessions"):  # "turns"/"sessions": workers.query.catalog results
        for row in value.get(key) or ():
            if isinstance(row, dict):
                yield str(row.get("session_id", "")), str(row.get("turn_id", ""))
                yield from (("", str(alias)) for alias in _list(row.get("aliases")))
    packet = value.get("packet")
    for item in (packet.get("items") or ()) if isinstance(packet, dict) else ():
        if isinstance(item, dict):
            qualifiers = item.get("qualifiers")
            qualifiers = qualifiers if isinstance(qualifiers, dict) else {}
            yield str(qualifiers.get("session_id", "")), str(item.get("turn_id", ""))
            yield from (("", str(alias)) for alias in _list(qualifiers.get("aliases")))


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _entry_ids(value: Mapping[str, Any]) -> set[int]:
    """The entry ids of a stored job result's hits, turns and packet items. A hit shown as an alias
    (a filter admitted the alias, not its canonical turn) carries the canonical entry's id and text
    under the alias's turn id and session: only its entry id tells that a forget of the canonical
    turn covers it (break-it session, 2026-12-07)."""
    packet = value.get("packet")
    rows = [*(value.get("hits") or ()), *(value.get("turns") or ()),
            *((packet.get("items") or ()) if isinstance(packet, dict) else ())]
    return {row["entry_id"] for row in rows if isinstance(row, dict) and isinstance(row.get("entry_id"), int)}


# a job id of api.client.job_id_for: the tenant's prefix (16 hex digits), then 32 more
_SCOPED_JOB_ID = re.compile(re.escape(JOB_ID_PREFIX) + r"[0-9a-f]{16}-[0-9a-f]{32}")


def erase_results(connection: redis.Redis, request: ForgetRequest, entry_ids: Iterable[int] = (), *,
                  stream_prefix: str) -> int:
    """Delete the stored results of the tenant's retrievals and catalog reads that returned a hit,
    packet item, turn or session ``request`` covers, or one of the ``entry_ids`` the forget erased (a
    client waiting for one of them right now times out); returns how many were deleted.

    One SCAN MATCH of ``rq:results:mnemos-*``; a result whose job id has another tenant's prefix, or
    the tenant's in another deployment (:func:`api.client.tenant_job_prefix` of ``stream_prefix``),
    is skipped by its name, unread, and every other one is read: this tenant's, those of job ids of
    any other form (enqueued before 2026-12-07, or by a client that hashes the tenant and request id
    its own way), whose tenant only the result says, and, under a prefix other than the default,
    those of the default prefix's form. The last are this deployment's results stored before job ids
    named their deployment (2026-12-07), or a default-prefix deployment's sharing the database: they
    are erased by the turns and sessions they show only, never by entry id (another database numbers
    its entries alike; break-it session, round 10). A job enqueued past the client under an id that
    does not start with ``mnemos-`` (rq's default uuid) is not read: its result keeps a forgotten
    turn until ``MNEMOS_RESULT_TTL_S`` (docs/architecture.md "Forget", its limits).
    """
    erased = frozenset(entry_ids)
    deleted = sum(_erase_result(connection, job_id, request, erased if kind != "unscoped" else frozenset())
                  for job_id, kind in _jobs_of(connection, request.tenant_id, stream_prefix))
    if deleted:
        log.info("deleted %d stored retrieval results holding forgotten turns", deleted)
    return deleted


def _jobs_of(connection: redis.Redis, tenant_id: str, stream_prefix: str) -> Iterator[tuple[str, str]]:
    """``(job id, kind)`` of every stored result that may be ``tenant_id``'s in the deployment of
    ``stream_prefix``: ``"named"`` when its job id carries the tenant's prefix there; ``"unscoped"``
    when it carries the tenant's default-prefix form and the deployment's prefix is another;
    ``"other"`` for an id of any other form. Only a named one's value need not be checked."""
    mine = tenant_job_prefix(tenant_id, stream_prefix)
    unscoped = tenant_job_prefix(tenant_id)
    for key in connection.scan_iter(match=Result.get_key(f"{JOB_ID_PREFIX}*"), count=SCAN_COUNT):
        job_id = _text(key).removeprefix(Result.get_key(""))
        if job_id.startswith(mine):
            yield job_id, "named"
        elif job_id.startswith(unscoped):
            yield job_id, "unscoped"
        elif not _SCOPED_JOB_ID.fullmatch(job_id):
            yield job_id, "other"


def expire_results(connection: redis.Redis, tenant_id: str, ttl_s: int, *, stream_prefix: str) -> int:
    """Let every stored result of ``tenant_id``'s retrievals and catalog reads (in the deployment of
    ``stream_prefix``, :func:`erase_results`) expire within ``ttl_s``
    seconds (never later than it would have); returns how many result keys that shortened. A tenant
    move calls it on the source: a client still waiting there can read its answer, and no answer
    holding text outlives a forget made on the target by more than ``ttl_s``. Results of the default
    prefix's form under another prefix are left alone: they may be another deployment's, and one of
    this deployment's is older than its upgrade, within ``MNEMOS_RESULT_TTL_S`` of expiring."""
    shortened = 0
    for job_id, kind in _jobs_of(connection, tenant_id, stream_prefix):
        key = Result.get_key(job_id)
        if kind == "unscoped" or (kind == "other" and not any(
                _value_of(connection, job_id, raw_id, fields).get("tenant_id") == tenant_id
                for raw_id, fields in connection.xrange(key))):
            continue
        ttl = int(connection.ttl(key))  # -1: no expiry, -2: gone meanwhile
        if ttl == -1 or ttl > ttl_s:
            shortened += bool(connection.expire(key, ttl_s))
    return shortened


def _value_of(connection: redis.Redis, job_id: str, raw_id: Any, fields: Any) -> dict[str, Any]:
    """A stored result's return value as a dict ({} when it is none or does not parse)."""
    try:
        value = Result.restore(job_id, _text(raw_id), fields, connection, serializer=JSONSerializer).return_value
    except (ValueError, TypeError):
        return {}
    return value if isinstance(value, dict) else {}


def _erase_result(connection: redis.Redis, job_id: str, request: ForgetRequest, erased: frozenset[int]) -> int:
    """XDEL the results of job ``job_id`` that ``request`` or the ``erased`` entry ids cover; returns how many."""
    doomed = []
    for raw_id, fields in connection.xrange(Result.get_key(job_id)):
        value = _value_of(connection, job_id, raw_id, fields)
        if value.get("tenant_id") == request.tenant_id and (
                any(request.covers(*turn) for turn in _turns_with_text(value)) or erased & _entry_ids(value)):
            doomed.append(_text(raw_id))
    return int(connection.xdel(Result.get_key(job_id), *doomed)) if doomed else 0


def delete_entries(connection: redis.Redis, stream: str, group: str, ack: Iterable[str],
                   delete: Iterable[str]) -> int:
    """Acknowledge ``ack`` (this consumer's, so they are never redelivered) and XDEL ``delete``
    from ``stream`` in one MULTI; returns how many entries were deleted."""
    ack_ids, delete_ids = sorted(set(ack)), sorted(set(delete))
    if not delete_ids:
        return 0
    pipe = connection.pipeline(transaction=True)
    if ack_ids:
        pipe.xack(stream, group, *ack_ids)
    pipe.xdel(stream, *delete_ids)
    deleted = int(pipe.execute()[-1])
    log.info("deleted %d forgotten entries of %s", deleted, stream)
    return deleted


def retry_entries(connection: redis.Redis, stream: str, group: str, tenant_id: str, turn_ids: Iterable[str],
                  forget_id: str, limits: Limits) -> list[str]:
    """Ids of the entries after the forget event ``forget_id`` that retry one of ``turn_ids`` (plain
    messages of the tenant, before the first re-add of that id that is valid under ``limits``: a
    malformed one is refused, stores nothing, and ends no retries; break-it session, round 10) and
    were delivered to ``group`` already. Stream order drops them; one read before the forget was
    stored, or taken for a redelivery of the stored value, so its copy would keep the erased text.
    Undelivered ones are dropped, and deleted, when they are read."""
    wanted, readded, found = set(turn_ids), set(), []
    try:
        groups = connection.xinfo_groups(stream) if wanted else []
    except redis.ResponseError:  # no such stream (an emptied Redis): nothing was delivered
        return []
    info = next((g for g in groups if _text(g["name"]) == group), None)
    if info is None:
        return []
    for sid, fields in _entries(connection, stream, _text(info["last-delivered-id"]), "(" + forget_id):
        turn_id = _text(fields.get(b"turn_id"))
        if (is_forget_message(fields) or _text(fields.get(b"tenant_id")) != tenant_id or turn_id not in wanted
                or turn_id in readded):
            continue
        if not is_readd(fields):
            found.append(sid)
        elif _valid_turn(fields, limits):
            readded.add(turn_id)
    return found


def _valid_turn(fields: Mapping[bytes, bytes], limits: Limits) -> bool:
    try:
        Turn.from_stream_fields(fields, limits, None)
    except InvalidInputError:
        return False
    return True


def erase_copies(connection: redis.Redis, stream: str, dead_stream: str, group: str, own: Iterable[str],
                 dropped: Iterable[str], erasures: Sequence[Erasure], *, stream_prefix: str, limits: Limits) -> None:
    """Delete the streams' copies of what a batch forgot or dropped: the turns-stream entries each
    erasure covers (:func:`covered_entries`; those pending for another consumer are deferred) and
    ``dropped`` ones, acknowledging those of this consumer's batch (``own``) in the same MULTI; the
    dead-stream copies of covered messages; the stored results that showed an erased turn."""
    own, doomed = set(own), set(dropped)
    for erasure in erasures:
        late = [*erasure.late, *retry_entries(connection, stream, group, erasure.request.tenant_id, erasure.named,
                                              erasure.after, limits)]
        now, later = covered_entries(connection, stream, group, erasure.request, erasure.upto, own, late=late)
        doomed.update(now)
        defer(connection, stream, group, later)
        letters = covered_dead_letters(connection, dead_stream, erasure.request, erasure.upto)
        if letters:
            connection.xdel(dead_stream, *letters)
        if erasure.upto or erasure.entry_ids:  # a sweep that erased nothing leaves the results alone
            erase_results(connection, erasure.request, erasure.entry_ids, stream_prefix=stream_prefix)
    delete_entries(connection, stream, group, ack=doomed & own, delete=doomed)

