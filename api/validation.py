"""Field checks shared by the client (before sending) and the workers (on what they receive).

Every check raises :class:`api.errors.InvalidInputError` with a :class:`api.errors.Reason`.
Limits are a value object so the workers can build them from their settings and the client can
take the defaults. Timestamps must carry a zone (a zone-less time is ambiguous across agents
and servers, so it is refused rather than guessed) and are converted to UTC.
"""

from __future__ import annotations

import json
import math
import numbers
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from api.errors import InvalidInputError, Reason

SCHEMA_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
DEFAULT_K = 10
"""Hits a retrieval request gets when it names no ``k`` (``MNEMOS_DEFAULT_K`` overrides it per deployment)."""
MAX_K = 100
"""The largest ``k`` a retrieval request may name (``MNEMOS_MAX_K`` overrides it per deployment)."""
_ALLOWED_TEXT_CONTROLS = frozenset("\t\n\r")
BIDI_REORDERING = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
"""Bidirectional embeddings, overrides and isolates (LRE, RLE, PDF, LRO, RLO, LRI, RLI, FSI, PDI):
they reorder how the characters after them are displayed, so a text or an id can read otherwise on
screen than it is ("Trojan Source"). Removed from texts, refused in ids."""
BIDI_CONTROLS = BIDI_REORDERING | frozenset("\u061c\u200e\u200f")
"""Every Unicode ``Bidi_Control`` character: :data:`BIDI_REORDERING` and the marks ALM, LRM, RLM
(kept in texts, where right-to-left writing needs them; refused in ids)."""


@dataclass(frozen=True)
class Limits:
    """Input limits (bytes are UTF-8 bytes; ``max_future_skew_s`` tolerates clock drift).

    ``max_filter_values`` bounds each list of a retrieval request's ``filters`` (session ids, roles);
    ``max_budget_tokens`` a request's evidence packet budget. ``default_k`` is not a limit but the
    ``k`` of a request that names none, carried here so the workers and a client of a deployment
    fill it in alike.
    """

    max_text_bytes: int = 32 * 1024
    max_query_bytes: int = 4 * 1024
    max_id_chars: int = 256
    max_metadata_bytes: int = 8 * 1024
    max_future_skew_s: float = 86_400.0
    max_k: int = MAX_K
    default_k: int = DEFAULT_K
    max_filter_values: int = 1024
    max_budget_tokens: int = 32_768


class LimitSettings(Protocol):
    """What :func:`limits_of` reads: the same-named fields of the service's settings
    (``workers.settings.Settings``; this package does not import it)."""

    @property
    def max_text_bytes(self) -> int: ...
    @property
    def max_query_bytes(self) -> int: ...
    @property
    def max_id_chars(self) -> int: ...
    @property
    def max_metadata_bytes(self) -> int: ...
    @property
    def max_future_skew_s(self) -> float: ...
    @property
    def max_k(self) -> int: ...
    @property
    def default_k(self) -> int: ...


def limits_of(settings: LimitSettings) -> Limits:
    """The validation limits of a deployment's settings: the workers check what they receive with
    them, and a client of that deployment (``mnemos publish``/``retrieve``) checks before sending.
    ``max_filter_values`` keeps its default."""
    return Limits(max_text_bytes=settings.max_text_bytes, max_query_bytes=settings.max_query_bytes,
                  max_id_chars=settings.max_id_chars, max_metadata_bytes=settings.max_metadata_bytes,
                  max_future_skew_s=settings.max_future_skew_s, max_k=settings.max_k, default_k=settings.default_k)


def text_fields(raw: Mapping[Any, Any]) -> dict[str, Any]:
    """A stream message's fields (bytes names and values, as redis-py reads them) as text.

    Raises InvalidInputError (``invalid_utf8``) for a name or value that is not UTF-8; its field is
    the name as text (invalid bytes replaced by U+FFFD, at most 40 characters), never a bytes repr.
    """
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
        try:
            if isinstance(key, bytes):
                key.decode("utf-8")
            out[name] = value.decode("utf-8") if isinstance(value, bytes) else value
        except UnicodeDecodeError:
            raise InvalidInputError(Reason.INVALID_UTF8, name[:40], "is not valid UTF-8") from None
    return out


