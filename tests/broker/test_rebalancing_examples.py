"""The examples of Solace's partitioned-queue documents replayed through the Broker, on real LMDB
directories with a ManualClock: rebalancing and handoffs.

* partition rebalancing: 7 partitions, 3 flows -> a 4th flow -> 2/2/2/1; an excess consumer on
  standby; a partition count change.
* partition handoff: the B1..B5 handoff of partition 1 from consumer 1 to consumer 2 (and its
  timeout variant), partition 0 never disturbed.
* consumers that bind or leave while a handoff runs.
"""
from __future__ import annotations

import pytest
from broker_helpers import DELAY, HANDOFF, drain
from example_helpers import KEY_B, check_p0_untouched, owners, part_statuses, seed000_setup

import partq


# ---------------------------------------------------------------------- partition rebalancing
def test_seed003_seven_partitions_three_then_four_flows(broker, clock, partitioner):
    broker.create_queue("q", partitions=7, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    f1 = broker.bind("q")
    assert f1.partitions == frozenset(range(7))
    f2 = broker.bind("q")
    f3 = broker.bind("q")
    assert broker.queue_status("q").rebalance_status == "Holddown"
    clock.advance(DELAY)
    broker.tick()
    flows = [f1, f2, f3]
    assert sorted(len(f.partitions) for f in flows) == [2, 2, 3]
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)

    # Messages flow on every partition; the consumers ack everything they got.
    for i in range(70):
        broker.publish("q", b"m%d" % i, key=f"key-{i}")
    got = sum((drain(f) for f in flows), [])
    assert len(got) == 70

    before = owners(broker, "q")
    f4 = broker.bind("q")
    assert f4.partitions == frozenset()
    st = broker.queue_status("q")
    assert st.rebalance_status == "Holddown"
    assert all(p.status == "Ready" for p in st.partitions)
    clock.advance(DELAY - 0.5)
    broker.tick()
    assert broker.queue_status("q").rebalance_status == "Holddown"
    assert owners(broker, "q") == before

    clock.advance(0.5)
    broker.tick()
    flows.append(f4)
    assert sorted(len(f.partitions) for f in flows) == [1, 2, 2, 2]
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)
    # Exactly one partition moved, from the flow that had three.
    moved = [p for p in range(7) if owners(broker, "q")[p] != before[p]]
    assert len(moved) == 1
    assert before.count(before[moved[0]]) == 3
    assert f4.partitions == frozenset(moved)
    # No partition in two flows, all held.
    held = [p for f in flows for p in f.partitions]
    assert sorted(held) == list(range(7))
    assert f4.events() == [partq.FlowChangeUpdate(True, frozenset(moved))]

    # Delivery follows the new mapping.
    for i in range(70, 140):
        broker.publish("q", b"m%d" % i, key=f"key-{i}")
    for f in flows:
        for m in drain(f):
            assert m.partition in f.partitions
            assert not m.redelivered


def test_seed003_excess_consumer_is_standby_and_takes_over_at_once(broker, clock, partitioner):
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    c1 = broker.bind("q")
    c2 = broker.bind("q")
    clock.advance(DELAY)
    broker.tick()
    assert len(c1.partitions) == 1 and len(c2.partitions) == 1
    c3 = broker.bind("q")                 # excess consumer: no rebalance, nothing to receive
    assert broker.queue_status("q").rebalance_status == "Ready"
    assert c3.partitions == frozenset() and not c3.active
    broker.publish_many("q", [(b"%d" % i, f"key-{i}") for i in range(20)])
    assert c3.receive(100) == []
    got1 = c1.receive(100)
    assert got1
    lost = c1.partitions
    c3.events()
    c1.unbind()                           # an active consumer fails: the standby takes over now
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert c3.partitions == lost
    assert all(p.status == "Ready" for p in st.partitions)
    assert c3.events() == [partq.FlowChangeUpdate(True, lost)]
    again = c3.receive(100)
    assert sorted((m.partition, m.seq) for m in again) == sorted((m.partition, m.seq) for m in got1)
    assert all(m.redelivered for m in again)
    clock.advance(DELAY * 2)
    broker.tick()
    assert c3.partitions == lost          # and nothing moves later


