"""The cursors of one flow of a queue whose delivery another process owns (``PeerFlow``), and
the steps that change them, each called by ``PeerQueue`` under its lock: brought in line with
the owner's stored assignment (``sync``), taken from (``take``), acked, nacked and rejected in
memory before the write that makes it durable (``apply_*``), settled when the flow lets a
partition go. Under ``ordering="key"`` it also takes from the partitions handed off to it
before their handoffs end (``peer_handoff``)."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from partq.delivery.cursor import Cursor
from partq.delivery.flow_state import dead_error, fenced_error, fenced_range
from partq.delivery.held_view import peer_holds
from partq.delivery.peers.peer_handoff import stored_draining_hold
from partq.errors import InvalidAck
from partq.message import Message

if TYPE_CHECKING:
    from partq.delivery.handout import Handout
    from partq.delivery.holds import Holds
    from partq.storage.encoding import AckState


class PeerCursors:
    """Per partition it delivers (or takes from early), a ``Cursor``; what ``PeerFlow`` adds:
    its queue, id, name and why it was unbound (declared here)."""

    queue: str
    name: str | None
    _flow_id: str
    _reason: str | None

    def __init__(self) -> None:
        self._cursors: dict[int, Cursor] = {}
        self._resync: set[int] = set()   # partitions whose cursor must be rebuilt from the store
        self._inflight = 0
        self._rr = 0
        self._held: frozenset[int] = frozenset()      # what it last held: its hint
        self._outside = -1          # the count of acks written outside delivery it last saw

    def _forget_cursors(self) -> None:
        self._cursors.clear()
        self._inflight = 0

    def sync(self, held: list[tuple[int, int, int]], ack_state: Callable[[int], AckState],
             keyed: bool = False, early: Iterable[tuple[int, int, int]] = (),
             draining: Callable[[int], tuple[AckState, dict] | None] | None = None,
             paused: Iterable[int] = ()) -> None:
        """Bring its cursors in line with the owner's assignment ``held`` ((slot, partition,
        epoch) it holds): drop those of partitions it lost, holds under a new epoch (delivered
        again from the ack floor) or whose acks failed to commit (``resync``), and start one
        from ``ack_state(partition)`` for each partition it gained. Under "key", ``early``: the
        partitions handed off to it, which it takes from once ``draining(partition)`` says what
        their sources hold (``peer_handoff``); when such a handoff ends with the partition its
        own, the cursor goes on under the new epoch. A cursor it settled for a handoff that
        was called off (no longer ``paused``) takes in what the handoff's target delivered.
        Nothing once unbound."""
        if self._reason is not None:
            return
        now = {sp: epoch for _, sp, epoch in held}
        early_now = {sp: epoch for _, sp, epoch in early}
        self._held = frozenset(now)
        resync = set()
        while self._resync:                   # filled by the writer thread (a refused ack)
            resync.add(self._resync.pop())
        delays: dict[int, dict[int, int]] = {}      # nack delays of the cursors dropped
        for sp, cursor in list(self._cursors.items()):
            if cursor.draining is not None and sp not in resync:
                if early_now.get(sp) == cursor.epoch:
                    continue                        # its handoff goes on
                if now.get(sp) == cursor.epoch + 1:
                    cursor.epoch += 1               # it ended: the partition is its own
                    cursor.merge_acks(ack_state(sp))    # with its source's last acks
                    cursor.draining = None
                    continue
            if now.get(sp) != cursor.epoch or sp in resync:
                self._inflight -= len(cursor.inflight)
                delays[sp] = cursor.ack.delays
                del self._cursors[sp]
            elif cursor.settled and sp not in paused and \
                    (stored := ack_state(sp)).delivered_mark > cursor.ack.delivered_mark:
                cursor.refresh(stored)
        for sp, epoch in now.items():
            if sp not in self._cursors:
                cursor = Cursor(sp, ack_state(sp), epoch, keyed)
                if delays.get(sp):      # its nacks' writes may not be in the state read
                    cursor.ack.delay(list(delays[sp].items()))
                self._cursors[sp] = cursor
        for sp, epoch in early_now.items():
            if sp not in self._cursors and draining is not None:
                found = draining(sp)
                if found is not None:
                    cursor = self._cursors[sp] = Cursor(sp, found[0], epoch, True)
                    cursor.draining = found[1]
        for cursor in self._cursors.values():
            cursor.set_ordering(keyed)

    def take_outside_acks(self, count: int, ack_state: Callable[[int], AckState]) -> None:
        """Acks were written outside delivery (``partq.delivery.outside``) when ``count``
        differs from the count this flow last saw: take its partitions' ack state in again."""
        if count == self._outside:
            return
        self._outside = count
        for sp, cursor in self._cursors.items():
            self._inflight -= len(cursor.take_acks(ack_state(sp), cursor.draining is not None))

    def resync(self, partitions: Iterable[int]) -> None:
        """Acks of ``partitions`` were applied in memory but their write was refused: rebuild
        those cursors from the store before the next use (any thread)."""
        self._resync.update(partitions)

    def credit(self, limit: int) -> int:
        """How many more messages it may have in flight under ``limit`` (rule `max-unacked`)."""
        return limit - self._inflight

    def early(self) -> dict[int, tuple[int, bool]]:
        """The fence (``fence``) of each partition handed off to it that it takes from."""
        return {sp: (c.epoch, True) for sp, c in self._cursors.items() if c.draining is not None}

    def fence(self, cursor: Cursor) -> tuple[int, bool]:
        """What its writes of ``cursor``'s partition are fenced by: the epoch, and whether it
        takes from the partition as a handoff's target (``Assignment.holds``)."""
        return cursor.epoch, cursor.draining is not None

    def take(self, reader, qid: int, ready: list[int], want: int, holds: Holds | None,
             handout: Handout) -> list[Message]:
        """Deliver up to ``want`` messages of the ``ready`` partitions (each synced; round-robin,
        one further each time) and count them in flight; what must be durable first goes in
        ``handout``. A partition handed off to it takes its source's acks in first, and holds
        back what its source still holds (``peer_handoff``)."""
        out: list[Message] = []
        self._rr = (self._rr + 1) % len(ready)
        for sp in ready[self._rr:] + ready[:self._rr]:
            if len(out) >= want:
                break
            cursor = self._cursors[sp]
            hold = holds.gate(sp) if holds is not None else None
            draining = cursor.draining
            if draining is not None:
                stored = reader.ack_state(qid, sp)
                if stored.delivered_mark > cursor.ack.delivered_mark:
                    self._resync.add(sp)    # delivered by another flow since: not its to take
                    continue
                cursor.merge_acks(stored)
                hold = stored_draining_hold(draining, cursor.ack, hold)
            cursor.take(reader, qid, self.queue, self, want, out, handout, hold)
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
                   ) -> tuple[dict[int, list[int]], dict[int, tuple[int, bool]]]:
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
        epochs: dict[int, tuple[int, bool]] = {}
        dead = []
        for m in msgs:
            cursor = self._cursors[m.partition]
            if m.seq > cursor.ack.delivered_mark:
                raise InvalidAck(f"{self.queue} partition {m.partition} seq {m.seq} was never "
                                 f"delivered")
            if not cursor.ack.is_acked(m.seq) and m.seq not in cursor.dead:
                by_sp.setdefault(m.partition, []).append(m.seq)
                epochs[m.partition] = self.fence(cursor)
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
        Raises ``FlowFenced`` when it does not hold ``sp`` (one handed off to it that it takes
        from already is not its yet: below ``seq`` its source may still hold messages)."""
        cursor = self._cursors.get(sp)
        if cursor is None or cursor.draining is not None:
            raise fenced_range(self.queue, self, sp, seq)
        cursor.ack.add_through(seq)
        cursor.next = max(cursor.next, seq + 1)
        for s in [s for s in cursor.inflight if s <= seq]:
            del cursor.inflight[s]
            self._inflight -= 1
        return cursor.epoch

    def apply_nack(self, msg: Message, delay: float, now: float,
                   until_ns: int = 0) -> tuple[Cursor, tuple[int, bool], list[int]] | None:
        """Give ``msg`` and every later message of its partition in flight back, to be delivered
        again in order, marked, after ``delay`` seconds (``Cursor.give_back``; ``until_ns``, the
        delay's end on the wall clock, is kept in the cursor's ack state too, and so by a cursor
        that replaces it: ``sync``). Returns the cursor and its ``fence``, None when ``msg``
        was not in flight to it (nothing changes); raises ``FlowFenced`` when it does not hold
        the partition."""
        cursor = self._cursor_of(msg, "nacked")
        back = cursor.give_back(msg.seq, self._flow_id, delay, now)
        if back is None:
            return None
        if until_ns:
            cursor.ack.delay([(msg.seq, until_ns)])
        self._inflight -= len(back)
        return cursor, self.fence(cursor), back

    def apply_reject(self, msg: Message) -> tuple[Cursor, tuple[int, bool]] | None:
        """Take ``msg`` out of flight to be killed; the cursor and its ``fence``, None when it was
        not in flight to this flow."""
        cursor = self._cursor_of(msg, "rejected")
        if cursor.inflight.get(msg.seq) != self._flow_id:
            return None
        del cursor.inflight[msg.seq]
        self._inflight -= 1
        cursor.ack.add([msg.seq])
        cursor.note_dead([msg.seq])
        return cursor, self.fence(cursor)

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
               ) -> list[tuple[int, tuple[int, bool], tuple[int, int, int, list]]]:
        """The flow lets its partitions go (unbind, close; or ``partitions``, paused for a
        handoff): ``(partition, fence, settle)`` for ``Writer.settle`` per cursor
        (``Cursor.settle_counts``). Each cursor counts as settled from now on: one that
        delivers again (a handoff called off) says so in its next handout."""
        out = []
        for sp, cursor in self._cursors.items():
            if partitions is not None and sp not in partitions:
                continue
            settled = cursor.settle_counts()
            if settled is not None:
                out.append((sp, self.fence(cursor), settled))
                cursor.ack.delivered_mark, cursor.ack.counted = settled[1], settled[2]
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
