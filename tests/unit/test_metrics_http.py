"""The metrics endpoint bounds what a client can hold: silent connections time out, and past the
limit a new connection is closed unanswered, so the worker keeps its threads and descriptors."""

from __future__ import annotations

import socket
import threading
import urllib.error
import urllib.request

import pytest

from tests.support import wait_until
from workers.runtime import metrics_http
from workers.runtime.metrics import ServiceMetrics, start_server


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code


def _half_request(port: int) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=10)
    connection.sendall(b"GET /metr")  # a request line that never ends
    return connection


def _closed_by_server(connection: socket.socket) -> bool:
    connection.settimeout(0.05)
    try:
        return connection.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def server():
    server = start_server(ServiceMetrics(), 0, host="127.0.0.1")
    yield server
    server.shutdown()
    server.server_close()


def test_only_the_metrics_and_liveness_paths_answer(server) -> None:
    port = server.server_port
    assert _get(port, "/metrics") == 200 and _get(port, "/") == 200 and _get(port, "/livez") == 200
    for wrong in ("/livez/", "/LIVEZ", "/health", "/metrics/../x"):
        assert _get(port, wrong) == 404, wrong  # a mistyped probe path must not pass as alive


def test_silent_connections_time_out_and_past_the_limit_one_is_closed_at_once(
        monkeypatch: pytest.MonkeyPatch, server) -> None:
    monkeypatch.setattr(metrics_http._QuietHandler, "timeout", 5.0)  # long enough to open them all
    port = server.server_port
    held = [_half_request(port) for _ in range(metrics_http.MAX_CONNECTIONS)]
    wait_until(lambda: sum(t.name.endswith("(process_request_thread)") for t in threading.enumerate())
               >= metrics_http.MAX_CONNECTIONS, what="every held connection to have its thread")
    extra = _half_request(port)
    try:
        wait_until(lambda: _closed_by_server(extra), what="the connection past the limit to be closed")
        assert not any(_closed_by_server(c) for c in held[:2])  # the held ones still wait for their request
        wait_until(lambda: all(_closed_by_server(c) for c in held), what="the silent connections to time out")
        wait_until(lambda: _get(port, "/metrics") == 200, what="scrapes to be served again")
    finally:
        for connection in [*held, extra]:
            connection.close()