def test_partition_count_change_rebalances_at_once(broker, clock):
    broker.create_queue("q", partitions=4, rebalance_delay=DELAY, max_handoff_time=HANDOFF)
    a = broker.bind("q")
    b = broker.bind("q")
    clock.advance(DELAY)
    broker.tick()
    assert sorted(len(f.partitions) for f in (a, b)) == [2, 2]
    a.events(), b.events()
    broker.scale("q", 6)                  # no clock advance: no holddown (rule `scaling`)
    assert sorted(len(f.partitions) for f in (a, b)) == [3, 3]
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert [p.status for p in st.partitions] == ["Ready"] * 6
    broker.scale("q", 2)
    st = broker.queue_status("q")
    assert st.partition_count == 2
    assert sorted(len(f.partitions) for f in (a, b)) == [1, 1]
    assert st.rebalance_status == "Ready"
    assert a.partitions | b.partitions == frozenset({0, 1})


# ---------------------------------------------------------------------- partition handoff
def test_seed000_graceful_handoff(broker, clock, partitioner):
    c1, c2, bs = seed000_setup(broker, partitioner)
    # (before the pause consumer 1 may still take B3: nothing is paused yet)
    assert part_statuses(broker, "q") == ["Ready", "Ready"]

    clock.advance(DELAY)
    broker.tick()
    st = broker.queue_status("q")
    assert st.rebalance_status == "Rebalancing"
    assert [p.status for p in st.partitions] == ["Ready", "Paused"]
    assert st.partitions[1].flow == c1.flow_id        # not reassigned yet
    assert st.partitions[1].unacked == 2
    check_p0_untouched(broker, c1, b"paused-1")

    # B3 is held; B4 and B5 arrive during the pause and are held too.
    broker.publish("q", b"B4", key=KEY_B)
    broker.publish("q", b"B5", key=KEY_B)
    assert c2.receive(100) == []
    check_p0_untouched(broker, c1, b"paused-2")
    assert broker.queue_status("q").partitions[1].status == "Paused"

    # Some time passes, still within max_handoff_time.
    clock.advance(HANDOFF / 2)
    broker.tick()
    assert part_statuses(broker, "q") == ["Ready", "Paused"]
    assert c2.receive(100) == []

    # Consumer 1 acks B1: still one outstanding.
    c1.ack(bs[0])
    assert part_statuses(broker, "q") == ["Ready", "Paused"]
    assert c2.receive(100) == []
    # ... and B2: handoff completes at once.
    c1.ack(bs[1])
    st = broker.queue_status("q")
    assert [p.status for p in st.partitions] == ["Ready", "Ready"]
    assert st.partitions[1].flow == c2.flow_id
    assert st.partitions[0].flow == c1.flow_id
    assert st.rebalance_status == "Ready"
    assert c2.partitions == frozenset({1}) and c1.partitions == frozenset({0})
    assert c2.events() == [partq.FlowChangeUpdate(True, frozenset({1}))]

    got = c2.receive(100)
    assert [m.payload for m in got] == [b"B3", b"B4", b"B5"]
    assert not any(m.redelivered for m in got)
    assert all(m.key == KEY_B and m.partition == 1 for m in got)
    assert [m.seq for m in got] == sorted(m.seq for m in got)
    c2.ack_many(got)
    check_p0_untouched(broker, c1, b"after")
    assert broker.queue_status("q").depth == 0


