"""Rule `leave`: a flow that unbinds for good leaves no ghost: its partitions go to the flows
still bound at once, or are owned by nobody and go to the next flow that binds at once."""
from __future__ import annotations

from partq.core.rebalancer import Rebalancer


def test_a_leaving_flows_partitions_go_to_the_bound_flows_at_once():
    core = Rebalancer(4, rebalance_delay=5.0, max_handoff_time=3.0)
    core.bind("a", 0.0)
    core.bind("b", 0.0)
    core.tick(5.0)
    core.tick(8.0)                       # the handoffs to b ended
    assert sorted(core.owner) == ["a", "a", "b", "b"]
    core.unbind("a", 9.0, leave=True)
    assert core.owner == ["b"] * 4 and core.holddown_deadline is None
    assert "a" not in core.flows


def test_the_last_flow_leaving_leaves_the_partitions_to_the_next_bind_at_once():
    core = Rebalancer(2, rebalance_delay=5.0, max_handoff_time=3.0)
    core.bind("a", 0.0)
    core.unbind("a", 1.0, leave=True)
    assert core.owner == [None, None] and core.flows == {}
    core.bind("b", 1.5)
    assert core.owner == ["b", "b"]


def test_without_leave_the_flow_is_a_ghost_for_the_delay():
    core = Rebalancer(2, rebalance_delay=5.0, max_handoff_time=3.0)
    core.bind("a", 0.0)
    core.unbind("a", 1.0)
    core.bind("b", 1.5)
    assert core.owner == ["a", "a"]      # Unbound until the delay ends (or a comes back)
