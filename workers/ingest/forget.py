"""Forget in the store: one forget event applied in its tenant's transaction, and the tombstones
that keep forgotten turns out (docs/architecture.md "Forget").

:func:`apply_forget` runs inside the ingest worker's transaction of the tenant, under its ingest
lock (so no turn of the tenant is written meanwhile), and:

1. takes the tenant row's lock first (it orders the forget with the suppression worker's
   transaction of the tenant) and bumps the tenant's memory and forget versions, unless the forget
   erases no turn (a turn-id or session forget of turns never stored, such as the forget half of a
   put of a new key: query workers and the suppression worker then keep what they hold);
2. deletes the entries of its scope carried by messages before it (a turn-id forget: of its turn
   ids, whatever carried them), but values a re-add at or after it carried, with their embeddings and
   suppression scores; an alias whose canonical entry is forgotten while it is not is promoted
   (:func:`plan_promotions`), an alias forgotten alone leaves its canonical entry as it was; a
   tenant forget also deletes the tenant's rows in every other table but its ``tenants`` row (ids
   and counters) and its tombstones, unless it or a later tenant forget was applied already;
3. deletes the tenant's dead letters of its scope (their payloads hold the text) but those of
   messages published after it;
4. records tombstones, each with the forget's stream position: a turn-id forget one per named or
   erased turn id; a session or tenant forget one for its scope and a sweep (scope ``swept``) per
   turn id it erased.

:func:`tombstone_verdict` then decides, for each turn message the ingest worker reads, whether a
tombstone keeps it out. Both are idempotent: a redelivered forget deletes nothing more.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import redis

from api.errors import InvalidInputError
from api.forget import ForgetRequest, ForgetScope
from api.schemas import Turn
from api.validation import Limits, check_id
from workers.runtime.dead_letters import DeadLetter, publish_dead_letters
from workers.runtime.streams import stream_position
from workers.store import Store, TenantSession
from workers.store.rows import EntryLink, TenantLock, Tombstone


@dataclass(frozen=True)
class ForgetReport:
    """What one applied forget deleted: turns (canonical entries and aliases), aliases promoted to
    canonical entries, dead letters, the erased entries' ids, the stream ids of erased values
    carried by messages after the forget (``late``) and the turn ids its tombstones name (``named``);
    ``bumped``: whether it moved the tenant's forget version."""

    turns: int = 0
    promoted: int = 0
    dead_letters: int = 0
    bumped: bool = False
    entry_ids: tuple[int, ...] = ()  # of the erased entries
    late: tuple[str, ...] = ()  # stream ids of erased values carried after the forget (retries read first)
    named: tuple[str, ...] = ()  # the turn ids its turn or swept tombstones name: later plain ones are retries
    at: str = ""  # the stream id of the forget (of a sweep: of the forget it follows)


def plan_promotions(forgotten: Sequence[EntryLink], aliases: Sequence[EntryLink]) -> dict[int, int | None]:
    """New ``canonical_entry_id`` of the surviving aliases of forgotten canonical entries.

    For each forgotten canonical entry, its surviving alias with the lowest id becomes canonical
    (None) and the others become its aliases; aliases that are forgotten themselves are left out.
    Aliases are never targets, so no chain can form (docs/architecture.md "Dedupe").
    """
    doomed = {link.entry_id for link in forgotten}
    survivors: dict[int, list[int]] = {}
    for alias in aliases:
        if alias.entry_id not in doomed and alias.canonical_entry_id in doomed:
            survivors.setdefault(alias.canonical_entry_id, []).append(alias.entry_id)
    changes: dict[int, int | None] = {}
    for ids in survivors.values():
        first, *rest = sorted(ids)
        changes[first] = None
        changes.update(dict.fromkeys(rest, first))
    return changes


