"""Rebalance dry-run (rule `rebalance-dry-run`): what the rebalancer would do, worked out on a copy
of its state.

Pure, like the rebalancer it drives: the caller gives the stored core state (``Rebalancer.to_dict``)
and per-partition counts; nothing is read or written. The copy is put through the change asked
for (``add`` flows, ``remove`` flows, or a ``consumers`` count), then through the end of the
holddown (the rebalance delay) and the end of every handoff it starts, and the plan lists what
happened to each partition on the way:

* ``assign``: owned by nobody, given to a flow at once (no handoff: nothing was delivered);
* ``handoff``: paused, with its unacked messages, until its owner acks them (at most
  ``max_handoff_time``), then moved (rules `handoff` and `handoff-isolation`). Under
  ``ordering="key"`` only the keys its owner holds unacked wait (``holds_keys``: a sample of
  them, at most 20, and ``holds_key_count``; rule `key-ordering`), the rest of the partition
  flows to the new owner at once; None under "partition" (the whole partition waits) and where
  the keys are not known (a flow of another process holds the partition);
* ``move``: moved at once, with no pause, because its owner is gone or ``max_handoff_time`` is
  0: its unacked messages are redelivered to the new owner from the ack floor;
* ``unassign``: no flow left for it.

``--consumers N`` on a set of B bound flows adds N - B flows, or removes B - N: standbys first,
then the most recently bound flows (the ones the rebalancer would give least). A plan is for at
most ``MAX_PLAN_FLOWS`` flows: the rebalancer is worked out for each one bound, so a count of a
hundred million would take hours and gigabytes; past the partition count every flow more is a
standby anyway.
"""
from __future__ import annotations

from dataclasses import dataclass

from partq.core.actions import Assign, FlowInfo, Handoff, Pause
from partq.core.rebalancer import Rebalancer
from partq.errors import InvalidConfig

MAX_PLAN_FLOWS = 10_000     # flows bound in a plan, after its change (a few seconds' work)


@dataclass(frozen=True)
class Change:
    kind: str                 # "add" | "remove"
    name: str                 # the flow's name, or its id (remove)


def plan_rebalance(core: dict, *, owner_running: bool, rebalance_delay: float,
                   max_handoff_time: float, index: list[int], unacked: dict[int, int],
                   depth: dict[int, int], inflight_keys: dict[int, tuple[list[str], int]]
                   | None = None, consumers: int | None = None,
                   add: list[str] | tuple[str, ...] = (),
                   remove: list[str] | tuple[str, ...] = ()) -> dict:
    """The plan as a document (see the module docstring). ``core``: the stored core state;
    ``owner_running``: whether a process runs the queue's delivery (if not, every flow is a ghost
    that must rebind within the delay); ``index``: the storage partition of each slot;
    ``unacked`` / ``depth``: per storage partition; ``inflight_keys``: per storage partition,
    under ``ordering="key"``, a sample of the keys in flight and how many (None otherwise)."""
    sim = _copy(core, owner_running, rebalance_delay, max_handoff_time)
    before = {f.flow_id: (f.name, sorted(f.partitions), f.bound) for f in sim.flows.values()}
    owners_before = list(sim.owner)
    changes = _changes(sim, consumers, list(add), list(remove))
    names = {fid: name for fid, (name, _, _) in before.items()}
    events: list[tuple[str, object]] = []
    seq = 0
    for change in changes:
        if change.kind == "add":
            seq += 1
            fid = f"new-{seq}"
            names[fid] = change.name
            events += [("now", a) for a in sim.bind(fid, 0.0, name=change.name)]
        else:
            fid = _find(sim, change.name)
            events += [("now", a) for a in sim.unbind(fid, 0.0)]
    holddown_at = sim.holddown_deadline
    if holddown_at is not None:
        events += [("after holddown", a) for a in sim.tick(holddown_at)]
    handoffs = {p: (h.source, h.target) for p, h in sim.handoffs.items()}
    end = (holddown_at or 0.0) + max_handoff_time + 1.0
    events += [("after handoff", a) for a in sim.tick(end)]

    first: dict[int, str] = {}      # partition -> when it was first paused or reassigned
    paused: set[int] = set()
    for when, a in events:
        if isinstance(a, (Pause, Assign)):
            first.setdefault(a.p, when)
            if isinstance(a, Pause):
                paused.add(a.p)
    steps = []
    for p, when in first.items():
        src = owners_before[p] if p < len(owners_before) else None
        dst = sim.owner[p] if p < sim.n else None
        if src == dst and p not in paused:
            continue
        sp = index[p] if p < len(index) else p
        if p in paused:
            kind = "handoff"
            src = handoffs.get(p, (src, dst))[0]
        elif src is None:
            kind = "assign"
        elif dst is None:
            kind = "unassign"
        else:
            kind = "move"
        keys = inflight_keys.get(sp) if inflight_keys is not None and kind == "handoff" \
            else None
        steps.append({"partition": sp, "action": kind, "when": when,
                      "from_flow": src, "from_name": names.get(src) if src else None,
                      "to_flow": dst, "to_name": names.get(dst) if dst else None,
                      "unacked": unacked.get(sp, 0), "depth": depth.get(sp, 0),
                      "holds_keys": None if keys is None else keys[0],
                      "holds_key_count": None if keys is None else keys[1]})
    steps.sort(key=lambda s: (s["when"] != "now", s["partition"]))
    flows_after = sorted(sim.flows.values(), key=lambda f: f.order)
    after = [{"flow": f.flow_id, "name": f.name, "new": f.flow_id not in before,
              "partitions": sorted(index[p] if p < len(index) else p for p in f.partitions)}
             for f in flows_after]
    counts = [len(f.partitions) for f in flows_after if f.partitions]
    return {
        "changes": [{"kind": c.kind, "name": c.name} for c in changes],
        "holddown_seconds": rebalance_delay if holddown_at is not None else 0.0,
        "max_handoff_time": max_handoff_time,
        "before": [{"flow": fid, "name": name, "bound": bound,
                    "partitions": [index[p] if p < len(index) else p for p in parts]}
                   for fid, (name, parts, bound) in before.items()],
        "steps": steps,
        "after": after,
        "balanced": not counts or max(counts) - min(counts) <= 1,
        "unassigned": [index[p] if p < len(index) else p for p in range(sim.n)
                       if sim.owner[p] is None],
        "status_after": str(sim.status),
    }


