"""Peer flows: flows of a queue whose delivery another process of the host owns (rule `peer-flows`).

Such a flow reads and acks its partitions in LMDB itself, from its own process (LMDB allows
readers in many processes and serialises writers): consumption scales past one process. The
owner coordinates over the control channel (``control``): it runs the rebalancer and persists
its state (assignments, pauses, epochs) with every change; a peer reads that state from
the store before each receive, delivers only the partitions assigned to its flow and not paused
for a handoff, and reports back what it holds unacked so that a handoff can complete.

Fencing (rule `fencing`): an ack is written in this process's own write transaction, which first reads
the owner's persisted state and refuses (``FlowFenced``, nothing written) unless the flow still
holds the partition, is bound, and holds it under the epoch the message was delivered in.

Failover (rule `owner-takeover`): when the owner's connection closes (it closed or died), this process takes
the queue's delivery lock if it is free and binds its flows locally, or else connects to whoever took
it; either way each flow presents its partition set as its hint (and its name), so within the
rebalance delay no partition moves.
"""
from __future__ import annotations

import logging
import threading
import time

from partq import errors
from partq.config import QueueConfig, redelivery_wait
from partq.delivery.cursor import flag_redelivered
from partq.delivery.dead_letter import dead_op, recent_dead_of, rejected
from partq.delivery.flow_state import fenced_error, fenced_range
from partq.delivery.handout import Handout
from partq.delivery.holds import Holds, read_cutover
from partq.delivery.outside import outside_count
from partq.delivery.peers.link import OwnerLink
from partq.delivery.peers.peer_flow import PeerFlow
from partq.delivery.saved_state import Assignment
from partq.errors import DeliveryLocked, FlowClosed, PartqError
from partq.message import FlowChangeUpdate, Message
from partq.pending import WriteHandle

log = logging.getLogger("partq.delivery")

FAILOVER_BACKOFF = (0.01, 0.5)


