"""Builders for the worker-logic tests: the in-memory store, a Redis stand-in, fake models, messages.

The workers' logic (ingest, suppression, query service) runs here against
:class:`workers.store.FakeStore` and :class:`RecordingRedis`, in milliseconds and without servers;
the same workers are tested against the real Redis and Postgres in ``tests/integration/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from api.forget import ForgetRequest, ForgetScope
from api.schemas import Outcome, PoolRow, Turn
from mnemos.encoder import HashingEncoder
from mnemos.rerank import FakeReranker
from workers.ingest.worker import IngestWorker
from workers.query.worker import QueryService
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.models import TruncationCounter
from workers.runtime.streams import StreamMessage
from workers.settings import FAKE_MODEL, Settings
from workers.store import FakeStore
from workers.suppression.worker import SuppressionWorker

BASE_TIME = datetime(2024, 3, 1, 9, 0, tzinfo=UTC)
NOW = datetime(2024, 6, 1, tzinfo=UTC)  # the ingest worker's clock: every turn above is in its past
DIM = 64


class RecordingRedis:
    """What the workers call on Redis here (``xadd``, pipelines, and the forget's ``xrange``,
    ``xpending_range``, ``xinfo_groups``, ``xack``, ``xdel`` and a set), recorded per key. Only what the workers added
    is in a stream (the tests hand batches to the ingest worker directly), so a range is empty."""

    def __init__(self) -> None:
        self.streams: dict[str, list[dict[str, str]]] = {}
        self.acked: dict[str, list[str]] = {}
        self.deleted: dict[str, list[str]] = {}
        self.sets: dict[str, set[str]] = {}
        self.hashes: dict[str, dict[str, str]] = {}

    def xadd(self, name: str, fields: Mapping[str, Any], *args: Any, **kwargs: Any) -> str:
        entries = self.streams.setdefault(name, [])
        entries.append({str(k): str(v) for k, v in fields.items()})
        return f"{len(entries)}-0"

    def xrange(self, name: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def xpending_range(self, name: str, group: str, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def xinfo_groups(self, name: str) -> list[Any]:
        return []  # no group: the range read after a forget would be empty anyway

    def scan_iter(self, *args: Any, **kwargs: Any) -> list[Any]:
        return []

    def xack(self, name: str, group: str, *ids: str) -> int:
        self.acked.setdefault(name, []).extend(ids)
        return len(ids)

    def xdel(self, name: str, *ids: str) -> int:
        self.deleted.setdefault(name, []).extend(ids)
        return len(ids)

    def sadd(self, name: str, *members: str) -> int:
        self.sets.setdefault(name, set()).update(members)
        return len(members)

    def srem(self, name: str, *members: str) -> int:
        self.sets.setdefault(name, set()).difference_update(members)
        return len(members)

    def smembers(self, name: str) -> set[str]:
        return set(self.sets.get(name, set()))

    def pipeline(self, transaction: bool = True) -> _Pipeline:
        return _Pipeline(self)

    def hget(self, name: str, key: str) -> str | None:
        return self.hashes.get(name, {}).get(key)

    def hexists(self, name: str, key: str) -> bool:
        return key in self.hashes.get(name, {})

    def register_script(self, script: str) -> Any:
        """The client's publish script (:data:`api.directory.PUBLISH_SCRIPT`), run in Python: a message
        of a tenant with a directory marker is answered ``to:<marker>``, any other is appended."""
        def run(keys: list[str], args: list[str]) -> list[str]:
            directory, stream = keys
            out, i = [], 0
            while i < len(args):
                tenant, n = args[i], int(args[i + 1])
                flat = args[i + 2:i + 2 + n]
                marker = self.hget(directory, tenant)
                out.append(f"to:{marker}" if marker is not None
                           else f"id:{self.xadd(stream, dict(zip(flat[::2], flat[1::2], strict=True)))}")
                i += 2 + n
            return out
        return run


class _Pipeline:
    """Queues calls on a :class:`RecordingRedis` and runs them on ``execute``."""

    def __init__(self, redis: RecordingRedis) -> None:
        self._redis = redis
        self._calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        def queue(*args: Any, **kwargs: Any) -> _Pipeline:
            self._calls.append((name, args, kwargs))
            return self
        return queue

    def execute(self) -> list[Any]:
        return [getattr(self._redis, name)(*args, **kwargs) for name, args, kwargs in self._calls]


def unit_settings(**changes: Any) -> Settings:
    return Settings(bi_encoder=FAKE_MODEL, cross_encoder=FAKE_MODEL, fake_encoder_dim=DIM, metrics_enabled=False,
                    stream_prefix="unit", clusters_k=2, bootstrap_factor=2,
                    session_weight=0.0, temporal_weight=0.0).replace(**changes)


def ingest_worker(store: FakeStore, redis: RecordingRedis, settings: Settings | None = None) -> IngestWorker:
    return IngestWorker(settings or unit_settings(), redis, store, HashingEncoder(DIM),  # type: ignore[arg-type]
                        TruncationCounter(), ServiceMetrics(), clock=lambda: NOW)


def suppression_worker(store: FakeStore, redis: RecordingRedis, settings: Settings | None = None) -> SuppressionWorker:
    return SuppressionWorker(settings or unit_settings(), redis, store, ServiceMetrics())  # type: ignore[arg-type]


def query_service(store: FakeStore, redis: RecordingRedis, settings: Settings | None = None, *,
                  rerank: bool = True) -> QueryService:
    return QueryService(settings or unit_settings(), redis, store, HashingEncoder(DIM),  # type: ignore[arg-type]
                        FakeReranker() if rerank else None, ServiceMetrics())


def turn_message(stream_id: str, tenant: str, turn_id: str, text: str, *, session: str = "s1", role: str = "user",
                 minutes: int = 0, readd: bool = False) -> StreamMessage:
    turn = Turn(tenant, session, turn_id, role, text, BASE_TIME + timedelta(minutes=minutes))
    fields = {k.encode(): v.encode() for k, v in turn.to_stream_fields().items()}
    if readd:
        fields[b"readd"] = b"1"
    return StreamMessage(stream_id, fields)


def forget_message(stream_id: str, tenant: str, *, session: str | None = None,
                   turn_ids: tuple[str, ...] | None = None) -> StreamMessage:
    """A forget event of the tenant, one of its sessions or some of its turn ids."""
    scope = ForgetScope.SESSION if session is not None else ForgetScope.TURNS if turn_ids else ForgetScope.TENANT
    request = ForgetRequest(tenant, scope, session, tuple(turn_ids or ()))
    return StreamMessage(stream_id, {k.encode(): v.encode() for k, v in request.to_stream_fields().items()})


CONVERSATION = (
    ("s1", "user", "I adopted a grey cat named Pixel last spring"),
    ("s1", "assistant", "Pixel sounds lovely, how old is she"),
    ("s2", "user", "My brother Tomas moved to Porto for a job at a bakery"),
    ("s2", "user", "He bakes sourdough bread every morning at five"),
    ("s3", "user", "I started learning the cello in January"),
    ("s3", "user", "My cello teacher is called Ines and she is strict"),
)


def conversation(tenant: str, first_id: int = 1) -> list[StreamMessage]:
    return [turn_message(f"{first_id + i}-0", tenant, f"{tenant}-t{i}", text, session=session, role=role, minutes=i)
            for i, (session, role, text) in enumerate(CONVERSATION)]


def outcome(outcome_id: str, tenant: str, ids: list[int], cluster: int | None,
            embedding: tuple[float, ...] | None = None) -> Outcome:
    """Every pooled entry falls: the first ranked is last after the rerank."""
    pool = tuple(PoolRow(e, rank, len(ids) + 1 - rank, 2.0 - rank) for rank, e in enumerate(ids, start=1))
    return Outcome(outcome_id, tenant, cluster, len(ids), pool, embedding)
