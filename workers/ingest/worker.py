"""Ingest worker: stream ``<prefix>:turns`` (group ``ingest``) into Postgres entries.

Per batch: validate every message (refused ones become dead letters with their reason), embed
all valid texts in one encoder call, then per tenant and in one transaction under the tenant's
advisory lock: skip turns already stored (a redelivery), dead-letter a known turn id with new
content, metadata included (``turn_id_conflict``: the first write wins; the detail names the
differing fields), dedupe against the tenant's canonical
entries (cosine >= 0.95 *and* the same speaker and distinguishing tokens, :mod:`mnemos.dedupe`,
docs/architecture.md "Dedupe": a near-duplicate is stored as an alias row that keeps its own
turn, and the query worker indexes its text under its canonical entry), insert with
``ON CONFLICT (tenant_id, turn_id) DO NOTHING``, bump the tenant's memory version, commit. Only
then are the stream entries acknowledged. A new tenant is created with this worker's rendering
and encoder dimension; under the lock, a tenant whose stored embeddings were made with another
version (reindexed while this worker runs, say) is refused: its turns stay pending for a worker
of that version (claimed after ``claim_idle_ms``), never written.

Forget events on the same stream (:mod:`api.forget`) are applied in stream order with the
tenant's turns, each in its own transaction under the tenant's lock (:mod:`workers.ingest.forget`);
turns a tombstone covers are dropped, and the streams' copies of what a batch forgot or dropped
are deleted after the commits (:mod:`workers.ingest.forget_streams`, docs/architecture.md "Forget").

Turns longer than the bi-encoder window are embedded from their first 256 word pieces; the full
text is stored and indexed by BM25, ``mnemos_ingest_encoder_truncated_total`` counts them, and
dedupe compares the words the encoder did not read (``unread`` of :func:`mnemos.dedupe.turn_signature`),
so two long turns that differ only past the window stay two entries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import redis

from api.directory import marked
from api.errors import InvalidInputError, Reason
from api.forget import ForgetRequest, is_forget_message, is_readd, is_replace
from api.schemas import Turn
from api.validation import limits_of
from mnemos.canonical_set import CanonicalSet
from mnemos.dedupe import Signature, turn_signature
from mnemos.encoder import Encoder
from mnemos.rendering import render_turn
from workers.ingest.forget import (
    Verdict,
    apply_forget,
    record_letters,
    record_readd,
    sweep_dropped,
    tombstone_verdict,
)
from workers.ingest.forget_streams import Erasure, erase_copies, sweep_deferred
from workers.runtime.dead_letters import DeadLetter, payload_of, publish_dead_letters, sent_id
from workers.runtime.errors import EmbeddingVersionError
from workers.runtime.heartbeats import Heartbeat
from workers.runtime.metrics import ServiceMetrics
from workers.runtime.models import TruncationCounter
from workers.runtime.streams import StreamConsumer, StreamMessage, consumer_name, run_consumer
from workers.settings import Settings
from workers.store import Store, TenantSession
from workers.store.rows import EntryRow, TenantLock, vector_to_bytes, vectors_from_bytes
from workers.store.state import current_version, require_tenant_version

log = logging.getLogger(__name__)

GROUP = "ingest"
UPSTREAM_LOSS = ("turns and forget events not yet stored or applied, and the copies on the dead-letter stream "
                 "(the dead_letters table keeps them); publish those turns again (a turn id is stored "
                 "once, a redelivery is skipped) and any forget that did not take effect")


class _MovedAway(Exception):
    """Raised under a tenant's lock when this shard's directory marks it as moved away (or being moved):
    the transaction rolls back and the tenant's items stay pending (docs/scaling.md "Moving a tenant between shards")."""


@dataclass
class _Pending:
    """A valid turn of the batch on its way to Postgres."""

    message: StreamMessage
    turn: Turn
    vector: np.ndarray
    unread: str | None  # the end of the rendering the bi-encoder did not read (None: it read it all)


@dataclass
class _Canonicals:
    """Cached canonical entries of one tenant: every canonical entry with id <= ``last_entry_id``,
    its embedding and its dedupe signature (:func:`mnemos.dedupe.turn_signature`), in id order.
    Grown in place, ``O(batch)`` per batch (:class:`mnemos.canonical_set.CanonicalSet`,
    docs/scaling.md "Ingest of a large tenant"), only with committed rows."""

    last_entry_id: int
    entry_ids: list[int]  # entry id of each row of ``entries``
    entries: CanonicalSet
    forget_version: int = 0  # the tenant's forget version they were read at (another: reloaded)


