"""Wire form of an evidence packet (docs/architecture.md "Evidence packets", "Contracts").

A retrieval request with ``budget_tokens`` gets, besides its hits, a :class:`Packet`: the selected
evidence in reading order, each :class:`PacketItem` with its :class:`Qualifiers` next to it, the
``line`` an agent pastes into its prompt (the text its tokens were counted on) and the ``header``
of its session group (session id and start, pasted once above the session's lines:
:meth:`Packet.prompt_text`), and the
omission report, one :class:`OmittedItem` per candidate left out with its ``reason``
(:data:`OMISSION_REASONS`) and, for ``redundant`` and ``superseded``, the turn id it is redundant
with or superseded by. ``used_tokens <= budget_tokens``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

__all__ = ["OMISSION_REASONS", "OmittedItem", "Packet", "PacketItem", "Qualifiers"]

OMISSION_REASONS = ("over_budget", "redundant", "filtered", "not_visible_at_as_of", "superseded", "session_cap")
"""Why a candidate was left out (the values of ``mnemos.packets.Omission``)."""


def _time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


@dataclass(frozen=True)
class Qualifiers:
    """Who said it (``role``), in which session, when, the turns deduplicated into it, and when its
    session started (None when unknown)."""

    session_id: str
    role: str
    occurred_at: datetime
    aliases: tuple[str, ...] = ()
    session_date: datetime | None = None

    def to_payload(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "role": self.role, "occurred_at": self.occurred_at.isoformat(),
                "aliases": list(self.aliases),
                "session_date": None if self.session_date is None else self.session_date.isoformat()}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Qualifiers:
        occurred_at = _time(data["occurred_at"])
        assert occurred_at is not None
        return cls(str(data["session_id"]), str(data["role"]), occurred_at, tuple(data.get("aliases", ())),
                   _time(data.get("session_date")))


@dataclass(frozen=True)
class PacketItem:
    """One selected piece of evidence: ``score`` is the rerank score, ``tokens`` the cross-encoder
    tokens of ``line`` (speaker and text, the time where it differs from the session's start), which
    is pasted under ``header`` (its session's id and start; ``""``: none)."""

    entry_id: int
    turn_id: str
    text: str
    score: float
    tokens: int
    qualifiers: Qualifiers
    line: str
    header: str = ""

    def to_payload(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "turn_id": self.turn_id, "text": self.text, "score": self.score,
                "tokens": self.tokens, "qualifiers": self.qualifiers.to_payload(), "line": self.line,
                "header": self.header}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> PacketItem:
        return cls(int(data["entry_id"]), str(data["turn_id"]), str(data["text"]), float(data["score"]),
                   int(data["tokens"]), Qualifiers.from_payload(data["qualifiers"]), str(data["line"]),
                   str(data.get("header", "")))


@dataclass(frozen=True)
class OmittedItem:
    """One candidate left out: ``reason`` (one of :data:`OMISSION_REASONS`), ``because_of`` the kept
    turn it repeats or the turn that supersedes it; ``score``/``tokens`` None when never scored."""

    entry_id: int
    turn_id: str
    reason: str
    score: float | None = None
    tokens: int | None = None
    because_of: str | None = None

    def to_payload(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "turn_id": self.turn_id, "reason": self.reason, "score": self.score,
                "tokens": self.tokens, "because_of": self.because_of}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> OmittedItem:
        score, tokens = data.get("score"), data.get("tokens")
        return cls(int(data["entry_id"]), str(data["turn_id"]), str(data["reason"]),
                   None if score is None else float(score), None if tokens is None else int(tokens),
                   data.get("because_of"))


@dataclass(frozen=True)
class Packet:
    """Selected items in reading order (session start, then turn time), the omission report, the
    budget and the tokens :meth:`prompt_text` uses (the items' lines and their session headers)."""

    items: tuple[PacketItem, ...]
    omitted: tuple[OmittedItem, ...]
    budget_tokens: int
    used_tokens: int

    def prompt_text(self) -> str:
        """What an agent pastes: each session's header once, then its items' lines (groups in order of
        their first item, items in reading order), newline-separated."""
        groups: dict[str, list[str]] = {}
        for item in self.items:
            groups.setdefault(item.header, []).append(item.line)
        return "\n".join(line for header, lines in groups.items() for line in ([header] if header else []) + lines)

    def to_payload(self) -> dict[str, Any]:
        return {"items": [i.to_payload() for i in self.items], "omitted": [o.to_payload() for o in self.omitted],
                "budget_tokens": self.budget_tokens, "used_tokens": self.used_tokens}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Packet:
        return cls(tuple(PacketItem.from_payload(i) for i in data["items"]),
                   tuple(OmittedItem.from_payload(o) for o in data["omitted"]),
                   int(data["budget_tokens"]), int(data["used_tokens"]))
