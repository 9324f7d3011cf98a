"""The metrics endpoint bounds what a client can hold: silent connections time out, and past the
limit a new connection is closed unanswered, so the worker keeps its threads and descriptors."""

from __future__ import annotations

import socket
import threading

import pytest

from tests.support import http_status, wait_until
from workers.runtime import metrics_http
from workers.runtime.metrics import ServiceMetrics, start_server


def _half_request(port: int, source: str = "127.0.0.1") -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    connection.sendall(b"GET /metr")  # a request line that never ends
    return connection


def _get_from(port: int, source: str, path: str = "/livez") -> bytes:
    """A whole request from the loopback address ``source``; the status line, or b'' if closed unanswered."""
    with socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0)) as connection:
        connection.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        try:
            return connection.recv(64).split(b"\r\n")[0]
        except ConnectionResetError:
            return b""


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
    assert http_status(port, "/metrics") == 200 and http_status(port, "/") == 200 and http_status(port, "/livez") == 200
    for wrong in ("/livez/", "/LIVEZ", "/health", "/metrics/../x"):
        assert http_status(port, wrong) == 404, wrong  # a mistyped probe path must not pass as alive


def test_one_address_cannot_take_every_slot_and_a_slow_drip_is_cut_at_the_deadline(
        monkeypatch: pytest.MonkeyPatch, server) -> None:
    """Break-it rounds 15 and 16: half-sent requests held a thread each for ever; then, with a per-read
    timeout only, one client dripping a byte every 9 s kept all 16 slots and /livez was refused."""
    monkeypatch.setattr(metrics_http, "REQUEST_DEADLINE_S", 3.0)  # long enough to open them all
    port = server.server_port
    held = [_half_request(port) for _ in range(metrics_http.MAX_PER_PEER)]
    extra = _half_request(port)
    try:
        wait_until(lambda: _closed_by_server(extra), what="one more connection from that address to be closed")
        assert _get_from(port, "127.0.0.2") == b"HTTP/1.0 200 OK"  # another address (the kubelet) is served
        stop = threading.Event()

        def drip() -> None:  # one byte at a time, well within each read's timeout
            while not stop.is_set():
                try:
                    held[0].send(b"x")
                except OSError:
                    return
                stop.wait(0.2)

        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        wait_until(lambda: all(_closed_by_server(c) for c in held), timeout_s=60,
                   what="every held connection, the dripping one too, to be cut at its deadline")
        stop.set()
        dripping.join(5)
        wait_until(lambda: http_status(port, "/livez") == 200, what="the address to be served again")
    finally:
        for connection in [*held, extra]:
            connection.close()


def test_past_the_total_limit_a_new_connection_is_closed_at_once(monkeypatch: pytest.MonkeyPatch, server) -> None:
    monkeypatch.setattr(metrics_http, "REQUEST_DEADLINE_S", 5.0)
    port = server.server_port
    sources = [f"127.0.0.{2 + i // metrics_http.MAX_PER_PEER}" for i in range(metrics_http.MAX_CONNECTIONS)]
    held = [_half_request(port, source) for source in sources]
    wait_until(lambda: sum(t.name.endswith("(process_request_thread)") for t in threading.enumerate())
               >= metrics_http.MAX_CONNECTIONS, what="every held connection to have its thread")
    try:
        assert _get_from(port, "127.0.0.99") == b""  # a new address, but no slot left
        wait_until(lambda: http_status(port, "/metrics") == 200, what="scrapes to be served once the deadline passed")
    finally:
        for connection in held:
            connection.close()
