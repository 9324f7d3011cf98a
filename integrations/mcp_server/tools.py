"""What the MCP tools do, over :class:`api.client.MnemosClient`, for one tenant per call.

:class:`MemoryTools` holds the plain logic (synchronous: the SDK runs each call in a worker thread);
:mod:`integrations.mcp_server.server` gives the tools their schemas and descriptions and decides the
tenant, which is never an argument here that a model could set. Every failure a caller can cause or
meet (an invalid argument, an oversized text, a queue timeout, Redis down, no query worker, a tenant
with no memories, a forget of something not stored) leaves as a ``ToolError`` whose message is one
sentence (:func:`tool_errors`); the SDK returns it as a tool error and the server keeps serving.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel, Field

from api.client import MnemosClient
from api.errors import (
    InvalidInputError,
    NoQueryWorker,
    Reason,
    RetrievalFailed,
    RetrievalTimeout,
    ServiceUnavailable,
)
from api.packets import Packet
from api.validation import DEFAULT_K, check_id, check_wait_or_zero

DEFAULT_SPEAKER = "user"
_ARGUMENTS = {"role": "speaker", "occurred_at": "timestamp", "filters.session_ids": "session_id",
              "filters.roles": "speaker", "turn_ids": "turn_id"}  # wire field -> the tool's argument
_TOO_LARGE = {Reason.TEXT_TOO_LARGE, Reason.QUERY_TOO_LARGE, Reason.METADATA_TOO_LARGE}


class MemoryHit(BaseModel):
    """One recalled memory."""

    turn_id: str = Field(description="id of the stored turn (forget takes it)")
    text: str
    speaker: str
    session_id: str
    timestamp: str = Field(description="when it was said, ISO 8601 UTC")
    score: float = Field(description="relevance (higher is better; a reranker logit, comparable within one recall)")
    rank: int = Field(description="1 is the best match")


class RememberResult(BaseModel):
    """What remember did."""

    turn_id: str
    session_id: str
    accepted: bool = Field(description="the turn passed validation and was published to the memory stream")
    stored: bool = Field(description="an ingest worker committed it, so recall can find it now")
    note: str


class RecallResult(BaseModel):
    """What recall found."""

    hits: list[MemoryHit]
    prompt_text: str | None = Field(default=None, description="with budget_tokens: the evidence to paste into a prompt")
    omitted: str | None = Field(default=None, description="with budget_tokens: what the evidence left out and why")
    note: str


class ForgetResult(BaseModel):
    """What forget removed."""

    scope: Literal["turn", "session"]
    session_id: str | None = None
    removed_turn_ids: list[str] = Field(description="turn ids erased (for a session: not listed, see removed_turns)")
    removed_turns: int
    applied: bool = Field(description="the erasure is committed: the next recall cannot return them")
    note: str


class SessionInfo(BaseModel):
    """One stored session."""

    session_id: str
    first_timestamp: str
    last_timestamp: str
    turns: int


class SessionsResult(BaseModel):
    """The tenant's sessions, oldest first."""

    sessions: list[SessionInfo]


def argument_of(field: str) -> str:
    """The tool argument a wire field came from (``occurred_at`` -> ``timestamp``, ``turns[0].text`` -> ``text``,
    ``turn_ids[0]`` -> ``turn_id``)."""
    name = field.split("].", 1)[-1].split("[", 1)[0]
    return _ARGUMENTS.get(name, name)


def sentence(exc: Exception) -> str | None:
    """One sentence for a client error a model can act on, or None for anything else."""
    if isinstance(exc, InvalidInputError):
        argument = argument_of(exc.field)
        if exc.reason in _TOO_LARGE:
            return f"The {argument} is too large ({exc.detail}, in UTF-8): shorten it or split it into several."
        return f"Invalid {argument}: {exc.detail.rstrip('.')} ({exc.reason.value})."
    if isinstance(exc, NoQueryWorker):
        return "No query worker of the memory service is running, so nothing can be recalled now; try again later."
    if isinstance(exc, RetrievalTimeout):
        return (f"The memory service did not answer within {exc.timeout_s:g} s (its query workers are busy or down); "
                "try again shortly.")
    if isinstance(exc, RetrievalFailed):
        return f"The memory service failed on this request ({exc.detail.rstrip('.')})."
    if isinstance(exc, ServiceUnavailable):
        return "The memory service's Redis cannot be reached, so nothing was stored or recalled; try again later."
    return None


@contextlib.contextmanager
def tool_errors() -> Iterator[None]:
    """Turn a client error into a ``ToolError`` of one sentence (:func:`sentence`); others propagate."""
    try:
        yield
    except ToolError:
        raise
    except Exception as exc:
        text = sentence(exc)
        if text is None:
            raise
        raise ToolError(text) from exc


