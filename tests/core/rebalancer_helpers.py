"""Helpers of the pure Rebalancer's tests (tests/core is on sys.path through pytest's
``pythonpath``): drive the core, read the actions it returns, check its invariants."""
from __future__ import annotations

from partq.core.actions import Assign, Pause
from partq.core.rebalancer import PAUSED, READY, Rebalancer

DELAY = 5.0
HANDOFF = 3.0


def sizes(r: Rebalancer) -> list[int]:
    """Partition counts of the bound flows, largest first."""
    return sorted((len(f.partitions) for f in r.bound_flows()), reverse=True)


def pauses(actions) -> list[int]:
    return [a.p for a in actions if isinstance(a, Pause)]


def assigns(actions) -> dict[int, str | None]:
    return {a.p: a.flow for a in actions if isinstance(a, Assign)}


def check_consistent(r: Rebalancer) -> None:
    """owner[] and the flows' partition sets describe the same mapping: rule `one-flow-per-partition`
    holds."""
    seen: dict[int, str] = {}
    for f in r.flows.values():
        for p in f.partitions:
            assert p not in seen, f"partition {p} held by {seen[p]} and {f.flow_id}"
            seen[p] = f.flow_id
            assert 0 <= p < r.n
    for p in range(r.n):
        assert r.owner[p] == seen.get(p), (p, r.owner, seen)
    for p, h in r.handoffs.items():
        assert r.owner[p] == h.source
        assert h.target in r.flows and r.flows[h.target].bound


def complete_all_handoffs(r: Rebalancer, now: float) -> list:
    out = []
    for p in sorted(r.handoffs):
        if p in r.handoffs:
            out += r.acked(p, 0, now)
    return out


def settle(r: Rebalancer, now: float) -> float:
    """Run the holddown and every handoff to completion (handoffs complete by acks)."""
    now += DELAY + 1
    r.tick(now)
    complete_all_handoffs(r, now)
    assert not r.handoffs
    return now


def seven_three() -> tuple[Rebalancer, float]:
    """7 partitions, flows f1..f3 balanced to {3, 2, 2} (the first diagram of Solace's
    partition rebalancing document)."""
    r = Rebalancer(7, DELAY, HANDOFF)
    r.bind("f1", 0.0)
    r.bind("f2", 1.0)
    r.bind("f3", 2.0)
    now = settle(r, 2.0)
    assert sizes(r) == [3, 2, 2]
    assert r.status == READY
    check_consistent(r)
    return r, now


def one_handoff() -> tuple[Rebalancer, int, float]:
    r = Rebalancer(2, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    actions = r.tick(DELAY)
    (p,) = pauses(actions)
    assert p == 1     # the donor's highest-numbered partition (as in the handoff example)
    assert r.partition_status(0) == READY and r.partition_status(1) == PAUSED
    return r, p, DELAY
