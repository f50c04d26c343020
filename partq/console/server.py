"""The console's HTTP listener: the standard library's ``ThreadingHTTPServer`` (no web framework:
a handful of GETs and POSTs, and the limits below, need none) with the limits every partq
listener keeps.

- It binds only where asked (an empty host is 127.0.0.1; port 0 picks a free one, read
  ``address`` back).
- At most ``max_connections`` connections at once: a new one cuts off the oldest, with a log
  line (``partq.wire.admission``), so slow peers can delay others but never keep them out.
- One deadline, ``timeout`` seconds, for a connection's whole life: its TLS handshake, request
  line, headers, body and answer. Each connection carries one request (``routes``), so there is
  no idle keep-alive to bound beyond that; a request line or header line is at most 64 KiB and
  100 headers (``http.server``), a body at most ``routes.MAX_BODY``.
- TLS when given a server context; the token and loopback rules are ``access``'s.
"""
from __future__ import annotations

import logging
import socket
import ssl
import sys
import threading
from http.server import ThreadingHTTPServer

from partq.console.access import Access
from partq.console.routes import Handler
from partq.console.views import Views
from partq.errors import InvalidConfig
from partq.wire.admission import Admission
from partq.wire.frames import parse_address
from partq.wire.listener import is_loopback

log = logging.getLogger("partq.console")


class Console:
    """What a request handler reads: the broker, its views, the access rules."""

    def __init__(self, broker, access: Access, allow_actions: bool) -> None:
        self.broker, self.access, self.allow_actions = broker, access, allow_actions
        self.views = Views(broker)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[str, int], handler, max_connections: int, timeout: float,
                 ssl_context: ssl.SSLContext | None) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self._admission = Admission(max_connections, timeout)
        self.max_connections = max_connections
        self.ssl_context = ssl_context
        super().__init__(address, handler)

    def process_request(self, request, client_address) -> None:
        # cut off through a second descriptor: TLS takes the first one over when it wraps it
        handle = request.dup()
        evicted = self._admission.admit(handle)
        if evicted is not None:
            log.warning("console cut off the oldest of %d connections to serve %s",
                        self.max_connections, client_address[0])
        thread = threading.Thread(target=self._serve, args=(request, handle, client_address),
                                  name="partq-console-conn", daemon=True)
        thread.start()

    def _serve(self, request, handle, client_address) -> None:
        sock = request
        try:
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(request, server_side=True)
            self.finish_request(sock, client_address)
        except Exception:
            self.handle_error(sock, client_address)
        finally:
            self._admission.release(handle)
            for s in (sock, request, handle):
                try:
                    s.close()
                except OSError:
                    pass

    def service_actions(self) -> None:
        """Called by serve_forever between polls: cut off connections past their deadline."""
        for _ in self._admission.reap():
            log.warning("console cut off a connection: no whole request and answer within %g s",
                        self._admission.deadline)

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, (OSError, ssl.SSLError)):      # the peer went away, or was too slow
            log.info("console: the request of %s failed: %s", client_address[0], exc)
        else:                                             # a bug: this request fails, not the console
            log.exception("console: a request of %s failed", client_address[0])

    def waiting(self) -> int:
        return self._admission.waiting()


class ConsoleServer:
    """Serves the console of ``broker`` on ``address`` ("HOST:PORT") until ``close()``.
    ``token`` (bytes, at least 16) and ``ssl_context`` (a server context) admit other hosts;
    ``allow_actions`` lets the page change things (``partq.console.actions``)."""

    def __init__(self, broker, address: str, *, token: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None, allow_actions: bool = False,
                 max_connections: int = 32, timeout: float = 10.0) -> None:
        host, port = parse_address(address)
        host = host.strip("[]")
        self.console = Console(broker, Access(token, ssl_context is not None), allow_actions)
        handler = type("ConsoleHandler", (Handler,), {"console": self.console,
                                                       "timeout": timeout})
        try:
            self._server = _Server((host, port), handler, max_connections, timeout, ssl_context)
        except OSError as exc:
            raise InvalidConfig(f"cannot serve the console on {address}: "
                                f"{exc.strerror or exc}") from None
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ":" in host else f"{host}:{bound}"
        self.url = f"{'https' if ssl_context else 'http'}://{self.address}/"
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={
            "poll_interval": 0.25}, name="partq-console", daemon=True)
        self._thread.start()
        log.info("serving the console on %s%s", self.url,
                 " (actions allowed)" if allow_actions else "")
        if token is None and not is_loopback(host):
            log.warning("the console on %s has no token: it is in protected mode and serves "
                        "loopback peers only; give it a token and TLS to serve other hosts",
                        self.address)
        elif token is not None and ssl_context is None and not is_loopback(host):
            log.warning("the console on %s has no TLS: it serves loopback peers only, so that "
                        "its token never crosses the network in the clear", self.address)

    def connections(self) -> int:
        """Connections open now (each is served within its deadline or cut off)."""
        return self._server.waiting()

    def close(self) -> None:
        """Stop serving; the port is free when this returns."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
