"""The pure Rebalancer as consumers bind and unbind: the holddown and its deadline, the first
rebalance (rules `rebalance-triggers`, `rebalance-delay`, `rebalance-algorithm`), a consumer set
that is back before the delay, hints and names (rules `bind-hint`, `stale-hint`), standby
consumers (rule `standby-flows`). No broker, no I/O.

The core is driven with events and checked through the actions it returns and its queries
(``owner``, ``status``, ``partition_status``, ``partitions_of``).
"""
from __future__ import annotations

import pytest
from rebalancer_helpers import (
    DELAY,
    HANDOFF,
    assigns,
    check_consistent,
    complete_all_handoffs,
    pauses,
    settle,
    seven_three,
    sizes,
)

from partq.core.actions import Assign, FlowActive, Redeliver, Resume
from partq.core.rebalancer import HOLDDOWN, PAUSED, READY, REBALANCING, UNBOUND, Rebalancer


# ---------------------------------------------------------------------- partition rebalancing
def test_first_flow_on_new_queue_gets_everything_at_once():
    r = Rebalancer(4, DELAY, HANDOFF)
    actions = r.bind("a", 0.0)
    assert assigns(actions) == {0: "a", 1: "a", 2: "a", 3: "a"}
    assert FlowActive("a", True) in actions
    assert not pauses(actions)
    assert r.status == READY
    assert all(r.partition_status(p) == READY for p in range(4))


def test_seed003_seven_partitions_three_then_four_flows():
    r, now = seven_three()
    before = list(r.owner)
    big = next(f.flow_id for f in r.bound_flows() if len(f.partitions) == 3)

    # A fourth consumer comes online: queue is unbalanced -> Holddown, nothing moves yet.
    actions = r.bind("f4", now)
    assert actions == []
    assert r.status == HOLDDOWN
    assert r.partitions_of("f4") == set()
    assert r.tick(now + DELAY - 0.01) == []
    assert r.status == HOLDDOWN
    assert r.owner == before

    # After the delay: exactly one handoff, from the flow with 3 to the new flow.
    actions = r.tick(now + DELAY)
    assert r.status == REBALANCING
    paused = pauses(actions)
    assert len(paused) == 1
    (p,) = paused
    assert before[p] == big
    assert r.partition_status(p) == PAUSED
    assert r.handoffs[p].source == big and r.handoffs[p].target == "f4"
    # Rule `handoff-isolation`: every other partition stays Ready with its owner.
    for q in range(7):
        if q != p:
            assert r.partition_status(q) == READY
    assert r.owner == before  # not reassigned until the source has acked

    # The old flow has acked everything: reassign and resume.
    actions = r.acked(p, 0, now + DELAY + 0.5)
    assert Assign(p, "f4") in actions and Resume(p) in actions
    assert FlowActive("f4", True) in actions
    assert r.owner[p] == "f4"
    assert sizes(r) == [2, 2, 2, 1]
    assert r.status == READY
    assert all(r.partition_status(q) == READY for q in range(7))
    check_consistent(r)


def test_holddown_deadline_runs_from_first_trigger():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 1.0)   # trigger at t=1 -> rebalance at t=6
    r.bind("c", 4.0)   # a later trigger does not push the deadline back
    assert r.next_deadline() == pytest.approx(1.0 + DELAY)
    assert r.tick(5.9) == []
    actions = r.tick(6.0)
    assert len(pauses(actions)) == 2
    complete_all_handoffs(r, 6.0)
    assert sizes(r) == [2, 1, 1]


def test_donor_is_flow_with_most_recipient_flow_with_least():
    r = Rebalancer(6, DELAY, HANDOFF)
    r.bind("a", 0.0)                      # a: 0..5
    now = settle(r, 0.0)
    r.bind("b", now)
    r.bind("c", now)
    now = settle(r, now)
    assert sizes(r) == [2, 2, 2]
    check_consistent(r)


# ---------------------------------------------------------------------- rebalance delay
def test_consumer_set_returning_before_delay_moves_nothing():
    r, now = seven_three()
    before = list(r.owner)
    actions = r.bind("f4", now)
    assert r.status == HOLDDOWN
    actions += r.unbind("f4", now + 1.0)
    assert r.status == READY
    actions += r.tick(now + 100.0)
    assert not pauses(actions)
    assert not assigns(actions)
    assert r.owner == before
    assert r.status == READY


