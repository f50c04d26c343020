"""The pure Rebalancer's handoffs (rules `handoff`, `handoff-isolation`): a partition paused
until its source acked everything or max_handoff_time passed, consumers binding and leaving while
handoffs run, and a partition count change, which starts a rebalance at once (rule `scaling`).
No broker, no I/O.

The core is driven with events and checked through the actions it returns and its queries
(``owner``, ``status``, ``partition_status``, ``partitions_of``).
"""
from __future__ import annotations

from rebalancer_helpers import (
    DELAY,
    HANDOFF,
    assigns,
    check_consistent,
    complete_all_handoffs,
    one_handoff,
    pauses,
    settle,
    sizes,
)

from partq.core.actions import Assign, FlowActive, Redeliver, Resume
from partq.core.rebalancer import HOLDDOWN, PAUSED, READY, REBALANCING, UNBOUND, Rebalancer


# ---------------------------------------------------------------------- consumer changes during handoffs
def test_bind_during_handoffs_is_part_of_the_balance():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("f1", 0.0)                      # f1: 0 1 2 3
    r.bind("f2", 0.0)
    assert pauses(r.tick(DELAY)) == [3, 2]  # f1 -> f2, f1 still has unacked messages
    r.bind("f3", DELAY + 0.5)              # 3 consumers < 4 partitions: a trigger
    # Whether it ends the holddown at once or after the delay, f3 must end up with a partition.
    for t in (DELAY + 1, DELAY + HANDOFF + 1, 2 * DELAY + 1, 2 * DELAY + HANDOFF + 2):
        r.tick(t)
        complete_all_handoffs(r, t)
    assert sizes(r) == [2, 1, 1], {f.flow_id: f.partitions for f in r.bound_flows()}


def test_handoff_target_leaving_lets_the_standby_take_its_place():
    r = Rebalancer(2, DELAY, HANDOFF)
    r.bind("a", 0.0)                       # a: 0 1
    r.bind("b", 0.0)                       # triggers (1 consumer < 2 partitions)
    r.bind("c", 0.0)                       # an excess consumer: no trigger
    assert pauses(r.tick(DELAY)) == [1]    # 1: a -> b
    r.unbind("b", DELAY + 1)               # b leaves before it got anything
    for t in (DELAY + 2, DELAY + HANDOFF + 2, 2 * DELAY + 2, 2 * DELAY + HANDOFF + 3):
        r.tick(t)
        complete_all_handoffs(r, t)
    assert sizes(r) == [1, 1], {f.flow_id: f.partitions for f in r.bound_flows()}


# ---------------------------------------------------------------------- handoff (rule `handoff`)
def test_handoff_waits_while_source_has_outstanding():
    r, p, now = one_handoff()
    assert r.acked(p, 2, now + 0.5) == []
    assert r.acked(p, 1, now + 1.0) == []
    assert r.tick(now + HANDOFF - 0.01) == []
    assert r.owner[p] == "a" and r.partition_status(p) == PAUSED
    assert r.status == REBALANCING


def test_handoff_completes_on_acked_zero():
    r, p, now = one_handoff()
    actions = r.acked(p, 0, now + 1.0)
    assert actions[:3] == [Assign(p, "b"), Redeliver(p), Resume(p)]
    assert r.owner[p] == "b" and r.partition_status(p) == READY
    assert r.status == READY
    assert r.tick(now + 100) == []


def test_handoff_completes_at_max_handoff_time():
    r, p, now = one_handoff()
    actions = r.tick(now + HANDOFF)
    assert Assign(p, "b") in actions and Redeliver(p) in actions and Resume(p) in actions
    assert r.owner[p] == "b"
    assert r.status == READY
    assert r.acked(p, 0, now + HANDOFF + 1) == []   # a late report is harmless


def test_zero_max_handoff_time_moves_without_pause():
    r = Rebalancer(2, DELAY, 0.0)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    actions = r.tick(DELAY)
    assert not pauses(actions)
    assert assigns(actions) == {1: "b"}
    assert r.status == READY


def test_zero_delay_rebalances_at_bind():
    r = Rebalancer(2, 0.0, HANDOFF)
    r.bind("a", 0.0)
    actions = r.bind("b", 0.0)
    assert pauses(actions) == [1]


def test_target_unbinding_cancels_handoff_and_resumes_source():
    r, p, now = one_handoff()
    actions = r.unbind("b", now + 1.0)
    assert Resume(p) in actions
    assert r.owner[p] == "a" and r.partition_status(p) == READY
    assert not r.handoffs
    check_consistent(r)


def test_source_unbinding_completes_handoff_at_once():
    r, p, now = one_handoff()
    actions = r.unbind("a", now + 1.0)
    assert Assign(p, "b") in actions
    assert r.owner[p] == "b"
    assert r.partition_status(0) == UNBOUND        # a's other partition waits for the delay
    check_consistent(r)


# ---------------------------------------------------------------------- scaling (rule `scaling`, a trigger)
def test_partition_count_increase_starts_at_once():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    now = settle(r, 0.0)
    actions = r.partition_count_changed(6, now)
    assert r.status != HOLDDOWN
    assert set(assigns(actions)) == {4, 5}
    assert sizes(r) == [3, 3]
    check_consistent(r)


def test_partition_count_change_during_holddown_starts_at_once():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 1.0)
    assert r.status == HOLDDOWN
    actions = r.partition_count_changed(5, 2.0)
    assert r.status == REBALANCING        # handoffs started, no holddown left
    assert pauses(actions)
    complete_all_handoffs(r, 2.0)
    assert sizes(r) == [3, 2]


def test_partition_count_decrease_removes_highest_and_deactivates_emptied_flow():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    settle(r, 0.0)
    assert r.partitions_of("b") == {2, 3}
    actions = r.partition_count_changed(2, 10.0)
    assert r.n == 2 and len(r.owner) == 2
    assert assigns(actions)[2] is None and assigns(actions)[3] is None
    assert FlowActive("b", False) in actions      # rule `rebalance-algorithm`, step 3
    assert pauses(actions) == [1]                 # then rebalance a {0,1} -> b
    assert r.status == REBALANCING
    complete_all_handoffs(r, 10.0)
    assert sizes(r) == [1, 1]
    check_consistent(r)
