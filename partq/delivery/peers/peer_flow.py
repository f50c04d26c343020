"""One flow of a queue whose delivery another process owns, as its ``Flow`` sees it: the
``FlowEndpoint`` that forwards to the group of this process's flows of that queue (``PeerQueue``
in ``peer_delivery.py``, known here only as the ``PeerGroup`` declared below), or, after this
process took delivery over, to a local endpoint.

Its delivery state (the cursors of the partitions it holds, how many messages it has in flight,
why it was unbound) changes only through the methods under "state transitions", each one step
of its life; ``PeerQueue`` calls them under its lock."""
from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

from partq.delivery.cursor import Cursor
from partq.delivery.flow_state import dead_error, fenced_error, fenced_range
from partq.delivery.held_view import peer_holds
from partq.errors import CorruptRecord, FlowClosed, InvalidAck
from partq.flow import FlowEndpoint, PollWatch
from partq.message import FlowChangeUpdate, Message
from partq.pending import WriteHandle

if TYPE_CHECKING:
    from partq.delivery.handout import Handout
    from partq.delivery.holds import Holds
    from partq.storage.encoding import AckState



class PeerGroup(Protocol):
    """What a ``PeerFlow`` asks of the group of its process's flows of one queue
    (``PeerQueue``): the ``FlowEndpoint`` calls that need the store or the owner. Each raises
    what ``partq.flow.FlowEndpoint`` documents for it."""

    def receive(self, flow: PeerFlow, max_messages: int, timeout: float) -> list[Message] | None:
        """Messages for ``flow``, waiting as ``FlowEndpoint.receive`` does; None when the flow
        was handed over to this process's own delivery meanwhile (ask that instead)."""

    def ack(self, flow: PeerFlow, msgs: list[Message],
            commit_here: bool = False) -> WriteHandle | None: ...

    def ack_through(self, flow: PeerFlow, partition: int, seq: int) -> WriteHandle | None: ...

    def nack(self, flow: PeerFlow, msg: Message, delay: float | None) -> list[int]: ...

    def reject(self, flow: PeerFlow, msg: Message) -> None: ...

    def unbind(self, flow: PeerFlow) -> None: ...

    def partitions(self, flow: PeerFlow) -> frozenset[int]: ...

    def now(self) -> float:
        """The time of the group's clock."""


