"""Wire schemas of the service (docs/architecture.md "Contracts"), version ``v`` = 1.

* :class:`Turn`: one message of stream ``<prefix>:turns`` (flat string fields).
* :class:`RetrievalRequest` with :class:`RetrievalFilters`: the JSON argument of an rq job on
  queue ``retrievals``.
* :class:`RetrievalResult` with :class:`Hit` (and, for a request with ``budget_tokens``, an
  evidence :class:`~api.packets.Packet`): the JSON return value of that job.
* :class:`Outcome` with :class:`PoolRow`: one message of stream ``<prefix>:outcomes``.

Each has ``to_*``/``from_*`` converters; the ``from_*`` side validates, so a worker applies the
same checks as the client. Times travel as ISO 8601 with a zone and are UTC in memory.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any

from api.errors import InvalidInputError, Reason
from api.packets import Packet
from api.validation import (
    DEFAULT_K,
    IMAGE_CAPTION_KEY,
    SCHEMA_VERSION,
    Limits,
    check_budget,
    check_id,
    check_id_list,
    check_k,
    check_metadata,
    check_tenant_id,
    check_text,
    check_timestamp,
    check_version,
    check_zoned_time,
    text_fields,
)

DEFAULT_LIMITS = Limits()
TURN_FIELDS = ("v", "tenant_id", "session_id", "turn_id", "role", "text", "occurred_at", "metadata")
_ABSENT = object()  # a metadata key a turn does not have (None is a value)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Turn:
    """One conversation turn as an agent publishes it; ``turn_id`` is the idempotency key in its tenant."""

    tenant_id: str
    session_id: str
    turn_id: str
    role: str
    text: str
    occurred_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    @classmethod
    def parse(cls, values: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS, now: datetime | None = None) -> Turn:
        """Validate a mapping of field values (stream fields or user input); raises InvalidInputError."""
        version = check_version(values.get("v", None))
        return cls(
            tenant_id=check_tenant_id(values.get("tenant_id"), "tenant_id", limits),
            session_id=check_id(values.get("session_id"), "session_id", limits),
            turn_id=check_id(values.get("turn_id"), "turn_id", limits),
            role=check_id(values.get("role"), "role", limits),
            text=check_text(values.get("text"), "text", limits.max_text_bytes, Reason.EMPTY_TEXT,
                            Reason.TEXT_TOO_LARGE),
            occurred_at=check_timestamp(values.get("occurred_at"), "occurred_at", limits, now or _now()),
            metadata=check_metadata(values.get("metadata"), limits),
            v=version,
        )

    @classmethod
    def from_stream_fields(cls, raw: Mapping[bytes, bytes], limits: Limits = DEFAULT_LIMITS,
                           now: datetime | None = None) -> Turn:
        """Decode and validate a stream message (bytes keys and values); raises InvalidInputError."""
        values = text_fields(raw)
        if "v" not in values:
            raise InvalidInputError(Reason.UNSUPPORTED_VERSION, "v", "is missing")
        if "kind" in values:  # a forget event is routed before this; any other kind is not a turn either
            shown = values["kind"] if len(str(values["kind"])) <= 40 else f"{str(values['kind'])[:40]}…"
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "kind",
                                    f"{shown!r} is not a message kind (a turn has no kind; a forget event has 'forget')")
        return cls.parse(values, limits, now)

    def to_stream_fields(self) -> dict[str, str]:
        """Flat string fields for XADD."""
        fields = {
            "v": str(self.v),
            "tenant_id": self.tenant_id,
            "session_id": self.session_id,
            "turn_id": self.turn_id,
            "role": self.role,
            "text": self.text,
            "occurred_at": self.occurred_at.isoformat(),
        }
        if self.metadata:
            fields["metadata"] = json.dumps(dict(self.metadata), ensure_ascii=False, separators=(",", ":"))
        return fields

    @property
    def image_caption(self) -> str | None:
        """``metadata.image_caption`` (a caption of an image shared with the turn), or None when blank."""
        caption = self.metadata.get(IMAGE_CAPTION_KEY)
        return caption.strip() or None if isinstance(caption, str) else None

    def same_content(self, other: Turn) -> bool:
        """True when ``other`` says the same thing (used to tell a redelivery from a turn-id conflict)."""
        return not self.differences(other)

    def differences(self, other: Turn) -> tuple[str, ...]:
        """The fields in which ``other`` says something else, in field order: ``session_id``,
        ``role``, ``text``, ``occurred_at`` (the same instant in another zone is equal), then
        ``metadata.<key>`` for every metadata key added, removed or changed (keys sorted)."""
        names = [name for name in ("session_id", "role", "text", "occurred_at")
                 if getattr(self, name) != getattr(other, name)]
        mine, theirs = dict(self.metadata), dict(other.metadata)
        names += [f"metadata.{key}" for key in sorted(mine.keys() | theirs.keys())
                  if not _same_json(mine.get(key, _ABSENT), theirs.get(key, _ABSENT))]
        return tuple(names)


def _same_json(a: Any, b: Any) -> bool:
    """JSON values equal as JSON numbers are: an int and a float are the same number when their
    float values are (Postgres's jsonb gives ``1.5e300`` back as the integer ``15`` followed by 299
    zeros), booleans equal only booleans, lists and objects element by element."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        try:
            return float(a) == float(b)
        except OverflowError:  # an integer past float range equals no float
            return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_json(a[k], b[k]) for k in a)
    return bool(a == b)


