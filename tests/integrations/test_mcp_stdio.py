"""``mnemos mcp`` over stdio, called by the MCP SDK's own client, against real ingest and query workers."""

from __future__ import annotations

import asyncio
import signal
import urllib.request

import pytest
import redis

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra is not installed")

from tests.integrations.harness import free_port, start_workers  # noqa: E402
from tests.integrations.mcp_helpers import (  # noqa: E402
    ok,
    recall_when_back,
    stdio_client,
    texts,
    tool_error,
    turn_ids,
)
from tests.support import wait_until  # noqa: E402
from workers.launch.supervisor import stop_workers  # noqa: E402
from workers.settings import Settings  # noqa: E402

pytestmark = pytest.mark.e2e


def test_remember_recall_list_and_forget_through_stdio(service: Settings) -> None:
    async def scenario() -> None:
        async with stdio_client(service, "alice") as client:
            tools = {tool.name: tool for tool in (await client.list_tools()).tools}
            assert set(tools) == {"remember", "recall", "forget", "list_sessions"}
            for tool in tools.values():  # the tenant is never an argument a model could set
                assert not any("tenant" in name for name in tool.input_schema.get("properties", {}))
            cat = await ok(client, "remember", text="I adopted a grey cat named Pixel last spring",
                           session_id="pets", timestamp="2024-03-01T09:00:00Z")
            assert cat["accepted"] and cat["stored"], cat
            await ok(client, "remember", text="My cello teacher Ines is strict", speaker="alice",
                     session_id="music", timestamp="2024-03-02T09:00:00Z")
            today = await ok(client, "remember", text="Lunch was a sourdough sandwich")
            assert today["session_id"].startswith("mcp-")
            recalled = await ok(client, "recall", query="grey cat Pixel", k=3)
            assert recalled["hits"][0]["turn_id"] == cat["turn_id"]
            assert recalled["hits"][0]["session_id"] == "pets" and recalled["hits"][0]["speaker"] == "user"
            only_music = await ok(client, "recall", query="cat", session_id="music")
            assert texts(only_music) == ["My cello teacher Ines is strict"]
            packet = await ok(client, "recall", query="grey cat Pixel", budget_tokens=64)
            assert "Pixel" in packet["prompt_text"] and packet["omitted"]
            sessions = (await ok(client, "list_sessions"))["sessions"]
            assert [(s["session_id"], s["turns"]) for s in sessions][:2] == [("pets", 1), ("music", 1)]
            forgot = await ok(client, "forget", turn_id=cat["turn_id"])
            assert forgot["applied"] and forgot["removed_turn_ids"] == [cat["turn_id"]]
            assert cat["turn_id"] not in turn_ids(await ok(client, "recall", query="grey cat Pixel", k=10))
            gone = await ok(client, "forget", session_id="music")
            assert gone["applied"] and gone["removed_turns"] == 1
            left = await ok(client, "recall", query="cello teacher Ines", k=10)
            assert "My cello teacher Ines is strict" not in texts(left)
            assert [s["session_id"] for s in (await ok(client, "list_sessions"))["sessions"]] == [today["session_id"]]

    asyncio.run(scenario())


