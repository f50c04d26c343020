"""Peer flows: flows of a queue whose delivery another process of the host owns (rule `peer-flows`).

Such a flow reads and acks its partitions in LMDB itself, from its own process (LMDB allows
readers in many processes and serialises writers): consumption scales past one process. The
owner coordinates over the control channel (``control``): it runs the rebalancer and persists
its state (assignments, pauses, epochs) with every change; a peer reads that state from
the store before each receive, delivers only the partitions assigned to its flow and not paused
for a handoff (and, under ``ordering="key"``, those handed off to it, early: ``peer_handoff``),
and reports back what it holds unacked so that a handoff can complete.

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
from partq.config import QueueConfig
from partq.delivery.cursor import flag_redelivered
from partq.delivery.handout import Handout
from partq.delivery.holds import Holds, read_cutover
from partq.delivery.lock import lease_for
from partq.delivery.outside import outside_count
from partq.delivery.peers.link import OwnerLink
from partq.delivery.peers.peer_acks import PeerAcks
from partq.delivery.peers.peer_flow import PeerFlow
from partq.delivery.peers.peer_handoff import read_draining
from partq.delivery.saved_state import Assignment
from partq.errors import DeliveryLocked, FlowClosed, PartqError
from partq.message import FlowChangeUpdate, Message

log = logging.getLogger("partq.delivery")

FAILOVER_BACKOFF = (0.01, 0.5)


class PeerQueue(PeerAcks):
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
        return OwnerLink(self.store.path, self.queue, self.qid, self._lease(), self._pushed,
                         self._lost, self._due_reports)

    def _lease(self) -> float:
        """The lease of the queue's delivery lock, from its settings as stored now: how long a
        stopped owner is waited for before this process takes delivery over."""
        with self.store.read() as r:
            raw = r.queue(self.queue)
        if raw is None:
            raise errors.QueueNotFound(f"queue {self.queue!r} was deleted; bind again once it "
                                       f"exists")
        return lease_for(QueueConfig.from_dict(raw).consumer_timeout)

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
            now = self.dispatcher.clock.now()
            return [{"op": "outstanding", "flow": f.flow_id, "counts": f.outstanding(),
                     "paused": sorted(f.seen_paused), "held": f.holding(now)}
                    for f in done.values()]

    def _note_pauses(self) -> None:
        """Under the lock (no receive of this process takes meanwhile): when the store changed,
        read the assignment again and report the flows whose paused partitions changed, and
        settle those partitions (so that a handoff's target under "key" can read from the
        store what its flow still holds: ``peer_handoff``, whether or not it receives). The
        settle is queued, not waited for: this thread beats for the process's flows, and a
        write may wait long for LMDB's write lock (a process stopped holding it)."""
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
        self._queue_settles([(flow, *s) for flow in self.flows.values()
                             for s in flow.settle(self._see_pauses(flow, assignment))])

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

    def unbind(self, flow: PeerFlow, reason: str = "unbound by the application",
               leave: bool = False) -> None:
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
            self._link.request({"op": "unbind", "flow": flow.flow_id, "leave": leave})
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
                if not handing_off:
                    taken = self._take(flow, assignment, r, max_messages)
            if handing_off:
                # written with no snapshot open: its commit may have to adopt a map another
                # process grew, which waits until no snapshot of this process is open
                self._write_settles([(flow, *s) for s in handing_off])
                with self.store.read() as r:
                    taken = self._take(flow, assignment, r, max_messages)
            if taken is None:
                return []
            out, handout, fences = taken
            if handout.wake is not None:
                self.dispatcher.wake_at(handout.wake)
            if not out:
                flow.raise_pending_error()
        if not handout.empty():
            seen: dict[int, int] = {}         # marks another process wrote since the read
            writes = handout.ops(self.queue, self.qid, seen,
                                 lambda w, sp: self._holds(w, flow, sp, fences[sp]))
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

    def _take(self, flow: PeerFlow, assignment: Assignment, r, max_messages: int
              ) -> tuple[list[Message], Handout, dict[int, tuple[int, bool]]] | None:
        """Under the lock, in snapshot ``r``: what ``flow`` takes of its partitions not paused
        and of those handed off to it that it takes from already (the messages, the handout to
        make durable first, and the fence of each partition: ``PeerFlow.fence``); None when it
        takes nothing (egress off, no credit, no partition)."""
        config = assignment.config
        want = min(max_messages, flow.credit(config.max_delivered_unacked_per_flow))
        if not config.egress_enabled or want <= 0:
            return None
        held = {sp: (epoch, False) for slot, sp, epoch in assignment.held_by(flow.flow_id)
                if slot not in assignment.paused}
        held.update(flow.early())
        if not held:
            return None
        cutover = read_cutover(r, self.qid)
        holds = Holds(cutover, r, self.qid) if cutover is not None else None
        clock = self.dispatcher.clock
        handout = Handout(config, clock.now(), clock.wall_ns())
        return flow.take(r, self.qid, sorted(held), want, holds, handout), handout, held

    @staticmethod
    def _paused(flow: PeerFlow, assignment: Assignment) -> list[int]:
        """The partitions ``flow`` holds that are paused for a handoff."""
        return [sp for slot, sp, _ in assignment.held_by(flow.flow_id) if slot in assignment.paused]

    def _sync(self, flow: PeerFlow, r) -> Assignment:
        """The owner's assignment in read snapshot ``r``, with ``flow``'s cursors brought in
        line with it (under the lock)."""
        assignment = self._read_assignment(r)
        qid = self.qid
        keyed = assignment.config.ordering == "key"
        flow.sync(assignment.held_by(flow.flow_id), lambda sp: r.ack_state(qid, sp), keyed,
                  assignment.handed_off_to(flow.flow_id) if keyed else [],
                  lambda sp: read_draining(r, qid, sp), self._paused(flow, assignment))
        flow.take_outside_acks(outside_count(r, qid), lambda sp: r.ack_state(qid, sp))
        return assignment

    def close(self) -> None:
        """This process is closing: its flows end, the owner sees the connection close. Those
        bound without a name leave for good first (nobody waits for them: their partitions go
        to the other flows at once); a named one is waited for (rule `named-flows`)."""
        with self.lock:
            flows = list(self.flows.values())
        self._settle(flows)
        for flow in flows:
            if flow.name is None and flow.bound:
                try:
                    self._link.request({"op": "unbind", "flow": flow.flow_id, "leave": True})
                except PartqError:
                    pass        # the owner is gone: its successor sees a ghost
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
