"""The HTTP endpoint Prometheus scrapes: ``GET /metrics`` (and ``/``) in the text exposition
format, from ``prometheus_client``'s own handler over a registry of this broker alone.

Limits, as every partq listener keeps them: it binds only where asked (an empty host is
127.0.0.1), serves at most ``max_connections`` at once (a new connection cuts off the oldest,
with a log line, so slow peers cannot keep a scrape out), and gives each connection ``timeout``
seconds for its whole request and answer (``partq.wire.admission``). It has no token: metrics are read
only, but they name queues and consumers, so bind a loopback or private address, or put it
behind a proxy that authenticates; binding another address logs a warning saying so.
"""
from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import ThreadingHTTPServer

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from partq.errors import InvalidConfig
from partq.metrics.collector import BrokerCollector
from partq.metrics.instruments import Instruments
from partq.wire.admission import Admission
from partq.wire.frames import parse_address
from partq.wire.listener import is_loopback

log = logging.getLogger("partq.metrics")

PATHS = ("/metrics", "/")


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler, max_connections: int,
                 timeout: float) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._admission = Admission(max_connections, timeout)
        self.max_connections = max_connections
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        evicted = self._admission.admit(request)
        if evicted is not None:
            log.warning("metrics endpoint cut off the oldest of %d connections to serve %s",
                        self.max_connections, client_address[0])
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._admission.release(request)
            raise

    def waiting(self) -> int:
        return self._admission.waiting()

    def service_actions(self) -> None:
        """Called by serve_forever between polls: cut off requests past their deadline."""
        for _ in self._admission.reap():
            log.warning("metrics endpoint cut off a connection: no whole request and answer "
                        "within %g s", self._admission.deadline)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError):      # the peer went away, or was too slow
            log.warning("metrics endpoint: the request of %s failed: %s", client_address[0], exc)
        else:                             # a bug: the scrape fails, the endpoint goes on
            log.exception("metrics endpoint: a scrape by %s failed", client_address[0])

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._admission.release(request)


def _handler(registry: CollectorRegistry, timeout: float):
    base = MetricsHandler.factory(registry)

    class Handler(base):   # type: ignore[valid-type,misc]
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in PATHS:
                self.send_error(404, "partq serves its metrics on /metrics")
                return
            super().do_GET()

        def log_message(self, format: str, *args) -> None:
            log.debug("metrics endpoint: %s: " + format, self.client_address[0], *args)
    Handler.timeout = timeout
    return Handler


class MetricsServer:
    """Serves ``broker``'s metrics on ``address`` ("HOST:PORT"; port 0 picks a free one, read
    ``address`` back) until ``close()``. ``connections()``: open connections per listener the
    broker does not know of (``partq serve``'s). ``broker=None``: only what is added with
    ``add`` (a worker's metrics, where it works through ``partq serve``)."""

    def __init__(self, broker, address: str, *, connections=None, max_connections: int = 16,
                 timeout: float = 10.0) -> None:
        host, port = parse_address(address)
        host = host.strip("[]")
        self.registry = CollectorRegistry(auto_describe=False)
        self.instruments: Instruments | None = None
        if broker is not None:
            self.registry.register(BrokerCollector(broker, connections))
            self.instruments = Instruments(self.registry, broker.store, broker.dispatcher.tally)
        try:
            self._server = _Server((host, port), _handler(self.registry, timeout), max_connections,
                                   timeout)
        except OSError as exc:
            if self.instruments is not None:
                self.instruments.close()
            raise InvalidConfig(f"cannot serve metrics on {address}: {exc.strerror or exc}") \
                from None
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={
            "poll_interval": 0.25}, name="partq-metrics", daemon=True)
        self._thread.start()
        log.info("serving Prometheus metrics on http://%s/metrics", self.address)
        if not is_loopback(host):
            log.warning("the metrics endpoint on %s has no token: anyone who reaches it reads "
                        "queue names, depths and consumers; firewall it or bind a private "
                        "address", self.address)

    def add(self, collector) -> None:
        """Serve ``collector``'s metrics too (until ``remove``)."""
        self.registry.register(collector)

    def remove(self, collector) -> None:
        self.registry.unregister(collector)

    def connections_waiting(self) -> int:
        """Connections open now (each is served within its deadline or cut off)."""
        return self._server.waiting()

    def close(self) -> None:
        """Stop serving; the port is free when this returns."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        if self.instruments is not None:
            self.instruments.close()