@dataclass
class _Forget:
    """A forget event of the batch (:mod:`api.forget`); ``replace``: the forget half of a replace
    message (:func:`api.forget.is_replace`), applied only where the re-add can be too, and without
    the erasure of copies (stream, dead letters, stored results) that a forget by request does."""

    message: StreamMessage
    request: ForgetRequest
    replace: bool = False


@dataclass
class _TenantOutcome:
    indexed: int = 0
    duplicates: int = 0
    conflicts: list[DeadLetter] | None = None
    dropped: list[str] = field(default_factory=list)  # stream ids a tombstone kept out
    swept: list[Erasure] = field(default_factory=list)  # retries a dropped message's sweep erased
    repeats: list[_Pending] = field(default_factory=list)  # messages that repeated a stored value or one of the batch


@dataclass
class _BatchTotals:
    """What a batch did, summed over its tenants' transactions."""

    indexed: int = 0
    duplicates: int = 0
    conflicts: list[DeadLetter] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)  # left pending: another embedding version
    erasures: list[Erasure] = field(default_factory=list)  # of the forgets by request, and sweeps

    def add(self, outcome: _TenantOutcome) -> None:
        self.indexed += outcome.indexed
        self.duplicates += outcome.duplicates
        self.conflicts.extend(outcome.conflicts or [])
        self.dropped.extend(outcome.dropped)
        self.erasures.extend(outcome.swept)


def _conflict_detail(turn_id: str, differences: Sequence[str]) -> str:
    """Why a known turn id with other content was refused, naming what differs: a metadata-only edit
    (``supersedes``, ``image_caption``) is refused like a text edit, never skipped as a redelivery."""
    return (f"turn_id {turn_id!r} already stored with a different {', '.join(differences)}; first write wins "
            "(to change a stored turn, forget it and publish it again with readd)")


