"""``make mcp-demo``: a remember / recall round trip through ``mnemos mcp`` (stdio), as an agent makes it.

Like ``mnemos demo``: Redis and Postgres at the configured URLs (embedded ones when none is configured
and none answers), migrations, then the ingest and query workers as processes (``--no-spawn`` when
``mnemos up`` already runs them). The MCP SDK's own client then starts ``mnemos mcp --tenant
<a fresh demo tenant>`` over stdio, lists its tools, remembers three statements, recalls two
questions (the second as an evidence packet), lists the sessions, and forgets the session again, so
nothing of the demo stays stored.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import time
import uuid

from api.heartbeats import live_workers
from workers.cli import configure_logging
from workers.launch.supervisor import prepare, spawn_workers, stop_workers
from workers.runtime.connections import redis_client
from workers.runtime.embedded import EmbeddedServices
from workers.settings import Settings, child_environment, prepare_offline_models, quiet_model_loading

FACTS = ("I moved to Lisbon in March and work from a café near Alfama.",
         "My daughter Ana starts school in September; she is allergic to peanuts.",
         "I am training for the Porto half marathon on 3 November.")
QUESTIONS = ("Where do I live now?", "What should the school know about Ana?")


async def round_trip(settings: Settings, tenant: str) -> None:
    """The agent's side: every call through the MCP SDK's stdio client."""
    from mcp.client import Client
    from mcp.client.stdio import StdioServerParameters

    command = [sys.executable, "-m", "workers", "--log-level", "WARNING", "mcp", "--tenant", tenant]
    params = StdioServerParameters(command=command[0], args=command[1:],
                                   env=child_environment(settings.replace(metrics_enabled=False)))
    async with Client(params, read_timeout_seconds=120) as client:
        tools = (await client.list_tools()).tools
        print(f"mnemos mcp (stdio, tenant {tenant}) offers: {', '.join(t.name for t in tools)}")
        for fact in FACTS:
            result = await client.call_tool("remember", {"text": fact, "session_id": "demo-chat"})
            print(f"remember: {fact}\n  -> {result.structured_content}")
        for number, question in enumerate(QUESTIONS):
            arguments: dict[str, object] = {"query": question, "k": 2}
            if number == 1:
                arguments["budget_tokens"] = 64
            found = (await client.call_tool("recall", arguments)).structured_content or {}
            print(f"recall: {question}")
            for hit in found.get("hits", []):
                print(f"  {hit['rank']}. [{hit['score']:+.2f}] {hit['speaker']}: {hit['text']}")
            if found.get("prompt_text"):
                print("  evidence packet:\n    " + found["prompt_text"].replace("\n", "\n    "))
        print(f"list_sessions -> {(await client.call_tool('list_sessions', {})).structured_content}")
        forgot = await client.call_tool("forget", {"session_id": "demo-chat"})
        print(f"forget session demo-chat -> {forgot.structured_content}")


def main() -> int:
    """Start what is needed, run :func:`round_trip` for a fresh tenant, stop what was started; the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-spawn", action="store_true", help="the workers already run (`mnemos up`)")
    spawn = not parser.parse_args().no_spawn
    prepare_offline_models()
    quiet_model_loading()
    configure_logging("WARNING")
    settings = Settings.from_env()
    if spawn:
        settings = prepare(settings, EmbeddedServices(settings))
    children = spawn_workers(settings, ("ingest", "query"), log_level="WARNING") if spawn else []
    try:
        connection = redis_client(settings)
        deadline = time.monotonic() + 300
        while not all(live_workers(connection, settings.stream_prefix, kind) for kind in ("ingest", "query")):
            if time.monotonic() > deadline:
                logging.error("the ingest and query workers did not start within 300 s")
                return 1
            time.sleep(0.5)
        asyncio.run(round_trip(settings, f"mcp-demo-{uuid.uuid4().hex[:8]}"))
    finally:
        stop_workers(children)
    return 0


if __name__ == "__main__":
    sys.exit(main())
