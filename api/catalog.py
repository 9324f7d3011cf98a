"""Catalog reads of a tenant's stored memory (wire schema ``v`` = 1): its sessions, or turns by id.

A catalog request is an rq job on the query workers' queue like a retrieval (JSON, never pickle),
so the queue stays the one path into the workers: the job function ``workers.query.catalog.catalog_job``
reads Postgres in one transaction scoped to the tenant (row-level security underneath) and returns
a :class:`CatalogResult`. Nothing is ranked, no outcome is sent, and nothing is cached.

* ``sessions``: every session of the tenant with the time of its first and last stored turn and
  its number of stored turns (aliases included: a deduplicated turn is still a turn said);
* ``turns``: the stored turns among ``turn_ids`` (at most ``max_filter_values``; an unknown or
  forgotten id is simply absent from the answer), with their text and metadata.

The MCP server's ``list_sessions`` tool and the LangGraph store's ``get`` read through it
(``integrations/``). Query workers older than this module fail the job (rq cannot import the
function): upgrade the query workers before clients call :meth:`api.client.MnemosClient.sessions`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from api.errors import InvalidInputError, Reason
from api.validation import SCHEMA_VERSION, Limits, check_id, check_id_list, check_version, check_zoned_time

CATALOG_JOB = "workers.query.catalog.catalog_job"  # resolved by the query worker, never imported here


class CatalogKind(StrEnum):
    """What a catalog request reads."""

    SESSIONS = "sessions"
    TURNS = "turns"


@dataclass(frozen=True)
class CatalogRequest:
    """One catalog read of one tenant (``turn_ids`` non-empty exactly for :attr:`CatalogKind.TURNS`)."""

    tenant_id: str
    kind: CatalogKind
    request_id: str
    turn_ids: tuple[str, ...] = ()
    v: int = SCHEMA_VERSION

    @classmethod
    def parse(cls, values: Mapping[str, Any], limits: Limits) -> CatalogRequest:
        """Validate a request payload (a missing ``request_id`` gets a random one); raises
        InvalidInputError (``malformed_message`` for an unknown kind or ids that do not fit it)."""
        version = check_version(values.get("v"))
        tenant_id = check_id(values.get("tenant_id"), "tenant_id", limits)
        request_id = values.get("request_id")
        request_id = check_id(uuid.uuid4().hex if request_id is None else request_id, "request_id", limits)
        try:
            kind = CatalogKind(str(values.get("kind")))
        except ValueError:
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "kind",
                                    f"must be one of {', '.join(k.value for k in CatalogKind)}") from None
        raw_ids = values.get("turn_ids")
        if (raw_ids is not None) != (kind is CatalogKind.TURNS):
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "turn_ids", f"is for kind turns only (kind {kind})")
        turn_ids = () if raw_ids is None else check_id_list(raw_ids, "turn_ids", limits)
        return cls(tenant_id=tenant_id, kind=kind, request_id=request_id, turn_ids=turn_ids, v=version)

    def to_payload(self) -> dict[str, Any]:
        """The job's JSON argument."""
        payload: dict[str, Any] = {"v": self.v, "tenant_id": self.tenant_id, "kind": self.kind.value,
                                   "request_id": self.request_id}
        if self.kind is CatalogKind.TURNS:
            payload["turn_ids"] = list(self.turn_ids)
        return payload


@dataclass(frozen=True)
class SessionSummary:
    """One session of a tenant: its first and last stored turn's ``occurred_at`` (UTC) and how many
    stored turns it has (canonical entries and aliases)."""

    session_id: str
    first_at: datetime
    last_at: datetime
    turns: int

    def to_payload(self) -> dict[str, Any]:
        """JSON fields (times ISO 8601)."""
        return {"session_id": self.session_id, "first_at": self.first_at.isoformat(),
                "last_at": self.last_at.isoformat(), "turns": self.turns}

    @classmethod
    def from_payload(cls, value: Mapping[str, Any]) -> SessionSummary:
        """Parse :meth:`to_payload`'s fields (raises KeyError, ValueError or InvalidInputError)."""
        return cls(str(value["session_id"]), check_zoned_time(value["first_at"], "first_at"),
                   check_zoned_time(value["last_at"], "last_at"), int(value["turns"]))


@dataclass(frozen=True)
class TurnRecord:
    """A stored turn as published (``role`` is the speaker; ``metadata`` ``{}`` when it had none)."""

    turn_id: str
    session_id: str
    role: str
    text: str
    occurred_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def to_payload(self) -> dict[str, Any]:
        """JSON fields (``occurred_at`` ISO 8601)."""
        return {"turn_id": self.turn_id, "session_id": self.session_id, "role": self.role, "text": self.text,
                "occurred_at": self.occurred_at.isoformat(), "metadata": dict(self.metadata)}

    @classmethod
    def from_payload(cls, value: Mapping[str, Any]) -> TurnRecord:
        """Parse :meth:`to_payload`'s fields (raises KeyError, ValueError or InvalidInputError)."""
        return cls(str(value["turn_id"]), str(value["session_id"]), str(value["role"]), str(value["text"]),
                   check_zoned_time(value["occurred_at"], "occurred_at"), dict(value.get("metadata") or {}))


@dataclass(frozen=True)
class CatalogResult:
    """A catalog job's answer: ``sessions`` ordered by first turn, then id (kind ``sessions``), or
    ``turns`` in the order of the request's ids (kind ``turns``); the other one is empty."""

    request_id: str
    tenant_id: str
    sessions: tuple[SessionSummary, ...] = ()
    turns: tuple[TurnRecord, ...] = ()
    v: int = SCHEMA_VERSION

    def to_payload(self) -> dict[str, Any]:
        """The job's JSON return value."""
        return {"v": self.v, "request_id": self.request_id, "tenant_id": self.tenant_id,
                "sessions": [s.to_payload() for s in self.sessions], "turns": [t.to_payload() for t in self.turns]}

    @classmethod
    def from_payload(cls, value: Mapping[str, Any]) -> CatalogResult:
        """Parse a job's return value (raises KeyError, ValueError or InvalidInputError when malformed)."""
        return cls(str(value["request_id"]), str(value["tenant_id"]),
                   tuple(SessionSummary.from_payload(s) for s in value.get("sessions", ())),
                   tuple(TurnRecord.from_payload(t) for t in value.get("turns", ())),
                   check_version(value.get("v")))
