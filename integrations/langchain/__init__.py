"""LangChain and LangGraph over Mnemos (the ``langchain`` extra): :class:`MnemosRetriever`, a
``langchain_core`` retriever, and :class:`MnemosStore`, a LangGraph ``BaseStore``.

Both act for one tenant given to their constructor by the application, never taken from a chain's or
a graph's input (docs/architecture.md "Agents"), and reach the workers only through
:class:`api.client.MnemosClient`.
"""

from integrations.langchain.retriever import MnemosRetriever
from integrations.langchain.store import MnemosStore

__all__ = ["MnemosRetriever", "MnemosStore"]
