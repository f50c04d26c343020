"""Frames, what every partq socket speaks: ``u32 length | u32 crc32c(body) | msgpack body``.

A bad checksum, an oversized length or a truncated frame raises ``FrameError``; the connection
that carried it ends (the peer reconnects and resumes). Nothing reads a frame it could not
verify, and a frame longer than the reader's limit is refused before its body is read.
"""
from __future__ import annotations

import os
import socket
import ssl
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import msgpack

from partq.errors import ConnectionEnded, FrameError, PartqError
from partq.storage.checksum import crc32c
from partq.wire.tls import Conn, SerialTLS

HEADER = struct.Struct(">II")
MAX_FRAME = 256 << 20
CHUNK = 1 << 20


_local = threading.local()


def encode_frame(obj) -> bytes:
    """The frame of ``obj``, header included (packed by a packer of the calling thread: a new
    one per frame would allocate its 256 KiB buffer each time)."""
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(use_bin_type=True)
    body = packer.pack(obj)
    return HEADER.pack(len(body), crc32c(body)) + body


def send_frame(sock: socket.socket, obj) -> None:
    sock.sendall(encode_frame(obj))


def recv_frame(sock: socket.socket, max_frame: int = MAX_FRAME):
    return _read(lambda n: recv_exact(sock, n), max_frame)


def read_frame(stream, max_frame: int = MAX_FRAME, max_items: int | None = None):
    """``recv_frame`` from a buffered binary stream (``socket.makefile("rb")``): one system call
    reads many small frames. ``max_items`` bounds every array and map of the frame, so a small
    frame cannot decode into millions of objects."""
    def read(n: int) -> bytes:
        data = stream.read(n)
        if len(data) < n:
            raise FrameError(f"connection closed mid-frame ({len(data)} of {n} bytes)")
        return data
    head = stream.read(HEADER.size)
    if not head:
        raise ConnectionEnded("closed the connection")
    if len(head) < HEADER.size:
        raise FrameError(f"connection closed mid-frame ({len(head)} of {HEADER.size} bytes)")
    return _read(read, max_frame, max_items, head)


def _read(read, max_frame: int, max_items: int | None = None, head: bytes | None = None):
    """One frame through ``read(n)`` (exactly n bytes, or ``FrameError``), after its header
    when that was read already: its length checked before the body is read, then its
    checksum, then its msgpack."""
    length, crc = HEADER.unpack(head if head is not None else read(HEADER.size))
    if length > max_frame:
        raise FrameError(f"frame of {length} bytes exceeds {max_frame}")
    body = read(length)
    if crc32c(body) != crc:
        raise FrameError("frame crc32c mismatch")
    try:
        if max_items is None:
            return msgpack.unpackb(body, raw=False)
        return msgpack.unpackb(body, raw=False, max_array_len=max_items, max_map_len=max_items)
    except ValueError as exc:
        if "exceeds max" in str(exc):
            raise FrameError(f"a frame holds more than {max_items} items in one array") from None
        raise FrameError(f"undecodable frame ({type(exc).__name__})") from None
    except Exception as exc:
        raise FrameError(f"undecodable frame ({type(exc).__name__})") from None


