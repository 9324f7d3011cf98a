"""Dead letters: messages a worker refused, with the reason, kept in Postgres and on a stream.

The ``dead_letters`` table is the durable record (one row per stream message, so a redelivered
message is not recorded twice); the ``<prefix>:turns:dead`` stream lets an operator tail them.
The table row is committed before the original message is acknowledged; the stream copy is
best effort after the commit (a crash in between can repeat it on the stream, never in the table).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import psycopg
import redis
from psycopg.types.json import Jsonb

log = logging.getLogger(__name__)

MAX_PAYLOAD_FIELD_CHARS = 64 * 1024


@dataclass(frozen=True)
class DeadLetter:
    """One refused message: where it came from, why (a ``Reason`` value), and its fields as text."""

    stream: str
    stream_id: str
    reason: str
    detail: str
    tenant_id: str | None = None
    turn_id: str | None = None
    payload: Mapping[str, str] = field(default_factory=dict)


def _clean(text: str) -> str:
    # Postgres text and jsonb refuse NUL; lone surrogates cannot be encoded
    text = text.replace("\x00", "\ufffd")
    return text.encode("utf-8", "replace").decode("utf-8")[:MAX_PAYLOAD_FIELD_CHARS]


def payload_of(fields: Mapping[bytes, bytes]) -> dict[str, str]:
    """The raw stream fields as printable text (invalid UTF-8 replaced, NUL replaced, long fields cut)."""
    out: dict[str, str] = {}
    for key, value in fields.items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        text = value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
        out[_clean(name)] = _clean(text)
    return out


def insert_dead_letters(conn: psycopg.Connection, letters: Sequence[DeadLetter]) -> None:
    """Insert ``letters`` inside the caller's transaction (idempotent per stream message: the
    ``dead_letters_message`` unique constraint drops a second letter for the same message)."""
    for letter in letters:
        conn.execute(
            "INSERT INTO dead_letters (stream, stream_id, reason, detail, tenant_id, turn_id, payload)"
            # no conflict target: naming the (stream, stream_id) arbiter would need SELECT on the row,
            # which row-level security (migration 0003) only grants for the scoped tenant's letters
            " VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
            (letter.stream, letter.stream_id, letter.reason, _clean(letter.detail),
             None if letter.tenant_id is None else _clean(letter.tenant_id),
             None if letter.turn_id is None else _clean(letter.turn_id), Jsonb(dict(letter.payload))),
        )


def publish_dead_letters(connection: redis.Redis, dead_stream: str, letters: Sequence[DeadLetter]) -> None:
    """XADD a copy of each letter to ``dead_stream``; failures are logged, the table is authoritative."""
    if not letters:
        return
    try:
        pipe = connection.pipeline(transaction=False)
        for letter in letters:
            pipe.xadd(dead_stream, {
                "stream": letter.stream, "stream_id": letter.stream_id, "reason": letter.reason,
                "detail": _clean(letter.detail), "tenant_id": _clean(letter.tenant_id or ""),
                "turn_id": _clean(letter.turn_id or ""), "payload": json.dumps(dict(letter.payload)),
            })
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not copy %d dead letters to %s: %s", len(letters), dead_stream, exc)
