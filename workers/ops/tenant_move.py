"""Moving one tenant from the shard that serves it to another shard's servers (``mnemos reshard move``;
docs/scaling.md "Moving a tenant between shards").

With ``MNEMOS_SHARD_MAP`` every shard has its own Redis and Postgres. :func:`move_tenant` runs, in order:

1. **freeze**: the tenant's marker in the source shard's directory becomes ``"frozen"``
   (:mod:`api.directory`). From then on no client appends a turn or forget of the tenant to the
   source's turns stream (the client's publish script checks the marker atomically with the
   append) and clients hold the tenant's publishes, forgets and retrievals until the flip;
2. **lock** the tenant on the source database (its ingest and suppression locks and its tenant row):
   a worker transaction of the tenant that began earlier commits first; one that comes later finds
   the marker under the lock and writes nothing (:func:`api.directory.marked`);
3. **copy** its rows to the target database with new entry ids (:mod:`workers.store.tenant_copy`),
   committed there, under the target's locks of the tenant;
4. **pending forgets**: its forgets by request that the source's ingest group has not acknowledged are
   applied to the copy at their source positions, committed (:func:`_apply_pending_forgets`);
5. **streams**, holding the tenant's locks on the target again: its unacknowledged turns and outcomes
   and its dead-letter copies (but those a forget covers) move to the target's streams (a pending turn that a
   forget drops sweeps its turn id on the target first, :func:`_sweep_dropped_turns`), and every entry of it leaves
   the source's streams (:mod:`workers.ops.tenant_move_streams`); a marker the target had for it (it
   lived there before) is removed before those locks are released, so the target's workers that
   read the moved messages write them;
6. **delete** its rows on the source, committed (which releases the source's locks), and let its
   stored results there expire within :data:`api.directory.MOVED_RESULT_TTL_S`;
7. **flip**: no marker on the target, the target's number on the source (and on the ring's home
   shard, when that is a third shard). Held clients go on to the target.

A failure before step 3 commits removes the freeze (unless the move was itself a resumed one): the
tenant serves from the source as before, and the messages its source workers left pending meanwhile
are claimed again after ``MNEMOS_CLAIM_IDLE_MS``. A failure after it leaves the tenant frozen and is
resumed by running the same move again: it finds
the freeze, rebuilds the id map by turn id when the copy is already on the target, and finishes
steps 4 to 7. One move of a tenant at a time.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass

import psycopg
import redis

from api import sharding
from api.directory import FROZEN, MOVED_RESULT_TTL_S, marker_shard, marker_text
from api.forget import ForgetRequest, is_readd, is_replace
from api.validation import Limits, limits_of
from workers.ingest.forget import Verdict, apply_forget, sweep_dropped, tombstone_verdict
from workers.ingest.forget_streams import erase_results, expire_results
from workers.ingest.worker import GROUP as INGEST_GROUP
from workers.ops.tenant_move_streams import (
    StreamMove,
    carry_positions,
    move_dead_letters,
    move_outcomes,
    move_turns,
    pending_forgets,
    pending_turns,
    tenant_entries,
)
from workers.runtime.connections import redis_client
from workers.runtime.errors import SettingsError, TenantMoveError, TenantMoveRefused
from workers.settings import Settings
from workers.store import PostgresStore
from workers.store.postgres_tenant import PostgresTenantSession
from workers.store.rows import Tombstone
from workers.store.tenant_copy import (
    copy_tenant,
    delete_tenant,
    entry_ids_by_turn,
    handled,
    lock_tenant,
    release_move_lock,
    tenant_present,
    tenant_tombstones,
    try_move_lock,
)
from workers.suppression.worker import GROUP as SUPPRESSION_GROUP

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MoveReport:
    """What one move did: rows copied (entries, aliases, scores, tombstones) and stream entries moved."""

    tenant_id: str
    source: int
    target: int
    resumed: bool
    entries: int
    aliases: int
    scores: int
    tombstones: int
    forgets: int  # pending forgets applied at their source positions
    turns: StreamMove
    outcomes: StreamMove
    dead_letters: StreamMove
    seconds: float

    copied_before: bool = False  # a resumed move found the rows a stopped run had copied: counted, not copied

    @classmethod
    def nothing(cls, tenant_id: str, shard: int, seconds: float) -> MoveReport:
        """The report of a move to the shard that serves the tenant already: nothing moved."""
        none = StreamMove(0, 0, 0)
        return cls(tenant_id, shard, shard, False, 0, 0, 0, 0, 0, none, none, none, seconds)

    def line(self) -> str:
        """One line for the operator."""
        if self.source == self.target:
            return f"tenant {self.tenant_id} is served by shard {self.target} already: nothing moved"
        rows = (f"{self.entries} entries found copied by the stopped run" if self.copied_before else
                f"{self.entries} entries ({self.aliases} aliases), {self.scores} suppression scores, "
                f"{self.tombstones} tombstones")
        return (f"moved tenant {self.tenant_id} from shard {self.source} to shard {self.target}"
                f"{' (resumed)' if self.resumed else ''} in {self.seconds:.1f}s: {rows}; "
                f"{self.forgets} pending forgets applied; {self.turns.moved} pending turns moved "
                f"({self.turns.dropped} not: covered by a forget, or forgets applied above), {self.outcomes.moved} pending outcomes moved, "
                f"{self.dead_letters.moved} dead letters moved ({self.dead_letters.dropped} forgotten)")


def _locate(connections: list[redis.Redis], settings: Settings, tenant_id: str) -> tuple[int, bool]:
    """The shard serving the tenant (following markers from its ring shard) and whether it is frozen there.

    A move that failed after its streams step has removed the target's marker while the source is
    still frozen: when the markers lead to a shard without one, a ``frozen`` marker elsewhere names
    the source of that unfinished move (so a move back to the ring shard can be resumed; break-it
    session, 2026-12-07)."""
    shard = sharding.shard_of(tenant_id, settings.shards)
    for _ in range(settings.shards + 1):
        marker = connections[shard].hget(sharding.directory_key(settings.stream_prefix, shard, settings.shards),
                                          tenant_id)
        if marker is None:
            frozen = [s for s in range(settings.shards) if s != shard and connections[s].hget(
                sharding.directory_key(settings.stream_prefix, s, settings.shards), tenant_id) == FROZEN.encode()]
            return (frozen[0], True) if frozen else (shard, False)
        text = marker_text(marker)
        if text == FROZEN:
            return shard, True
        named = marker_shard(text, settings.shards)
        if named is None:
            raise TenantMoveRefused(
                f"the tenant directory of shard {shard} holds {text!r} for tenant {tenant_id!r}, which is not a "
                f"shard of this map (0..{settings.shards - 1}): fix or remove that marker "
                f"({sharding.directory_key(settings.stream_prefix, shard, settings.shards)}) first")
        shard = named
    raise TenantMoveRefused(f"the tenant directory of {tenant_id!r} loops between shards; fix the markers "
                          f"{settings.stream_prefix}:directory:* by hand")


def locate(settings: Settings, tenant_id: str) -> tuple[int, bool]:
    """The shard serving ``tenant_id`` and whether it is frozen there (a move of it is running, or
    stopped: running the same move again finishes it), read from the tenant directories without
    waiting, unlike a client (``mnemos reshard where``). Raises redis.RedisError."""
    connections = [redis_client(settings.for_shard(s)) for s in range(settings.shards)]
    try:
        return _locate(connections, settings, tenant_id)
    finally:
        _close(connections)


@contextlib.contextmanager
def _move_lock(settings: Settings, tenant_id: str) -> Iterator[None]:
    """Hold the tenant's move lock (:func:`workers.store.tenant_copy.try_move_lock`, on the tenant's ring
    shard's database, from before the move locates the tenant to its end), or raise TenantMoveRefused
    when another move of it holds it. A second move started while the first copied found the source
    still frozen, took it for a stopped move, waited for the source's locks, then "moved" the emptied
    source elsewhere and routed the tenant away from its rows (break-it session, 2026-12-07). The lock
    is the ring shard's, which no move changes. It is released when the move ends, before its
    connection closes (a close releases it only once the server's backend has ended, so a move right
    after a failed one found it held); a killed move's goes with its connection."""
    ring = sharding.shard_of(tenant_id, settings.shards)
    with psycopg.connect(settings.for_shard(ring).database_url, autocommit=True) as conn:
        if not try_move_lock(conn, tenant_id):
            raise TenantMoveRefused(f"another `mnemos reshard move` of tenant {tenant_id!r} is running (it holds the "
                                    f"tenant's move lock in shard {ring}'s database): let it end, then check with "
                                    "`mnemos reshard where`")
        try:
            yield
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection has released it
                release_move_lock(conn, tenant_id)


