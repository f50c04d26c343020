"""Rule `delivery-count`: a partition that moves gracefully between processes (a handoff from a
flow of another process, that process's flow unbinding) is counted and marked exactly: its next
holder marks redelivered, and counts a failed delivery for, only what was really delivered and
not acked. Before, the next holder marked everything up to the delivered mark's lease (up to
1024 messages) redelivered.

The "other process" is a second Broker of this process on the same directory, served by the
first through the control socket like any other process."""
from __future__ import annotations

from helpers import wait_until

import partq


def _keys(partition: int, n: int, partitions: int = 2) -> list[str]:
    out, i = [], 0
    while len(out) < n:
        if partq.key_partition(f"k{i}", partitions) == partition:
            out.append(f"k{i}")
        i += 1
    return out


def test_a_handoff_from_another_process_counts_only_what_it_delivered(tmp_path):
    data = tmp_path / "d"
    owner = partq.Broker.open(data)
    peer = partq.Broker.open(data)
    try:
        owner.create_queue("q", partitions=2, rebalance_delay=0.2, max_handoff_time=30)
        items = [(b"%d/%d" % (p, i), k) for p in (0, 1) for i, k in enumerate(_keys(p, 40))]
        owner.publish_many("q", items)
        owner.dispatcher.take_over("q")
        far = peer.bind("q", name="far")                 # a flow of another process: both
        got = []
        while len(got) < 20:
            got += far.receive(20 - len(got), timeout=1)
        far.ack_many(got[:6])
        held = got[6:]
        near = owner.bind("q", name="near")              # one partition moves to it
        moving = wait_until(lambda: (lambda st: [p.partition for p in st.partitions
                                                 if p.status == "Paused"])(
            owner.queue_status("q")), 10, "a handoff to start")
        (p,) = moving
        far.receive(10, timeout=0.2)                     # the old holder sees the pause ...
        far.ack_many([m for m in held if m.partition == p])   # ... and acks what it holds
        wait_until(lambda: p in near.partitions, 10, "the handoff to end")
        delivered = {m.seq for m in got if m.partition == p}
        rest = []
        while len(rest) < 40 - len(delivered):
            msgs = near.receive(100, timeout=1)
            assert msgs, f"received {len(rest)} of {40 - len(delivered)}"
            rest += msgs
        assert sorted(m.seq for m in rest) == sorted(set(range(40)) - delivered)
        assert not any(m.redelivered for m in rest), "never delivered, yet marked redelivered"
        assert {m.delivery_count for m in rest} == {1}
    finally:
        peer.close()
        owner.close()


def test_a_flow_of_another_process_that_unbinds_leaves_exact_counts(tmp_path):
    data = tmp_path / "d"
    owner = partq.Broker.open(data)
    peer = partq.Broker.open(data)
    try:
        owner.create_queue("q", partitions=1, rebalance_delay=0)
        owner.publish_many("q", [b"%d" % i for i in range(50)])
        owner.dispatcher.take_over("q")
        far = peer.bind("q")
        got = []
        while len(got) < 10:
            got += far.receive(10 - len(got), timeout=1)
        far.ack_many(got[:4])
        far.unbind()                                     # six in flight, forty never delivered
        near = owner.bind("q")
        rest = []
        while len(rest) < 46:
            msgs = near.receive(100, timeout=1)
            assert msgs, f"received {len(rest)} of 46"
            rest += msgs
        assert [(m.delivery_count, m.redelivered) for m in rest] == \
            [(2, True)] * 6 + [(1, False)] * 40
    finally:
        peer.close()
        owner.close()
