"""A TCP listener with the limits every partq listener keeps (S34): TLS when given a context, the
handshake of ``partq.wire`` (a token proven by challenge-response), a handshake timeout, a
connection limit, and protected mode: without a token only loopback peers are let in, as Redis
does, and the listener says so when it starts. A peer that breaks a rule loses its own
connection, with a log line; the listener and the other peers go on.

The handler a listener is given runs in a thread per connection, after the handshake, with the
socket (TLS-wrapped when configured) and the peer's hello; it owns the socket from then on and
must bound its own frame sizes and idle time (``Limits``).
"""
from __future__ import annotations

import ipaddress
import logging
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass

from partq.errors import InvalidConfig
from partq.wire.frames import FrameError, parse_address
from partq.wire.handshake import HandshakeFailed, refuse, server_handshake

log = logging.getLogger("partq.listener")

ACCEPT_POLL = 0.25
CLOSE_WAIT = 10.0          # seconds close() waits for each connection's handler to end


@dataclass(frozen=True)
class Limits:
    """What one connection may cost the listener."""
    max_frame: int = 16 << 20          # bytes per frame read from a peer
    handshake_timeout: float = 5.0     # seconds from accept to the end of the handshake
    idle_timeout: float = 60.0         # seconds without a frame (or mid-frame) from a peer
    max_connections: int = 256


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


class Listener:
    def __init__(self, address: str, role: str, handler: Callable[[socket.socket, dict, str], None],
                 *, token: bytes | None, ssl_context: ssl.SSLContext | None = None,
                 limits: Limits = Limits()) -> None:
        host, port = parse_address(address)
        self.role, self.token, self.ssl_context, self.limits = role, token, ssl_context, limits
        self._handler = handler
        self._stop = threading.Event()
        self._active: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        try:
            self._sock = socket.create_server((host, port))
        except OSError as exc:
            raise InvalidConfig(f"cannot listen on {address}: {exc.strerror or exc}") from None
        self._sock.settimeout(ACCEPT_POLL)
        bound = self._sock.getsockname()
        self.address = f"{host}:{bound[1]}"
        if token is None:
            log.warning("%s listener on %s is in protected mode: no token, so it accepts "
                        "loopback peers only; give it a token to accept others", role,
                        self.address)
        self._thread = threading.Thread(target=self._accept_loop, name=f"partq-{role}-accept",
                                        daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError as exc:
                if self._stop.is_set():
                    return
                # out of descriptors, or a connection aborted before it was accepted: the
                # listener goes on (a peer must never end it)
                log.warning("%s listener could not accept a connection: %s", self.role, exc)
                self._stop.wait(ACCEPT_POLL)
                continue
            where = f"{peer[0]}:{peer[1]}"
            with self._lock:
                full = len(self._active) >= self.limits.max_connections
                if not full:
                    self._active.add(conn)
            if full:
                log.warning("%s listener refused %s: %d connections already", self.role, where,
                            self.limits.max_connections)
                conn.settimeout(0)       # the refusal is best effort: never block accepting
                refuse(conn, f"the {self.role} listener serves {self.limits.max_connections} "
                             f"connections already; retry later")
                conn.close()
                continue
            thread = threading.Thread(target=self._serve, args=(conn, where, peer[0]),
                                      name=f"partq-{self.role}-conn", daemon=True)
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, conn: socket.socket, where: str, host: str) -> None:
        sock = conn
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(self.limits.handshake_timeout)
            if self.token is None and not is_loopback(host):
                raise refuse(conn, f"this {self.role} listener is in protected mode (it has no "
                                   f"token) and admits loopback peers only; give it a token "
                                   f"to admit other hosts")
            if self.ssl_context is not None:
                sock = self.ssl_context.wrap_socket(conn, server_side=True)
            hello = server_handshake(sock, self.role, self.token, self.limits.handshake_timeout,
                                     self.limits.max_frame)
        except (HandshakeFailed, FrameError, OSError, ssl.SSLError) as exc:
            log.warning("%s listener dropped %s during the handshake: %s", self.role, where, exc)
            self._done(conn, sock)
            return
        except Exception:  # a bug ends this connection only, visibly
            log.exception("%s listener: the handshake with %s failed", self.role, where)
            self._done(conn, sock)
            return
        try:
            self._handler(sock, hello, where)
        except Exception:  # a bug ends this connection only, visibly
            log.exception("%s connection from %s failed", self.role, where)
        finally:
            self._done(conn, sock)

    def _done(self, conn: socket.socket, sock: socket.socket) -> None:
        with self._lock:
            self._active.discard(conn)
        for s in {sock, conn}:
            try:
                s.close()
            except OSError:
                pass

    def connections(self) -> int:
        with self._lock:
            return len(self._active)

    def close(self) -> None:
        """Stop accepting, end every connection and wait for its handler, and for the accept
        loop: the port is free when this returns."""
        self._stop.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        if threading.current_thread() is not self._thread:
            self._thread.join()
        with self._lock:
            active, threads = list(self._active), list(self._threads)
        for conn in active:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:       # each ends its session (unbinding its flows) and logs
            thread.join(timeout=CLOSE_WAIT)