class Outbox:
    """Frames queued by any thread, written by one thread in as few system calls as possible:
    what piles up while a write is under way goes out in the next one (requests of a pipelining
    client, deliveries and answers of a server). ``close()`` ends the writer once what is queued
    is written; a failed write closes it too (``on_error`` is told). ``pending_bytes()`` counts
    what is queued or being written, so that producers can wait for a slow reader
    (``wait_below``, or ``when_below`` without a thread) instead of piling up memory."""

    def __init__(self, sock: Conn, name: str, on_error=None, gather=None,
                 direct: str | None = None) -> None:
        self._sock = sock
        self._cond = threading.Condition()
        self._frames: list[bytes] = []
        self._poked = False
        self._closed = False
        self._writing = False          # a write is under way (the thread's, or a direct one)
        self._corked = False           # frames are held until ``corked`` ends
        self._direct = direct
        self._pending = 0
        self._below: list[tuple[int, Callable[[], None]]] = []    # when_below's callbacks
        self._room_waiters = 0         # threads in wait_below
        self._on_error = on_error
        self._gather = gather          # () -> more frames, called before each write
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, frame: dict | bytes) -> None:
        """Queue ``frame`` for the writing thread. With ``direct``, when nothing is queued or
        being written, the caller's thread writes it instead, saving a thread's wake-up:
        ``"wait"`` (a client, which waits for its answer anyway) writes all of it;
        ``"try"`` (a server's commit or pump thread, which must never wait for a slow
        client) writes what the socket takes without waiting and leaves the rest to the
        writing thread. A write that fails closes the outbox and raises."""
        data = frame if isinstance(frame, bytes) else encode_frame(frame)
        with self._cond:
            if self._closed:
                raise OSError("the connection is closed")
            self._pending += len(data)
            if self._corked:
                self._frames.append(data)       # written when the cork is taken out
                return
            if self._direct is None or self._writing or self._frames or self._poked:
                self._frames.append(data)
                if self._room_waiters:      # one notify could wake a waiter for room
                    self._cond.notify_all()     # instead of the writing thread
                else:
                    self._cond.notify()
                return
            self._writing = True
        self._write_direct(data)

    @contextmanager
    def corked(self) -> Iterator[None]:
        """Hold the frames put meanwhile (by any thread), then write them together: one system
        call, and one read at the other end, for an answer and the delivery that follows it.
        Only a direct outbox writes them in the calling thread; otherwise its thread does."""
        with self._cond:
            self._corked = True
        try:
            yield
        finally:
            self._uncork()

    def _uncork(self) -> None:
        """The end of ``corked``: write what it held, in this thread if the outbox is direct
        and no write is under way, else by the writing thread."""
        with self._cond:
            self._corked = False
            if not self._frames:
                return
            if self._direct is None or self._writing or self._poked or self._closed:
                self._cond.notify_all()
                return
            data = b"".join(self._frames)
            self._frames = []
            self._writing = True
        self._write_direct(data)

    def _write_direct(self, data: bytes) -> None:
        """Write ``data`` in the calling thread (``_writing`` is set): all of it (``"wait"``),
        or what the socket takes at once, the rest left to the writing thread (``"try"``)."""
        sent = 0
        try:
            if self._direct == "wait":
                self._sock.sendall(data)
                sent = len(data)
            else:
                sent = self._write_now(data)
        except OSError as exc:
            self._failed(exc)
            raise
        finally:
            with self._cond:
                self._writing = False
                if sent < len(data) and not self._closed:
                    self._frames.insert(0, data[sent:])     # the rest, before anything later
                self._pending = max(0, self._pending - sent)
                if self._frames or self._closed or self._room_waiters:
                    self._cond.notify_all()     # else none waits for it: the writing thread
                due = self._due()               # has nothing to do, and no one waits for room
            for fn in due:
                fn()

    def _write_now(self, data: bytes) -> int:
        """Write what the socket takes at once; how many bytes. Only a socket in timeout mode
        (its descriptor is non-blocking) that is not TLS (whose records cannot be cut
        anywhere) is written this way; otherwise nothing is."""
        sock = self._sock
        if sock.gettimeout() is None or isinstance(sock, (ssl.SSLSocket, SerialTLS)):
            return 0
        try:
            return os.write(sock.fileno(), data)
        except BlockingIOError:
            return 0

    def _failed(self, exc: OSError) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            due = self._due()
        for fn in due:
            fn()
        if self._on_error is not None:
            self._on_error(exc)

    def pending_bytes(self) -> int:
        with self._cond:
            return self._pending

    def wait_below(self, limit: int, timeout: float) -> bool:
        """Wait until fewer than ``limit`` bytes are pending, or the outbox closed (True), or
        ``timeout`` seconds passed (False)."""
        with self._cond:
            self._room_waiters += 1
            try:
                return self._cond.wait_for(lambda: self._pending < limit or self._closed,
                                           timeout)
            finally:
                self._room_waiters -= 1

    def when_below(self, limit: int, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once fewer than ``limit`` bytes are pending or the outbox closed: now,
        or from the thread whose write brings it there (``fn`` must be quick)."""
        with self._cond:
            if not (self._pending < limit or self._closed):
                if (limit, fn) not in self._below:      # asked again before it came: once
                    self._below.append((limit, fn))
                return
        fn()

    def _due(self) -> list[Callable[[], None]]:
        """Under ``_cond``: the ``when_below`` callbacks now due, forgotten."""
        if not self._below:
            return []
        due = [fn for limit, fn in self._below if self._pending < limit or self._closed]
        if due:
            self._below = [(limit, fn) for limit, fn in self._below
                           if not (self._pending < limit or self._closed)]
        return due

    def poke(self) -> None:
        """Wake the writer: ``gather`` has something. Already poked, it will call ``gather``
        (it clears the flag before it does): nothing to do, and no lock taken (a pipelining
        publisher pokes once per message)."""
        if self._poked:
            return
        with self._cond:
            self._poked = True
            if self._room_waiters:
                self._cond.notify_all()
            else:
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()     # the writing thread, and any waiter for room
            due = self._due()
        for fn in due:
            fn()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._writing or (not self._frames and not self._poked
                                        and not self._closed):
                    self._cond.wait()
                frames, self._frames, self._poked = self._frames, [], False
                closing = self._closed
                self._writing = True
            try:
                if self._gather is not None:
                    frames += self._gather()
                if frames:
                    data = b"".join(frames)
                    frames.clear()
                    self._sock.sendall(data)
                    with self._cond:
                        self._pending = max(0, self._pending - len(data))
                        due = self._due()
                    for fn in due:
                        fn()
                    frames.append(data)      # something was written: not the closing round
            except OSError as exc:
                self._failed(exc)
                return
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()
            if closing and not frames:
                return


def recv_exact(sock: socket.socket, n: int) -> bytes:
    parts, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, CHUNK))
        if not chunk:
            raise FrameError(f"connection closed mid-frame ({got} of {n} bytes)")
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def parse_address(address: str) -> tuple[str, int]:
    """``HOST:PORT`` (an empty host means 127.0.0.1) as a (host, port) pair."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise PartqError(f"address {address!r} must be HOST:PORT, e.g. 127.0.0.1:7010")
    return host or "127.0.0.1", int(port)


def printable(value) -> str:
    """A value a peer sent, fit for a log line or a status: control characters escaped, so a
    peer cannot forge lines."""
    text = str(value)
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")
