"""Partition moves of one queue, as the process that runs its delivery carries them out: one log
line per rebalance decision (which partitions move, and why), per handoff start and end (acked,
timed out, its source left, cancelled; messages outstanding) and per holddown; the durable
counts of rebalances and handoffs (queue meta, written in the commit that stores the new
assignment); the durations of both for the metrics (``Tally.observe``).

The pure core is left as it is: after the shell carried out the core's actions and the stored
state changed, ``Moves.observe`` compares the core's assignment with the one it saw last.

Vocabulary of the log lines and counts
* A *rebalance* is one decision that moves partitions between flows or starts handoffs (a
  holddown that ends with the consumers as before, rule `rebalance-delay`, moves nothing and is no rebalance;
  nor is a consumer that comes back within the delay and keeps its partitions, rule `bind-hint`). Its duration
  runs from the decision until the last handoff it started ended (0 when nothing had to wait).
* A handoff ends ``acked`` (its source acked or nacked everything it held), ``timed_out``
  (``max_handoff_time`` passed: what the source held is redelivered to the target),
  ``source_left`` (the source unbound or disconnected), or ``cancelled`` (the target left,
  or scaling removed the partition; it stays where it was).

Runs under the dispatcher's lock, like the runtime that calls it.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import msgpack

from partq.states import RebalanceState
from partq.storage.encoding import PARENT

log = logging.getLogger("partq.delivery")

COUNTS = b"moves"         # queue meta: msgpack {"rebalances": n, "handoffs_<outcome>": n}
OUTCOMES = ("acked", "timed_out", "source_left", "cancelled")
MAX_LISTED = 16           # moves named in one log line; the rest are counted
HOLDDOWN, READY = RebalanceState.HOLDDOWN, RebalanceState.READY

Held = Callable[[int, str], "int | None"]    # (slot, flow id) -> messages it holds unacked


def read_counts(reader, qid: int) -> dict[str, int]:
    """The durable counts of queue id ``qid`` (an empty dict before the first rebalance; a
    damaged value reads as empty: counts must never stop delivery)."""
    raw = reader.queue_meta(qid, COUNTS)
    if raw is None:
        return {}
    try:
        doc = msgpack.unpackb(raw, raw=False)
    except Exception:
        return {}
    return {str(k): int(v) for k, v in doc.items()} if isinstance(doc, dict) else {}


@dataclass(slots=True)
class _Handoff:
    source: str
    target: str
    deadline: float
    started: float
    outstanding: int | None = None      # what the source held at the last look


@dataclass(slots=True)
class _Rebalance:
    started: float
    waiting: set[int] = field(default_factory=set)     # slots whose handoffs have not ended


class Moves:
    def __init__(self, queue: str, qid: int, core, tally, now: float) -> None:
        self.queue, self.qid, self.tally = queue, qid, tally
        self._owner: list[str | None] = list(core.owner)
        self._flows = {fid: (f.name, f.bound) for fid, f in core.flows.items()}
        self._status = str(core.status)
        self._handoffs = {p: _Handoff(h.source, h.target, h.deadline, now)
                          for p, h in core.handoffs.items()}
        self._rebalances: list[_Rebalance] = []

    def sample(self, held: Held) -> None:
        """Note what the sources of handoffs in progress hold, before the shell carries out
        actions that may redeliver it (called first thing by the runtime's ``_run``)."""
        for p, h in self._handoffs.items():
            n = held(p, h.source)
            if n is not None:
                h.outstanding = n

    def observe(self, core, now: float, index: list[int], held: Held) -> list:
        """The stored state changed: log and count what moved since the last call. Returns the
        writes to submit with the new state (the durable counts), possibly none."""
        flows = {fid: (f.name, f.bound) for fid, f in core.flows.items()}
        joined = [fid for fid, (_, bound) in flows.items()
                  if bound and not self._flows.get(fid, (None, False))[1]]
        left = [fid for fid, (_, bound) in self._flows.items()
                if bound and not flows.get(fid, (None, False))[1]]
        names = {**{fid: n for fid, (n, _) in self._flows.items()},
                 **{fid: n for fid, (n, _) in flows.items()}}

        def who(fid: str | None) -> str:
            return "nobody" if fid is None else str(names.get(fid) or fid)

        def part(p: int) -> str:
            sp = index[p] if p < len(index) else p
            return "parent" if sp == PARENT else str(sp)

        counts: dict[str, int] = {}
        ended = self._ended(core, now, flows, who, part, counts)
        moves, kept = self._moved(core, flows, joined, ended, who, part, counts)
        started = [p for p in sorted(core.handoffs) if p not in self._handoffs]
        for p in started:
            h = core.handoffs[p]
            self._handoffs[p] = _Handoff(h.source, h.target, h.deadline, now, held(p, h.source))
        moves = [f"{part(p)} {who(core.handoffs[p].source)} -> {who(core.handoffs[p].target)} "
                 f"(handoff)" for p in started] + moves
        why = self._why(core, joined, left, who)
        if moves:
            counts["rebalances"] = counts.get("rebalances", 0) + 1
            shown = moves[:MAX_LISTED] + ([f"and {len(moves) - MAX_LISTED} more"]
                                          if len(moves) > MAX_LISTED else [])
            log.info("queue %r: rebalance after %s: partition %s", self.queue, why or "a change",
                     ", ".join(shown))
            rebalance = _Rebalance(now, set(started))
            if rebalance.waiting:
                self._rebalances.append(rebalance)
            else:
                self.tally.observe("rebalance", self.queue, 0.0)
        for p in started:
            h = self._handoffs[p]
            log.info("queue %r: handoff of partition %s from %s to %s started: %s unacked "
                     "message(s) to wait for, at most %g s", self.queue, part(p), who(h.source),
                     who(h.target), "?" if h.outstanding is None else h.outstanding,
                     core.max_handoff_time)
        for fid, parts in kept:
            log.info("queue %r: flow %s came back within the rebalance delay and keeps partition(s)"
                     " %s", self.queue, who(fid), ", ".join(parts))
        self._status_changed(core, why, bool(moves), who)
        self._owner = list(core.owner)
        self._flows = flows
        self._status = str(core.status)
        return [self._count_op(counts)] if counts else []

    # ------------------------------------------------------------------ the parts of observe
    def _ended(self, core, now: float, flows: dict, who, part, counts: dict) -> set[int]:
        """Handoffs that ended since the last look: log, count, time them."""
        ended = {p for p in self._handoffs if p not in core.handoffs}
        for p in sorted(ended):
            h = self._handoffs.pop(p)
            owner = core.owner[p] if p < core.n else None
            if owner != h.target:
                outcome = "cancelled"
            elif now >= h.deadline:
                outcome = "timed_out"
            elif not flows.get(h.source, (None, False))[1]:
                outcome = "source_left"
            else:
                outcome = "acked"
            counts["handoffs_" + outcome] = counts.get("handoffs_" + outcome, 0) + 1
            seconds = max(0.0, now - h.started)
            self.tally.observe("handoff", self.queue, seconds)
            held = "?" if h.outstanding is None else str(h.outstanding)
            detail = {
                "acked": "acked: nothing outstanding",
                "timed_out": f"timed out (max_handoff_time {core.max_handoff_time:g} s): {held} "
                             f"unacked message(s) redelivered to {who(h.target)}",
                "source_left": f"its source left: {held} unacked message(s) redelivered to "
                               f"{who(h.target)}",
                "cancelled": f"cancelled: the partition stays with {who(owner)}",
            }[outcome]
            log.log(logging.WARNING if outcome == "timed_out" else logging.INFO,
                    "queue %r: handoff of partition %s from %s to %s ended after %.3f s, %s",
                    self.queue, part(p), who(h.source), who(h.target), seconds, detail)
            for rebalance in list(self._rebalances):
                rebalance.waiting.discard(p)
                if not rebalance.waiting:
                    self._rebalances.remove(rebalance)
                    self.tally.observe("rebalance", self.queue, max(0.0, now - rebalance.started))
        return ended

    def _moved(self, core, flows: dict, joined: list[str], ended: set[int], who, part,
               counts: dict) -> tuple[list[str], list[tuple[str, list[str]]]]:
        """Assignments that changed other than by a handoff ending: the moves of a decision,
        and the partitions consumers that came back keep (flow id, partitions)."""
        moves: list[str] = []
        kept: dict[str, list[str]] = {}
        old_n, new_n = len(self._owner), core.n
        for p in range(max(old_n, new_n)):
            old = self._owner[p] if p < old_n else None
            new = core.owner[p] if p < new_n else None
            if old == new or p in ended:
                continue
            if p >= new_n:
                moves.append(f"{part(p)} removed")
            elif new is None:
                moves.append(f"{part(p)} {who(old)} -> nobody")
            elif old is None:
                moves.append(f"{part(p)} -> {who(new)}")
            elif new in joined and not self._flows.get(old, (None, True))[1]:
                # a ghost came back (rules `bind-hint` and `named-flows`)
                kept.setdefault(new, []).append(part(p))
            elif flows.get(old, (None, False))[1] and core.max_handoff_time > 0:
                # a handoff that completed within the decision: its source held nothing
                moves.append(f"{part(p)} {who(old)} -> {who(new)} (handed off, nothing unacked)")
                counts["handoffs_acked"] = counts.get("handoffs_acked", 0) + 1
                self.tally.observe("handoff", self.queue, 0.0)
            else:
                moves.append(f"{part(p)} {who(old)} -> {who(new)}")
        return moves, list(kept.items())

    def _why(self, core, joined: list[str], left: list[str], who) -> str:
        reasons = []
        if joined:
            reasons.append(f"flow {', '.join(who(f) for f in joined)} bound")
        if left:
            reasons.append(f"flow {', '.join(who(f) for f in left)} left")
        if len(self._owner) != core.n:
            reasons.append(f"the partition count changed from {len(self._owner)} to {core.n}")
        if not reasons and self._status == HOLDDOWN and core.status != HOLDDOWN:
            reasons.append(f"the rebalance delay of {core.rebalance_delay:g} s ended")
        return "; ".join(reasons)

    def _status_changed(self, core, why: str, moved: bool, who) -> None:
        status = str(core.status)
        if status == self._status:
            return
        if status == HOLDDOWN:
            log.info("queue %r: %s: holding down for %g s before rebalancing (nothing moves if "
                     "the consumers are back as before by then)", self.queue, why or "a change",
                     core.rebalance_delay)
        elif self._status == HOLDDOWN and not moved:
            log.info("queue %r: holddown ended with nothing to move", self.queue)
        if status == READY and (moved or self._status != HOLDDOWN):
            held = sorted((who(f.flow_id), len(f.partitions)) for f in core.bound_flows())
            log.info("queue %r: balanced: %s", self.queue,
                     ", ".join(f"{name} holds {n}" for name, n in held) or "no flows bound")

    def _count_op(self, counts: dict[str, int]):
        qid = self.qid

        def op(w) -> None:
            doc = read_counts(w, qid)
            for key, n in counts.items():
                doc[key] = doc.get(key, 0) + n
            w.put_queue_meta(qid, COUNTS, msgpack.packb(doc, use_bin_type=True))
        return op
