"""``MnemosStore``: a LangGraph ``BaseStore`` whose items are one tenant's conversation turns.

The mapping (the tenant is the constructor's, never an operation's):

* a namespace is a session: ``("memories", "chat-7")`` is session ``memories.chat-7`` (LangGraph forbids
  ``.`` inside a label, so the join is unambiguous), and an item's key lives inside it: turn id
  ``memories.chat-7..<key>`` (a session holds no ``..``, so two (namespace, key) pairs never share a
  turn id);
* ``put`` publishes the item as a turn: ``value[text_key]`` (a string) is the text, ``value["speaker"]``
  the speaker (default ``user``), ``value["timestamp"]`` (ISO 8601 with a zone) when it was said
  (default now), every other field its metadata (a JSON object of at most ``MNEMOS_MAX_METADATA_BYTES``).
  Every put publishes one replace message (:meth:`api.client.MnemosClient.replace_turn`): the ingest
  worker forgets the key's turn and re-adds it with the new value (Mnemos never edits a stored turn
  in place, and an earlier put or delete of the key may still be in the stream, so whether it exists
  is not asked). Copies of the old value in the stream and in stored results age out with the
  stream's trim and the result TTL; ``put(..., None)`` and ``delete`` forget the key for good. Each waits up to
  ``ingest_wait_s`` for the ingest worker's commit, so the next ``get`` or ``search`` sees it (past
  the wait it logs a warning and returns: the write stays on the stream and is applied later);
* ``get`` reads the stored turn back (catalog read through the queue) as the value it was put with;
* ``search(prefix, query=...)`` is a Mnemos retrieval limited to the sessions under the prefix (at most
  1,024 of them, a request's filter limit), best first, with the reranker's score; its items carry text,
  speaker and timestamp (a retrieval returns no metadata: ``get`` the item for its other fields). A
  memory deduplicated across namespaces is returned as its own item under the prefix, never as the
  item of another namespace. Paging reaches the best ``MNEMOS_MAX_K`` (100) items: ``offset + limit``
  past them raises ``NotImplementedError``, and ``limit`` 0 finds nothing.

A value without a string ``text`` field raises ``ValueError`` (arbitrary JSON documents are not turns; the
value is ``{"text": ..., "speaker"?: ..., "timestamp"?: ISO 8601, other keys kept as metadata}``). What
Mnemos cannot honour raises ``NotImplementedError`` with the reason instead of guessing: a search without ``query`` (Mnemos
ranks by relevance, it has no listing of items), a ``filter`` on anything but ``speaker``, and
``list_namespaces`` with ``prefix``/``suffix`` conditions or ``max_depth``. TTLs are not supported
(``supports_ttl`` is False, so LangGraph refuses a ``ttl`` itself); ``index`` is ignored: every turn's
text is indexed, for BM25 and dense retrieval alike.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    validate_op_namespace,
)

from api.catalog import TurnRecord
from api.client import MnemosClient
from api.schemas import Hit
from api.validation import check_wait_or_zero

log = logging.getLogger(__name__)

KEY_SEPARATOR = ".."
_RESERVED = ("speaker", "timestamp")


def session_of(namespace: tuple[str, ...]) -> str:
    """The session id of a namespace (labels joined by ``.``)."""
    return ".".join(namespace)


def turn_id_of(namespace: tuple[str, ...], key: str) -> str:
    """The turn id of an item: its session, ``..``, its key."""
    return f"{session_of(namespace)}{KEY_SEPARATOR}{key}"


def item_address(session_id: str, turn_id: str) -> tuple[tuple[str, ...], str]:
    """(namespace, key) of a stored turn; a turn not put through the store keeps its turn id as key."""
    prefix = session_id + KEY_SEPARATOR
    key = turn_id[len(prefix):] if turn_id.startswith(prefix) else turn_id
    return tuple(session_id.split(".")), key


class MnemosStore(BaseStore):
    """One tenant's memory as a LangGraph store (the module docstring has the mapping and the limits).

    Args:
        client: the deployment's client.
        tenant_id: the tenant every operation acts for.
        text_key: the value field that holds an item's text.
        default_speaker: the speaker of an item without ``speaker``.
        ingest_wait_s: how long put and delete wait for the ingest worker's commit (0: not at all;
            else in (0, 86400] s, or InvalidInputError ``bad_timeout`` here).
    """

    supports_ttl = False

    def __init__(self, client: MnemosClient, tenant_id: str, *, text_key: str = "text", default_speaker: str = "user",
                 ingest_wait_s: float = 10.0) -> None:
        self.client = client
        self.tenant_id = tenant_id
        self.text_key = text_key
        self.default_speaker = default_speaker
        self.ingest_wait_s = check_wait_or_zero(ingest_wait_s, "ingest_wait_s")  # before any put is sent

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order (each its own call through the client). Raises InvalidNamespaceError,
        before any op runs, for a namespace label that is empty or holds ``.`` (LangGraph's
        ``validate_op_namespace``: ops passed here skip the checks of ``put``/``get``, and a label
        ``"a.b"`` would otherwise address the namespace ``("a", "b")``)."""
        ops = list(ops)
        for op in ops:
            validate_op_namespace(op)
        results: list[Result] = []
        for op in ops:
            if isinstance(op, GetOp):
                results.append(self._get(op))
            elif isinstance(op, SearchOp):
                results.append(self._search(op))
            elif isinstance(op, PutOp):
                self._put(op)
                results.append(None)
            elif isinstance(op, ListNamespacesOp):
                results.append(self._list_namespaces(op))
            else:
                raise NotImplementedError(f"MnemosStore does not know the operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """:meth:`batch` in a worker thread (the client is synchronous)."""
        return await asyncio.to_thread(self.batch, list(ops))

    # operations -------------------------------------------------------------------------------

    def _get(self, op: GetOp) -> Item | None:
        turns = self.client.turns(self.tenant_id, [turn_id_of(op.namespace, op.key)])
        if not turns:
            return None
        namespace, key = item_address(turns[0].session_id, turns[0].turn_id)
        return Item(value=self._value(turns[0]), key=key, namespace=namespace, created_at=turns[0].occurred_at,
                    updated_at=turns[0].occurred_at)

    def _put(self, op: PutOp) -> None:
        # Always replace (forget, then re-add, in one message): whether the key exists cannot be read
        # reliably (an earlier put or delete of it may still be in the stream), and the stream applies
        # a tenant's events in order. A forget of a key never stored is a no-op the re-add lifts.
        turn_id = turn_id_of(op.namespace, op.key)
        if op.value is None:
            self._wait(self.client.forget(self.tenant_id, turn_ids=[turn_id]), f"delete of {turn_id!r}")
            return
        text = op.value.get(self.text_key)
        if not isinstance(text, str):
            raise ValueError(f"MnemosStore stores conversation turns: a value needs a string {self.text_key!r} "
                             "field (arbitrary JSON documents are not memories Mnemos can rank)")
        metadata = {k: v for k, v in op.value.items() if k not in (self.text_key, *_RESERVED)}
        turn: dict[str, Any] = {"tenant_id": self.tenant_id, "session_id": session_of(op.namespace),
                                "turn_id": turn_id, "text": text,
                                "role": op.value.get("speaker", self.default_speaker),
                                "occurred_at": op.value.get("timestamp", datetime.now(UTC).isoformat())}
        if metadata:
            turn["metadata"] = metadata
        # refused before anything is sent; one message, so of two concurrent puts of one key the one
        # published later wins, whichever ingest consumers read them (break-it sessions, 2026-12-07)
        self._wait(self.client.replace_turn(turn), f"put of {turn_id!r}")

    def _search(self, op: SearchOp) -> list[SearchItem]:
        if op.query is None:
            raise NotImplementedError("MnemosStore searches by relevance: pass query=...; Mnemos has no listing of "
                                      "items without a query")
        filters: dict[str, Any] = {}
        for name, wanted in (op.filter or {}).items():
            if name != "speaker" or not isinstance(wanted, str):
                raise NotImplementedError(f"MnemosStore filters on speaker (a string) only, not {name!r}: Mnemos "
                                          "keeps other value fields as metadata it does not index")
            filters["roles"] = [wanted]
        sessions: set[str] | None = None
        if op.namespace_prefix:
            prefix = session_of(op.namespace_prefix)
            sessions = {s.session_id for s in self.client.sessions(self.tenant_id)
                        if s.session_id == prefix or s.session_id.startswith(prefix + ".")}
            if not sessions:
                return []
            if len(sessions) > self.client.limits.max_filter_values:
                raise NotImplementedError(
                    f"MnemosStore searches at most {self.client.limits.max_filter_values} namespaces at once; "
                    f"{op.namespace_prefix!r} holds {len(sessions)}: search a narrower prefix")
            filters["session_ids"] = sorted(sessions)
        if op.limit <= 0:
            return []
        k = op.offset + op.limit
        if op.offset < 0 or k > self.client.limits.max_k:  # hits past the cap were cut silently before
            raise NotImplementedError(
                f"MnemosStore ranks the best {self.client.limits.max_k} items of a search (MNEMOS_MAX_K); "
                f"offset {op.offset} + limit {op.limit} reaches past them: search with a narrower query or prefix")
        result = self.client.retrieve(self.tenant_id, op.query, k=k, filters=filters or None)
        return [self._search_item(hit, record) for hit, record in self._in_prefix(result.hits[op.offset:], sessions)]

    def _in_prefix(self, hits: Sequence[Hit], sessions: set[str] | None) -> list[tuple[Hit, TurnRecord]]:
        """Each hit with the stored turn it stands for under the prefix. A deduplicated memory passes the
        session filter by any of its turns, but a hit carries its canonical turn, which may live in
        another namespace: then the item is its alias inside the prefix, read back with its own text."""
        records = {hit.turn_id: TurnRecord(hit.turn_id, hit.session_id, hit.role, hit.text, hit.occurred_at)
                   for hit in hits}
        inside = {hit.turn_id: hit.turn_id if sessions is None or hit.session_id in sessions
                  else next((a for a in hit.aliases if a.split(KEY_SEPARATOR, 1)[0] in sessions), None)
                  for hit in hits}
        wanted = sorted({t for hit_id, t in inside.items() if t is not None and t != hit_id})
        if wanted:
            records.update({r.turn_id: r for r in self.client.turns(self.tenant_id, wanted)})
        return [(hit, records[t]) for hit in hits if (t := inside[hit.turn_id]) is not None and t in records]

    def _search_item(self, hit: Hit, record: TurnRecord) -> SearchItem:
        namespace, key = item_address(record.session_id, record.turn_id)
        return SearchItem(namespace, key, self._value(record), record.occurred_at, record.occurred_at,
                          score=hit.score)

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        if op.match_conditions or op.max_depth is not None:
            raise NotImplementedError("MnemosStore lists every namespace (session) of its tenant; prefix/suffix "
                                      "conditions and max_depth are not supported")
        sessions = [tuple(s.session_id.split(".")) for s in self.client.sessions(self.tenant_id)]
        return sorted(sessions)[op.offset:op.offset + op.limit]

    # helpers ----------------------------------------------------------------------------------

    def _value(self, turn: TurnRecord) -> dict[str, Any]:
        """An item's value from its stored turn: text, speaker, timestamp and the metadata fields."""
        return {**dict(turn.metadata), self.text_key: turn.text, "speaker": turn.role,
                "timestamp": turn.occurred_at.astimezone(UTC).isoformat()}

    def _wait(self, stream_id: str, what: str) -> None:
        """Wait up to ``ingest_wait_s`` for the ingest worker's commit of ``stream_id``; past it, log a
        warning naming ``what`` (the write stays on the stream and is applied when a worker reads
        it, but a ``get`` or ``search`` before then does not see it)."""
        if self.ingest_wait_s > 0 and not self.client.wait_acknowledged(self.tenant_id, stream_id, self.ingest_wait_s):
            log.warning("MnemosStore %s of tenant %r: published (stream id %s) but no ingest worker committed it "
                        "within %.1f s; it is applied when one reads it, and reads until then do not see it",
                        what, self.tenant_id, stream_id, self.ingest_wait_s)
