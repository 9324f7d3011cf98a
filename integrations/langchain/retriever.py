"""``MnemosRetriever``: a LangChain retriever over a Mnemos tenant's memory."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from api.client import MnemosClient
from api.schemas import Hit
from api.validation import DEFAULT_K

_PER_CALL = frozenset({"k", "as_of", "filters"})


def hit_document(hit: Hit) -> Document:
    """A hit as a ``Document``: the turn's text, and its ids, speaker, session, time (ISO 8601 UTC),
    score, rank and deduplicated aliases as metadata."""
    return Document(page_content=hit.text, id=hit.turn_id, metadata={
        "turn_id": hit.turn_id, "speaker": hit.role, "session_id": hit.session_id,
        "timestamp": hit.occurred_at.astimezone(UTC).isoformat(), "score": hit.score, "rank": hit.rank,
        "aliases": list(hit.aliases)})


class MnemosRetriever(BaseRetriever):
    """The memories of one tenant relevant to a query, best first, through the query workers.

    ``invoke(query)`` runs one retrieval (:meth:`api.client.MnemosClient.retrieve`); ``batch`` runs
    one per query. ``k``, ``as_of`` (knowledge time: only turns that occurred by then) and
    ``filters`` (``session_ids``, ``roles``, ``occurred_after``; see the README) are set on the
    retriever and may be overridden per call (``invoke(query, k=3)``); the tenant may not: it is the
    application's choice, never the chain's, and any other keyword is refused (``TypeError``).
    Errors are the client's (``RetrievalTimeout``, ``NoQueryWorker``, ``ServiceUnavailable``,
    ``InvalidInputError``, ...).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    client: MnemosClient
    tenant_id: str
    k: int = DEFAULT_K
    as_of: datetime | str | None = None
    filters: dict[str, Any] | None = None
    timeout_s: float | None = None

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun,
                                **kwargs: Any) -> list[Document]:
        unknown = set(kwargs) - _PER_CALL
        if unknown:
            raise TypeError(f"MnemosRetriever takes only {sorted(_PER_CALL)} per call, not {sorted(unknown)} "
                            "(the tenant is fixed when the retriever is made)")
        result = self.client.retrieve(self.tenant_id, query, k=kwargs.get("k", self.k),
                                      as_of=kwargs.get("as_of", self.as_of),
                                      filters=kwargs.get("filters", self.filters), timeout_s=self.timeout_s)
        return [hit_document(hit) for hit in result.hits]