def test_bad_arguments_and_empty_memory_are_tool_errors_and_the_server_keeps_serving(service: Settings) -> None:
    small = service.replace(max_text_bytes=64)

    async def scenario() -> None:
        async with stdio_client(small, "carol") as client:
            assert "No memories are stored" in await tool_error(client, "recall", query="anything")
            assert "text is too large" in await tool_error(client, "remember", text="x" * 65)
            assert "Invalid text" in await tool_error(client, "remember", text="   ")
            assert "Invalid timestamp" in await tool_error(client, "remember", text="hi", timestamp="2024-03-01 09:00")
            assert "Invalid speaker" in await tool_error(client, "remember", text="hi", speaker="")
            assert "metadata" in await tool_error(client, "remember", text="hi", metadata="not an object")
            for wrong in ("many", "5", True, 2.5):  # the SDK's schema check, strict: no "5" -> 5, no true -> 1
                refusal = await tool_error(client, "recall", query="x", k=wrong)
                assert refusal.startswith("Invalid k: ") and "\n" not in refusal and "pydantic" not in refusal
            assert await tool_error(client, "recall") == "Missing argument query."
            unknown = await tool_error(client, "recall", query="x", top_k=3)
            assert unknown.startswith("Unknown argument top_k: recall takes ") and "k, " in unknown
            assert (await tool_error(client, "recall", query="x", k=0)).startswith("Invalid k: ")  # no SDK prefix
            assert (await tool_error(client, "forget", turn_id="x" * 300)).startswith("Invalid turn_id: ")
            # break-it round 12: an invalid session id was looked for, and repeated whole as "not stored"
            assert (await tool_error(client, "forget", session_id="x" * 300)).startswith("Invalid session_id: ")
            assert "(65 bytes, limit 64, in UTF-8)" in await tool_error(client, "remember", text="x" * 65)
            assert "Invalid as_of" in await tool_error(client, "recall", query="x", as_of="yesterday")
            assert "exactly one" in await tool_error(client, "forget")
            assert "exactly one" in await tool_error(client, "forget", turn_id="a", session_id="b")
            assert "nothing was forgotten" in await tool_error(client, "forget", turn_id="never-stored")
            assert "nothing was forgotten" in await tool_error(client, "forget", session_id="never-stored")
            await tool_error(client, "no_such_tool")
            stored = await ok(client, "remember", text="still serving after the errors")
            assert stored["stored"]
            assert texts(await ok(client, "recall", query="still serving")) == ["still serving after the errors"]

    asyncio.run(scenario())


def test_a_killed_query_worker_is_a_timeout_error_and_the_server_recovers(
        settings: Settings, redis_client: redis.Redis) -> None:
    own = settings.replace(retrieve_timeout_s=2.0, metrics_enabled=True, mcp_metrics_port=free_port(),
                           ingest_metrics_port=free_port(), query_metrics_port=free_port())
    workers = start_workers(own.replace(metrics_enabled=False), redis_client)

    async def scenario() -> None:
        async with stdio_client(own, "dave") as client:
            await ok(client, "remember", text="The spare key is under the blue flower pot")
            assert texts(await ok(client, "recall", query="spare key"))
            query = workers.pop()
            query.send_signal(signal.SIGKILL)
            query.wait(10)
            error = await tool_error(client, "recall", query="spare key")
            assert "did not answer within 2 s" in error, error
            workers.extend(start_workers(own.replace(metrics_enabled=False), redis_client, ("query",)))
            recalled, timeouts = await recall_when_back(client, query="spare key")
            assert texts(recalled) == ["The spare key is under the blue flower pot"]
            metrics = wait_until(lambda: _metrics(own.mcp_metrics_port), 10, "the MCP server's metrics")
            assert 'mnemos_mcp_tool_calls_total{outcome="ok",tool="recall"} 2.0' in metrics
            assert f'mnemos_mcp_tool_calls_total{{outcome="tool_error",tool="recall"}} {1 + timeouts}.0' in metrics
            assert 'mnemos_mcp_tool_seconds_count{tool="remember"} 1.0' in metrics

    try:
        asyncio.run(scenario())
    finally:
        stop_workers(workers, timeout_s=10)


def test_redis_down_is_a_tool_error(settings: Settings) -> None:
    down = settings.replace(redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def scenario() -> None:
        async with stdio_client(down, "erin") as client:
            for tool, arguments in (("remember", {"text": "hello"}), ("recall", {"query": "hello"}),
                                    ("list_sessions", {})):
                assert "Redis cannot be reached" in await tool_error(client, tool, **arguments)
            assert len((await client.list_tools()).tools) == 4

    asyncio.run(scenario())


def _metrics(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return response.read().decode()
    except OSError:
        return None
