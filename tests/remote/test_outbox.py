"""The outbox every partq connection writes through: a thread that waits for room to push is
woken when the peer read enough (``when_below``), once however often it asked, and when the
connection closes; frames put while it is corked wait for the cork's end (an answer and the
delivery after it leave together). Real Unix socket pairs."""
from __future__ import annotations

import socket
import threading

import pytest
from helpers import wait_until

from partq.errors import InvalidAck
from partq.wire.frames import Outbox, read_frame


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


def _frames_on(peer: socket.socket, count: int) -> list:
    """The next ``count`` frames the peer can read (within 5 s)."""
    stream = peer.makefile("rb")
    try:
        return [read_frame(stream) for _ in range(count)]
    finally:
        stream.close()


def _nothing_to_read(peer: socket.socket) -> bool:
    peer.setblocking(False)
    try:
        peer.recv(1)
    except BlockingIOError:
        return True
    finally:
        peer.settimeout(5.0)
    return False


def test_frames_put_while_corked_are_held_then_written_in_order():
    ours, peer = socket.socketpair()
    ours.settimeout(5.0)
    outbox = Outbox(ours, "test-send", direct="try")
    try:
        with outbox.corked():
            outbox.put({"op": "ok", "req": 1})
            threading.Thread(target=outbox.put, args=({"op": "ok", "req": 2},)).start()
            outbox.put({"op": "deliver", "n": 1})
            wait_until(lambda: outbox.pending_bytes() > 0, 5, "the frames to be queued")
            assert _nothing_to_read(peer)           # held while corked, whoever put them
        frames = _frames_on(peer, 3)
        assert frames[0] == {"op": "ok", "req": 1}
        assert {"op": "deliver", "n": 1} in frames and {"op": "ok", "req": 2} in frames
        wait_until(lambda: outbox.pending_bytes() == 0, 5, "the outbox to drain")
    finally:
        outbox.close()
        ours.close()
        peer.close()


def test_an_error_inside_the_cork_is_raised_and_what_was_held_still_goes():
    ours, peer = socket.socketpair()
    ours.settimeout(5.0)
    outbox = Outbox(ours, "test-send", direct="try")
    try:
        with pytest.raises(InvalidAck), outbox.corked():
            raise InvalidAck("refused")             # nothing held (an ack refused at once)
        with pytest.raises(InvalidAck), outbox.corked():
            outbox.put({"op": "deliver", "n": 1})
            raise InvalidAck("refused")
        assert _frames_on(peer, 1) == [{"op": "deliver", "n": 1}]
        outbox.put({"op": "ok", "req": 2})          # not corked any more: written at once
        assert _frames_on(peer, 1) == [{"op": "ok", "req": 2}]
    finally:
        outbox.close()
        ours.close()
        peer.close()
