"""The MCP server: the SDK's ``MCPServer`` with Mnemos's four tools, the tenant of each call, metrics.

The tenant is never a tool argument (docs/architecture.md "Agents"): :func:`fixed_tenant` (stdio: the
server's ``--tenant`` or ``MNEMOS_MCP_TENANT``) or :func:`token_tenant` (HTTP: the tenant of the
request's bearer token, verified by the SDK's bearer middleware with
:class:`~integrations.mcp_server.tokens.TenantTokenVerifier`, which answers 401 to a request without a
known token) decides it. A session id, speaker, query or metadata that names another tenant's data is
read within the caller's tenant, where it matches nothing of the other.

Every ``tools/call`` is counted and timed by a server middleware (``mnemos_mcp_tool_calls_total{tool,
outcome}``, ``mnemos_mcp_tool_seconds{tool}``), argument-schema refusals included.
"""

# no `from __future__ import annotations`: the SDK reads the tools' annotations, whose descriptions
# are built from build_server's arguments, when each tool is registered
import time
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken, TokenVerifier
from mcp.server.auth.settings import AuthSettings
from mcp.server.context import CallNext, HandlerResult, ServerMiddleware, ServerRequestContext
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from pydantic import Field, ValidationError

from api.validation import MAX_K
from integrations.mcp_server.tools import (
    ForgetResult,
    MemoryTools,
    RecallResult,
    RememberResult,
    SessionsResult,
)
from workers.runtime.metrics import ServiceMetrics

Tenancy = Callable[[Context], str]
"""Decides the tenant of one tool call from its context (never from its arguments)."""

INSTRUCTIONS = (
    "Mnemos is the long-term memory of this user across conversations. Call remember for anything worth "
    "knowing later (facts about the user, decisions, preferences, events with their dates), one self-contained "
    "statement per call. Call recall before answering anything that depends on earlier conversations, with a "
    "question-like query; use budget_tokens to get the evidence as prompt-ready text. Use forget when the user "
    "asks to erase something, and list_sessions to see which conversations are stored. The memory belongs to "
    "the user this server was configured for: there is no argument to read anyone else's."
)


def fixed_tenant(tenant_id: str) -> Tenancy:
    """Every call acts for ``tenant_id`` (the stdio transport: one local user per server process)."""

    def tenancy(_ctx: Context) -> str:
        return tenant_id

    return tenancy


def token_tenant(ctx: Context) -> str:
    """The tenant of the call's HTTP request's verified bearer token (the SDK's bearer middleware put
    it on the request scope); a ``ToolError`` when there is none."""
    token: AccessToken | None = None
    with_request = ctx.request_context.request
    user = getattr(with_request, "scope", {}).get("user") if with_request is not None else None
    token = getattr(user, "access_token", None) or get_access_token()
    if token is None or not token.subject:
        raise ToolError("This request carries no valid bearer token, so it has no memory to act on.")
    return token.subject