def move_tenant(settings: Settings, tenant_id: str, target: int, echo: Callable[[str], None] = log.info) -> MoveReport:
    """Move ``tenant_id`` to shard ``target`` (module docstring); returns what moved.

    One move of a tenant runs at a time: it holds the tenant's move lock (:func:`_move_lock`) while it
    runs, and another move of the same tenant is refused meanwhile.

    A tenant that ``target`` serves already, unfrozen, is not touched: the report says nothing moved
    (running a move twice is no error). Raises SettingsError without a shard map or for a shard the map
    does not have; TenantMoveRefused, before anything changed, for a tenant id with no rows and no
    messages, a tenant frozen on ``target`` by a stopped move (the message names the shard holding its
    copy), a stopped move resumed towards another shard than one holding its copy, or directory
    markers that name no shard or loop; TenantMoveError when a step failed (the message says where the
    tenant is left)."""
    if settings.shard_map is None or settings.shards < 2:
        raise SettingsError("mnemos reshard move needs MNEMOS_SHARDS >= 2 and MNEMOS_SHARD_MAP (each shard on its "
                            "own servers)")
    settings.servers_of(target)
    with _move_lock(settings, tenant_id):
        return _move(settings, tenant_id, target, echo)


def _move(settings: Settings, tenant_id: str, target: int, echo: Callable[[str], None]) -> MoveReport:
    """The steps of :func:`move_tenant`, under the tenant's move lock."""
    started = time.monotonic()
    connections = [redis_client(settings.for_shard(s)) for s in range(settings.shards)]
    try:
        source, resumed = _locate(connections, settings, tenant_id)
        if source == target:
            _refuse_no_op(settings, connections, tenant_id, source, resumed)
        elif resumed:
            _refuse_another_target(settings, connections, tenant_id, source, target)
        else:
            _refuse_unknown(settings, connections, tenant_id, source)
    except BaseException:
        _close(connections)
        raise
    if source == target:
        _close(connections)
        return MoveReport.nothing(tenant_id, target, time.monotonic() - started)
    src, dst = settings.for_shard(source), settings.for_shard(target)
    connections[source].hset(src_key := sharding.directory_key(settings.stream_prefix, source, settings.shards),
                             tenant_id, FROZEN)
    echo(f"froze tenant {tenant_id} on shard {source}{' (a frozen move resumed)' if resumed else ''}")
    copied = False
    try:
        with PostgresStore(src.database_url, settings.db_app_role) as source_store, \
                PostgresStore(dst.database_url, settings.db_app_role) as target_store, \
                source_store.tenant_tx(tenant_id) as a:
            lock_tenant(a, tenant_id)
            with target_store.tenant_tx(tenant_id) as b:
                lock_tenant(b, tenant_id)
                id_map, counts, copied_before = _copy_rows(a, b, tenant_id, resumed)
            copied = True
            echo(f"found {counts[0]} entries of tenant {tenant_id} on shard {target}, copied by the stopped run"
                 if copied_before else f"copied {counts[0]} entries of tenant {tenant_id} to shard {target}")
            forgets = _apply_pending_forgets(target_store, connections[source], src, tenant_id, limits_of(settings),
                                             id_map)
            with target_store.tenant_tx(tenant_id) as b:  # the target's workers wait until its marker is gone
                lock_tenant(b, tenant_id)
                done = handled(b, tenant_id, src.turns_stream)
                _sweep_dropped_turns(b, connections[source], src, tenant_id, limits_of(settings), done, id_map)
                moves = _move_streams(settings, connections, source, target, tenant_id, id_map,
                                      tenant_tombstones(b, tenant_id), done)
                connections[target].hdel(sharding.directory_key(settings.stream_prefix, target, settings.shards),
                                         tenant_id)
            delete_tenant(a, tenant_id)
        expire_results(connections[source], tenant_id, MOVED_RESULT_TTL_S, stream_prefix=settings.stream_prefix)
        _flip(connections, settings, tenant_id, source, target)
    except Exception as exc:
        if not copied and not resumed:  # a resumed move may have its copy on the target: it stays frozen
            connections[source].hdel(src_key, tenant_id)
            raise TenantMoveError(f"moving tenant {tenant_id!r} failed before its rows were copied ({exc}); it is "
                                  f"served by shard {source} as before") from exc
        raise TenantMoveError(f"moving tenant {tenant_id!r} failed after its rows were copied to shard {target} "
                              f"({exc}); it stays frozen: run the same move again to finish it") from exc
    finally:
        _close(connections)
    echo(f"routing of tenant {tenant_id} flipped to shard {target}")
    return MoveReport(tenant_id, source, target, resumed, *counts, forgets, *moves,
                      seconds=time.monotonic() - started, copied_before=copied_before)


