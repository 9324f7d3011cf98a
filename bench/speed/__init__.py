"""``mnemos bench speed``, ``speed-report`` and ``mcp``: service overhead and latency against the models' own time."""
