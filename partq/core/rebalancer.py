"""The pure partition-assignment state machine of one queue: the rules of docs/rules.md from
`one-flow-per-partition` to `named-flows` (Solace's partition rebalancing, handoff and message
distribution documents).

Events in, actions out, time as a number: no threads, no I/O, no clock, no randomness. The broker
feeds it ``bind``, ``unbind``, ``acked``, ``tick`` and ``partition_count_changed`` and carries out
the actions it returns; the hypothesis state machine in ``tests/`` drives it the same way.

Vocabulary
* A *flow* is a bound consumer. A flow holding partitions is *active*; a bound flow holding none
  is a *standby* (rule `standby-flows`). An unbound flow that still holds partitions during the
  rebalance delay is a *ghost*: its partitions are Unbound until it returns (rules `bind-hint`,
  `named-flows`) or the delay ends.
* A *handoff* (rule `handoff`) moves one partition from its owner (the source) to another flow: the
  partition is paused, then reassigned once the broker reports the source has nothing
  outstanding from it (``acked(p, 0)``) or ``max_handoff_time`` has passed.

Choices where Solace's documents are silent (written down in docs/behaviour.md):
* Partitions owned by nobody (a new queue, or every consumer gone for longer than the delay)
  are given to the first flows that bind at once: nothing moves, so there is nothing to hold.
* The holddown deadline runs from the *first* trigger and is not pushed back by later ones
  (Solace's partition rebalancing document: "the maximum delay between the first and last
  consumer instance change").
* All handoffs the algorithm plans start together; each pauses only its own partition (rule
  `handoff-isolation`).
* The partition handed off is the donor's highest-numbered one (Solace's handoff example moves
  partition 1).
"""
from __future__ import annotations

import heapq
from collections.abc import Iterable

from partq.core.actions import (
    Action,
    Assign,
    FlowActive,
    FlowInfo,
    Handoff,
    Pause,
    Redeliver,
    Resume,
)
from partq.states import PartitionState, RebalanceState

# Partition statuses (rule `partition-status`), rebalancing statuses (rule `rebalance-status`).
UNASSIGNED, READY, PAUSED, UNBOUND = (PartitionState.UNASSIGNED, PartitionState.READY,
                                      PartitionState.PAUSED, PartitionState.UNBOUND)
HOLDDOWN, REBALANCING = RebalanceState.HOLDDOWN, RebalanceState.REBALANCING


