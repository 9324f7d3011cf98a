"""Removing the consumers that dead workers left in a stream's consumer group.

Every worker process joins its group under a name of its own (``<kind>-<host>-<pid>``), so each
restart, crash or rescheduled pod leaves one more name in ``XINFO CONSUMERS``, forever. A name
with nothing pending holds nothing: removing it loses no entry, and a live consumer removed by
mistake is created again by its next read. So the consumers are pruned that have **no pending
entries** and have been idle for longer than ``idle_ms`` (an hour by default, far above any read
block or batch), checked and removed in one server-side script, atomically: a consumer cannot be
handed an entry between the check and the removal. A consumer with pending entries is never
removed here; ``XAUTOCLAIM`` moves its entries to a live consumer first, and a later prune then
removes its name.
"""

from __future__ import annotations

import logging

import redis

log = logging.getLogger(__name__)

PRUNE_IDLE_MS = 3_600_000
"""Milliseconds without any read after which a consumer with nothing pending is removed."""

_PRUNE = """
local removed = {}
for _, fields in ipairs(redis.call('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])) do
  local info = {}
  for i = 1, #fields, 2 do info[fields[i]] = fields[i + 1] end
  if info['name'] ~= ARGV[3] and tonumber(info['pending']) == 0 and tonumber(info['idle']) > tonumber(ARGV[2]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], info['name'])
    table.insert(removed, info['name'])
  end
end
return removed
"""


def prune_idle_consumers(connection: redis.Redis, stream: str, group: str, *, keep: str,
                         idle_ms: int = PRUNE_IDLE_MS) -> list[str]:
    """Remove ``group``'s consumers of ``stream`` that have nothing pending and were idle over
    ``idle_ms`` milliseconds, never ``keep`` (the caller's own name). Returns the removed names.

    Raises:
        redis.RedisError: Redis refused (no such group or stream: ``NOGROUP``), or is unreachable.
    """
    removed = connection.eval(_PRUNE, 1, stream, group, int(idle_ms), keep)
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in removed or []]
    if names:
        log.info("%s/%s: removed %d consumer(s) idle over %d s with nothing pending: %s", stream, group,
                 len(names), idle_ms // 1000, ", ".join(names[:5]) + (" …" if len(names) > 5 else ""))
    return names
