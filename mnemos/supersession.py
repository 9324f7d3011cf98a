"""Which turns later turns correct: the ``metadata.supersedes`` of published turns, per tenant.

A turn may name, in ``metadata.supersedes``, the turn ids of earlier turns it corrects ("I moved
to Berlin" superseding "I live in Paris"). A :class:`SupersessionTable` records every such claim
with the correcting turn's time, so an evidence packet (:mod:`mnemos.packets`) can leave the
corrected turns out of a current answer while a request whose knowledge time ``as_of`` falls
before the correction still sees them (docs/architecture.md "Evidence packets").

Nothing here reads a clock: ``as_of`` is whatever the caller says; None means "now" (every
recorded correction counts).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from mnemos.errors import InvalidParameterError

__all__ = ["Correction", "SupersessionTable"]


@dataclass(frozen=True)
class Correction:
    """A turn that supersedes another: its turn id and when it occurred (tz-aware)."""

    turn_id: str
    occurred_at: datetime


class SupersessionTable:
    """``superseded turn id -> corrections`` of one tenant (append-only, like the tenant's index).

    A turn naming itself is ignored; naming a turn id the tenant never had is kept (the corrected
    turn may arrive later, or be an alias).
    """

    def __init__(self) -> None:
        self._by_target: dict[str, list[Correction]] = {}

    def __len__(self) -> int:
        """Number of superseded turn ids."""
        return len(self._by_target)

    def add(self, turn_id: str, occurred_at: datetime, supersedes: Sequence[str]) -> None:
        """Record that turn ``turn_id`` (at tz-aware ``occurred_at``) corrects the turns ``supersedes``.

        Raises:
            InvalidParameterError: if ``occurred_at`` is naive or ``supersedes`` is one string.
        """
        if occurred_at.tzinfo is None or occurred_at.utcoffset() is None:
            raise InvalidParameterError(f"turn {turn_id!r}: occurred_at must be tz-aware")
        if isinstance(supersedes, str):
            raise InvalidParameterError("supersedes must be a sequence of turn ids, not one string")
        correction = Correction(turn_id, occurred_at)
        for target in dict.fromkeys(supersedes):
            if target != turn_id and correction not in self._by_target.get(target, ()):
                self._by_target.setdefault(target, []).append(correction)

    def superseding(self, turn_ids: Iterable[str], as_of: datetime | None = None,
                    exclude: Collection[str] = (), after: datetime | None = None) -> Correction | None:
        """The newest correction of any of ``turn_ids`` visible at ``as_of``, or None.

        A correction is visible when it occurred at or before ``as_of`` (None: always). Corrections
        made by a turn in ``exclude`` (an entry's own turns: a duplicate cannot correct itself) do
        not count, nor, with ``after`` (the corrected turn's own time), corrections that did not
        occur strictly later: a turn cannot correct a newer one, and so two turns that name each
        other (a cycle) cannot hide both. Ties in time go to the smaller turn id, so the answer is
        deterministic.
        """
        best: Correction | None = None
        for target in turn_ids:
            for correction in self._by_target.get(target, ()):
                if correction.turn_id in exclude or (as_of is not None and correction.occurred_at > as_of):
                    continue
                if after is not None and correction.occurred_at <= after:
                    continue
                if best is None or correction.occurred_at > best.occurred_at or (
                        correction.occurred_at == best.occurred_at and correction.turn_id < best.turn_id):
                    best = correction
        return best
