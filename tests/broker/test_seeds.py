"""The seed examples replayed through the Broker, on real LMDB directories with a ManualClock.

* seed 003: 7 partitions, 3 flows -> a 4th flow -> 2/2/2/1.
* seed 000: the B1..B5 handoff of partition 1 from consumer 1 to consumer 2 (and its timeout
  variant), partition 0 never disturbed.
* seed 004: the four outcomes of consumer loss; S17: named consumers across a broker restart.
"""
from __future__ import annotations

import pytest
from broker_helpers import DELAY, HANDOFF, drain

import partq

# ---------------------------------------------------------------------- helpers

def owners(broker: partq.Broker, queue: str) -> list[str | None]:
    return [p.flow for p in broker.queue_status(queue).partitions]


def part_statuses(broker: partq.Broker, queue: str) -> list[str]:
    return [p.status for p in broker.queue_status(queue).partitions]


def pick_key(partition: int, n: int, candidates) -> str:
    for k in candidates:
        if partq.key_partition(k, n) == partition:
            return k
    raise AssertionError(f"no candidate key lands in partition {partition}")


# Seed 000 names its keys A and B; "A" hashes to partition 0 of 2, "B" does not hash to 1, so the
# B key is the first of these that does (S1: crc32c(utf8(key)) % 2).
KEY_A = pick_key(0, 2, ["A", "A0", "cust-A", "AA"])
KEY_B = pick_key(1, 2, ["B", "BB", "B0", "cust-B", "B_"])


# ---------------------------------------------------------------------- seed 003
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
    broker.scale("q", 6)                  # no clock advance: no holddown (S18, seed 003)
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


