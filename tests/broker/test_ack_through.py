"""Flow.ack_through: acking a partition's messages up to a sequence without receiving them (a
consumer that reads ranges of the log itself, like Spark's stream), fenced like any ack."""
from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import drain

import partq

KEYED = [(b"m%d" % i, f"key-{i}") for i in range(40)]

ACK_THROUGH_IN_ANOTHER_PROCESS = """
import sys, partq
with partq.Broker.open(sys.argv[1]) as b:
    flow = b.bind("q", name="ranges")
    for p in sorted(flow.partitions):
        flow.ack_through(p, 2).result()
    print(sorted(flow.partitions))
"""


def test_ack_through_acks_a_prefix_and_moves_delivery_past_it(broker):
    broker.create_queue("q", partitions=2, rebalance_delay=0)
    broker.publish_many("q", KEYED)
    flow = broker.bind("q", name="ranges")
    before = {p.partition: p for p in broker.queue_status("q").partitions}
    flow.ack_through(0, 4).result()
    flow.ack_through(1, 1_000_000).result()          # past the head: up to the head
    after = {p.partition: p for p in broker.queue_status("q").partitions}
    assert after[0].ack_floor == 5 and after[0].depth == before[0].depth - 5
    assert after[1].depth == 0
    got = drain(flow)
    assert {(m.partition, m.seq) for m in got} == {(0, s) for s in range(5, before[0].next_seq)}
    assert not any(m.redelivered for m in got)


def test_ack_through_of_a_partition_the_flow_does_not_hold_is_fenced(broker):
    broker.create_queue("q", partitions=2, rebalance_delay=0)
    broker.publish_many("q", KEYED)
    first = broker.bind("q", name="a")
    second = broker.bind("q", name="b")
    held = next(iter(second.partitions))
    with pytest.raises(partq.FlowFenced, match=f"does not hold partition {held}"):
        first.ack_through(held, 3)
    assert broker.queue_status("q").partitions[held].ack_floor == 0


def test_ack_through_from_a_process_that_does_not_own_delivery(broker, data_dir):
    broker.create_queue("q", partitions=2, rebalance_delay=0)
    broker.publish_many("q", KEYED)
    broker.bind("q", name="owner")
    proc = subprocess.run([sys.executable, "-c", ACK_THROUGH_IN_ANOTHER_PROCESS, str(data_dir)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    held = eval(proc.stdout)                 # the partitions the other process held
    status = {p.partition: p for p in broker.queue_status("q").partitions}
    for p in held:
        assert status[p].ack_floor == min(3, status[p].next_seq)
