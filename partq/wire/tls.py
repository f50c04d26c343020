"""A TLS connection that one thread reads while another writes.

``partq serve`` and ``partq.connect`` read a connection in one thread and write it in another
(pushes and answers go out while requests come in). A plain socket allows that; an
``ssl.SSLSocket`` does not: both directions share one OpenSSL object, whose calls are not safe
from two threads at once. Its last-operation state is shared, so a read that found no data
while a write ran beside it could be reported as ``SSLEOFError("EOF occurred in violation of
protocol")``, and with ``suppress_ragged_eofs`` as a plain end of the connection: each side
then thought the other had hung up, a few times a second under load.

``SerialTLS`` keeps the descriptor non-blocking and makes one TLS call at a time under a lock,
never holding it while it waits: a read waiting for data lets a write through, and the
reverse. Only what a connection of ``partq serve`` uses is offered.
"""
from __future__ import annotations

import io
import select
import socket
import ssl
import threading
import time

WRITE_CHUNK = 256 << 10      # bytes encrypted per turn of the lock: a long write lets reads in


class SerialTLS:
    """An ``SSLSocket`` after its handshake, safe to read from one thread and write from
    another; timeouts (``settimeout``) bound each call as a socket's do."""

    def __init__(self, sock: ssl.SSLSocket) -> None:
        self._sock = sock
        self._timeout = sock.gettimeout()
        self._lock = threading.Lock()
        sock.setblocking(False)

    # ------------------------------------------------------------------ the one TLS call
    def _call(self, fn, *args):
        """``fn(*args)`` under the lock, again each time the descriptor is ready for what it
        wants, until it returns or the timeout runs out (``TimeoutError``)."""
        deadline = None if self._timeout is None else time.monotonic() + self._timeout
        while True:
            with self._lock:
                try:
                    return fn(*args)
                except ssl.SSLWantReadError:
                    events = select.POLLIN
                except ssl.SSLWantWriteError:
                    events = select.POLLOUT
            self._wait(events, deadline)

    def _wait(self, events: int, deadline: float | None) -> None:
        poller = select.poll()
        poller.register(self._sock.fileno(), events)
        if deadline is None:
            poller.poll()
            return
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            raise TimeoutError("timed out")

    # ------------------------------------------------------------------ what a socket offers
    def recv_into(self, buffer, nbytes: int = 0) -> int:
        return self._call(self._sock.recv_into, buffer, nbytes or memoryview(buffer).nbytes)

    def recv(self, n: int) -> bytes:
        return self._call(self._sock.recv, n)

    def sendall(self, data) -> None:
        with memoryview(data) as view, view.cast("B") as flat:
            for start in range(0, len(flat), WRITE_CHUNK):
                chunk = flat[start:start + WRITE_CHUNK]
                # without partial writes, a write told to wait must be made again whole
                self._call(self._sock.send, chunk)

    def makefile(self, mode: str = "rb", buffering: int = io.DEFAULT_BUFFER_SIZE):
        if mode != "rb":
            raise ValueError("SerialTLS reads only: makefile('rb')")
        return io.BufferedReader(_Reader(self), buffering)

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def fileno(self) -> int:
        return self._sock.fileno()

    def getpeername(self):
        return self._sock.getpeername()

    def shutdown(self, how: int) -> None:
        """End the connection under the TLS object: a reader waiting for data wakes to an end
        (``SSLSocket.shutdown`` would also drop the TLS object while it is in use)."""
        socket.socket.shutdown(self._sock, how)

    def close(self) -> None:
        self._sock.close()


class _Reader(io.RawIOBase):
    def __init__(self, conn: SerialTLS) -> None:
        self._conn = conn

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._conn.recv_into(buffer)


Conn = socket.socket | SerialTLS       # what a session of partq serve or a client speaks over


def serial(sock: socket.socket) -> Conn:
    """``sock`` made safe for a reading and a writing thread: a TLS socket wrapped, any other
    as it is."""
    return SerialTLS(sock) if isinstance(sock, ssl.SSLSocket) else sock
