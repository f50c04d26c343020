"""Minimal reproductions of bugs the crash tests found. Open ones are strict xfails: each turns
into a failure ("XPASS(strict)") once the bug is fixed, and then the xfail mark goes; fixed ones
stay as regression tests.

They happen without any crash too; a crash (or a consumer restart) is just the usual way in.
"""
from __future__ import annotations

import os
import subprocess
import sys
from functools import partial

import helpers

import partq


def key_for(partition: int, partitions: int) -> str:
    return next(k for k in (f"k{i}" for i in range(10_000))
                if partq.key_partition(k, partitions) == partition)


# receive and ack until a 50 ms receive is empty; an empty receive before the first message does
# not end it (at most 20 receives in all)
drain = partial(helpers.drain, timeout=0.05, max_rounds=20, at_least=1)


# ---------------------------------------------------------------------- bug 1
def test_open_during_a_scaling_finishes_it_without_losing_messages(tmp_path):
    data = os.fspath(tmp_path / "data")
    key = key_for(3, 4)
    child = (f"import partq\n"
             f"with partq.Broker.open({data!r}) as b:\n"       # this open finishes the scaling
             f"    print(b.publish('q', b'after-scaling', key={key!r}).partition)\n")
    published = []

    def progress(step):
        # the scaler has read the ScalingUp config and created partition 2; another process
        # opens the directory now (any publisher or consumer that starts during a scaling)
        if step == "created partition 2" and not published:
            out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0, out.stderr
            published.append(int(out.stdout))

    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=2, rebalance_delay=0.0)
        b.scale("q", 4, progress=progress)
        assert published == [3]
        got = drain(b.bind("q", name="c"))
        assert [m.payload for m in got] == [b"after-scaling"]


# ---------------------------------------------------------------------- fixed
# Found by the crash-point sweep: QueueDelivery restored the rebalancer with the partition count
# of the stored state (older than a scaling done while no process ran delivery, or whose owner
# died before its next tick) and never reconciled it: new partitions were never delivered,
# queue_status and bind raised IndexError.

def test_scale_up_while_no_consumer_runs(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=2, rebalance_delay=0.0)
        b.bind("q", name="c")                     # stores delivery state with 2 partitions
    with partq.Broker.open(data) as b:            # e.g. `partq scale` while the consumer is down
        b.scale("q", 4)
        b.publish("q", b"new-partition", key=key_for(3, 4))
    with partq.Broker.open(data) as b:            # the consumer comes back
        flow = b.bind("q", name="c")
        assert flow.partitions == {0, 1, 2, 3}
        assert b.queue_status("q").depth == 1
        assert [m.payload for m in drain(flow)] == [b"new-partition"]


def test_scale_down_while_no_consumer_runs(tmp_path):
    data = tmp_path / "data"
    with partq.Broker.open(data) as b:
        b.create_queue("q", partitions=4, rebalance_delay=0.0)
        kept = [b.publish("q", b"m%d" % i, key=f"k{i}") for i in range(20)]
        b.bind("q", name="c")
    with partq.Broker.open(data) as b:
        b.scale("q", 2)
    with partq.Broker.open(data) as b:
        flow = b.bind("q", name="c")
        assert flow.partitions == {0, 1}
        got = drain(flow)
        assert sorted((m.partition, m.seq) for m in got) == \
            sorted((r.partition, r.seq) for r in kept if r.partition < 2)


# ---------------------------------------------------------------------- bug 2
def test_nack_after_a_scale_down_removed_the_partition(tmp_path):
    with partq.Broker.open(tmp_path / "data", clock=partq.ManualClock()) as b:
        b.create_queue("q", partitions=3, rebalance_delay=0.0)
        b.publish("q", b"doomed", key=key_for(2, 3))
        flow = b.bind("q", name="c")
        msg, = flow.receive(10)
        assert msg.partition == 2
        b.scale("q", 2)            # from another process in real life; the owner's tick applies it
        flow.nack(msg)
        flow.ack(msg)              # both accepted: the message went with its partition


def test_a_late_ack_for_a_dropped_partition_does_not_resurrect_it(tmp_path):
    """Found by the long random-kill run (seed 20261121, round 20): a consumer's ack of a message
    received before a scale-down dropped its partition committed after the drop. It recreated
    the partition's ack state with floor 0, the next scale-up saw a partition that existed and
    left it so, and the records the drop had deleted could never be acked: the queue never
    drained."""
    clock = partq.ManualClock()
    with partq.Broker.open(tmp_path / "d", clock=clock) as b:
        b.create_queue("q", partitions=4, rebalance_delay=0.0, max_handoff_time=0.0)
        key = key_for(3, 4)
        b.publish_many("q", [(b"m%d" % i, key) for i in range(10)])
        flow = b.bind("q", name="c")
        held = [m for m in flow.receive(100) if m.partition == 3]
        assert len(held) == 10
        # Another broker (another process, in real use) scales; the owner has not ticked yet.
        scaler = partq.Broker.open(tmp_path / "d", clock=clock)
        try:
            scaler.scale("q", 3)        # partition 3 and its messages go
            flow.ack_many(held[5:])     # the owner's late ack of some of what it received
            scaler.scale("q", 4)        # partition 3 comes back, empty
        finally:
            scaler.close()
        b.tick()
        b.publish("q", b"after", key=key)
        got = drain(flow)
        assert [(m.partition, m.payload) for m in got] == [(3, b"after")]
        st = b.queue_status("q")
        assert st.depth == 0, [(p.partition, p.depth, p.ack_floor, p.next_seq) for p in st.partitions]
