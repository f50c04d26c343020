"""Connections a listener has accepted but does not trust yet: in the handshake of a TCP
listener, or an HTTP request of the metrics endpoint being read and answered.

Two rules keep slow or silent peers from locking others out (a slowloris):

- one deadline for the whole phase, not per read: a peer that sends a byte every few seconds
  is cut off when its time is up, however busy it looks;
- a bounded number at once, and when that many are waiting, the oldest is cut off to admit the
  newest. A prompt peer finishes its handshake in milliseconds, so stalled ones can delay it
  but never keep it out; a peer that is cut off is closed, never the listener.

Cutting off is ``shutdown(SHUT_RDWR)`` from another thread, which ends a read blocked in the
thread that serves the connection (a TLS handshake included); that thread then closes it.
"""
from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable


class Admission:
    """At most ``limit`` untrusted connections, each for at most ``deadline`` seconds."""

    def __init__(self, limit: int, deadline: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.deadline = limit, deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._waiting: dict[socket.socket, float] = {}     # insertion order is age order

    def admit(self, conn: socket.socket) -> socket.socket | None:
        """Start ``conn``'s deadline; return the connection cut off to make room, if any."""
        with self._lock:
            evicted = None
            if len(self._waiting) >= self.limit:
                evicted = next(iter(self._waiting))
                del self._waiting[evicted]
            self._waiting[conn] = self._clock() + self.deadline
        if evicted is not None:
            cut_off(evicted)
        return evicted

    def release(self, conn: socket.socket) -> bool:
        """``conn`` is trusted now, or gone. False if it had been cut off already."""
        with self._lock:
            return self._waiting.pop(conn, None) is not None

    def reap(self) -> list[socket.socket]:
        """Cut off every connection past its deadline; return them."""
        now = self._clock()
        with self._lock:
            late = [conn for conn, until in self._waiting.items() if until <= now]
            for conn in late:
                del self._waiting[conn]
        for conn in late:
            cut_off(conn)
        return late

    def cut_off_all(self) -> None:
        """Cut off every waiting connection (the listener is closing)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), {}
        for conn in waiting:
            cut_off(conn)

    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)


def cut_off(conn: socket.socket) -> None:
    """End whatever read or write another thread is blocked in on ``conn``."""
    try:
        conn.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