def check_version(value: Any) -> int:
    """The schema version as an int (an int, or a string of ASCII digits); refuses missing or unknown ones.

    Floats and bools are refused rather than truncated (``1.5`` is not version 1).
    """
    if isinstance(value, int) and not isinstance(value, bool):
        version = value
    elif isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        version = int(value)
    else:
        raise InvalidInputError(Reason.UNSUPPORTED_VERSION, "v", f"not a schema version: {value!r:.40}")
    if version not in SUPPORTED_VERSIONS:
        raise InvalidInputError(Reason.UNSUPPORTED_VERSION, "v", f"unknown schema version {version}")
    return version


def _utf8_size(value: str, field: str) -> int:
    try:
        return len(value.encode("utf-8"))
    except UnicodeEncodeError:  # lone surrogates, e.g. from a JSON "\ud800"
        raise InvalidInputError(Reason.INVALID_UTF8, field, "not encodable as UTF-8") from None


def check_id(value: Any, field: str, limits: Limits) -> str:
    """A non-blank identifier (not only whitespace or invisible format characters) without control
    characters, at most ``max_id_chars`` characters.

    Bidirectional controls (:data:`BIDI_CONTROLS`) are refused as ``control_characters``, with the
    code points in the detail: an id must read on screen as it is.

    Separators, quotes and SQL-looking text are allowed: ids only ever travel as bound parameters.
    """
    if value is None:
        raise InvalidInputError(Reason.MISSING_FIELD, field, "is missing")
    if not isinstance(value, str):
        raise InvalidInputError(Reason.BAD_ID, field, f"must be a string, not {type(value).__name__}")
    if _blank(value):
        raise InvalidInputError(Reason.BAD_ID, field, "is empty, whitespace or invisible characters only")
    if len(value) > limits.max_id_chars:
        raise InvalidInputError(Reason.BAD_ID, field, f"longer than {limits.max_id_chars} characters")
    if any(unicodedata.category(ch) == "Cc" for ch in value):
        raise InvalidInputError(Reason.CONTROL_CHARACTERS, field, "contains control characters")
    bidi = sorted({f"U+{ord(ch):04X}" for ch in value if ch in BIDI_CONTROLS})
    if bidi:
        raise InvalidInputError(Reason.CONTROL_CHARACTERS, field,
                                f"contains bidirectional control characters ({', '.join(bidi)})")
    _utf8_size(value, field)
    return value


_DEFAULT_IGNORABLE = ((0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5),
                      (0x180B, 0x180F), (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164),
                      (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF), (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3),
                      (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF))
"""Unicode's Default_Ignorable_Code_Point ranges (DerivedCoreProperties.txt): code points a renderer
shows as nothing (zero-width and format characters, variation selectors, Hangul fillers, tags)."""

_BLANK_SYMBOLS = frozenset("\u2800")  # braille pattern blank: a symbol that renders as a space


def _looks_like_nothing(ch: str) -> bool:
    code = ord(ch)
    return (ch in _BLANK_SYMBOLS or unicodedata.category(ch) == "Cf"
            or any(low <= code <= high for low, high in _DEFAULT_IGNORABLE))


def check_tenant_id(value: Any, field: str, limits: Limits) -> str:
    """A tenant id: :func:`check_id`, and one that cannot render like another tenant's id.

    The tenant id is the isolation boundary that dashboards, logs and tokens files show to people, so
    two ids that look the same must not name two tenants. Besides :func:`check_id`'s rules it refuses,
    as ``bad_id``:

    - whitespace at either end (``"alice "``, ``"alice\u00a0"``);
    - an id that Unicode's compatibility normalisation NFKC changes: a decomposed accent
      (``"e"`` + U+0301 for ``"é"``), fullwidth letters, ligatures (``"\ufb01"`` for ``"fi"``),
      superscripts; send ``unicodedata.normalize("NFKC", tenant_id)``;
    - a character that renders as nothing or as a blank, anywhere: Unicode's default-ignorable code
      points (zero-width space, joiner and non-joiner, soft hyphen, word joiner, BOM, combining
      grapheme joiner, variation selectors, Hangul fillers, tags) and the braille blank, with the
      code points in the detail. This also refuses names that need a joiner to be spelt (Persian
      with U+200C, emoji sequences): a tenant id is an identifier, not a display name.

    Turns (new memory) and the MCP server's tenants use it; retrievals, catalog reads and forgets
    keep :func:`check_id`, so a tenant stored before this rule stays readable and erasable.
    Confusable letters of other scripts (a Cyrillic "а" for a Latin "a") are not detected: pick
    tenant ids from a known alphabet, such as account numbers or UUIDs (docs/architecture.md
    "Contracts").
    """
    tenant_id = check_id(value, field, limits)
    if tenant_id != tenant_id.strip():
        raise InvalidInputError(Reason.BAD_ID, field, "starts or ends with whitespace")
    hidden = sorted({f"U+{ord(ch):04X}" for ch in tenant_id if _looks_like_nothing(ch)})
    if hidden:
        raise InvalidInputError(Reason.BAD_ID, field, f"contains characters that render as nothing ({', '.join(hidden)})")
    if unicodedata.normalize("NFKC", tenant_id) != tenant_id:
        raise InvalidInputError(Reason.BAD_ID, field,
                                "is not in Unicode NFKC form (normalise it before sending: it may look like another id)")
    return tenant_id