@dataclass(frozen=True)
class RetrievalFilters:
    """Optional restrictions of a retrieval request (its ``filters`` JSON object); None: no restriction.

    Attributes:
        session_ids: only turns of these sessions of the requesting tenant (another tenant's
            session ids never match anything).
        roles: only turns of these speakers.
        occurred_after: inclusive lower bound on ``occurred_at`` (UTC; not later than ``as_of``).

    The conditions hold on one turn together (and with ``as_of``). A deduplicated memory passes
    when its canonical turn or any of its aliases does: dedupe loses nothing. When only an alias
    passes, the hit shows that alias's turn id, session, role and time, and ``aliases`` names only
    turns the request admits (the text stays the canonical's).
    """

    session_ids: tuple[str, ...] | None = None
    roles: tuple[str, ...] | None = None
    occurred_after: datetime | None = None

    @classmethod
    def parse(cls, value: Any, limits: Limits = DEFAULT_LIMITS, as_of: datetime | None = None
              ) -> RetrievalFilters | None:
        """Validate a ``filters`` JSON object into the record; ``{}`` is None (no restriction).

        Keys (all optional, :data:`FILTER_KEYS`): ``session_ids`` and ``roles`` (non-empty lists of
        ids, duplicates dropped, first order kept), ``occurred_after`` (zone-aware ISO 8601, not
        later than ``as_of``; UTC in the record).

        Raises InvalidInputError: ``bad_filter`` for anything else (not an object, an unknown key,
        a wrong type, an empty list, an empty time range); a bad id or time keeps its own reason.
        """
        if not isinstance(value, dict):
            raise InvalidInputError(Reason.BAD_FILTER, "filters", f"must be a JSON object, not {type(value).__name__}")
        unknown = sorted(str(key) for key in value if key not in FILTER_KEYS)
        if unknown:
            raise InvalidInputError(Reason.BAD_FILTER, "filters",
                                    f"unknown key {unknown[0][:40]!r} (allowed: {', '.join(FILTER_KEYS)})")
        if not value:
            return None
        session_ids, roles = (None if key not in value else check_id_list(value[key], f"filters.{key}", limits)
                              for key in ("session_ids", "roles"))
        after = None
        if "occurred_after" in value:
            if value["occurred_after"] is None:
                raise InvalidInputError(Reason.BAD_FILTER, "filters.occurred_after", "is null (leave the key out)")
            after = check_zoned_time(value["occurred_after"], "filters.occurred_after")
            if as_of is not None and after > as_of:
                raise InvalidInputError(Reason.BAD_FILTER, "filters.occurred_after",
                                        f"{after.isoformat()} is later than as_of {as_of.isoformat()} "
                                        "(nothing can match)")
        return cls(session_ids=session_ids, roles=roles, occurred_after=after)

    def to_payload(self) -> dict[str, Any]:
        """The JSON object, with only the keys that restrict something."""
        out: dict[str, Any] = {}
        if self.session_ids is not None:
            out["session_ids"] = list(self.session_ids)
        if self.roles is not None:
            out["roles"] = list(self.roles)
        if self.occurred_after is not None:
            out["occurred_after"] = self.occurred_after.isoformat()
        return out


