"""The outbox every partq connection writes through: a thread that waits for room to push is
woken when the peer read enough (``when_below``), once however often it asked, and when the
connection closes. Real Unix socket pairs."""
from __future__ import annotations

import socket
import threading

from helpers import wait_until

from partq.wire.frames import Outbox


def _full(limit: int) -> tuple[Outbox, socket.socket, socket.socket]:
    """An outbox (a server's: writes what the socket takes) with more than ``limit`` bytes
    pending because its peer reads nothing."""
    ours, peer = socket.socketpair()
    ours.settimeout(5.0)            # non-blocking descriptor: the server's direct writes
    outbox = Outbox(ours, "test-send", direct="try")
    chunk = b"x" * (256 << 10)
    for _ in range(200):
        outbox.put(chunk)
        if outbox.pending_bytes() >= limit:
            return outbox, ours, peer
    raise AssertionError("the socket took 50 MiB without its peer reading")


def _drain(peer: socket.socket, stop: threading.Event) -> None:
    peer.settimeout(0.2)
    while not stop.is_set():
        try:
            if not peer.recv(1 << 20):
                return
        except TimeoutError:
            pass
        except OSError:
            return


def test_when_below_calls_back_once_the_peer_read_enough_and_once_only():
    limit = 1 << 20
    outbox, ours, peer = _full(2 * limit)
    calls: list[int] = []

    def wake() -> None:
        calls.append(outbox.pending_bytes())
    try:
        for _ in range(5):                  # a pump asks on every look while there is no room
            outbox.when_below(limit, wake)
        assert calls == []                  # no room yet: nothing called
        stop = threading.Event()
        reader = threading.Thread(target=_drain, args=(peer, stop), daemon=True)
        reader.start()
        wait_until(lambda: calls, 30, "the callback once the peer read")
        wait_until(lambda: outbox.pending_bytes() == 0, 30, "the outbox to drain")
        assert len(calls) == 1 and calls[0] < limit
        outbox.when_below(limit, lambda: calls.append(-1))
        assert calls[-1] == -1              # room now: called at once
        stop.set()
        reader.join(5)
    finally:
        outbox.close()
        ours.close()
        peer.close()


def test_when_below_calls_back_when_the_connection_closes():
    outbox, ours, peer = _full(1 << 20)
    called = threading.Event()
    try:
        outbox.when_below(1 << 20, called.set)
        assert not called.is_set()
        outbox.close()
        assert called.is_set()
    finally:
        ours.close()
        peer.close()
