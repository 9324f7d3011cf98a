"""The HTTP endpoint a worker serves: ``/metrics`` for Prometheus and ``/livez`` for the kubelet.

It listens on every interface by default (Prometheus scrapes the pod IP), so it must not let a
client hold the worker's threads and file descriptors, or the probe's turn: a connection lasts at
most ``REQUEST_DEADLINE_S`` in all (reading and writing, however slowly it drips), at most
``MAX_CONNECTIONS`` are served at once and at most ``MAX_PER_PEER`` from one address; one more is
closed unanswered. Before this (break-it round 15) every half-sent request held a thread and a
descriptor for ever: at the descriptor limit ``accept`` failed in a busy loop and the worker could
not reconnect to Redis. A per-read timeout alone was not enough (round 16): one client dripping a
byte every 9 s kept all slots, and the kubelet's probe was refused until it restarted the pod
(docs/architecture.md "Metrics").
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from workers.runtime.liveness import Liveness

log = logging.getLogger(__name__)

LIVENESS_PATH = "/livez"
METRICS_PATHS = ("/", "/metrics")
MAX_CONNECTIONS = 16  # scrapers and probes in flight at once; a scrape takes milliseconds
MAX_PER_PEER = 4  # from one address: a kubelet or a Prometheus needs one or two at a time
REQUEST_DEADLINE_S = 10.0  # the longest a connection may last in all (Prometheus' default scrape timeout)


class _BoundedServer(ThreadingWSGIServer):
    """One thread per connection within the limits above; a connection past them is closed unanswered,
    and one still open at its deadline is shut down."""

    request_queue_size = 64  # connections the kernel queues before accept (socketserver's default: 5)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self._open: dict[str, int] = {}  # connections being served, per peer address

    def process_request(self, request: Any, client_address: Any) -> None:
        peer = _peer(client_address)
        with self._lock:
            admitted = sum(self._open.values()) < MAX_CONNECTIONS and self._open.get(peer, 0) < MAX_PER_PEER
            if admitted:
                self._open[peer] = self._open.get(peer, 0) + 1
        if not admitted:
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._release(peer)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(REQUEST_DEADLINE_S, _cut, args=(request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self._release(_peer(client_address))

    def _release(self, peer: str) -> None:
        with self._lock:
            left = self._open.get(peer, 1) - 1
            if left:
                self._open[peer] = left
            else:
                self._open.pop(peer, None)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that timed out or hung up is not worth a traceback on stderr."""
        log.debug("metrics endpoint: a connection from %s ended with an error", client_address, exc_info=True)


def _peer(client_address: Any) -> str:
    return str(client_address[0]) if isinstance(client_address, tuple) else str(client_address)


def _cut(request: socket.socket) -> None:
    """Shut a connection down at its deadline: a blocked read or write in its thread returns."""
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


class _DebugLog:
    """wsgiref's error stream: its tracebacks (a client that stopped reading) go to the debug log."""

    def write(self, text: str) -> int:
        if text.strip():
            log.debug("metrics endpoint: %s", text.rstrip())
        return len(text)

    def flush(self) -> None:
        """Nothing is buffered."""


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_DEADLINE_S  # each read and write of the connection, within its total deadline

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Scrapes and probes are not worth a log line each."""

    def get_stderr(self) -> Any:
        return _DebugLog()


def start_server(metrics_app: Callable, port: int, liveness: Liveness | None = None,
                 host: str = "0.0.0.0") -> ThreadingWSGIServer:
    """Serve the WSGI ``metrics_app`` on ``host:port`` in a daemon thread and return the server
    (``shutdown()`` stops it). ``GET /livez`` answers 200 while ``liveness`` says the work loop
    advances and 503 once it is overdue (always 200 without one); ``/`` and ``/metrics`` serve the
    metrics; any other path is 404.

    Raises OSError when the port cannot be bound.
    """
    server = make_server(host, port, _app(metrics_app, liveness), _BoundedServer, handler_class=_QuietHandler)
    threading.Thread(target=server.serve_forever, name="mnemos-metrics", daemon=True).start()
    return server


def _app(metrics_app: Callable, liveness: Liveness | None) -> Callable:
    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path in METRICS_PATHS:
            return metrics_app(environ, start_response)
        if path != LIVENESS_PATH:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: this endpoint serves /metrics and {LIVENESS_PATH}\n".encode()]
        ok, text = (True, "no work loop to watch") if liveness is None else liveness.report()
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8")])
        return [(text + "\n").encode()]

    return app


__all__ = ["LIVENESS_PATH", "MAX_CONNECTIONS", "MAX_PER_PEER", "METRICS_PATHS", "REQUEST_DEADLINE_S", "start_server"]