def apply_forget(tx: TenantSession, request: ForgetRequest, stream: str, stream_id: str, *,
                 replace: bool = False) -> ForgetReport:
    """Apply ``request`` (carried by entry ``stream_id`` of the turns stream ``stream``) in ``tx``,
    which holds the tenant's ingest lock; returns what was deleted. Raises StoreError when the store
    fails. ``replace``: the forget half of a replacement, which updates a turn: it erases the stored
    value but leaves the turn id's dead letters alone, and its tombstone has scope ``replace``:
    older messages of the turn id are dropped, but no refused message's letter is (it is no
    forget). Dead letters of messages published after the forget are kept in any case.

    Consumers of one group run side by side, so a value carried by a message after the forget may be
    stored already. A session or tenant forget keeps it (a new turn of the scope), and so does a
    replacement's forget half (a newer value, or one stream order would refuse as a conflict); a
    turn-id forget by request erases it (a plain message of a forgotten turn id after the forget is
    a retry, which stream order drops) and reports its stream id as ``late``. A forget by request
    keeps a value that a re-add at or after it carried (the entry's re-add position, migration
    0009): in stream order that re-add stored it again.
    """
    at = stream_position(stream_id)
    tx.tenant(lock=True)  # the row lock first: it orders the forget with the suppression worker's transaction
    if request.scope is ForgetScope.TENANT:
        links = tx.entry_links()
    elif request.scope is ForgetScope.SESSION:
        links = tx.entry_links(session_id=request.session_id)
    else:
        links = tx.entry_links(turn_ids=request.turn_ids)
    covered = [link for link in links if request.scope is ForgetScope.TURNS and not replace or _before(link, at)]
    kept = [] if replace else [link for link in covered if _readded_since(link, at)]
    links = [link for link in covered if link not in kept]
    wipe = request.scope is ForgetScope.TENANT and not _tenant_forgotten_since(tx, at)
    through = (stream, stream_id)
    if request.scope is ForgetScope.TENANT:
        letters = tx.delete_dead_letters(through=through)
        if wipe:  # suppression scores first: they reference the entries
            tx.delete_tenant_state()
    elif request.scope is ForgetScope.SESSION:
        letters = tx.delete_dead_letters(session_id=request.session_id, through=through)
    else:
        letters = 0 if replace else tx.delete_dead_letters(turn_ids=request.turn_ids, through=through)
    promoted, bumped = _erase(tx, links, bump=wipe)
    tx.add_tombstones([Tombstone("replace", t, *at) for t in request.turn_ids] if replace
                      else _tombstones(request, covered, at))
    for link in kept:  # in stream order the re-add stored the value again, after this forget
        tx.mark_readded([link.turn_id], link.readd_position or at)
    swept = tx.swept_at(*at) if request.scope is not ForgetScope.TURNS else []  # a redelivery covers nothing again
    named = () if replace else tuple(dict.fromkeys([*request.turn_ids, *(link.turn_id for link in covered), *swept]))
    return ForgetReport(turns=len(links), promoted=promoted, dead_letters=letters, bumped=bumped,
                        entry_ids=tuple(link.entry_id for link in links), late=_late(links, at), named=named,
                        at=stream_id)


