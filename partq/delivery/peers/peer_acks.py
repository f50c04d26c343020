"""The writes of flows of a queue another process delivers (``PeerQueue``'s acks, nacks,
rejects and settles), each in this process's own write transaction and fenced there (rule
`fencing`): it reads the owner's persisted state first and changes nothing unless the flow
still holds the partition under the epoch its messages were delivered in. ``PeerQueue``
provides the lock, the store and the assignment reads (declared here).

Why not send the acks to the owner, to commit with its own (so that a consumer process never
holds LMDB's write lock)? Tried: an ack's write (ack state, truncating the log) is CPU work,
and in the owner's one GIL it was the bound: two consumer processes went from 1.41x one
process to 1.02x, the owner's commits merged 1.1 ack batches on average, and the peer's ack
took 1.75 ms instead of 0.78 ms."""
from __future__ import annotations

import logging
import threading
from typing import Any

from partq.config import QueueConfig, redelivery_wait
from partq.delivery.dead_letter import dead_op, recent_dead_of, rejected
from partq.delivery.flow_state import dead_error, fenced_error, fenced_range
from partq.delivery.peers.peer_flow import PeerFlow
from partq.delivery.saved_state import Assignment
from partq.delivery.txn_parts import Entry, TxnPart, unacked_check
from partq.errors import InvalidAck, PartqError
from partq.message import Message
from partq.pending import WriteHandle, add_done_callback

log = logging.getLogger("partq.delivery")


