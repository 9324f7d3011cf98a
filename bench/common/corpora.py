"""Benchmark corpora: dataset conversations turned into tenant indexes, per tenant or pooled.

Turn and session ids are made global (``"<conversation>/<turn id>"``) so the pooled index, where
LoCoMo's ``D1:3`` would repeat in every conversation, stays unambiguous. Each tenant is built
like the service builds one: embed, dedupe within the tenant (cosine >= 0.95 and, unless the
guard is switched off for the ablation, equal speaker, distinguishing tokens and words past the
bi-encoder's window: :mod:`mnemos.dedupe`, docs/architecture.md "Dedupe"), add canonical entries to a
:class:`~mnemos.tenant_index.TenantIndex`, then fold each alias into its canonical entry with
its own session, role and time and its rendered text (which BM25 then reads with the canonical's).
Relevant turns are mapped to canonical entry ids, so an absorbed gold turn still counts when
its canonical is retrieved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import numpy as np

from bench.common.datasets import Conversation, Turn
from mnemos.canonical_set import CanonicalSet
from mnemos.dedupe import DEFAULT_THRESHOLD, Signature, dedupe_batch, turn_signature
from mnemos.records import Entry, TurnFacts
from mnemos.rendering import RENDERING_VERSION, Rendering, render_turn
from mnemos.sessions import SessionIndex
from mnemos.tenant_index import TenantIndex

__all__ = ["CorpusMode", "SessionIndex", "Tenant", "UnreadOf", "build_tenants", "global_id", "rendered_texts",
           "unread_of"]

UnreadOf = Callable[[Sequence[str]], Sequence[str]]
"""Per rendered text, the end the bi-encoder does not read (``""``: all read), as
:meth:`workers.runtime.models.TruncationCounter.unread`; dedupe compares its words (:func:`mnemos.dedupe.turn_signature`)."""


class CorpusMode(StrEnum):
    """How conversations map to tenants."""

    PER_TENANT = "per_tenant"
    """Each conversation is its own tenant (the service's unit of isolation)."""
    POOLED = "pooled"
    """Every conversation in one index, as *Clustered Retrieval-Induced Forgetting* (§4.1) evaluates LongMemEval S."""


def unread_of(encoder: object) -> UnreadOf | None:
    """The encoder's ``unread`` method when it has one (:class:`bench.common.caches.PersistentEncoder`:
    its model's window), else None: an encoder without a window (the hashing one) reads everything."""
    method = getattr(encoder, "unread", None)
    return method if callable(method) else None


def global_id(conversation_id: str, local_id: str) -> str:
    """``"<conversation>/<local id>"``: unique across a pooled corpus."""
    return f"{conversation_id}/{local_id}"


@dataclass
class Tenant:
    """One tenant of a corpus mode: its index plus the maps the metrics need.

    ``canonical`` maps every global turn id of the tenant to its canonical entry id;
    ``entry_session`` / ``entry_date`` give an entry's session and its turn's time (in the bench's
    datasets every turn carries its session's start). ``sessions`` is the session-level retriever
    over every turn of the tenant, dedupe aliases included, in dataset order. ``n_aliases`` counts
    the turns dedupe folded into another entry, ``n_repeats`` the turns a pooled corpus with shared
    turn ids held once for several conversations (:func:`build_tenants`).
    """

    tenant_id: str
    index: TenantIndex
    canonical: dict[str, int]
    entry_session: dict[int, str]
    entry_date: dict[int, datetime]
    sessions: SessionIndex
    conversations: tuple[str, ...]
    n_aliases: int = 0
    question_keys: list[str] = field(default_factory=list)
    n_repeats: int = 0

    def relevant_entries(self, turn_ids: frozenset[str]) -> frozenset[int]:
        """Canonical entry ids of the given global turn ids (ids outside the tenant are ignored)."""
        return frozenset(self.canonical[t] for t in turn_ids if t in self.canonical)


DEDUPE_BATCH_ROWS = 8192
"""A tenant of at most this many turns is deduped as one batch; a larger one (the pooled LongMemEval-S
corpus: about 199,000 turns, whose ``(n, n)`` similarity matrix would not fit in memory) in batches
of :data:`DEDUPE_CHUNK_ROWS` against the canonical entries so far, as the ingest worker dedupes
its batches (:class:`mnemos.canonical_set.CanonicalSet`). Both decide the same rows canonical;
an alias may then point at another canonical above the threshold."""

DEDUPE_CHUNK_ROWS = 1024
"""Rows per batch above :data:`DEDUPE_BATCH_ROWS` (a ``(1024, N)`` float32 similarity block)."""


def _dedupe_rows(vectors: np.ndarray, signatures: Sequence[Signature], dim: int, threshold: float,
                 guard: bool) -> list[int | None]:
    """Per row of ``vectors`` (``(n, dim)`` float32, tenant order): the earlier row it becomes an alias
    of, or None for a canonical row (:func:`mnemos.dedupe.dedupe_batch`, batched as the service
    dedupes above :data:`DEDUPE_BATCH_ROWS` rows)."""
    n = len(signatures)
    if n <= DEDUPE_BATCH_ROWS:
        decided = dedupe_batch(vectors, np.zeros((0, dim)), threshold, new_signatures=signatures,
                               existing_signatures=[], guard=guard)
        return [d.batch if d.is_duplicate else None for d in decided]
    out: list[int | None] = []
    canon = CanonicalSet(dim)
    canon_rows: list[int] = []  # CanonicalSet row -> tenant row
    for start in range(0, n, DEDUPE_CHUNK_ROWS):
        chunk = vectors[start:start + DEDUPE_CHUNK_ROWS]
        chunk_signatures = signatures[start:start + DEDUPE_CHUNK_ROWS]
        new_rows = []
        for d in canon.dedupe(chunk, threshold, new_signatures=chunk_signatures, guard=guard):
            if d.existing is not None:
                out.append(canon_rows[d.existing])
            elif d.batch is not None:
                out.append(start + d.batch)
            else:
                out.append(None)
                new_rows.append(d.row)
        canon.add(chunk[new_rows], [chunk_signatures[i] for i in new_rows])
        canon_rows.extend(start + i for i in new_rows)
    return out


def _build_tenant(
    tenant_id: str,
    rows: Sequence[tuple[int, str, Turn]],
    vectors: np.ndarray,
    dim: int,
    dedupe_threshold: float | None,
    rendering: Rendering,
    dedupe_guard: bool = True,
    unread_of: UnreadOf | None = None,
) -> Tenant:
    """``rows`` are ``(global turn number, conversation id, turn)``; ``vectors`` their embeddings
    (of the rendered texts, :func:`rendered_texts`)."""
    index = TenantIndex(tenant_id, dim, rendering=rendering)
    decisions: list[int | None] = [None] * len(rows)  # per row: the row it is an alias of, or None
    if dedupe_threshold is not None:
        ends = unread_of(rendered_texts([t for _, _, t in rows], rendering)) if unread_of else [""] * len(rows)
        signatures = [turn_signature(turn.role, turn.text, turn.image_caption, unread=end)
                      for (_, _, turn), end in zip(rows, ends, strict=True)]
        decisions = _dedupe_rows(vectors, signatures, dim, dedupe_threshold, dedupe_guard)
    aliases: dict[int, list[int]] = defaultdict(list)  # canonical entry id -> its alias rows, in order
    canonical: dict[str, int] = {}
    for i, (number, conv, turn) in enumerate(rows):
        decision = decisions[i]
        if decision is not None:
            target = rows[decision][0]
            aliases[target].append(i)
            canonical[global_id(conv, turn.turn_id)] = target
        else:
            canonical[global_id(conv, turn.turn_id)] = number
    entries, keep = [], []
    entry_session: dict[int, str] = {}
    entry_date: dict[int, datetime] = {}
    for i, (number, conv, turn) in enumerate(rows):
        if decisions[i] is not None:
            continue
        session = global_id(conv, turn.session_id)
        entries.append(
            Entry(
                entry_id=number, tenant_id=tenant_id, turn_id=global_id(conv, turn.turn_id), session_id=session,
                role=turn.role, text=turn.text, occurred_at=turn.occurred_at, image_caption=turn.image_caption,
            )
        )
        keep.append(i)
        entry_session[number] = session
        entry_date[number] = turn.occurred_at
    index.add(entries, vectors[keep] if keep else np.zeros((0, dim), np.float32))
    for target, members in aliases.items():  # as the service's tenant cache folds them in
        alias_rows = [rows[i] for i in members]
        index.add_aliases(
            target, [global_id(conv, turn.turn_id) for _, conv, turn in alias_rows],
            [TurnFacts(global_id(conv, turn.session_id), turn.role, turn.occurred_at)
             for _, conv, turn in alias_rows],
            rendered_texts([turn for _, _, turn in alias_rows], rendering))

    sessions = SessionIndex(dim)
    sessions.add([global_id(conv, turn.session_id) for _, conv, turn in rows],
                 rendered_texts([turn for _, _, turn in rows], rendering), vectors, [turn.occurred_at for _, _, turn in rows])
    index.sessions = sessions  # every turn in dataset order, aliases included: what the pipeline's features read too
    return Tenant(
        tenant_id=tenant_id,
        index=index,
        canonical=canonical,
        entry_session=entry_session,
        entry_date=entry_date,
        sessions=sessions,
        conversations=tuple(dict.fromkeys(conv for _, conv, _ in rows)),
        n_aliases=sum(1 for d in decisions if d is not None),
    )


def rendered_texts(turns: Sequence[Turn], rendering: Rendering | int = RENDERING_VERSION) -> list[str]:
    """What the models see for each turn (:func:`mnemos.rendering.render_turn`), in order."""
    return [render_turn(t.role, t.text, t.image_caption, version=rendering) for t in turns]


def build_tenants(
    conversations: Sequence[Conversation],
    turn_vectors: np.ndarray,
    mode: CorpusMode,
    *,
    dim: int,
    dedupe_threshold: float | None = DEFAULT_THRESHOLD,
    rendering: Rendering | int = RENDERING_VERSION,
    dedupe_guard: bool = True,
    unread_of: UnreadOf | None = None,
) -> dict[str, Tenant]:
    """Tenants of ``mode``, keyed by tenant id (the conversation id, or ``"pooled"``).

    ``turn_vectors`` is ``(total turns, dim)`` float32: embeddings of :func:`rendered_texts` under
    the same ``rendering``, rows in conversation order then turn order; a turn's row number is its
    entry id in every mode (aliases have no entry). ``dedupe_threshold`` None turns dedupe off;
    ``dedupe_guard`` False dedupes on cosine alone (the "dedupe guard off" ablation,
    :func:`mnemos.dedupe.dedupe_batch`). ``unread_of`` tells what the bi-encoder did not read of
    each rendering (None: it read everything, as the hashing encoder does).

    Pooled, when every conversation has ``shared_turn_ids`` (LongMemEval), a turn id seen in an
    earlier conversation is not indexed again: the pooled tenant holds each (haystack session,
    position) once, as *Clustered Retrieval-Induced Forgetting* (§4.1) builds its 199,509-turn
    LongMemEval-S corpus, under the first conversation's global ids, and every later
    conversation's global id of that turn maps to the same entry (``canonical``); the tenant's
    ``n_repeats`` counts them. Dedupe (cosine) then runs on what is left, as always. The copy kept
    has the first conversation's date: LongMemEval-S repeats sessions under other dates in other
    haystacks (the texts are the same), so a few questions see their evidence at another date.

    Raises:
        ValueError: if ``turn_vectors`` has the wrong shape, or (shared turn ids) a conversation
            repeats a turn id.
    """
    rows: list[tuple[int, str, Turn]] = []
    for conv in conversations:
        base = len(rows)
        rows.extend((base + i, conv.conversation_id, turn) for i, turn in enumerate(conv.turns))
    if turn_vectors.shape != (len(rows), dim):
        raise ValueError(f"turn_vectors must be ({len(rows)}, {dim}), got {turn_vectors.shape}")
    groups: dict[str, list[tuple[int, str, Turn]]] = defaultdict(list)
    repeats: dict[str, str] = {}  # pooled with shared turn ids: global id of a repeat -> of the turn kept
    if mode is CorpusMode.POOLED and conversations and all(c.shared_turn_ids for c in conversations):
        first: dict[str, str] = {}  # turn id -> global id of its first occurrence
        for conv in conversations:
            ids = [t.turn_id for t in conv.turns]
            if len(set(ids)) != len(ids):
                raise ValueError(f"conversation {conv.conversation_id!r} repeats a turn id: with shared turn ids "
                                 "a turn id must name one turn")
        for row in rows:
            kept = first.setdefault(row[2].turn_id, global_id(row[1], row[2].turn_id))
            if kept == global_id(row[1], row[2].turn_id):
                groups["pooled"].append(row)
            else:
                repeats[global_id(row[1], row[2].turn_id)] = kept
    else:
        for row in rows:
            groups["pooled" if mode is CorpusMode.POOLED else row[1]].append(row)
    tenants = {
        tenant_id: _build_tenant(
            tenant_id, members, turn_vectors[[n for n, _, _ in members]], dim, dedupe_threshold, Rendering(rendering),
            dedupe_guard, unread_of,
        )
        for tenant_id, members in groups.items()
    }
    if repeats:  # every conversation's turn ids reach the one copy kept
        pooled = tenants["pooled"]
        pooled.canonical.update({repeat: pooled.canonical[kept] for repeat, kept in repeats.items()})
        pooled.conversations = tuple(c.conversation_id for c in conversations)
        pooled.n_repeats = len(repeats)
    return tenants
