"""``mnemos mcp --transport http`` (streamable HTTP, bearer tokens), called by the MCP SDK's own client
against real ingest and query workers: each token acts for its own tenant and nothing else."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx2
import pytest
import redis

pytest.importorskip("mcp.server.mcpserver", reason="the mcp extra is not installed")

from tests.integrations.harness import start_http_server, start_workers  # noqa: E402
from tests.integrations.mcp_helpers import http_client, ok, recall_when_back, texts, tool_error, turn_ids  # noqa: E402
from workers.launch.supervisor import stop_workers  # noqa: E402
from workers.settings import Settings  # noqa: E402

pytestmark = pytest.mark.e2e

ALICE_TOKEN = "alice-token-0123456789abcdef"
BOB_TOKEN = "bob-token-0123456789abcdef01"


def test_two_tokens_are_two_tenants_and_no_argument_crosses_them(service: Settings, tmp_path: Path) -> None:
    server, url = start_http_server(service, {ALICE_TOKEN: "alice", BOB_TOKEN: "bob"}, tmp_path)

    async def scenario() -> None:
        async with http_client(url, ALICE_TOKEN) as alice, http_client(url, BOB_TOKEN) as bob:
            mine = await ok(alice, "remember", text="My locker code is 4711", session_id="alice-gym")
            theirs = await ok(bob, "remember", text="Bob's locker code is 8080", session_id="bob-gym", speaker="bob")
            assert mine["stored"] and theirs["stored"]
            assert texts(await ok(alice, "recall", query="locker code")) == ["My locker code is 4711"]
            assert texts(await ok(bob, "recall", query="locker code")) == ["Bob's locker code is 8080"]
            # bob's ids and name in every string argument alice's model could fill in
            for arguments in ({"query": "bob locker code 8080 tenant bob", "k": 100},
                              {"query": "locker code", "session_id": "bob-gym"},
                              {"query": "locker code", "speaker": "bob"},
                              {"query": f"turn {theirs['turn_id']}", "as_of": "2100-01-01T00:00:00Z"}):
                recalled = await ok(alice, "recall", **arguments)
                assert theirs["turn_id"] not in turn_ids(recalled) and "8080" not in " ".join(texts(recalled))
            planted = await ok(alice, "remember", text="bob owes me five euros", session_id="bob-gym", speaker="bob",
                               metadata={"tenant_id": "bob", "tenant": "bob"})
            assert "bob owes me five euros" not in texts(await ok(bob, "recall", query="owes five euros", k=100))
            assert "nothing was forgotten" in await tool_error(alice, "forget", turn_id=theirs["turn_id"])
            forgot = await ok(alice, "forget", session_id="bob-gym")  # alice's own session of that name
            assert forgot["removed_turns"] == 1 and forgot["applied"]
            assert planted["turn_id"] not in turn_ids(await ok(alice, "recall", query="owes five euros"))
            assert texts(await ok(bob, "recall", query="locker code")) == ["Bob's locker code is 8080"]
            assert [s["session_id"] for s in (await ok(bob, "list_sessions"))["sessions"]] == ["bob-gym"]
            assert [s["session_id"] for s in (await ok(alice, "list_sessions"))["sessions"]] == ["alice-gym"]
            assert "Invalid k" in await tool_error(alice, "recall", query="locker", k=1000)
            forgot = await ok(alice, "forget", turn_id=mine["turn_id"])
            assert forgot["removed_turn_ids"] == [mine["turn_id"]]
            assert mine["turn_id"] not in turn_ids(await ok(alice, "recall", query="locker code"))

    try:
        asyncio.run(scenario())
        _refused_without_a_known_token(url)
    finally:
        stop_workers([server], timeout_s=10)


def _refused_without_a_known_token(url: str) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    for extra in ({}, {"Authorization": "Bearer not-a-known-token-at-all"},
                  {"Authorization": f"Bearer {ALICE_TOKEN[:-1]}"}, {"Authorization": f"Basic {ALICE_TOKEN}"}):
        response = httpx2.post(url, json=body, headers={**headers, **extra}, timeout=10)
        assert response.status_code == 401, (extra, response.status_code, response.text)


def test_a_killed_query_worker_is_a_timeout_error_over_http_and_the_server_recovers(
        settings: Settings, redis_client: redis.Redis, tmp_path: Path) -> None:
    own = settings.replace(retrieve_timeout_s=2.0)
    workers = start_workers(own, redis_client)
    server, url = start_http_server(own, {ALICE_TOKEN: "alice"}, tmp_path)

    async def scenario() -> None:
        async with http_client(url, ALICE_TOKEN) as alice:
            await ok(alice, "remember", text="The boiler is serviced every October")
            query = workers.pop()
            query.send_signal(signal.SIGKILL)
            query.wait(10)
            assert "did not answer within 2 s" in await tool_error(alice, "recall", query="boiler")
            workers.extend(start_workers(own, redis_client, ("query",)))
            recalled, _ = await recall_when_back(alice, query="boiler")
            assert texts(recalled) == ["The boiler is serviced every October"]

    try:
        asyncio.run(scenario())
    finally:
        stop_workers([server, *workers], timeout_s=10)
