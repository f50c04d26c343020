"""The message distribution example replayed through the Broker, on real LMDB directories with
a ManualClock: the four outcomes of losing a consumer (back within the delay with its hint,
restarted without one, back after the delay, never back; rules `bind-hint`, `stale-hint`)."""
from __future__ import annotations

from broker_helpers import DELAY, HANDOFF, drain
from example_helpers import owners


# ---------------------------------------------------------------------- consumer loss
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
    # Rule `stale-hint`: after the delay the hint is ignored: the first rebalance remaps a's partitions among
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
