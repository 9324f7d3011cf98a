"""Which entries a retrieval may consider: knowledge time (``as_of``) and filters, as a candidate set.

An :class:`EntryFilter` is a pure value: an optional knowledge time ``as_of`` (only turns with
``occurred_at <= as_of``), an optional inclusive lower bound ``occurred_after``, and optional sets
of session ids and roles. A :class:`TurnTable` records the :class:`~mnemos.records.TurnFacts` of
every turn of one tenant, canonical and alias, next to the entry that stands for it, and turns a
filter into the sorted ids of the allowed entries with a few vectorised comparisons.

An entry is allowed when ANY of its turns is admitted: an alias (a dedupe duplicate) keeps its
own session, role and time, and dedupe must not lose what it said, so a canonical entry passes a
filter when one of its aliases does (the hit then shows that alias's turn id, session, role and
time, :meth:`mnemos.tenant_index.TenantIndex.shown`, never a turn the filter refused).

The retrievers apply the allowed ids inside candidate generation (BM25 scores only allowed
documents, dense search runs under a faiss ID selector), so a selective filter still returns the
best allowed entries. Nothing here reads a clock: ``as_of`` is whatever the caller says.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from mnemos.errors import InvalidParameterError
from mnemos.records import TurnFacts

__all__ = ["EntryFilter", "TurnTable"]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    """Microseconds since the Unix epoch of a tz-aware time (exact: datetimes have microsecond resolution)."""
    return (moment - _EPOCH) // _MICROSECOND


def _aware(value: datetime | None, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise InvalidParameterError(f"{name} must be a tz-aware datetime, got {value!r}")
    return value.astimezone(UTC)


def _names(value: Iterable[str] | None, name: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise InvalidParameterError(f"{name} must be a collection of strings, not one string")
    names = frozenset(value)
    if not names:
        raise InvalidParameterError(f"{name} must not be empty (None means no restriction)")
    if not all(isinstance(n, str) for n in names):
        raise InvalidParameterError(f"{name} must hold strings only")
    return names


@dataclass(frozen=True)
class EntryFilter:
    """Which turns a retrieval may see; every field None (the default) admits everything.

    Attributes:
        as_of: knowledge time, tz-aware: only turns with ``occurred_at <= as_of``.
        occurred_after: tz-aware inclusive lower bound: only turns with ``occurred_at >= occurred_after``.
        session_ids: only turns of these sessions (non-empty; None: any session).
        roles: only turns of these speakers (non-empty; None: any role).

    Times are stored in UTC. The conditions are ANDed on one turn; an entry passes when any of
    its turns (canonical or alias) passes.

    Raises:
        InvalidParameterError: naive or non-datetime times, ``occurred_after > as_of``, an empty
            or non-string set.
    """

    as_of: datetime | None = None
    occurred_after: datetime | None = None
    session_ids: frozenset[str] | None = None
    roles: frozenset[str] | None = None

    def __post_init__(self) -> None:
        as_of = _aware(self.as_of, "as_of")
        after = _aware(self.occurred_after, "occurred_after")
        if as_of is not None and after is not None and after > as_of:
            raise InvalidParameterError(f"occurred_after {after.isoformat()} is later than as_of {as_of.isoformat()}")
        object.__setattr__(self, "as_of", as_of)
        object.__setattr__(self, "occurred_after", after)
        object.__setattr__(self, "session_ids", _names(self.session_ids, "session_ids"))
        object.__setattr__(self, "roles", _names(self.roles, "roles"))

    @property
    def is_open(self) -> bool:
        """True when the filter restricts nothing (the unfiltered code path is used)."""
        return self.as_of is None and self.occurred_after is None and self.session_ids is None and self.roles is None

    def admits(self, facts: TurnFacts) -> bool:
        """True when one turn with ``facts`` passes every condition (the scalar form of :meth:`TurnTable.allowed`)."""
        return ((self.as_of is None or facts.occurred_at <= self.as_of)
                and (self.occurred_after is None or facts.occurred_at >= self.occurred_after)
                and (self.session_ids is None or facts.session_id in self.session_ids)
                and (self.roles is None or facts.role in self.roles))


TURN_BYTES = 140
"""Estimated bytes per recorded turn: four list slots, its entry id and time as Python ints, and the
four int64 columns built from them."""


class TurnTable:
    """Append-only columns of every turn of one tenant: owning entry id, time, session and role codes.

    Sessions and roles are interned to small ints; times are int64 microseconds since the epoch.
    The numpy columns are rebuilt lazily, once, on the first :meth:`allowed` after adds.
    """

    def __init__(self) -> None:
        self._entry_ids: list[int] = []
        self._micros: list[int] = []
        self._sessions: list[int] = []
        self._roles: list[int] = []
        self._session_codes: dict[str, int] = {}
        self._role_codes: dict[str, int] = {}
        self._columns: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        """Number of turns recorded."""
        return len(self._entry_ids)

    def memory_bytes(self) -> int:
        """Estimated bytes held: :data:`TURN_BYTES` per turn."""
        return len(self._entry_ids) * TURN_BYTES

    def add(self, entry_ids: Sequence[int], facts: Sequence[TurnFacts]) -> None:
        """Record turns: ``facts[i]`` is a turn that entry ``entry_ids[i]`` stands for.

        Raises:
            InvalidParameterError: if the sequences differ in length or a time is naive.
        """
        if len(entry_ids) != len(facts):
            raise InvalidParameterError(f"{len(entry_ids)} entry ids but {len(facts)} turn facts")
        for entry_id, turn in zip(entry_ids, facts, strict=True):
            if turn.occurred_at.tzinfo is None or turn.occurred_at.utcoffset() is None:
                raise InvalidParameterError(f"turn of entry {entry_id}: occurred_at must be tz-aware")
        for entry_id, turn in zip(entry_ids, facts, strict=True):
            self._entry_ids.append(int(entry_id))
            self._micros.append(_micros(turn.occurred_at))
            self._sessions.append(self._session_codes.setdefault(turn.session_id, len(self._session_codes)))
            self._roles.append(self._role_codes.setdefault(turn.role, len(self._role_codes)))
        if entry_ids:
            self._columns = None

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if self._columns is None:
            self._columns = (np.asarray(self._entry_ids, dtype=np.int64), np.asarray(self._micros, dtype=np.int64),
                             np.asarray(self._sessions, dtype=np.int64), np.asarray(self._roles, dtype=np.int64))
        return self._columns

    def allowed(self, entry_filter: EntryFilter) -> np.ndarray:
        """Sorted unique ``(n_allowed,)`` int64 ids of the entries with at least one admitted turn.

        Names the filter lists that this tenant never used (another tenant's session id, say)
        simply admit nothing.
        """
        entry_ids, micros, sessions, roles = self._arrays()
        ok = np.ones(entry_ids.shape[0], dtype=bool)
        if entry_filter.as_of is not None:
            ok &= micros <= _micros(entry_filter.as_of)
        if entry_filter.occurred_after is not None:
            ok &= micros >= _micros(entry_filter.occurred_after)
        for column, codes, names in ((sessions, self._session_codes, entry_filter.session_ids),
                                     (roles, self._role_codes, entry_filter.roles)):
            if names is not None:
                wanted = np.asarray([codes[n] for n in names if n in codes], dtype=np.int64)
                ok &= np.isin(column, wanted)
        return np.unique(entry_ids[ok])