FILTER_KEYS = tuple(f.name for f in fields(RetrievalFilters))
"""The keys a retrieval request's ``filters`` object may hold (every one optional): the record's fields."""


@dataclass(frozen=True)
class RetrievalRequest:
    """One question of a tenant; ``request_id`` becomes the rq job id and the outcome id.

    ``as_of`` (optional, zone-aware, UTC in memory) is the knowledge time: only turns with
    ``occurred_at <= as_of`` can be returned, scored, pooled or suppressed (the memory as it
    stood then, seen through today's index: BM25 term statistics, dedupe and suppression scores
    are the current ones). It also anchors relative time expressions ("last week") of the
    temporal feature; without it they stay unresolved. A future ``as_of`` is accepted and hides
    nothing. ``filters`` (optional, :class:`RetrievalFilters`) narrows further. Both restrict
    candidate generation itself, so a selective request still gets the best allowed turns; a
    request whose restrictions allow nothing gets no hits. A filtered request still sends an
    outcome for the entries it pooled, so it teaches suppression about them like any other.

    Version: still ``v`` = 1. ``as_of`` and ``filters`` are optional additions; a v1 payload
    without them parses as before, and :meth:`to_payload` leaves them out when unset, so the
    payload of an unfiltered request is unchanged. A worker older than these fields ignores
    them (it would answer unfiltered): upgrade the query workers before clients send them.
    ``budget_tokens`` (optional, 1..``max_budget_tokens``) asks for an evidence packet of at most
    that many cross-encoder tokens besides the hits (docs/architecture.md "Evidence packets").
    """

    tenant_id: str
    query: str
    k: int = DEFAULT_K
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    v: int = SCHEMA_VERSION
    as_of: datetime | None = None
    filters: RetrievalFilters | None = None
    budget_tokens: int | None = None

    @classmethod
    def parse(cls, values: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS) -> RetrievalRequest:
        """Validate a request payload; raises InvalidInputError.

        ``as_of``: ISO 8601 with a zone (or a zone-aware datetime); missing or null means none.
        ``filters``: a JSON object (see :class:`RetrievalFilters`); missing, null or ``{}`` means none.
        ``k``: missing means ``limits.default_k`` (in a query worker, its ``MNEMOS_DEFAULT_K``).
        """
        request_id = values.get("request_id")
        if request_id is None:  # an explicit "" is refused below, not silently replaced
            request_id = uuid.uuid4().hex
        tenant_id = check_id(values.get("tenant_id"), "tenant_id", limits)
        query = check_text(values.get("query"), "query", limits.max_query_bytes, Reason.EMPTY_QUERY,
                           Reason.QUERY_TOO_LARGE)
        k = check_k(values.get("k", limits.default_k), limits)
        request_id = check_id(request_id, "request_id", limits)
        version = check_version(values.get("v"))
        raw_as_of, raw_filters = values.get("as_of"), values.get("filters")
        as_of = None if raw_as_of is None else check_zoned_time(raw_as_of, "as_of")
        filters = None if raw_filters is None else RetrievalFilters.parse(raw_filters, limits, as_of)
        budget = values.get("budget_tokens")
        return cls(tenant_id=tenant_id, query=query, k=k, request_id=request_id, v=version, as_of=as_of,
                   filters=filters, budget_tokens=None if budget is None else check_budget(budget, limits))

    def to_payload(self) -> dict[str, Any]:
        """The job's JSON argument; ``as_of`` and ``filters`` only when set."""
        payload: dict[str, Any] = {"v": self.v, "request_id": self.request_id, "tenant_id": self.tenant_id,
                                   "query": self.query, "k": self.k}
        if self.as_of is not None:
            payload["as_of"] = self.as_of.isoformat()
        if self.filters is not None:
            payload["filters"] = self.filters.to_payload()
        if self.budget_tokens is not None:
            payload["budget_tokens"] = self.budget_tokens
        return payload