def _known(settings: Settings, connection: redis.Redis, shard: int, tenant_id: str) -> bool:
    """Whether ``shard`` holds a row of the tenant or a message of it on its turns stream (a move of an
    unknown id used to succeed and leave a directory marker for it; new-operator session, 2026-12-07)."""
    own = settings.for_shard(shard)
    with PostgresStore(own.database_url, settings.db_app_role) as store, store.tenant_tx(tenant_id) as conn:
        if tenant_present(conn, tenant_id):
            return True
    return next(iter(tenant_entries(connection, own.turns_stream, tenant_id)), None) is not None


def _holders(settings: Settings, connections: list[redis.Redis], tenant_id: str, skip: set[int]) -> list[int]:
    """The shards outside ``skip`` that hold rows or turns-stream messages of the tenant (:func:`_known`)."""
    return [s for s in range(settings.shards) if s not in skip and _known(settings, connections[s], s, tenant_id)]


def _close(connections: Sequence[redis.Redis]) -> None:
    for connection in connections:
        connection.close()


def _refuse_unknown(settings: Settings, connections: list[redis.Redis], tenant_id: str, shard: int) -> None:
    """Raise TenantMoveRefused when ``shard`` holds no row and no turns-stream message of the tenant."""
    if not _known(settings, connections[shard], shard, tenant_id):
        raise TenantMoveRefused(f"tenant {tenant_id!r} has no rows and no messages on shard {shard}: nothing to move "
                                "(a mistyped id?)")


