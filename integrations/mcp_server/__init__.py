"""``mnemos mcp``: the Model Context Protocol server over :class:`api.client.MnemosClient`.

* :mod:`.tools`: what each tool does, with plain arguments and typed results, and how a client
  error becomes one sentence the model reads (:class:`.tools.MemoryTools`);
* :mod:`.server`: the SDK's ``MCPServer`` with the tools' schemas and descriptions, the tenant of a
  call, the tool-call metrics (:func:`.server.build_server`);
* :mod:`.tokens`: bearer token -> tenant for the HTTP transport, compared in constant time;
* :mod:`.command`: the click command and :func:`.command.run_mcp`.

Needs the ``mcp`` extra (``pip install 'mnemos[mcp]'``); :mod:`.command` imports without it and
says so when run.
"""