def sweep_dropped(tx: TenantSession, stones: dict[tuple[str, str], Tombstone], turn: Turn,
                  stream_id: str) -> ForgetReport | None:
    """The turn message ``stream_id`` was dropped: does a session or tenant forget read before it (in
    ``stones``, the batch's view keyed by ``(scope, key)``) cover it? Then, in stream order, it was
    stored and that forget erased it and swept its turn id, so a plain message of the turn id after
    the forget is a retry. Sweep the turn id now, at the earliest such forget, and erase a value
    of it that such a retry carried, read before this message (one a re-add since carried stays).
    Returns what was erased (its ``named`` and ``at``: the delivered retries after the forget go
    with it), None when no such forget covers the message; raises StoreError when the store
    fails. ``tx`` holds the tenant's ingest lock (docs/architecture.md "Tombstones")."""
    position = stream_position(stream_id)
    covering = [stone.stream_position for stone in (stones.get(("tenant", "")), stones.get(("session", turn.session_id)))
                if stone is not None and position < stone.stream_position]
    if not covering:
        return None
    at = min(covering)
    tx.add_tombstones([Tombstone("swept", turn.turn_id, *at)])
    stones.update({(t.scope, t.key): t for t in tx.tombstones(session_ids=[], turn_ids=[turn.turn_id])})
    links = [link for link in tx.entry_links(turn_ids=[turn.turn_id])
             if not _before(link, at) and not _readded_since(link, at)]
    if links:
        tx.tenant(lock=True)  # as a forget: it orders the erasure with the suppression worker's transaction
    promoted, bumped = _erase(tx, links) if links else (0, False)
    return ForgetReport(turns=len(links), promoted=promoted, bumped=bumped, entry_ids=tuple(link.entry_id for link in links),
                        late=_late(links, at), named=(turn.turn_id,), at=f"{at[0]}-{at[1]}")


def _erase(tx: TenantSession, links: Sequence[EntryLink], *, bump: bool = False) -> tuple[int, bool]:
    """Delete the entries of ``links`` (embeddings and suppression scores go with them), promoting
    the surviving aliases of erased canonical entries (:func:`plan_promotions`); bumps the tenant's
    forget version when any is erased, or with ``bump``. Returns (aliases promoted, bumped). An
    erasure of nothing leaves every cache of the tenant valid (a put of a new key)."""
    bumped = bool(links) or bump
    if bumped:
        tx.bump_forget_version()
    changes = plan_promotions(links, tx.aliases_of([link.entry_id for link in links]))
    tx.set_canonical(changes)
    tx.delete_entries([link.entry_id for link in links])
    return sum(1 for canonical in changes.values() if canonical is None), bumped


def _late(links: Sequence[EntryLink], at: tuple[int, int]) -> tuple[str, ...]:
    """Stream ids of the erased values carried by messages after stream position ``at``."""
    return tuple(link.stream_id for link in links if link.stream_id is not None and not _before(link, at))


def _tenant_forgotten_since(tx: TenantSession, at: tuple[int, int]) -> bool:
    """Whether a tenant forget at or after position ``at`` was applied already: this one again (a
    redelivery after a worker died before acknowledging, or a tenant move's step 4) or a later one.
    The tenant state (suppression scores, ledger, query clusters) has no stream position, so wiping
    it again would erase what outcomes of later turns built (break-it session, 2026-12-07)."""
    stone = next((t for t in tx.tombstones(session_ids=[], turn_ids=[]) if t.scope == "tenant"), None)
    return stone is not None and stone.stream_position >= at


def _before(link: EntryLink, at: tuple[int, int]) -> bool:
    """True when the turn was carried by a message before stream position ``at`` (a row without a
    readable stream id counts as before)."""
    try:
        return link.stream_id is None or stream_position(link.stream_id) < at
    except ValueError:
        return True


def _readded_since(link: EntryLink, at: tuple[int, int]) -> bool:
    """True when a re-add message at or after stream position ``at`` carried the stored value (at
    ``at`` itself: the replacement whose forget half this is): the forget at ``at`` keeps it."""
    return link.readd_position is not None and link.readd_position >= at


def _tombstones(request: ForgetRequest, links: Sequence[EntryLink], at: tuple[int, int]) -> list[Tombstone]:
    """A turn-id forget tombstones the ids it names or covers (scope ``turn``); a session or tenant
    forget tombstones its scope and sweeps the turn ids it covers, erased or kept for a later re-add
    (scope ``swept``: their later retries are dropped, and a replacement that moved one of them to
    another session before the forget, read after it, is kept; migration 0009)."""
    if request.scope is ForgetScope.TURNS:
        return [Tombstone("turn", turn_id, *at) for turn_id in dict.fromkeys([*request.turn_ids,
                                                                              *(link.turn_id for link in links)])]
    rows = [Tombstone("swept", turn_id, *at) for turn_id in dict.fromkeys(link.turn_id for link in links)]
    if request.scope is ForgetScope.TENANT:
        rows.append(Tombstone("tenant", "", *at))
    else:
        assert request.session_id is not None
        rows.append(Tombstone("session", request.session_id, *at))
    return rows


