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

from partq.config import QueueConfig
from partq.core.actions import Assign, FlowActive, Pause, Redeliver, Resume
from partq.core.rebalancer import Rebalancer
from partq.delivery.cursor import Cursor
from partq.delivery.flow_calls import FlowCalls
from partq.delivery.flow_state import FlowState
from partq.delivery.held_view import handed_to_remote, held_slot, reported_slot
from partq.delivery.holds import Holds, clear_cutover, read_cutover
from partq.delivery.key_handoff import early_slots, give_back, keeps_inflight
from partq.delivery.layout import delivery_layout, describe_mode
from partq.delivery.moves import Moves
from partq.delivery.outside import outside_count
from partq.delivery.remote_handoffs import RemoteHandoffs
from partq.delivery.saved_state import Assignment, DeliveryView, decode_state, encode_state, view_of
from partq.delivery.tally import Tally
from partq.message import FlowChangeUpdate
from partq.storage import crashpoints
from partq.storage.encoding import decode_meta

log = logging.getLogger("partq.delivery")



class QueueDelivery(RemoteHandoffs, FlowCalls):
    def __init__(self, config: QueueConfig, reader, now: float, tally: Tally | None = None,
                 now_ns: int = 0) -> None:
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
            # flows that had all left before a clean close: their holddown goes on
            until = state.holddown_until_ns
            remaining = (until - now_ns) / 1e9 if until is not None and now_ns else None
            self.core = Rebalancer.restored(state.core, config.rebalance_delay,
                                            config.max_handoff_time, now, remaining)
        self.owner_token = b""      # this process's claim in the store (``owner``)
        self.claimed = False        # ... resolved
        self.claim_error: Exception | None = None   # ... refused by the store
        self.fenced = False         # another process claimed the queue since: step down
        self.seen_version = -1      # store version its config, claim, ... were last read at
        self.parts: list[Cursor] = []
        self.store_early: dict[int, str] = {}   # ``RemoteHandoffs``
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
        keyed = self.config.ordering == "key"
        self.parts = [kept.get(sp) or Cursor(sp, reader.ack_state(self.qid, sp), keyed=keyed)
                      for sp in index]
        self.slot_of = {sp: slot for slot, sp in enumerate(index)}

    def part(self, sp: int) -> Cursor | None:
        """The delivery state of storage partition ``sp``; None if this queue does not deliver
        it."""
        slot = self.slot_of.get(sp)
        return None if slot is None else self.parts[slot]

    def partitions_of(self, flow_id: str) -> frozenset[int]:
        """The storage partitions a flow holds, and under ``ordering="key"`` those handed off to
        it that it takes from already (``key_handoff``)."""
        parts = self.parts
        slots = self.core.partitions_of(flow_id)
        if self.core.handoffs:
            slots |= {slot for slot, _ in early_slots(self.core, self.flows, parts, flow_id)}
        return frozenset(parts[slot].sp for slot in slots)

    def apply_config(self, config: QueueConfig, raw: bytes, reader, now: float) -> list:
        """The stored config changed (here or in another process): take the new settings; on a
        new partition count rebalance at once (rules `rebalance-triggers` and `scaling`); on a change between
        partitioned and non-partitioned unbind every flow, telling it why (rule `ingress-egress`)."""
        old = self.config
        self.config, self.config_raw = config, raw
        if config.ordering != old.ordering:     # from the next receive on (rule `key-ordering`)
            for ps in self.parts:
                ps.set_ordering(config.ordering == "key")
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

    def unbind(self, flow, now: float, leave: bool = False) -> list:
        """The flow left: its unacked messages come back to whoever takes its partitions, each
        counting a lost delivery (rule `delivery-count`). ``leave``: for good (rule `leave`:
        no ghost waits out the rebalance delay)."""
        self.flows.pop(flow.flow_id, None)
        ops = []
        for slot, ps in enumerate(self.parts):
            if self.store_early.get(slot) == flow.flow_id:
                del self.store_early[slot]      # its handoff's source takes the partition on
                ops += self.drop_from_store(ps)
                continue
            lost = [s for s, f in ps.inflight.items() if f == flow.flow_id]
            for seq in lost:
                del ps.inflight[seq]
            if lost:
                ops.append(self._failures_op(ps, ps.count_lost(sorted(lost))))
                if ps.keyed is not None:    # back before later messages of their keys
                    ps.keyed.take_back(sorted(lost))
            if ps.keyed is not None and ps.keyed.early == flow.flow_id:
                ps.keyed.early = None
        return ops + self._run(self.core.unbind(flow.flow_id, now, leave), now)

    def unbind_hung(self, now: float) -> list:
        """Unbind this process's flows whose handler hangs (rule `max-poll-interval`): holding
        unacked messages, no receive, ack or nack for ``max_poll_interval``. Their messages
        come back, counted, to whoever takes their partitions."""
        interval = self.config.max_poll_interval
        ops: list = []
        if not interval:
            return ops
        for state in [s for s in self.flows.values() if s.remote is None]:
            reason = state.poll.hung(now, interval, state.inflight)
            if reason is not None:
                log.warning("queue %r: flow %s unbound: %s", self.name,
                            state.name or state.flow_id, reason)
                state.close(f"unbound by the broker: {reason}")
                ops += self.unbind(state, now)
        return ops

    def config_ops(self, r, now: float) -> list:
        """Apply the queue's stored config if it changed (in this process or another) since
        this runtime last looked."""
        raw = r.queue_raw(self.name)
        if raw is None or raw == self.config_raw:
            return []
        config = QueueConfig.from_dict(decode_meta(raw, f"config of {self.name!r}"))
        return self.apply_config(config, raw, r, now)

    def _failures_op(self, ps: Cursor, counts: list[tuple[int, int]]) -> Callable:
        qid, sp = self.qid, ps.sp
        return lambda w: w.set_failures(qid, sp, counts)

    def tick(self, now: float) -> list:
        return self._run(self.core.tick(now), now)

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
                    source = self.flows.get(self.core.owner[a.p] or "")
                    if source is not None and source.remote is not None:
                        source.reported.pop(a.p, None)  # its counts from before the pause
                    elif a.p < len(self.parts):
                        ops += self.settle_for_remote_target(a.p)
                elif isinstance(a, Resume):
                    ps = self.parts[a.p] if a.p < len(self.parts) else None
                    if ps is not None and ps.keyed is not None and ps.settled \
                            and not ps.remote_held:
                        ps.stale = True     # a target of another process may have taken from it
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
                            ps.draining = None        # (``remote_handoffs``): read it all again
                        elif ps.inflight and not ps.remote_held:
                            # the old flow's deliveries ended unacked (its handoff timed out);
                            # the new flow's, taken during a handoff under "key", go on
                            lost = sorted(s for s, f in ps.inflight.items() if f != a.flow)
                            if lost:
                                ops.append(self._failures_op(ps, ps.count_lost(lost)))
                        elif ps.remote_held:
                            ps.stale, ps.remote_held = True, False   # read its state again
                        if a.flow is None:
                            self._forget_inflight(ps)
                            ps.draining = None
                elif isinstance(a, FlowActive):
                    flow = self.flows.get(a.flow)
                    if flow is not None:
                        flow.changed(FlowChangeUpdate(a.active, self.partitions_of(a.flow)))
                else:
                    raise AssertionError(f"unknown action {a!r}")
            actions = []
            for p in paused:
                actions += self.core.acked(p, self._outstanding(p), now)
        if self.store_early:
            ops += self.sweep_from_store()
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

    def settle_all(self, now: float, now_ns: int) -> list:
        """This process stops delivering the queue (it closes): its flows bound without a name
        leave for good (a named one is waited for); settle every partition it delivers itself;
        when every flow had left (ghosts waited for by the holddown), note when that holddown
        ends, so that the next owner does not wait for them again from its own start (flows
        still bound at the close are waited for from the next owner's first bind, rule
        `named-flows`)."""
        ops = []
        for state in [s for s in self.flows.values() if s.remote is None and s.name is None]:
            ops += self.unbind(state, now, leave=True)  # no name to come back under: it leaves
        for ps in self.parts:
            if not ps.remote_held and not ps.stale:
                ops += self._settle_ops(ps)
        core = self.core
        if not core.flows or core.bound_flows() or core.holddown_deadline is None:
            return ops
        until = now_ns + int(max(0.0, core.holddown_deadline - now) * 1e9)
        blob, qid = encode_state(self.mode, core, holddown_until_ns=until), self.qid
        return ops + [lambda w: w.put_state(qid, blob)]

    def _outstanding(self, p: int) -> int:
        owner = self.core.owner[p]
        if owner is None:
            return 0
        state = self.flows.get(owner)
        if state is not None and state.remote is not None:
            # unknown until it reports a count made after it saw the pause: not nothing
            return state.reported.get(p, 1 if p in self.core.handoffs else 0)
        return self.parts[p].outstanding(owner)

    def _held(self, p: int, flow_id: str) -> int | None:
        """Messages of slot ``p`` the flow holds unacked (None: it is no flow of this runtime)."""
        state = self.flows.get(flow_id)
        if state is None or p >= len(self.parts):
            return None
        return state.reported.get(p, 0) if state.remote is not None else \
            self.parts[p].outstanding(flow_id)

    def report(self, flow: FlowState, counts: dict[int, int], now: float,
               paused: set[int] | None = None, held: dict[int, list] | None = None) -> list:
        """A flow of another process reports what it holds unacked per storage partition: a
        handoff waiting for it may complete, on a count the flow made after it saw the
        partition paused (``paused``; None from a peer that does not say: any count). A count
        made before could miss a message it was taking as the pause began. ``held``: what
        holds messages back on its partitions (``held_view.peer_holds``), for the status.
        Returns the writes to submit."""
        if held is not None:
            flow.reported_held = {slot: h for sp, h in held.items()
                                  if (slot := self.slot_of.get(sp)) is not None}
        actions = []
        for sp, n in counts.items():
            slot = self.slot_of.get(sp)
            if slot is None or self.core.owner[slot] != flow.flow_id:
                continue
            if slot in self.core.handoffs and paused is not None and sp not in paused:
                continue            # counted before it saw the pause: wait for the next count
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
        owner = self.core.owner[p]
        if keeps_inflight(ps, owner):
            give_back(ps, owner, self.flows)    # type: ignore[arg-type]
            return
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
        slots = []
        for slot in view.slots:
            ps = self.part(slot.partition)
            s = self.slot_of[ps.sp] if ps is not None else -1
            shown = handed_to_remote(slot, s, self.core, self.flows) \
                if ps is not None and ps.keyed is not None else None
            if shown is not None:
                slot = shown
            elif ps is not None and (not ps.remote_held or ps.draining is not None):
                slot = held_slot(slot, ps, s, self.core, self.flows, self.parts, now)
            elif ps is not None and slot.flow in self.flows:
                slot = reported_slot(slot, self.flows[slot.flow].reported_held.get(s))
            slots.append(slot)
        return dataclasses.replace(view, delayed=self.delayed(now), slots=slots)

    def _state_ops(self, now: float) -> list:
        blob = encode_state(self.mode, self.core)
        if blob == self._last_blob:
            return []
        self._last_blob = blob
        qid = self.qid
        return [lambda w: w.put_state(qid, blob)] + self.moves.observe(
            self.core, now, [ps.sp for ps in self.parts], self._held)

    # ------------------------------------------------------------------ delivery
