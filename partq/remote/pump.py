"""A flow's pushes to its ``partq serve`` client: messages in deliver frames bounded in bytes,
partition changes and events, and the nacks that take effect between two frames. A pump has no
thread of its own: the connection's thread serves its flow right after its client's acks, and
the server's pump thread (``Pumps``) serves every flow when something else changed."""
from __future__ import annotations

import queue as queue_module
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Protocol

from partq.errors import FlowClosed, PartqError
from partq.message import Message
from partq.wire.error_frames import error_frame
from partq.wire.listener import Limits

PUSH_BATCH = 500          # messages per deliver frame at most
PUSH_BYTES = 4 << 20      # payload and key bytes per deliver frame (one larger message goes alone)


class PumpSession(Protocol):
    """What a pump needs of the session whose client it pushes to."""

    limits: Limits
    closed: threading.Event

    def send(self, frame: dict) -> None: ...

    def pending_bytes(self) -> int: ...

    def corked(self) -> AbstractContextManager[None]:
        """Hold the frames sent meanwhile, then write them together (``Outbox.corked``)."""

    def when_room(self, limit: int, fn: Callable[[], None]) -> None:
        """Call ``fn()`` once fewer than ``limit`` bytes wait to be written to the client."""

    def close_connection(self) -> None: ...


