"""Flows of a queue whose delivery another process of the host owns (S29, S30, S33).

Such a flow reads and acks its partitions in LMDB itself, from its own process (LMDB allows
readers in many processes and serialises writers): consumption scales past one process. The
owner coordinates over the control channel (``control``): it runs the rebalancer and persists
its state (assignments, pauses, epochs) with every change; a follower reads that state from
the store before each receive, delivers only the partitions assigned to its flow and not paused
for a handoff, and reports back what it holds unacked so that a handoff can complete.

Fencing (S33): an ack is written in this process's own write transaction, which first reads
the owner's persisted state and refuses (``FlowFenced``, nothing written) unless the flow still
holds the partition, is bound, and holds it under the epoch the message was delivered in.

Failover (S30): when the owner's connection closes (it closed or died), this process takes the
queue's delivery lock if it is free and binds its flows locally, or else connects to whoever took
it; either way each flow presents its partition set as its hint (and its name), so within the
rebalance delay no partition moves.
"""
from __future__ import annotations

import logging
import threading
import time

from partq import errors
from partq.config import QueueConfig
from partq.delivery.cursor import Cursor, flag_redelivered, mark_ops
from partq.delivery.flow_state import InvalidAck, fenced_error, fenced_range
from partq.delivery.holds import Holds, read_cutover
from partq.delivery.peers.link import OwnerLink
from partq.delivery.peers.peer_flow import PeerFlow
from partq.delivery.saved_state import Assignment
from partq.errors import DeliveryLocked, FlowClosed, PartqError
from partq.message import FlowChangeUpdate, Message

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
        """The unacked counts of flows whose acks committed (or that nacked): a handoff waits
        for them."""
        with self.lock:
            done = {id(f): f for p, f in self._reports if p is None or p.done()}
            self._reports = [(p, f) for p, f in self._reports if not (p is None or p.done())]
            return [{"op": "outstanding", "flow": f.flow_id,
                     "counts": [[sp, len(c.inflight)] for sp, c in f.cursors.items()]}
                    for f in done.values()]

    def _lost(self) -> None:
        """The owner's connection closed: take delivery over or follow the new owner."""
        with self.lock:
            if self._closing:
                return
            flows = [f for f in self.flows.values() if f.reason is None]
        log.info("the delivery owner of queue %r is gone; %d flow(s) of this process fail over",
                 self.queue, len(flows))
        threading.Thread(target=self._failover, args=(flows,), name="partq-failover",
                         daemon=True).start()

    def _failover(self, flows: list[PeerFlow]) -> None:
        delay = FAILOVER_BACKOFF[0]
        while not self._closing:
            try:
                if self.dispatcher.take_over(self.queue):
                    self.dispatcher.forget_follower(self.queue, self)
                    for flow in flows:
                        self._to_local(flow)
                    return
                self._link = self._connect()
                for flow in flows:
                    self._rebind(flow)
                return
            except DeliveryLocked:
                pass            # the new owner is not answering yet
            except errors.QueueNotFound:
                with self.lock:
                    for flow in flows:
                        flow.close(f"queue {self.queue!r} was deleted")
                self.dispatcher.forget_follower(self.queue, self)
                self.dispatcher.notify()
                return
            except PartqError as exc:
                log.warning("failover of queue %r: %s; retrying", self.queue, exc)
            time.sleep(delay)
            delay = min(delay * 2, FAILOVER_BACKOFF[1])

    def _to_local(self, flow: PeerFlow) -> None:
        if flow.reason is not None:
            return              # the application unbound it while the owner was gone
        hint = sorted(flow.last_partitions)
        endpoint = self.dispatcher.bind_local(self.queue, flow.name, hint or None,
                                              flow.skip_corrupt)
        with self.lock:
            if flow.reason is not None:     # ... or while it was being bound again here
                endpoint.unbind()
                return
            if flow.callback is not None:
                endpoint.on_change(flow.callback)
            flow.local = endpoint
            flow.cursors.clear()
            flow.inflight = 0
        self.dispatcher.notify()

    def _rebind(self, flow: PeerFlow) -> None:
        if flow.reason is not None:
            return              # the application unbound it while the owner was gone
        hint = sorted(flow.last_partitions)
        reply = self._link.request({"op": "bind", "name": flow.name, "hint": hint or None,
                               "skip_corrupt": flow.skip_corrupt})
        with self.lock:
            gone = flow.reason is not None  # ... or while it was being bound again
            if not gone:
                self.flows.pop(flow.flow_id, None)
                flow.flow_id = str(reply["flow"])
                flow.cursors.clear()       # the new epochs deliver from the ack floor again
                flow.inflight = 0
                self.flows[flow.flow_id] = flow
        if gone:
            try:
                self._link.send({"op": "unbind", "req": 0, "flow": str(reply["flow"])})
            except OSError:
                pass            # the owner went again: its successor drops it as a ghost
        self.dispatcher.notify()

    # ------------------------------------------------------------------ flows
    def bind(self, name: str | None, hint: list[int] | None, skip_corrupt: bool) -> PeerFlow:
        reply = self._link.request({"op": "bind", "name": name, "hint": hint,
                               "skip_corrupt": skip_corrupt})
        flow = PeerFlow(self, str(reply["flow"]), name, skip_corrupt)
        with self.lock:
            self.flows[flow.flow_id] = flow
        flow.last_partitions = self.partitions(flow)
        return flow

    def unbind(self, flow: PeerFlow) -> None:
        with self.lock:
            if flow.reason is not None:
                return
            flow.close("unbound by the application")
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
            if flow.reason is None:
                flow.last_partitions = held
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

    def collect(self, flow: PeerFlow, max_messages: int) -> list[Message]:
        """Take up to ``max_messages`` for ``flow`` from the partitions the owner assigned it
        (not paused), after bringing its cursors in line with the assignment."""
        marks: dict[int, tuple[int, int]] = {}
        skipped: dict[int, list[int]] = {}
        out: list[Message] = []
        with self.lock:
            if flow.reason is not None:
                raise FlowClosed(f"flow {flow.name or flow.flow_id} of queue {self.queue!r} is "
                                 f"unbound: {flow.reason}; bind again")
            if flow.pending_error is not None:
                err, flow.pending_error = flow.pending_error, None
                raise err
            with self.store.read() as r:
                assignment = self._read_assignment(r)
                held = assignment.held_by(flow.flow_id)
                flow.last_partitions = frozenset(sp for _, sp, _ in held)
                self._sync_cursors(flow, held, r)
                config = assignment.config
                want = min(max_messages, config.max_delivered_unacked_per_flow - flow.inflight)
                if not config.egress_enabled or want <= 0:
                    return []
                ready = sorted(sp for slot, sp, _ in held if slot not in assignment.paused)
                if not ready:
                    return []
                flow.rr = (flow.rr + 1) % len(ready)
                cutover = read_cutover(r, self.qid)
                holds = Holds(cutover, r, self.qid) if cutover is not None else None
                for sp in ready[flow.rr:] + ready[:flow.rr]:
                    if len(out) >= want:
                        break
                    cursor = flow.cursors[sp]
                    cursor.take(r, self.qid, self.queue, flow, want, out, skipped,
                                holds.gate(sp) if holds is not None else None)
                    mark = cursor.mark(r, self.qid)
                    if mark is not None:
                        marks[sp] = mark
            flow.inflight += len(out)
            if not out and flow.pending_error is not None:
                err, flow.pending_error = flow.pending_error, None
                raise err
        if marks or skipped:
            qid = self.qid
            seen: dict[int, int] = {}         # marks another process wrote since the read
            writes = mark_ops(qid, marks, seen)

            def op(w):
                for write in writes:
                    write(w)
                for sp, seqs in skipped.items():
                    w.ack(qid, sp, seqs)
            try:
                self.store.write(op)
            except BaseException:
                with self.lock:
                    for sp, (old, _) in marks.items():
                        if sp in flow.cursors:
                            flow.cursors[sp].ack.delivered_mark = old
                    for m in out:
                        taken = flow.cursors.get(m.partition)
                        if taken is not None and taken.inflight.pop(m.seq, None) is not None:
                            flow.inflight -= 1
                            taken.next = min(taken.next, m.seq)
                raise
            if seen:
                with self.lock:
                    for sp, stored in seen.items():
                        if sp in flow.cursors:
                            cursor = flow.cursors[sp]
                            cursor.redeliver_upto = max(cursor.redeliver_upto, stored)
                out = flag_redelivered(out, seen)
        return out

    def _sync_cursors(self, flow: PeerFlow, held, r) -> None:
        """Drop the cursors of partitions the flow lost (or holds under a new epoch: delivered
        again from the ack floor) and start one for each partition it gained."""
        now = {sp: epoch for _, sp, epoch in held}
        resync = set()
        while flow.resync:                    # filled by the writer thread (a refused ack)
            resync.add(flow.resync.pop())
        for sp, cursor in list(flow.cursors.items()):
            if now.get(sp) != cursor.epoch or sp in resync:
                flow.inflight -= len(cursor.inflight)
                del flow.cursors[sp]
        for sp, epoch in now.items():
            if sp not in flow.cursors:
                flow.cursors[sp] = Cursor(sp, r.ack_state(self.qid, sp), epoch)

    def ack(self, flow: PeerFlow, msgs: list[Message]):
        """Apply acks in memory and queue their write, fenced in the write transaction.

        The assignment is read again first, so an ack of a partition that moved since the last
        receive is fenced before anything changes. If it moves between that read and the
        commit, the write is refused whole (nothing acked, as on the owner) and the cursors of
        the batch are marked for a resync from the durable state: the in-memory acks that did
        not commit are forgotten and those messages delivered again."""
        by_sp: dict[int, list[int]] = {}
        with self.lock:
            with self.store.read() as r:
                self._sync_cursors(flow, self._read_assignment(r).held_by(flow.flow_id), r)
            fenced = []
            for m in msgs:
                if m.queue != self.queue:
                    raise InvalidAck(f"message of queue {m.queue!r} acked on a flow of "
                                     f"{self.queue!r}")
                if m.partition not in flow.cursors:
                    fenced.append(m)
            if fenced:
                raise fenced_error(self.queue, flow, fenced, "acked")
            epochs = {}
            for m in msgs:
                cursor = flow.cursors[m.partition]
                if m.seq > cursor.ack.delivered_mark:
                    raise InvalidAck(f"{self.queue} partition {m.partition} seq {m.seq} was "
                                     f"never delivered")
                if not cursor.ack.is_acked(m.seq):
                    by_sp.setdefault(m.partition, []).append(m.seq)
                    epochs[m.partition] = cursor.epoch
            for sp, seqs in by_sp.items():
                cursor = flow.cursors[sp]
                cursor.ack.add(seqs)
                for s in seqs:
                    if cursor.inflight.pop(s, None) is not None:
                        flow.inflight -= 1
        if not by_sp:
            return None
        qid, name, flow_id = self.qid, self.queue, flow.flow_id
        by_msg = {(m.partition, m.seq): m for m in msgs}

        def op(w):
            assignment = Assignment(QueueConfig.from_dict(w.queue(name)), w.state(qid)) \
                if w.queue_raw(name) is not None else None
            lost = [by_msg[(sp, s)] for sp, seqs in by_sp.items() for s in seqs
                    if assignment is None or not assignment.holds(flow_id, sp, epochs[sp])]
            if lost:
                flow.resync.update(by_sp)     # the in-memory acks of the batch did not commit
                raise fenced_error(name, flow, lost, "acked")
            for sp, seqs in by_sp.items():
                w.ack(qid, sp, seqs)
        pending = self.store.submit(op)
        with self.lock:
            self._reports.append((pending, flow))
        self.dispatcher.notify()
        return pending

    def ack_through(self, flow: PeerFlow, sp: int, seq: int):
        """Ack every message of ``sp`` up to ``seq``, fenced in the write transaction."""
        with self.lock:
            with self.store.read() as r:       # a flow that never received has no cursors yet
                self._sync_cursors(flow, self._read_assignment(r).held_by(flow.flow_id), r)
            cursor = flow.cursors.get(sp)
            if cursor is None:
                raise fenced_range(self.queue, flow, sp, seq)
            epoch = cursor.epoch
            cursor.ack.add_through(seq)
            cursor.next = max(cursor.next, seq + 1)
            for s in [s for s in cursor.inflight if s <= seq]:
                del cursor.inflight[s]
                flow.inflight -= 1
        qid, name, flow_id = self.qid, self.queue, flow.flow_id

        def op(w):
            raw = w.queue(name)
            if raw is None or not Assignment(QueueConfig.from_dict(raw), w.state(qid)) \
                    .holds(flow_id, sp, epoch):
                flow.resync.add(sp)
                raise fenced_range(name, flow, sp, seq)
            w.ack_through(qid, sp, seq)
        pending = self.store.submit(op)
        with self.lock:
            self._reports.append((pending, flow))
        self.dispatcher.notify()
        return pending

    def nack(self, flow: PeerFlow, msg: Message) -> None:
        with self.lock:
            cursor = flow.cursors.get(msg.partition)
            if cursor is None:
                raise fenced_error(self.queue, flow, [msg], "nacked")
            if cursor.inflight.get(msg.seq) != flow.flow_id:
                return
            for seq in sorted(s for s in cursor.inflight if s >= msg.seq):
                del cursor.inflight[seq]
                flow.inflight -= 1
            cursor.redeliver_upto = max(cursor.redeliver_upto, cursor.high)
            cursor.next = min(cursor.next, msg.seq)
            self._reports.append((None, flow))
        self.dispatcher.notify()

    def close(self) -> None:
        """This process is closing: its flows end, the owner sees the connection close."""
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
