"""The forget event (wire schema ``v`` = 1) and the re-add flag of a turn message.

A forget travels on the turns stream ``<prefix>:turns``, so it is ordered with the turns around
it: the ingest worker applies it after every earlier message of the stream and before every later
one (docs/architecture.md "Forget"). Its flat string fields:

* ``v``, ``kind`` = ``"forget"`` (a turn message has no ``kind``), ``tenant_id``;
* ``scope``: ``"tenant"`` (everything of the tenant), ``"session"`` (with ``session_id``) or
  ``"turns"`` (with ``turn_ids``, a JSON list of at most ``max_filter_values`` turn ids).

A turn message may carry ``readd`` = ``"1"``: the client re-adds a turn it forgot before. Without
it, a turn whose id a forget covered is dropped when it arrives again (a redelivery, or a
publish after the forget). ``readd`` = ``"replace"`` is a forget of the turn's id and its re-add in
one message (:meth:`api.client.MnemosClient.replace_turn`): one ingest consumer applies both, in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from api.errors import InvalidInputError, Reason
from api.validation import SCHEMA_VERSION, Limits, check_id, check_id_list, check_version, text_fields

KIND_FIELD = "kind"
FORGET_KIND = "forget"
READD_FIELD = "readd"
REPLACE_VALUE = "replace"  # READD_FIELD's value for a forget of the turn's id and its re-add in one message


class ForgetScope(StrEnum):
    """What one forget erases."""

    TENANT = "tenant"
    SESSION = "session"
    TURNS = "turns"


def is_forget_message(raw: Mapping[bytes, bytes]) -> bool:
    """True when a turns-stream message is a forget event (its ``kind`` field says so)."""
    return raw.get(KIND_FIELD.encode()) == FORGET_KIND.encode()


def is_readd(raw: Mapping[bytes, bytes]) -> bool:
    """True when a turn message asks to re-add a turn a forget covered (``readd`` = ``"1"``, or
    ``"replace"``: see :func:`is_replace`)."""
    return raw.get(READD_FIELD.encode()) in (b"1", b"true", REPLACE_VALUE.encode())


def is_replace(raw: Mapping[bytes, bytes]) -> bool:
    """True when a turn message replaces its turn id: a forget of that id at the message's own
    stream position, then the turn re-added (``readd`` = ``"replace"``)."""
    return raw.get(READD_FIELD.encode()) == REPLACE_VALUE.encode()


@dataclass(frozen=True)
class ForgetRequest:
    """One forget of a tenant's memory: the whole tenant, one session, or a list of turn ids.

    ``session_id`` is set only for :attr:`ForgetScope.SESSION`, ``turn_ids`` (non-empty, without
    repeats) only for :attr:`ForgetScope.TURNS`.
    """

    tenant_id: str
    scope: ForgetScope
    session_id: str | None = None
    turn_ids: tuple[str, ...] = ()
    v: int = SCHEMA_VERSION

    @classmethod
    def parse(cls, values: Mapping[str, Any], limits: Limits) -> ForgetRequest:
        """Validate field values (stream fields as text, or user input; ``turn_ids`` as a list or
        its JSON text). Raises InvalidInputError (``bad_forget`` for a wrong scope or its fields)."""
        version = check_version(values.get("v"))
        tenant_id = check_id(values.get("tenant_id"), "tenant_id", limits)
        try:
            scope = ForgetScope(str(values.get("scope")))
        except ValueError:
            raise InvalidInputError(Reason.BAD_FORGET, "scope",
                                    f"must be one of {', '.join(s.value for s in ForgetScope)}") from None
        session_id, turn_ids = values.get("session_id"), values.get("turn_ids")
        if (session_id is not None) != (scope is ForgetScope.SESSION):
            raise InvalidInputError(Reason.BAD_FORGET, "session_id", f"is for scope session only (scope {scope})")
        if (turn_ids is not None) != (scope is ForgetScope.TURNS):
            raise InvalidInputError(Reason.BAD_FORGET, "turn_ids", f"is for scope turns only (scope {scope})")
        if isinstance(turn_ids, str):
            try:
                turn_ids = json.loads(turn_ids)
            except (ValueError, RecursionError):
                raise InvalidInputError(Reason.BAD_FORGET, "turn_ids", "is not a JSON list") from None
        try:
            ids = () if turn_ids is None else check_id_list(turn_ids, "turn_ids", limits)
        except InvalidInputError as exc:
            raise InvalidInputError(Reason.BAD_FORGET, exc.field, exc.detail) from None
        return cls(tenant_id=tenant_id, scope=scope,
                   session_id=None if session_id is None else check_id(session_id, "session_id", limits),
                   turn_ids=ids, v=version)

    @classmethod
    def from_stream_fields(cls, raw: Mapping[bytes, bytes], limits: Limits) -> ForgetRequest:
        """Decode and validate a forget message of the turns stream; raises InvalidInputError."""
        values = text_fields(raw)
        values.pop(KIND_FIELD, None)
        return cls.parse(values, limits)

    def to_stream_fields(self) -> dict[str, str]:
        """Flat string fields for XADD."""
        fields = {"v": str(self.v), KIND_FIELD: FORGET_KIND, "tenant_id": self.tenant_id, "scope": self.scope.value}
        if self.session_id is not None:
            fields["session_id"] = self.session_id
        if self.scope is ForgetScope.TURNS:
            fields["turn_ids"] = json.dumps(list(self.turn_ids), ensure_ascii=False)
        return fields

    @classmethod
    def replacing(cls, tenant_id: str, turn_id: str) -> ForgetRequest:
        """The forget half of a replacement (:func:`is_replace`) of ``turn_id``: a forget of that id."""
        return cls(tenant_id, ForgetScope.TURNS, turn_ids=(turn_id,))

    def covers(self, session_id: str, turn_id: str) -> bool:
        """True when this forget erases a turn of its tenant with these ids."""
        if self.scope is ForgetScope.TENANT:
            return True
        if self.scope is ForgetScope.SESSION:
            return session_id == self.session_id
        return turn_id in self.turn_ids