def _refuse_no_op(settings: Settings, connections: list[redis.Redis], tenant_id: str, shard: int,
                  resumed: bool) -> None:
    """Raise TenantMoveRefused for a move to the shard ``_locate`` found, unless the tenant is served
    there, unfrozen, and known there. A break-it session (2026-12-07) found "nothing moved" (exit 0)
    for a tenant frozen on that shard by a stopped move, whose clients kept failing, and for a
    mistyped id whose ring shard was the target."""
    if not resumed:
        _refuse_unknown(settings, connections, tenant_id, shard)
        return
    holders = _holders(settings, connections, tenant_id, {shard})
    where = (f"shard {holders[0]} holds its copy or messages: finish that move with --to {holders[0]}"
             if len(holders) == 1 else
             f"shards {', '.join(map(str, holders))} hold rows or messages of it: finish the stopped move with "
             "the --to it was given" if holders else
             "no other shard holds rows or messages of it (the move stopped before its copy): finish it with "
             f"--to another shard, or, when no move of it runs, unfreeze it with HDEL "
             f"{sharding.directory_key(settings.stream_prefix, shard, settings.shards)} {tenant_id} on shard "
             f"{shard}'s Redis")
    raise TenantMoveRefused(f"tenant {tenant_id!r} is frozen on shard {shard} by a move that is running or stopped, "
                            f"so it is not served there yet; {where} (docs/scaling.md \"Moving a tenant between "
                            "shards\")")