class PeerAcks:
    """The flows' writes, prepared under the lock, written outside it."""

    dispatcher: Any
    store: Any
    queue: str
    qid: int
    lock: threading.RLock
    _reports: list

    def _sync(self, flow: PeerFlow, r) -> Assignment:
        raise NotImplementedError

    @staticmethod
    def _paused(flow: PeerFlow, assignment: Assignment) -> list[int]:
        raise NotImplementedError

    def ack(self, flow: PeerFlow, msgs: list[Message],
            commit_here: bool = False) -> WriteHandle | None:
        """Apply acks in memory and queue their write, fenced in the write transaction
        (``commit_here``: the caller waits; an idle writer means this thread commits).

        The assignment is read again first, so an ack of a partition that moved since the last
        receive is fenced before anything changes. If it moves between that read and the
        commit, the write is refused whole (nothing acked, as on the owner) and the cursors of
        the batch are marked for a resync from the durable state: the in-memory acks that did
        not commit are forgotten and those messages delivered again."""
        flow.poll.touch(self.dispatcher.clock.now())
        with self.lock:
            with self.store.read() as r:
                assignment = self._sync(flow, r)
                by_sp, epochs = flow.apply_acks(msgs, recent_dead_of(r, self.qid))
            # a partition paused for a handoff settles with the acks that may end it
            handing_off = flow.settle(self._paused(flow, assignment))
        if not by_sp:
            if handing_off:
                self._write_settles([(flow, *s) for s in handing_off])
            return None
        qid, name, flow_id = self.qid, self.queue, flow.flow_id
        by_msg = {(m.partition, m.seq): m for m in msgs}

        def op(w):
            assignment = self._assignment_in(w)
            lost = [by_msg[(sp, s)] for sp, seqs in by_sp.items() for s in seqs
                    if assignment is None or not assignment.holds(flow_id, sp, *epochs[sp])]
            if lost:
                flow.resync(by_sp)            # the in-memory acks of the batch did not commit
                raise fenced_error(name, flow, lost, "acked")
            for sp, seqs in by_sp.items():
                w.ack(qid, sp, seqs)
            self._settle_op(w, [(flow, *s) for s in handing_off])
        return self._submit_reported(flow, op, commit_here)

    def transaction_part(self, flow: PeerFlow, entries: list[Entry]) -> TxnPart:
        """The part of a transaction (``partq.delivery.txn_parts``) of ``flow``'s ``entries``,
        each fenced in the write by the epoch its partition is held under; memory changes
        only once the write committed, so a refused or failed transaction leaves the messages
        in flight to the flow. Raises ``FlowFenced`` or ``InvalidAck`` at once for what memory
        refuses already."""
        clock = self.dispatcher.clock
        flow.poll.touch(clock.now())
        part = TxnPart()
        qid, name, fid = self.qid, self.queue, flow.flow_id
        with self.lock:
            with self.store.read() as r:
                assignment = self._sync(flow, r)
            fenced: dict[str, list[Message]] = {}
            for e in entries:
                if e.msg.queue != name:
                    raise InvalidAck(f"message of queue {e.msg.queue!r} {e.verb} on a flow of "
                                     f"{name!r}")
                cursor = None if not flow.bound else flow.cursor(e.msg.partition)
                if cursor is None or cursor.inflight.get(e.msg.seq) != fid:
                    fenced.setdefault(e.verb, []).append(e.msg)
                elif e.msg.seq in cursor.dead:
                    fenced.setdefault("died", []).append(e.msg)
            for verb, msgs in fenced.items():
                raise dead_error(name, flow, msgs) if verb == "died" else \
                    fenced_error(name, flow, msgs, verb)
            for e in entries:
                cursor = flow.cursor(e.msg.partition)
                assert cursor is not None            # in flight to it: checked
                sp, fence = e.msg.partition, flow.fence(cursor)
                part.checks.append(unacked_check(name, qid, flow, sp, [e.msg], e.verb,
                                                 self._holder(flow, sp, fence)))
                if e.verb == "acked":
                    part.writes.append(lambda w, sp=sp, seq=e.msg.seq: w.ack(qid, sp, [seq]))
                elif e.verb == "rejected":
                    dead = [rejected(sp, e.msg.seq, cursor.ack.failed(e.msg.seq) + 1)]
                    part.writes.append(dead_op(name, qid, dead, clock.wall_ns()))
                else:
                    self._nack_part(part, flow, e, assignment.config)
        acks = [e.msg for e in entries if e.verb == "acked"]
        rejects = [e.msg for e in entries if e.verb == "rejected"]
        part.after.insert(0, lambda: self._after_transaction(flow, acks, rejects))
        return part

    def _holder(self, flow: PeerFlow, sp: int, fence: tuple[int, bool]):
        return lambda w: self._holds(w, flow, sp, fence)

    def _nack_part(self, part: TxnPart, flow: PeerFlow, entry: Entry, config: QueueConfig) -> None:
        clock, msg, delay = self.dispatcher.clock, entry.msg, entry.delay
        cursor = flow.cursor(msg.partition)
        assert cursor is not None          # in flight to it: checked
        failures = cursor.ack.failed(msg.seq) + 1
        wait = redelivery_wait(config, failures) if delay is None else delay
        until = clock.wall_ns() + int(wait * 1e9) if wait > 0 else 0
        qid, sp = self.qid, msg.partition

        def write(w) -> None:
            w.set_failures(qid, sp, [(msg.seq, failures)])
            if until:
                w.set_delays(qid, sp, [(msg.seq, until)])
        part.writes.append(write)

        def after() -> list:
            with self.lock:
                try:
                    taken = flow.apply_nack(msg, wait, clock.now(), until)
                    if taken is not None:
                        taken[0].count_lost([msg.seq])      # its count, as committed
                        entry.back = taken[2]
                except PartqError:
                    pass                  # moved since the commit: its next holder has it
            if wait > 0:
                self.dispatcher.wake_at(clock.now() + wait)
            return []
        part.after.append(after)

    def _after_transaction(self, flow: PeerFlow, acks: list[Message],
                           rejects: list[Message]) -> list:
        """A transaction with ``flow``'s ``acks`` and ``rejects`` committed: take them in memory
        (a partition that moved since is read again from the store by its next holder), and
        the owner hears what the flow still holds."""
        with self.lock:
            try:
                with self.store.read() as r:
                    if acks:
                        flow.apply_acks(acks, recent_dead_of(r, self.qid))
                for m in rejects:
                    flow.apply_reject(m)
            except PartqError:
                pass
            self._reports.append((None, flow))
        self.dispatcher.notify()
        return []

    def ack_through(self, flow: PeerFlow, sp: int, seq: int) -> WriteHandle | None:
        """Ack every message of ``sp`` up to ``seq``, fenced in the write transaction."""
        flow.poll.touch(self.dispatcher.clock.now())
        with self.lock:
            with self.store.read() as r:       # a flow that never received has no cursors yet
                self._sync(flow, r)
            epoch = flow.apply_ack_through(sp, seq)
        qid, name = self.qid, self.queue

        def op(w):
            if not self._holds(w, flow, sp, (epoch, False)):
                flow.resync([sp])
                raise fenced_range(name, flow, sp, seq)
            w.ack_through(qid, sp, seq)
        return self._submit_reported(flow, op)

    def _submit_reported(self, flow: PeerFlow, op, commit_here: bool = False) -> WriteHandle:
        """Queue ``op`` (or commit it here: ``Store.submit``'s ``wait``); once it commits the
        owner hears what ``flow`` still holds unacked."""
        pending = self.store.submit(op, commit_here)
        with self.lock:
            self._reports.append((pending, flow))
        self.dispatcher.notify()
        return pending

    def _holds(self, w, flow: PeerFlow, sp: int, fence: tuple[int, bool]) -> bool:
        """Whether, in write ``w``, ``flow`` still holds ``sp`` under ``fence`` (its epoch, and
        whether it took from ``sp`` as its handoff's target: ``PeerFlow.fence``; rule
        `fencing`): what it writes for the partition otherwise changes nothing."""
        assignment = self._assignment_in(w)
        return assignment is not None and assignment.holds(flow.flow_id, sp, *fence)

    def _assignment_in(self, w) -> Assignment | None:
        """The owner's assignment of this queue in write ``w``; None once the queue is gone
        (deleted, or deleted and created again under its name: another qid)."""
        raw = w.queue(self.queue)
        if raw is None or raw["qid"] != self.qid:
            return None
        return Assignment(QueueConfig.from_dict(raw), w.state(self.qid))

    def nack(self, flow: PeerFlow, msg: Message, delay: float | None) -> list[int]:
        """Give ``msg`` back (``PeerFlow.apply_nack``) and make its delivery count and delay
        durable, fenced: a flow that lost the partition counts nothing (its next holder does)."""
        clock = self.dispatcher.clock
        flow.poll.touch(clock.now())
        with self.lock:
            with self.store.read() as r:
                config = self._sync(flow, r).config
            cursor = flow.cursor(msg.partition)
            failures = (cursor.ack.failed(msg.seq) if cursor is not None else 0) + 1
            wait = redelivery_wait(config, failures) if delay is None else delay
            until = clock.wall_ns() + int(wait * 1e9) if wait > 0 else 0
            taken = flow.apply_nack(msg, wait, clock.now(), until)
            if taken is not None:
                self._reports.append((None, flow))
        self.dispatcher.tally.nacked(self.queue)
        if taken is None:
            return []
        cursor, fence, back = taken
        counts = cursor.count_lost([msg.seq])
        qid, sp = self.qid, msg.partition

        def op(w):
            if self._holds(w, flow, sp, fence):
                w.set_failures(qid, sp, counts)
            if until:       # not fenced: the consumer's delay holds wherever the message goes
                w.set_delays(qid, sp, [(msg.seq, until)])   # next (its new holder's cursor
        self.store.write(op)                                 # is read from the store)
        if wait > 0:
            self.dispatcher.wake_at(clock.now() + wait)
        self.dispatcher.notify()
        return back

    def reject(self, flow: PeerFlow, msg: Message, headers: dict | None = None) -> None:
        """``msg`` is dead at once: acked here and appended to the dead message queue in one
        write, fenced like an ack."""
        flow.poll.touch(self.dispatcher.clock.now())
        with self.lock:
            with self.store.read() as r:
                self._sync(flow, r)
            taken = flow.apply_reject(msg)
        if taken is None:
            return
        cursor, fence = taken
        dead = [rejected(msg.partition, msg.seq, cursor.ack.failed(msg.seq) + 1, headers)]
        write = dead_op(self.queue, self.qid, dead, self.dispatcher.clock.wall_ns(),
                        lambda w, sp: self._holds(w, flow, sp, fence))
        self._submit_reported(flow, write).result()

    def _settle(self, flows: list[PeerFlow]) -> None:
        """``flows`` let their partitions go gracefully: make their delivery counts and marks
        exact first (``PeerFlow.settle``), fenced, so the next holder counts only what they
        really delivered. Best effort: a failure leaves the counts as after a crash."""
        with self.lock:
            settles = [(flow, sp, fence, settled) for flow in flows
                       for sp, fence, settled in flow.settle()]
        self._write_settles(settles)

    def _write_settles(self, settles: list) -> None:
        if not settles:
            return
        try:
            self.store.write(lambda w: self._settle_op(w, settles))
        except PartqError as exc:
            self._settle_failed(exc)

    def _queue_settles(self, settles: list) -> None:
        """``_write_settles`` without waiting for the write (a failure is logged when it
        comes)."""
        if not settles:
            return
        try:
            pending = self.store.submit(lambda w: self._settle_op(w, settles))
        except PartqError as exc:
            self._settle_failed(exc)
            return

        def logged() -> None:
            try:
                pending.result()        # done: does not wait
            except PartqError as exc:
                self._settle_failed(exc)
        add_done_callback(pending, logged)

    def _settle_failed(self, exc: PartqError) -> None:
        """A settle is best effort: one that failed leaves the counts as after a crash."""
        log.warning("could not settle delivery counts of queue %r: %s", self.queue, exc)

    def _settle_op(self, w, settles: list) -> None:
        """``Writer.settle`` of each ``(flow, partition, fence, settle)`` the flow still holds
        (fenced: one that lost it changes nothing)."""
        for flow, sp, fence, (expected, mark, counted, counts) in settles:
            if self._holds(w, flow, sp, fence):
                w.settle(self.qid, sp, expected, mark, counted, counts)