def tool_metrics(metrics: ServiceMetrics) -> ServerMiddleware[Any]:
    """A server middleware that counts and times every ``tools/call`` (ok or tool error) in ``metrics``."""

    async def observe(ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        if ctx.method != "tools/call":
            return await call_next(ctx)
        name = str((ctx.params or {}).get("name", ""))
        started = time.perf_counter()
        ok = False
        try:
            result = await call_next(ctx)
            flag = result.get("isError") if isinstance(result, dict) else getattr(result, "is_error", False)
            ok = not flag
            return result
        finally:
            metrics.mcp_tool_call(name, ok=ok, seconds=time.perf_counter() - started)

    return observe


class _OneSentenceServer(MCPServer):
    """The SDK's server, whose argument-schema refusals read as one sentence per wrong argument
    (``Invalid k: Input should be a valid integer.``) like the tools' own errors, instead of
    pydantic's multi-line report with a documentation link (a break-it session, 2026-12-07); the
    tools' own errors lose the SDK's ``Error executing tool <name>:`` prefix, so every refusal reads
    alike. The ``ValidationError`` stays the cause, so the SDK still logs the argument names only.
    An argument the tool does not take is refused by name, with the ones it takes."""

    async def call_tool(self, name: str, arguments: dict[str, Any], context: Any = None) -> Any:
        schema = self._tool_input_schema(name)
        known = set((schema or {}).get("properties", {}))
        unknown = sorted(set(arguments) - known) if schema is not None else []
        if unknown:  # a typo ("top_k") would otherwise be ignored and the default used silently
            raise ToolError(f"Unknown argument {', '.join(unknown)}: {name} takes {', '.join(sorted(known)) or 'none'}.")
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if isinstance(cause, ToolError):  # the tools' own sentences, without the SDK's "Error executing tool"
                raise ToolError(str(cause)) from cause
            if not isinstance(cause, ValidationError):
                raise
            raise ToolError(argument_errors(cause)) from cause


def argument_errors(error: ValidationError) -> str:
    """One sentence per wrong argument, from pydantic's errors (the values are never echoed)."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        where = ".".join(str(part) for part in item["loc"]) or "arguments"
        message = str(item["msg"]).rstrip(".")
        parts.append(f"Missing argument {where}." if item["type"] == "missing" else f"Invalid {where}: {message}.")
    return " ".join(parts)


def build_server(tools: MemoryTools, tenancy: Tenancy, *, metrics: ServiceMetrics | None = None,
                 token_verifier: TokenVerifier | None = None, server_url: str | None = None,
                 max_k: int = MAX_K) -> MCPServer:
    """The MCP server of ``tools``, acting for the tenant ``tenancy`` gives each call.

    With ``token_verifier`` (the HTTP transport) every request needs a bearer token it accepts;
    ``server_url`` is then the issuer the SDK's auth settings require (static tokens have no OAuth
    authorization server; it is never advertised, as no resource metadata is served).
    """
    auth = None
    if token_verifier is not None:
        auth = AuthSettings(issuer_url=server_url or "http://127.0.0.1", resource_server_url=None)  # type: ignore[arg-type]
    server: MCPServer = _OneSentenceServer("mnemos", instructions=INSTRUCTIONS, token_verifier=token_verifier, auth=auth,
                                  middleware=[tool_metrics(metrics)] if metrics is not None else None)
    _register(server, tools, tenancy, max_k)
    return server


def _register(server: MCPServer, tools: MemoryTools, tenancy: Tenancy, max_k: int) -> None:
    """Add the four tools to ``server`` (their docstrings are the descriptions a model reads)."""
    writes = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False)
    reads = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=writes)
    def remember(
        text: Annotated[str, Field(description="What to remember: one self-contained statement, e.g. "
                                               "'Alice moved to Lisbon in March 2026.' At most 32 KiB.")],
        ctx: Context,
        speaker: Annotated[str | None, Field(description="Who said it (a name is better than 'user'); "
                                                         "default 'user'.")] = None,
        session_id: Annotated[str | None, Field(description="Conversation id to group it with; default one "
                                                            "session per UTC day ('mcp-YYYY-MM-DD').")] = None,
        timestamp: Annotated[str | None, Field(description="When it was said, ISO 8601 with a time zone "
                                                           "('2026-03-02T10:00:00Z'); default now.")] = None,
        metadata: Annotated[dict[str, Any] | None, Field(description="Optional JSON object kept with it; "
                                                                     "'supersedes': [turn ids] marks older turns "
                                                                     "it corrects.")] = None,
    ) -> RememberResult:
        """Store one memory of this user. Returns its turn id and whether it is stored (then recall finds it)."""
        return tools.remember(tenancy(ctx), text, speaker, session_id, timestamp, metadata)

    @server.tool(annotations=reads)
    def recall(
        query: Annotated[str, Field(description="A question or topic, e.g. 'Where does Alice live now?'")],
        ctx: Context,
        k: Annotated[int | None, Field(strict=True, description=f"How many memories to return, 1 to {max_k}; "
                                                                f"default {tools.default_k}.")] = None,
        as_of: Annotated[str | None, Field(description="Only what was said by this time (ISO 8601 with a zone); "
                                                       "also anchors 'last week' in the query.")] = None,
        session_id: Annotated[str | None, Field(description="Only memories of this session.")] = None,
        speaker: Annotated[str | None, Field(description="Only memories said by this speaker.")] = None,
        budget_tokens: Annotated[int | None, Field(strict=True, description="Also return the best evidence that fits this many "
                                                               "tokens as prompt-ready text, with what was left "
                                                               "out and why (e.g. 512).")] = None,
    ) -> RecallResult:
        """Find this user's memories relevant to a query, best first (text, speaker, session, time, score)."""
        return tools.recall(tenancy(ctx), query, k, as_of, session_id, speaker, budget_tokens)

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True))
    def forget(
        ctx: Context,
        turn_id: Annotated[str | None, Field(description="Erase this one memory (a turn id from recall or "
                                                         "remember).")] = None,
        session_id: Annotated[str | None, Field(description="Erase every memory of this session.")] = None,
    ) -> ForgetResult:
        """Erase one memory or one whole session of this user for good (give exactly one). Returns what was removed."""
        return tools.forget(tenancy(ctx), turn_id, session_id)

    @server.tool(annotations=reads)
    def list_sessions(ctx: Context) -> SessionsResult:
        """List this user's stored conversations: session id, first and last time, number of memories."""
        return tools.list_sessions(tenancy(ctx))
