"""Bounded waits and process helpers shared by the MCP and LangChain tests."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from api.heartbeats import live_workers
from tests.support import wait_until
from workers.launch.supervisor import spawn_workers, stop_workers
from workers.settings import Settings, child_environment


def start_workers(settings: Settings, connection: redis.Redis,
                  kinds: Sequence[str] = ("ingest", "query")) -> list[subprocess.Popen]:
    """Spawn the workers of ``kinds`` and wait until each one's heartbeat is live."""
    children = spawn_workers(settings, tuple(kinds), log_level="WARNING")
    try:
        for kind in kinds:
            wait_until(lambda kind=kind: live_workers(connection, settings.stream_prefix, kind), 60.0,
                     f"the {kind} worker's heartbeat")
    except BaseException:
        stop_workers(children, timeout_s=10)
        raise
    return children


@pytest.fixture
def service(settings: Settings, redis_client: redis.Redis) -> Iterator[Settings]:
    """The ingest and query workers running with ``settings`` (their heartbeats live); yields the settings."""
    children = start_workers(settings, redis_client)
    try:
        yield settings
    finally:
        stop_workers(children, timeout_s=10)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def mcp_command(*args: str) -> list[str]:
    """``python -m workers --log-level WARNING mcp ARGS``."""
    return [sys.executable, "-m", "workers", "--log-level", "WARNING", "mcp", *args]


def start_http_server(settings: Settings, tokens: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen, str]:
    """``mnemos mcp --transport http`` on a free loopback port with ``tokens`` in a file; returns the
    process and the endpoint URL once the port accepts connections."""
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps(tokens), encoding="utf-8")
    port = free_port()
    process = subprocess.Popen(mcp_command("--transport", "http", "--port", str(port), "--tokens-file", str(path)),
                               env=child_environment(settings))

    def listening() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"the MCP server exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        except OSError:
            return False
        return True

    try:
        wait_until(listening, 60.0, "the MCP HTTP server")
    except BaseException:
        stop_workers([process], timeout_s=5)
        raise
    return process, f"http://127.0.0.1:{port}/mcp"