def _copy(core: dict, owner_running: bool, delay: float, handoff: float) -> Rebalancer:
    """The core as stored: flows keep their bound flag when an owner runs (when none does they
    are ghosts, as a new owner would restore them); a stored handoff is in progress."""
    sim = Rebalancer.restored(core, delay, handoff, 0.0)
    if not owner_running:
        return sim
    sim.flows.clear()
    for flow_id, name, order, bound, parts in core["flows"]:
        sim.flows[flow_id] = FlowInfo(flow_id, name, order, bool(bound), set(parts))
    for p, source, target in core.get("handoffs", []):
        if p < sim.n and source in sim.flows and target in sim.flows:
            sim.handoffs[p] = Handoff(source, target, handoff)
    sim.holddown_deadline = delay if core.get("holddown") else None
    return sim


def _changes(sim: Rebalancer, consumers: int | None, add: list[str],
             remove: list[str]) -> list[Change]:
    if consumers is not None and (add or remove):
        raise InvalidConfig("give either a consumer count or flows to add and remove, not both")
    if consumers is not None and (isinstance(consumers, bool) or not isinstance(consumers, int)
                                  or not 0 <= consumers <= MAX_PLAN_FLOWS):
        raise InvalidConfig(f"the consumer count must be an integer from 0 to {MAX_PLAN_FLOWS}, "
                            f"not {consumers!r:.40}; past the partition count every consumer "
                            f"more is a standby, so plan for fewer")
    if consumers is None:
        bound_now = len(sim.bound_flows())
        if bound_now + len(add) > MAX_PLAN_FLOWS:
            raise InvalidConfig(f"a plan is for at most {MAX_PLAN_FLOWS} consumers and "
                                f"{bound_now} are bound: add at most "
                                f"{max(MAX_PLAN_FLOWS - bound_now, 0)}, not {len(add)}")
        for name in remove:
            _find(sim, name)      # unknown names fail before anything is worked out
        taken = {f.name for f in sim.bound_flows()}
        for name in add:
            if name in taken:
                raise InvalidConfig(f"a flow named {name!r} is bound already; names are unique")
            taken.add(name)
        return [Change("remove", n) for n in remove] + [Change("add", n) for n in add]
    bound = sim.bound_flows()
    if consumers >= len(bound):
        return [Change("add", f"consumer-{i + 1}") for i in range(consumers - len(bound))]
    # standbys first, then the most recently bound
    gone = sorted(bound, key=lambda f: (bool(f.partitions), -f.order))[:len(bound) - consumers]
    return [Change("remove", f.name or f.flow_id) for f in gone]


def _find(sim: Rebalancer, name: str) -> str:
    """The id of the bound flow named ``name`` (or with that id)."""
    for f in sim.bound_flows():
        if f.flow_id == name or f.name == name:
            return f.flow_id
    known = ", ".join(sorted(f.name or f.flow_id for f in sim.bound_flows())) or "none"
    raise InvalidConfig(f"no bound flow named {name!r} (bound: {known})")