def test_active_flow_leaving_and_returning_with_hint_moves_nothing():
    r, now = seven_three()
    before = list(r.owner)
    hint = r.partitions_of("f2")
    actions = r.unbind("f2", now)
    assert r.status == HOLDDOWN
    for p in hint:
        assert r.partition_status(p) == UNBOUND
    actions = r.bind("f2-again", now + 1.0, hint=hint)
    assert r.partitions_of("f2-again") == hint
    assert not pauses(actions)
    assert r.status == READY
    assert [("f2-again" if o == "f2" else o) for o in before] == r.owner
    assert not pauses(r.tick(now + 100.0))
    assert r.status == READY
    check_consistent(r)


def test_named_ghost_returns_by_name():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("x1", 0.0, name="svc-a")
    r.bind("y", 0.0, name="svc-b")
    now = settle(r, 0.0)
    mine = r.partitions_of("x1")
    assert len(mine) == 2
    r.unbind("x1", now)
    actions = r.bind("x2", now + 2.0, name="svc-a")
    assert r.partitions_of("x2") == mine
    assert not pauses(actions)
    assert r.status == READY


def test_hint_presented_after_deadline_is_ignored_even_before_tick():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    now = settle(r, 0.0)
    hint = r.partitions_of("a")
    r.unbind("a", now)
    r.bind("a2", now + DELAY + 1.0, hint=hint)     # the delay is over; no tick happened in between
    assert r.partitions_of("a2") != hint


def test_wrong_hint_is_a_new_consumer():
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    now = settle(r, 0.0)
    held = r.partitions_of("a")
    r.unbind("a", now)
    r.bind("a2", now + 1.0, hint=held | {99})
    assert r.partitions_of("a2") == set()
    assert r.status == HOLDDOWN
    now = settle(r, now + 1.0)
    assert sizes(r) == [2, 2]


# -------------------------------------------- standby (rules `rebalance-triggers`, `standby-flows`)
def standby_setup() -> tuple[Rebalancer, float]:
    r = Rebalancer(2, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 0.0)
    now = settle(r, 0.0)
    assert sizes(r) == [1, 1]
    return r, now


def test_extra_bind_with_as_many_consumers_as_partitions_triggers_nothing():
    r, now = standby_setup()
    before = list(r.owner)
    assert r.bind("c", now) == []
    assert r.status == READY
    assert r.partitions_of("c") == set()
    assert r.bind("d", now) == []
    assert r.status == READY
    assert r.tick(now + 100.0) == []
    assert r.owner == before


def test_active_unbind_hands_partitions_to_standby_at_once():
    r, now = standby_setup()
    r.bind("c", now)
    gone = r.partitions_of("a")
    actions = r.unbind("a", now + 1.0)
    assert not pauses(actions)
    assert r.status == READY                      # no holddown
    assert r.partitions_of("c") == gone
    for p in gone:
        assert Assign(p, "c") in actions and Redeliver(p) in actions and Resume(p) in actions
    assert FlowActive("c", True) in actions
    check_consistent(r)


def test_standby_unbind_triggers_nothing():
    r, now = standby_setup()
    r.bind("c", now)
    before = list(r.owner)
    assert r.unbind("c", now) == []
    assert r.status == READY
    assert r.owner == before


def test_standby_order_first_bound_standby_takes_over():
    r, now = standby_setup()
    r.bind("c", now)
    r.bind("d", now + 0.5)
    r.unbind("b", now + 1.0)
    assert r.partitions_of("c") and not r.partitions_of("d")


def test_unbind_without_excess_consumers_waits_for_the_delay():
    # 4 partitions, 1 active consumer; a second binds (Holddown, 2 consumers < 4 partitions, so it
    # is not an excess consumer). The active one disconnects: rule `rebalance-triggers` says an
    # unbind without excess consumers triggers a rebalance after the delay, and rule `bind-hint` says
    # the consumer that
    # comes back within the delay with its partition set gets exactly that set again.
    r = Rebalancer(4, DELAY, HANDOFF)
    r.bind("a", 0.0)
    r.bind("b", 1.0)
    hint = r.partitions_of("a")
    r.unbind("a", 2.0)
    assert r.partitions_of("b") == set(), "b is not an excess consumer: nothing moves before the delay"
    r.bind("a2", 3.0, hint=hint)
    assert r.partitions_of("a2") == hint