# ---------------------------------------------------------------------- seed 000
def seed000_setup(broker, partitioner):
    """Consumer 1 holds both partitions, has received A1..A3 (acked) and B1, B2 (not acked);
    B3 is in partition 1, undelivered."""
    assert partq.key_partition(KEY_A, 2) == 0 and partq.key_partition(KEY_B, 2) == 1
    broker.create_queue("q", partitions=2, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    c1 = broker.bind("q", name="consumer-1")
    assert c1.partitions == frozenset({0, 1})
    for i in (1, 2, 3):
        assert broker.publish("q", b"A%d" % i, key=KEY_A).partition == 0
    for i in (1, 2, 3):
        assert broker.publish("q", b"B%d" % i, key=KEY_B).partition == 1
    got = []
    while not any(m.payload == b"B2" for m in got):
        batch = c1.receive(1)
        assert batch, "consumer 1 should be able to receive B1 and B2"
        got += batch
    assert b"B3" not in [m.payload for m in got]
    bs = [m for m in got if m.partition == 1]
    assert [m.payload for m in bs] == [b"B1", b"B2"]
    c1.ack_many([m for m in got if m.partition == 0])
    c2 = broker.bind("q", name="consumer-2")
    assert c2.partitions == frozenset()
    st = broker.queue_status("q")
    assert st.rebalance_status == "Holddown"
    assert part_statuses(broker, "q") == ["Ready", "Ready"]
    return c1, c2, bs


def check_p0_untouched(broker, c1, tag):
    """S13 / goal 2: partition 0 is Ready with consumer 1, and a new A message goes to it."""
    st = broker.queue_status("q")
    assert st.partitions[0].status == "Ready"
    assert st.partitions[0].flow == c1.flow_id
    broker.publish("q", b"A-" + tag, key=KEY_A)
    got = c1.receive(100)
    assert [m.payload for m in got if m.partition == 0][-1:] == [b"A-" + tag]
    assert all(m.partition == 0 for m in got), "nothing of paused partition 1 may reach consumer 1"
    c1.ack_many(got)


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
    # A late ack from consumer 1, which no longer holds partition 1, is fenced (S33) and
    # changes nothing.
    with pytest.raises(partq.FlowFenced):
        c1.ack(bs[0])
    assert broker.queue_status("q").depth == 0
    assert c2.receive(100) == []


def test_seed000_late_ack_after_timeout_is_fenced(broker, clock, partitioner):
    """S33: consumer 1 finishes B1, B2 after its handoff timed out and partition 1 moved: the
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


# ---------------------------------------------------------------------- seed 004: consumer loss
def two_consumers(broker, clock, partitioner):
    """4 partitions, consumers a and b with two each; every partition has two unacked messages
    delivered to its owner."""
    broker.create_queue("q", partitions=4, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                        partitioner=partitioner)
    a = broker.bind("q")
    b = broker.bind("q")
    clock.advance(DELAY)
    broker.tick()
    assert len(a.partitions) == 2 and len(b.partitions) == 2
    assert broker.queue_status("q").rebalance_status == "Ready"
    for i in range(40):
        broker.publish("q", b"m%d" % i, key=f"key-{i}")
    a_got = a.receive(1000)
    b_got = b.receive(1000)
    assert len(a_got) + len(b_got) == 40
    return a, b, a_got, b_got


def test_seed004_api_reconnect_within_delay_with_hint(broker, clock, partitioner):
    a, b, a_got, _ = two_consumers(broker, clock, partitioner)
    hint = a.partitions
    before = owners(broker, "q")
    a.unbind()                                       # connectivity lost
    st = broker.queue_status("q")
    assert st.rebalance_status == "Holddown"
    for p in hint:
        assert st.partitions[p].status == "Unbound"
    for p in b.partitions:
        assert st.partitions[p].status == "Ready"
    clock.advance(DELAY / 2)
    broker.tick()
    a2 = broker.bind("q", hint=hint)
    assert a2.partitions == hint
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)
    assert owners(broker, "q") == [a2.flow_id if o == a.flow_id else o for o in before]
    # Messages start at once: a's unacked ones, in order, marked redelivered.
    got = a2.receive(1000)
    assert sorted((m.partition, m.seq) for m in got) == sorted((m.partition, m.seq) for m in a_got)
    assert all(m.redelivered for m in got)
    # After the delay nothing happens.
    clock.advance(DELAY * 3)
    broker.tick()
    assert broker.queue_status("q").rebalance_status == "Ready"
    assert a2.partitions == hint
    assert all(p.status == "Ready" for p in broker.queue_status("q").partitions)


def test_seed004_restart_within_delay_without_hint(broker, clock, partitioner):
    a, b, a_got, _ = two_consumers(broker, clock, partitioner)
    b_parts = b.partitions
    a.unbind()
    clock.advance(1.0)
    broker.tick()
    a2 = broker.bind("q")                            # restarted: no hint, no name
    assert a2.partitions == frozenset()
    assert broker.queue_status("q").rebalance_status == "Holddown"
    clock.advance(DELAY - 1.0 - 0.01)
    broker.tick()
    assert a2.partitions == frozenset()
    clock.advance(0.01)
    broker.tick()
    # The timer expired: a2 is treated as a new client; balance is 2/2 and b never lost its own.
    assert len(a2.partitions) == 2 and b.partitions == b_parts
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)
    got = a2.receive(1000)
    assert sorted((m.partition, m.seq) for m in got) == sorted((m.partition, m.seq) for m in a_got)
    assert all(m.redelivered for m in got)


def test_seed004_restart_after_delay_hint_ignored(broker, clock, partitioner):
    a, b, _, b_got = two_consumers(broker, clock, partitioner)
    hint = a.partitions
    a.unbind()
    clock.advance(DELAY)
    broker.tick()
    # First rebalance: remapped among the consumers still connected.
    assert b.partitions == frozenset(range(4))
    assert broker.queue_status("q").rebalance_status == "Ready"
    drain(b)
    b.ack_many(b_got)                                # b holds nothing unacked: handoffs are instant
    a2 = broker.bind("q", hint=hint)                 # the previous mapping is ignored
    assert a2.partitions == frozenset()
    assert broker.queue_status("q").rebalance_status == "Holddown"
    clock.advance(DELAY)
    broker.tick()                                    # second rebalance includes a2
    assert len(a2.partitions) == 2 and len(b.partitions) == 2
    assert a2.partitions | b.partitions == frozenset(range(4))
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)


def test_seed004_hint_after_delay_ignored_even_if_no_timer_ran_yet(broker, clock, partitioner):
    a, b, _, b_got = two_consumers(broker, clock, partitioner)
    b.ack_many(b_got)
    hint = a.partitions
    a.unbind()
    clock.advance(DELAY + 1.0)          # the delay has expired; nobody called tick() or receive()
    a2 = broker.bind("q", hint=hint)
    # S16: after the delay the hint is ignored: the first rebalance remaps a's partitions among
    # the consumers still connected (b), and a2 is a new consumer for a second rebalance.
    assert a2.partitions != hint


def test_seed004_consumer_never_returns(broker, clock, partitioner):
    a, b, a_got, b_got = two_consumers(broker, clock, partitioner)
    a.unbind()
    clock.advance(DELAY - 0.01)
    broker.tick()
    assert b.partitions != frozenset(range(4))
    clock.advance(0.01)
    broker.tick()
    assert b.partitions == frozenset(range(4))
    st = broker.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" and p.flow == b.flow_id for p in st.partitions)
    got = b.receive(1000)
    # a's unacked messages go to b marked redelivered; b's own stay in flight with b.
    assert sorted((m.partition, m.seq) for m in got) == sorted((m.partition, m.seq) for m in a_got)
    assert all(m.redelivered for m in got)
    b.ack_many(got + b_got)
    assert broker.queue_status("q").depth == 0


# ---------------------------------------------------------------------- S17: broker restart
def named_pair(b, clock, partitioner):
    b.create_queue("q", partitions=4, rebalance_delay=DELAY, max_handoff_time=HANDOFF,
                   partitioner=partitioner)
    x = b.bind("q", name="svc-x")
    y = b.bind("q", name="svc-y")
    clock.advance(DELAY)
    b.tick()
    assert len(x.partitions) == 2 and len(y.partitions) == 2
    for i in range(40):
        b.publish("q", b"m%d" % i, key=f"key-{i}")
    x_got = x.receive(1000)
    y_got = y.receive(1000)
    # Ack half of what each consumer got, keep the rest unacked.
    x.ack_many(x_got[::2])
    y.ack_many(y_got[::2])
    return x, y, x_got, y_got


def test_s17_named_consumers_get_their_partitions_back_after_broker_restart(open_broker, clock,
                                                                            partitioner):
    b = open_broker()
    x, y, x_got, y_got = named_pair(b, clock, partitioner)
    x_parts, y_parts = x.partitions, y.partitions
    names_before = [p.flow_name for p in b.queue_status("q").partitions]
    b.close()

    clock.advance(1.0)
    b = open_broker()
    # Assignments survive the restart (S17) and are visible before anyone binds.
    st = b.queue_status("q")
    assert [p.flow_name for p in st.partitions] == names_before
    assert {f.name for f in st.flows} == {"svc-x", "svc-y"}
    assert all(not f.bound for f in st.flows)

    x2 = b.bind("q", name="svc-x")
    assert x2.partitions == x_parts
    st = b.queue_status("q")
    for p in x_parts:
        assert st.partitions[p].status == "Ready" and st.partitions[p].flow_name == "svc-x"
    for p in y_parts:
        assert st.partitions[p].status == "Unbound" and st.partitions[p].flow_name == "svc-y"
    assert st.rebalance_status == "Holddown"

    clock.advance(DELAY / 2)
    b.tick()
    y2 = b.bind("q", name="svc-y")
    assert y2.partitions == y_parts
    st = b.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)
    assert [p.flow_name for p in st.partitions] == names_before

    # Acked messages are not delivered again; unacked ones come back marked redelivered.
    for flow, got in ((x2, x_got), (y2, y_got)):
        again = flow.receive(1000)
        assert sorted((m.partition, m.seq) for m in again) == \
            sorted((m.partition, m.seq) for m in got[1::2])
        assert all(m.redelivered for m in again)
        flow.ack_many(again)
    clock.advance(DELAY * 2)
    b.tick()
    assert x2.partitions == x_parts and y2.partitions == y_parts
    assert b.queue_status("q").depth == 0


def test_s17_only_one_named_consumer_returns(open_broker, clock, partitioner):
    b = open_broker()
    x, y, _, y_got = named_pair(b, clock, partitioner)
    x_parts = x.partitions
    b.close()
    b = open_broker()
    x2 = b.bind("q", name="svc-x")
    assert x2.partitions == x_parts
    clock.advance(DELAY)
    b.tick()
    assert x2.partitions == frozenset(range(4))       # svc-y never came back
    st = b.queue_status("q")
    assert st.rebalance_status == "Ready"
    assert all(p.status == "Ready" for p in st.partitions)
    got = drain(x2)
    assert {(m.partition, m.seq) for m in y_got[1::2]} <= {(m.partition, m.seq) for m in got}
    # A late return of svc-y is a new consumer: a second rebalance, 2/2 again.
    y3 = b.bind("q", name="svc-y")
    assert y3.partitions == frozenset()
    assert b.queue_status("q").rebalance_status == "Holddown"
    clock.advance(DELAY)
    b.tick()
    assert len(y3.partitions) == 2 and len(x2.partitions) == 2


def test_s17_statuses_after_restart_reflect_state(open_broker, clock, partitioner):
    b = open_broker()
    x, y, _, _ = named_pair(b, clock, partitioner)
    b.close()
    b = open_broker()
    st = b.queue_status("q")
    # Hints and assignments survive; the persisted flows are no longer bound.
    assert sorted(p for f in st.flows for p in f.partitions) == [0, 1, 2, 3]
    x2 = b.bind("q", name="svc-x")
    y2 = b.bind("q", name="svc-y")
    assert sorted(x2.partitions | y2.partitions) == [0, 1, 2, 3]
    b.close()
    b = open_broker()
    st = b.queue_status("q")
    assert {f.name: f.partitions for f in st.flows} == {"svc-x": sorted(x2.partitions),
                                                        "svc-y": sorted(y2.partitions)}


def test_s17_statuses_after_restart_are_unbound_until_consumers_return(open_broker, clock,
                                                                         partitioner):
    b = open_broker()
    named_pair(b, clock, partitioner)
    b.close()
    b = open_broker()
    st = b.queue_status("q")
    assert all(not f.bound for f in st.flows)
    assert [p.status for p in st.partitions] == ["Unbound"] * 4


def test_restart_during_handoff_status(open_broker, clock, partitioner):
    b = open_broker()
    c1, c2, bs = seed000_setup(b, partitioner)
    clock.advance(DELAY)
    b.tick()
    assert part_statuses(b, "q") == ["Ready", "Paused"]
    b.close()
    b = open_broker()
    st = b.queue_status("q")
    assert "Paused" not in [p.status for p in st.partitions]
    assert st.rebalance_status != "Rebalancing"


def test_s17_holddown_after_restart_runs_from_the_first_bind(open_broker, clock, partitioner):
    """Delivery is taken at the first bind after a restart (never at open: an inspecting
    process must not take the lock), and the delay for returning consumers runs from there."""
    b = open_broker()
    x, y, _, _ = named_pair(b, clock, partitioner)
    held_x = x.partitions
    b.close()
    b = open_broker()
    clock.advance(DELAY + 1.0)          # time passes before anyone binds: no delay runs yet
    b.tick()
    x2 = b.bind("q", name="svc-x")
    assert x2.partitions == held_x       # the delay started now: svc-x is back in time
    clock.advance(DELAY + 1.0)          # svc-y never returns: its partitions go to svc-x
    b.tick()
    assert x2.partitions == frozenset(range(4))


def test_restart_during_handoff_named_consumers_recover(open_broker, clock, partitioner):
    """A broker closed in the middle of the seed-000 handoff: the partition stays with its source
    (consumer 1), whose unacked B1, B2 come back to it marked redelivered, then B3 in order."""
    b = open_broker()
    c1, c2, bs = seed000_setup(b, partitioner)
    clock.advance(DELAY)
    b.tick()
    b.close()
    b = open_broker()
    c1b = b.bind("q", name="consumer-1")
    assert c1b.partitions == frozenset({0, 1})
    c2b = b.bind("q", name="consumer-2")
    got = [m for m in c1b.receive(100) if m.partition == 1]
    assert [m.payload for m in got] == [b"B1", b"B2", b"B3"]
    assert got[0].redelivered and got[1].redelivered
    c1b.ack_many(got)
    clock.advance(DELAY)
    b.tick()
    assert sorted([len(c1b.partitions), len(c2b.partitions)]) == [1, 1]
    assert all(s == "Ready" for s in part_statuses(b, "q"))


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