class PeerFlow:
    """A flow bound through the owner's control channel; the endpoint its ``Flow`` calls.
    After a failover that made this process the owner it forwards to a local endpoint."""

    def __init__(self, group: PeerGroup, queue: str, flow_id: str, name: str | None,
                 skip_corrupt: bool) -> None:
        self._group = group
        self._flow_id = flow_id
        self.queue, self.name, self.skip_corrupt = queue, name, skip_corrupt   # never change
        self.pending_error: CorruptRecord | None = None   # set by Cursor.take; the next receive
        self._cursors: dict[int, Cursor] = {}             # raises it
        self._resync: set[int] = set()   # partitions whose cursor must be rebuilt from the store
        self._inflight = 0
        self._rr = 0
        self._reason: str | None = None       # why it was unbound (None while bound)
        self._held: frozenset[int] = frozenset()      # what it last held: its hint
        self._events: deque[FlowChangeUpdate] = deque()
        self._events_lock = threading.Lock()
        self._callback: Callable[[FlowChangeUpdate], None] | None = None
        self._local: FlowEndpoint | None = None       # after this process took delivery over
        self.poll = PollWatch(group.now())            # rule `max-poll-interval`
        self._outside = -1          # the count of acks written outside delivery it last saw
        self.seen_paused: frozenset[int] = frozenset()  # its partitions paused for a handoff, as
                                    # its last receive saw them (its reports say so)

    # the FlowEndpoint interface ------------------------------------------------
    @property
    def flow_id(self) -> str:
        return self._flow_id

    def receive(self, max_messages: int, timeout: float) -> list[Message]:
        while True:
            local = self._local
            if local is not None:
                return local.receive(max_messages, timeout)
            msgs = self._group.receive(self, max_messages, timeout)
            if msgs is not None:
                return msgs

    def ack_async(self, msgs: Iterable[Message], commit_here: bool = False) -> WriteHandle | None:
        local = self._local
        if local is not None:
            return local.ack_async(msgs, commit_here)
        return self._group.ack(self, list(msgs), commit_here)

    def ack_through(self, partition: int, seq: int) -> WriteHandle | None:
        local = self._local
        if local is not None:
            return local.ack_through(partition, seq)
        return self._group.ack_through(self, partition, seq)

    def nack(self, msg: Message, delay: float | None = None) -> list[int]:
        local = self._local
        if local is not None:
            return local.nack(msg, delay)
        return self._group.nack(self, msg, delay)

    def reject(self, msg: Message) -> None:
        local = self._local
        if local is not None:
            return local.reject(msg)
        self._group.reject(self, msg)

    def unbind(self) -> None:
        local = self._local
        if local is not None:
            return local.unbind()
        self._group.unbind(self)

    def partitions(self) -> frozenset[int]:
        local = self._local
        if local is not None:
            return local.partitions()
        return self._group.partitions(self)

    def events(self) -> list[FlowChangeUpdate]:
        local = self._local
        if local is not None:
            return local.events()
        with self._events_lock:
            out = list(self._events)
            self._events.clear()
            return out

    def unacked(self) -> int:
        local = self._local
        return local.unacked() if local is not None else self._inflight

    def closed(self) -> bool:
        local = self._local
        return local.closed() if local is not None else self._reason is not None

    def closed_reason(self) -> str | None:
        local = self._local
        return local.closed_reason() if local is not None else self._reason

    def on_change(self, callback: Callable[[FlowChangeUpdate], None] | None) -> None:
        self._callback = callback
        local = self._local
        if local is not None:
            local.on_change(callback)

    # state transitions (under the PeerQueue's lock) ----------------------------
    @property
    def bound(self) -> bool:
        """Not unbound yet (by the application, the owner, or this process's close)."""
        return self._reason is None

    @property
    def handed_over(self) -> bool:
        """This process took delivery over: the flow lives in its own delivery now."""
        return self._local is not None

    def hint(self) -> list[int] | None:
        """The partitions it last held, to present when it is bound again (rule `bind-hint`)."""
        return sorted(self._held) or None

    def held(self, partitions: frozenset[int]) -> None:
        """The owner's stored assignment gives it ``partitions`` now."""
        if self._reason is None:
            self._held = partitions

    def changed(self, update: FlowChangeUpdate) -> None:
        """The owner pushed a FlowChangeUpdate."""
        with self._events_lock:
            self._events.append(update)
        callback = self._callback
        if callback is not None:
            callback(update)

    def close(self, reason: str) -> None:
        """It is unbound (the first reason stays): it holds nothing, nothing is in flight."""
        if self._reason is None:
            self._reason = reason
        self._forget_cursors()

    def rebound(self, flow_id: str) -> None:
        """A new owner bound it again under ``flow_id``: under the new epochs its partitions
        are delivered again from their ack floors."""
        self._flow_id = flow_id
        self._forget_cursors()

    def hand_over(self, local: FlowEndpoint) -> bool:
        """This process took delivery over and bound the flow in it as ``local``: every call
        goes there from now on. False, changing nothing, when it was unbound meanwhile."""
        if self._reason is not None:
            return False
        if self._callback is not None:
            local.on_change(self._callback)
        self._local = local
        self._forget_cursors()
        return True

    def _forget_cursors(self) -> None:
        self._cursors.clear()
        self._inflight = 0

    def check_receivable(self) -> None:
        """Raise what a receive must raise before anything: ``FlowClosed`` once unbound, else
        the corrupt record an earlier receive met (once)."""
        if self._reason is not None:
            raise FlowClosed(f"flow {self.name or self._flow_id} of queue {self.queue!r} is "
                             f"unbound: {self._reason}; bind again")
        self.raise_pending_error()

    def raise_pending_error(self) -> None:
        err, self.pending_error = self.pending_error, None
        if err is not None:
            raise err

    def sync(self, held: list[tuple[int, int, int]], ack_state: Callable[[int], AckState],
             keyed: bool = False) -> None:
        """Bring its cursors in line with the owner's assignment ``held`` ((slot, partition,
        epoch) it holds): drop those of partitions it lost, holds under a new epoch (delivered
        again from the ack floor) or whose acks failed to commit (``resync``), and start one
        from ``ack_state(partition)`` for each partition it gained. Nothing once unbound."""
        if self._reason is not None:
            return
        now = {sp: epoch for _, sp, epoch in held}
        self._held = frozenset(now)
        resync = set()
        while self._resync:                   # filled by the writer thread (a refused ack)
            resync.add(self._resync.pop())
        delays: dict[int, dict[int, int]] = {}      # nack delays of the cursors dropped
        for sp, cursor in list(self._cursors.items()):
            if now.get(sp) != cursor.epoch or sp in resync:
                self._inflight -= len(cursor.inflight)
                delays[sp] = cursor.ack.delays
                del self._cursors[sp]
        for sp, epoch in now.items():
            if sp not in self._cursors:
                cursor = Cursor(sp, ack_state(sp), epoch, keyed)
                if delays.get(sp):      # its nacks' writes may not be in the state read
                    cursor.ack.delay(list(delays[sp].items()))
                self._cursors[sp] = cursor
        for cursor in self._cursors.values():
            cursor.set_ordering(keyed)

    def take_outside_acks(self, count: int, ack_state: Callable[[int], AckState]) -> None:
        """Acks were written outside delivery (``partq.delivery.outside``) when ``count``
        differs from the count this flow last saw: take its partitions' ack state in again."""
        if count == self._outside:
            return
        self._outside = count
        for sp, cursor in self._cursors.items():
            self._inflight -= len(cursor.take_acks(ack_state(sp)))

    def resync(self, partitions: Iterable[int]) -> None:
        """Acks of ``partitions`` were applied in memory but their write was refused: rebuild
        those cursors from the store before the next use (any thread)."""
        self._resync.update(partitions)

    def credit(self, limit: int) -> int:
        """How many more messages it may have in flight under ``limit`` (rule `max-unacked`)."""
        return limit - self._inflight

    def take(self, reader, qid: int, ready: list[int], want: int, holds: Holds | None,
             handout: Handout) -> list[Message]:
        """Deliver up to ``want`` messages of the ``ready`` partitions (each synced; round-robin,
        one further each time) and count them in flight; what must be durable first goes in
        ``handout``."""
        out: list[Message] = []
        self._rr = (self._rr + 1) % len(ready)
        for sp in ready[self._rr:] + ready[:self._rr]:
            if len(out) >= want:
                break
            cursor = self._cursors[sp]
            cursor.take(reader, qid, self.queue, self, want, out, handout,
                        holds.gate(sp) if holds is not None else None)
            mark = cursor.mark(reader, qid)
            if mark is not None:
                handout.marks[sp] = mark
        for d in handout.dead:
            self._cursors[d.partition].note_dead([d.seq])
        self._inflight += len(out)
        return out

    def untake(self, out: list[Message], handout: Handout) -> None:
        """The write of a receive's handout failed: nothing of it happened. Its cursors are
        rebuilt from the store before the next use."""
        for m in out:
            cursor = self._cursors.get(m.partition)
            if cursor is not None and cursor.inflight.pop(m.seq, None) is not None:
                self._inflight -= 1
        self.resync({m.partition for m in out} | set(handout.marks) | set(handout.counts)
                    | handout.unsettled | {d.partition for d in handout.dead})

    def taken(self, handout: Handout) -> None:
        """A receive's handout is durable: its dead messages are acked."""
        for d in handout.dead:
            cursor = self._cursors.get(d.partition)
            if cursor is not None:
                cursor.ack.add([d.seq])

    def marked_elsewhere(self, seen: dict[int, int]) -> None:
        """Another process stored delivered marks ``seen`` (partition -> mark) since this one's
        read: what it delivers up to them is redelivered."""
        for sp, stored in seen.items():
            cursor = self._cursors.get(sp)
            if cursor is not None:
                cursor.redeliver_upto = max(cursor.redeliver_upto, stored)

    def apply_acks(self, msgs: list[Message], recent_dead: Callable[[int], frozenset[int]]
                   ) -> tuple[dict[int, list[int]], dict[int, int]]:
        """Ack ``msgs`` in memory, all or none: returns the seqs newly acked per partition and
        the epoch it holds each partition under (the write checks it). Raises ``InvalidAck``,
        or ``FlowFenced`` for messages of partitions it does not hold or that died since they
        were handed out (``recent_dead(partition)``: the store's word), changing nothing."""
        fenced = []
        for m in msgs:
            if m.queue != self.queue:
                raise InvalidAck(f"message of queue {m.queue!r} acked on a flow of {self.queue!r}")
            if m.partition not in self._cursors:
                fenced.append(m)
        if fenced:
            raise fenced_error(self.queue, self, fenced, "acked")
        by_sp: dict[int, list[int]] = {}
        epochs: dict[int, int] = {}
        dead = []
        for m in msgs:
            cursor = self._cursors[m.partition]
            if m.seq > cursor.ack.delivered_mark:
                raise InvalidAck(f"{self.queue} partition {m.partition} seq {m.seq} was never "
                                 f"delivered")
            if not cursor.ack.is_acked(m.seq) and m.seq not in cursor.dead:
                by_sp.setdefault(m.partition, []).append(m.seq)
                epochs[m.partition] = cursor.epoch
            elif m.seq in cursor.dead or m.seq in recent_dead(m.partition):
                dead.append(m)
        if dead:
            raise dead_error(self.queue, self, dead)
        for sp, seqs in by_sp.items():
            cursor = self._cursors[sp]
            cursor.ack.add(seqs)
            for s in seqs:
                if cursor.inflight.pop(s, None) is not None:
                    self._inflight -= 1
        return by_sp, epochs

    def apply_ack_through(self, sp: int, seq: int) -> int:
        """Ack partition ``sp`` up to ``seq`` in memory; returns the epoch it holds ``sp`` under.
        Raises ``FlowFenced`` when it does not hold ``sp``."""
        cursor = self._cursors.get(sp)
        if cursor is None:
            raise fenced_range(self.queue, self, sp, seq)
        cursor.ack.add_through(seq)
        cursor.next = max(cursor.next, seq + 1)
        for s in [s for s in cursor.inflight if s <= seq]:
            del cursor.inflight[s]
            self._inflight -= 1
        return cursor.epoch

    def apply_nack(self, msg: Message, delay: float, now: float,
                   until_ns: int = 0) -> tuple[Cursor, int, list[int]] | None:
        """Give ``msg`` and every later message of its partition in flight back, to be delivered
        again in order, marked, after ``delay`` seconds (``Cursor.give_back``; ``until_ns``, the
        delay's end on the wall clock, is kept in the cursor's ack state too, and so by a cursor
        that replaces it: ``sync``). Returns the cursor and the epoch it holds the partition
        under, None when ``msg`` was not in flight to it (nothing changes); raises
        ``FlowFenced`` when it does not hold the partition."""
        cursor = self._cursor_of(msg, "nacked")
        back = cursor.give_back(msg.seq, self._flow_id, delay, now)
        if back is None:
            return None
        if until_ns:
            cursor.ack.delay([(msg.seq, until_ns)])
        self._inflight -= len(back)
        return cursor, cursor.epoch, back

    def apply_reject(self, msg: Message) -> tuple[Cursor, int] | None:
        """Take ``msg`` out of flight to be killed; the cursor and its epoch, None when it was
        not in flight to this flow."""
        cursor = self._cursor_of(msg, "rejected")
        if cursor.inflight.get(msg.seq) != self._flow_id:
            return None
        del cursor.inflight[msg.seq]
        self._inflight -= 1
        cursor.ack.add([msg.seq])
        cursor.note_dead([msg.seq])
        return cursor, cursor.epoch

    def cursor(self, sp: int) -> Cursor | None:
        return self._cursors.get(sp)

    def _cursor_of(self, msg: Message, verb: str) -> Cursor:
        if msg.queue != self.queue:
            raise InvalidAck(f"message of queue {msg.queue!r} {verb} on a flow of {self.queue!r}")
        cursor = self._cursors.get(msg.partition)
        if cursor is None:
            raise fenced_error(self.queue, self, [msg], verb)
        return cursor

    def settle(self, partitions: Iterable[int] | None = None
               ) -> list[tuple[int, int, tuple[int, int, int, list]]]:
        """The flow lets its partitions go (unbind, close; or ``partitions``, paused for a
        handoff): ``(partition, epoch, settle)`` for ``Writer.settle`` per cursor
        (``Cursor.settle_counts``). Each cursor counts as settled from now on: one that
        delivers again (a handoff called off) says so in its next handout."""
        out = []
        for sp, cursor in self._cursors.items():
            if partitions is not None and sp not in partitions:
                continue
            settled = cursor.settle_counts()
            if settled is not None:
                out.append((sp, cursor.epoch, settled))
                cursor.settled = True
        return out

    def holding(self, now: float) -> list[list]:
        """[partition, *what holds messages back on it] for each partition it delivers where
        something does (``held_view.peer_holds``): what the owner's status shows."""
        return [[sp, *h] for sp, c in self._cursors.items()
                if (h := peer_holds(c, now)) is not None]

    def outstanding(self) -> list[list[int]]:
        """[partition, messages in flight] for each partition it delivers: what the owner
        waits for in a handoff."""
        return [[sp, len(c.inflight)] for sp, c in self._cursors.items()]