def test_seed000_handoff_timeout_redelivers_in_order(broker, clock, partitioner):
    c1, c2, bs = seed000_setup(broker, partitioner)
    clock.advance(DELAY)
    broker.tick()
    assert part_statuses(broker, "q") == ["Ready", "Paused"]
    broker.publish("q", b"B4", key=KEY_B)
    broker.publish("q", b"B5", key=KEY_B)

    clock.advance(HANDOFF - 0.1)
    broker.tick()
    assert part_statuses(broker, "q") == ["Ready", "Paused"]
    assert c2.receive(100) == []
    check_p0_untouched(broker, c1, b"waiting")

    clock.advance(0.1)          # max_handoff_time reached; consumer 1 never acked
    broker.tick()
    st = broker.queue_status("q")
    assert [p.status for p in st.partitions] == ["Ready", "Ready"]
    assert st.partitions[1].flow == c2.flow_id
    assert st.rebalance_status == "Ready"

    got = c2.receive(100)
    assert [m.payload for m in got] == [b"B1", b"B2", b"B3", b"B4", b"B5"]
    assert [m.redelivered for m in got] == [True, True, False, False, False]
    c2.ack_many(got)
    # Consumer 1 gets nothing more of partition 1; partition 0 still flows to it.
    check_p0_untouched(broker, c1, b"after")
    # A late ack from consumer 1, which no longer holds partition 1, is fenced (rule `fencing`) and
    # changes nothing.
    with pytest.raises(partq.FlowFenced):
        c1.ack(bs[0])
    assert broker.queue_status("q").depth == 0
    assert c2.receive(100) == []


def test_seed000_late_ack_after_timeout_is_fenced(broker, clock, partitioner):
    """Rule `fencing`: consumer 1 finishes B1, B2 after its handoff timed out and partition 1 moved: the
    acks change nothing (FlowFenced names the messages) and consumer 2 gets B1, B2 redelivered,
    in order, before B3."""
    c1, c2, bs = seed000_setup(broker, partitioner)
    clock.advance(DELAY)
    broker.tick()
    clock.advance(HANDOFF)
    broker.tick()
    assert owners(broker, "q")[1] == c2.flow_id
    with pytest.raises(partq.FlowFenced) as fenced:
        c1.ack_many(bs)
    assert fenced.value.messages == list(bs)
    with pytest.raises(partq.FlowFenced):
        c1.nack(bs[0])
    got = c2.receive(100)
    assert [m.payload for m in got] == [b"B1", b"B2", b"B3"]
    assert [m.redelivered for m in got] == [True, True, False]


# ---------------------------------------------------------------------- consumer changes mid-handoff
def test_consumer_bound_during_handoff_gets_partitions(broker, clock, partitioner):
    broker.create_queue("q", partitions=4, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    c1 = broker.bind("q")
    broker.publish_many("q", [(b"m", f"k{i}") for i in range(40)])
    got = c1.receive(100)                       # unacked: the handoffs must wait
    c2 = broker.bind("q")
    clock.advance(DELAY)
    broker.tick()
    assert part_statuses(broker, "q").count("Paused") == 2
    c3 = broker.bind("q")
    c1.ack_many(got)
    for _ in range(3):
        clock.advance(DELAY + HANDOFF)
        broker.tick()
        drain(c1), drain(c2), drain(c3)
    assert sorted(len(f.partitions) for f in (c1, c2, c3)) == [1, 1, 2]
    assert all(s == "Ready" for s in part_statuses(broker, "q"))


def test_handoff_target_unbinding_lets_standby_take_over(broker, clock, partitioner):
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    c1 = broker.bind("q")
    broker.publish_many("q", [(b"m", f"k{i}") for i in range(20)])
    got = c1.receive(100)
    c2 = broker.bind("q")
    c3 = broker.bind("q")                       # excess consumer, standby
    clock.advance(DELAY)
    broker.tick()
    assert part_statuses(broker, "q") == ["Ready", "Paused"]
    c2.unbind()
    c1.ack_many(got)
    for _ in range(3):
        clock.advance(DELAY + HANDOFF)
        broker.tick()
    assert len(c1.partitions) == 1 and len(c3.partitions) == 1