@dataclass(frozen=True)
class Hit:
    """One returned memory; ``rank`` is 1-based, ``aliases`` the turn ids deduplicated into it."""

    entry_id: int
    turn_id: str
    session_id: str
    role: str
    text: str
    occurred_at: datetime
    score: float
    rank: int
    aliases: tuple[str, ...] = ()

    def to_payload(self) -> dict[str, Any]:
        return {"entry_id": self.entry_id, "turn_id": self.turn_id, "session_id": self.session_id,
                "role": self.role, "text": self.text, "occurred_at": self.occurred_at.isoformat(),
                "score": self.score, "rank": self.rank, "aliases": list(self.aliases)}

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> Hit:
        return cls(int(data["entry_id"]), str(data["turn_id"]), str(data["session_id"]), str(data["role"]),
                   str(data["text"]), datetime.fromisoformat(data["occurred_at"]), float(data["score"]),
                   int(data["rank"]), tuple(data.get("aliases", ())))


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


@dataclass(frozen=True)
class RetrievalResult:
    """Ordered hits plus diagnostics: pool size, deep pass, cluster, seconds per stage, memory version and
    suppression version (how many outcomes of the tenant the suppression state it read had applied;
    None from a worker older than migration 0005), the pool pairs the cross-encoder scored for this
    request and those its score cache answered (``rerank_pairs_scored`` / ``rerank_pairs_cached``;
    None from an older worker; both 0 for an answer from the packet cache) and, when the request set
    ``budget_tokens``, the evidence ``packet``."""

    request_id: str
    tenant_id: str
    hits: tuple[Hit, ...]
    pool_size: int
    deep_pass: bool
    cluster: int | None
    top_rerank_score: float | None
    stage_seconds: Mapping[str, float]
    memory_version: int
    suppression_version: int | None = None
    packet: Packet | None = None
    rerank_pairs_scored: int | None = None
    rerank_pairs_cached: int | None = None
    v: int = SCHEMA_VERSION

    def to_payload(self) -> dict[str, Any]:
        payload = {"v": self.v, "request_id": self.request_id, "tenant_id": self.tenant_id,
                   "hits": [h.to_payload() for h in self.hits], "pool_size": self.pool_size,
                   "deep_pass": self.deep_pass, "cluster": self.cluster, "top_rerank_score": self.top_rerank_score,
                   "stage_seconds": dict(self.stage_seconds), "memory_version": self.memory_version,
                   "suppression_version": self.suppression_version,
                   "rerank_pairs_scored": self.rerank_pairs_scored, "rerank_pairs_cached": self.rerank_pairs_cached}
        if self.packet is not None:
            payload["packet"] = self.packet.to_payload()
        return payload

    @classmethod
    def from_payload(cls, data: Mapping[str, Any]) -> RetrievalResult:
        return cls(
            request_id=str(data["request_id"]), tenant_id=str(data["tenant_id"]),
            hits=tuple(Hit.from_payload(h) for h in data["hits"]), pool_size=int(data["pool_size"]),
            deep_pass=bool(data["deep_pass"]), cluster=data.get("cluster"),
            top_rerank_score=data.get("top_rerank_score"), stage_seconds=dict(data.get("stage_seconds", {})),
            memory_version=int(data.get("memory_version", 0)),
            suppression_version=None if data.get("suppression_version") is None else int(data["suppression_version"]),
            packet=None if data.get("packet") is None else Packet.from_payload(data["packet"]),
            rerank_pairs_scored=_optional_int(data.get("rerank_pairs_scored")),
            rerank_pairs_cached=_optional_int(data.get("rerank_pairs_cached")),
            v=check_version(data.get("v")),
        )


@dataclass(frozen=True)
class PoolRow:
    """How one pool entry fared: ranks 1-based (before / after rerank), the rerank logit."""

    entry_id: int
    initial_rank: int
    final_rank: int
    rerank_score: float