def _refuse_another_target(settings: Settings, connections: list[redis.Redis], tenant_id: str, source: int,
                           target: int) -> None:
    """Raise TenantMoveRefused when a third shard holds rows or turns-stream messages of the frozen
    tenant: a stopped move copied it there, or moved its pending messages there, or clients wrote there
    after its streams step; resumed towards another target, it would leave those behind, unreachable
    (break-it sessions, 2026-12-07)."""
    holders = _holders(settings, connections, tenant_id, {source, target})
    if holders:
        raise TenantMoveRefused(
            f"tenant {tenant_id!r} is frozen on shard {source} by a move that stopped, and shard {holders[0]} "
            f"holds rows or messages of it: finish that move with --to {holders[0]}, or roll it back "
            "(docs/scaling.md \"Moving a tenant between shards\")")


def _copy_rows(a: psycopg.Connection, b: psycopg.Connection, tenant_id: str,
               resumed: bool) -> tuple[dict[int, int], tuple[int, int, int, int], bool]:
    """Copy the rows (or, resuming a move whose copy committed, rebuild its id map by turn id); returns the
    id map, (entries, aliases, scores, tombstones) copied (only the entries found, for a copy a stopped run
    made), and whether the copy was found rather than made."""
    if resumed and tenant_present(b, tenant_id):
        old, new = entry_ids_by_turn(a, tenant_id), entry_ids_by_turn(b, tenant_id)
        return {entry: new[turn] for turn, entry in old.items() if turn in new}, (len(new), 0, 0, 0), True
    report = copy_tenant(a, b, tenant_id)
    return (dict(report.id_map), (report.entries, report.aliases, report.suppression, len(report.tombstones)),
            False)


def _apply_pending_forgets(store: PostgresStore, source: redis.Redis, src: Settings, tenant_id: str,
                           limits: Limits, id_map: dict[int, int]) -> int:
    """Apply the tenant's unacknowledged forgets by request to its rows on the target, in stream order at
    their source positions, in one committed transaction under its locks there; returns how many. Copied
    rows and tombstones keep their source positions, so each forget erases only what was published
    before it, as on the source; carried to the target's stream, it would get a later position there
    and erase a turn stored from a later message too (break-it session, round 5). Applying one again
    (a resumed move) erases nothing more. Then their covered results leave the source's Redis.

    A pending replacement's forget half is applied here too, in stream order with the forgets, at its
    position: the value it replaces goes as it would have on the source, whether the replacement then
    moves (the target applies it again, which erases nothing more) or a forget covers it and it is
    dropped whole (break-it sessions, 2026-12-07: a put into a session, then a forget of that session,
    brought the older value back; a put out of a session, then a forget of the old session, erased the
    new value, because the forget found the old value still in that session and tombstoned its turn id)."""
    pending = pending_forgets(source, src.turns_stream, INGEST_GROUP, tenant_id, limits)
    if not pending:
        return 0
    erased: list[tuple[ForgetRequest, tuple[int, ...]]] = []
    with store.tenant_tx(tenant_id) as b:
        lock_tenant(b, tenant_id)
        session = PostgresTenantSession(b, tenant_id)
        for stream_id, item in pending:
            if isinstance(item, ForgetRequest):
                erased.append((item, apply_forget(session, item, src.turns_stream, stream_id).entry_ids))
            else:
                apply_forget(session, ForgetRequest.replacing(tenant_id, item.turn_id), src.turns_stream, stream_id,
                             replace=True)
    _erase_source_results(source, src, erased, id_map)
    return len(erased)