def _blank(value: str) -> bool:
    """True when nothing visible is left: only whitespace and format characters (zero-width, BOM)."""
    return all(ch.isspace() or unicodedata.category(ch) == "Cf" for ch in value)


def _has_text_controls(value: str) -> bool:
    """True when ``value`` holds a control character other than tab, CR and LF (the text's rule)."""
    return any(unicodedata.category(ch) == "Cc" and ch not in _ALLOWED_TEXT_CONTROLS for ch in value)


def check_text(value: Any, field: str, max_bytes: int, empty_reason: Reason, large_reason: Reason) -> str:
    """Non-blank text of at most ``max_bytes`` UTF-8 bytes; tab, CR and LF are the only controls allowed.

    Bidirectional embeddings, overrides and isolates (:data:`BIDI_REORDERING`) are removed: the
    text returned is the text without them (the bidi marks LRM, RLM and ALM are kept). The client and
    the worker remove the same characters, so a raw stream message stores what the client would.
    Blank means empty, whitespace, or only invisible format characters (zero-width space/joiner,
    BOM). Bytes that are not UTF-8 are refused as ``invalid_utf8``, as the workers refuse them.
    """
    if value is None:
        raise InvalidInputError(Reason.MISSING_FIELD, field, "is missing")
    if isinstance(value, bytes | bytearray):
        try:
            bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(Reason.INVALID_UTF8, field, "is not valid UTF-8") from None
    if not isinstance(value, str):
        raise InvalidInputError(empty_reason, field, f"must be a string, not {type(value).__name__}")
    if not BIDI_REORDERING.isdisjoint(value):
        value = "".join(ch for ch in value if ch not in BIDI_REORDERING)
    if _blank(value):
        raise InvalidInputError(empty_reason, field, "is empty, whitespace or invisible characters only")
    size = _utf8_size(value, field)
    if size > max_bytes:
        raise InvalidInputError(large_reason, field, f"{size} bytes, limit {max_bytes}")
    if _has_text_controls(value):
        raise InvalidInputError(Reason.CONTROL_CHARACTERS, field, "contains NUL or other control characters")
    return str(value)


def check_timestamp(value: Any, field: str, limits: Limits, now: datetime) -> datetime:
    """A zone-aware time (datetime or ISO 8601 string) no later than ``now`` + skew, in UTC."""
    moment = check_zoned_time(value, field)
    if (moment - now).total_seconds() > limits.max_future_skew_s:
        raise InvalidInputError(Reason.TIMESTAMP_IN_FUTURE, field, f"{moment.isoformat()} is in the future")
    return moment


