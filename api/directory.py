"""The tenant directory: which shard serves a tenant once a move has overridden the ring
(docs/scaling.md "Moving a tenant between shards").

The ring (:mod:`api.sharding`) gives every tenant a home shard. A move (``mnemos reshard move``)
leaves a marker in the directory hash (:func:`api.sharding.directory_key`) of every shard that no
longer serves the tenant: ``"frozen"`` while the move copies its rows and pending turns, then the
number of the shard that serves it. A shard that serves a tenant has no marker for it. A client
therefore starts at the home shard and follows markers:

* a publish (turns or a forget) runs :data:`PUBLISH_SCRIPT` on the shard's Redis: in one atomic
  step it reads the markers of the message's tenants and appends the messages of unmarked tenants
  to the shard's turns stream. So no message of a tenant reaches a shard's stream once the move has
  frozen it there, whatever a client read before; the others are sent on to the marked shard, or
  held while the tenant is frozen (polled every ``poll_s`` seconds, up to ``wait_s``: then
  :class:`~api.errors.TenantMoving`, and that tenant's messages were not sent);
* a retrieval, a catalog read or an acknowledgement check reads the markers (``HGET``) the same way
  before it picks the shard's queue or stream.

A deployment of one shard has no directory: nothing can move.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import redis

from api import sharding
from api.errors import ShardUnavailable, TenantMoving

FROZEN = "frozen"
"""The marker of a tenant whose move is under way (its value in a shard's directory hash)."""

PUBLISH_SCRIPT = """
local where = {}
local out = {}
local i = 1
while i <= #ARGV do
  local tenant = ARGV[i]
  local n = tonumber(ARGV[i + 1])
  if where[tenant] == nil then
    where[tenant] = redis.call('HGET', KEYS[1], tenant)
  end
  if where[tenant] == false then
    local fields = {}
    for j = 1, n do fields[j] = ARGV[i + 1 + j] end
    out[#out + 1] = 'id:' .. redis.call('XADD', KEYS[2], '*', unpack(fields))
  else
    out[#out + 1] = 'to:' .. where[tenant]
  end
  i = i + 2 + n
end
return out
"""
"""KEYS: a shard's directory hash and its turns stream. ARGV: per message its tenant, the number of
field and value strings, then those strings. Returns per message ``id:<stream id>`` (appended) or
``to:<marker>`` (not appended: the tenant is frozen here, or served by the shard named; any marker, an
empty one included, holds the message back, as the shard's workers leave a marked tenant's turns alone)."""


MOVED_RESULT_TTL_S = 60
"""Seconds a stored result of a tenant lives on a shard that is moving it away or no longer serves it:
a client still waiting there reads it, and no answer holding text outlives a forget made on the
tenant's new shard (whose ingest workers erase results on their own shard's Redis only) by longer."""


def marked(connection: redis.Redis, stream_prefix: str, shard: int, shards: int, tenant_id: str) -> bool:
    """Whether ``shard``'s directory has a marker for ``tenant_id``: the tenant is being moved from
    this shard or is served by another, so this shard's workers write nothing of it (always False
    with one shard). Raises redis.RedisError."""
    if shards == 1:
        return False
    return bool(connection.hexists(sharding.directory_key(stream_prefix, shard, shards), tenant_id))


def marker_text(value: bytes | str) -> str:
    """A directory marker (or a publish reply) as text; bytes that are not UTF-8 read as U+FFFD, which
    :func:`marker_shard` refuses like any other non-number."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def marker_shard(marker: str, shards: int) -> int | None:
    """The shard a directory marker names, or None when it names no shard of ``shards``: anything but
    plain ASCII digits (:data:`FROZEN`, an empty marker, signs, spaces, other scripts' digits) or a
    number past the last shard. The one reading of a marker for clients and ``mnemos reshard``."""
    return int(marker) if marker.isascii() and marker.isdecimal() and int(marker) < shards else None


class Directory:
    """The directory as one client reads it: one Redis client per shard (index = shard).

    Args:
        connections: the shards' Redis clients, in shard order.
        stream_prefix: the deployment's stream prefix (names of the directory and the streams).
        wait_s: seconds a call waits for a frozen tenant before :class:`TenantMoving`.
        poll_s: seconds between two reads of a frozen tenant's marker.
    """

    def __init__(self, connections: Sequence[redis.Redis], stream_prefix: str, *, wait_s: float = 30.0,
                 poll_s: float = 0.05) -> None:
        if not (math.isfinite(wait_s) and wait_s >= 0):  # NaN would wait for ever, a negative value as 0
            raise ValueError(f"move_wait_s must be a number of seconds >= 0, got {wait_s}")
        self.connections = list(connections)
        self.shards = len(self.connections)
        self.stream_prefix = stream_prefix
        self.wait_s = wait_s
        self.poll_s = poll_s
        self._scripts: dict[int, Any] = {}

    def key(self, shard: int) -> str:
        return sharding.directory_key(self.stream_prefix, shard, self.shards)

    def resolve(self, tenant_id: str, home: int) -> int:
        """The shard serving ``tenant_id`` now, from its ``home`` shard by the markers (waiting while it
        is frozen). Raises TenantMoving after ``wait_s``, ShardUnavailable when a shard's Redis fails."""
        deadline = time.monotonic() + self.wait_s
        shard, hops = home, 0
        while True:
            try:
                marker = self.connections[shard].hget(self.key(shard), tenant_id)
            except redis.RedisError as exc:
                raise ShardUnavailable(shard, f"cannot read the tenant directory {self.key(shard)}: {exc}") from exc
            if marker is None:
                return shard
            if marker_text(marker) == FROZEN:
                time.sleep(self.poll_s)
                hops = 0  # markers followed since the last wait: moves back to back are no loop
            else:
                hops += 1
            shard = self._next(shard, tenant_id, marker_text(marker), deadline, hops)

    def _next(self, shard: int, tenant_id: str, marker: str, deadline: float, hops: int) -> int:
        """The shard to ask next after ``marker`` was read on ``shard``: the one it names, or (frozen) the
        same again. TenantMoving once a frozen tenant is still frozen past ``deadline``; the wait applies to
        frozen markers only, so a moved tenant is followed however small ``wait_s`` is (a break-it session
        found every call for a moved tenant failing with ``MNEMOS_MOVE_WAIT_S=0``). ShardUnavailable for a
        marker that names no shard of this client (an empty one included), and after ``hops`` shard
        markers followed since the last frozen one beyond twice the shards (markers that loop; a
        break-it session found a count over the whole call tripping on moves back to back)."""
        if marker == FROZEN:
            if time.monotonic() >= deadline:
                raise TenantMoving(shard, tenant_id, self.wait_s)
            return shard
        if hops > 2 * self.shards:
            raise ShardUnavailable(shard, f"the tenant directory's markers for {tenant_id!r} loop between shards")
        target = marker_shard(marker, self.shards)
        if target is None:
            raise ShardUnavailable(shard, f"the tenant directory names shard {marker!r} for {tenant_id!r}, "
                                          f"which this client (shards={self.shards}) does not have")
        return target

    def publish(self, messages: Sequence[tuple[str, Mapping[str, str]]], home_of: Callable[[str], int]) -> list[str]:
        """Append each ``(tenant_id, fields)`` message to the turns stream of the shard serving its
        tenant (:data:`PUBLISH_SCRIPT`, one call per shard and round); returns the stream ids in order.

        A tenant's messages travel together, so they keep their order. Raises TenantMoving (a tenant
        frozen past ``wait_s``: its messages were not sent; those of other tenants may have been) or
        ShardUnavailable (a shard's Redis failed; the message names the shards already published)."""
        ids = [""] * len(messages)
        todo = [(index, home_of(tenant)) for index, (tenant, _) in enumerate(messages)]
        deadline = time.monotonic() + self.wait_s
        done: set[int] = set()
        hops: dict[str, int] = {}  # tenant -> shard markers followed
        while todo:
            by_shard: dict[int, list[int]] = {}
            for index, shard in todo:
                by_shard.setdefault(shard, []).append(index)
            todo, frozen = [], False
            for shard, indexes in sorted(by_shard.items()):
                replies = self._run(shard, [messages[i] for i in indexes], done)
                after: dict[str, int] = {}  # tenant -> the shard its messages go to next
                for index, reply in zip(indexes, replies, strict=True):
                    kind, _, value = marker_text(reply).partition(":")
                    if kind == "id":
                        ids[index] = value
                        done.add(shard)
                        continue
                    tenant = messages[index][0]
                    if tenant not in after:
                        hops[tenant] = 0 if value == FROZEN else hops.get(tenant, 0) + 1
                        after[tenant] = self._next(shard, tenant, value, deadline, hops[tenant])
                    todo.append((index, after[tenant]))
                    frozen = frozen or value == FROZEN
            if frozen:
                time.sleep(self.poll_s)
        return ids

    def _run(self, shard: int, messages: Sequence[tuple[str, Mapping[str, str]]], done: set[int]) -> list[Any]:
        args: list[str] = []
        for tenant, fields in messages:
            flat = [str(part) for pair in fields.items() for part in pair]
            args += [tenant, str(len(flat)), *flat]
        stream = sharding.turns_stream(self.stream_prefix, shard, self.shards)
        try:
            script = self._scripts.get(shard)
            if script is None:
                script = self._scripts[shard] = self.connections[shard].register_script(PUBLISH_SCRIPT)
            return list(script(keys=[self.key(shard), stream], args=args))
        except redis.RedisError as exc:
            sent = f" (the turns of shard(s) {', '.join(map(str, sorted(done)))} were published)" if done else ""
            raise ShardUnavailable(shard, f"cannot publish to {stream}: {exc}{sent}") from exc


__all__ = ["FROZEN", "PUBLISH_SCRIPT", "Directory", "marked"]
