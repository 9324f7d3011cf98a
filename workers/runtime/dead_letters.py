"""Dead letters: messages a worker refused, with the reason, kept in Postgres and on a stream.

The ``dead_letters`` table is the durable record (one row per stream message, so a redelivered
message is not recorded twice; the store writes it: ``record_dead_letters`` of
:mod:`workers.store`); the ``<prefix>:turns:dead`` stream lets an operator tail the latest
(:data:`DEAD_STREAM_MAXLEN`).
The table row is committed before the original message is acknowledged; the stream copy is
best effort after the commit (a crash in between can repeat it on the stream, never in the table).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

import redis

log = logging.getLogger(__name__)

MAX_PAYLOAD_FIELD_CHARS = 64 * 1024
DEAD_STREAM_MAXLEN = 10_000
"""About how many copies the dead-letter stream keeps (``XADD MAXLEN ~``): it is for tailing; the
table keeps every letter. Unbounded, malformed messages would grow Redis without end, and every
forget reads the whole stream to delete its copies."""


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

    def printable(self) -> DeadLetter:
        """This letter with its texts storable: NUL and invalid UTF-8 replaced, each cut to
        ``MAX_PAYLOAD_FIELD_CHARS`` (``stream``, ``stream_id`` and ``reason`` are the service's own)."""
        return replace(
            self, detail=_clean(self.detail), tenant_id=None if self.tenant_id is None else _clean(self.tenant_id),
            turn_id=None if self.turn_id is None else _clean(self.turn_id),
            payload={_clean(k): _clean(v) for k, v in self.payload.items()})


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


def sent_id(fields: Mapping[bytes, bytes], name: bytes) -> str | None:
    """Field ``name`` of raw stream ``fields`` as the sender's text: None when it is missing, not
    valid UTF-8 or holds NUL. Its :func:`payload_of` copy has replacement characters there, and
    would read as another id (a tenant named with them would own the letter)."""
    value = fields.get(name)
    try:
        text = value.decode("utf-8") if isinstance(value, bytes) else value
    except UnicodeDecodeError:
        return None
    return text if isinstance(text, str) and "\x00" not in text else None


def copied_letter(fields: Mapping[bytes, bytes]) -> DeadLetter | None:
    """The letter a dead-stream entry copies (the fields :func:`publish_dead_letters` writes), or None
    when its payload is JSON but no object; a payload that does not parse reads as empty, a missing
    field as "" (a turn id is also looked for in the payload)."""
    def text(name: bytes) -> str:
        value = fields.get(name, b"")
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)

    try:
        payload = json.loads(text(b"payload") or "{}")
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        return None
    payload = {str(k): str(v) for k, v in payload.items()}
    return DeadLetter(stream=text(b"stream"), stream_id=text(b"stream_id"), reason=text(b"reason"),
                      detail=text(b"detail"), tenant_id=text(b"tenant_id"),
                      turn_id=text(b"turn_id") or payload.get("turn_id", ""), payload=payload)


def publish_dead_letters(connection: redis.Redis, dead_stream: str, letters: Sequence[DeadLetter]) -> None:
    """XADD a copy of each letter to ``dead_stream``; failures are logged, the table is authoritative."""
    if not letters:
        return
    try:
        pipe = connection.pipeline(transaction=False)
        for letter in letters:
            pipe.xadd(dead_stream, maxlen=DEAD_STREAM_MAXLEN, approximate=True, fields={
                "stream": letter.stream, "stream_id": letter.stream_id, "reason": letter.reason,
                "detail": _clean(letter.detail), "tenant_id": _clean(letter.tenant_id or ""),
                "turn_id": _clean(letter.turn_id or ""), "payload": json.dumps(dict(letter.payload)),
            })
        pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not copy %d dead letters to %s: %s", len(letters), dead_stream, exc)
