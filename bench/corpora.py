"""Benchmark corpora: dataset conversations turned into tenant indexes, per tenant or pooled.

Turn and session ids are made global (``"<conversation>/<turn id>"``) so the pooled index, where
LoCoMo's ``D1:3`` would repeat in every conversation, stays unambiguous. Each tenant is built
like the service builds one: embed, dedupe within the tenant (cosine >= 0.95 and, unless the
guard is switched off for the ablation, equal speaker and distinguishing tokens:
:mod:`mnemos.dedupe`, docs/architecture.md "Dedupe"), add canonical entries to a
:class:`~mnemos.tenant_index.TenantIndex`, then fold each alias into its canonical entry with
its own session, role and time and its rendered text (which BM25 then reads with the canonical's).
Relevant turns are mapped to canonical entry ids, so an absorbed gold turn still counts when
its canonical is retrieved.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

import numpy as np

from bench.datasets import Conversation, Turn
from mnemos.dedupe import DEFAULT_THRESHOLD, dedupe_batch, turn_signature
from mnemos.records import Entry, TurnFacts
from mnemos.rendering import RENDERING_VERSION, Rendering, render_turn
from mnemos.sessions import SessionIndex
from mnemos.tenant_index import TenantIndex

__all__ = ["CorpusMode", "SessionIndex", "Tenant", "build_tenants", "global_id", "rendered_texts"]


class CorpusMode(StrEnum):
    """How conversations map to tenants."""

    PER_TENANT = "per_tenant"
    """Each conversation is its own tenant (the service's unit of isolation)."""
    POOLED = "pooled"
    """Every conversation in one index, as *Clustered Retrieval-Induced Forgetting* (§4.1) evaluates LongMemEval S."""


def global_id(conversation_id: str, local_id: str) -> str:
    """``"<conversation>/<local id>"``: unique across a pooled corpus."""
    return f"{conversation_id}/{local_id}"


@dataclass
class Tenant:
    """One tenant of a corpus mode: its index plus the maps the metrics need.

    ``canonical`` maps every global turn id of the tenant to its canonical entry id;
    ``entry_session`` / ``entry_date`` give an entry's session and its turn's time (in the bench's
    datasets every turn carries its session's start). ``sessions`` is the session-level retriever
    over every turn of the tenant, dedupe aliases included, in dataset order.
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

    def relevant_entries(self, turn_ids: frozenset[str]) -> frozenset[int]:
        """Canonical entry ids of the given global turn ids (ids outside the tenant are ignored)."""
        return frozenset(self.canonical[t] for t in turn_ids if t in self.canonical)


def _build_tenant(
    tenant_id: str,
    rows: Sequence[tuple[int, str, Turn]],
    vectors: np.ndarray,
    dim: int,
    dedupe_threshold: float | None,
    rendering: Rendering,
    dedupe_guard: bool = True,
) -> Tenant:
    """``rows`` are ``(global turn number, conversation id, turn)``; ``vectors`` their embeddings
    (of the rendered texts, :func:`rendered_texts`)."""
    index = TenantIndex(tenant_id, dim, rendering=rendering)
    if dedupe_threshold is None:
        decisions = [None] * len(rows)
    else:
        signatures = [turn_signature(turn.role, turn.text, turn.image_caption) for _, _, turn in rows]
        decided = dedupe_batch(vectors, np.zeros((0, dim)), dedupe_threshold, new_signatures=signatures,
                               existing_signatures=[], guard=dedupe_guard)
        decisions = [d if d.is_duplicate else None for d in decided]
    aliases: dict[int, list[int]] = defaultdict(list)  # canonical entry id -> its alias rows, in order
    canonical: dict[str, int] = {}
    for i, (number, conv, turn) in enumerate(rows):
        decision = decisions[i]
        if decision is not None and decision.batch is not None:
            target = rows[decision.batch][0]
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
) -> dict[str, Tenant]:
    """Tenants of ``mode``, keyed by tenant id (the conversation id, or ``"pooled"``).

    ``turn_vectors`` is ``(total turns, dim)`` float32: embeddings of :func:`rendered_texts` under
    the same ``rendering``, rows in conversation order then turn order; a turn's row number is its
    entry id in every mode (aliases have no entry). ``dedupe_threshold`` None turns dedupe off;
    ``dedupe_guard`` False dedupes on cosine alone (the "dedupe guard off" ablation,
    :func:`mnemos.dedupe.dedupe_batch`).
    """
    rows: list[tuple[int, str, Turn]] = []
    for conv in conversations:
        base = len(rows)
        rows.extend((base + i, conv.conversation_id, turn) for i, turn in enumerate(conv.turns))
    if turn_vectors.shape != (len(rows), dim):
        raise ValueError(f"turn_vectors must be ({len(rows)}, {dim}), got {turn_vectors.shape}")
    groups: dict[str, list[tuple[int, str, Turn]]] = defaultdict(list)
    for row in rows:
        groups["pooled" if mode is CorpusMode.POOLED else row[1]].append(row)
    return {
        tenant_id: _build_tenant(
            tenant_id, members, turn_vectors[[n for n, _, _ in members]], dim, dedupe_threshold, Rendering(rendering),
            dedupe_guard,
        )
        for tenant_id, members in groups.items()
    }
