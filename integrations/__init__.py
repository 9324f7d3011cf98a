"""The doors agents use to reach Mnemos, each a thin layer over the client (:mod:`api`).

* :mod:`integrations.mcp_server`: ``mnemos mcp``, a Model Context Protocol server (the ``mcp``
  extra) whose tools remember, recall, forget and list sessions for one tenant fixed by the server's
  configuration (stdio) or by the caller's bearer token (HTTP), never by a tool argument.
* :mod:`integrations.langchain`: ``MnemosRetriever`` (a LangChain retriever) and ``MnemosStore`` (a
  LangGraph store), for the ``langchain`` extra.

Everything goes through :class:`api.client.MnemosClient`: turns and forgets onto the turns stream,
retrievals and catalog reads through the query workers' queue. The core (``mnemos``), the service
(``workers``) and the client (``api``) never import this package (``tests/unit/test_architecture.py``).
"""