class Pump:
    """One flow's pushes to its client: messages, partition changes and events. It has no
    thread: the connection's thread serves the flow after its client's acks (``ack``), the
    server's pump thread when anything else changed (``serve``); one at a time. ``wake``
    wakes the pump thread (when a slow client read enough to take more)."""

    def __init__(self, session: PumpSession, flow, consumer_timeout: float,
                 wake: Callable[[], None]) -> None:
        self.session: PumpSession | None = session
        self._wake = wake
        self.flow = flow
        self.consumer_timeout = consumer_timeout
        self._nacks: queue_module.SimpleQueue = queue_module.SimpleQueue()
        self._sent = 0
        self._partitions = flow.partitions
        self._batch = 1             # per receive, from the sizes seen: what one receive holds
                                    # stays near PUSH_BYTES (one at first: sizes unknown)
        self._held: list[list[Message]] = []     # received, not pushed yet: the client is slow
        self.stopped = False
        self._serving = threading.Lock()     # one thread serves the flow at a time
        self._missed = False        # the pump thread found it served by the connection's thread

    def messages(self, ids) -> list[Message]:
        """The messages ``[[partition, seq], ...]`` of a request names (each pair checked by
        ``partq.remote.requests``), as ack and nack need them (queue, partition, seq). (Built
        without Message's keyword handling: an ack of 100 costs 30 us instead of 70.)"""
        queue, new = self.flow.queue, tuple.__new__
        return [new(Message, (queue, p, s, None, b"", None, 0, False, 1)) for p, s in ids]

    def nack(self, req, msg: Message, delay: float | None = None, reject: bool = False,
             headers: dict | None = None) -> None:
        """Queue a nack (or a reject, with the headers it adds) of ``msg`` (``messages``) for
        the pump thread, which applies it between two deliver frames."""
        self._nacks.put((req, msg, delay, reject, headers))
        self._wake()

    @property
    def sent(self) -> int:
        """How many deliver frames it sent."""
        return self._sent

    @contextmanager
    def held(self) -> Iterator[None]:
        """Push nothing meanwhile (a transaction naming the flow commits): what it sent is
        ``sent`` throughout."""
        with self._serving:
            yield

    def wake(self) -> None:
        """Have the pump thread serve the flow (a transaction gave messages back)."""
        self._wake()

    def detach(self) -> None:
        """Drop what the pump holds of its session once the session ended (after a serve under
        way, which then has no session to push to)."""
        with self._serving:
            self._held = []
            self.session = None

    def close_connection(self) -> None:
        """End the connection of this pump's client (a push to it failed unexpectedly)."""
        session = self.session
        if session is not None:
            session.close_connection()

    def stop(self, unbind: bool, leave: bool = False) -> None:
        self.stopped = True
        if unbind:
            try:
                self.flow.unbind(leave=leave)
            except PartqError:
                pass

    def _room(self, session: PumpSession) -> bool:
        """Whether the client has room for pushes; if not, the pump thread is woken when it has
        (serving this flow before would only hold more in memory)."""
        if session.pending_bytes() < session.limits.max_push_bytes:
            return True
        session.when_room(session.limits.max_push_bytes, self._wake)
        return False

    def _push_held(self, session: PumpSession) -> bool:
        """Push held deliver frames while the client has room; True when none are left."""
        while self._held:
            if not self._room(session):
                return False
            batch = self._held.pop(0)
            self._sent += 1
            # each message as its fields after the queue's name: partition, seq, key, payload,
            # headers, publish_time_ns, redelivered, delivery_count (a slice of the tuple)
            session.send({"op": "deliver", "flow": self.flow.flow_id, "n": self._sent,
                          "messages": [m[1:] for m in batch]})
        return True

    def ack(self, msgs: list[Message], answer: Callable[[object], None]) -> None:
        """Ack ``msgs`` (``messages``) for the client, ``answer(handle)`` (the handle of the
        acks' write), and serve the flow: the room the acks made goes to the client from the
        calling thread (the connection's; acks wake no other thread, unless another receive of
        the flow waits or a handoff or scaling waits for them). When the writer was idle the
        acks committed in this thread too: one thread does the round, with no hand-off between
        threads on the way. The answer is written before the flow is served, not held to go
        with the delivery: the client's ``ack_many`` returns while this thread reads the next
        messages. If the pump thread came by meanwhile (``serve``: something changed after
        this serve looked), this thread serves the flow again, rather than waking the pump
        thread to look at every flow (with many busy connections it would find another one
        busy each time, and be woken again for it, round after round); only one that came by
        as this thread left is woken."""
        session = self.session
        try:
            with self._serving:
                self._missed = False    # what it came by for before this serve, this covers
                pending = self.flow.ack_many_async(msgs, commit_here=True)
                answer(pending)
                with session.corked() if session is not None else nullcontext():  # one write
                    while not self.stopped:
                        self._serve()
                        if not self._missed:
                            break
                        self._missed = False
        finally:
            if self._missed:
                self._wake()

    def serve(self) -> bool:
        """``_serve``, from the pump thread, unless the connection's thread serves the flow now
        (its commit may be slow, and one flow must not hold up the others): then it is marked
        missed, and the connection's thread serves it again before it leaves."""
        self._missed = True             # before the try: a holder that leaves sees it
        if not self._serving.acquire(blocking=False):
            return False
        try:
            self._missed = False
            return self._serve()
        finally:
            self._serving.release()

    def _serve(self) -> bool:
        """Apply queued nacks, push what the flow has now (without waiting), its events and a
        change of its partitions. True if it pushed messages (there may be more). Nothing
        while the client has no room: frames received before a nack go out before it takes
        effect."""
        flow, session, fid = self.flow, self.session, self.flow.flow_id
        if session is None or self.stopped or session.closed.is_set():
            return False
        if not self._room(session) or (self._held and not self._push_held(session)):
            return False
        while not self._nacks.empty():
            req, msg, delay, reject, headers = self._nacks.get()
            try:
                back = [msg.seq] if reject else flow.nack(msg, delay)
                if reject:
                    flow.reject(msg, headers)
                session.send({"op": "ok", "req": req, "upto": self._sent, "back": back})
            except PartqError as exc:
                session.send(error_frame(exc, req=req))
        try:
            msgs = flow.receive(self._batch, timeout=0)
        except FlowClosed as exc:
            self.stopped = True
            if not session.closed.is_set():
                session.send({"op": "closed", "flow": fid,
                              "reason": flow.closed_reason or str(exc)})
            return False
        except PartqError as exc:      # a corrupt record: the client raises it
            session.send(error_frame(exc, req=None, flow=fid))
            return True
        if msgs:
            self._held, size = byte_batches(msgs, PUSH_BYTES)
            self._batch = max(1, min(PUSH_BATCH, PUSH_BYTES * len(msgs) // max(size, 1)))
            self._push_held(session)
        for update in flow.events():
            session.send({"op": "event", "flow": fid, "active": update.active,
                          "partitions": sorted(update.partitions)})
        now = flow.partitions
        if now != self._partitions:
            self._partitions = now
            session.send({"op": "state", "flow": fid, "partitions": sorted(now)})
        return bool(msgs)


def byte_batches(msgs: list[Message], limit: int) -> tuple[list[list[Message]], int]:
    """``msgs`` in order, cut into batches of at most ``limit`` bytes of payload, key and
    headers (a message larger than that goes alone): a deliver frame stays far below what a
    client reads, whatever the queue's max_message_size. Also returns the bytes of all."""
    if any(m.headers for m in msgs):
        sizes = [message_bytes(m) for m in msgs]
    else:                       # the common case, without a call per message
        sizes = [len(m.payload) + (len(m.key) if m.key else 0) for m in msgs]
    total = sum(sizes)
    if total <= limit:
        return [msgs], total
    batches: list[list[Message]] = []
    size = limit
    for m, n in zip(msgs, sizes, strict=True):
        if size + n > limit and (not batches or batches[-1]):
            batches.append([])
            size = 0
        batches[-1].append(m)
        size += n
    return batches, total


def message_bytes(m: Message) -> int:
    """About the bytes of a message's payload, key and headers in a deliver frame (a header
    value that is not text or bytes counted as 8)."""
    n = len(m.payload) + len(m.key or "")
    if m.headers:
        n += sum(len(k) + (len(v) if isinstance(v, (bytes, str)) else 8)
                 for k, v in m.headers.items())
    return n
