"""What a queue's flows ask of its delivery in the process that owns it: take messages
(``collect``, with the ``Handout`` to make durable first), ack, ack a range, nack, reject, and
take in acks written outside delivery. ``QueueDelivery`` (``queue_delivery.py``) is built on it
and keeps the partition assignment these calls read: its cursors, the rebalancer, the flows.

Like the rest of ``QueueDelivery`` these run under the dispatcher's lock and never wait for a
commit: they return the writes to submit."""
from __future__ import annotations

from collections.abc import Callable

from partq.config import QueueConfig, redelivery_wait
from partq.core.rebalancer import Rebalancer
from partq.delivery.cursor import Cursor, flag_redelivered
from partq.delivery.dead_letter import DeadMessage, dead_op, recent_dead_of, rejected
from partq.delivery.flow_state import FlowState, dead_error, fenced_error, fenced_range
from partq.delivery.handout import Handout
from partq.delivery.holds import Cutover, Holds
from partq.delivery.key_handoff import Hold, draining_hold, early_slots, target_holds
from partq.delivery.layout import ack_parent_log, check_delivered_from_parent
from partq.delivery.outside import outside_count
from partq.errors import FlowClosed, InvalidAck
from partq.message import Message
from partq.storage.encoding import PARENT


class FlowCalls:
    """The flows' calls; ``QueueDelivery`` provides the state and the methods declared here."""

    config: QueueConfig
    name: str
    qid: int
    core: Rebalancer
    parts: list[Cursor]
    slot_of: dict[int, int]
    flows: dict[str, FlowState]
    cutover: Cutover | None
    outside: int

    def part(self, sp: int) -> Cursor | None:
        raise NotImplementedError

    def _run(self, actions: list, now: float) -> list:
        raise NotImplementedError

    def _outstanding(self, p: int) -> int:
        raise NotImplementedError

    def _fenced(self, reader, slot: int) -> bool:
        raise NotImplementedError

    def take_from_store(self, slot: int, reader, gate: Hold | None,
                        target: str) -> tuple[Cursor, Hold] | None:
        raise NotImplementedError

    def _failures_op(self, ps: Cursor, counts: list[tuple[int, int]]) -> Callable:
        raise NotImplementedError

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
        if not owned and not core.handoffs:
            return [], handout
        flow.rr = (flow.rr + 1) % max(len(owned), 1)
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
        if core.handoffs:
            self._take_early(flow, want, out, handout, reader, holds)
        for d in handout.dead:
            self.parts[self.slot_of[d.partition]].note_dead([d.seq])
        flow.inflight += len(out)
        if not out and flow.pending_error is not None:
            err, flow.pending_error = flow.pending_error, None
            raise err
        return out, handout

    def _take_early(self, flow, want: int, out: list[Message], handout: Handout, reader,
                    holds: Holds | None) -> None:
        """Under ``ordering="key"``: take from the partitions handed off to ``flow`` whose
        handoffs have not ended, passing over the keys their sources still hold
        (``key_handoff``)."""
        for slot, source in early_slots(self.core, self.flows, self.parts, flow.flow_id):
            if len(out) >= want:
                return
            ps = self.parts[slot]
            gate = holds.gate(ps.sp) if holds is not None else None
            hold: Hold | None
            if ps.remote_held:          # a source of another process: from the store
                found = self.take_from_store(slot, reader, gate, flow.flow_id)
                if found is None:
                    continue
                ps, hold = found
            else:
                hold = draining_hold(ps, source, gate)
            if hold is None or ps.keyed is None:
                continue
            ps.keyed.early = flow.flow_id
            ps.take(reader, self.qid, self.name, flow, want, out, handout, hold)
            mark = ps.mark(reader, self.qid)
            if mark is not None:
                handout.marks[ps.sp] = mark

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
            ps.put_back(m.seq, m.key, m.redelivered)
        for d in handout.dead:
            ps = self.part(d.partition)
            if ps is not None:
                ps.forget_dead([d.seq])
                ps.put_back(d.seq, d.key, False)

    def collected(self, handout: Handout) -> None:
        """A collect's writes are durable: dead messages are acked."""
        self._acked_dead(handout.dead)

    def _acked_dead(self, dead: list[DeadMessage]) -> None:
        for d in dead:
            ps = self.part(d.partition)
            if ps is not None:
                ps.ack.add([d.seq])
                ps.note_dead([d.seq])

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
        """Partitions waiting out a nack's delay now (each holds back its nacked message), and
        under ``ordering="key"`` keys waiting out one."""
        return sum(1 for ps in self.parts if ps.wait_until > now) + sum(
            1 for ps in self.parts if ps.keyed is not None
            for entry in ps.keyed.pending.values() if entry[2] > now)

    def ack(self, flow, msgs, now: float, reader) -> list:
        """Apply acks in memory and return the writes. Fencing (rule `fencing`): an ack of a message of a
        partition the flow no longer holds (it moved to another flow after a handoff timed out,
        or the flow left) changes nothing and raises ``FlowFenced``; the message belongs to the
        partition's current flow, which gets it redelivered. A batch is taken whole or not at
        all. Late acks of messages whose partition no longer exists change nothing either way.
        An ack of a message that died since it was handed out (``dead_letter``) raises
        ``FlowFenced`` too: it is in the dead message queue, and acking it changes nothing."""
        name, slot_of, owner, parts = self.name, self.slot_of, self.core.owner, self.parts
        msgs = list(msgs)
        groups: dict[int, list[Message]] = {}       # partition -> its messages, in order
        for m in msgs:
            if m[0] != name:
                raise InvalidAck(f"message of queue {m.queue!r} acked on a flow of {name!r}")
            group = groups.get(m[1])
            if group is None:
                groups[m[1]] = [m]
            else:
                group.append(m)
        fid = flow.flow_id
        foreign = {p: slot for p in groups if (slot := slot_of.get(p)) is not None
                   and owner[slot] != fid}      # held by another flow (or handed off to this)
        if foreign:
            fenced = [m for p, slot in foreign.items() for m in groups[p]
                      if not target_holds(self.core, parts[slot], slot, fid, m[2])]
            if fenced:
                raise fenced_error(name, flow, fenced, "acked")
        recent = recent_dead_of(reader, self.qid)
        # acks written outside delivery not taken in yet: an operator may have killed any of them
        unseen = outside_count(reader, self.qid) != self.outside
        by_p: dict[int, list[int]] = {}     # slot -> seqs
        stranded: list[int] = []
        dead: list[Message] = []
        for partition, group in groups.items():
            slot = slot_of.get(partition)
            if slot is None:
                if partition == PARENT:
                    stranded += [m[2] for m in group]
                continue            # else removed by scaling: its messages are gone
            ps = parts[slot]
            top = max(m[2] for m in group)
            if ps.stale or top > ps.ack.delivered_mark:
                ps.refresh(reader.ack_state(self.qid, ps.sp),
                           not ps.stale or self._fenced(reader, slot))
            mark = ps.ack.delivered_mark
            if top > mark:
                never = next(m for m in group if m[2] > mark)
                raise InvalidAck(f"{name} partition {partition} seq {never[2]} was never "
                                 f"delivered")
            floor, above, killed = ps.ack.floor, ps.ack.above, ps.dead
            seqs: list[int] = []
            for m in group:
                seq = m[2]
                acked = seq < floor or seq in above
                if (killed and seq in killed) or ((acked or unseen) and seq in recent(ps.sp)):
                    dead.append(m)
                elif not acked:
                    seqs.append(seq)
            if seqs:
                by_p[slot] = seqs
        if dead:
            killed_ids = {id(m) for m in dead}
            raise dead_error(name, flow, [m for m in msgs if id(m) in killed_ids])
        if stranded:
            check_delivered_from_parent(self.name, self.qid, flow.flow_id in self.flows,
                                        stranded, reader)
        qid = self.qid
        ops: list[Callable] = [] if not stranded else [lambda w: ack_parent_log(w, qid, stranded)]
        if not by_p:
            return ops
        items = [(self.parts[p].sp, seqs) for p, seqs in by_p.items()]
        return ops + [lambda w: [w.ack(qid, p, seqs) for p, seqs in items]] + \
            self.acked_in_memory(by_p, now)

    def acked_in_memory(self, by_p: dict[int, list[int]], now: float) -> list:
        """Take acks of ``by_p`` (slot -> seqs, each in flight) in memory: the cursors' ack
        state, what each flow holds, the handoffs waiting for them. Returns the writes of what
        that set off (a handoff may complete); the acks' own write is the caller's."""
        flows, parts = self.flows, self.parts
        for p, seqs in by_p.items():
            ps = parts[p]
            ps.ack.add(seqs)
            pop = ps.inflight.pop
            for s in seqs:
                holder = flows.get(pop(s, None))     # type: ignore[arg-type]
                if holder is not None:
                    holder.inflight -= 1
        actions = []
        for p in by_p:
            if p in self.core.handoffs:
                actions += self.core.acked(p, self._outstanding(p), now)
        return self._run(actions, now)

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

    def nack(self, flow, msg: Message, now: float, delay: float | None = None,
             now_ns: int = 0) -> tuple[list, list[int]]:
        """Give ``msg`` back: it and every later in-flight message of its partition are delivered
        again, in order, marked redelivered (rule `partition-order` holds across nacks); only
        ``msg`` counts a failed delivery. The partition waits ``delay`` seconds first (None: the
        queue's redelivery delay rule). A nack during a handoff counts like an ack towards it:
        the old flow no longer holds the message. Under ``ordering="key"`` only ``msg``'s key
        comes back and waits (``key_order``). The delay is durable (``Writer.set_delays``,
        ending ``now_ns`` + delay on the wall clock): it holds across a restart and a move to
        another process. Returns the writes to submit and the seqs given back."""
        ps, slot = self.held_part(flow, msg, "nacked")
        if ps is None:
            return [], []
        failures = ps.ack.failed(msg.seq) + 1
        if delay is None:
            delay = redelivery_wait(self.config, failures)
        back = ps.give_back(msg.seq, flow.flow_id, delay, now)
        if back is None:
            return [], []
        flow.inflight -= len(back)
        ops = [self._failures_op(ps, ps.count_lost([msg.seq]))]
        if delay > 0:
            op, until = delays_op(self.qid, ps.sp, msg.seq, now_ns, delay)
            ps.ack.delay([(msg.seq, until)])    # the cursor's own copy: a rebuilt or rewound
            ops.append(op)                      # cursor waits too, before the write is read
        if slot in self.core.handoffs:
            ops += self._run(self.core.acked(slot, self._outstanding(slot), now), now)
        return ops, back

    def reject(self, flow, msg: Message, now: float, now_ns: int,
               headers: dict | None = None) -> list:
        """``msg`` is dead at once (rule `redelivery-limit`): removed from the queue and moved to its
        dead message queue in one write; the rest of its partition flows on. Returns the
        writes."""
        ps, slot = self.held_part(flow, msg, "rejected")
        if ps is None or ps.inflight.get(msg.seq) != flow.flow_id:
            return []
        dead = [rejected(ps.sp, msg.seq, ps.ack.failed(msg.seq) + 1, headers)]
        return [dead_op(self.name, self.qid, dead, now_ns)] + \
            self.rejected_in_memory(flow, slot, dead, now)

    def rejected_in_memory(self, flow, slot: int, dead: list[DeadMessage], now: float) -> list:
        """Take the reject of ``dead`` (one message of ``slot`` in flight to ``flow``) in
        memory; returns the writes of what that set off (a handoff may complete)."""
        ps = self.parts[slot]
        del ps.inflight[dead[0].seq]
        flow.inflight -= 1
        self._acked_dead(dead)
        if slot in self.core.handoffs:
            return self._run(self.core.acked(slot, self._outstanding(slot), now), now)
        return []

    def held_part(self, flow, msg: Message, verb: str) -> tuple[Cursor | None, int]:
        """The cursor of ``msg``'s partition, which ``flow`` must hold (``FlowFenced``); None
        when the partition is gone (scaled down, access type changed)."""
        if msg.queue != self.name:
            raise InvalidAck(f"message of queue {msg.queue!r} {verb} on a flow of {self.name!r}")
        slot = self.slot_of.get(msg.partition)
        if slot is None:
            return None, -1
        if self.core.owner[slot] != flow.flow_id and not target_holds(
                self.core, self.parts[slot], slot, flow.flow_id, msg.seq):
            raise fenced_error(self.name, flow, [msg], verb)
        return self.parts[slot], slot

    def acks_wake_others(self) -> bool:
        """Whether an ack may make a message deliverable to another flow: a handoff is under
        way (its new flow waits for the old one's acks, or takes keys they free), or an online
        scaling holds keys of new partitions until the old ones drain."""
        return bool(self.core.handoffs) or self.cutover is not None

    def full(self, flow: FlowState) -> bool:
        """Whether ``flow`` holds as many unacked messages as the queue lets a flow hold, with
        no error to raise: a collect would hand out nothing, so a receive reads nothing."""
        return (flow.inflight >= self.config.max_delivered_unacked_per_flow
                and flow.pending_error is None)

    def check_flow(self, flow: FlowState) -> None:
        if flow.closed_reason is not None:
            raise FlowClosed(f"flow {flow.name or flow.flow_id} of queue {self.name!r} is unbound"
                             f"{': ' + flow.closed_reason if flow.closed_reason else ''}; bind again")


def delays_op(qid: int, sp: int, seq: int, now_ns: int, delay: float) -> tuple[Callable, int]:
    """The write that keeps a nack's delay of ``seq`` durable (``Writer.set_delays``), and
    when the delay ends (wall clock, ns)."""
    until = now_ns + int(delay * 1e9)
    return (lambda w: w.set_delays(qid, sp, [(seq, until)])), until