def readded(stone: Tombstone, stream_id: str) -> Tombstone:
    """``stone`` after an explicit re-add of its turn id at entry ``stream_id``, applied (the earliest
    re-add position since the forget is kept)."""
    at = stream_position(stream_id)
    if stone.readd_position is not None and stone.readd_position <= at:
        return stone
    return dataclasses.replace(stone, readd_ms=at[0], readd_seq=at[1])


def record_readd(tx: TenantSession, stones: dict[tuple[str, str], Tombstone], turn_id: str, stream_id: str) -> None:
    """An explicit re-add at entry ``stream_id`` stores ``turn_id`` again (verdict ``READD``): the
    tombstones that made it a retry (:func:`retry_stones`) keep its position, in ``stones`` (the
    batch's view, keyed by ``(scope, key)``) and in ``tx``. Raises StoreError when the store fails."""
    position = stream_position(stream_id)
    for stone in retry_stones(stones, turn_id, position):
        stones[(stone.scope, stone.key)] = readded(stone, stream_id)
    tx.mark_readded([turn_id], position)


class Verdict(Enum):
    """What a tombstone check says about one turn message."""

    KEEP = "keep"  # no tombstone covers it
    DROP = "drop"  # a forget covers it: never stored
    READD = "readd"  # an explicit re-add after the forget: stored, its position kept on the tombstone


def tombstone_verdict(tombstones: Mapping[tuple[str, str], Tombstone], turn: Turn, stream_id: str,
                      readd: bool, *, replace: bool = False) -> Verdict:
    """Whether the turn message ``stream_id`` survives the tenant's ``tombstones`` (keyed by
    ``(scope, key)``).

    A message published before a forget of its tenant, its session or its turn id, or before a
    replacement of its turn id (scope ``replace``: a stale value), is dropped, and so is one
    published before a session or tenant forget erased its turn id (scope ``swept``: in stream
    order the erased value was there first, so it was a conflict or a redelivery), unless it is a
    replacement (``replace``), or the first re-add after a forget of its turn id: those set the
    value and are judged by their own session's and tenant's tombstones (they may have moved the
    turn id out of the forgotten session). A message published after a forget of its turn id, or
    after a sweep of it, is a retry or a replay and is dropped too, unless it is an explicit re-add
    (``readd``), or published at or after the earliest re-add applied since (the tombstone's
    ``readd_position``): those are ordinary again (:func:`retry_stones`).
    """
    position = stream_position(stream_id)
    replaced, swept = tombstones.get(("replace", turn.turn_id)), tombstones.get(("swept", turn.turn_id))
    if (forgotten_before(tombstones, stream_id, turn.session_id, turn.turn_id)
            or replaced is not None and position < replaced.stream_position
            or swept is not None and position < swept.stream_position and not (
                replace or readd and _first_readd(tombstones.get(("turn", turn.turn_id)), position))):
        return Verdict.DROP
    if not retry_stones(tombstones, turn.turn_id, position):
        return Verdict.KEEP
    return Verdict.READD if readd else Verdict.DROP


def _first_readd(forgotten: Tombstone | None, position: tuple[int, int]) -> bool:
    """Whether a re-add at ``position`` is the first one after the forget of its turn id
    (``forgotten``): a later one met the value the first stored, a conflict in stream order."""
    return forgotten is not None and forgotten.stream_position < position and (
        forgotten.readd_position is None or position <= forgotten.readd_position)


