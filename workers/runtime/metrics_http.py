"""The HTTP endpoint a worker serves: ``/metrics`` for Prometheus and ``/livez`` for the kubelet.

It listens on every interface by default (Prometheus scrapes the pod IP), so it must not let a
client hold the worker's threads and file descriptors: a connection that sends nothing for
``REQUEST_TIMEOUT_S`` is closed, and past ``MAX_CONNECTIONS`` at once a new one is closed at once.
Before this (break-it round 15) every half-sent request held a thread and a descriptor for ever; at
the descriptor limit ``accept`` failed in a busy loop and the worker could not reconnect to Redis
(docs/architecture.md "Metrics").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from socket import socket
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client.exposition import ThreadingWSGIServer

from workers.runtime.liveness import Liveness

log = logging.getLogger(__name__)

LIVENESS_PATH = "/livez"
METRICS_PATHS = ("/", "/metrics")
MAX_CONNECTIONS = 16  # scrapers and probes in flight at once; a scrape takes milliseconds
REQUEST_TIMEOUT_S = 10.0  # the longest a connection may stay silent (Prometheus' default scrape timeout)


class _BoundedServer(ThreadingWSGIServer):
    """One thread per connection, at most ``MAX_CONNECTIONS`` of them; one more is closed unanswered."""

    request_queue_size = 64  # connections the kernel queues before accept (socketserver's default: 5)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: socket | tuple[bytes, socket], client_address: Any) -> None:
        """A client that timed out or hung up is not worth a traceback on stderr."""
        log.debug("metrics endpoint: a connection from %s ended with an error", client_address, exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # the socket's timeout for every read and write of the connection

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the base class's name)
        """Scrapes and probes are not worth a log line each."""


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


__all__ = ["LIVENESS_PATH", "MAX_CONNECTIONS", "METRICS_PATHS", "REQUEST_TIMEOUT_S", "start_server"]
