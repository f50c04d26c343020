"""What holds messages back on a partition a flow of another process delivers shows in the
owner's ``queue_status`` (rule `key-ordering`), as that flow last reported it: a nack's delay
holding one key. (Before, such a partition showed nothing held.) Here the "other process" is
a second Broker of this process on the same directory, served by the first through the control
socket like any other process."""
from __future__ import annotations

import pytest
from helpers import wait_until

import partq


def key_in(partition: int, prefix: str) -> str:
    return next(k for k in (f"{prefix}{i}" for i in range(1000))
                if partq.key_partition(k, 2) == partition)


def test_a_peer_flows_nack_delay_and_keys_in_flight_show_in_the_owners_status(tmp_path):
    data = tmp_path / "d"
    clock = partq.ManualClock(100.0)
    owner = partq.Broker.open(data, clock=clock)
    peer = partq.Broker.open(data, clock=clock)     # shares the store, not the delivery
    try:
        owner.create_queue("q", partitions=2, rebalance_delay=1.0, ordering="key",
                           consumer_timeout=600)
        x = owner.bind("q", name="x")                  # this broker runs delivery
        b = peer.bind("q", name="b")                   # served by it
        x.unbind()
        clock.advance(1.1)
        owner.tick()                                   # b holds both partitions
        assert b.partitions == frozenset({0, 1})
        kb, kc = key_in(1, "b"), key_in(1, "c")
        for payload, key in ((b"B1", kb), (b"B2", kb), (b"C1", kc)):
            owner.publish("q", payload, key=key)
        got = wait_until(lambda: b.receive(100), 30, "b to receive")
        assert [m.payload for m in got] == [b"B1", b"B2", b"C1"]
        b.nack(got[0], delay=30)                       # B1 and B2 wait; C1 stays with b
        p1 = wait_until(lambda: (lambda p: p if p.held_for else None)(
            owner.queue_status("q").partitions[1]), 30, "b's report of the delay")
        assert (p1.flow, p1.held_for, p1.held_keys, p1.held_messages) == \
            (b.flow_id, ["delay"], 1, 2)
        clock.advance(31)
        again = wait_until(lambda: b.receive(100), 30, "B1 and B2 again")
        assert [m.payload for m in again] == [b"B1", b"B2"]
        b.ack_many(again + got[2:])
        wait_until(lambda: (lambda p: p.held_for == [] and p.held_keys == 0)(
            owner.queue_status("q").partitions[1]), 30, "b's report that nothing is held")
    finally:
        peer.close()
        owner.close()


@pytest.mark.parametrize("ordering", ["partition", "key"])
def test_a_peer_flows_nack_delay_holds_after_its_partition_moves_to_the_owner(tmp_path,
                                                                            ordering):
    """A flow of another process nacks with a delay and leaves: the delay is in the store, so
    the flow that takes the partition over waits it out too (before, it sent the message at
    once). Under "key" only that key waits."""
    data = tmp_path / "d"
    clock = partq.ManualClock(100.0)
    owner = partq.Broker.open(data, clock=clock)
    peer = partq.Broker.open(data, clock=clock)
    try:
        owner.create_queue("q", partitions=1, rebalance_delay=0, ordering=ordering,
                           consumer_timeout=600)
        x = owner.bind("q", name="x")
        b = peer.bind("q", name="b")
        x.unbind()
        owner.tick()
        wait_until(lambda: b.partitions == frozenset({0}), 30, "b to hold the partition")
        for payload, key in ((b"B1", "b"), (b"C1", "c")):
            owner.publish("q", payload, key=key)
        got = wait_until(lambda: b.receive(100), 30, "b to receive")
        assert [m.payload for m in got] == [b"B1", b"C1"]
        b.nack(got[0], delay=30)
        b.ack(got[1])
        b.unbind()
        x = owner.bind("q", name="x")
        owner.tick()
        wait_until(lambda: x.partitions == frozenset({0}), 30, "x to take the partition")
        owner.publish("q", b"C2", key="c")
        if ordering == "partition":          # C2 waits behind B1
            assert x.receive(100, timeout=0.5) == []
        else:                                # key c holds nothing: C2 flows at once
            early = wait_until(lambda: x.receive(100), 30, "C2, whose key holds nothing")
            assert [m.payload for m in early] == [b"C2"]
        clock.advance(31)
        late = wait_until(lambda: x.receive(100), 30, "B1 after its delay")
        assert [m.payload for m in late] == ([b"B1", b"C2"] if ordering == "partition"
                                            else [b"B1"])
        assert late[0].redelivered and late[0].delivery_count == 2
    finally:
        peer.close()
        owner.close()
