"""The forget methods of the in-memory store (docs/architecture.md "Forget"), mixed into
:class:`workers.store.fake.FakeTenantSession`; they behave like
:class:`workers.store.postgres_forget.PostgresForget` (the store contract test runs both)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from workers.runtime.errors import StoreError
from workers.runtime.streams import stream_position
from workers.store.rows import EntryLink, EntryRow, Tombstone

if TYPE_CHECKING:
    from workers.store.fake_tables import _Entry, _Tables


class FakeForget:
    """Forget methods over a fake session's tables (a mixin: the session provides ``_tenant_id``,
    ``_t``, ``_write`` and ``_entries``)."""

    _tenant_id: str

    if TYPE_CHECKING:  # provided by the session
        @property
        def _t(self) -> _Tables: ...

        def _write(self) -> _Tables: ...

        def _entries(self) -> list[tuple[int, _Entry]]: ...

        def _update_tenant(self, **changes: Any) -> Any: ...

    def bump_forget_version(self) -> None:
        row = self._write().tenants.get(self._tenant_id)
        if row is not None:
            self._update_tenant(memory_version=row.memory_version + 1, forget_version=row.forget_version + 1)

    def entry_links(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None
                    ) -> list[EntryLink]:
        wanted = None if turn_ids is None else set(turn_ids)
        return [_link(i, e.row) for i, e in self._entries()
                if (wanted is None or e.row.turn_id in wanted) and (session_id is None or e.row.session_id == session_id)]

    def aliases_of(self, entry_ids: Sequence[int]) -> list[EntryLink]:
        wanted = set(entry_ids)
        return [_link(i, e.row) for i, e in self._entries() if e.row.canonical_entry_id in wanted]

    def set_canonical(self, changes: Mapping[int, int | None]) -> None:
        tables = self._write()
        for entry_id, canonical in changes.items():
            entry = tables.entries.get(entry_id)
            if entry is not None and entry.tenant_id == self._tenant_id:
                entry.row = replace(entry.row, canonical_entry_id=canonical)

    def delete_entries(self, entry_ids: Sequence[int]) -> None:
        tables = self._write()
        doomed = {i for i in entry_ids if i in tables.entries and tables.entries[i].tenant_id == self._tenant_id}
        if any(e.row.canonical_entry_id in doomed for i, e in tables.entries.items() if i not in doomed):
            raise StoreError("ForeignKeyViolation: an alias still names a deleted entry", transient=False)
        tables.suppression = {k: v for k, v in tables.suppression.items()
                              if not (k[0] == self._tenant_id and k[1] in doomed)}
        for entry_id in doomed:
            del tables.entries[entry_id]

    def delete_dead_letters(self, *, turn_ids: Sequence[str] | None = None, session_id: str | None = None,
                            through: tuple[str, str] | None = None) -> int:
        tables = self._write()
        wanted = None if turn_ids is None else set(turn_ids)

        def later(letter: Any) -> bool:
            if through is None or letter.stream != through[0]:
                return False
            try:
                return stream_position(letter.stream_id) > stream_position(through[1])
            except ValueError:
                return False

        def doomed(letter: Any) -> bool:
            if letter.tenant_id != self._tenant_id or later(letter):
                return False
            if wanted is not None:
                return letter.turn_id in wanted or letter.payload.get("turn_id") in wanted
            return session_id is None or letter.payload.get("session_id") == session_id

        keys = [key for key, letter in tables.dead_letters.items() if doomed(letter)]
        for key in keys:
            del tables.dead_letters[key]
        return len(keys)

    def delete_tenant_state(self) -> None:
        tables = self._write()
        tenant = self._tenant_id
        tables.suppression = {k: v for k, v in tables.suppression.items() if k[0] != tenant}
        tables.ledger = {k: v for k, v in tables.ledger.items() if k[0] != tenant}
        tables.buffer.pop(tenant, None)
        tables.centroids.pop(tenant, None)

    def tombstones(self, *, session_ids: Sequence[str], turn_ids: Sequence[str]) -> list[Tombstone]:
        keys = {("tenant", "")} | {("session", s) for s in session_ids} | {(scope, t) for t in turn_ids
                                                                           for scope in ("turn", "swept", "replace")}
        return sorted((t for (tenant, scope, key), t in self._t.tombstones.items()
                       if tenant == self._tenant_id and (scope, key) in keys), key=lambda t: (t.scope, t.key))

    def swept_at(self, stream_ms: int, stream_seq: int) -> list[str]:
        return sorted(key for (tenant, scope, key), t in self._t.tombstones.items()
                      if tenant == self._tenant_id and scope == "swept" and t.stream_position == (stream_ms, stream_seq))

    def add_tombstones(self, rows: Sequence[Tombstone]) -> None:
        tables = self._write()
        for row in rows:
            key = (self._tenant_id, row.scope, row.key)
            old = tables.tombstones.get(key)
            if old is None or old.stream_position < row.stream_position:
                readd = None if old is None else old.readd_position
                kept = readd if readd is not None and readd > row.stream_position else None
                tables.tombstones[key] = replace(row, readd_ms=kept and kept[0], readd_seq=kept and kept[1])

    def record_repeat(self, turn_id: str, stream_id: str, readd: bool) -> None:
        at, tables = stream_position(stream_id), self._write()
        for entry in tables.entries.values():
            row = entry.row
            if entry.tenant_id != self._tenant_id or row.turn_id != turn_id:
                continue
            if row.readd_ms is None and row.stream_id is not None and at < stream_position(row.stream_id):
                row = replace(row, stream_id=stream_id)
            if readd and (row.readd_ms is None or (row.readd_ms, row.readd_seq or 0) < at):
                row = replace(row, readd_ms=at[0], readd_seq=at[1])
            entry.row = row

    def mark_readded(self, turn_ids: Sequence[str], at: tuple[int, int]) -> None:
        tables = self._write()
        for key in [(self._tenant_id, scope, turn_id) for turn_id in turn_ids for scope in ("turn", "swept")]:
            stone = tables.tombstones.get(key)
            if stone is not None and stone.stream_position < at and (
                    stone.readd_position is None or at < stone.readd_position):
                tables.tombstones[key] = replace(stone, readd_ms=at[0], readd_seq=at[1])


def _link(entry_id: int, row: EntryRow) -> EntryLink:
    """What a forget reads of the stored entry ``row`` (an :class:`EntryLink`)."""
    return EntryLink(entry_id, row.turn_id, row.session_id, row.canonical_entry_id, row.stream_id, row.readd_ms,
                     row.readd_seq)