def _new_entry(item: _Pending, entry_id: int, canonical: int | None) -> EntryRow:
    turn, readd = item.turn, item.message.position if is_readd(item.message.fields) else None
    return EntryRow(turn_id=turn.turn_id, session_id=turn.session_id, role=turn.role, text=turn.text,
                    occurred_at=turn.occurred_at, metadata=dict(turn.metadata), entry_id=entry_id,
                    embedding=vector_to_bytes(item.vector), canonical_entry_id=canonical,
                    encoder_truncated=item.unread is not None, stream_id=item.message.stream_id,
                    readd_ms=readd and readd[0], readd_seq=readd and readd[1])


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
        """Process ``batch``; returns the stream ids to acknowledge (all of them, once committed, but
        those of a tenant refused for its embedding version). Each tenant's turns and forget events
        are applied in stream order; the streams' copies of forgotten turns are deleted last."""
        now = self.clock()
        parsed: list[tuple[StreamMessage, Turn | ForgetRequest]] = []
        rejected: list[DeadLetter] = []
        for message in batch:
            try:
                parsed.append((message, ForgetRequest.from_stream_fields(message.fields, self.limits)
                               if is_forget_message(message.fields)
                               else Turn.from_stream_fields(message.fields, self.limits, now)))
            except InvalidInputError as exc:
                rejected.append(self._dead_letter(message, exc.reason.value, str(exc)))
        rejected, moved = self._record_refused(rejected)  # before the tenants' forgets, which delete what they cover
        started = time.perf_counter()
        turns = [t for _, t in parsed if isinstance(t, Turn)]
        rendered = [render_turn(t.role, t.text, t.image_caption) for t in turns]
        vectors = iter(self.encoder.encode(rendered))
        ends = self.truncation.cuts(rendered)  # per turn: what the encoder did not read, None: nothing
        cuts = iter(ends)
        embed_s = time.perf_counter() - started

        by_tenant: dict[str, list[_Pending | _Forget]] = {}
        for message, item in parsed:
            queue = by_tenant.setdefault(item.tenant_id, [])
            if isinstance(item, Turn) and is_replace(message.fields):  # its turn id forgotten first, here
                queue.append(_Forget(message, ForgetRequest.replacing(item.tenant_id, item.turn_id), replace=True))
            queue.append(_Pending(message, item, next(vectors), next(cuts)) if isinstance(item, Turn)
                         else _Forget(message, item))
        started = time.perf_counter()
        totals = _BatchTotals()
        totals.refused.update(letter.stream_id for letter in moved)  # left pending: the move carries them
        for tenant_id, items in by_tenant.items():
            self._handle_tenant(tenant_id, items, totals)
        commit_s = time.perf_counter() - started

        for letter in rejected + totals.conflicts:  # recorded and copied to the dead stream by now
            log.info("dead letter %s %s: %s", self.settings.turns_stream, letter.stream_id, letter.detail)
            self.metrics.rejected(letter.reason)
        self._erase(batch, totals)
        self.metrics.ingest_batch(
            read=len(batch), claimed=sum(m.claimed for m in batch), embed_s=embed_s, commit_s=commit_s,
            indexed=totals.indexed, duplicates=totals.duplicates, truncated=sum(end is not None for end in ends))
        return [m.stream_id for m in batch if m.stream_id not in totals.refused]

    def _handle_tenant(self, tenant_id: str, items: Sequence[_Pending | _Forget], totals: _BatchTotals) -> None:
        """One tenant's items in stream order: each run of turns in one transaction, then the forget
        after it in another. A refused embedding version leaves the rest of the tenant's items pending."""
        start = 0
        for position, item in enumerate([*items, None]):
            if isinstance(item, _Pending):
                continue
            run = [p for p in items[start:position] if isinstance(p, _Pending)]
            try:
                if run:
                    totals.add(self._write_tenant(tenant_id, run))
                if isinstance(item, _Forget):
                    erasure = self._forget(tenant_id, item)
                    if not item.replace:  # a replace updates a turn; copies of the old value age out
                        totals.erasures.append(erasure)
            except EmbeddingVersionError as exc:  # left pending for a worker of the tenant's version
                log.error("ingest worker refuses %d turns: %s", len(items) - start, exc)
                self.metrics.version_refusal("ingest", len(run))
                totals.refused.update(i.message.stream_id for i in items[start:])
                return
            except _MovedAway:  # the move took (or takes) these messages to the tenant's new shard
                log.info("ingest worker leaves %d messages of a tenant being moved or moved away", len(items) - start)
                totals.refused.update(i.message.stream_id for i in items[start:])
                return
            start = position + 1

    def _forget(self, tenant_id: str, item: _Forget) -> Erasure:
        """Apply one forget event in its own transaction, under the tenant's ingest lock
        (:func:`workers.ingest.forget.apply_forget`); returns what its copies' erasure needs."""
        with self.store.tenant(tenant_id) as tx:
            tx.lock(TenantLock.INGEST)
            self._check_not_moved(tenant_id)
            if item.replace:  # a worker that cannot store the re-add must not apply the forget half
                require_tenant_version(tx, self.version)
            report = apply_forget(tx, item.request, self.settings.turns_stream, item.message.stream_id,
                                  replace=item.replace)
        if report.bumped:
            self._canonicals.pop(tenant_id, None)  # other ingest workers see the new forget version
        self.metrics.forgotten(report.turns)
        log.info("forget %s (%s) erased %d turns, promoted %d aliases, deleted %d dead letters",
                 item.message.stream_id, item.request.scope.value, report.turns, report.promoted, report.dead_letters)
        return Erasure(item.request, item.message.stream_id, report.entry_ids, report.late, report.named, report.at)

    def _erase(self, batch: Sequence[StreamMessage], totals: _BatchTotals) -> None:
        """Delete the streams' copies of what this batch forgot or dropped (:mod:`workers.ingest.forget_streams`)."""
        if totals.erasures or totals.dropped:
            erase_copies(self.connection, self.settings.turns_stream, self.settings.dead_letter_stream, GROUP,
                         {m.stream_id for m in batch} - totals.refused, totals.dropped, totals.erasures,
                         stream_prefix=self.settings.stream_prefix, limits=self.limits)

    def _record_refused(self, letters: list[DeadLetter]) -> tuple[list[DeadLetter], list[DeadLetter]]:
        """:func:`workers.ingest.forget.record_letters` of the refused messages: ``(recorded, left)``."""
        s = self.settings
        kept, left = record_letters(self.store, self.connection, s.dead_letter_stream, self.limits, letters,
                                    lambda tenant: marked(self.connection, s.stream_prefix, s.shard, s.shards, tenant))
        if len(kept) + len(left) < len(letters):
            self.metrics.tombstoned(len(letters) - len(kept) - len(left))
        return kept, left

    def _dead_letter(self, message: StreamMessage, reason: str, detail: str, turn: Turn | None = None
                     ) -> DeadLetter:
        return DeadLetter(
            stream=self.settings.turns_stream, stream_id=message.stream_id, reason=reason, detail=detail,
            tenant_id=turn.tenant_id if turn else sent_id(message.fields, b"tenant_id"),
            turn_id=turn.turn_id if turn else sent_id(message.fields, b"turn_id"), payload=payload_of(message.fields))

    # one tenant, one transaction ---------------------------------------------------------------

    def _write_tenant(self, tenant_id: str, pending: Sequence[_Pending]) -> _TenantOutcome:
        outcome = _TenantOutcome(conflicts=[])
        assert self.version.dim is not None
        with self.store.tenant(tenant_id) as tx:
            tx.create_tenant(self.version.rendering, self.version.dim)
            tx.lock(TenantLock.INGEST)
            self._check_not_moved(tenant_id)
            record = require_tenant_version(tx, self.version, adopt=True)  # never mix versions in a tenant
            fresh = self._drop_known(tx, pending, outcome)
            canon = self._load_canonicals(tx, 0 if record is None else record.forget_version)
            new_ids: list[int] = []
            new_vectors: list[np.ndarray] = []
            new_signatures: list[Signature] = []
            if fresh:
                matrix = np.stack([p.vector for p in fresh]).astype(np.float32)
                signatures = [turn_signature(p.turn.role, p.turn.text, p.turn.image_caption, unread=p.unread or "")
                              for p in fresh]
                decisions = canon.entries.dedupe(matrix, self.settings.dedupe_threshold, new_signatures=signatures)
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
            for item in outcome.repeats:  # the value's earliest message, and its latest re-add
                tx.record_repeat(item.turn.turn_id, item.message.stream_id, is_readd(item.message.fields))
            # the stream copies of letters recorded now, before the commit, under the lock: a forget
            # that waits for it finds them, and a retried batch does not copy them again
            publish_dead_letters(self.connection, self.settings.dead_letter_stream,
                                 tx.record_dead_letters(outcome.conflicts or []))
        self._remember(tenant_id, canon, new_ids, new_vectors, new_signatures)  # only after the commit
        return outcome

    def _check_not_moved(self, tenant_id: str) -> None:
        """Under the tenant's lock: raise _MovedAway when this shard's directory marks the tenant (a move
        froze it before taking the same lock, so a marker read here is never too early or too late)."""
        s = self.settings
        if marked(self.connection, s.stream_prefix, s.shard, s.shards, tenant_id):
            raise _MovedAway(tenant_id)

    def _drop_known(self, tx: TenantSession, pending: Sequence[_Pending], outcome: _TenantOutcome) -> list[_Pending]:
        """Pending turns not stored yet; redeliveries are skipped, conflicting turn ids dead-lettered,
        turns a forget covered dropped (:func:`workers.ingest.forget.tombstone_verdict`)."""
        turn_ids = sorted({p.turn.turn_id for p in pending})
        stored = tx.stored_turns(turn_ids)
        known: dict[str, Turn] = {
            r.turn_id: Turn(tx.tenant_id, r.session_id, r.turn_id, r.role, r.text, r.occurred_at, r.metadata)
            for r in stored}
        stones = {(t.scope, t.key): t for t in tx.tombstones(
            session_ids=sorted({p.turn.session_id for p in pending}), turn_ids=turn_ids)}
        fresh: list[_Pending] = []
        for item in pending:
            verdict = tombstone_verdict(stones, item.turn, item.message.stream_id, is_readd(item.message.fields),
                                        replace=is_replace(item.message.fields))
            if verdict is Verdict.DROP:
                if swept := sweep_dropped(tx, stones, item.turn, item.message.stream_id):  # retries read first
                    outcome.swept.append(Erasure(ForgetRequest.replacing(tx.tenant_id, item.turn.turn_id), None,
                                                 swept.entry_ids, swept.late, swept.named, swept.at))
                    if swept.entry_ids:
                        known.pop(item.turn.turn_id, None)
                        self._canonicals.pop(tx.tenant_id, None)
                outcome.dropped.append(item.message.stream_id)
                self.metrics.tombstoned()
                log.info("dropped turn %r of tenant %r (%s): a forget or a later replacement covers it (publish "
                         "it with readd to store it again)", item.turn.turn_id, tx.tenant_id, item.message.stream_id)
                continue
            if verdict is Verdict.READD:  # the tombstones stay for messages published before the re-add
                record_readd(tx, stones, item.turn.turn_id, item.message.stream_id)
            first = known.get(item.turn.turn_id)
            if first is None:
                known[item.turn.turn_id] = item.turn
                fresh.append(item)
            elif differences := first.differences(item.turn):
                assert outcome.conflicts is not None
                outcome.conflicts.append(self._dead_letter(
                    item.message, Reason.TURN_ID_CONFLICT.value, _conflict_detail(item.turn.turn_id, differences),
                    item.turn))
            else:  # repeats the value (stored, or of this batch): recorded after the inserts
                outcome.repeats.append(item)
        return fresh

    def _load_canonicals(self, tx: TenantSession, forget_version: int) -> _Canonicals:
        """The tenant's canonical entries (embeddings and signatures): the cache plus rows committed
        since (under the lock). A signature is computed from the stored role, text and caption, and
        for an entry stored with ``encoder_truncated`` from the end of its rendering the encoder cuts.
        A cache of another forget version is dropped: entries were deleted or promoted since.
        The rows read are committed, so they join the cache in place even if this transaction fails."""
        canon = self._canonicals.get(tx.tenant_id)
        if canon is None or canon.forget_version != forget_version:
            canon = _Canonicals(0, [], CanonicalSet(self.encoder.dim), forget_version)
        rows = tx.canonical_entries(after=canon.last_entry_id)
        if rows:
            cut = [r for r in rows if r.encoder_truncated]  # only these have an unread end to compare
            ends = dict(zip((r.entry_id for r in cut), self.truncation.unread(
                [render_turn(r.role, r.text, r.image_caption) for r in cut]), strict=True))
            canon.entries.add(vectors_from_bytes([r.embedding for r in rows], self.encoder.dim),
                              [turn_signature(r.role, r.text, r.image_caption, unread=ends.get(r.entry_id, ""))
                               for r in rows])
            canon.entry_ids.extend(r.entry_id for r in rows)
            canon.last_entry_id = rows[-1].entry_id
        return canon

    def _remember(self, tenant_id: str, canon: _Canonicals, new_ids: list[int],
                  new_vectors: list[np.ndarray], new_signatures: list[Signature]) -> None:
        """Add this batch's committed canonical entries to the tenant's cache (``O(batch)``), mark
        the tenant most recently used and evict beyond ``max_cached_tenants``."""
        if new_ids:
            canon.entries.add(np.stack(new_vectors), new_signatures)
            canon.entry_ids.extend(new_ids)
            canon.last_entry_id = max(new_ids)
        self._canonicals[tenant_id] = canon
        self._canonicals.move_to_end(tenant_id)
        while len(self._canonicals) > self.settings.max_cached_tenants:
            self._canonicals.popitem(last=False)

    def poison(self, message: StreamMessage, exc: Exception) -> bool:
        """Dead-letter a message the worker failed on by itself (``processing_error``) as a refused one
        (:meth:`_record_refused`: under its tenant's lock, dropped when a forget covers it); returns
        whether to acknowledge it: False for a tenant moving away (left pending for the move)."""
        letter = self._dead_letter(message, Reason.PROCESSING_ERROR.value, f"{type(exc).__name__}: {exc}")
        kept, left = self._record_refused([letter])
        if kept:
            self.metrics.rejected(letter.reason)
        return not left

    def on_lost(self, stream_id: str) -> None:
        log.error("turn %s of %s was trimmed before it was acknowledged", stream_id, self.settings.turns_stream)
        self.metrics.rejected(Reason.TRIMMED_BEFORE_ACK.value)

    # the loop ---------------------------------------------------------------------------------

    def consumer(self, name: str | None = None) -> StreamConsumer:
        s = self.settings
        return StreamConsumer(
            self.connection, s.turns_stream, GROUP, name or consumer_name("ingest"),
            batch_size=s.ingest_batch_size, block_ms=s.block_ms, claim_idle_ms=s.claim_idle_ms,
            claim_interval_s=s.claim_interval_s, on_lost=self.on_lost, upstream_loss=UPSTREAM_LOSS)

    def run(self, stop: threading.Event, name: str | None = None, heartbeat: Heartbeat | None = None) -> None:
        """Consume until ``stop`` is set (renewing ``heartbeat`` from the loop)."""
        log.info("ingest worker consuming %s as group %s", self.settings.turns_stream, GROUP)
        run_consumer(self.consumer(name), self.handle, stop, poison=self.poison,
                     trim_interval_s=self.settings.trim_interval_s, heartbeat=heartbeat, after_ack=self.after_ack)

    def after_ack(self) -> None:
        """After each acknowledgement: delete the stream copies of forgotten turns that were pending
        when their forget was applied (:func:`workers.ingest.forget_streams.sweep_deferred`)."""
        sweep_deferred(self.connection, self.settings.turns_stream, GROUP)
