"""A broker restart, replayed through the Broker on real LMDB directories with a ManualClock
(rule `named-flows`): named consumers get their partitions back, assignments and statuses
survive it, the delay for returning consumers runs from the first bind, and a handoff cut short
by the restart stays with its source."""
from __future__ import annotations

from broker_helpers import DELAY, HANDOFF, drain
from example_helpers import part_statuses, seed000_setup


# ---------------------------------------------------------------------- named flows: broker restart
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


def test_named_consumers_get_their_partitions_back_after_broker_restart(open_broker, clock, partitioner):
    b = open_broker()
    x, y, x_got, y_got = named_pair(b, clock, partitioner)
    x_parts, y_parts = x.partitions, y.partitions
    names_before = [p.flow_name for p in b.queue_status("q").partitions]
    b.close()

    clock.advance(1.0)
    b = open_broker()
    # Assignments survive the restart (rule `named-flows`) and are visible before anyone binds.
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


def test_only_one_named_consumer_returns(open_broker, clock, partitioner):
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


def test_statuses_after_restart_reflect_state(open_broker, clock, partitioner):
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


def test_statuses_after_restart_are_unbound_until_consumers_return(open_broker, clock, partitioner):
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


def test_holddown_after_restart_runs_from_the_first_bind(open_broker, clock, partitioner):
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
    """A broker closed in the middle of the B1..B5 handoff: the partition stays with its source
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


def test_a_consumer_that_left_before_a_clean_close_is_not_waited_for_again(open_broker, clock):
    """Tried as a new operator would: after `partq consume` left and exited, the next consumer
    waited out a whole rebalance delay again for its ghost. The holddown its leaving started
    now goes on across the close: a consumer back within it keeps its partitions, one that
    comes after it finds the ghost gone. (Flows still bound at a close are waited for from the
    next first bind: `test_holddown_after_restart_runs_from_the_first_bind`.)"""
    b = open_broker()
    b.create_queue("q", partitions=2, rebalance_delay=5.0)
    b.bind("q", name="left").unbind()
    b.close()
    clock.advance(3.0)
    b = open_broker()
    assert b.bind("q", name="left").partitions == {0, 1}    # back within the delay: kept
    b.close()                                              # ... and bound at this close
    b = open_broker()
    back = b.bind("q", name="left")
    back.unbind()
    b.close()
    clock.advance(6.0)                                     # past the delay of that leaving
    b = open_broker()
    other = b.bind("q", name="other")
    assert other.partitions == {0, 1}                       # no wait for the ghost


def test_a_consumer_that_left_is_waited_for_the_rest_of_its_delay(open_broker, clock):
    b = open_broker()
    b.create_queue("q", partitions=2, rebalance_delay=5.0)
    b.bind("q", name="left").unbind()
    clock.advance(2.0)
    b.close()
    clock.advance(1.0)
    b = open_broker()
    other = b.bind("q", name="other")
    assert other.partitions == frozenset()                  # 2 s of the delay are left
    clock.advance(2.1)
    b.tick()
    assert other.partitions == {0, 1}