def retry_stones(tombstones: Mapping[tuple[str, str], Tombstone], turn_id: str,
                 position: tuple[int, int]) -> list[Tombstone]:
    """The tombstones of ``turn_id`` (scopes ``turn`` and ``swept``) that make its message at stream
    position ``position`` a retry: their erasure came before it and no re-add applied since came at
    or before it (a message before a sweep: :func:`tombstone_verdict`; docs/architecture.md
    "Tombstones")."""
    stones = (tombstones.get((scope, turn_id)) for scope in ("turn", "swept"))
    return [stone for stone in stones if stone is not None and stone.stream_position < position
            and (stone.readd_position is None or position < stone.readd_position)]


def forgotten_before(tombstones: Mapping[tuple[str, str], Tombstone], stream_id: str, session_id: str,
                     turn_id: str) -> bool:
    """Whether the message ``stream_id`` of ``session_id`` / ``turn_id`` was published before an
    applied forget of its tenant, its session or its turn id (``tombstones`` keyed by ``(scope,
    key)``); a ``replace`` tombstone is no forget. Raises ValueError for an id that is not a stream id."""
    position = stream_position(stream_id)
    keys = (("tenant", ""), ("session", session_id), ("turn", turn_id))
    return any(stone is not None and position < stone.stream_position for stone in map(tombstones.get, keys))


def letter_forgotten(tombstones: Mapping[tuple[str, str], Tombstone], letter: DeadLetter) -> bool:
    """:func:`forgotten_before` for a refused message's ``letter`` (its payload's session id, False
    for a stream id that is not one): its letter would keep text that forget erased (a message
    left pending by a dead consumer, refused after the forget was applied)."""
    try:
        return forgotten_before(tombstones, letter.stream_id, str(letter.payload.get("session_id") or ""),
                                letter.turn_id or "")
    except ValueError:
        return False


def record_letters(store: Store, connection: redis.Redis, dead_stream: str, limits: Limits,
                   letters: Sequence[DeadLetter], moved: Callable[[str], bool] = lambda _tenant: False,
                   ) -> tuple[list[DeadLetter], list[DeadLetter]]:
    """Record refused messages' ``letters`` (the ``dead_letters`` table and ``dead_stream``) but those
    an applied forget covers (:func:`letter_forgotten`: dropped like a forgotten turn) and those of a
    tenant ``moved`` says this shard no longer writes (read under the tenant's lock, as for its turns:
    their messages stay pending, and the move carries them to the tenant's new shard). Returns
    ``(recorded, left)``. Raises StoreError when the store fails.

    A tenant's letters are checked and written under its ingest lock, which a forget also takes: the
    forget commits either before the check, which then sees its tombstones, or after both copies
    exist, which it then deletes (a break-it session found a batch's copies, read before a forget,
    written after it). Letters without a valid tenant id are recorded as they are (no forget can name it).
    """
    by_tenant: dict[str | None, list[DeadLetter]] = {}
    for letter in letters:
        try:
            tenant_id: str | None = check_id(letter.tenant_id, "tenant_id", limits)
        except InvalidInputError:
            tenant_id = None
        by_tenant.setdefault(tenant_id, []).append(letter)
    kept, left = by_tenant.pop(None, []), []
    if kept:  # the stream copy of a letter recorded now only: a retried batch's are there already
        publish_dead_letters(connection, dead_stream, store.record_dead_letters(kept))
    for tenant_id, mine in sorted(by_tenant.items()):
        with store.tenant(tenant_id) as tx:
            tx.lock(TenantLock.INGEST)
            rows = tx.tombstones(session_ids=sorted({str(x.payload.get("session_id") or "") for x in mine}),
                                 turn_ids=sorted({x.turn_id or "" for x in mine}))
            stones = {(row.scope, row.key): row for row in rows}
            alive = [x for x in mine if not letter_forgotten(stones, x)]
            if moved(tenant_id):  # the forgotten are dropped here; the others move with the tenant
                left += alive
                continue
            publish_dead_letters(connection, dead_stream, tx.record_dead_letters(alive))  # under the lock
        kept += alive
    return kept, left
