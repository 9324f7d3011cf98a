"""Liveness of one process's work loop: has it advanced within the bound its last beat promised?

The loop's :class:`~workers.runtime.heartbeats.Heartbeat` calls :meth:`Liveness.extend` on every beat with
the time the loop may take before its next one: the heartbeat TTL while idle (a blocking read returns
well within it: the socket timeout is shorter), the TTL plus the longest legitimate batch or job while
busy. The metrics server's ``GET /livez`` (:func:`workers.runtime.metrics.start_server`) answers 503 once that
deadline has passed, so a Kubernetes liveness probe restarts a worker whose loop is stuck (a hung
Redis or Postgres call, a job that ignores its timeout) while its metrics thread still answers.

Thread-safe: the loop writes, the HTTP thread reads (one float, replaced atomically).
"""

from __future__ import annotations

import time
from collections.abc import Callable


class Liveness:
    """The deadline by which this process's work loop must beat again.

    Args:
        start_allowance_s: seconds the loop has to beat for the first time (from construction).
        monotonic: clock in seconds (tests inject one).
    """

    def __init__(self, start_allowance_s: float, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.monotonic = monotonic
        self._deadline = monotonic() + start_allowance_s
        self._last_beat: float | None = None

    def extend(self, seconds: float) -> None:
        """The loop advanced now; it must advance again within ``seconds``."""
        now = self.monotonic()
        self._last_beat = now
        self._deadline = now + seconds

    def overdue_s(self) -> float:
        """Seconds past the deadline (negative while the loop is within its bound)."""
        return self.monotonic() - self._deadline

    def alive(self) -> bool:
        return self.overdue_s() <= 0

    def report(self) -> tuple[bool, str]:
        """``(alive, one line)`` for the probe's response body."""
        overdue = self.overdue_s()
        since = "never beat" if self._last_beat is None else f"last beat {self.monotonic() - self._last_beat:.1f}s ago"
        if overdue <= 0:
            return True, f"ok: work loop advancing ({since})"
        return False, f"work loop stalled: {since}, {overdue:.1f}s past its bound"


__all__ = ["Liveness"]