class PeerQueue:
    """This process's flows of one queue delivered by another process, and the control
    connection they share."""

    def __init__(self, dispatcher, queue: str, qid: int) -> None:
        self.dispatcher = dispatcher
        self.store = dispatcher.store
        self.queue = queue
        self.qid = qid
        self.lock = threading.RLock()
        self.flows: dict[str, PeerFlow] = {}
        self._assignment: tuple[bytes | None, bytes | None, Assignment] | None = None
        self._reports: list = []            # (pending ack or None, flow) to report once done
        self._seen_version = -1             # the store's version when pauses were last looked at
        self._closing = False
        self._link = self._connect()

    def _connect(self) -> OwnerLink:
        return OwnerLink(self.store.path, self.queue, self.qid, self._pushed, self._lost,
                         self._due_reports)

    def _pushed(self, frame: dict) -> None:
        """The owner pushed a FlowChangeUpdate or the closing of a flow."""
        op = frame.get("op")
        with self.lock:
            flow = self.flows.get(str(frame.get("flow")))
            if flow is None:
                return
            if op == "event":
                flow.changed(FlowChangeUpdate(bool(frame.get("active")),
                                              frozenset(frame.get("partitions", ()))))
            elif op == "closed":
                flow.close(str(frame.get("reason", "unbound by the delivery owner")))
                self.flows.pop(flow.flow_id, None)
        self.dispatcher.notify()

    def _due_reports(self) -> list[dict]:
        """The unacked counts of flows that received, whose acks committed, or that nacked, or
        that have partitions newly paused for a handoff (a handoff waits for a count made
        after the flow saw the pause, whether or not it receives); the owner's queue status
        shows them."""
        self._unbind_hung()
        with self.lock:
            self._note_pauses()
            done = {id(f): f for p, f in self._reports if p is None or p.done()}
            self._reports = [(p, f) for p, f in self._reports if not (p is None or p.done())]
            return [{"op": "outstanding", "flow": f.flow_id, "counts": f.outstanding(),
                     "paused": sorted(f.seen_paused)} for f in done.values()]

    def _note_pauses(self) -> None:
        """Under the lock (no receive of this process takes meanwhile): when the store changed,
        read the assignment again and report the flows whose paused partitions changed."""
        if self._closing or not self.flows:
            return
        try:
            version = self.store.version()
            if version == self._seen_version:
                return
            self._seen_version = version
            with self.store.read() as r:
                assignment = self._read_assignment(r)
        except Exception:   # the store closing, the queue deleted: the link thread
            return          # must go on (beats); the flows' own receives say what happened
        for flow in self.flows.values():
            self._see_pauses(flow, assignment)

    def _see_pauses(self, flow: PeerFlow, assignment: Assignment) -> frozenset[int]:
        """Under the lock: ``flow``'s partitions paused for a handoff in ``assignment``; when
        they changed, its next report says so (the owner waits for a count made after the
        flow saw the pause)."""
        paused = frozenset(self._paused(flow, assignment))
        if paused != flow.seen_paused:
            flow.seen_paused = paused
            self._reports.append((None, flow))
        return paused

    def _unbind_hung(self) -> None:
        """Unbind this process's flows whose handler hangs (rule `max-poll-interval`), each in
        a thread of its own: unbinding asks the owner over this link."""
        cached = self._assignment
        interval = cached[2].config.max_poll_interval if cached is not None else 0.0
        if not interval:
            return
        now = self.dispatcher.clock.now()
        with self.lock:
            hung = [(f, reason) for f in self.flows.values() if f.bound
                    and (reason := f.poll.hung(now, interval, f.unacked())) is not None]
            for flow, _ in hung:
                flow.poll.receiving += 1          # not again while it is being unbound
        for flow, reason in hung:
            log.warning("queue %r: flow %s unbound: %s", self.queue, flow.name or flow.flow_id,
                        reason)
            threading.Thread(target=self.unbind, args=(flow, f"unbound by the broker: {reason}"),
                             name="partq-unbind-hung", daemon=True).start()

    def _lost(self) -> None:
        """The owner's connection closed: take delivery over or follow the new owner."""
        with self.lock:
            if self._closing:
                return
            flows = [f for f in self.flows.values() if f.bound]
        log.info("the delivery owner of queue %r is gone; %d flow(s) of this process fail over",
                 self.queue, len(flows))
        threading.Thread(target=self._failover, args=(flows,), name="partq-failover",
                         daemon=True).start()

    def _failover(self, flows: list[PeerFlow]) -> None:
        delay = FAILOVER_BACKOFF[0]
        while not self._closing:
            try:
                if self.dispatcher.take_over(self.queue):
                    self.dispatcher.forget_peer_queue(self.queue, self)
                    for flow in flows:
                        self._to_local(flow)
                    return
                self._link = self._connect()
                for flow in flows:
                    self._rebind(flow)
                return
            except (DeliveryLocked, errors.OwnerLost):
                pass            # the new owner is not answering yet, or the old one's lock is
                                # not released yet
            except errors.QueueNotFound:
                with self.lock:
                    for flow in flows:
                        flow.close(f"queue {self.queue!r} was deleted")
                self.dispatcher.forget_peer_queue(self.queue, self)
                self.dispatcher.notify()
                return
            except PartqError as exc:
                log.warning("failover of queue %r: %s; retrying", self.queue, exc)
            time.sleep(delay)
            delay = min(delay * 2, FAILOVER_BACKOFF[1])

    def _to_local(self, flow: PeerFlow) -> None:
        if not flow.bound:
            return              # the application unbound it while the owner was gone
        endpoint = self.dispatcher.bind_local(self.queue, flow.name, flow.hint(),
                                              flow.skip_corrupt)
        with self.lock:
            if not flow.hand_over(endpoint):    # ... or while it was being bound again here
                endpoint.unbind()
                return
        self.dispatcher.notify()

    def _rebind(self, flow: PeerFlow) -> None:
        if not flow.bound:
            return              # the application unbound it while the owner was gone
        reply = self._link.request({"op": "bind", "name": flow.name, "hint": flow.hint(),
                                    "skip_corrupt": flow.skip_corrupt})
        with self.lock:
            gone = not flow.bound       # ... or while it was being bound again
            if not gone:
                self.flows.pop(flow.flow_id, None)
                flow.rebound(str(reply["flow"]))
                self.flows[flow.flow_id] = flow
        if gone:
            try:
                self._link.send({"op": "unbind", "req": 0, "flow": str(reply["flow"])})
            except OSError:
                pass            # the owner went again: its successor drops it as a ghost
        self.dispatcher.notify()

    # ------------------------------------------------------------------ flows
    def now(self) -> float:
        return self.dispatcher.clock.now()

    def bind(self, name: str | None, hint: list[int] | None, skip_corrupt: bool) -> PeerFlow:
        reply = self._link.request({"op": "bind", "name": name, "hint": hint,
                               "skip_corrupt": skip_corrupt})
        flow = PeerFlow(self, self.queue, str(reply["flow"]), name, skip_corrupt)
        with self.lock:
            self.flows[flow.flow_id] = flow
        self.partitions(flow)                   # noted as its hint
        return flow

    def unbind(self, flow: PeerFlow, reason: str = "unbound by the application") -> None:
        with self.lock:
            if not flow.bound:
                return
        self._settle([flow])
        with self.lock:
            if not flow.bound:
                return
            flow.close(reason)
            self.flows.pop(flow.flow_id, None)
        try:
            self._link.request({"op": "unbind", "flow": flow.flow_id})
        except DeliveryLocked:
            pass        # the owner is gone: its successor sees this flow as a ghost
        self.dispatcher.notify()

    def partitions(self, flow: PeerFlow) -> frozenset[int]:
        with self.store.read() as r:
            assignment = self._read_assignment(r)
        with self.lock:
            held = frozenset(sp for _, sp, _ in assignment.held_by(flow.flow_id))
            flow.held(held)
            return held

    def _read_assignment(self, r) -> Assignment:
        """The owner's assignment in read snapshot ``r`` (decoded again only when it changed)."""
        config_raw, blob = r.queue_raw(self.queue), r.state(self.qid)
        cached = self._assignment
        if cached is not None and cached[0] == config_raw and cached[1] == blob:
            return cached[2]
        if config_raw is None:
            raise FlowClosed(f"queue {self.queue!r} was deleted; bind again once it exists")
        config = QueueConfig.from_dict(r.queue(self.queue))
        if config.qid != self.qid:
            raise FlowClosed(f"queue {self.queue!r} was deleted and created again; bind again")
        assignment = Assignment(config, blob)
        self._assignment = (config_raw, blob, assignment)
        return assignment

    def receive(self, flow: PeerFlow, max_messages: int, timeout: float) -> list[Message] | None:
        """Messages for ``flow``, waiting up to ``timeout`` s; None when it was handed over to
        this process's own delivery meanwhile."""
        clock, poll = self.dispatcher.clock, flow.poll
        poll.touch(clock.now())
        poll.receiving += 1
        try:
            msgs = self.dispatcher.wait_for_messages(lambda n: self._collect(flow, n),
                                                     max_messages, timeout)
        finally:
            poll.receiving -= 1
            poll.touch(clock.now())
        if msgs:
            self.dispatcher.tally.delivered(self.queue, msgs)
        return msgs

    def _collect(self, flow: PeerFlow, max_messages: int) -> list[Message] | None:
        """Take up to ``max_messages`` for ``flow`` from the partitions the owner assigned it
        (not paused), after bringing its cursors in line with the assignment."""
        with self.lock:
            if flow.handed_over:
                return None
            flow.check_receivable()
            with self.store.read() as r:
                assignment = self._sync(flow, r)
                handing_off = flow.settle(self._see_pauses(flow, assignment))
                config = assignment.config
                if handing_off:
                    self._write_settles([(flow, *s) for s in handing_off])
                want = min(max_messages, flow.credit(config.max_delivered_unacked_per_flow))
                if not config.egress_enabled or want <= 0:
                    return []
                held = {sp: epoch for slot, sp, epoch in assignment.held_by(flow.flow_id)
                        if slot not in assignment.paused}
                if not held:
                    return []
                cutover = read_cutover(r, self.qid)
                holds = Holds(cutover, r, self.qid) if cutover is not None else None
                clock = self.dispatcher.clock
                handout = Handout(config, clock.now(), clock.wall_ns())
                out = flow.take(r, self.qid, sorted(held), want, holds, handout)
            if handout.wake is not None:
                self.dispatcher.wake_at(handout.wake)
            if not out:
                flow.raise_pending_error()
        if not handout.empty():
            seen: dict[int, int] = {}         # marks another process wrote since the read
            writes = handout.ops(self.queue, self.qid, seen,
                                 lambda w, sp: self._holds(w, flow, sp, held[sp]))
            try:
                self.store.write(lambda w: [write(w) for write in writes])
            except BaseException:
                with self.lock:
                    flow.untake(out, handout)
                raise
            with self.lock:
                flow.taken(handout)
                if seen:
                    flow.marked_elsewhere(seen)
            if seen:
                out = flag_redelivered(out, seen)
        if out:
            with self.lock:       # the owner shows what this flow holds (queue status)
                self._reports.append((None, flow))
        return out

    @staticmethod
    def _paused(flow: PeerFlow, assignment: Assignment) -> list[int]:
        """The partitions ``flow`` holds that are paused for a handoff."""
        return [sp for slot, sp, _ in assignment.held_by(flow.flow_id) if slot in assignment.paused]

    def _sync(self, flow: PeerFlow, r) -> Assignment:
        """The owner's assignment in read snapshot ``r``, with ``flow``'s cursors brought in
        line with it (under the lock)."""
        assignment = self._read_assignment(r)
        qid = self.qid
        flow.sync(assignment.held_by(flow.flow_id), lambda sp: r.ack_state(qid, sp),
                  assignment.config.ordering == "key")
        flow.take_outside_acks(outside_count(r, qid), lambda sp: r.ack_state(qid, sp))
        return assignment

    def ack(self, flow: PeerFlow, msgs: list[Message]) -> WriteHandle | None:
        """Apply acks in memory and queue their write, fenced in the write transaction.

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
            assignment = Assignment(QueueConfig.from_dict(w.queue(name)), w.state(qid)) \
                if w.queue_raw(name) is not None else None
            lost = [by_msg[(sp, s)] for sp, seqs in by_sp.items() for s in seqs
                    if assignment is None or not assignment.holds(flow_id, sp, epochs[sp])]
            if lost:
                flow.resync(by_sp)            # the in-memory acks of the batch did not commit
                raise fenced_error(name, flow, lost, "acked")
            for sp, seqs in by_sp.items():
                w.ack(qid, sp, seqs)
            self._settle_op(w, [(flow, *s) for s in handing_off])
        return self._submit_reported(flow, op)

    def ack_through(self, flow: PeerFlow, sp: int, seq: int) -> WriteHandle | None:
        """Ack every message of ``sp`` up to ``seq``, fenced in the write transaction."""
        flow.poll.touch(self.dispatcher.clock.now())
        with self.lock:
            with self.store.read() as r:       # a flow that never received has no cursors yet
                self._sync(flow, r)
            epoch = flow.apply_ack_through(sp, seq)
        qid, name, flow_id = self.qid, self.queue, flow.flow_id

        def op(w):
            raw = w.queue(name)
            if raw is None or not Assignment(QueueConfig.from_dict(raw), w.state(qid)) \
                    .holds(flow_id, sp, epoch):
                flow.resync([sp])
                raise fenced_range(name, flow, sp, seq)
            w.ack_through(qid, sp, seq)
        return self._submit_reported(flow, op)

    def _submit_reported(self, flow: PeerFlow, op) -> WriteHandle:
        """Queue ``op``; once it commits the owner hears what ``flow`` still holds unacked."""
        pending = self.store.submit(op)
        with self.lock:
            self._reports.append((pending, flow))
        self.dispatcher.notify()
        return pending

    def _holds(self, w, flow: PeerFlow, sp: int, epoch: int) -> bool:
        """Whether, in write ``w``, ``flow`` still holds ``sp`` under ``epoch`` (rule
        `fencing`): what it writes for the partition otherwise changes nothing."""
        raw = w.queue(self.queue)
        return raw is not None and raw["qid"] == self.qid and \
            Assignment(QueueConfig.from_dict(raw), w.state(self.qid)).holds(flow.flow_id, sp, epoch)

    def nack(self, flow: PeerFlow, msg: Message, delay: float | None) -> list[int]:
        """Give ``msg`` back (``PeerFlow.apply_nack``) and make its delivery count durable,
        fenced: a flow that lost the partition counts nothing (its next holder does)."""
        clock = self.dispatcher.clock
        flow.poll.touch(clock.now())
        with self.lock:
            with self.store.read() as r:
                config = self._sync(flow, r).config
            cursor = flow.cursor(msg.partition)
            failures = (cursor.ack.failed(msg.seq) if cursor is not None else 0) + 1
            wait = redelivery_wait(config, failures) if delay is None else delay
            taken = flow.apply_nack(msg, wait, clock.now())
            if taken is not None:
                self._reports.append((None, flow))
        self.dispatcher.tally.nacked(self.queue)
        if taken is None:
            return []
        cursor, epoch, back = taken
        counts = cursor.count_lost([msg.seq])
        qid, sp = self.qid, msg.partition

        def op(w):
            if self._holds(w, flow, sp, epoch):
                w.set_failures(qid, sp, counts)
        self.store.write(op)
        if wait > 0:
            self.dispatcher.wake_at(clock.now() + wait)
        self.dispatcher.notify()
        return back

    def reject(self, flow: PeerFlow, msg: Message) -> None:
        """``msg`` is dead at once: acked here and appended to the dead message queue in one
        write, fenced like an ack."""
        flow.poll.touch(self.dispatcher.clock.now())
        with self.lock:
            with self.store.read() as r:
                self._sync(flow, r)
            taken = flow.apply_reject(msg)
        if taken is None:
            return
        cursor, epoch = taken
        dead = [rejected(msg.partition, msg.seq, cursor.ack.failed(msg.seq) + 1)]
        write = dead_op(self.queue, self.qid, dead, self.dispatcher.clock.wall_ns(),
                        lambda w, sp: self._holds(w, flow, sp, epoch))
        self._submit_reported(flow, write).result()

    def _settle(self, flows: list[PeerFlow]) -> None:
        """``flows`` let their partitions go gracefully: make their delivery counts and marks
        exact first (``PeerFlow.settle``), fenced, so the next holder counts only what they
        really delivered. Best effort: a failure leaves the counts as after a crash."""
        with self.lock:
            settles = [(flow, sp, epoch, settled) for flow in flows
                       for sp, epoch, settled in flow.settle()]
        self._write_settles(settles)

    def _write_settles(self, settles: list) -> None:
        if not settles:
            return
        try:
            self.store.write(lambda w: self._settle_op(w, settles))
        except PartqError as exc:
            log.warning("could not settle delivery counts of queue %r: %s", self.queue, exc)

    def _settle_op(self, w, settles: list) -> None:
        """``Writer.settle`` of each ``(flow, partition, epoch, settle)`` the flow still holds
        (fenced: one that lost it changes nothing)."""
        for flow, sp, epoch, (expected, mark, counted, counts) in settles:
            if self._holds(w, flow, sp, epoch):
                w.settle(self.qid, sp, expected, mark, counted, counts)

    def close(self) -> None:
        """This process is closing: its flows end, the owner sees the connection close."""
        with self.lock:
            flows = list(self.flows.values())
        self._settle(flows)
        with self.lock:
            self._closing = True
            for flow in self.flows.values():
                flow.close("the broker was closed")
            self.flows.clear()
        self._link.close()

    def view(self) -> dict | None:
        """The owner's live view of the queue (None when it does not answer)."""
        try:
            return self._link.request({"op": "view"}).get("view")
        except PartqError:
            return None
