"""``mnemos mcp``: run the MCP server on stdio (desktop agents, IDEs) or streamable HTTP (remote agents).

Declared as an entry-point command of the ``mnemos`` CLI (group ``mnemos.commands`` in
``pyproject.toml``). This module imports only click and the service's settings, so ``mnemos mcp
--help`` works without the ``mcp`` extra; running it without the extra ends in one line naming the
``pip install`` (exit code 2).

* ``--transport stdio`` (default): one tenant, ``--tenant`` or ``MNEMOS_MCP_TENANT``. Nothing but
  the protocol is written to stdout; logs go to stderr.
* ``--transport http``: ``http://<host>:<port>/mcp``, host ``127.0.0.1`` unless told otherwise;
  every request needs ``Authorization: Bearer <token>`` with a token of ``--tokens-file`` /
  ``MNEMOS_MCP_TOKENS_FILE`` / ``MNEMOS_MCP_TOKENS`` (401 without one), and acts for that token's
  tenant (:mod:`integrations.mcp_server.tokens`).

Tool calls are counted and timed on ``:<MNEMOS_MCP_METRICS_PORT>/metrics`` when metrics are enabled.
"""

from __future__ import annotations

import importlib.util
import ipaddress
import logging
import sys
from pathlib import Path

import click

from workers.runtime.errors import SettingsError
from workers.settings import Settings

log = logging.getLogger(__name__)

TRANSPORTS = ("stdio", "http")


def require_sdk() -> None:
    """Raise SettingsError unless the ``mcp`` extra (the official MCP SDK) is installed."""
    if importlib.util.find_spec("mcp") is None or importlib.util.find_spec("mcp.server.mcpserver") is None:
        raise SettingsError("the 'mcp' extra is not installed (the MCP SDK, mcp>=2.3): pip install 'mnemos[mcp]'")


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_mcp(settings: Settings, *, transport: str) -> int:
    """Serve until stdin closes (stdio) or SIGINT/SIGTERM (http); returns the exit code.

    Raises SettingsError for a missing extra, a stdio server without a tenant or an HTTP server
    without tokens.
    """
    require_sdk()
    from api.validation import Limits, check_tenant_id
    from integrations.mcp_server.server import build_server, fixed_tenant, token_tenant
    from integrations.mcp_server.tokens import TenantTokenVerifier, TokenTable
    from integrations.mcp_server.tools import MemoryTools
    from workers.runtime.connections import settings_client
    from workers.runtime.metrics import MCP, ServiceMetrics, serve

    client = settings_client(settings)
    tools = MemoryTools(client, ingest_wait_s=settings.mcp_ingest_wait_s, default_k=settings.default_k)
    metrics = ServiceMetrics(worker=MCP)
    if transport == "stdio":
        if not settings.mcp_tenant:
            raise SettingsError("the stdio transport serves one tenant: give --tenant or set MNEMOS_MCP_TENANT")
        try:
            tenant = check_tenant_id(settings.mcp_tenant, "tenant", Limits(max_id_chars=settings.max_id_chars))
        except ValueError as exc:
            raise SettingsError(f"--tenant / MNEMOS_MCP_TENANT: {exc}") from None
        server = build_server(tools, fixed_tenant(tenant), metrics=metrics, max_k=settings.max_k)
        if settings.metrics_enabled:
            serve(metrics, settings.mcp_metrics_port, MCP, host=settings.metrics_host)
        log.info("MCP server on stdio for tenant %r", tenant)
        server.run("stdio")
        return 0
    table = TokenTable.from_settings(settings)
    host, port = settings.mcp_host, settings.mcp_port
    url = f"http://{host}:{port}"
    server = build_server(tools, token_tenant, metrics=metrics, token_verifier=TenantTokenVerifier(table),
                          server_url=url, max_k=settings.max_k)
    if settings.metrics_enabled:
        serve(metrics, settings.mcp_metrics_port, MCP, host=settings.metrics_host)
    if not _loopback(host):
        log.warning("the MCP server listens on %s, beyond loopback: put TLS in front of it (tokens travel in "
                    "every request)", host)
    log.info("MCP server (streamable HTTP) on %s/mcp, %d bearer token(s)", url, len(table))
    server.run("streamable-http", host=host, port=port)
    return 0


@click.command("mcp")
@click.option("--transport", type=click.Choice(TRANSPORTS), default="stdio", show_default=True,
              help="stdio for a desktop agent or IDE; http for remote agents (streamable HTTP, bearer tokens)")
@click.option("--tenant", default=None, help="stdio: the tenant every call acts for (default MNEMOS_MCP_TENANT)")
@click.option("--tokens-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help='http: JSON {"<token>": "<tenant>"} (default MNEMOS_MCP_TOKENS_FILE; MNEMOS_MCP_TOKENS is added)')
@click.option("--host", default=None, help="http: the address to listen on (default MNEMOS_MCP_HOST, 127.0.0.1)")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="http: the port (default MNEMOS_MCP_PORT)")
@click.pass_context
def mcp(ctx: click.Context, transport: str, tenant: str | None, tokens_file: Path | None, host: str | None,
        port: int | None) -> None:
    """Serve Mnemos to agents over the Model Context Protocol: tools remember, recall, forget and
    list_sessions for one tenant, fixed by --tenant (stdio) or by the bearer token (http), never by
    an argument the model sets."""
    settings: Settings = ctx.find_root().obj
    changes: dict[str, object] = {}
    for name, value in (("mcp_tenant", tenant), ("mcp_tokens_file", None if tokens_file is None else str(tokens_file)),
                        ("mcp_host", host), ("mcp_port", port)):
        if value is not None:
            changes[name] = value
    sys.exit(run_mcp(settings.replace(**changes), transport=transport))