@dataclass(frozen=True)
class Outcome:
    """One retrieval's suppression update as a stream message (Clustered Retrieval-Induced Forgetting, Algorithm 1, as data).

    ``query_embedding`` is sent while the tenant has no frozen centroids (the bootstrap buffer
    needs it) and omitted afterwards. ``forget_version`` is the tenant's forget version the
    retrieval read (None from query workers before 2026-12-07): the suppression worker applies
    nothing of an outcome that a later forget made moot (docs/architecture.md "Forget").
    """

    outcome_id: str
    tenant_id: str
    cluster: int | None
    pool_size: int
    pool: tuple[PoolRow, ...]
    query_embedding: tuple[float, ...] | None = None
    forget_version: int | None = None
    v: int = SCHEMA_VERSION

    def to_stream_fields(self) -> dict[str, str]:
        body = {"outcome_id": self.outcome_id, "cluster": self.cluster, "pool_size": self.pool_size,
                "pool": [[p.entry_id, p.initial_rank, p.final_rank, p.rerank_score] for p in self.pool],
                "query_embedding": None if self.query_embedding is None else list(self.query_embedding)}
        if self.forget_version is not None:  # absent rather than null: older workers' messages are unchanged
            body["forget_version"] = self.forget_version
        return {"v": str(self.v), "tenant_id": self.tenant_id, "outcome": json.dumps(body, separators=(",", ":"))}

    @classmethod
    def from_stream_fields(cls, raw: Mapping[bytes, bytes]) -> Outcome:
        """Decode and validate a stream message; raises InvalidInputError (MALFORMED_MESSAGE) when it is not one.

        Besides parsing, the message must make sense as an update: a valid tenant id, ``pool_size >= 1``,
        ranks in ``1..pool_size``, finite logits and embedding values, entry ids within bigint and a
        cluster within ``0..2**31-1``. A refusal here is final (a dead letter), never retried.
        """
        try:
            values = {k.decode(): v.decode() for k, v in raw.items()}
            version = check_version(values.get("v"))
            body = json.loads(values["outcome"], parse_constant=_refuse_constant)
            pool = tuple(PoolRow(int(e), int(i), int(f), float(s)) for e, i, f, s in body["pool"])
            embedding, forgets = body.get("query_embedding"), body.get("forget_version")
            if forgets is not None and (isinstance(forgets, bool) or not isinstance(forgets, int)):
                raise TypeError(f"forget_version must be an integer, not {type(forgets).__name__}")
            if not isinstance(body["outcome_id"], str):  # a request id: never a number or a list made into text
                raise TypeError(f"outcome_id must be a string, not {type(body['outcome_id']).__name__}")
            outcome = cls(
                outcome_id=body["outcome_id"], tenant_id=values["tenant_id"],
                cluster=None if body.get("cluster") is None else int(body["cluster"]),
                pool_size=int(body["pool_size"]), pool=pool,
                query_embedding=None if embedding is None else tuple(float(x) for x in embedding),
                forget_version=forgets, v=version,
            )
        except InvalidInputError:
            raise
        except (KeyError, TypeError, ValueError, UnicodeDecodeError, AttributeError) as exc:
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "outcome", f"{type(exc).__name__}: {exc}") from None
        except RecursionError:
            raise InvalidInputError(Reason.MALFORMED_MESSAGE, "outcome", "nested too deeply") from None
        outcome._check()
        return outcome

    def _check(self) -> None:
        def refuse(name: str, detail: str) -> InvalidInputError:
            return InvalidInputError(Reason.MALFORMED_MESSAGE, f"outcome.{name}", detail)

        for name, value in (("tenant_id", self.tenant_id), ("outcome_id", self.outcome_id)):
            try:
                check_id(value, name, DEFAULT_LIMITS)
            except InvalidInputError as exc:
                raise refuse(name, f"{exc.detail} ({exc.reason.value})") from None
        if self.cluster is not None and not 0 <= self.cluster <= _INT32_MAX:
            raise refuse("cluster", f"{self.cluster} is outside 0..{_INT32_MAX}")
        if self.forget_version is not None and not 0 <= self.forget_version <= _INT64_MAX:
            raise refuse("forget_version", f"{self.forget_version} is outside 0..{_INT64_MAX}")
        if self.pool_size < 1:
            raise refuse("pool_size", f"must be >= 1, got {self.pool_size}")
        for row in self.pool:
            if not 1 <= row.entry_id <= _INT64_MAX:
                raise refuse("pool", f"entry id {row.entry_id} is outside 1..{_INT64_MAX}")
            for name, rank in (("initial_rank", row.initial_rank), ("final_rank", row.final_rank)):
                if not 1 <= rank <= self.pool_size:
                    raise refuse("pool", f"{name} {rank} is outside 1..{self.pool_size}")
            if not math.isfinite(row.rerank_score):
                raise refuse("pool", f"rerank score {row.rerank_score} is not finite")
        if self.query_embedding is not None and not all(math.isfinite(x) for x in self.query_embedding):
            raise refuse("query_embedding", "has non-finite values")


_INT32_MAX = 2**31 - 1  # Postgres integer (cluster)
_INT64_MAX = 2**63 - 1  # Postgres bigint (entry id)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number JSON allows")
