"""Which shard serves a tenant, and the Redis names of a shard (docs/scaling.md).

A deployment of ``shards`` shards routes each tenant to one shard with a consistent-hash ring: every
shard owns :data:`VIRTUAL_NODES` points on a 64-bit ring (``blake2b`` of ``"shard-<n>#<v>"``), and a
tenant belongs to the shard of the first point at or after ``blake2b(tenant_id)``, wrapping around
(Karger et al., *Consistent Hashing and Random Trees*, STOC 1997). The hashes are fixed functions
of the text, never Python's per-process ``hash()``, so every client and worker agrees. Growing from
``n`` to ``n + 1`` shards adds the new shard's points and removes none: only the tenants whose
successor point is now one of the new shard's move, about ``1 / (n + 1)`` of them, and all of
them move to the new shard.

Each shard has its own turns stream, outcomes stream, dead-letter stream and rq queue: the
unsharded names followed by ``:{shard-<n>}``. The braces are a Redis Cluster hash tag, so the
streams of a shard (and the keys derived from them) hash to one slot. With one shard the names
carry no suffix: an unsharded deployment keeps exactly the names it always had.
"""

from __future__ import annotations

import bisect
import hashlib
from functools import lru_cache

VIRTUAL_NODES = 1024
"""Points per shard on the ring. Part of the routing contract: changing it moves tenants."""


def ring_hash(text: str) -> int:
    """A stable unsigned 64-bit hash of ``text`` (blake2b, 8-byte digest, big-endian)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class ShardRing:
    """The consistent-hash ring of ``shards`` shards (numbered ``0 .. shards - 1``).

    Raises:
        ValueError: if ``shards`` < 1.
    """

    def __init__(self, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"shards must be >= 1, got {shards}")
        self.shards = shards
        points = sorted((ring_hash(f"shard-{shard}#{v}"), shard) for shard in range(shards)
                        for v in range(VIRTUAL_NODES))
        self._points = [point for point, _ in points]
        self._owners = [shard for _, shard in points]

    def shard_of(self, tenant_id: str) -> int:
        """The shard (``0 .. shards - 1``) that serves ``tenant_id``."""
        if self.shards == 1:
            return 0
        position = bisect.bisect_left(self._points, ring_hash(tenant_id))
        return self._owners[position % len(self._points)]


@lru_cache(maxsize=16)
def ring(shards: int) -> ShardRing:
    """The (cached) ring of ``shards`` shards."""
    return ShardRing(shards)


def shard_of(tenant_id: str, shards: int) -> int:
    """The shard of ``tenant_id`` among ``shards`` shards (see :class:`ShardRing`)."""
    return ring(shards).shard_of(tenant_id)


def shard_suffix(shard: int, shards: int) -> str:
    """What a shard's Redis names end with: ``""`` with one shard, else ``":{shard-<shard>}"``.

    Raises:
        ValueError: if ``shard`` is not within ``0 .. shards - 1``.
    """
    if not 0 <= shard < shards:
        raise ValueError(f"shard must be within 0..{shards - 1}, got {shard}")
    return "" if shards == 1 else f":{{shard-{shard}}}"


def turns_stream(prefix: str, shard: int = 0, shards: int = 1) -> str:
    """The turns (and forget events) stream of a shard: ``<prefix>:turns[:{shard-n}]``."""
    return f"{prefix}:turns{shard_suffix(shard, shards)}"


def outcomes_stream(prefix: str, shard: int = 0, shards: int = 1) -> str:
    """The outcomes stream of a shard: ``<prefix>:outcomes[:{shard-n}]``."""
    return f"{prefix}:outcomes{shard_suffix(shard, shards)}"


def dead_letter_stream(prefix: str, shard: int = 0, shards: int = 1) -> str:
    """The dead-letter stream of a shard's turns: ``<prefix>:turns:dead[:{shard-n}]``."""
    return f"{prefix}:turns:dead{shard_suffix(shard, shards)}"


def moved_ids_key(turns_stream: str) -> str:
    """The hash of the messages tenant moves appended to ``turns_stream`` (``<turns stream>:moved``,
    in the stream's hash slot): :func:`moved_field` of each message's id on the source shard to its
    id here, so a caller holding the id ``publish_turn`` returned before the move can follow it
    (``MnemosClient.acknowledged``). It expires a while after the last move to this shard."""
    return f"{turns_stream}:moved"


def tenant_digest(tenant_id: str) -> str:
    """A 16-hex-digit hash of ``tenant_id``: keys and fields that must name a tenant (its rq job ids,
    its moved message ids) hold this, never the tenant id in the clear."""
    return hashlib.blake2b(tenant_id.encode(), digest_size=8).hexdigest()


def moved_field(tenant_id: str, stream_id: str) -> str:
    """The :func:`moved_ids_key` field of ``tenant_id``'s message ``stream_id`` of the shard it left:
    :func:`tenant_digest` and the id."""
    return f"{tenant_digest(tenant_id)}:{stream_id}"


def moved_floor_field(tenant_id: str) -> str:
    """The :func:`moved_ids_key` field holding the last id the shard ``tenant_id`` left had given out
    when it moved: an id of the tenant up to it without a :func:`moved_field` entry was committed, or
    covered by a forget, before the move."""
    return moved_field(tenant_id, "floor")


def directory_key(prefix: str, shard: int = 0, shards: int = 1) -> str:
    """The tenant directory of a shard's Redis: ``<prefix>:directory[:{shard-n}]``, a hash of the tenants
    this shard does *not* serve although the ring or an earlier move sends clients here, each to
    ``"frozen"`` (being moved: hold its publishes and retrievals) or to the shard that serves it now
    (``api.directory``, docs/scaling.md "Moving a tenant between shards"). Its hash tag is the shard's,
    so a script may read it and append to the shard's turns stream atomically."""
    return f"{prefix}:directory{shard_suffix(shard, shards)}"


def queue_name(base: str, shard: int = 0, shards: int = 1) -> str:
    """The rq queue of a shard's retrievals: ``<base>[:{shard-n}]``."""
    return f"{base}{shard_suffix(shard, shards)}"
