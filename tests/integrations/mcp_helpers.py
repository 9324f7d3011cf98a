"""Calling ``mnemos mcp`` with the MCP SDK's own client, over stdio or streamable HTTP."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
from mcp.client import Client
from mcp.client.stdio import StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from tests.integrations.harness import mcp_command
from workers.settings import Settings, child_environment


def stdio_client(settings: Settings, tenant: str) -> Client:
    """An SDK client that launches ``mnemos mcp --tenant TENANT`` (stdio) with ``settings``."""
    command = mcp_command("--tenant", tenant)
    return Client(StdioServerParameters(command=command[0], args=command[1:], env=child_environment(settings)),
                  read_timeout_seconds=60)


@contextlib.asynccontextmanager
async def http_client(url: str, token: str | None) -> AsyncIterator[Client]:
    """An SDK client of the streamable HTTP endpoint ``url`` sending ``token`` as its bearer token."""
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with (httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=120.0)) as http,
                Client(streamable_http_client(url, http_client=http), read_timeout_seconds=60) as client):
        yield client


def text_of(result: CallToolResult) -> str:
    """The text content of a tool result (a tool error's sentence)."""
    return " ".join(block.text for block in result.content if isinstance(block, TextContent))


async def ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """Call ``tool`` and return its structured result; fails the test on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, f"{tool}({arguments}) failed: {text_of(result)}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def tool_error(client: Client, tool: str, **arguments: Any) -> str:
    """Call ``tool``, require a tool error, and return its text."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool}({arguments}) succeeded: {result.structured_content}"
    return text_of(result)


def turn_ids(recalled: dict[str, Any]) -> list[str]:
    return [hit["turn_id"] for hit in recalled["hits"]]


def texts(recalled: dict[str, Any]) -> list[str]:
    return [hit["text"] for hit in recalled["hits"]]


async def recall_when_back(client: Client, deadline_s: float = 60.0, **arguments: Any) -> tuple[dict[str, Any], int]:
    """Call ``recall`` until a query worker answers it (a restarted worker loads its models and the
    tenant's index first, which on a busy machine can outlast a short retrieve timeout): its
    structured result and how many calls timed out before. Any other tool error fails the test, and
    so does no answer within ``deadline_s``."""
    import time

    deadline = time.monotonic() + deadline_s
    timeouts = 0
    while True:
        result = await client.call_tool("recall", arguments)
        if not result.is_error:
            assert isinstance(result.structured_content, dict)
            return result.structured_content, timeouts
        assert "did not answer within" in text_of(result), text_of(result)
        timeouts += 1
        assert time.monotonic() < deadline, f"no query worker answered recall within {deadline_s:g} s"
