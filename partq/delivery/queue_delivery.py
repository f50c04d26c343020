"""Delivery of one queue in the process that owns it: cursors, in-flight messages, and the shell
around the pure ``Rebalancer`` that carries out its actions.

Everything here runs under the dispatcher's lock and never waits for a commit: methods return the
write operations to submit (in order, still under the lock) so that the caller can wait for the
commit after releasing it.

The core numbers its partitions 0..n-1 ("slots"); ``index[slot]`` is the storage partition the
slot delivers. For a partitioned queue they are the same numbers; an exclusive (non-partitioned)
queue has one slot whose log is the parent queue's (``PARENT``), so one flow receives and the
others stand by, exactly as the core treats excess consumers of a one-partition queue.
Messages, hints and ``Flow.partitions`` speak storage partitions; only the core sees slots.

Per partition the shell keeps a ``Cursor`` (``cursor.py``: where delivery stands, what is in
flight, the delivered mark); per flow a ``FlowState``.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from partq.config import QueueConfig, redelivery_wait
from partq.core.rebalancer import Assign, FlowActive, Pause, Rebalancer, Redeliver, Resume
from partq.delivery.cursor import Cursor, flag_redelivered
from partq.delivery.dead_letter import DeadMessage, dead_op, rejected
from partq.delivery.flow_state import FlowState, fenced_error, fenced_range
from partq.delivery.handout import Handout
from partq.delivery.holds import Holds, clear_cutover, read_cutover
from partq.delivery.layout import ack_parent_log, delivery_layout, describe_mode
from partq.delivery.moves import Moves
from partq.delivery.outside import outside_count
from partq.delivery.saved_state import Assignment, DeliveryView, decode_state, encode_state, view_of
from partq.delivery.tally import Tally
from partq.errors import FlowClosed, InvalidAck
from partq.message import FlowChangeUpdate, Message
from partq.storage import crashpoints
from partq.storage.encoding import PARENT

log = logging.getLogger("partq.delivery")



class QueueDelivery:
    def __init__(self, config: QueueConfig, reader, now: float, tally: Tally | None = None) -> None:
        self.config = config
        self.name = config.name
        self.qid = config.qid
        self.mode, index = delivery_layout(config)
        blob = reader.state(self.qid)
        state = decode_state(blob, f"queue {self.name!r}")
        if state is None or state.mode != self.mode:
            # new, or the access type changed while no process ran delivery: nothing carries over
            self.core = Rebalancer(len(index), config.rebalance_delay, config.max_handoff_time)
        else:
            self.core = Rebalancer.restored(state.core, config.rebalance_delay,
                                            config.max_handoff_time, now)
        self.parts: list[Cursor] = []
        self.slot_of: dict[int, int] = {}     # storage partition -> slot
        self.cutover = read_cutover(reader, self.qid)  # an online scaling not drained yet
        self._set_index(index, reader)
        for slot, owner in enumerate(self.core.owner[:len(self.parts)]):
            if owner is not None:
                # a flow of the last run (maybe of another process, which may go on delivering
                # until it notices the change): read its state again before delivering it here
                self.parts[slot].remote_held = True
        self.flows: dict[str, FlowState] = {}   # flow id -> its delivery state
        self.config_raw = reader.queue_raw(self.name)
        self.outside = outside_count(reader, self.qid)   # acks written outside delivery
        self._last_blob: bytes | None = blob
        self.moves = Moves(self.name, self.qid, self.core, tally or Tally(), now)   # logs, counts
        # writes from construction, submitted with the first bind
        if self.core.n != len(index):
            # scaled while no process ran delivery: rebalance at once, as scaling does (rule `scaling`)
            self.pending_ops = self._run(self.core.partition_count_changed(len(index), now), now)
        else:
            self.pending_ops = self._state_ops(now)

    def _set_index(self, index: list[int], reader) -> None:
        """Deliver the storage partitions ``index`` (slot order); keep the state of those kept."""
        kept = {ps.sp: ps for ps in self.parts}
        for sp, ps in kept.items():
            if sp not in index:
                self._forget_inflight(ps)
        self.parts = [kept.get(sp) or Cursor(sp, reader.ack_state(self.qid, sp))
                      for sp in index]
        self.slot_of = {sp: slot for slot, sp in enumerate(index)}

    def part(self, sp: int) -> Cursor | None:
        """The delivery state of storage partition ``sp``; None if this queue does not deliver
        it."""
        slot = self.slot_of.get(sp)
        return None if slot is None else self.parts[slot]

    def partitions_of(self, flow_id: str) -> frozenset[int]:
        """The storage partitions a flow holds."""
        parts = self.parts
        return frozenset(parts[slot].sp for slot in self.core.partitions_of(flow_id))

    def apply_config(self, config: QueueConfig, raw: bytes, reader, now: float) -> list:
        """The stored config changed (here or in another process): take the new settings; on a
        new partition count rebalance at once (rules `rebalance-triggers` and `scaling`); on a change between
        partitioned and non-partitioned unbind every flow, telling it why (rule `ingress-egress`)."""
        old = self.config
        self.config, self.config_raw = config, raw
        self.cutover = read_cutover(reader, self.qid)   # written with the count it switched
        self.core.rebalance_delay = config.rebalance_delay
        self.core.max_handoff_time = config.max_handoff_time
        mode, index = delivery_layout(config)
        if mode != self.mode:
            reason = (f"queue {self.name!r} changed from {describe_mode(old)} to "
                      f"{describe_mode(config)}")
            for flow in list(self.flows.values()):
                flow.close(reason)
            self.flows.clear()
            self._run(self.core.drop_all(), now)
            self.mode = mode
        actions = []
        if index != [ps.sp for ps in self.parts]:
            self._set_index(index, reader)
            if len(index) != self.core.n:
                actions = self.core.partition_count_changed(len(index), now)
        return self._run(actions, now)

    # ------------------------------------------------------------------ core events
    def bind(self, flow, hint, now: float) -> list:
        if hint is not None:
            # hints name storage partitions; one this queue does not deliver cannot match
            hint = [self.slot_of.get(p, -1 - i) for i, p in enumerate(hint)]
        self.flows[flow.flow_id] = flow
        ops, self.pending_ops = self.pending_ops, []
        return ops + self._run(self.core.bind(flow.flow_id, now, flow.name, hint), now)

    def unbind(self, flow, now: float) -> list:
        """The flow left: its unacked messages come back to whoever takes its partitions, each
        counting a lost delivery (rule `delivery-count`)."""
        self.flows.pop(flow.flow_id, None)
        ops = []
        for ps in self.parts:
            lost = [s for s, f in ps.inflight.items() if f == flow.flow_id]
            for seq in lost:
                del ps.inflight[seq]
            if lost:
                ops.append(self._failures_op(ps, ps.count_lost(sorted(lost))))
        return ops + self._run(self.core.unbind(flow.flow_id, now), now)

    def _failures_op(self, ps: Cursor, counts: list[tuple[int, int]]) -> Callable:
        qid, sp = self.qid, ps.sp
        return lambda w: w.set_failures(qid, sp, counts)

    def tick(self, now: float) -> list:
        return self._run(self.core.tick(now), now)

    def take_outside_acks(self, reader, now: float) -> list:
        """Acks written outside delivery since the last look (``outside``): take them in, so
        nothing acked is delivered and the flows' credit and handoffs count them. Returns the
        writes (a handoff may complete)."""
        count = outside_count(reader, self.qid)
        if count == self.outside:
            return []
        self.outside = count
        actions = []
        for slot, ps in enumerate(self.parts):
            if ps.remote_held:
                continue
            for fid in ps.take_acks(reader.ack_state(self.qid, ps.sp)):
                flow = self.flows.get(fid)
                if flow is not None:
                    flow.inflight -= 1
            if slot in self.core.handoffs:
                actions += self.core.acked(slot, self._outstanding(slot), now)
        return self._run(actions, now)

    def cutover_ops(self, reader) -> list:
        """Once every old partition of an online scaling drained past its cut-over, the
        record goes (checked again in the write): nothing is held or checked any more."""
        if self.cutover is None or not Holds(self.cutover, reader, self.qid).all_drained():
            return []
        cutover, qid = self.cutover, self.qid
        self.cutover = None
        log.info("queue %r: the online scaling from %d to %d partitions has drained; per-key "
                 "holds are off", self.name, cutover.from_partitions, cutover.to_partitions)

        def op(w):
            current = read_cutover(w, qid)
            if current == cutover and Holds(current, w, qid).all_drained():
                clear_cutover(w, qid)
        return [op]

    def _run(self, actions: list, now: float) -> list:
        """Carry out actions; report drained paused partitions back to the core until quiet.
        Returns the write operations to submit (the new state blob, if it changed)."""
        self.moves.sample(self._held)
        ops: list = []
        while actions:
            paused = []
            for a in actions:
                if isinstance(a, Pause):
                    paused.append(a.p)
                elif isinstance(a, Redeliver):
                    self._redeliver(a.p)
                elif isinstance(a, Assign):
                    for state in self.flows.values():
                        state.reported.pop(a.p, None)
                    if a.p < len(self.parts):
                        ps = self.parts[a.p]
                        target = self.flows.get(a.flow) if a.flow is not None else None
                        if target is not None and target.remote is not None:
                            if not ps.remote_held and not ps.stale:
                                ops += self._settle_ops(ps)
                            ps.remote_held = True     # its process reads and acks it itself
                        elif ps.inflight and not ps.remote_held:
                            # the old flow's deliveries ended unacked (its handoff timed out)
                            ops.append(self._failures_op(ps, ps.count_lost(sorted(ps.inflight))))
                        elif ps.remote_held:
                            ps.stale, ps.remote_held = True, False   # read its state again
                        if a.flow is None:
                            self._forget_inflight(ps)
                elif isinstance(a, FlowActive):
                    flow = self.flows.get(a.flow)
                    if flow is not None:
                        flow.changed(FlowChangeUpdate(a.active, self.partitions_of(a.flow)))
                elif not isinstance(a, Resume):
                    raise AssertionError(f"unknown action {a!r}")
            actions = []
            for p in paused:
                actions += self.core.acked(p, self._outstanding(p), now)
        return ops + self._state_ops(now)

    def _settle_ops(self, ps: Cursor) -> list:
        """This process lets ``ps`` go to a flow of another process: make its delivery counts
        and delivered mark exact first, so the next holder counts and marks only what this one
        really delivered (``Writer.settle``)."""
        settled = ps.settle_counts()
        if settled is None:
            return []
        expected, mark, counted, counts = settled
        ps.ack.delivered_mark, ps.ack.counted = mark, counted
        ps.settled = True
        qid, sp = self.qid, ps.sp
        return [lambda w: w.settle(qid, sp, expected, mark, counted, counts)]

    def settle_all(self) -> list:
        """This process stops delivering the queue (it closes): settle every partition it
        delivers itself."""
        ops = []
        for ps in self.parts:
            if not ps.remote_held and not ps.stale:
                ops += self._settle_ops(ps)
        return ops

    def _outstanding(self, p: int) -> int:
        owner = self.core.owner[p]
        if owner is None:
            return 0
        state = self.flows.get(owner)
        if state is not None and state.remote is not None:
            return state.reported.get(p, 0)
        return self.parts[p].outstanding(owner)

    def _held(self, p: int, flow_id: str) -> int | None:
        """Messages of slot ``p`` the flow holds unacked (None: it is no flow of this runtime)."""
        state = self.flows.get(flow_id)
        if state is None or p >= len(self.parts):
            return None
        return state.reported.get(p, 0) if state.remote is not None else \
            self.parts[p].outstanding(flow_id)

    def report(self, flow: FlowState, counts: dict[int, int], now: float) -> list:
        """A flow of another process reports what it holds unacked per storage partition: a
        handoff waiting for it may complete. Returns the writes to submit."""
        actions = []
        for sp, n in counts.items():
            slot = self.slot_of.get(sp)
            if slot is None or self.core.owner[slot] != flow.flow_id:
                continue
            flow.reported[slot] = n
            if slot in self.core.handoffs:
                actions += self.core.acked(slot, n, now)
        return self._run(actions, now)

    def _forget_inflight(self, ps: Cursor) -> None:
        for fid in ps.inflight.values():
            flow = self.flows.get(fid)
            if flow is not None:
                flow.inflight -= 1
        ps.inflight.clear()

    def _redeliver(self, p: int) -> None:
        if crashpoints.ENABLED:
            crashpoints.hit("during_handoff")
        ps = self.parts[p]
        self._forget_inflight(ps)
        ps.rewind()

    def _fenced(self, reader, slot: int) -> bool:
        """Whether snapshot ``reader`` already holds ``slot``'s assignment as this runtime has it
        (its owner and epoch). A flow of another process acks in a write that reads the stored
        assignment first (``PeerQueue.ack``), so once the move away from it is stored none of
        its acks can commit any more, and those that did are in every later snapshot. Until
        then (the move is in memory and its commit queued: a receive that ran the rebalance
        timer reads before that commit) the partition's ack state may still grow elsewhere."""
        stored = Assignment(self.config, reader.state(self.qid))
        return slot < len(stored.epoch) and stored.epoch[slot] == self.core.epoch[slot] \
            and stored.owner[slot] == self.core.owner[slot]

    def view(self, this_process: str | None = None, now: float = 0.0) -> DeliveryView:
        """Statuses, owners, unacked counts and errors as they are now. A partition a flow of
        another process holds shows what that process last reported unacked."""
        def live(sp: int) -> tuple[int, str | None]:
            ps = self.part(sp)
            if ps is None:
                return 0, None
            slot = self.slot_of[sp]
            owner = self.core.owner[slot]
            state = self.flows.get(owner) if owner is not None else None
            unacked = (state.reported.get(slot, 0) if state is not None and state.remote
                       else len(ps.inflight))
            return unacked, str(ps.error) if ps.error else None

        def client(fid: str) -> str | None:
            state = self.flows.get(fid)
            if state is None:
                return None
            return state.client if state.remote is not None else this_process
        view = view_of(self.core, [ps.sp for ps in self.parts], self.core.status, None,
                       bound=True, live=live, mode=self.mode, client=client)
        return dataclasses.replace(view, delayed=self.delayed(now))

    def _state_ops(self, now: float) -> list:
        blob = encode_state(self.mode, self.core)
        if blob == self._last_blob:
            return []
        self._last_blob = blob
        qid = self.qid
        return [lambda w: w.put_state(qid, blob)] + self.moves.observe(
            self.core, now, [ps.sp for ps in self.parts], self._held)

    # ------------------------------------------------------------------ delivery
    def collect(self, flow, max_messages: int, reader, now: float,
                now_ns: int) -> tuple[list[Message], Handout]:
        """Take up to ``max_messages`` deliverable messages for ``flow``. Returns the messages
        and the ``Handout`` whose writes (``collect_ops``: delivered marks, delivery counts,
        dead messages, skipped corrupt records' acks) must be durable before they are handed
        over; ``collected`` applies it once they are, ``undo_collect`` puts everything back if
        that commit fails."""
        if flow.pending_error is not None:
            err, flow.pending_error = flow.pending_error, None
            raise err
        handout = Handout(self.config, now, now_ns)
        if not self.config.egress_enabled:
            return [], handout
        want = min(max_messages, self.config.max_delivered_unacked_per_flow - flow.inflight)
        if want <= 0:
            return [], handout
        core, name, qid = self.core, self.name, self.qid
        owned = sorted(core.partitions_of(flow.flow_id))
        if not owned:
            return [], handout
        flow.rr = (flow.rr + 1) % len(owned)
        out: list[Message] = []
        holds = Holds(self.cutover, reader, qid) if self.cutover is not None else None
        for slot in owned[flow.rr:] + owned[:flow.rr]:
            if len(out) >= want:
                break
            if slot in core.handoffs:
                continue
            ps = self.parts[slot]
            if ps.stale:
                if not self._fenced(reader, slot):
                    continue    # its old holder may still ack: once the move is stored
                ps.refresh(reader.ack_state(qid, ps.sp))
            ps.take(reader, qid, name, flow, want, out, handout,
                    holds.gate(ps.sp) if holds is not None else None)
            mark = ps.mark(reader, qid)
            if mark is not None:
                handout.marks[ps.sp] = mark
        flow.inflight += len(out)
        if not out and flow.pending_error is not None:
            err, flow.pending_error = flow.pending_error, None
            raise err
        return out, handout

    def undo_collect(self, flow, msgs: list[Message], handout: Handout) -> None:
        """The writes of a collect could not be made durable: put the messages back."""
        for p, (old, _new) in handout.marks.items():
            ps = self.part(p)
            if ps is not None:
                ps.ack.delivered_mark = old
        for p, counts in handout.counts.items():
            ps = self.part(p)
            if ps is not None:
                for seq, n in counts:
                    if ps.ack.failures.get(seq) == n:
                        ps.ack.failures[seq] = n - 1
                    ps.suspect_from = min(ps.suspect_from, seq)
        for p in handout.unsettled:
            ps = self.part(p)
            if ps is not None:
                ps.settled = True
        for m in msgs:
            ps = self.part(m.partition)
            if ps is None:
                continue
            if ps.inflight.pop(m.seq, None) is not None:
                flow.inflight -= 1
            ps.next = min(ps.next, m.seq)
        for d in handout.dead:
            ps = self.part(d.partition)
            if ps is not None:
                ps.next = min(ps.next, d.seq)

    def collected(self, handout: Handout) -> None:
        """A collect's writes are durable: dead messages are acked."""
        self._acked_dead(handout.dead)

    def _acked_dead(self, dead: list[DeadMessage]) -> None:
        for d in dead:
            ps = self.part(d.partition)
            if ps is not None:
                ps.ack.add([d.seq])

    def collect_ops(self, handout: Handout, seen: dict[int, int]) -> list:
        """The writes of a collect (``Handout.ops``)."""
        return handout.ops(self.name, self.qid, seen)

    def flag_concurrent(self, msgs: list[Message], seen: dict[int, int]) -> list[Message]:
        """After ``collect_ops`` found marks another process wrote meanwhile: those messages are
        redeliveries, and so is what this flow is given of them later."""
        for p, mark in seen.items():
            ps = self.part(p)
            if ps is not None:
                ps.redeliver_upto = max(ps.redeliver_upto, mark)
        return flag_redelivered(msgs, seen)

    def next_wake(self) -> float | None:
        """The earliest end of a nack's delay among the partitions (None: none waits)."""
        waits = [ps.wait_until for ps in self.parts if ps.wait_until]
        return min(waits) if waits else None

    def delayed(self, now: float) -> int:
        """Partitions waiting out a nack's delay now (each holds back its nacked message)."""
        return sum(1 for ps in self.parts if ps.wait_until > now)

    def ack(self, flow, msgs, now: float, reader) -> list:
        """Apply acks in memory and return the writes. Fencing (rule `fencing`): an ack of a message of a
        partition the flow no longer holds (it moved to another flow after a handoff timed out,
        or the flow left) changes nothing and raises ``FlowFenced``; the message belongs to the
        partition's current flow, which gets it redelivered. A batch is taken whole or not at
        all. Late acks of messages whose partition no longer exists change nothing either way."""
        by_p: dict[int, list[int]] = {}     # slot -> seqs
        slot_of, owner = self.slot_of, self.core.owner
        stranded: list[int] = []
        fenced: list[Message] = []
        msgs = list(msgs)
        for m in msgs:
            if m.queue != self.name:
                raise InvalidAck(f"message of queue {m.queue!r} acked on a flow of {self.name!r}")
            slot = slot_of.get(m.partition)
            if slot is not None and owner[slot] != flow.flow_id:
                fenced.append(m)
        if fenced:
            raise fenced_error(self.name, flow, fenced, "acked")
        for m in msgs:
            slot = slot_of.get(m.partition)
            if slot is None:
                if m.partition == PARENT:
                    stranded.append(m.seq)
                # else removed by scaling: its messages are gone
                continue
            ps = self.parts[slot]
            if ps.stale or m.seq > ps.ack.delivered_mark:
                ps.refresh(reader.ack_state(self.qid, ps.sp),
                           not ps.stale or self._fenced(reader, slot))
            if m.seq > ps.ack.delivered_mark:
                raise InvalidAck(f"{self.name} partition {m.partition} seq {m.seq} was never delivered")
            if not ps.ack.is_acked(m.seq):
                by_p.setdefault(slot, []).append(m.seq)
        if stranded:
            self._check_delivered_from_parent(flow, stranded, reader)
        qid = self.qid
        ops: list[Callable] = [] if not stranded else [lambda w: ack_parent_log(w, qid, stranded)]
        if not by_p:
            return ops
        for p, seqs in by_p.items():
            ps = self.parts[p]
            ps.ack.add(seqs)
            for s in seqs:
                fid = ps.inflight.pop(s, None)
                if fid is not None and fid in self.flows:
                    self.flows[fid].inflight -= 1
        items = [(self.parts[p].sp, seqs) for p, seqs in by_p.items()]
        ops.append(lambda w: [w.ack(qid, p, seqs) for p, seqs in items])
        actions = []
        for p in by_p:
            if p in self.core.handoffs:
                actions += self.core.acked(p, self._outstanding(p), now)
        return ops + self._run(actions, now)

    def _check_delivered_from_parent(self, flow, seqs: list[int], reader) -> None:
        """Late acks of the parent log come from flows the change of access type unbound, and
        name only what was delivered (at or below the parent's durable delivered mark). A flow
        bound to the partitioned queue never received from the parent log, so its acks of it
        are refused. Raises ``InvalidAck``: no flow can ack stranded messages nobody received."""
        if flow.flow_id in self.flows:
            raise InvalidAck(f"{self.name}: a flow of the partitioned queue acked the parent "
                             f"queue's seq {seqs[0]}, which it was never given; stranded "
                             f"messages are copied out (`partq copy-out --parent`), not acked")
        mark = (reader.ack_state(self.qid, PARENT).delivered_mark
                if reader.has_partition(self.qid, PARENT) else -1)
        never = [s for s in seqs if s > mark]
        if never:
            raise InvalidAck(f"{self.name} parent queue seq {never[0]} was never delivered: its "
                             f"stranded messages are copied out (`partq copy-out --parent`), "
                             f"not acked by a flow")

    def ack_through(self, flow, sp: int, seq: int, now: float, reader) -> list:
        """Ack every message of storage partition ``sp`` up to ``seq`` (a consumer that reads a
        range of the log itself: Spark's stream), delivered to ``flow`` or not; fenced like an
        ack. The delivered mark moves past ``seq`` with it. Returns the writes."""
        slot = self.slot_of.get(sp)
        if slot is None:
            return []                   # removed by scaling: nothing left to ack
        if self.core.owner[slot] != flow.flow_id:
            raise fenced_range(self.name, flow, sp, seq)
        ps = self.parts[slot]
        if ps.stale:
            ps.refresh(reader.ack_state(self.qid, sp), self._fenced(reader, slot))
        head = reader.head(self.qid, sp)
        seq = min(seq, head - 1)
        if seq < ps.ack.floor:
            return []
        ps.ack.add_through(seq)
        ps.ack.delivered_mark = max(ps.ack.delivered_mark, seq)
        ps.next = max(ps.next, seq + 1)
        ps.high = max(ps.high, seq)
        for s in [s for s in ps.inflight if s <= seq]:
            fid = ps.inflight.pop(s)
            if fid in self.flows:
                self.flows[fid].inflight -= 1
        qid = self.qid
        ops: list[Callable] = [lambda w: w.ack_through(qid, sp, seq)]
        actions = self.core.acked(slot, self._outstanding(slot), now) \
            if slot in self.core.handoffs else []
        return ops + self._run(actions, now)

    def nack(self, flow, msg: Message, now: float, delay: float | None = None) -> list:
        """Give ``msg`` back: it and every later in-flight message of its partition are delivered
        again, in order, marked redelivered (rule `partition-order` holds across nacks); only
        ``msg`` counts a failed delivery. The partition waits ``delay`` seconds first (None: the
        queue's redelivery delay rule). A nack during a handoff counts like an ack towards it:
        the old flow no longer holds the message. Returns the writes to submit."""
        ps, slot = self._held_part(flow, msg, "nacked")
        if ps is None:
            return []
        failures = ps.ack.failed(msg.seq) + 1
        if delay is None:
            delay = redelivery_wait(self.config, failures)
        back = ps.give_back(msg.seq, flow.flow_id, delay, now)
        if back is None:
            return []
        flow.inflight -= len(back)
        ops = [self._failures_op(ps, ps.count_lost([msg.seq]))]
        if slot in self.core.handoffs:
            return ops + self._run(self.core.acked(slot, self._outstanding(slot), now), now)
        return ops

    def reject(self, flow, msg: Message, now: float, now_ns: int) -> list:
        """``msg`` is dead at once (rule `redelivery-limit`): removed from the queue and moved to its
        dead message queue in one write; the rest of its partition flows on. Returns the
        writes."""
        ps, slot = self._held_part(flow, msg, "rejected")
        if ps is None or ps.inflight.get(msg.seq) != flow.flow_id:
            return []
        del ps.inflight[msg.seq]
        flow.inflight -= 1
        dead = [rejected(ps.sp, msg.seq, ps.ack.failed(msg.seq) + 1)]
        self._acked_dead(dead)
        ops = [dead_op(self.name, self.qid, dead, now_ns)]
        if slot in self.core.handoffs:
            return ops + self._run(self.core.acked(slot, self._outstanding(slot), now), now)
        return ops

    def _held_part(self, flow, msg: Message, verb: str) -> tuple[Cursor | None, int]:
        """The cursor of ``msg``'s partition, which ``flow`` must hold (``FlowFenced``); None
        when the partition is gone (scaled down, access type changed)."""
        if msg.queue != self.name:
            raise InvalidAck(f"message of queue {msg.queue!r} {verb} on a flow of {self.name!r}")
        slot = self.slot_of.get(msg.partition)
        if slot is None:
            return None, -1
        if self.core.owner[slot] != flow.flow_id:
            raise fenced_error(self.name, flow, [msg], verb)
        return self.parts[slot], slot

    def check_flow(self, flow: FlowState) -> None:
        if flow.closed_reason is not None:
            raise FlowClosed(f"flow {flow.name or flow.flow_id} of queue {self.name!r} is unbound"
                             f"{': ' + flow.closed_reason if flow.closed_reason else ''}; bind again")