class Rebalancer:
    """Assignment state of one queue. Not thread-safe: the broker serialises calls."""

    def __init__(self, partitions: int, rebalance_delay: float, max_handoff_time: float) -> None:
        self.n = partitions
        self.rebalance_delay = rebalance_delay
        self.max_handoff_time = max_handoff_time
        self.flows: dict[str, FlowInfo] = {}
        self.owner: list[str | None] = [None] * partitions
        # Fencing (rule `fencing`): a partition's epoch goes up each time its owner changes, so an ack
        # made under an earlier assignment can be told apart even by the same flow.
        self.epoch: list[int] = [0] * partitions
        self.handoffs: dict[int, Handoff] = {}
        self.holddown_deadline: float | None = None
        self._next_order = 0

    # ------------------------------------------------------------------ queries
    @property
    def status(self) -> RebalanceState:
        if self.holddown_deadline is not None:
            return HOLDDOWN
        return REBALANCING if self.handoffs else RebalanceState.READY

    def partition_status(self, p: int) -> PartitionState:
        owner = self.owner[p]
        if owner is None:
            return UNASSIGNED
        if p in self.handoffs:
            return PAUSED
        return READY if self.flows[owner].bound else UNBOUND

    def partitions_of(self, flow_id: str) -> set[int]:
        info = self.flows.get(flow_id)
        return set(info.partitions) if info else set()

    def next_deadline(self) -> float | None:
        times = [h.deadline for h in self.handoffs.values()]
        if self.holddown_deadline is not None:
            times.append(self.holddown_deadline)
        return min(times) if times else None

    def bound_flows(self) -> list[FlowInfo]:
        return [f for f in self.flows.values() if f.bound]

    def find_bound(self, name: str) -> FlowInfo | None:
        return next((f for f in self.flows.values() if f.bound and f.name == name), None)

    # ------------------------------------------------------------------ events
    def bind(self, flow_id: str, now: float, name: str | None = None,
             hint: Iterable[int] | None = None) -> list[Action]:
        """A consumer binds. A named consumer, or one presenting its previous partition set, that
        finds its ghost during the delay takes the ghost's partitions back unchanged (rules
        `bind-hint`, `named-flows`)."""
        # a delay that ended before this bind has ended (rule `stale-hint`)
        out: list[Action] = self.tick(now)
        ghost = self._matching_ghost(name, None if hint is None else set(hint))
        if ghost is not None:
            del self.flows[ghost.flow_id]
            self.flows[flow_id] = FlowInfo(flow_id, name, ghost.order, True, set(ghost.partitions))
            for p in sorted(ghost.partitions):
                self._set_owner(p, flow_id)
                out += [Assign(p, flow_id), Redeliver(p), Resume(p)]
            out.append(FlowActive(flow_id, True))
        else:
            consumers_before = len(self.bound_flows())
            self.flows[flow_id] = FlowInfo(flow_id, name, self._take_order())
            out += self._assign_unowned(now)
            if consumers_before < self.n:
                self._trigger(now)
        out += self._settle_or_run(now)
        return out

    def unbind(self, flow_id: str, now: float, leave: bool = False) -> list[Action]:
        """A consumer unbinds or disconnects (rule `liveness` makes no distinction). ``leave``:
        it said it will not come back (rule `leave`): no ghost waits for it; its partitions go
        to the flows still bound at once, or are owned by nobody, for the next to bind."""
        info = self.flows.get(flow_id)
        if info is None or not info.bound:
            return []
        out: list[Action] = self.tick(now)
        excess = len(self.bound_flows()) > self.n   # rule `rebalance-triggers`: excess consumers?
        # Handoffs into this flow go back to their sources (and are planned again below);
        # handoffs out of it complete now, since a flow that is gone has nothing to acknowledge.
        replan = False
        for p, h in sorted(self.handoffs.items()):
            if h.target == flow_id:
                del self.handoffs[p]
                out.append(Resume(p))
                replan = True
            elif h.source == flow_id:
                out += self._complete_handoff(p)
        if leave and info.partitions:
            del self.flows[flow_id]
            for p in sorted(info.partitions):
                out += self._move(p, flow_id, None)
            out += self._assign_unowned(now)
            return out + self._settle_or_run(now)
        if not info.partitions:
            del self.flows[flow_id]
            if replan and self.holddown_deadline is None:
                out += self._start_moves(now)
            return out + self._settle_or_run(now)
        standby = self._first_standby(exclude=flow_id) if excess else None
        if standby is not None:
            del self.flows[flow_id]
            for p in sorted(info.partitions):
                out += self._move(p, None, standby.flow_id)
            return out + self._settle_or_run(now)
        info.bound = False  # a ghost until it returns or the delay ends
        self._trigger(now)
        return out + self._settle_or_run(now)

    def acked(self, p: int, outstanding: int, now: float) -> list[Action]:
        """The broker reports how many messages of ``p`` its owner still holds unacked."""
        if outstanding == 0 and p in self.handoffs:
            return self._complete_handoff(p) + self._settle_or_run(now)
        return []

    def tick(self, now: float) -> list[Action]:
        """Run every timer due at ``now``."""
        out: list[Action] = []
        for p, h in sorted(self.handoffs.items()):
            if h.deadline <= now:
                out += self._complete_handoff(p)
        if self.holddown_deadline is not None and self.holddown_deadline <= now:
            self.holddown_deadline = None
            out += self._rebalance(now)
        return out

    def partition_count_changed(self, n: int, now: float) -> list[Action]:
        """Scaling finished (rule `scaling`): drop or add partitions and rebalance at once, no holddown."""
        out: list[Action] = []
        for p in range(n, self.n):
            self.handoffs.pop(p, None)
            owner = self.owner[p]
            if owner is not None:
                out += self._move(p, owner, None)
        del self.owner[n:]
        del self.epoch[n:]
        self.owner.extend([None] * (n - len(self.owner)))
        self.epoch.extend([0] * (n - len(self.epoch)))
        self.n = n
        self.holddown_deadline = None
        return out + self._rebalance(now)

    def drop_all(self) -> list[Action]:
        """Every flow is unbound (queue type change, rule `ingress-egress`); partitions become Unassigned."""
        out: list[Action] = []
        self.handoffs.clear()
        for p, owner in enumerate(self.owner):
            if owner is not None:
                out += self._move(p, owner, None)
        self.flows.clear()
        self.holddown_deadline = None
        return out

    # ------------------------------------------------------------------ internals
    def _set_owner(self, p: int, flow_id: str | None) -> None:
        if self.owner[p] != flow_id:
            self.owner[p] = flow_id
            self.epoch[p] += 1

    def _take_order(self) -> int:
        self._next_order += 1
        return self._next_order

    def _matching_ghost(self, name: str | None, hint: set[int] | None) -> FlowInfo | None:
        for f in self.flows.values():
            if f.bound or not f.partitions:
                continue
            if (name is not None and f.name == name) or (hint is not None and hint == f.partitions):
                return f
        return None

    def _first_standby(self, exclude: str | None = None) -> FlowInfo | None:
        targets = {h.target for h in self.handoffs.values()}
        for f in sorted(self.flows.values(), key=lambda f: f.order):
            if f.bound and not f.partitions and f.flow_id != exclude and f.flow_id not in targets:
                return f
        return None

    def _trigger(self, now: float) -> None:
        if self.holddown_deadline is None:
            self.holddown_deadline = now + self.rebalance_delay

    def _settle_or_run(self, now: float) -> list[Action]:
        """After a bind or unbind: a zero delay rebalances now; a consumer set that is back to
        a settled state ends the holddown with nothing moved (rule `rebalance-delay`)."""
        if self.holddown_deadline is None:
            return []
        if self.rebalance_delay <= 0 or self.holddown_deadline <= now:
            self.holddown_deadline = None
            return self._rebalance(now)
        if self._settled():
            self.holddown_deadline = None
        return []

    def _settled(self) -> bool:
        if any(not f.bound for f in self.flows.values()):
            return False
        if self.bound_flows() and any(o is None for o in self.owner):
            return False
        return not self._would_move()

    def _would_move(self) -> bool:
        """Whether ``_plan_moves`` would plan anything: its first step, without the plan."""
        flows = self._balance_set()
        if len(flows) < 2:
            return False
        counts = self._future_counts(flows)
        low = min(counts.values())
        return any(counts[f.flow_id] - low > 1 and any(p not in self.handoffs for p in f.partitions)
                   for f in flows)

    def _move(self, p: int, source: str | None, target: str | None) -> list[Action]:
        """Reassign ``p`` at once (no pause: the source is gone or there is none)."""
        out: list[Action] = []
        if source is not None and source in self.flows:
            src = self.flows[source]
            src.partitions.discard(p)
            if not src.partitions and src.bound:
                out.append(FlowActive(source, False))
        self._set_owner(p, target)
        out.append(Assign(p, target))
        if target is not None:
            dst = self.flows[target]
            dst.partitions.add(p)
            out += [Redeliver(p), Resume(p)]
            if len(dst.partitions) == 1:
                out.append(FlowActive(target, True))
        return out

    def _complete_handoff(self, p: int) -> list[Action]:
        h = self.handoffs.pop(p)
        return self._move(p, h.source, h.target)

    def _balance_set(self) -> list[FlowInfo]:
        """The bound flows that take part in balancing: holders first, then by bind order, at
        most one per partition; the rest are standbys."""
        bound = sorted(self.bound_flows(), key=lambda f: (not f.partitions, f.order))
        return bound[: self.n]

    def _future_counts(self, flows: list[FlowInfo]) -> dict[str, int]:
        counts = {f.flow_id: len(f.partitions) for f in flows}
        for h in self.handoffs.values():
            if h.source in counts:
                counts[h.source] -= 1
            if h.target in counts:
                counts[h.target] += 1
        return counts

    def _assign_unowned(self, now: float) -> list[Action]:
        """Step 2 of rule `rebalance-algorithm`: partitions owned by nobody go to the flows with fewest,
        immediately."""
        flows = self._balance_set()
        if not flows:
            return []
        counts = self._future_counts(flows)
        order = {f.flow_id: f.order for f in flows}
        out: list[Action] = []
        for p in range(self.n):
            if self.owner[p] is None:
                target = min(counts, key=lambda f: (counts[f], order[f]))
                counts[target] += 1
                out += self._move(p, None, target)
        return out

    def _plan_moves(self) -> list[tuple[int, str, str]]:
        """Steps 4-5 of rule `rebalance-algorithm` on paper: (partition, donor, recipient) moves until
        balanced (rule `balanced`)."""
        flows = self._balance_set()
        if len(flows) < 2:
            return []
        counts = self._future_counts(flows)
        order = {f.flow_id: f.order for f in flows}
        movable = {f.flow_id: sorted(p for p in f.partitions if p not in self.handoffs)
                   for f in flows}
        # Two heaps give the same choices as scanning every flow per move, in O(moves log flows):
        # the recipient is the flow with fewest (earliest bound on ties); the donor is the flow
        # with most among those that still have a partition not already moving (latest bound on
        # ties), as long as it holds at least two more than the recipient. A flow whose count
        # changes gets a fresh entry; stale entries are dropped when they reach the top.
        def recipient_entry(f):
            return (counts[f], order[f], f)

        def donor_entry(f):
            return (-counts[f], -order[f], f) if movable[f] else None

        def top(heap, current):
            while heap:
                entry = heap[0]
                if entry == current(entry[2]):
                    return entry
                heapq.heappop(heap)
            return None

        recipients = [recipient_entry(f) for f in counts]
        donors = [e for e in map(donor_entry, counts) if e is not None]
        heapq.heapify(recipients)
        heapq.heapify(donors)
        moves: list[tuple[int, str, str]] = []
        while True:
            r, d = top(recipients, recipient_entry), top(donors, donor_entry)
            if r is None or d is None or -d[0] - r[0] <= 1:
                return moves     # balanced, or every surplus partition is already moving
            recipient, donor = r[2], d[2]
            p = movable[donor].pop()
            moves.append((p, donor, recipient))
            counts[donor] -= 1
            counts[recipient] += 1
            for f in (donor, recipient):
                heapq.heappush(recipients, recipient_entry(f))
                entry = donor_entry(f)
                if entry is not None:
                    heapq.heappush(donors, entry)

    def _rebalance(self, now: float) -> list[Action]:
        """The algorithm of rule `rebalance-algorithm`: drop ghosts, map unowned partitions to the flows
        with fewest, then start one handoff per partition that must move."""
        out: list[Action] = []
        for f in [f for f in self.flows.values() if not f.bound]:
            for p in sorted(f.partitions):
                self._set_owner(p, None)
                out.append(Assign(p, None))
            del self.flows[f.flow_id]
        out += self._assign_unowned(now)
        return out + self._start_moves(now)

    def _start_moves(self, now: float) -> list[Action]:
        """Start a handoff (or, with no handoff time, an immediate move) per planned move."""
        out: list[Action] = []
        for p, donor, recipient in self._plan_moves():
            if self.max_handoff_time <= 0:
                out += self._move(p, donor, recipient)
                continue
            self.handoffs[p] = Handoff(donor, recipient, now + self.max_handoff_time)
            out.append(Pause(p))
        return out

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict:
        return {
            "n": self.n,
            "next_order": self._next_order,
            "flows": [[f.flow_id, f.name, f.order, f.bound, sorted(f.partitions)]
                      for f in self.flows.values()],
            "handoffs": [[p, h.source, h.target] for p, h in sorted(self.handoffs.items())],
            "holddown": self.holddown_deadline is not None,
            "epochs": list(self.epoch),
        }

    @classmethod
    def restored(cls, state: dict, rebalance_delay: float, max_handoff_time: float,
                 now: float, remaining: float | None = None) -> Rebalancer:
        """The state after a broker restart: every flow of the previous run is a ghost holding
        what it held (a handoff in progress stays with its source, whose consumer still counts it
        in its hint), and the holddown runs so consumers can come back (rule `named-flows`):
        from ``now``, or, when every flow had left before the last run closed, for the
        ``remaining`` seconds of the holddown their leaving started (they are not waited for
        twice)."""
        core = cls(state["n"], rebalance_delay, max_handoff_time)
        core._next_order = state["next_order"]
        core.epoch = list(state.get("epochs", core.epoch))
        for flow_id, name, order, _bound, parts in state["flows"]:
            if parts:
                core.flows[flow_id] = FlowInfo(flow_id, name, order, False, set(parts))
                for p in parts:
                    core.owner[p] = flow_id
        if core.flows:
            core.holddown_deadline = now + (rebalance_delay if remaining is None
                                            else min(rebalance_delay, max(0.0, remaining)))
        return core