def check_zoned_time(value: Any, field: str) -> datetime:
    """A zone-aware time (datetime or ISO 8601 string) in UTC; any moment in years 1..9999 UTC.

    RFC 3339's lowercase ``t`` separator and ``z`` zone are accepted. A fraction finer than a
    microsecond (nanoseconds, say) is accepted and truncated to microseconds, the resolution of
    Python's datetime and of Postgres' timestamptz: ``...00.123456789Z`` is ``...00.123456Z``, so
    two times that differ only below a microsecond compare equal. No clock is read: a request's
    ``as_of`` may lie in the future (it then hides nothing).
    """
    if value is None:
        raise InvalidInputError(Reason.MISSING_FIELD, field, "is missing")
    if isinstance(value, datetime):
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(_rfc3339_upper(value.strip()))
        except ValueError:
            raise InvalidInputError(Reason.BAD_TIMESTAMP, field, f"not ISO 8601: {value[:64]!r}") from None
    else:
        raise InvalidInputError(Reason.BAD_TIMESTAMP, field, f"must be an ISO 8601 string, not {type(value).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise InvalidInputError(Reason.TIMESTAMP_WITHOUT_ZONE, field, "has no time zone (add Z or +HH:MM)")
    try:
        moment = moment.astimezone(UTC)
    except OverflowError:  # e.g. 9999-12-31T23:59:59-14:00 is in year 10000 in UTC
        raise InvalidInputError(Reason.BAD_TIMESTAMP, field, f"{moment.isoformat()} is outside years 1..9999 in UTC"
                                ) from None
    return moment


def _rfc3339_upper(text: str) -> str:
    """``text`` with RFC 3339's lowercase date-time separator ``t`` and zone ``z`` in upper case
    (``datetime.fromisoformat`` knows only ``T`` and ``Z``); anything else unchanged."""
    if len(text) > 10 and text[10] == "t":
        text = f"{text[:10]}T{text[11:]}"
    return f"{text[:-1]}Z" if text.endswith("z") else text


IMAGE_CAPTION_KEY = "image_caption"
"""Metadata key of a caption of an image shared with the turn (a string); the rendering shows it."""
SUPERSEDES_KEY = "supersedes"
"""Metadata key of the turn ids (a list of ids) of earlier turns this turn corrects; evidence packets
leave a superseded turn out once its correction is visible (docs/architecture.md "Evidence packets")."""
MAX_SUPERSEDES = 64
"""Most turn ids one turn may name in ``metadata.supersedes``."""


def check_metadata(value: Any, limits: Limits) -> dict[str, Any]:
    """A JSON object (dict or its JSON text) of at most ``max_metadata_bytes`` bytes, as text and serialized.
    ``image_caption``, when present, must be a string.

    Text is measured before it is parsed; nesting deeper than the JSON parser allows is ``bad_metadata``.
    """
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        size = _utf8_size(value, "metadata")  # refuse a huge text before parsing it
        if size > limits.max_metadata_bytes:
            raise InvalidInputError(Reason.METADATA_TOO_LARGE, "metadata",
                                    f"{size} bytes, limit {limits.max_metadata_bytes}")
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidInputError(Reason.BAD_METADATA, "metadata", "not valid JSON") from None
        except RecursionError:
            raise InvalidInputError(Reason.BAD_METADATA, "metadata", "nested too deeply") from None
    if not isinstance(value, dict):
        raise InvalidInputError(Reason.BAD_METADATA, "metadata", "must be a JSON object")
    try:
        encoded = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInputError(Reason.BAD_METADATA, "metadata", f"not JSON-serializable: {exc}") from None
    except RecursionError:
        raise InvalidInputError(Reason.BAD_METADATA, "metadata", "nested too deeply") from None
    if "\\u0000" in encoded:
        raise InvalidInputError(Reason.CONTROL_CHARACTERS, "metadata", "contains NUL")
    _check_string_keys(value)
    size = _utf8_size(encoded, "metadata")
    if size > limits.max_metadata_bytes:
        raise InvalidInputError(Reason.METADATA_TOO_LARGE, "metadata", f"{size} bytes, limit {limits.max_metadata_bytes}")
    caption = value.get(IMAGE_CAPTION_KEY)
    if caption is not None and not isinstance(caption, str):
        raise InvalidInputError(Reason.BAD_METADATA, f"metadata.{IMAGE_CAPTION_KEY}",
                                f"must be a string, got {type(caption).__name__}")
    if caption is not None and _has_text_controls(caption):  # rendered with the text: the text's rule
        raise InvalidInputError(Reason.CONTROL_CHARACTERS, f"metadata.{IMAGE_CAPTION_KEY}",
                                "contains NUL or other control characters")
    if SUPERSEDES_KEY in value:
        return {**value, SUPERSEDES_KEY: list(check_supersedes(value[SUPERSEDES_KEY], limits))}
    return value


def _check_string_keys(value: dict[Any, Any]) -> None:
    """Refuse an object key that is not a string anywhere in ``value`` (already JSON-serializable, so
    acyclic): JSON turns 1, 1.0, True and None into text, so ``{1: "a", "1": "b"}`` went out as two
    equal keys and came back with one value (break-it round 12)."""
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for key, inner in item.items():
                if not isinstance(key, str):
                    raise InvalidInputError(Reason.BAD_METADATA, "metadata",
                                            f"object keys must be strings, got {type(key).__name__} {key!r}")
                stack.append(inner)
        elif isinstance(item, list | tuple):
            stack.extend(item)


def check_supersedes(value: Any, limits: Limits) -> tuple[str, ...]:
    """``metadata.supersedes``: a non-empty list of at most :data:`MAX_SUPERSEDES` turn ids (each as
    :func:`check_id`), duplicates dropped, first order kept; refused as ``bad_metadata``."""
    field = f"metadata.{SUPERSEDES_KEY}"
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidInputError(Reason.BAD_METADATA, field, f"must be a list of turn ids, not {type(value).__name__}")
    if not value or len(value) > MAX_SUPERSEDES:
        raise InvalidInputError(Reason.BAD_METADATA, field, f"must name 1..{MAX_SUPERSEDES} turn ids, got {len(value)}")
    ids = []
    for i, item in enumerate(value):
        try:
            ids.append(check_id(item, f"{field}[{i}]", limits))
        except InvalidInputError as exc:
            raise InvalidInputError(Reason.BAD_METADATA, exc.field, exc.detail) from None
    return tuple(dict.fromkeys(ids))


MAX_WAIT_S = 86_400.0
"""The longest one client call may wait, in seconds (a day): Redis and rq take the lifetimes of the
request-id claim and the queued job in whole seconds, and refuse one too large."""


def check_wait(value: Any, field: str) -> float:
    """A client call's wait: a real number of seconds (numpy's too) in (0, :data:`MAX_WAIT_S`]; NaN,
    infinities, bools, Decimal and text raise InvalidInputError ``bad_timeout`` (a NaN deadline never
    passes, and a huge or negative one reached Redis as a key lifetime it refused, which read as
    Redis being down)."""
    seconds = math.nan if isinstance(value, bool) or not isinstance(value, numbers.Real) else float(value)
    if not 0 < seconds <= MAX_WAIT_S:
        raise InvalidInputError(Reason.BAD_TIMEOUT, field, f"must be a number of seconds in (0, {MAX_WAIT_S:g}], "
                                                           f"got {value!r}")
    return seconds


def check_wait_or_zero(value: Any, field: str) -> float:
    """:func:`check_wait`, or 0 (no wait at all), for a wait that follows something already sent:
    checked when the waiting object is built, never after the send (break-it round 14)."""
    return 0.0 if value == 0 and not isinstance(value, bool) else check_wait(value, field)


def check_k(value: Any, limits: Limits) -> int:
    """An int in 1..max_k (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(Reason.K_OUT_OF_RANGE, "k", f"must be an integer, not {type(value).__name__}")
    if not 1 <= value <= limits.max_k:
        raise InvalidInputError(Reason.K_OUT_OF_RANGE, "k", f"{value} is outside 1..{limits.max_k}")
    return value


def check_budget(value: Any, limits: Limits) -> int:
    """A packet budget in tokens: an int in 1..max_budget_tokens (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(Reason.BUDGET_OUT_OF_RANGE, "budget_tokens",
                                f"must be an integer, not {type(value).__name__}")
    if not 1 <= value <= limits.max_budget_tokens:
        raise InvalidInputError(Reason.BUDGET_OUT_OF_RANGE, "budget_tokens",
                                f"{value} is outside 1..{limits.max_budget_tokens}")
    return value


def check_id_list(value: Any, field: str, limits: Limits) -> tuple[str, ...]:
    """A non-empty JSON list of ids (each as :func:`check_id`), duplicates dropped, first order kept."""
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise InvalidInputError(Reason.BAD_FILTER, field, f"must be a list of strings, not {type(value).__name__}")
    if not value:
        raise InvalidInputError(Reason.BAD_FILTER, field, "is an empty list (leave the key out for no restriction)")
    if len(value) > limits.max_filter_values:
        raise InvalidInputError(Reason.BAD_FILTER, field, f"{len(value)} values, limit {limits.max_filter_values}")
    return tuple(dict.fromkeys(check_id(item, f"{field}[{i}]", limits) for i, item in enumerate(value)))
