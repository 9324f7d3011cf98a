"""Ingest worker: stream ``<prefix>:turns`` (group ``ingest``) into Postgres entries.

Per batch: validate every message (refused ones become dead letters with their reason), embed
all valid texts in one encoder call, then per tenant and in one transaction under the tenant's
advisory lock: skip turns already stored (a redelivery), dead-letter a known turn id with new
content (``turn_id_conflict``: the first write wins), dedupe against the tenant's canonical
entries (cosine >= 0.95 *and* the same speaker and distinguishing tokens, :mod:`mnemos.dedupe`,
docs/architecture.md "Dedupe": a near-duplicate is stored as an alias row that keeps its own
turn, and the query worker indexes its text under its canonical entry), insert with
``ON CONFLICT (tenant_id, turn_id) DO NOTHING``, bump the tenant's memory version, commit. Only
then are the stream entries acknowledged. A new tenant is created with this worker's rendering
and encoder dimension; under the lock, a tenant whose stored embeddings were made with another
version (reindexed while this worker runs, say) is refused: its turns stay pending for a worker
of that version (claimed after ``claim_idle_ms``), never written.

Turns longer than the bi-encoder window are embedded from their first 256 word pieces; the full
text is stored and indexed by BM25, and ``mnemos_ingest_encoder_truncated_total`` counts them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import redis

from api.errors import InvalidInputError, Reason
from api.schemas import Turn
from api.validation import limits_of
from mnemos.dedupe import Signature, dedupe_batch, turn_signature
from mnemos.encoder import Encoder
from mnemos.rendering import render_turn
from workers.dead_letters import DeadLetter, payload_of, publish_dead_letters
from workers.errors import EmbeddingVersionError
from workers.heartbeats import Heartbeat
from workers.metrics import ServiceMetrics
from workers.models import TruncationCounter
from workers.settings import Settings
from workers.store import NewEntry, Store, TenantLock, TenantSession, vectors_from_bytes
from workers.store_state import current_version, require_tenant_version
from workers.streams import StreamConsumer, StreamMessage, consumer_name, run_consumer

log = logging.getLogger(__name__)

GROUP = "ingest"


@dataclass
class _Pending:
    """A valid turn of the batch on its way to Postgres."""

    message: StreamMessage
    turn: Turn
    vector: np.ndarray
    truncated: bool


@dataclass
class _Canonicals:
    """Cached canonical entries of one tenant: every canonical entry with id <= ``last_entry_id``,
    its embedding and its dedupe signature (:func:`mnemos.dedupe.turn_signature`), in id order."""

    last_entry_id: int
    entry_ids: list[int]
    vectors: np.ndarray  # (n, dim) float32
    signatures: list[Signature]


@dataclass
class _TenantOutcome:
    indexed: int = 0
    duplicates: int = 0
    conflicts: list[DeadLetter] | None = None


def _new_entry(item: _Pending, entry_id: int, canonical: int | None) -> NewEntry:
    turn = item.turn
    return NewEntry(entry_id, turn.turn_id, turn.session_id, turn.role, turn.text, turn.occurred_at, item.vector,
                    canonical, dict(turn.metadata), item.truncated, item.message.stream_id)


class IngestWorker:
    """Handles batches of turn messages (see the module docstring). Single-threaded."""

    def __init__(self, settings: Settings, connection: redis.Redis, store: Store, encoder: Encoder,
                 truncation: TruncationCounter, metrics: ServiceMetrics,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.settings = settings
        self.connection = connection
        self.store = store
        self.encoder = encoder
        self.truncation = truncation
        self.metrics = metrics
        self.clock = clock
        self.limits = limits_of(settings)
        self.version = current_version(encoder.dim)  # rendering and dimension of what this worker embeds
        self._canonicals: OrderedDict[str, _Canonicals] = OrderedDict()

    # the batch --------------------------------------------------------------------------------

    def handle(self, batch: list[StreamMessage]) -> list[str]:
        """Process ``batch``; returns the stream ids to acknowledge (all of them, once committed)."""
        stream = self.settings.turns_stream
        now = self.clock()
        valid: list[tuple[StreamMessage, Turn]] = []
        rejected: list[DeadLetter] = []
        for message in batch:
            try:
                valid.append((message, Turn.from_stream_fields(message.fields, self.limits, now)))
            except InvalidInputError as exc:
                rejected.append(self._dead_letter(message, exc.reason.value, str(exc)))
        started = time.perf_counter()
        rendered = [render_turn(t.role, t.text, t.image_caption) for _, t in valid]
        vectors = self.encoder.encode(rendered)
        truncated = self.truncation.truncated(rendered)
        embed_s = time.perf_counter() - started

        by_tenant: dict[str, list[_Pending]] = {}
        for (message, turn), vector, cut in zip(valid, vectors, truncated, strict=True):
            by_tenant.setdefault(turn.tenant_id, []).append(_Pending(message, turn, vector, cut))
        started = time.perf_counter()
        indexed = duplicates = 0
        conflicts: list[DeadLetter] = []
        refused: set[str] = set()
        for tenant_id, pending in by_tenant.items():
            try:
                result = self._write_tenant(tenant_id, pending)
            except EmbeddingVersionError as exc:  # left pending for a worker of the tenant's version
                log.error("ingest worker refuses %d turns: %s", len(pending), exc)
                self.metrics.version_refusal("ingest", len(pending))
                refused.update(p.message.stream_id for p in pending)
                continue
            indexed += result.indexed
            duplicates += result.duplicates
            conflicts.extend(result.conflicts or [])
        if rejected:
            self.store.record_dead_letters(rejected)
        commit_s = time.perf_counter() - started

        letters = rejected + conflicts
        publish_dead_letters(self.connection, self.settings.dead_letter_stream, letters)
        for letter in letters:
            log.info("dead letter %s %s: %s", stream, letter.stream_id, letter.detail)
            self.metrics.rejected(letter.reason)
        self.metrics.ingest_batch(
            read=len(batch), claimed=sum(m.claimed for m in batch), embed_s=embed_s, commit_s=commit_s,
            indexed=indexed, duplicates=duplicates, truncated=sum(truncated))
        return [m.stream_id for m in batch if m.stream_id not in refused]

    def _dead_letter(self, message: StreamMessage, reason: str, detail: str, turn: Turn | None = None
                     ) -> DeadLetter:
        payload = payload_of(message.fields)
        return DeadLetter(
            stream=self.settings.turns_stream, stream_id=message.stream_id, reason=reason, detail=detail,
            tenant_id=turn.tenant_id if turn else payload.get("tenant_id"),
            turn_id=turn.turn_id if turn else payload.get("turn_id"), payload=payload)

    # one tenant, one transaction ---------------------------------------------------------------

    def _write_tenant(self, tenant_id: str, pending: Sequence[_Pending]) -> _TenantOutcome:
        outcome = _TenantOutcome(conflicts=[])
        assert self.version.dim is not None
        with self.store.tenant(tenant_id) as tx:
            tx.create_tenant(self.version.rendering, self.version.dim)
            tx.lock(TenantLock.INGEST)
            require_tenant_version(tx, self.version, adopt=True)  # never mix versions in a tenant
            fresh = self._drop_known(tx, pending, outcome)
            canon = self._load_canonicals(tx)
            new_ids: list[int] = []
            new_vectors: list[np.ndarray] = []
            new_signatures: list[Signature] = []
            if fresh:
                matrix = np.stack([p.vector for p in fresh]).astype(np.float32)
                signatures = [turn_signature(p.turn.role, p.turn.text, p.turn.image_caption) for p in fresh]
                decisions = dedupe_batch(matrix, canon.vectors, self.settings.dedupe_threshold,
                                         new_signatures=signatures, existing_signatures=canon.signatures)
                ids = tx.allocate_entry_ids(len(fresh))  # stream order, ascending
                rows: list[tuple[_Pending, int, int | None]] = []
                signature_of: dict[int, Signature] = {}
                for decision, item, signature in zip(decisions, fresh, signatures, strict=True):
                    if decision.existing is not None:
                        canonical: int | None = canon.entry_ids[decision.existing]
                    elif decision.batch is not None:
                        canonical = ids[decision.batch]
                    else:
                        canonical = None
                    rows.append((item, ids[decision.row], canonical))
                    signature_of[ids[decision.row]] = signature
                stored = tx.insert_entries([_new_entry(item, entry_id, canonical) for item, entry_id, canonical in rows])
                for item, entry_id, canonical in rows:
                    if entry_id not in stored:  # a concurrent writer won (cannot happen under the lock)
                        continue
                    if canonical is None:
                        new_ids.append(entry_id)
                        new_vectors.append(item.vector)
                        new_signatures.append(signature_of[entry_id])
                        outcome.indexed += 1
                    else:
                        outcome.duplicates += 1
                if outcome.indexed or outcome.duplicates:
                    tx.bump_memory_version()
            tx.record_dead_letters(outcome.conflicts or [])
        self._remember(tenant_id, canon, new_ids, new_vectors, new_signatures)  # only after the commit
        return outcome

    def _drop_known(self, tx: TenantSession, pending: Sequence[_Pending], outcome: _TenantOutcome) -> list[_Pending]:
        """Pending turns not stored yet; redeliveries are skipped, conflicting turn ids dead-lettered."""
        stored = tx.stored_turns(list({p.turn.turn_id for p in pending}))
        known: dict[str, Turn] = {
            r.turn_id: Turn(tx.tenant_id, r.session_id, r.turn_id, r.role, r.text, r.occurred_at) for r in stored}
        fresh: list[_Pending] = []
        for item in pending:
            first = known.get(item.turn.turn_id)
            if first is None:
                known[item.turn.turn_id] = item.turn
                fresh.append(item)
            elif not first.same_content(item.turn):
                assert outcome.conflicts is not None
                outcome.conflicts.append(self._dead_letter(
                    item.message, Reason.TURN_ID_CONFLICT.value,
                    f"turn_id {item.turn.turn_id!r} already stored with different content; first write wins",
                    item.turn))
        return fresh

    def _load_canonicals(self, tx: TenantSession) -> _Canonicals:
        """The tenant's canonical entries (embeddings and signatures): the cache plus rows committed
        since (under the lock). A signature is computed from the stored role, text and caption."""
        cached = self._canonicals.get(tx.tenant_id)
        last = cached.last_entry_id if cached else 0
        rows = tx.canonical_entries(after=last)
        ids = list(cached.entry_ids) if cached else []
        vectors = cached.vectors if cached else np.zeros((0, self.encoder.dim), np.float32)
        signatures = list(cached.signatures) if cached else []
        if rows:
            ids.extend(r.entry_id for r in rows)
            vectors = np.vstack([vectors, vectors_from_bytes([r.embedding for r in rows], self.encoder.dim)])
            signatures.extend(turn_signature(r.role, r.text, r.image_caption) for r in rows)
            last = rows[-1].entry_id
        return _Canonicals(last, ids, vectors, signatures)

    def _remember(self, tenant_id: str, canon: _Canonicals, new_ids: list[int],
                  new_vectors: list[np.ndarray], new_signatures: list[Signature]) -> None:
        if new_ids:
            canon = _Canonicals(max(new_ids), canon.entry_ids + new_ids,
                                np.vstack([canon.vectors, np.stack(new_vectors).astype(np.float32)]),
                                canon.signatures + new_signatures)
        self._canonicals[tenant_id] = canon
        self._canonicals.move_to_end(tenant_id)
        while len(self._canonicals) > self.settings.max_cached_tenants:
            self._canonicals.popitem(last=False)

    def poison(self, message: StreamMessage, exc: Exception) -> None:
        """Dead-letter a message the worker failed on by itself (``processing_error``)."""
        letter = self._dead_letter(message, Reason.PROCESSING_ERROR.value, f"{type(exc).__name__}: {exc}")
        self.store.record_dead_letters([letter])
        publish_dead_letters(self.connection, self.settings.dead_letter_stream, [letter])
        self.metrics.rejected(letter.reason)

    def on_lost(self, stream_id: str) -> None:
        log.error("turn %s of %s was trimmed before it was acknowledged", stream_id, self.settings.turns_stream)
        self.metrics.rejected(Reason.TRIMMED_BEFORE_ACK.value)

    # the loop ---------------------------------------------------------------------------------

    def consumer(self, name: str | None = None) -> StreamConsumer:
        s = self.settings
        return StreamConsumer(
            self.connection, s.turns_stream, GROUP, name or consumer_name("ingest"),
            batch_size=s.ingest_batch_size, block_ms=s.block_ms, claim_idle_ms=s.claim_idle_ms,
            claim_interval_s=s.claim_interval_s, on_lost=self.on_lost)

    def run(self, stop: threading.Event, name: str | None = None, heartbeat: Heartbeat | None = None) -> None:
        """Consume until ``stop`` is set (renewing ``heartbeat`` from the loop)."""
        log.info("ingest worker consuming %s as group %s", self.settings.turns_stream, GROUP)
        run_consumer(self.consumer(name), self.handle, stop, poison=self.poison,
                     trim_interval_s=self.settings.trim_interval_s, heartbeat=heartbeat)
