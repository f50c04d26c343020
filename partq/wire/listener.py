"""A TCP listener with the limits every partq listener keeps: TLS when given a context, the
handshake of ``partq.wire`` (a token proven by challenge-response), one deadline for the whole
handshake (TLS included), a bound on connections still in their handshake (the oldest is cut off
to admit a new one: ``partq.wire.admission``), a separate limit of connections that passed it,
so unauthenticated peers can never take an authenticated peer's slot, and protected mode:
without a token only loopback peers are let in, as Redis does, and the listener says so when it
starts. A peer that breaks a rule loses its own connection, with a log line; the listener and
the other peers go on.

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

from partq.errors import FrameError, HandshakeFailed, InvalidConfig
from partq.wire.admission import Admission
from partq.wire.frames import parse_address
from partq.wire.handshake import refuse, server_handshake

log = logging.getLogger("partq.listener")

ACCEPT_POLL = 0.25
CLOSE_WAIT = 10.0          # seconds close() waits for each connection's handler to end


@dataclass(frozen=True)
class Limits:
    """What one connection may cost the listener."""
    max_frame: int = 16 << 20          # bytes per frame read from a peer
    handshake_timeout: float = 5.0     # seconds from accept to the end of the handshake, in all
    idle_timeout: float = 60.0         # seconds without a frame (or mid-frame) from a peer
    max_connections: int = 256         # connections that passed the handshake
    max_handshakes: int = 64           # connections in their handshake; the oldest gives way
    # what one connection of ``partq serve`` may hold (the other listeners read small frames)
    max_pending_bytes: int = 4 << 20   # answers and pushes not yet read by the peer; past it the
                                       # server reads no more of its requests (backpressure)
    max_push_bytes: int = 4 << 20      # pushes queued for the peer: flows deliver no more
    max_flows: int = 64                # flows bound over one connection
    max_batch: int = 10_000            # items of one publish


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
        self._admission = Admission(limits.max_handshakes, limits.handshake_timeout)
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
            for late in self._admission.reap():
                log.warning("%s listener cut off %s: no handshake within %g s", self.role,
                            _peer_of(late), self.limits.handshake_timeout)
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
            try:
                # cut off and shut down through a second descriptor of the same socket: TLS
                # takes ``conn``'s over (``conn`` is detached) as soon as it wraps it
                handle = conn.dup()
            except OSError as exc:
                log.warning("%s listener could not take %s: %s", self.role, where, exc)
                conn.close()
                continue
            evicted = self._admission.admit(handle)
            if evicted is not None:
                log.warning("%s listener cut off %s, the oldest of %d connections still in their "
                            "handshake, to admit %s", self.role, _peer_of(evicted),
                            self.limits.max_handshakes, where)
            thread = threading.Thread(target=self._serve, args=(conn, handle, where, peer[0]),
                                      name=f"partq-{self.role}-conn", daemon=True)
            with self._lock:
                self._threads = [t for t in self._threads if t.is_alive()] + [thread]
            thread.start()

    def _serve(self, conn: socket.socket, handle: socket.socket, where: str, host: str) -> None:
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
                                     self.limits.max_frame, admit=lambda: self._admit(handle))
        except (HandshakeFailed, FrameError, OSError, ssl.SSLError) as exc:
            log.warning("%s listener dropped %s during the handshake: %s", self.role, where, exc)
            self._done(conn, handle, sock)
            return
        except Exception:  # a bug ends this connection only, visibly
            log.exception("%s listener: the handshake with %s failed", self.role, where)
            self._done(conn, handle, sock)
            return
        try:
            self._handler(sock, hello, where)
        except Exception:  # a bug ends this connection only, visibly
            log.exception("%s connection from %s failed", self.role, where)
        finally:
            self._done(conn, handle, sock)

    def _admit(self, handle: socket.socket) -> str | None:
        """Called once a peer proved itself, before it is welcomed: move it from the
        handshake's slots to the authenticated ones, or say why not."""
        if not self._admission.release(handle):
            return "cut off: the handshake took too long"
        with self._lock:
            if len(self._active) >= self.limits.max_connections:
                return (f"the {self.role} listener serves {self.limits.max_connections} "
                        f"connections already; retry later")
            self._active.add(handle)
        return None

    def _done(self, conn: socket.socket, handle: socket.socket, sock) -> None:
        self._admission.release(handle)
        with self._lock:
            self._active.discard(handle)
        for s in (sock, conn, handle):
            try:
                s.close()
            except OSError:
                pass

    def connections(self) -> int:
        """Open connections: those that passed the handshake and those still in it."""
        with self._lock:
            return len(self._active) + self._admission.waiting()

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
        self._admission.cut_off_all()
        with self._lock:
            active, threads = list(self._active), list(self._threads)
        for conn in active:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in threads:       # each ends its session (unbinding its flows) and logs
            thread.join(timeout=CLOSE_WAIT)


def _peer_of(conn: socket.socket) -> str:
    try:
        host, port = conn.getpeername()[:2]
        return f"{host}:{port}"
    except OSError:
        return "a peer"