class MemoryTools:
    """The tools' logic for any tenant (the caller decides which; see the module docstring).

    Args:
        client: the deployment's client.
        ingest_wait_s: how long remember and forget wait for the ingest worker's commit (0: not at all;
            else in (0, 86400] s, or InvalidInputError ``bad_timeout`` here).
        default_k: hits a recall without ``k`` returns.
        clock: the time a remember without ``timestamp`` is stamped with.
    """

    def __init__(self, client: MnemosClient, *, ingest_wait_s: float = 10.0, default_k: int = DEFAULT_K,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.client = client
        self.ingest_wait_s = check_wait_or_zero(ingest_wait_s, "ingest_wait_s")  # before any publish
        self.default_k = default_k
        self.clock = clock

    def remember(self, tenant_id: str, text: str, speaker: str | None = None, session_id: str | None = None,
                 timestamp: str | None = None, metadata: Mapping[str, Any] | None = None) -> RememberResult:
        """Publish one turn (defaults: speaker ``user``, now, session ``mcp-<UTC date>``), then wait up to
        ``ingest_wait_s`` for its commit."""
        with tool_errors():
            occurred = timestamp if timestamp is not None else self.clock().astimezone(UTC).isoformat()
            values: dict[str, Any] = {"tenant_id": tenant_id, "turn_id": f"mcp-{uuid.uuid4().hex}", "text": text,
                                      "role": DEFAULT_SPEAKER if speaker is None else speaker, "occurred_at": occurred}
            if metadata is not None:
                values["metadata"] = dict(metadata)
            values["session_id"] = session_id if session_id is not None else "mcp"
            turn = self.client.make_turn(values)
            if session_id is None:  # the default session: one per UTC day of the turn
                turn = dataclasses.replace(turn, session_id=f"mcp-{turn.occurred_at.date().isoformat()}")
            stream_id = self.client.publish_turn(turn)
            stored = self.ingest_wait_s > 0 and self.client.wait_acknowledged(tenant_id, stream_id, self.ingest_wait_s)
        note = ("Stored: recall can find it now." if stored else
                "Accepted: an ingest worker has not stored it yet; recall finds it once one has.")
        return RememberResult(turn_id=turn.turn_id, session_id=turn.session_id, accepted=True, stored=stored, note=note)

    def recall(self, tenant_id: str, query: str, k: int | None = None, as_of: str | None = None,
               session_id: str | None = None, speaker: str | None = None,
               budget_tokens: int | None = None) -> RecallResult:
        """Retrieve through the query workers; a tenant that never stored anything is a tool error."""
        filters: dict[str, Any] = {}
        if session_id is not None:
            filters["session_ids"] = [session_id]
        if speaker is not None:
            filters["roles"] = [speaker]
        with tool_errors():
            result = self.client.retrieve(tenant_id, query, k=self.default_k if k is None else k, as_of=as_of,
                                          filters=filters or None, budget_tokens=budget_tokens)
        if not result.hits and result.memory_version == 0:
            raise ToolError("No memories are stored for this user yet: remember something first.")
        hits = [MemoryHit(turn_id=h.turn_id, text=h.text, speaker=h.role, session_id=h.session_id,
                          timestamp=h.occurred_at.astimezone(UTC).isoformat(), score=round(h.score, 4), rank=h.rank)
                for h in result.hits]
        packet = result.packet
        note = f"{len(hits)} memories, best first." if hits else "No stored memory matched this query and its filters."
        return RecallResult(hits=hits, prompt_text=None if packet is None else packet.prompt_text(),
                            omitted=None if packet is None else omission_note(packet), note=note)

    def forget(self, tenant_id: str, turn_id: str | None = None, session_id: str | None = None) -> ForgetResult:
        """Erase one stored turn or one session (exactly one of them), then wait up to ``ingest_wait_s``
        for the erasure's commit; naming nothing stored is a tool error."""
        if (turn_id is None) == (session_id is None):
            raise ToolError("Give exactly one of turn_id or session_id: forget erases one turn or one session.")
        with tool_errors():
            if turn_id is not None:
                if not self.client.turns(tenant_id, [turn_id]):
                    raise ToolError(f"No stored memory has turn id {turn_id!r}; nothing was forgotten.")
                removed, ids = 1, [turn_id]
                stream_id = self.client.forget(tenant_id, turn_ids=[turn_id])
            else:  # an invalid id is named as such, not looked for and repeated whole (break-it round 12)
                session_id = check_id(session_id, "session_id", self.client.limits)
                found = [s for s in self.client.sessions(tenant_id) if s.session_id == session_id]
                if not found:
                    raise ToolError(f"No stored session has id {session_id!r}; nothing was forgotten.")
                removed, ids = found[0].turns, []
                stream_id = self.client.forget(tenant_id, session_id=session_id)
            applied = self.ingest_wait_s > 0 and self.client.wait_acknowledged(tenant_id, stream_id,
                                                                               self.ingest_wait_s)
        what = (f"turn {turn_id}" if turn_id is not None
                else f"session {session_id} ({removed} turn{'' if removed == 1 else 's'})")
        note = (f"Forgot {what}: it is erased everywhere and no recall returns it." if applied else
                f"The forget of {what} is queued: an ingest worker has not applied it yet.")
        return ForgetResult(scope="turn" if turn_id is not None else "session", session_id=session_id,
                            removed_turn_ids=ids, removed_turns=removed, applied=applied, note=note)

    def list_sessions(self, tenant_id: str) -> SessionsResult:
        """The tenant's sessions with their first and last turn time and their number of turns."""
        with tool_errors():
            sessions = self.client.sessions(tenant_id)
        return SessionsResult(sessions=[
            SessionInfo(session_id=s.session_id, first_timestamp=s.first_at.isoformat(),
                        last_timestamp=s.last_at.isoformat(), turns=s.turns) for s in sessions])


def omission_note(packet: Packet) -> str:
    """One line on what an evidence packet left out: counts per reason, and the supersessions."""
    if not packet.omitted:
        return f"Nothing was left out ({packet.used_tokens} of {packet.budget_tokens} tokens used)."
    counts: dict[str, int] = {}
    for item in packet.omitted:
        counts[item.reason] = counts.get(item.reason, 0) + 1
    parts = [f"{n} {reason}" for reason, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    superseded = [f"{o.turn_id} by {o.because_of}" for o in packet.omitted if o.reason == "superseded" and o.because_of]
    tail = f"; superseded: {', '.join(superseded)}" if superseded else ""
    return (f"Left out {len(packet.omitted)} candidates ({', '.join(parts)}){tail}; "
            f"{packet.used_tokens} of {packet.budget_tokens} tokens used.")
