"""Which received message may run now: per-key (or per-partition) order under concurrency.

Messages are grouped into *units*: under ``ordering="key"`` a unit is one key of one partition
(an unkeyed message is a unit of its own, so unkeyed messages run freely); under
``ordering="partition"`` a unit is a partition. Invariants, kept under one lock:

* at most one message of a unit is *out* (handed to a handler, running, or waiting for its
  ack) at a time: the head of the unit's queue;
* a unit's messages are handed out in the order they were received, which is their publish
  order (a flow receives a partition in sequence order);
* a unit's next message is handed out only after ``done`` was called for the one before, which
  the runner does once that one's ack was applied (or its nack or reject was);
* ``buffered`` (received, not done) stays under the runner's receive-ahead bound: the runner
  waits in ``wait_for_room`` before it receives more.

Worked example, ordering "key", one partition, received in order a1 b1 a2 c1 with three
handlers free: a1, b1, c1 run at once; a2 waits; a1's ack is applied, ``done(a1)`` makes a2
ready.

Thread-safe: every method may be called from any thread.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from partq.message import Message


class Entry:
    """A received message and where it stands."""

    __slots__ = ("msg", "unit", "epoch", "started", "warned")

    def __init__(self, msg: Message, unit: tuple, epoch: int) -> None:
        self.msg = msg
        self.unit = unit
        self.epoch = epoch          # the receive it came with (a nack drops older copies only)
        self.started = 0.0          # clock time its handler started (0: not yet)
        self.warned = False         # logged as slow already


def unit_of(msg: Message, ordering: str) -> tuple:
    """The unit ``msg`` runs in: one at a time per unit."""
    if ordering == "key":
        if msg.key is None:
            return ("m", msg.partition, msg.seq)
        return ("k", msg.partition, msg.key)
    return ("p", msg.partition)


class KeyScheduler:
    def __init__(self, ordering: str) -> None:
        self.ordering = ordering
        lock = threading.Lock()
        self._cond = threading.Condition(lock)      # handler threads wait here for work
        self._room = threading.Condition(lock)      # the receiving thread waits here for room
        self._units: dict[tuple, deque[Entry]] = {}     # per unit, its head first
        self._out: set[tuple] = set()                   # units whose head is out
        self._ready: deque[Entry] = deque()
        self._buffered = 0
        self._epoch = 0
        self._closed = False
        # messages a handler thread takes at a time (the runner sets it): one thread is woken
        # per that many messages made ready
        self.batch = 1

    def add(self, msgs: list[Message]) -> None:
        with self._cond:
            self._epoch += 1
            ready = len(self._ready)
            for msg in msgs:
                entry = Entry(msg, unit_of(msg, self.ordering), self._epoch)
                queue = self._units.get(entry.unit)
                if queue is None:
                    queue = self._units[entry.unit] = deque()
                queue.append(entry)
                self._buffered += 1
                if entry.unit not in self._out:
                    self._out.add(entry.unit)
                    self._ready.append(entry)
            self._wake_takers(len(self._ready) - ready)

    def epoch(self) -> int:
        """The current receive's number: entries received from now on have a higher one."""
        with self._cond:
            return self._epoch + 1

    def take(self, timeout: float, limit: int = 1) -> list[Entry]:
        """The next messages that may run, at most ``limit`` (each of another unit), oldest
        first; [] after ``timeout`` seconds or once closed."""
        with self._cond:
            deadline = None
            while not self._ready:
                if self._closed:
                    return []
                if deadline is None:
                    deadline = time.monotonic() + timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                self._cond.wait(left)
            if self._closed:
                return []
            ready = self._ready
            if limit == 1 or len(ready) == 1:
                return [ready.popleft()]
            return [ready.popleft() for _ in range(min(limit, len(ready)))]

    def done(self, entries: list[Entry]) -> None:
        """``entries`` (each the head of its unit) were acked, nacked or rejected: hand out
        each unit's next message."""
        with self._cond:
            ready = len(self._ready)
            for entry in entries:
                self._finish(entry)
            self._woke(ready)

    def given_back(self, entry: Entry, partition: int, seqs: list[int], since: int) -> int:
        """A nack of ``entry`` gave back ``seqs`` of ``partition``: drop the copies of them
        received before epoch ``since`` (they come again), then finish ``entry``. Returns how
        many were dropped."""
        back = set(seqs)
        with self._cond:
            queue = self._units.get(entry.unit, deque())
            kept = deque(e for e in queue if e is entry or e.epoch >= since
                         or e.msg.partition != partition or e.msg.seq not in back)
            dropped = len(queue) - len(kept)
            if dropped:
                self._units[entry.unit] = kept
                self._buffered -= dropped
            ready = len(self._ready)
            self._finish(entry)
            self._woke(ready)
            return dropped

    def _woke(self, ready_before: int) -> None:
        """Wake a handler thread per message made ready, and the receiving thread (there is
        room now)."""
        self._wake_takers(len(self._ready) - ready_before)
        self._room.notify()

    def _wake_takers(self, made_ready: int) -> None:
        if made_ready > 0:
            self._cond.notify(-(-made_ready // self.batch))

    def _finish(self, entry: Entry) -> None:
        queue = self._units.get(entry.unit)
        if not queue or queue[0] is not entry:
            return          # finished already
        queue.popleft()
        self._buffered -= 1
        if queue:
            self._ready.append(queue[0])
        else:
            del self._units[entry.unit]
            self._out.discard(entry.unit)

    def drop_waiting(self) -> int:
        """Forget every message not handed to a handler (waiting for its turn, or ready and not
        taken); the ones out stay until ``done``. Returns how many were dropped."""
        with self._cond:
            ready = {id(e) for e in self._ready}
            self._ready.clear()
            dropped = 0
            for unit in list(self._units):
                queue = self._units[unit]
                if id(queue[0]) in ready:       # not taken: the whole unit goes
                    dropped += len(queue)
                    del self._units[unit]
                    self._out.discard(unit)
                else:                           # its head runs: only the head stays
                    dropped += len(queue) - 1
                    self._units[unit] = deque([queue[0]])
            self._buffered -= dropped
            self._room.notify_all()
            return dropped

    def buffered(self) -> int:
        """Messages received and not done: ready, running, waiting for their ack or their
        turn."""
        with self._cond:
            return self._buffered

    def wait_for_room(self, limit: int, timeout: float, at_least: int = 1) -> int:
        """Wait until at most ``limit - at_least`` messages are buffered (or ``timeout``
        passed, or closed); return how many more may be received (receives of ``at_least`` or
        more cost less per message than many small ones)."""
        with self._cond:
            deadline = None
            while self._buffered > limit - at_least and not self._closed:
                if deadline is None:
                    deadline = time.monotonic() + timeout
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._room.wait(left)
            return max(limit - self._buffered, 0)

    def closed(self) -> bool:
        with self._cond:
            return self._closed

    def close(self) -> int:
        """Hand out nothing more (``take`` returns None); return how many received messages
        were never handed out (they go back to the queue when the flow unbinds)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            self._room.notify_all()
            return sum(len(q) for q in self._units.values()) - len(self._out) + len(self._ready)