def _erase_source_results(source: redis.Redis, src: Settings, erased: Sequence[tuple[ForgetRequest, tuple[int, ...]]],
                          id_map: dict[int, int]) -> None:
    """Delete the source's stored results that each ``(request, target entry ids)`` erasure covers
    (:func:`workers.ingest.forget_streams.erase_results`); the source's results name the source's
    entries, so the ids are mapped back through the copy's ``id_map``."""
    old_ids = {new: old for old, new in id_map.items()}
    for request, entry_ids in erased:
        erase_results(source, request, [old_ids[e] for e in entry_ids if e in old_ids], stream_prefix=src.stream_prefix)


def _sweep_dropped_turns(conn: psycopg.Connection, source: redis.Redis, src: Settings, tenant_id: str,
                         limits: Limits, done: Collection[str], id_map: dict[int, int]) -> int:
    """Sweep, on the target, the turn ids of the tenant's pending turn messages that a forget drops, as
    the source's ingest worker would on reading them (:func:`workers.ingest.forget.sweep_dropped`):
    a retry of such a turn id, published after the forget and stored first by another consumer, is
    erased, and the stored results that returned it leave the source's Redis. The move drops those
    messages (:func:`workers.ops.tenant_move_streams.move_turns`), so without this the retry stayed
    stored on the target (break-it session, round 9). A message ``done`` names was handled already
    (its sweep committed with it). Runs in the caller's transaction, under the tenant's locks on the
    target; returns how many messages swept something. Raises what the store or Redis raise."""
    pending = [(i, turn, fields) for i, turn, fields in
               pending_turns(source, src.turns_stream, INGEST_GROUP, tenant_id, limits) if i not in done]
    if not pending:
        return 0
    session = PostgresTenantSession(conn, tenant_id)
    stones = {(t.scope, t.key): t for t in session.tombstones(
        session_ids=sorted({turn.session_id for _, turn, _ in pending}),
        turn_ids=sorted({turn.turn_id for _, turn, _ in pending}))}
    erased: list[tuple[ForgetRequest, tuple[int, ...]]] = []
    for stream_id, turn, fields in pending:
        if tombstone_verdict(stones, turn, stream_id, is_readd(fields), replace=is_replace(fields)) is not Verdict.DROP:
            continue
        report = sweep_dropped(session, stones, turn, stream_id)
        if report is not None and report.entry_ids:
            erased.append((ForgetRequest.replacing(tenant_id, turn.turn_id), report.entry_ids))
    _erase_source_results(source, src, erased, id_map)
    if erased:
        log.info("swept %d turn ids of tenant %r that pending dropped messages name", len(erased), tenant_id)
    return len(erased)


def _move_streams(settings: Settings, connections: list[redis.Redis], source: int, target: int, tenant_id: str,
                  id_map: dict[int, int], stones: Sequence[Tombstone],
                  handled_ids: set[str]) -> tuple[StreamMove, StreamMove, StreamMove]:
    src, dst = settings.for_shard(source), settings.for_shard(target)
    a, b = connections[source], connections[target]
    carry_positions(a, src.turns_stream, b, dst.turns_stream, INGEST_GROUP)
    turns = move_turns(a, src.turns_stream, INGEST_GROUP, b, dst.turns_stream, tenant_id, stones,
                       limits_of(settings), handled_ids)
    outcomes = move_outcomes(a, src.outcomes_stream, SUPPRESSION_GROUP, b, dst.outcomes_stream, tenant_id, id_map)
    letters = move_dead_letters(a, src.dead_letter_stream, b, dst.dead_letter_stream, tenant_id, stones)
    return turns, outcomes, letters


def _flip(connections: list[redis.Redis], settings: Settings, tenant_id: str, source: int, target: int) -> None:
    """Route the tenant to ``target``: its marker removed there, set to ``target`` on the source and on a
    third home shard (so clients find it in one hop)."""
    def key(shard: int) -> str:
        return sharding.directory_key(settings.stream_prefix, shard, settings.shards)

    connections[target].hdel(key(target), tenant_id)
    connections[source].hset(key(source), tenant_id, str(target))
    home = sharding.shard_of(tenant_id, settings.shards)
    if home not in (source, target):
        connections[home].hset(key(home), tenant_id, str(target))


__all__ = ["MoveReport", "locate", "move_tenant"]
